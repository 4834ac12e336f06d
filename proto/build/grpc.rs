//! tonic/prost bindings for the kubelet APIs (DRA v1 and v1beta1, plugin
//! registration, DRA health v1alpha1 and v1) and for dracpu.v1.

use std::path::PathBuf;

const KUBELET_PROTOS: &[&str] = &[
    "proto/kubelet/dra_v1.proto",
    "proto/kubelet/dra_v1beta1.proto",
    "proto/kubelet/pluginregistration.proto",
    "proto/kubelet/dra_health_v1alpha1.proto",
    "proto/kubelet/dra_health_v1.proto",
];

const COORDINATION_PROTOS: &[&str] = &["proto/dracpu/coordination.proto"];

pub fn generate() {
    // The vendored protoc keeps the build free of a system protobuf install.
    let protoc = protoc_bin_vendored::protoc_bin_path()
        .unwrap_or_else(|e| panic!("no vendored protoc for this host: {e}"));
    std::env::set_var("PROTOC", protoc);

    let out_dir = PathBuf::from(
        std::env::var_os("OUT_DIR").unwrap_or_else(|| panic!("cargo did not set OUT_DIR")),
    );
    compile(KUBELET_PROTOS, out_dir.join("kubelet_descriptor.bin"));
    compile(
        COORDINATION_PROTOS,
        out_dir.join("coordination_descriptor.bin"),
    );
}

fn compile(protos: &[&str], descriptor_path: PathBuf) {
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(&descriptor_path)
        .compile_protos(protos, &["proto"])
        .unwrap_or_else(|e| panic!("compiling {protos:?}: {e}"));
}
