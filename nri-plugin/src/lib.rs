//! nri-plugin: the containerd NRI plugin of dra-cpu. It pins claim
//! containers to their exclusive CPUs and keeps every other container on the
//! shared pool, following the claims dra-plugin prepares.

pub mod handler;
