//! A tiny OCI image built from the static busybox binary, for nodes that reach
//! no registry. One image serves as the workload image and as the sandbox
//! (pause) image: its entrypoint sleeps forever, and workloads override it.
//!
//! The archive is an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/*`) with an uncompressed layer, built byte-for-byte
//! reproducibly (fixed mtimes and owners) so every run imports the same digest.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

/// The tag workloads run (`ContainerConfig.image`).
pub const WORKLOAD_IMAGE: &str = "dra-cpu.test/busybox:1";
/// The tag containerd's CRI plugin uses for pod sandboxes (`sandbox_image`).
pub const SANDBOX_IMAGE: &str = "dra-cpu.test/pause:1";
/// Where Debian's busybox-static installs the binary.
pub const BUSYBOX_PATH: &str = "/bin/busybox";

/// Applets linked into `/bin` next to busybox: what tests run inside containers.
const APPLETS: &[&str] = &[
    "sh", "ash", "sleep", "cat", "grep", "env", "ls", "echo", "true", "false", "ps", "taskset",
    "nproc", "mkdir", "rm", "touch", "awk", "sed", "head", "tail", "wc", "kill", "id", "test", "[",
    "printf", "tr", "cut", "sort", "uniq", "hostname", "mount", "stat", "readlink", "yes",
    "timeout", "date",
];

/// Fixed timestamp of every tar entry, so the layer digest never changes.
const EPOCH: u64 = 0;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot read {path} (install busybox-static: scripts/install-deps.sh): {source}")]
    ReadBusybox { path: PathBuf, source: io::Error },
    #[error("cannot read {path} for the image: {source}")]
    ReadFile { path: PathBuf, source: io::Error },
    #[error("cannot list the shared libraries of {binary} with ldd: {detail}")]
    Ldd { binary: PathBuf, detail: String },
    #[error("cannot build the image archive: {0}")]
    Archive(#[source] io::Error),
    #[error("cannot write the image archive {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot run ctr to import {archive}: {source}")]
    RunCtr { archive: PathBuf, source: io::Error },
    #[error("`ctr images import {archive}` failed ({status}): {stderr}")]
    Import {
        archive: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// A built OCI archive and the digests inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciArchive {
    /// The whole `.tar` (OCI image layout).
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of the image manifest.
    pub manifest_digest: String,
    /// `sha256:<hex>` of the (uncompressed) layer, which is also its diff id.
    pub layer_digest: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn header(kind: tar::EntryType, path: &str, mode: u32, size: u64) -> io::Result<tar::Header> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_path(path)?;
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(EPOCH);
    header.set_uid(0);
    header.set_gid(0);
    Ok(header)
}

fn append_file(
    builder: &mut tar::Builder<Vec<u8>>,
    path: &str,
    mode: u32,
    data: &[u8],
) -> io::Result<()> {
    let mut h = header(tar::EntryType::Regular, path, mode, data.len() as u64)?;
    h.set_cksum();
    builder.append(&h, data)
}

/// The root filesystem layer: busybox, its applet links, and the empty
/// directories a container runtime mounts over.
pub fn build_layer(busybox: &[u8]) -> io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for dir in [
        "bin/", "dev/", "etc/", "proc/", "sys/", "tmp/", "run/", "var/",
    ] {
        let mode = if dir == "tmp/" { 0o1777 } else { 0o755 };
        let mut h = header(tar::EntryType::Directory, dir, mode, 0)?;
        h.set_cksum();
        builder.append(&h, io::empty())?;
    }
    append_file(&mut builder, "bin/busybox", 0o755, busybox)?;
    for applet in APPLETS {
        let mut h = header(tar::EntryType::Symlink, &format!("bin/{applet}"), 0o777, 0)?;
        h.set_link_name("busybox")?;
        h.set_cksum();
        builder.append(&h, io::empty())?;
    }
    append_file(
        &mut builder,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    )?;
    append_file(
        &mut builder,
        "etc/group",
        0o644,
        b"root:x:0:\nnogroup:x:65534:\n",
    )?;
    builder.into_inner()
}

