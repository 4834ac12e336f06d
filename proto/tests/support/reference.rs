//! The upstream protocol files in `shared/reference/proto/`, compiled with
//! the vendored protoc, for the tests that check our protocols against them.

use prost::Message as _;
use prost_types::FileDescriptorSet;
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
