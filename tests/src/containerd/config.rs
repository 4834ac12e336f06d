//! A private containerd's directory layout and configuration.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{OWNER_FILE, POD_LEDGER, SHIM_SOCKET_DIR};
use crate::image::SANDBOX_IMAGE;

/// How to run a private containerd.
#[derive(Debug, Clone)]
pub struct ContainerdOptions {
    /// Serve the NRI socket (`[plugins."io.containerd.nri.v1.nri"]`).
    pub nri: bool,
    /// NRI `plugin_registration_timeout` (containerd's default is 5 s).
    pub nri_registration_timeout: Duration,
    /// NRI `plugin_request_timeout` (containerd's default is 2 s).
    pub nri_request_timeout: Duration,
    /// Import the busybox test image under the workload and sandbox tags.
    pub import_image: bool,
    /// How long to wait for the sockets to answer.
    pub start_timeout: Duration,
    /// Where instance directories are created (keep it short).
    pub parent_dir: PathBuf,
    /// The directory holding `containerd`, `ctr` and
    /// `containerd-shim-runc-v2`: Debian's 1.7 in `/usr/bin` by default, or
    /// a build of another release (scripts/build-components.sh). containerd
    /// 2.x reads this version-2 config too (it migrates it at start).
    pub bin_dir: PathBuf,
}

impl ContainerdOptions {
    pub fn containerd_bin(&self) -> PathBuf {
        self.bin_dir.join("containerd")
    }
    pub fn ctr_bin(&self) -> PathBuf {
        self.bin_dir.join("ctr")
    }
}

impl Default for ContainerdOptions {
    fn default() -> Self {
        ContainerdOptions {
            nri: true,
            nri_registration_timeout: Duration::from_secs(5),
            nri_request_timeout: Duration::from_secs(2),
            import_image: true,
            start_timeout: Duration::from_secs(60),
            parent_dir: PathBuf::from("/tmp"),
            bin_dir: PathBuf::from(super::DEFAULT_BIN_DIR),
        }
    }
}

/// The paths of one instance, all under its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstancePaths {
    pub dir: PathBuf,
}

impl InstancePaths {
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    /// containerd's gRPC address, which also serves CRI.
    pub fn cri_socket(&self) -> PathBuf {
        self.dir.join("cri.sock")
    }
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri.sock")
    }
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn pod_ledger(&self) -> PathBuf {
        self.dir.join(POD_LEDGER)
    }
    pub fn owner(&self) -> PathBuf {
        self.dir.join(OWNER_FILE)
    }
    pub fn image_archive(&self) -> PathBuf {
        self.dir.join("image.tar")
    }
}

fn duration_toml(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn toml_string(path: &Path) -> String {
    // Paths here are ours (ASCII, no quotes); escape anyway so a surprising
    // temp dir cannot break the file.
    let text = path.to_string_lossy();
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// The containerd 1.7 config (version 2 schema) of an instance.
pub fn render_config(paths: &InstancePaths, options: &ContainerdOptions) -> String {
    let p = |path: PathBuf| toml_string(&path);
    format!(
        r#"version = 2
root = {root}
state = {state}
oom_score = 0

[grpc]
  address = {cri_socket}

[ttrpc]
  address = ""

[debug]
  level = "info"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{sandbox_image}"
    enable_cdi = true
    cdi_spec_dirs = [{cdi_dir}]
    restrict_oom_score_adj = true
    disable_apparmor = true
    disable_tcp_service = true
    systemd_cgroup = false
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = {runc_root}
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = {cni_bin}
      conf_dir = {cni_conf}
  [plugins."io.containerd.nri.v1.nri"]
    disable = {nri_disable}
    disable_connections = false
    plugin_config_path = {nri_conf}
    plugin_path = {nri_plugins}
    plugin_registration_timeout = "{nri_registration}"
    plugin_request_timeout = "{nri_request}"
    socket_path = {nri_socket}
"#,
        root = p(paths.root()),
        state = p(paths.state()),
        cri_socket = p(paths.cri_socket()),
        sandbox_image = SANDBOX_IMAGE,
        cdi_dir = p(paths.cdi_dir()),
        runc_root = p(paths.runc_root()),
        cni_bin = p(paths.dir.join("cni/bin")),
        cni_conf = p(paths.dir.join("cni/conf")),
        nri_disable = !options.nri,
        nri_conf = p(paths.dir.join("nri/conf.d")),
        nri_plugins = p(paths.dir.join("nri/plugins")),
        nri_registration = duration_toml(options.nri_registration_timeout),
        nri_request = duration_toml(options.nri_request_timeout),
        nri_socket = p(paths.nri_socket()),
    )
}

/// containerd 1.7's shim socket for a task: `/run/containerd/s/` followed by
/// the hex sha256 of `<grpc address>/<namespace>/<id>` (`shim.SocketAddress`).
pub fn shim_socket_path(address: &Path, namespace: &str, id: &str) -> PathBuf {
    let key = address.join(namespace).join(id);
    let digest = Sha256::digest(key.to_string_lossy().as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Path::new(SHIM_SOCKET_DIR).join(hex)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerd::CRI_NAMESPACE;

    #[test]
    fn config_keeps_everything_under_the_instance_dir() {
        let paths = InstancePaths {
            dir: PathBuf::from("/tmp/dcpu-abc123"),
        };
        let config = render_config(&paths, &ContainerdOptions::default());
        for line in config.lines().filter(|l| l.contains("\"/")) {
            assert!(
                line.contains("\"/tmp/dcpu-abc123/"),
                "escapes the instance dir: {line}"
            );
        }
        for wanted in [
            "enable_cdi = true",
            "cdi_spec_dirs = [\"/tmp/dcpu-abc123/cdi\"]",
            "restrict_oom_score_adj = true",
            "disable = false",
            "socket_path = \"/tmp/dcpu-abc123/nri.sock\"",
            "plugin_request_timeout = \"2000ms\"",
            "plugin_registration_timeout = \"5000ms\"",
            "SystemdCgroup = false",
            "sandbox_image = \"dra-cpu.test/pause:1\"",
        ] {
            assert!(config.contains(wanted), "missing {wanted}");
        }
        let no_nri = render_config(
            &paths,
            &ContainerdOptions {
                nri: false,
                ..Default::default()
            },
        );
        assert!(no_nri.contains("disable = true"));
    }

    #[test]
    fn socket_paths_fit_sun_path() {
        // A tempdir name under /tmp: prefix plus 6 random characters.
        let paths = InstancePaths {
            dir: PathBuf::from("/tmp/dcpu-XXXXXX"),
        };
        for socket in [paths.cri_socket(), paths.nri_socket()] {
            assert!(socket.as_os_str().len() < 108, "{}", socket.display());
        }
        let shim = shim_socket_path(&paths.cri_socket(), CRI_NAMESPACE, &"f".repeat(64));
        assert!(shim.as_os_str().len() < 108);
    }

    #[test]
    fn shim_socket_is_sha256_of_address_namespace_id() {
        // sha256("/a/k8s.io/b")
        let path = shim_socket_path(Path::new("/a"), "k8s.io", "b");
        let expected: String = Sha256::digest(b"/a/k8s.io/b")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(path, Path::new(SHIM_SOCKET_DIR).join(expected));
        assert_ne!(path, shim_socket_path(Path::new("/a"), "k8s.io", "c"));
    }
}