/// What an image runs: its entrypoint and environment, and the line its
/// history records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    pub created_by: String,
    /// Workloads run `sleep` as PID 1, which ignores SIGTERM: a stop would
    /// otherwise wait out the whole grace period.
    pub stop_signal: Option<String>,
}

impl ImageConfig {
    /// The busybox test image: sleeps forever unless a workload says otherwise.
    pub fn busybox() -> Self {
        ImageConfig {
            entrypoint: vec!["/bin/sleep".into(), "infinity".into()],
            env: vec!["PATH=/bin".into()],
            created_by: "dra-cpu test harness: busybox-static".into(),
            stop_signal: Some("SIGKILL".into()),
        }
    }
}

/// The OCI image layout archive around one layer, with `index.json` naming the
/// manifest under every tag in `tags` (`io.containerd.image.name`, which
/// `ctr images import` uses as the image name).
pub fn build_archive(layer: &[u8], tags: &[&str]) -> io::Result<OciArchive> {
    build_archive_with(layer, tags, &ImageConfig::busybox())
}

/// [`build_archive`] with the image's own configuration.
pub fn build_archive_with(
    layer: &[u8],
    tags: &[&str],
    image: &ImageConfig,
) -> io::Result<OciArchive> {
    let layer_hex = sha256_hex(layer);
    let mut runtime = json!({
        "Entrypoint": image.entrypoint,
        "Env": image.env,
        "WorkingDir": "/",
    });
    if let Some(signal) = &image.stop_signal {
        runtime["StopSignal"] = json!(signal);
    }
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
        "history": [{"created_by": image.created_by, "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z"
    });
    let config_bytes = serde_json::to_vec(&config).map_err(io::Error::other)?;
    let config_hex = sha256_hex(&config_bytes);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_hex}"),
            "size": config_bytes.len()
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_hex}"),
            "size": layer.len()
        }]
    });
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(io::Error::other)?;
    let manifest_hex = sha256_hex(&manifest_bytes);
    let manifests: Vec<_> = tags
        .iter()
        .map(|tag| {
            json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{manifest_hex}"),
                "size": manifest_bytes.len(),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": tag}
            })
        })
        .collect();
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests});
    let index_bytes = serde_json::to_vec(&index).map_err(io::Error::other)?;

    let mut builder = tar::Builder::new(Vec::new());
    append_file(
        &mut builder,
        "oci-layout",
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    append_file(&mut builder, "index.json", 0o644, &index_bytes)?;
    for (hex, bytes) in [
        (&layer_hex, layer),
        (&config_hex, config_bytes.as_slice()),
        (&manifest_hex, manifest_bytes.as_slice()),
    ] {
        append_file(&mut builder, &format!("blobs/sha256/{hex}"), 0o644, bytes)?;
    }
    Ok(OciArchive {
        bytes: builder.into_inner()?,
        manifest_digest: format!("sha256:{manifest_hex}"),
        layer_digest: format!("sha256:{layer_hex}"),
    })
}

/// Builds the test image from the machine's busybox, tagged as both
/// [`WORKLOAD_IMAGE`] and [`SANDBOX_IMAGE`].
pub fn build_busybox_image() -> Result<OciArchive, ImageError> {
    let busybox = std::fs::read(BUSYBOX_PATH).map_err(|source| ImageError::ReadBusybox {
        path: PathBuf::from(BUSYBOX_PATH),
        source,
    })?;
    let layer = build_layer(&busybox).map_err(ImageError::Archive)?;
    build_archive(&layer, &[WORKLOAD_IMAGE, SANDBOX_IMAGE]).map_err(ImageError::Archive)
}

/// A file of the host copied into an image at `image_path` (relative, no
/// leading `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    pub host_path: PathBuf,
    pub image_path: String,
}

