//! Starting, stopping and restarting the node's processes and containerd,
//! and waiting until they are ready.

use super::layout::{nri_plugin_args, NodeLayout};
use super::process::{http_get, log_tail};
use super::read_back::metric_value;
use super::{Node, NodeError, DRIVER_NAME, POLL, SETTLE};
use crate::cgroup::hierarchy::CpusetHierarchy;
use crate::kubelet_dra::plugin_watcher::RegistrySnapshot;
use crate::kubelet_dra::KubeletDra;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// dra-plugin's crash point variable (`dra_plugin::driver::crash_points`),
/// which this crate does not link.
const DRA_CRASH_AT_ENV: &str = "DRA_CPU_CRASH_AT";

impl Node {
    /// Starts dra-plugin and registers it with the kubelet stand-in.
    pub async fn start_dra_plugin(&mut self) -> Result<(), NodeError> {
        // A killed plugin leaves its registration socket behind. The new
        // one renames its socket onto that name, which kubelet's watcher
        // sees as a new plugin: so does this wait, which registers only a
        // socket that was not there before the start.
        let registry = self.layout.plugins_registry();
        let seen = RegistrySnapshot::of(&registry);
        self.kubelet = None;
        self.dra.spawn()?;
        let started = Instant::now();
        let version = self.options.dra_version;
        let register = KubeletDra::register_new(&registry, seen, DRIVER_NAME, version, SETTLE);
        tokio::pin!(register);
        let kubelet = loop {
            tokio::select! {
                registered = &mut register => break registered?,
                () = tokio::time::sleep(POLL) => self.dra.check_running()?,
            }
        };
        self.kubelet = Some(kubelet);
        self.wait_http_ok("dra-plugin", self.layout.dra_metrics, "/readyz", started)
            .await
    }

    /// Starts nri-plugin and waits until it is registered with containerd
    /// and subscribed to dra-plugin (when dra-plugin runs).
    pub async fn start_nri_plugin(&mut self) -> Result<(), NodeError> {
        self.nri.spawn()?;
        self.wait_nri_ready(self.dra.pid().is_some()).await
    }

    /// Starts nri-plugin and waits for its registration with NRI alone (the
    /// runtime's Synchronize done), not for its subscription to dra-plugin.
    pub async fn start_nri_plugin_unsubscribed(&mut self) -> Result<(), NodeError> {
        self.nri.spawn()?;
        self.wait_nri_ready(false).await
    }

