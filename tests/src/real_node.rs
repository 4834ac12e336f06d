//! The real node of `scripts/real-node.sh` as the tests drive it: kubectl as
//! cluster admin, objects applied from YAML, pods waited for, and each
//! container's CPUs read from its cgroup and from inside it (`kubectl exec`,
//! through the real API server, kubelet and containerd).
//!
//! The node is found through `scripts/real-node.sh env`; a test that finds no
//! node skips, or fails in CI ([`crate::skip`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shared_state::CpuSet;

use crate::cgroup::container::parse_cpus_allowed_list;
use crate::cgroup::cpuset::read_cpuset_dir;
use crate::cgroup::hierarchy::cpuset_dir_of;

#[derive(Debug, thiserror::Error)]
pub enum RealNodeError {
    #[error("no real node is up ({0}); start one with `scripts/real-node.sh up`")]
    NotUp(String),
    #[error("cannot run {what}: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    #[error("`{what}` failed ({status}): {stderr}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("`{what}` printed what is not JSON: {source}")]
    Json {
        what: String,
        source: serde_json::Error,
    },
    #[error("{0}")]
    Unexpected(String),
    #[error("timed out after {after:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        after: Duration,
        last: String,
    },
}

type Result<T> = std::result::Result<T, RealNodeError>;

/// The repository's root (the tests crate sits in `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// A container's CPUs, read two ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCpus {
    /// `cpuset.cpus` of its cgroup (or the effective CPUs where none was set).
    pub cgroup: CpuSet,
    /// `Cpus_allowed_list` of a process exec'd in it (`sched_getaffinity`).
    pub inside: CpuSet,
}

/// Reads one container's `cpuset.cpus` every [`CpusetRecorder::PERIOD`] on
/// a thread of its own and keeps every value it takes, in order: a cpuset
/// that moves for a moment during a restart and moves back shows here,
/// where [`RealNode::wait_cpus`] sees only where it ends.
#[derive(Debug)]
pub struct CpusetRecorder {
    what: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<CpusetHistory>>,
}

/// What a [`CpusetRecorder`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpusetHistory {
    /// Each cpuset the container had, consecutive repeats folded.
    pub values: Vec<CpuSet>,
    /// How many reads were made (a history of one read proves little).
    pub reads: usize,
    /// Why reading stopped before it was asked to (the container gone).
    pub ended: Option<String>,
}

impl CpusetHistory {
    /// The history, printable.
    pub fn describe(&self) -> String {
        let values: Vec<String> = self.values.iter().map(CpuSet::to_cpulist).collect();
        format!(
            "[{}] in {} reads{}",
            values.join(" -> "),
            self.reads,
            self.ended
                .as_ref()
                .map(|e| format!(", ended: {e}"))
                .unwrap_or_default()
        )
    }
}

impl CpusetRecorder {
    pub const PERIOD: Duration = Duration::from_millis(5);

    fn start(what: String, dir: PathBuf) -> Result<CpusetRecorder> {
        // The first read is made here, so a recording always starts from the
        // container's cpuset at the call.
        let first = read_cpuset_dir(&dir)
            .map_err(|e| RealNodeError::Unexpected(format!("{what}: {e}")))?
            .cpus;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cpuset-recorder".into())
            .spawn(move || {
                let mut history = CpusetHistory {
                    values: vec![first],
                    reads: 1,
                    ended: None,
                };
                while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Self::PERIOD);
                    match read_cpuset_dir(&dir) {
                        Ok(read) => {
                            history.reads += 1;
                            if history.values.last() != Some(&read.cpus) {
                                history.values.push(read.cpus);
                            }
                        }
                        Err(e) => {
                            history.ended = Some(e.to_string());
                            break;
                        }
                    }
                }
                history
            })
            .map_err(|source| RealNodeError::Spawn {
                what: format!("the cpuset recorder of {what}"),
                source,
            })?;
        Ok(CpusetRecorder {
            what,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops reading and returns what was seen.
    pub fn finish(mut self) -> CpusetHistory {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(history)) => history,
            _ => CpusetHistory {
                values: Vec::new(),
                reads: 0,
                ended: Some(format!("the recorder of {} panicked", self.what)),
            },
        }
    }

    /// Stops reading and checks the container had `want` all along: read at
    /// least twice, never anything else, and still readable at the end.
    pub fn assert_held(self, want: &CpuSet, during: &str) {
        let what = self.what.clone();
        let history = self.finish();
        assert!(
            history.values == [want.clone()] && history.reads >= 2 && history.ended.is_none(),
            "{what} was to stay on CPUs {} during {during}; it had {}",
            want.to_cpulist(),
            history.describe()
        );
        eprintln!(
            "real node: {what} stayed on CPUs {} during {during} ({} reads)",
            want.to_cpulist(),
            history.reads
        );
    }
}

