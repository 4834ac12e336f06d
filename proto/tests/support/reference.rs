//! The upstream protocol files in `shared/reference/proto/`, compiled with
//! the vendored protoc, for the tests that check our protocols against them.

use prost::Message as _;
use prost_types::field_descriptor_proto::Label;
use prost_types::{FieldDescriptorProto, FileDescriptorSet, MethodDescriptorProto};
use std::path::{Path, PathBuf};

/// Where the upstream protocol files are.
pub fn reference_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/proto");
    assert!(
        dir.is_dir(),
        "upstream protocol files expected at {}",
        dir.display()
    );
    dir
}

/// The descriptors of upstream protocol `files` (names inside
/// [`reference_dir`]).
pub fn compile_reference(files: &[&str]) -> FileDescriptorSet {
    let out = tempfile::tempdir().unwrap();
    let descriptor = out.path().join("reference.bin");
    let status = std::process::Command::new(protoc_bin_vendored::protoc_bin_path().unwrap())
        .arg(format!("--proto_path={}", reference_dir().display()))
        .arg(format!("--descriptor_set_out={}", descriptor.display()))
        .args(files)
        .status()
        .unwrap();
    assert!(status.success(), "protoc failed on {files:?}");
    let bytes = std::fs::read(descriptor).unwrap();
    FileDescriptorSet::decode(bytes.as_slice()).unwrap()
}

/// A field's label and type as they decide its encoding: `repeated` or
/// `optional` (proto3's explicit presence), the scalar type, and the
/// message or enum type name.
pub fn field_type(f: &FieldDescriptorProto) -> String {
    let label = match f.label() {
        Label::Repeated => "repeated ",
        _ if f.proto3_optional() => "optional ",
        _ => "",
    };
    format!("{label}{:?} {}", f.r#type(), f.type_name())
}

/// An RPC's request and response, streamed or not:
/// `(stream .pkg.In) returns (.pkg.Out)`.
pub fn rpc_signature(m: &MethodDescriptorProto) -> String {
    format!(
        "({}{}) returns ({}{})",
        if m.client_streaming() { "stream " } else { "" },
        m.input_type(),
        if m.server_streaming() { "stream " } else { "" },
        m.output_type()
    )
}
