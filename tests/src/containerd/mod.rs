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

pub mod cleanup;
pub mod config;

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cgroup;
use crate::cri::CriClient;
use crate::image::{self, OciArchive, SANDBOX_IMAGE, WORKLOAD_IMAGE};
use cleanup::{clean_instance, process_start_time, reap_stale_instances};
use config::{render_config, ContainerdOptions, InstancePaths};

/// Where Debian's containerd 1.7, its shim and `ctr` are installed.
pub const DEFAULT_BIN_DIR: &str = "/usr/bin";
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
    #[error("cannot start {} with {config}: {source}", bin.display())]
    Spawn {
        bin: PathBuf,
        config: PathBuf,
        source: io::Error,
    },
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
        for bin in [
            options.containerd_bin(),
            options.ctr_bin(),
            options.bin_dir.join("containerd-shim-runc-v2"),
            PathBuf::from(image::BUSYBOX_PATH),
        ] {
            if !bin.exists() {
                return Err(ContainerdError::NotInstalled { path: bin });
            }
        }
        // On cgroup v2 the pod cgroups under /kubepods get cpuset files only
        // when the hierarchy's root enables the controller for its children.
        cgroup::hierarchy::enable_cpuset_for_pods()?;
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
            let ctr = options.ctr_bin();
            let archive = archive.clone();
            tokio::task::spawn_blocking(move || {
                image::import(&ctr, &archive, &archive_path, &address)
            })
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
        // containerd runs the shim found first on its PATH: the one of the
        // same release.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(
            std::iter::once(self.options.bin_dir.clone()).chain(std::env::split_paths(&path)),
        )
        .unwrap_or(path);
        let child = Command::new(self.options.containerd_bin())
            .arg("--config")
            .arg(self.paths.config())
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: a ^C to the test run must not reach it
            // before the harness has cleaned up.
            .process_group(0)
            .spawn()
            .map_err(|source| ContainerdError::Spawn {
                bin: self.options.containerd_bin(),
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
