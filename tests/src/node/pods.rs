//! The node playing kubelet for pods and containers, and reading back their
//! cpusets and the processes' logs.

use super::read_back::log_messages_with;
use super::{CpusNotReached, Node, NodeError, NAMESPACE, POLL, SETTLE};
use crate::cgroup;
use crate::cgroup::container::ContainerCpus;
use crate::cri::new_uid;
use crate::cri::spec::{ContainerSpec, PodSandbox};
use serde_json::Value;
use shared_state::CpuSet;
use std::time::Instant;

/// A pod's name and UID, known before the pod runs (the claim reserves it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: String,
    pub uid: String,
}

impl PodIdentity {
    pub fn new(name: &str) -> Self {
        PodIdentity {
            name: name.to_string(),
            uid: new_uid(),
        }
    }
}

/// A running pod and its containers (name, id), in spec order.
#[derive(Debug, Clone)]
pub struct RunningPod {
    pub sandbox: PodSandbox,
    pub containers: Vec<(String, String)>,
}

impl RunningPod {
    /// The id of container `name`; empty when there is none.
    pub fn id(&self, name: &str) -> &str {
        self.containers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| id.as_str())
            .unwrap_or("")
    }
}

impl Node {
    /// Plays kubelet: RunPodSandbox, then CreateContainer and StartContainer
    /// for each container.
    pub async fn start_pod(
        &mut self,
        pod: &PodIdentity,
        containers: &[ContainerSpec],
    ) -> Result<RunningPod, NodeError> {
        let sandbox = self.cri.run_pod(&pod.name, NAMESPACE, &pod.uid).await?;
        let mut running = RunningPod {
            sandbox,
            containers: Vec::new(),
        };
        for spec in containers {
            let id = self.cri.run_container(&running.sandbox, spec).await?;
            running.containers.push((spec.name.clone(), id));
        }
        Ok(running)
    }

    /// Plays kubelet deleting a pod: stop and remove its sandbox.
    pub async fn delete_pod(&mut self, pod: &RunningPod) -> Result<(), NodeError> {
        self.cri.delete_pod(&pod.sandbox.id).await?;
        Ok(())
    }

    /// Starts a shared container and removes it again: an NRI event whose
    /// reply carries the pool changes deferred on runtimes where unsolicited
    /// updates are not safe.
    pub async fn nudge(&mut self) -> Result<(), NodeError> {
        let pod = PodIdentity::new("nudge");
        let running = self
            .start_pod(
                &pod,
                &[ContainerSpec::sleeper("nudge").with_cpu(Some(10), None)],
            )
            .await?;
        self.delete_pod(&running).await
    }

    /// Whether nri-plugin decided this runtime takes unsolicited updates
    /// (from its log; `None` before it has registered).
    pub fn unsolicited_updates_safe(&self) -> Option<bool> {
        self.nri_log()
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|v| {
                v.pointer("/fields/unsolicited_updates_safe")
                    .and_then(Value::as_bool)
            })
    }

    /// The container runtime's name and version, as CRI reports them.
    pub async fn runtime_version(&mut self) -> Result<String, NodeError> {
        let v = self.cri.version().await?;
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    /// What nri-plugin logged of the NRI runtime when it registered: the
    /// runtime's NRI version (as the runtime reports it, if it does).
    pub fn nri_runtime_nri_version(&self) -> Option<String> {
        self.nri_log()
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| {
                v.pointer("/fields/message").and_then(Value::as_str)
                    == Some("configured by the NRI runtime")
            })
            .and_then(|v| v.pointer("/fields/nri").cloned())
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
            .filter(|v| v != "None")
    }

    /// After a claim is unprepared: make sure an event reaches nri-plugin if
    /// it has to wait for one to grow containers back.
    pub async fn after_unprepare(&mut self) -> Result<(), NodeError> {
        if self.unsolicited_updates_safe() != Some(true) {
            self.nudge().await?;
        }
        Ok(())
    }

    /// A container's cpuset now, from its cgroup and from inside it.
    pub async fn cpus(&mut self, id: &str) -> Result<ContainerCpus, NodeError> {
        Ok(cgroup::container::container_cpus(&mut self.cri, id).await?)
    }

    /// Writes `cpus` into container `id`'s cgroup `cpuset.cpus` behind the
    /// runtime's back, as an operator or another agent could.
    pub async fn write_cgroup_cpus(&mut self, id: &str, cpus: &CpuSet) -> Result<(), NodeError> {
        let pid = self.cri.container_pid(id).await?;
        let path = cgroup::hierarchy::cpuset_dir_of(pid)?.join("cpuset.cpus");
        std::fs::write(&path, cpus.to_cpulist()).map_err(|source| NodeError::Write { path, source })
    }

    /// Waits until both the cgroup and the inside of container `id` say
    /// `want`; the error names what they said last.
    pub async fn wait_cpus(&mut self, id: &str, want: &CpuSet) -> Result<ContainerCpus, NodeError> {
        let started = Instant::now();
        loop {
            let now = self.cpus(id).await?;
            if &now.cgroup.cpus == want && &now.allowed_inside == want {
                return Ok(now);
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::Cpus(Box::new(CpusNotReached {
                    id: id.to_string(),
                    want: want.clone(),
                    got: now.cgroup.cpus,
                    got_inside: now.allowed_inside,
                    waited: started.elapsed(),
                    nri_log_tail: super::process::log_tail(&self.layout.nri_log()),
                })));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `log()` has a line whose message contains `fragment`.
    pub async fn wait_log(&self, nri: bool, fragment: &str) -> Result<Vec<Value>, NodeError> {
        let started = Instant::now();
        loop {
            let log = if nri { self.nri_log() } else { self.dra_log() };
            let found = log_messages_with(&log, fragment);
            if !found.is_empty() {
                return Ok(found);
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::Timeout(
                    format!("a log line containing {fragment:?}"),
                    started.elapsed(),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The CPUs containers may use: online CPUs but the reserved ones.
    pub fn allocatable(&self) -> Result<CpuSet, NodeError> {
        let online = cgroup::online_cpus()?;
        if self.options.reserved_cpus.is_empty() {
            return Ok(online);
        }
        let reserved = CpuSet::parse_cpulist(&self.options.reserved_cpus).map_err(|e| {
            NodeError::ClaimObject {
                name: "--reserved-cpus".into(),
                reason: format!("{:?}: {e}", self.options.reserved_cpus),
            }
        })?;
        Ok(online.difference(&reserved))
    }
}