/// The shared libraries `ldd` names for `binary` (the dynamic loader
/// included), each at its host path: what a glibc binary needs in an image
/// without a distribution.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| ImageError::Ldd {
            binary: binary.to_path_buf(),
            detail: source.to_string(),
        })?;
    if !output.status.success() {
        return Err(ImageError::Ldd {
            binary: binary.to_path_buf(),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&output.stdout)))
}

/// The absolute paths in `ldd` output: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`
/// and the loader's own line `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has none.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| {
            let target = match line.split_once("=>") {
                Some((_, right)) => right.trim(),
                None => line.trim(),
            };
            let path = target.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The layer of a distroless image: `files`, the directories they sit in, and
/// the empty directories a container runtime mounts over. Symlinked library
/// paths are stored as the files they resolve to, under the name asked for.
pub fn build_files_layer(files: &[HostFile]) -> Result<Vec<u8>, ImageError> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs: Vec<String> = ["dev/", "etc/", "proc/", "sys/", "tmp/", "run/", "var/"]
        .iter()
        .map(|d| d.to_string())
        .collect();
    for file in files {
        let mut parent = Path::new(&file.image_path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            dirs.push(format!("{}/", dir.display()));
            parent = dir.parent();
        }
    }
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        let mode = if dir == "tmp/" { 0o1777 } else { 0o755 };
        let mut h = header(tar::EntryType::Directory, dir, mode, 0).map_err(ImageError::Archive)?;
        h.set_cksum();
        builder
            .append(&h, io::empty())
            .map_err(ImageError::Archive)?;
    }
    let mut files = files.to_vec();
    files.sort_by(|a, b| a.image_path.cmp(&b.image_path));
    files.dedup_by(|a, b| a.image_path == b.image_path);
    for file in &files {
        let data = std::fs::read(&file.host_path).map_err(|source| ImageError::ReadFile {
            path: file.host_path.clone(),
            source,
        })?;
        append_file(&mut builder, &file.image_path, 0o755, &data).map_err(ImageError::Archive)?;
    }
    append_file(
        &mut builder,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/:/sbin/nologin\n",
    )
    .map_err(ImageError::Archive)?;
    append_file(&mut builder, "etc/group", 0o644, b"root:x:0:\n").map_err(ImageError::Archive)?;
    builder.into_inner().map_err(ImageError::Archive)
}

/// The driver's image: each of `binaries` at `/usr/bin/<file name>` with the
/// shared libraries they link, entrypoint the first binary.
pub fn build_driver_image(binaries: &[PathBuf], tag: &str) -> Result<OciArchive, ImageError> {
    let mut files = Vec::new();
    for binary in binaries {
        let name = binary
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .ok_or_else(|| ImageError::ReadFile {
                path: binary.clone(),
                source: io::Error::other("not a file path"),
            })?;
        files.push(HostFile {
            host_path: binary.clone(),
            image_path: format!("usr/bin/{name}"),
        });
        for library in shared_libraries(binary)? {
            let image_path = library
                .to_string_lossy()
                .trim_start_matches('/')
                .to_string();
            files.push(HostFile {
                host_path: library,
                image_path,
            });
        }
    }
    let entrypoint = files
        .first()
        .map(|f| format!("/{}", f.image_path))
        .into_iter()
        .collect();
    let layer = build_files_layer(&files)?;
    let config = ImageConfig {
        entrypoint,
        env: vec!["PATH=/usr/bin".into()],
        created_by: "dra-cpu: dra-plugin and nri-plugin with their shared libraries".into(),
        stop_signal: None,
    };
    build_archive_with(&layer, &[tag], &config).map_err(ImageError::Archive)
}

