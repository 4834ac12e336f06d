//! One product process of a node, its log and its HTTP endpoints.

use super::NodeError;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One product process.
#[derive(Debug)]
pub(super) struct Process {
    pub(super) what: &'static str,
    pub(super) bin: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) log: PathBuf,
    /// Set for its next starts (a crash point, for crash tests).
    pub(super) env: Vec<(String, String)>,
    /// Runs it in a mount namespace of its own where the directory `.1`
    /// is a read-only bind of `.0` (the host's cgroups as the chart mounts
    /// them into nri-plugin); the mount goes with the process.
    pub(super) read_only_bind: Option<(PathBuf, PathBuf)>,
    pub(super) child: Option<Child>,
}

/// Binds `$1` read-only onto `$2`, then runs the rest of the arguments.
const READ_ONLY_BIND: &str = "mount --bind -o ro \"$1\" \"$2\" && shift 2 && exec \"$@\"";

impl Process {
    pub(super) fn spawn(&mut self) -> Result<(), NodeError> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|source| NodeError::Dir {
                    path: self.log.clone(),
                    source,
                })
        };
        let (out, err) = (open()?, open()?);
        let mut command = match &self.read_only_bind {
            None => Command::new(&self.bin),
            Some((source, target)) => {
                std::fs::create_dir_all(target).map_err(|source| NodeError::Dir {
                    path: target.clone(),
                    source,
                })?;
                let mut wrapped = Command::new("unshare");
                wrapped
                    .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                    .args([READ_ONLY_BIND, "sh"])
                    .arg(source)
                    .arg(target)
                    .arg(&self.bin);
                wrapped
            }
        };
        let child = command
            .args(&self.args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env_remove(NRI_SOCKET_INHERIT_ENV)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| NodeError::Spawn {
                bin: self.bin.clone(),
                source,
            })?;
        self.child = Some(child);
        Ok(())
    }

    pub(super) fn check_running(&mut self) -> Result<(), NodeError> {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(NodeError::Exited {
                    what: self.what,
                    status,
                    log_tail: log_tail(&self.log),
                });
            }
        }
        Ok(())
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash or an OOM kill would end it.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it does not stop.
    pub(super) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// nri-plugin would take an inherited NRI socket from this variable.
const NRI_SOCKET_INHERIT_ENV: &str = "NRI_PLUGIN_SOCKET";

pub(super) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

pub(super) fn free_port() -> Result<SocketAddr, NodeError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(NodeError::Port)?;
    listener.local_addr().map_err(NodeError::Port)
}

/// GET `path` on `addr` with a bare HTTP/1.0 request; the body on 200.
pub(super) async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}
