//! nri-plugin: the containerd NRI plugin of dra-cpu. It pins claim
//! containers to their exclusive CPUs and keeps every other container on the
//! shared pool, following the claims dra-plugin prepares.

pub mod cdi_fallback;
pub mod config;
pub mod handler;
pub mod metrics;
pub mod plugin;
pub mod subscription;
