//! The upstream protocol files, taken from the Go modules that publish them
//! (`k8s.io/kubelet`, `github.com/containerd/nri`) as the Go toolchain
//! downloads them into its module cache, and compiled with the vendored
//! protoc, for the tests that check our protocols against them.
//!
//! Nothing downloaded is kept in the repository: each test process asks
//! `go mod download -json MODULE@VERSION` where the module is (a cache hit
//! once `scripts/install-deps.sh` or an earlier run has fetched it). Without
//! a Go toolchain or a reachable module proxy the tests fail, saying what to
//! install.

use prost::Message as _;
use prost_types::field_descriptor_proto::Label;
use prost_types::{FieldDescriptorProto, FileDescriptorSet, MethodDescriptorProto};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The kubelet API module and the version whose protocols ours follow.
pub const KUBELET: &str = "k8s.io/kubelet";
pub const KUBELET_VERSION: &str = "v0.37.2";
/// The NRI module and the versions of its protocol we check against,
/// oldest first.
pub const NRI: &str = "github.com/containerd/nri";
pub const NRI_VERSIONS: [&str; 3] = ["v0.6.1", "v0.8.0", "v0.12.2"];

/// One upstream protocol file: a path inside a Go module at a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upstream {
    pub module: &'static str,
    pub version: &'static str,
    pub path: &'static str,
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}/{}", self.module, self.version, self.path)
    }
}

/// kubelet's DRA plugin API, v1.
pub const DRA_V1: Upstream = Upstream {
    module: KUBELET,
    version: KUBELET_VERSION,
    path: "pkg/apis/dra/v1/api.proto",
};
/// kubelet's DRA resource health API, v1.
pub const DRA_HEALTH_V1: Upstream = Upstream {
    module: KUBELET,
    version: KUBELET_VERSION,
    path: "pkg/apis/dra-health/v1/api.proto",
};
/// kubelet's plugin registration API, v1.
pub const PLUGIN_REGISTRATION_V1: Upstream = Upstream {
    module: KUBELET,
    version: KUBELET_VERSION,
    path: "pkg/apis/pluginregistration/v1/api.proto",
};

/// The NRI protocol at `version` (one of [`NRI_VERSIONS`]).
pub fn nri(version: &'static str) -> Upstream {
    Upstream {
        module: NRI,
        version,
        path: "pkg/api/api.proto",
    }
}

/// The Go toolchain: `$GO`, else `go` on PATH, else the usual install
/// places (the official tarball's, then Debian's, newest first).
fn go_command() -> Option<PathBuf> {
    if let Some(go) = std::env::var_os("GO").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(go));
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("go"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let minor = name.strip_prefix("go-1.")?.parse().ok()?;
            Some((minor, entry.path().join("bin/go")))
        })
        .collect();
    debian.sort();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/local/go/bin/go")])
        .chain(debian.into_iter().rev().map(|(_, go)| go))
        .find(|go| go.is_file())
}

/// Why the module `what` (`module@version`) with upstream protocol files
/// could not be had, with what to do about it.
fn unavailable(what: &str, reason: &str) -> ! {
    panic!(
        "the Go module {what}, which holds upstream protocol files, is not available: {reason}\n\
         These tests compare our protocols with the upstream .proto files of \
         the Go modules that publish them, fetched into the Go module cache by \
         the Go toolchain. Install Go (scripts/install-deps.sh installs one; \
         set $GO to use another) with the Go module proxy reachable, or fill \
         the cache beforehand with `go mod download {what}`."
    )
}

/// The directory of `module@version` in the Go module cache, downloaded
/// there first if needed; once per test process.
pub fn module_dir(module: &str, version: &str) -> PathBuf {
    static DIRS: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let key = format!("{module}@{version}");
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dir) = dirs.get(&key) {
        return dir.clone();
    }
    let Some(go) = go_command() else {
        unavailable(
            &key,
            "no Go toolchain found ($GO, go on PATH, /usr/local/go, /usr/lib/go-1.*)",
        );
    };
    // Outside any module (a fresh directory, no workspace), so that nothing
    // of the repository's own Go code is read or changed.
    let scratch = tempfile::tempdir().unwrap();
    let output = Command::new(&go)
        .args(["mod", "download", "-json", &key])
        .current_dir(scratch.path())
        .env("GOFLAGS", "-mod=mod")
        .env("GOWORK", "off")
        // A module that needs a newer Go than this one may have it fetched
        // through the module proxy, unless the caller chose otherwise.
        .env(
            "GOTOOLCHAIN",
            std::env::var("GOTOOLCHAIN").unwrap_or_else(|_| "auto".into()),
        )
        .output()
        .unwrap_or_else(|e| unavailable(&key, &format!("running {}: {e}", go.display())));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let info: serde_json::Value = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    let reason = info["Error"].as_str().map(str::to_string).or_else(|| {
        (!output.status.success()).then(|| {
            format!(
                "{} mod download exited with {}: {}",
                go.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
        })
    });
    if let Some(reason) = reason {
        unavailable(&key, &reason);
    }
    let Some(dir) = info["Dir"]
        .as_str()
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
    else {
        unavailable(
            &key,
            &format!("go mod download named no module directory: {stdout}"),
        );
    };
    dirs.insert(key, dir.clone());
    dir
}

/// Where `file` is on this machine (in the Go module cache).
pub fn upstream_path(file: &Upstream) -> PathBuf {
    let path = module_dir(file.module, file.version).join(file.path);
    assert!(
        path.is_file(),
        "{file}: {} does not exist in the downloaded module",
        path.display()
    );
    path
}

/// The descriptors of the upstream protocol `file`, with its module's root
/// as the import path.
pub fn compile_reference(file: &Upstream) -> FileDescriptorSet {
    upstream_path(file);
    let root = module_dir(file.module, file.version);
    let out = tempfile::tempdir().unwrap();
    let descriptor = out.path().join("reference.bin");
    let status = Command::new(protoc_bin_vendored::protoc_bin_path().unwrap())
        .arg(format!("--proto_path={}", root.display()))
        .arg(format!("--descriptor_set_out={}", descriptor.display()))
        .arg(file.path)
        .status()
        .unwrap();
    assert!(status.success(), "protoc failed on {file}");
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
