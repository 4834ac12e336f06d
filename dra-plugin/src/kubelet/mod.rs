//! What dra-plugin serves kubelet and reads from it: the DRA gRPC service,
//! plugin registration, the device-health stream, and the check of
//! kubelet's own CPU manager state.

pub mod device_health;
pub mod dra_service;
pub mod kubelet_cpu_manager;
pub mod registration;
