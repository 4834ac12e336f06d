//! Wire protocols of dra-cpu: kubelet DRA and plugin registration, the
//! dra-plugin/nri-plugin coordination protocol (`dracpu.v1`), NRI with a
//! native client, and the HTTP metrics and probe endpoints.

pub mod coordination;
pub mod http;
pub mod kubelet;
pub mod nri;
pub mod transport;
