//! A private containerd per test: root, state, config, CRI socket, NRI
//! socket, CDI spec dir, runc state and pod logs all live under one short
//! directory (`/tmp/dcpu-XXXXXX`, so socket paths stay far below the 107-byte
//! limit), with NRI and CDI enabled and `restrict_oom_score_adj` on (no
//! CAP_SYS_RESOURCE here).
//!
//! Cleanup is by PID and by path, never by name: containerd is stopped with
//! SIGTERM then SIGKILL, then the shims whose `-address` is this instance's
//! socket are killed, the pod cgroups it created (recorded in a ledger before
//! each RunPodSandbox) are removed from every cgroup hierarchy, its mounts are
//! detached, its shim sockets under `/run/containerd/s` are removed, and so is
//! its directory. A run that crashed leaves its directory with an `owner` file
//! naming a dead process: the next start reaps it.
//!
//! Pods get the kubelet cgroup parent `/kubepods/pod<uid>` (runc, driven by
//! containerd's cgroupfs driver, puts a container at
//! `<cgroup root>/kubepods/pod<uid>/<container id>`: under
//! `/sys/fs/cgroup/cpuset` and each other v1 hierarchy on a v1 host, under
//! `/sys/fs/cgroup` on a v2 host, where `start` first lists `+cpuset` in the
//! root's `cgroup.subtree_control`); pod UIDs are
//! unique, so concurrent instances never share a pod cgroup. The empty
//! `/kubepods` directories themselves are left in place: they are shared, and
//! removing one could race with another instance creating a pod under it.
//! Likewise the shared, empty `/run/containerd/s` directory stays.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

use crate::cgroup;
use crate::cri::{pod_cgroup_parent, CriClient};
use crate::image::{self, OciArchive, SANDBOX_IMAGE, WORKLOAD_IMAGE};

pub const CONTAINERD_BIN: &str = "/usr/bin/containerd";
pub const CTR_BIN: &str = "/usr/bin/ctr";
/// Prefix of instance directories; the reaper only looks at these.
pub const INSTANCE_PREFIX: &str = "dcpu-";
/// containerd 1.7 puts shim sockets here whatever its state dir is.
pub const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
/// The containerd namespace the CRI plugin uses.
pub const CRI_NAMESPACE: &str = "k8s.io";

const OWNER_FILE: &str = "owner";
const POD_LEDGER: &str = "pods";
const INSTALL_HINT: &str = "run scripts/install-deps.sh (as root) to install containerd 1.7 with NRI, runc and busybox-static";

#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("{path} not found: {INSTALL_HINT}")]
    NotInstalled { path: PathBuf },
    #[error("cannot create the instance directory under {parent}: {source}")]
    CreateDir { parent: PathBuf, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot start {CONTAINERD_BIN} with {config}: {source}")]
    Spawn { config: PathBuf, source: io::Error },
    #[error("containerd ({config}) exited during start-up ({status}); log tail:\n{log_tail}")]
    Exited {
        config: PathBuf,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error(
        "containerd ({config}) not ready after {waited:?}: {waiting_for}; log tail:\n{log_tail}"
    )]
    NotReady {
        config: PathBuf,
        waited: Duration,
        waiting_for: String,
        log_tail: String,
    },
    #[error("cannot build the test image: {0}")]
    ImageBuild(String),
    #[error(transparent)]
    Image(#[from] image::ImageError),
    #[error(transparent)]
    Cri(#[from] crate::cri::CriError),
    #[error("cleanup of {dir} incomplete: {problems:?}")]
    Cleanup { dir: PathBuf, problems: Vec<String> },
    #[error("pods cannot get a cpuset cgroup on this host: {0}")]
    Cgroup(#[from] cgroup::CgroupError),
}

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

/// Field 22 (start time in clock ticks) of `/proc/<pid>/stat` text; the
/// command name before it may contain spaces and parentheses.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // after_name starts with field 3 (state); field 22 is 19 further.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

fn process_start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The owner record `"<pid> <start time>"` of an instance directory.
pub fn parse_owner(text: &str) -> Option<(u32, u64)> {
    let mut parts = text.split_whitespace();
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    Some((pid, start))
}

fn owner_alive(owner_file: &Path) -> bool {
    let Some((pid, start)) = std::fs::read_to_string(owner_file)
        .ok()
        .as_deref()
        .and_then(parse_owner)
    else {
        return false;
    };
    process_start_time(pid) == Some(start)
}

/// Processes whose command line says they belong to the instance at
/// `paths`: its containerd (`--config <dir>/config.toml`) and its shims
/// (`-address <dir>/cri.sock`).
pub fn instance_processes(paths: &InstancePaths) -> Vec<u32> {
    let config = paths.config().to_string_lossy().to_string();
    let address = paths.cri_socket().to_string_lossy().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own_pid = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own_pid)
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.windows(2).any(|pair| {
                let (flag, value) = (pair[0], pair[1]);
                ((flag == b"--config" || flag == b"-c") && value == config.as_bytes())
                    || ((flag == b"-address" || flag == b"--address")
                        && value == address.as_bytes())
            })
        })
        .collect()
}

fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        // A zombie child of ours still has a /proc entry; reap it if it is one.
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid as i32),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if state
            .rsplit_once(')')
            .map(|(_, s)| s.trim_start().starts_with('Z'))
            == Some(true)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Mount points under `dir` in this mount namespace, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Task ids (containers and sandboxes) containerd keeps state for.
fn task_ids(paths: &InstancePaths) -> Vec<String> {
    let dir = paths
        .state()
        .join("io.containerd.runtime.v2.task")
        .join(CRI_NAMESPACE);
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes everything an instance left: processes, pod cgroups, mounts,
/// shim sockets, its directory. Used by `stop`, by `Drop` and by the reaper.
/// Returns what could not be cleaned.
pub fn clean_instance(paths: &InstancePaths) -> Vec<String> {
    let mut problems = Vec::new();
    // Shim sockets are named by task id; learn the ids before state goes.
    let ids = task_ids(paths);
    for pid in instance_processes(paths) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        if !wait_gone(pid, Duration::from_secs(5)) {
            problems.push(format!("process {pid} survived SIGKILL"));
        }
    }
    let uids = std::fs::read_to_string(paths.pod_ledger()).unwrap_or_default();
    for uid in uids.lines().map(str::trim).filter(|u| !u.is_empty()) {
        if let Err(e) = cgroup::remove_everywhere(&pod_cgroup_parent(uid)) {
            problems.push(e.to_string());
        }
    }
    for point in mounts_under(&paths.dir) {
        if let Err(e) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
            problems.push(format!("cannot unmount {}: {e}", point.display()));
        }
    }
    for id in &ids {
        let socket = shim_socket_path(&paths.cri_socket(), CRI_NAMESPACE, id);
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => problems.push(format!("cannot remove {}: {e}", socket.display())),
        }
    }
    let left_mounted = mounts_under(&paths.dir);
    if !left_mounted.is_empty() {
        // Deleting through a live mount could reach files that are not ours.
        problems.push(format!("still mounted, directory kept: {left_mounted:?}"));
        return problems;
    }
    match std::fs::remove_dir_all(&paths.dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => problems.push(format!("cannot remove {}: {e}", paths.dir.display())),
    }
    problems
}

/// Cleans every instance directory under `parent` whose owner process is
/// gone (a crashed or killed test run). Returns the directories reaped.
pub fn reap_stale_instances(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut reaped = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(INSTANCE_PREFIX) {
            continue;
        }
        let paths = InstancePaths { dir: entry.path() };
        // Only directories this harness made carry an owner file; one being
        // created right now has its owner alive.
        if !paths.owner().exists() || owner_alive(&paths.owner()) {
            continue;
        }
        let problems = clean_instance(&paths);
        if !problems.is_empty() {
            eprintln!(
                "containerd harness: stale instance {} not fully cleaned: {problems:?}",
                paths.dir.display()
            );
        }
        reaped.push(paths.dir);
    }
    reaped
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn test_image() -> Result<&'static OciArchive, ContainerdError> {
    static IMAGE: OnceLock<Result<OciArchive, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| image::build_busybox_image().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| ContainerdError::ImageBuild(e.clone()))
}

/// A running private containerd. Dropping it stops it and cleans up.
#[derive(Debug)]
pub struct Containerd {
    paths: InstancePaths,
    options: ContainerdOptions,
    child: Option<Child>,
}

