//! End-to-end harness of dra-cpu: a private containerd with NRI, kubelet
//! stand-ins (CRI and DRA), cgroup read-back and a fake API server.

// Test support: a panic here fails the test or measurement that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod apiserver;
pub mod cgroup;
pub mod chart;
pub mod claims;
pub mod containerd;
pub mod cri;
pub mod docs_check;
pub mod image;
pub mod interrupts;
pub mod irqbalance;
pub mod kubelet_dra;
pub mod metrics_doc;
pub mod metrics_golden;
pub mod must;
pub mod node;
pub mod nri_runtime;
pub mod prom_text;
pub mod real_clients;
pub mod real_node;
pub mod repin;
pub mod seed;
pub mod served_series;
pub mod skip;