impl Drop for CpusetRecorder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The node `scripts/real-node.sh` brought up.
#[derive(Debug, Clone)]
pub struct RealNode {
    pub facts: BTreeMap<String, String>,
}

impl RealNode {
    /// The node that is up, from `scripts/real-node.sh env`.
    pub fn find() -> Result<RealNode> {
        let script = repo_root().join("scripts/real-node.sh");
        let output = Command::new(&script)
            .arg("env")
            .output()
            .map_err(|source| RealNodeError::Spawn {
                what: script.display().to_string(),
                source,
            })?;
        if !output.status.success() {
            return Err(RealNodeError::NotUp(
                String::from_utf8_lossy(&output.stderr).trim().to_string(),
            ));
        }
        let facts = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(RealNode { facts })
    }

    pub fn fact(&self, key: &str) -> &str {
        self.facts.get(key).map(String::as_str).unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.fact("REAL_NODE_NAME")
    }

    /// The Kubernetes minor release the node runs (37 for 1.37.2).
    pub fn kubernetes_minor(&self) -> u32 {
        self.fact("REAL_NODE_KUBERNETES")
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// Whether the node's containerd takes NRI updates outside an event
    /// safely (2.4+, NRI 0.12.1): nri-plugin then grows the pool at once.
    pub fn runtime_takes_unsolicited_updates(&self) -> bool {
        let mut parts = self
            .fact("REAL_NODE_CONTAINERD")
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (2, 4)
    }

    fn kubectl_command(&self, args: &[&str]) -> Command {
        // The API server listens only inside the node's network namespace.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.fact("REAL_NODE_NETNS")))
            .arg("--")
            .arg(self.fact("REAL_NODE_KUBECTL"))
            .arg(format!(
                "--kubeconfig={}",
                self.fact("REAL_NODE_KUBECONFIG")
            ))
            .args(args);
        cmd
    }

    /// Runs kubectl; its stdout on success.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, None)
    }