impl Containerd {
    /// Reaps stale instances, creates a fresh instance directory, starts
    /// containerd in it and waits until CRI answers, the NRI socket exists
    /// and (unless disabled) the test image is visible through CRI.
    pub async fn start(options: ContainerdOptions) -> Result<Containerd, ContainerdError> {
        for bin in [CONTAINERD_BIN, CTR_BIN, image::BUSYBOX_PATH] {
            if !Path::new(bin).exists() {
                return Err(ContainerdError::NotInstalled {
                    path: PathBuf::from(bin),
                });
            }
        }
        // On cgroup v2 the pod cgroups under /kubepods get cpuset files only
        // when the hierarchy's root enables the controller for its children.
        cgroup::enable_cpuset_for_pods()?;
        reap_stale_instances(&options.parent_dir);
        let dir = tempfile::Builder::new()
            .prefix(INSTANCE_PREFIX)
            .rand_bytes(6)
            .tempdir_in(&options.parent_dir)
            .map_err(|source| ContainerdError::CreateDir {
                parent: options.parent_dir.clone(),
                source,
            })?
            .keep();
        let paths = InstancePaths { dir };
        let write = |path: PathBuf, contents: String| {
            std::fs::write(&path, contents)
                .map_err(|source| ContainerdError::Write { path, source })
        };
        let own_pid = std::process::id();
        let own_start = process_start_time(own_pid).unwrap_or(0);
        // From here on, dropping `instance` cleans the directory.
        let mut instance = Containerd {
            paths: paths.clone(),
            options: options.clone(),
            child: None,
        };
        write(paths.owner(), format!("{own_pid} {own_start}\n"))?;
        for dir in [paths.cdi_dir(), paths.pod_logs(), paths.runc_root()] {
            std::fs::create_dir_all(&dir).map_err(|source| ContainerdError::Write {
                path: dir.clone(),
                source,
            })?;
        }
        write(paths.config(), render_config(&paths, &options))?;
        instance.spawn()?;
        instance.wait_ready().await?;
        if options.import_image {
            let archive = test_image()?;
            let (archive_path, address) = (paths.image_archive(), paths.cri_socket());
            let archive = archive.clone();
            tokio::task::spawn_blocking(move || image::import(&archive, &archive_path, &address))
                .await
                .map_err(|e| ContainerdError::ImageBuild(format!("import task failed: {e}")))??;
            instance.wait_images().await?;
        }
        Ok(instance)
    }

