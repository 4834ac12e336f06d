//! Real gRPC clients of other languages, as kubelet and other peers run them:
//! a grpc-go program with kubelet's dial options (`tests/go/kubelet-client`),
//! built offline from Debian's Go packages in GOPATH mode, and a Python
//! grpcio (C-core) script (`tests/python/grpcio_get_info.py`).
//! `scripts/install-deps.sh` installs both toolchains.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// Where Debian's Go library packages put their sources (GOPATH mode).
pub const DEBIAN_GOPATH: &str = "/usr/share/gocode";

/// Why a real client cannot be built or run here.
#[derive(Debug, thiserror::Error)]
pub enum RealClientError {
    #[error("no Go toolchain: neither `go` on PATH nor /usr/lib/go-1.*/bin/go (apt-get install golang-1.24-go/trixie)")]
    NoGo,
    #[error("{} missing: install golang-google-grpc-dev/trixie and golang-google-protobuf-dev/trixie", .0.display())]
    NoGoPackage(PathBuf),
    #[error("building {source_file} with {go}: {output}")]
    GoBuild {
        go: String,
        source_file: String,
        output: String,
    },
    #[error("no python3 with the grpcio package (python3 -m pip install grpcio): {0}")]
    NoGrpcio(String),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_dir().join("target"),
    }
}

/// The `go` command: the newest Debian `/usr/lib/go-1.N` (what
/// `scripts/install-deps.sh` installs, 1.24: trixie's protobuf sources need
/// it), else `go` on PATH. An older `go` on PATH (bookworm's 1.19) cannot
/// build them, so it comes last.
pub fn go_command() -> Result<PathBuf, RealClientError> {
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let minor = name.strip_prefix("go-1.")?.parse().ok()?;
            let go = entry.path().join("bin/go");
            go.is_file().then_some((minor, go))
        })
        .collect();
    debian.sort();
    if let Some((_, go)) = debian.pop() {
        return Ok(go);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("go"))
        .find(|go| go.is_file())
        .ok_or(RealClientError::NoGo)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Builds `tests/go/kubelet-client` (once; again when its source is newer)
/// into the target directory and returns the binary.
pub fn kubelet_go_client() -> Result<PathBuf, RealClientError> {
    let go = go_command()?;
    for package in ["google.golang.org/grpc", "google.golang.org/protobuf"] {
        let dir = Path::new(DEBIAN_GOPATH).join("src").join(package);
        if !dir.is_dir() {
            return Err(RealClientError::NoGoPackage(dir));
        }
    }
    let source_dir = workspace_dir().join("tests/go/kubelet-client");
    let source = source_dir.join("main.go");
    let out_dir = target_dir().join("tmp");
    let binary = out_dir.join("kubelet-go-client");
    if let (Some(built), Some(written)) = (modified(&binary), modified(&source)) {
        if built >= written {
            return Ok(binary);
        }
    }
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| RealClientError::Io(format!("creating {}", out_dir.display()), e))?;
    // Built under a name of this process, then renamed: tests running in
    // parallel never run a half-written binary.
    let partial = out_dir.join(format!("kubelet-go-client.{}", std::process::id()));
    let output = Command::new(&go)
        .current_dir(&source_dir)
        .args(["build", "-o"])
        .arg(&partial)
        .arg("main.go")
        .env("GO111MODULE", "off")
        .env("GOPATH", DEBIAN_GOPATH)
        .env("GOCACHE", out_dir.join("go-cache"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .output()
        .map_err(|e| RealClientError::Io(format!("running {}", go.display()), e))?;
    if !output.status.success() {
        return Err(RealClientError::GoBuild {
            go: go.display().to_string(),
            source_file: source.display().to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    std::fs::rename(&partial, &binary)
        .map_err(|e| RealClientError::Io(format!("moving {}", partial.display()), e))?;
    Ok(binary)
}

/// `python3`, checked to import `grpc`.
pub fn python_with_grpcio() -> Result<PathBuf, RealClientError> {
    let output = Command::new("python3")
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()
        .map_err(|e| RealClientError::NoGrpcio(format!("running python3: {e}")))?;
    if !output.status.success() {
        return Err(RealClientError::NoGrpcio(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ));
    }
    Ok(PathBuf::from("python3"))
}

/// The grpcio GetInfo script.
pub fn grpcio_get_info_script() -> PathBuf {
    workspace_dir().join("tests/python/grpcio_get_info.py")
}