    /// Runs kubectl with `input` on its stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: Option<&str>) -> Result<String> {
        let what = format!("kubectl {}", args.join(" "));
        let mut child = self
            .kubectl_command(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| RealNodeError::Spawn {
                what: what.clone(),
                source,
            })?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|source| RealNodeError::Spawn {
                    what: what.clone(),
                    source,
                })?;
        }
        let output = child
            .wait_with_output()
            .map_err(|source| RealNodeError::Spawn {
                what: what.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(RealNodeError::Failed {
                what,
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).to_string())
    }

    /// `kubectl get ... -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl(&all)?;
        serde_json::from_str(&text).map_err(|source| RealNodeError::Json {
            what: format!("kubectl {}", all.join(" ")),
            source,
        })
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml))
            .map(|_| ())
    }

    /// `kubectl create -f -` of `yaml`, which must fail: its error text.
    pub fn create_refused(&self, yaml: &str, extra: &[&str]) -> Result<String> {
        let mut args = vec!["create", "-f", "-"];
        args.extend_from_slice(extra);
        match self.kubectl_stdin(&args, Some(yaml)) {
            Ok(out) => Err(RealNodeError::Unexpected(format!(
                "kubectl create was accepted: {out}"
            ))),
            Err(RealNodeError::Failed { stderr, .. }) => Ok(stderr),
            Err(other) => Err(other),
        }
    }

    /// Polls `probe` until it returns `Some`, for at most `timeout`.
    pub fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> Result<std::result::Result<T, String>>,
    ) -> Result<T> {
        let start = Instant::now();
        loop {
            let last = match probe() {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(seen)) => seen,
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(RealNodeError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                    last,
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the pod's containers all run; returns the pod object.
    pub fn wait_running(&self, namespace: &str, pod: &str, timeout: Duration) -> Result<Value> {
        self.wait(&format!("pod {namespace}/{pod} running"), timeout, || {
            let object = self.get_json(&["pod", "-n", namespace, pod])?;
            let phase = object["status"]["phase"].as_str().unwrap_or("").to_string();
            let statuses = object["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let all_running = !statuses.is_empty()
                && statuses
                    .iter()
                    .all(|s| s["state"]["running"].is_object() && s["ready"] == true);
            if phase == "Running" && all_running {
                Ok(Ok(object))
            } else {
                Ok(Err(format!(
                    "phase {phase:?}, conditions {}, containers {}",
                    object["status"]["conditions"], object["status"]["containerStatuses"]
                )))
            }
        })
    }

    /// Waits until the scheduler has found no node for the pod; returns the
    /// message of its `PodScheduled` condition.
    pub fn wait_unschedulable(
        &self,
        namespace: &str,
        pod: &str,
        timeout: Duration,
    ) -> Result<String> {
        self.wait(&format!("pod {pod} unschedulable"), timeout, || {
            let object = self.get_json(&["pod", "-n", namespace, pod])?;
            let scheduled = object["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "PodScheduled").cloned())
                .unwrap_or_default();
            match (scheduled["status"].as_str(), scheduled["message"].as_str()) {
                (Some("False"), Some(message)) if !message.is_empty() => {
                    Ok(Ok(message.to_string()))
                }
                _ => Ok(Err(format!("{scheduled}"))),
            }
        })
    }

    /// Waits until a container of the pod waits for `reason` (for example
    /// `CreateContainerError`); returns the message kubelet gives with it.
    pub fn wait_waiting_reason(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<String> {
        self.wait(
            &format!("{namespace}/{pod}/{container} waiting for {reason}"),
            timeout,
            || {
                let object = self.get_json(&["pod", "-n", namespace, pod])?;
                let status = object["status"]["containerStatuses"]
                    .as_array()
                    .and_then(|s| s.iter().find(|c| c["name"] == container).cloned())
                    .unwrap_or_default();
                let waiting = &status["state"]["waiting"];
                if waiting["reason"] == reason {
                    Ok(Ok(waiting["message"].as_str().unwrap_or("").to_string()))
                } else {
                    Ok(Err(format!("status {status}")))
                }
            },
        )
    }

    /// GETs `path` of a driver container's HTTP endpoint (its metrics port
    /// `port` on pod `pod` of `namespace`) through the API server's proxy.
    pub fn pod_http(&self, namespace: &str, pod: &str, port: u16, path: &str) -> Result<String> {
        self.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}"),
        ])
    }

    /// Waits until the pod is gone.
    pub fn wait_deleted(&self, namespace: &str, pod: &str, timeout: Duration) -> Result<()> {
        self.wait(
            &format!("pod {namespace}/{pod} gone"),
            timeout,
            || match self.kubectl(&["get", "pod", "-n", namespace, pod, "-o", "name"]) {
                Ok(out) => Ok(Err(format!("still there: {}", out.trim()))),
                Err(RealNodeError::Failed { stderr, .. }) if stderr.contains("NotFound") => {
                    Ok(Ok(()))
                }
                Err(e) => Err(e),
            },
        )
    }

    /// The containerd id of a container of a pod.
    pub fn container_id(&self, namespace: &str, pod: &str, container: &str) -> Result<String> {
        let object = self.get_json(&["pod", "-n", namespace, pod])?;
        object["status"]["containerStatuses"]
            .as_array()
            .and_then(|statuses| {
                statuses
                    .iter()
                    .find(|s| s["name"] == container)
                    .and_then(|s| s["containerID"].as_str())
            })
            .and_then(|id| id.split_once("://").map(|(_, id)| id.to_string()))
            .ok_or_else(|| {
                RealNodeError::Unexpected(format!(
                    "pod {namespace}/{pod} has no container id for {container}: {}",
                    object["status"]
                ))
            })
    }

    /// The host pid of a container's init process, from containerd.
    pub fn container_pid(&self, id: &str) -> Result<u32> {
        let script = repo_root().join("scripts/real-node.sh");
        let output = Command::new(&script)
            .args(["ctr", "tasks", "ls"])
            .output()
            .map_err(|source| RealNodeError::Spawn {
                what: "real-node.sh ctr tasks ls".into(),
                source,
            })?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                Some((fields.next()?, fields.next()?))
            })
            .find(|(task, _)| *task == id)
            .and_then(|(_, pid)| pid.parse().ok())
            .ok_or_else(|| RealNodeError::Unexpected(format!("no task {id} in: {text}")))
    }

    /// A container's CPUs from its cgroup and from inside it.
    pub fn pod_cpus(&self, namespace: &str, pod: &str, container: &str) -> Result<PodCpus> {
        let id = self.container_id(namespace, pod, container)?;
        let pid = self.container_pid(&id)?;
        let dir = cpuset_dir_of(pid).map_err(|e| RealNodeError::Unexpected(e.to_string()))?;
        let cgroup = read_cpuset_dir(&dir)
            .map_err(|e| RealNodeError::Unexpected(e.to_string()))?
            .cpus;
        let status = self.kubectl(&[
            "exec",
            "-n",
            namespace,
            pod,
            "-c",
            container,
            "--",
            "cat",
            "/proc/self/status",
        ])?;
        let inside = parse_cpus_allowed_list(&status)
            .and_then(|list| CpuSet::parse_cpulist(list).ok())
            .ok_or_else(|| {
                RealNodeError::Unexpected(format!("no Cpus_allowed_list in {pod}: {status}"))
            })?;
        Ok(PodCpus { cgroup, inside })
    }

    /// Writes `cpus` into a container's cgroup `cpuset.cpus` behind the
    /// runtime's back, as another agent on the node could.
    pub fn write_cgroup_cpus(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        cpus: &CpuSet,
    ) -> Result<()> {
        let id = self.container_id(namespace, pod, container)?;
        let pid = self.container_pid(&id)?;
        let file = cpuset_dir_of(pid)
            .map_err(|e| RealNodeError::Unexpected(e.to_string()))?
            .join("cpuset.cpus");
        std::fs::write(&file, cpus.to_cpulist())
            .map_err(|e| RealNodeError::Unexpected(format!("writing {}: {e}", file.display())))
    }

    /// Starts recording a running container's `cpuset.cpus`
    /// ([`CpusetRecorder`]).
    pub fn record_cpus(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<CpusetRecorder> {
        let id = self.container_id(namespace, pod, container)?;
        let pid = self.container_pid(&id)?;
        let dir = cpuset_dir_of(pid).map_err(|e| RealNodeError::Unexpected(e.to_string()))?;
        CpusetRecorder::start(format!("{namespace}/{pod}/{container}"), dir)
    }

    /// Waits until a container's CPUs, read both ways, equal `want`.
    pub fn wait_cpus(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        want: &CpuSet,
        timeout: Duration,
    ) -> Result<PodCpus> {
        self.wait(
            &format!(
                "{namespace}/{pod}/{container} on CPUs {}",
                want.to_cpulist()
            ),
            timeout,
            || {
                let cpus = self.pod_cpus(namespace, pod, container)?;
                if cpus.cgroup == *want && cpus.inside == *want {
                    Ok(Ok(cpus))
                } else {
                    Ok(Err(format!(
                        "cgroup {}, inside {}",
                        cpus.cgroup.to_cpulist(),
                        cpus.inside.to_cpulist()
                    )))
                }
            },
        )
    }

    /// The ResourceSlices of `driver` on this node.
    pub fn slices(&self, driver: &str) -> Result<Vec<Value>> {
        let list = self.get_json(&["resourceslices"])?;
        Ok(list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s["spec"]["driver"] == driver && s["spec"]["nodeName"] == self.name())
            .collect())
    }

    /// Whether the node publishes grouped `dra.cpu` devices (capacity
    /// `dra.cpu/cpu`) rather than one device per CPU.
    pub fn publishes_grouped_devices(&self) -> Result<bool> {
        Ok(self.slices("dra.cpu")?.iter().any(|slice| {
            slice["spec"]["devices"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["capacity"]["dra.cpu/cpu"].is_object()))
        }))
    }

    /// Runs `scripts/real-node.sh ARGS` (restart, install, uninstall).
    pub fn script(&self, args: &[&str]) -> Result<String> {
        let script = repo_root().join("scripts/real-node.sh");
        let output = Command::new(&script)
            .args(args)
            .output()
            .map_err(|source| RealNodeError::Spawn {
                what: format!("real-node.sh {}", args.join(" ")),
                source,
            })?;
        if !output.status.success() {
            return Err(RealNodeError::Failed {
                what: format!("real-node.sh {}", args.join(" ")),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).to_string())
    }
}

