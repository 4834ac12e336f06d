//! End-to-end harness of dra-cpu: a private containerd with NRI, kubelet
//! stand-ins (CRI and DRA), cgroup read-back and a fake API server.

pub mod apiserver;
pub mod cgroup;
pub mod containerd;
pub mod cri;
pub mod image;
pub mod kubelet_dra;
pub mod metrics_doc;
pub mod metrics_golden;
pub mod node;
pub mod perf;
pub mod prom_text;
pub mod real_clients;
pub mod skip;
