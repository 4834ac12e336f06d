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

/// The OCI image layout archive around one layer, with `index.json` naming the
/// manifest under every tag in `tags` (`io.containerd.image.name`, which
/// `ctr images import` uses as the image name).
pub fn build_archive(layer: &[u8], tags: &[&str]) -> io::Result<OciArchive> {
    let layer_hex = sha256_hex(layer);
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/bin/sleep", "infinity"],
            "Env": ["PATH=/bin"],
            "WorkingDir": "/",
            // Workloads run `sleep` as PID 1, which ignores SIGTERM: a stop
            // would otherwise wait out the whole grace period.
            "StopSignal": "SIGKILL"
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
        "history": [{"created_by": "dra-cpu test harness: busybox-static", "created": "1970-01-01T00:00:00Z"}],
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

/// Writes the archive to `path` and imports it into the `k8s.io` namespace of
/// the containerd listening on `address` (where the CRI plugin looks).
pub fn import(archive: &OciArchive, path: &Path, address: &Path) -> Result<(), ImageError> {
    std::fs::write(path, &archive.bytes).map_err(|source| ImageError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    let output = Command::new("ctr")
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
    fn archive_is_reproducible() {
        let layer = build_layer(b"same input").unwrap();
        let a = build_archive(&layer, &[WORKLOAD_IMAGE]).unwrap();
        let b = build_archive(&build_layer(b"same input").unwrap(), &[WORKLOAD_IMAGE]).unwrap();
        assert_eq!(a, b);
        let c = build_archive(&build_layer(b"other input").unwrap(), &[WORKLOAD_IMAGE]).unwrap();
        assert_ne!(a.layer_digest, c.layer_digest);
    }
}