/// A namespace of a scenario's own, deleted (with its pods and claims) when
/// dropped, also when the scenario fails.
pub struct TestNamespace<'a> {
    node: &'a RealNode,
    pub name: String,
}

impl<'a> TestNamespace<'a> {
    /// Creates `name` afresh and waits for its default service account, which
    /// pods need and the controller manager makes a moment later.
    pub fn new(node: &'a RealNode, name: &str) -> Result<Self> {
        let _ = node.kubectl(&[
            "delete",
            "namespace",
            name,
            "--wait=true",
            "--ignore-not-found",
        ]);
        node.kubectl(&["create", "namespace", name])?;
        node.wait("default service account", Duration::from_secs(60), || {
            Ok(node
                .kubectl(&["get", "serviceaccount", "default", "-n", name])
                .map(|_| ())
                .map_err(|e| e.to_string()))
        })?;
        Ok(TestNamespace {
            node,
            name: name.to_string(),
        })
    }

    /// A template `one-cpu` of one CPU (grouped or individual, as the node
    /// publishes), a shared pod `shared` and a pod `claim_pod` with a claim
    /// from it and `cpu_request` (a mixed pod in mixed mode, else exclusive);
    /// waits for both to run.
    pub fn start_shared_and_claim_pods(
        &self,
        claim_pod: &str,
        cpu_request: Option<&str>,
        timeout: Duration,
    ) -> Result<()> {
        let grouped = self.node.publishes_grouped_devices()?;
        self.node
            .apply(&claim_template_yaml(&self.name, "one-cpu", 1, grouped))?;
        self.node
            .apply(&pod_yaml(&self.name, "shared", Some("100m"), &[]))?;
        self.node.apply(&pod_yaml(
            &self.name,
            claim_pod,
            cpu_request,
            &[("cpus", "one-cpu")],
        ))?;
        self.node.wait_running(&self.name, claim_pod, timeout)?;
        self.node.wait_running(&self.name, "shared", timeout)?;
        Ok(())
    }
}