    /// Waits until nri-plugin is registered with NRI and, when `subscribed`,
    /// subscribed to dra-plugin.
    pub async fn wait_nri_ready(&mut self, subscribed: bool) -> Result<(), NodeError> {
        let started = Instant::now();
        loop {
            self.nri.check_running()?;
            let metrics = http_get(self.layout.nri_metrics, "/metrics").await;
            let value = |name| {
                metrics
                    .as_deref()
                    .and_then(|m| metric_value(m, name))
                    .unwrap_or(0.0)
            };
            let registered = value("nri_plugin_nri_registered") == 1.0;
            let connected = value("nri_plugin_coordination_connected") == 1.0;
            if registered && (connected || !subscribed) {
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::NotReady {
                    what: "nri-plugin",
                    waited: started.elapsed(),
                    waiting_for: format!(
                        "registered with NRI: {registered}, subscribed to dra-plugin: {connected}"
                    ),
                    log_tail: log_tail(&self.layout.nri_log()),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_http_ok(
        &mut self,
        what: &'static str,
        addr: SocketAddr,
        path: &str,
        started: Instant,
    ) -> Result<(), NodeError> {
        loop {
            if what == "dra-plugin" {
                self.dra.check_running()?;
            } else {
                self.nri.check_running()?;
            }
            if http_get(addr, path).await.is_some() {
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                let log = if what == "dra-plugin" {
                    self.layout.dra_log()
                } else {
                    self.layout.nri_log()
                };
                return Err(NodeError::NotReady {
                    what,
                    waited: started.elapsed(),
                    waiting_for: format!("GET http://{addr}{path} to answer 200"),
                    log_tail: log_tail(&log),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// This node's ResourceSlices as the API server holds them.
    pub(super) fn published_slices(&self) -> Vec<Value> {
        self.api
            .slice_values()
            .into_iter()
            .filter(|s| {
                s.pointer("/spec/nodeName").and_then(Value::as_str)
                    == Some(self.options.node_name.as_str())
            })
            .collect()
    }

    /// Waits until this node's ResourceSlices are published.
    pub async fn wait_slices(&mut self) -> Result<Vec<Value>, NodeError> {
        let started = Instant::now();
        loop {
            self.dra.check_running()?;
            let slices = self.published_slices();
            if !slices.is_empty() {
                return Ok(slices);
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::NotReady {
                    what: "dra-plugin",
                    waited: started.elapsed(),
                    waiting_for: "its ResourceSlices in the API server".into(),
                    log_tail: log_tail(&self.layout.dra_log()),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// kill -9 of dra-plugin.
    pub fn kill_dra_plugin(&mut self) {
        self.kubelet = None;
        self.dra.kill();
    }

    /// kill -9 of nri-plugin.
    pub fn kill_nri_plugin(&mut self) {
        self.nri.kill();
    }

    /// Holds dra-plugin with SIGSTOP, as a hung process: its sockets stay,
    /// the kernel queues connections to them, and nothing is answered. Back
    /// when the guard is released or dropped.
    pub async fn hold_dra_plugin(&self) -> Result<HeldProcess, NodeError> {
        let pid = self
            .dra_plugin_pid()
            .ok_or_else(|| NodeError::Hold("dra-plugin does not run".into()))?;
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)
            .map_err(|e| NodeError::Hold(format!("SIGSTOP: {e}")))?;
        let held = HeldProcess { pid };
        let since = Instant::now();
        while process_state(pid.as_raw()) != Some('T') {
            if since.elapsed() > Duration::from_secs(10) {
                return Err(NodeError::Hold(format!(
                    "not stopped after 10 s: state {:?}",
                    process_state(pid.as_raw())
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(held)
    }

    /// Arms a crash point of dra-plugin (`DRA_CPU_CRASH_AT`, see
    /// `dra_plugin::driver::crash_points`) for its next starts; `None`
    /// disarms it.
    pub fn arm_dra_crash_point(&mut self, point: Option<&str>) {
        self.dra.env.retain(|(k, _)| k != DRA_CRASH_AT_ENV);
        if let Some(point) = point {
            self.dra
                .env
                .push((DRA_CRASH_AT_ENV.to_string(), point.to_string()));
        }
    }

    /// Waits until dra-plugin has exited (a crash point fired); the time
    /// it took.
    pub async fn wait_dra_plugin_exit(&mut self) -> Result<Duration, NodeError> {
        let started = Instant::now();
        while self.dra.check_running().is_ok() && self.dra.pid().is_some() {
            if started.elapsed() > SETTLE {
                return Err(NodeError::Timeout(
                    "dra-plugin to exit at its crash point".into(),
                    started.elapsed(),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        self.kubelet = None;
        Ok(started.elapsed())
    }

    /// kill -9 of dra-plugin, then a fresh start on the same state.
    pub async fn restart_dra_plugin(&mut self) -> Result<(), NodeError> {
        self.kill_dra_plugin();
        self.start_dra_plugin().await?;
        // nri-plugin reconnects on its own; wait until it has.
        if self.nri.pid().is_some() {
            self.wait_nri_ready(true).await?;
        }
        Ok(())
    }

    /// SIGTERM to nri-plugin (a clean stop), waiting until it has exited.
    pub fn stop_nri_plugin(&mut self) {
        self.nri.stop();
    }

    /// Starts nri-plugin again with `--host-cgroups` set to `host_cgroups`
    /// (none when empty), every other flag as before.
    pub async fn start_nri_plugin_with_host_cgroups(
        &mut self,
        host_cgroups: &[&str],
    ) -> Result<(), NodeError> {
        self.options.host_cgroups = host_cgroups.iter().map(|c| c.to_string()).collect();
        self.nri.args = nri_plugin_args(&self.layout, &self.options);
        self.start_nri_plugin().await
    }

    /// Starts nri-plugin again with `--cpuset-check-seconds` set to
    /// `seconds` and, as the chart runs it without low-latency tuning, the
    /// host's cpuset hierarchy read-only; every other flag as before.
    pub async fn start_nri_plugin_with_cpuset_check_on_read_only_cgroups(
        &mut self,
        seconds: u64,
    ) -> Result<(), NodeError> {
        self.options.cpuset_check_seconds = Some(seconds);
        self.options.read_only_cgroups = true;
        self.nri.read_only_bind = Some(read_only_bind(&self.layout)?);
        self.nri.args = nri_plugin_args(&self.layout, &self.options);
        self.start_nri_plugin().await
    }

    /// kill -9 of nri-plugin, then a fresh start.
    pub async fn restart_nri_plugin(&mut self) -> Result<(), NodeError> {
        self.kill_nri_plugin();
        self.start_nri_plugin().await
    }

    /// Restarts containerd (containers keep running in their shims); waits
    /// until nri-plugin has registered with the new containerd.
    pub async fn restart_containerd(&mut self) -> Result<(), NodeError> {
        self.containerd.restart().await?;
        self.cri = self.containerd.cri().await?;
        // nri-plugin sees its connection drop and must reconnect itself.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            let metrics = http_get(self.layout.nri_metrics, "/metrics").await;
            if metrics
                .as_deref()
                .and_then(|m| metric_value(m, "nri_plugin_nri_registered"))
                == Some(0.0)
            {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.wait_nri_ready(self.dra.pid().is_some()).await
    }
}

/// A process held with SIGSTOP ([`Node::hold_dra_plugin`]); SIGCONT when
/// dropped, so a failing test never leaves it stopped.
pub struct HeldProcess {
    pid: nix::unistd::Pid,
}

impl HeldProcess {
    /// Whether the kernel has it stopped (state `T`).
    pub fn is_stopped(&self) -> bool {
        process_state(self.pid.as_raw()) == Some('T')
    }

    /// Lets it run again.
    pub fn release(self) {}
}

impl Drop for HeldProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A process's state letter from `/proc/PID/stat` (`T`: stopped).
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may hold spaces: the state follows its end.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The bind [`NodeOptions::read_only_cgroups`] makes for nri-plugin: the
/// host's cpuset hierarchy (on cgroup v1 a mount of its own, at `cpuset/`
/// of the root, as below a host's `/sys/fs/cgroup`).
///
/// [`NodeOptions::read_only_cgroups`]: super::layout::NodeOptions::read_only_cgroups
pub(super) fn read_only_bind(layout: &NodeLayout) -> Result<(PathBuf, PathBuf), NodeError> {
    let root = layout.read_only_cgroup_root();
    Ok(match crate::cgroup::hierarchy::cpuset_hierarchy()? {
        CpusetHierarchy::V1 { mount_point } => (mount_point, root.join("cpuset")),
        CpusetHierarchy::V2 { mount_point } => (mount_point, root),
    })
}