/// Writes the archive to `path` and imports it with `ctr` into the `k8s.io`
/// namespace of the containerd listening on `address` (where the CRI plugin
/// looks).
pub fn import(
    ctr: &Path,
    archive: &OciArchive,
    path: &Path,
    address: &Path,
) -> Result<(), ImageError> {
    std::fs::write(path, &archive.bytes).map_err(|source| ImageError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    let output = Command::new(ctr)
        .arg("--address")
        .arg(address)
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(path)
        .output()
        .map_err(|source| ImageError::RunCtr {
            archive: path.to_path_buf(),
            source,
        })?;
    if !output.status.success() {
        return Err(ImageError::Import {
            archive: path.to_path_buf(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    fn entries(archive: &[u8]) -> BTreeMap<String, (tar::EntryType, Vec<u8>, Option<String>)> {
        let mut out = BTreeMap::new();
        let mut reader = tar::Archive::new(archive);
        for entry in reader.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().to_string();
            let kind = entry.header().entry_type();
            let link = entry
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().to_string());
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.insert(path, (kind, data, link));
        }
        out
    }

    #[test]
    fn layer_holds_busybox_and_applet_links() {
        let layer = build_layer(b"fake busybox").unwrap();
        let files = entries(&layer);
        assert_eq!(files["bin/busybox"].1, b"fake busybox");
        for applet in ["sh", "sleep", "cat", "grep", "env"] {
            let (kind, _, link) = &files[&format!("bin/{applet}")];
            assert_eq!(*kind, tar::EntryType::Symlink, "{applet}");
            assert_eq!(link.as_deref(), Some("busybox"), "{applet}");
        }
        assert_eq!(files["proc/"].0, tar::EntryType::Directory);
    }

    #[test]
    fn archive_blobs_match_their_digests_and_tags() {
        let layer = build_layer(b"fake busybox").unwrap();
        let archive = build_archive(&layer, &["a.test/x:1", "a.test/y:2"]).unwrap();
        let files = entries(&archive.bytes);
        for (path, (_, data, _)) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(sha256_hex(data), hex, "blob {path}");
            }
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"].1).unwrap();
        let names: Vec<_> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                assert_eq!(m["digest"], archive.manifest_digest.as_str());
                m["annotations"]["io.containerd.image.name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["a.test/x:1", "a.test/y:2"]);
        let manifest_hex = archive.manifest_digest.strip_prefix("sha256:").unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{manifest_hex}")].1).unwrap();
        assert_eq!(
            manifest["layers"][0]["digest"],
            archive.layer_digest.as_str()
        );
        let config_digest = manifest["config"]["digest"].as_str().unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{}", &config_digest[7..])].1)
                .unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            archive.layer_digest.as_str()
        );
    }

    #[test]
    fn ldd_lines_give_library_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n").is_empty());
    }

    #[test]
    fn files_layer_holds_files_and_their_directories() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("tool");
        std::fs::write(&host, b"binary").unwrap();
        let layer = build_files_layer(&[HostFile {
            host_path: host,
            image_path: "usr/bin/tool".into(),
        }])
        .unwrap();
        let files = entries(&layer);
        assert_eq!(files["usr/bin/tool"].1, b"binary");
        assert_eq!(files["usr/"].0, tar::EntryType::Directory);
        assert_eq!(files["usr/bin/"].0, tar::EntryType::Directory);
        assert_eq!(files["tmp/"].0, tar::EntryType::Directory);
        let missing = build_files_layer(&[HostFile {
            host_path: dir.path().join("absent"),
            image_path: "usr/bin/absent".into(),
        }]);
        assert!(matches!(missing, Err(ImageError::ReadFile { .. })));
    }

    #[test]
    fn archive_is_reproducible() {
        let layer = build_layer(b"same input").unwrap();
        let a = build_archive(&layer, &[WORKLOAD_IMAGE]).unwrap();
        let b = build_archive(&build_layer(b"same input").unwrap(), &[WORKLOAD_IMAGE]).unwrap();
        assert_eq!(a, b);
        let c = build_archive(&build_layer(b"other input").unwrap(), &[WORKLOAD_IMAGE]).unwrap();
        assert_ne!(a.layer_digest, c.layer_digest);
    }
}