impl Drop for TestNamespace<'_> {
    fn drop(&mut self) {
        let _ = self.node.kubectl(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=true",
            "--timeout=180s",
        ]);
    }
}

/// A busybox pod that sleeps, with `cpu_request` (e.g. "100m") if any and
/// the claims of `templates` (`(claim name, template name)`), all given to
/// its one container `app`.
pub fn pod_yaml(
    namespace: &str,
    name: &str,
    cpu_request: Option<&str>,
    templates: &[(&str, &str)],
) -> String {
    let mut pod = PodSpec::new(namespace, name);
    pod.cpu_request = cpu_request;
    pod.templates = templates.to_vec();
    pod.yaml()
}

/// A busybox pod that sleeps, as a scenario needs it: each container gets
/// `cpu_request` and every claim of the pod, from a template
/// (`(claim name, template name)`) or a ResourceClaim of the namespace
/// (`(claim name, ResourceClaim name)`), and `env`.
#[derive(Debug, Clone)]
pub struct PodSpec<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub containers: Vec<&'a str>,
    /// Init containers, each naming the pod's claims as the containers do;
    /// they print their CPUs and exit.
    pub init_containers: Vec<&'a str>,
    pub cpu_request: Option<&'a str>,
    /// `resources.limits.cpu` of each container.
    pub cpu_limit: Option<&'a str>,
    pub templates: Vec<(&'a str, &'a str)>,
    pub claims: Vec<(&'a str, &'a str)>,
    pub env: Vec<(&'a str, &'a str)>,
}