    fn spawn(&mut self) -> Result<(), ContainerdError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.paths.log())
            .map_err(|source| ContainerdError::Write {
                path: self.paths.log(),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| ContainerdError::Write {
            path: self.paths.log(),
            source,
        })?;
        let child = Command::new(CONTAINERD_BIN)
            .arg("--config")
            .arg(self.paths.config())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: a ^C to the test run must not reach it
            // before the harness has cleaned up.
            .process_group(0)
            .spawn()
            .map_err(|source| ContainerdError::Spawn {
                config: self.paths.config(),
                source,
            })?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<(), ContainerdError> {
        let started = Instant::now();
        let mut waiting_for;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(ContainerdError::Exited {
                        config: self.paths.config(),
                        status,
                        log_tail: log_tail(&self.paths.log()),
                    });
                }
            }
            waiting_for = match CriClient::connect(&self.paths.cri_socket()).await {
                Ok(mut cri) => match cri.version().await {
                    // NRI answers when it accepts a connection; a plugin that
                    // never registers is dropped by containerd after the
                    // registration timeout, so this probe leaves nothing.
                    Ok(_) if !self.options.nri => return Ok(()),
                    Ok(_) => match std::os::unix::net::UnixStream::connect(self.paths.nri_socket())
                    {
                        Ok(_) => return Ok(()),
                        Err(e) => format!("NRI socket {}: {e}", self.paths.nri_socket().display()),
                    },
                    Err(e) => format!("CRI Version: {e}"),
                },
                Err(e) => format!("CRI socket: {e}"),
            };
            if started.elapsed() > self.options.start_timeout {
                return Err(ContainerdError::NotReady {
                    config: self.paths.config(),
                    waited: started.elapsed(),
                    waiting_for,
                    log_tail: log_tail(&self.paths.log()),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The CRI image service learns of imported images through events.
    async fn wait_images(&mut self) -> Result<(), ContainerdError> {
        let started = Instant::now();
        let mut cri = CriClient::connect(&self.paths.cri_socket()).await?;
        for image in [WORKLOAD_IMAGE, SANDBOX_IMAGE] {
            while !cri.image_present(image).await? {
                if started.elapsed() > self.options.start_timeout {
                    return Err(ContainerdError::NotReady {
                        config: self.paths.config(),
                        waited: started.elapsed(),
                        waiting_for: format!("image {image} in CRI"),
                        log_tail: log_tail(&self.paths.log()),
                    });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    /// Stops the containerd process only (shims and containers keep running).
    fn terminate(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(mut child) = self.child.take() else {
            return problems;
        };
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return problems,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
        let _ = child.kill();
        if let Err(e) = child.wait() {
            problems.push(format!("containerd {pid} not reaped: {e}"));
        }
        problems
    }

    pub fn paths(&self) -> &InstancePaths {
        &self.paths
    }
    pub fn dir(&self) -> &Path {
        &self.paths.dir
    }
    pub fn cri_socket(&self) -> PathBuf {
        self.paths.cri_socket()
    }
    pub fn nri_socket(&self) -> PathBuf {
        self.paths.nri_socket()
    }
    pub fn cdi_dir(&self) -> PathBuf {
        self.paths.cdi_dir()
    }
    /// The containerd process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
    pub fn log_tail(&self) -> String {
        log_tail(&self.paths.log())
    }

    /// A CRI client of this instance that records pod UIDs for cleanup.
    pub async fn cri(&self) -> Result<CriClient, ContainerdError> {
        Ok(CriClient::connect(&self.paths.cri_socket())
            .await?
            .with_pod_ledger(self.paths.pod_ledger())
            .with_log_root(self.paths.pod_logs()))
    }

    /// Stops containerd and starts it again on the same directories, as a
    /// node's containerd restart: running containers survive in their shims.
    pub async fn restart(&mut self) -> Result<(), ContainerdError> {
        let problems = self.terminate();
        if !problems.is_empty() {
            return Err(ContainerdError::Cleanup {
                dir: self.paths.dir.clone(),
                problems,
            });
        }
        // containerd recreates the NRI socket; a stale one would satisfy the
        // readiness check too early.
        let _ = std::fs::remove_file(self.paths.nri_socket());
        self.spawn()?;
        self.wait_ready().await?;
        if self.options.import_image {
            self.wait_images().await?;
        }
        Ok(())
    }

    /// Stops containerd and removes everything this instance created.
    pub fn stop(mut self) -> Result<(), ContainerdError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ContainerdError> {
        let mut problems = self.terminate();
        if self.paths.dir.exists() {
            problems.extend(clean_instance(&self.paths));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ContainerdError::Cleanup {
                dir: self.paths.dir.clone(),
                problems,
            })
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("containerd harness: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn start_time_parsing_survives_odd_command_names() {
        let fields_after: String = (3..=52).map(|i| format!(" {i}")).collect();
        let table = [
            (format!("1 (sleep){fields_after}"), Some(22)),
            (format!("77 (a b) (c){fields_after}"), Some(22)),
            ("1 (x) S 1".to_string(), None),
            ("garbage".to_string(), None),
        ];
        for (stat, expected) in table {
            assert_eq!(parse_start_time(&stat), expected, "{stat}");
        }
        let own = process_start_time(std::process::id());
        assert!(own.is_some());
    }

    #[test]
    fn owner_records_parse() {
        let table = [
            ("12 345\n", Some((12, 345))),
            ("12", None),
            ("x 1", None),
            ("", None),
        ];
        for (text, expected) in table {
            assert_eq!(parse_owner(text), expected, "{text:?}");
        }
    }

    #[test]
    fn reaper_cleans_dead_owners_and_keeps_live_ones() {
        let parent = tempfile::tempdir().unwrap();
        let dead = parent.path().join(format!("{INSTANCE_PREFIX}dead"));
        let live = parent.path().join(format!("{INSTANCE_PREFIX}live"));
        let foreign = parent.path().join(format!("{INSTANCE_PREFIX}foreign"));
        for dir in [&dead, &live, &foreign] {
            std::fs::create_dir_all(dir.join("state")).unwrap();
        }
        // A pid that cannot exist (above pid_max) stands for a dead owner.
        std::fs::write(dead.join(OWNER_FILE), "4194304999 1\n").unwrap();
        let me = std::process::id();
        let start = process_start_time(me).unwrap();
        std::fs::write(live.join(OWNER_FILE), format!("{me} {start}\n")).unwrap();
        let reaped = reap_stale_instances(parent.path());
        assert_eq!(reaped, vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(live.exists());
        assert!(
            foreign.exists(),
            "a directory without an owner file is not ours"
        );
    }
}
