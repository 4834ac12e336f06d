//! NRI bindings: rust-protobuf 3 messages and async ttrpc services for
//! `proto/nri/api.proto`, written to `$OUT_DIR/nri/`.
//!
//! ttrpc-codegen emits files that open with inner attributes (`#![...]`) and
//! inner doc comments (`//!`). `include!` cannot splice those into a module,
//! so they are stripped here; `src/nri.rs` puts the equivalent `allow`s on
//! the wrapping modules instead, which keeps generated-code lints contained.

use std::fs;
use std::path::{Path, PathBuf};

const PROTO_DIR: &str = "proto/nri";
const PROTO_FILE: &str = "proto/nri/api.proto";
const GENERATED_FILES: [&str; 2] = ["api.rs", "api_ttrpc.rs"];

pub fn generate() {
    println!("cargo:rerun-if-changed={PROTO_FILE}");
    println!("cargo:rerun-if-changed=build/nri.rs");

    let out_dir = match std::env::var_os("OUT_DIR") {
        Some(dir) => PathBuf::from(dir).join("nri"),
        None => panic!("OUT_DIR is not set: build.rs must run under cargo"),
    };
    if let Err(err) = fs::create_dir_all(&out_dir) {
        panic!("creating {}: {err}", out_dir.display());
    }

    let result = ttrpc_codegen::Codegen::new()
        .out_dir(&out_dir)
        .input(PROTO_FILE)
        .include(PROTO_DIR)
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ttrpc_codegen::ProtobufCustomize::default().gen_mod_rs(false))
        .run();
    if let Err(err) = result {
        panic!("generating NRI bindings from {PROTO_FILE}: {err}");
    }

    for name in GENERATED_FILES {
        strip_inner_attributes(&out_dir.join(name));
    }
}

/// Removes the lines `include!` rejects: inner attributes and inner doc
/// comments. Multi-line inner attributes are skipped up to their closing `]`.
fn strip_inner_attributes(path: &Path) {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) => panic!("reading generated {}: {err}", path.display()),
    };
    let mut kept = String::with_capacity(text.len());
    let mut in_attribute = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if in_attribute {
            if trimmed.ends_with(']') {
                in_attribute = false;
            }
            continue;
        }
        if trimmed.starts_with("#![") {
            in_attribute = !trimmed.ends_with(']');
            continue;
        }
        if trimmed.starts_with("//!") {
            continue;
        }
        kept.push_str(line);
        kept.push('\n');
    }
    if let Err(err) = fs::write(path, kept) {
        panic!("writing {}: {err}", path.display());
    }
}