impl<'a> PodSpec<'a> {
    /// One container `app`, no request, no claim.
    pub fn new(namespace: &'a str, name: &'a str) -> Self {
        PodSpec {
            namespace,
            name,
            containers: vec!["app"],
            init_containers: Vec::new(),
            cpu_request: None,
            cpu_limit: None,
            templates: Vec::new(),
            claims: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn yaml(&self) -> String {
        let (namespace, name) = (self.namespace, self.name);
        let mut y = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  terminationGracePeriodSeconds: 1\n"
        );
        let claim_names: Vec<&str> = self
            .templates
            .iter()
            .chain(&self.claims)
            .map(|(claim, _)| *claim)
            .collect();
        if !claim_names.is_empty() {
            y.push_str("  resourceClaims:\n");
            for (claim, template) in &self.templates {
                y.push_str(&format!(
                    "    - name: {claim}\n      resourceClaimTemplateName: {template}\n"
                ));
            }
            for (claim, object) in &self.claims {
                y.push_str(&format!(
                    "    - name: {claim}\n      resourceClaimName: {object}\n"
                ));
            }
        }
        let init = self.init_containers.iter().map(|c| (*c, true));
        let main = self.containers.iter().map(|c| (*c, false));
        for (index, (container, is_init)) in init.chain(main).enumerate() {
            if index == 0 && is_init {
                y.push_str("  initContainers:\n");
            }
            if index == self.init_containers.len() {
                y.push_str("  containers:\n");
            }
            let command = if is_init {
                r#"["/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"]"#
            } else {
                r#"["/bin/sleep", "infinity"]"#
            };
            y.push_str(&format!(
                "    - name: {container}\n      image: {}\n      imagePullPolicy: Never\n      command: {command}\n",
                crate::image::WORKLOAD_IMAGE
            ));
            if !self.env.is_empty() {
                y.push_str("      env:\n");
                for (key, value) in &self.env {
                    y.push_str(&format!(
                        "        - name: {key}\n          value: {}\n",
                        serde_json::Value::from(*value)
                    ));
                }
            }
            y.push_str("      resources:\n");
            if let Some(cpu) = self.cpu_request {
                y.push_str(&format!("        requests:\n          cpu: {cpu}\n"));
            }
            if let Some(cpu) = self.cpu_limit {
                y.push_str(&format!("        limits:\n          cpu: {cpu}\n"));
            }
            if !claim_names.is_empty() {
                y.push_str("        claims:\n");
                for claim in &claim_names {
                    y.push_str(&format!("          - name: {claim}\n"));
                }
            }
        }
        y
    }
}

/// The value of the sample `name` (with exactly the labels written in it,
/// e.g. `x{a="b"}`) in a Prometheus text exposition.
pub fn metric_value(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        if !rest.starts_with(' ') {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// A ResourceClaim `name` of `cpus` CPUs of the `dra.cpu` class, which pods
/// name directly (and so may share), unlike a template's claims.
pub fn claim_yaml(namespace: &str, name: &str, cpus: u32, grouped: bool) -> String {
    let template = claim_template_yaml(namespace, name, cpus, grouped);
    // A template's spec.spec is a claim's spec.
    let devices = template
        .split_once("  spec:\n    devices:\n")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let devices: String = devices
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  devices:\n{devices}"
    )
}

/// A ResourceClaimTemplate of `cpus` CPUs of the `dra.cpu` class: a share of
/// a grouped device's `dra.cpu/cpu` capacity, or `cpus` individual devices.
pub fn claim_template_yaml(namespace: &str, name: &str, cpus: u32, grouped: bool) -> String {
    let request = if grouped {
        format!("          exactly:\n            deviceClassName: dra.cpu\n            capacity:\n              requests:\n                dra.cpu/cpu: \"{cpus}\"\n")
    } else {
        format!(
            "          exactly:\n            deviceClassName: dra.cpu\n            count: {cpus}\n"
        )
    };
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  spec:\n    devices:\n      requests:\n        - name: cpus\n{request}"
    )
}

/// A ResourceClaimTemplate whose one request `cpus` lists alternatives in
/// order (`firstAvailable`): `(subrequest name, CPUs)` each, as capacity of a
/// grouped device or a count of individual ones.
pub fn first_available_template_yaml(
    namespace: &str,
    name: &str,
    alternatives: &[(&str, u32)],
    grouped: bool,
) -> String {
    let mut y = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  spec:\n    devices:\n      requests:\n        - name: cpus\n          firstAvailable:\n"
    );
    for (sub, cpus) in alternatives {
        y.push_str(&format!(
            "            - name: {sub}\n              deviceClassName: dra.cpu\n"
        ));
        if grouped {
            y.push_str(&format!(
                "              capacity:\n                requests:\n                  dra.cpu/cpu: \"{cpus}\"\n"
            ));
        } else {
            y.push_str(&format!("              count: {cpus}\n"));
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_yaml_is_valid_yaml_with_its_claims() {
        let y = pod_yaml("ns", "p", Some("250m"), &[("cpus", "one-cpu")]);
        let v: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        assert_eq!(
            v["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
            "one-cpu"
        );
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "250m"
        );
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["claims"][0]["name"],
            "cpus"
        );
        let plain: serde_json::Value =
            serde_saphyr::from_str(&pod_yaml("ns", "q", None, &[])).unwrap();
        assert!(plain["spec"]["resourceClaims"].is_null());
        assert!(plain["spec"]["containers"][0]["resources"]["claims"].is_null());
    }

    #[test]
    fn pod_specs_give_every_container_the_claims_and_the_env() {
        let mut pod = PodSpec::new("ns", "p");
        pod.containers = vec!["a", "b"];
        pod.claims = vec![("cpus", "shared-claim")];
        pod.templates = vec![("more", "one-cpu")];
        pod.env = vec![("DRA_CPUSET_x", "not: a cpulist")];
        let v: serde_json::Value = serde_saphyr::from_str(&pod.yaml()).unwrap();
        assert_eq!(
            v["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
            "one-cpu"
        );
        assert_eq!(
            v["spec"]["resourceClaims"][1]["resourceClaimName"],
            "shared-claim"
        );
        for i in 0..2 {
            let c = &v["spec"]["containers"][i];
            assert_eq!(c["resources"]["claims"][0]["name"], "more");
            assert_eq!(c["resources"]["claims"][1]["name"], "cpus");
            assert_eq!(c["env"][0]["value"], "not: a cpulist");
        }
        assert_eq!(v["spec"]["containers"][1]["name"], "b");
    }

    #[test]
    fn metric_values_are_read_by_exact_name_and_labels() {
        let text = "# HELP a x\na 3\nab 4\nc{r=\"x\"} 5\nc{r=\"y\"} 6\n";
        assert_eq!(metric_value(text, "a"), Some(3.0));
        assert_eq!(metric_value(text, "ab"), Some(4.0));
        assert_eq!(metric_value(text, "c{r=\"y\"}"), Some(6.0));
        assert_eq!(metric_value(text, "c"), None);
        assert_eq!(metric_value(text, "d"), None);
    }

    #[test]
    fn claims_have_the_spec_of_a_template() {
        for grouped in [true, false] {
            let claim: serde_json::Value =
                serde_saphyr::from_str(&claim_yaml("ns", "c", 2, grouped)).unwrap();
            let template: serde_json::Value =
                serde_saphyr::from_str(&claim_template_yaml("ns", "c", 2, grouped)).unwrap();
            assert_eq!(claim["kind"], "ResourceClaim");
            assert_eq!(claim["spec"], template["spec"]["spec"], "grouped {grouped}");
        }
    }

    #[test]
    fn first_available_templates_list_their_alternatives_in_order() {
        let v: serde_json::Value = serde_saphyr::from_str(&first_available_template_yaml(
            "ns",
            "t",
            &[("big", 64), ("one", 1)],
            true,
        ))
        .unwrap();
        let alternatives = &v["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"];
        assert_eq!(alternatives[0]["name"], "big");
        assert_eq!(alternatives[0]["capacity"]["requests"]["dra.cpu/cpu"], "64");
        assert_eq!(alternatives[1]["name"], "one");
        let individual: serde_json::Value = serde_saphyr::from_str(&first_available_template_yaml(
            "ns",
            "t",
            &[("one", 1)],
            false,
        ))
        .unwrap();
        assert_eq!(
            individual["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"],
            1
        );
    }

    #[test]
    fn claim_templates_ask_for_capacity_or_a_count() {
        let grouped: serde_json::Value =
            serde_saphyr::from_str(&claim_template_yaml("ns", "t", 2, true)).unwrap();
        let request = &grouped["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!(request["capacity"]["requests"]["dra.cpu/cpu"], "2");
        let individual: serde_json::Value =
            serde_saphyr::from_str(&claim_template_yaml("ns", "t", 2, false)).unwrap();
        assert_eq!(
            individual["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"],
            2
        );
    }
}
