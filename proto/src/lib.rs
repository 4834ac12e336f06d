//! Wire protocols of dra-cpu, generated and nothing else but their one
//! conversion: kubelet DRA, plugin registration and DRA health
//! ([`kubelet`]), the dra-plugin/nri-plugin coordination protocol
//! `dracpu.v1` with its conversion to the shared types ([`coordination`]),
//! and NRI ([`nri`]). The NRI client is `dra-cpu-nri`; the Unix-socket
//! transport is `dra-cpu-transport`.

pub mod coordination;
pub mod kubelet;
pub mod nri;
