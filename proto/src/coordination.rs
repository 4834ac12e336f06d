//! The dra-plugin/nri-plugin coordination protocol `dracpu.v1` (tonic).
//!
//! See `proto/dracpu/coordination.proto` for the meaning of every field. CPU
//! sets are cpulist strings: parse them with `shared_state::CpuSet` on receipt.

/// `dracpu.v1`: Coordination (Watch, Lookup, ReportApplied).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("dracpu.v1");
}

/// Encoded `google.protobuf.FileDescriptorSet` of `dracpu.v1`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/coordination_descriptor.bin"));
