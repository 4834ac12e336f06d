//! Wire protocols of dra-cpu: kubelet DRA and plugin registration, the
//! dra-plugin/nri-plugin coordination protocol (`dracpu.v1`), and NRI with a
//! native client.

pub mod coordination;
pub mod kubelet;
pub mod nri;
pub mod transport;
