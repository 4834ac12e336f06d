//! Generates the protocol bindings: tonic/prost for kubelet and coordination,
//! ttrpc/rust-protobuf for NRI.

#[path = "build/grpc.rs"]
mod grpc;
#[path = "build/nri.rs"]
mod nri;

fn main() {
    grpc::generate();
    nri::generate();
}
