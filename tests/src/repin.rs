//! The re-pin check: after a node restarts, nri-plugin (the real binary,
//! subscribed to a running dra-plugin) must put every re-created container
//! on the right CPUs. [`plan`] lays out the containers a runtime brings
//! back for the claims kubelet knows prepared, [`run`] starts nri-plugin
//! and drives them through the stand-in NRI runtime
//! ([`crate::nri_runtime`]), and [`judge`] compares each container's final
//! cpuset with what the acknowledged claims say it must be:
//!
//! - a claim (exclusive) container: exactly its claim's CPUs;
//! - a shared container: the allocatable CPUs (online minus reserved)
//!   minus every claim's CPUs;
//! - a mixed container (`--mixed-allocation-mode`, a claim and a CPU
//!   request): its claim's CPUs and the shared pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use shared_state::claim_env::cdi_env_var;
use shared_state::CpuSet;
use tokio::process::{Child, Command};

use crate::node::read_back::metric_value;
use crate::nri_runtime::{self, NriRuntime, NriRuntimeError, RuntimeState};

/// Bound on things that take milliseconds (a start, a subscription); only a
/// hung process gets near it, even under an emulator.
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// `cpu.shares` of a container without a CPU request (kubelet's minimum).
const NO_REQUEST_SHARES: u64 = 2;
/// `cpu.shares` of a container requesting half a CPU.
const REQUEST_SHARES: u64 = 512;
const NAMESPACE: &str = "default";

/// How nri-plugin must place a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exclusive,
    Shared,
    Mixed,
}

/// When the runtime shows nri-plugin the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Running when nri-plugin connects: in the Synchronize request.
    Synchronize,
    /// Created after the Synchronize: a CreateContainer.
    Create,
}

/// A prepared claim's container as the runtime re-creates it: in its pod,
/// with the CDI env the claim's spec injects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recreated {
    pub claim_uid: String,
    pub pod_uid: String,
    /// The CPUs of `DRA_CPUSET_<claim_uid>` (the CDI spec's).
    pub env_cpus: CpuSet,
}

/// One container of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub id: String,
    pub name: String,
    pub pod_uid: String,
    pub kind: Kind,
    pub claim_uid: Option<String>,
    pub env: Vec<String>,
    pub phase: Phase,
}

impl Planned {
    fn shares(&self) -> u64 {
        match self.kind {
            Kind::Mixed => REQUEST_SHARES,
            Kind::Exclusive | Kind::Shared => NO_REQUEST_SHARES,
        }
    }
}

/// The containers of the check: one per claim and three shared ones. The
/// last claim's container and the third shared one are created after the
/// Synchronize; with `mixed`, the second-to-last claim's container is a
/// mixed one created after it and the first claim's (given three claims or
/// more) a mixed one in it. Every other claim container is exclusive and in
/// the Synchronize, so with enough claims each kind is seen both ways.
pub fn plan(recreated: &[Recreated], mixed: bool) -> Vec<Planned> {
    let n = recreated.len();
    let mut out = Vec::with_capacity(n + 3);
    for (i, r) in recreated.iter().enumerate() {
        let (kind, phase) = match i {
            _ if i + 1 == n => (Kind::Exclusive, Phase::Create),
            _ if mixed && i + 2 == n => (Kind::Mixed, Phase::Create),
            0 if mixed => (Kind::Mixed, Phase::Synchronize),
            _ => (Kind::Exclusive, Phase::Synchronize),
        };
        out.push(Planned {
            id: format!("claim{i}"),
            name: "app".into(),
            pod_uid: r.pod_uid.clone(),
            kind,
            claim_uid: Some(r.claim_uid.clone()),
            env: vec![cdi_env_var(&r.claim_uid, &r.env_cpus)],
            phase,
        });
    }
    for i in 0..3 {
        out.push(Planned {
            id: format!("shared{i}"),
            name: "web".into(),
            pod_uid: format!("5a5a5a5a-0000-4000-8000-{i:012x}"),
            kind: Kind::Shared,
            claim_uid: None,
            env: Vec::new(),
            phase: if i < 2 {
                Phase::Synchronize
            } else {
                Phase::Create
            },
        });
    }
    out
}

/// The cpuset `container` must have given the claims `truth` (uid → CPUs)
/// and the `allocatable` CPUs; `None` when it names a claim not in `truth`.
pub fn expected(
    container: &Planned,
    truth: &BTreeMap<String, CpuSet>,
    allocatable: &CpuSet,
) -> Option<CpuSet> {
    let exclusive = truth.values().fold(CpuSet::new(), |acc, c| acc.union(c));
    let shared = allocatable.difference(&exclusive);
    let claim = match &container.claim_uid {
        Some(uid) => Some(truth.get(uid)?),
        None => None,
    };
    match (container.kind, claim) {
        (Kind::Shared, _) => Some(shared),
        (Kind::Exclusive, Some(cpus)) => Some(cpus.clone()),
        (Kind::Mixed, Some(cpus)) => Some(cpus.union(&shared)),
        (Kind::Exclusive | Kind::Mixed, None) => None,
    }
}

/// The check's result: how many containers ended on their right CPUs, and
/// a line for each one that did not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub repinned: usize,
    pub wrong: Vec<String>,
}

/// Compare each planned container's cpuset in `state` with [`expected`].
pub fn judge(
    planned: &[Planned],
    truth: &BTreeMap<String, CpuSet>,
    allocatable: &CpuSet,
    state: &RuntimeState,
) -> Verdict {
    let mut v = Verdict::default();
    for c in planned {
        let want = expected(c, truth, allocatable);
        let got = state.cpusets.get(&c.id).cloned().flatten();
        let got_set = got.as_deref().and_then(|g| CpuSet::parse_cpulist(g).ok());
        match (&want, &got_set) {
            (Some(w), Some(g)) if w == g => v.repinned += 1,
            _ => {
                let what = match (state.refused.get(&c.id), &got) {
                    (Some(why), _) => format!("refused: {why}"),
                    (None, None) => "unpinned".to_string(),
                    (None, Some(g)) => format!("on {g}"),
                };
                v.wrong.push(format!(
                    "{:?} container {} (claim {:?}, {:?}) {what}, wanted {}",
                    c.kind,
                    c.id,
                    c.claim_uid,
                    c.phase,
                    want.map(|w| w.to_cpulist())
                        .unwrap_or_else(|| "a claim kubelet never had prepared".into()),
                ));
            }
        }
    }
    v
}

#[derive(Debug, thiserror::Error)]
pub enum RepinError {
    #[error(transparent)]
    Runtime(#[from] NriRuntimeError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("nri-plugin exited ({status}) before the check ended\n--- nri-plugin log ---\n{log}")]
    Exited { status: String, log: String },
    #[error("nri-plugin did not {what} within {WAIT:?}\n--- nri-plugin log ---\n{log}")]
    Timeout { what: &'static str, log: String },
}

/// Where nri-plugin runs and what it is subscribed to.
#[derive(Debug, Clone)]
pub struct RepinSetup {
    pub nri_plugin: PathBuf,
    pub coordination_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub sysfs_root: PathBuf,
    /// For the NRI socket, nri-plugin's state and its log.
    pub work_dir: PathBuf,
    pub mixed: bool,
}

/// The nri-plugin binary: `$NRI_PLUGIN_BIN`, else `<CARGO_TARGET_DIR or
/// the workspace's target>/debug/nri-plugin`.
pub fn nri_plugin_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(crate::node::NRI_PLUGIN_BIN_ENV).filter(|p| !p.is_empty())
    {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug").join("nri-plugin")
}

struct NriPlugin {
    child: Child,
    log: PathBuf,
    metrics: std::net::SocketAddr,
}

impl NriPlugin {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metric(&self, name: &str) -> Option<f64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.metrics).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.metrics);
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        metric_value(&body, name)
    }

    /// Wait until `ready` holds of the metrics; fails if nri-plugin exits.
    async fn wait_for(
        &mut self,
        what: &'static str,
        ready: impl Fn(&NriPlugin) -> futures::future::BoxFuture<'_, bool>,
    ) -> Result<(), RepinError> {
        let deadline = Instant::now() + WAIT;
        loop {
            if ready(self).await {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(RepinError::Exited {
                    status: status.to_string(),
                    log: self.log(),
                });
            }
            if Instant::now() > deadline {
                return Err(RepinError::Timeout {
                    what,
                    log: self.log(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RepinError {
    let what = what.into();
    move |source| RepinError::Io { what, source }
}

fn spawn_nri_plugin(setup: &RepinSetup, socket: &Path) -> Result<NriPlugin, RepinError> {
    // A free port: nri-plugin reports when it has dra-plugin's snapshot
    // only on its metrics.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("finding a free port for nri-plugin's metrics"))?;
    let log = setup.work_dir.join("nri-plugin.log");
    let log_file =
        std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut args = vec![
        format!("--nri-socket={}", path(socket)),
        format!("--coordination-socket={}", path(&setup.coordination_socket)),
        format!("--cdi-dir={}", path(&setup.cdi_dir)),
        format!("--sysfs-root={}", path(&setup.sysfs_root)),
        format!("--state-dir={}", path(&setup.work_dir.join("nri-state"))),
        format!("--metrics-address={metrics}"),
    ];
    if setup.mixed {
        args.push("--mixed-allocation-mode".into());
    }
    let child = Command::new(&setup.nri_plugin)
        .args(&args)
        .env_remove(dra_cpu_nri::client::PLUGIN_SOCKET_ENV)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .spawn()
        .map_err(io(format!(
            "spawning {} (set ${} or run `cargo build -p nri-plugin`)",
            setup.nri_plugin.display(),
            crate::node::NRI_PLUGIN_BIN_ENV
        )))?;
    Ok(NriPlugin {
        child,
        log,
        metrics,
    })
}

/// Start nri-plugin against the dra-plugin at `setup.coordination_socket`,
/// connect it to a stand-in runtime, Synchronize and create the planned
/// containers once it has dra-plugin's snapshot, wait until it has nothing
/// left to send, and judge every container against `truth` (claim uid →
/// CPUs, what kubelet was told) and `allocatable`.
pub async fn run(
    setup: &RepinSetup,
    planned: &[Planned],
    truth: &BTreeMap<String, CpuSet>,
    allocatable: &CpuSet,
) -> Result<Verdict, RepinError> {
    std::fs::create_dir_all(&setup.work_dir)
        .map_err(io(format!("creating {}", setup.work_dir.display())))?;
    let socket = setup.work_dir.join("nri.sock");
    let _ = std::fs::remove_file(&socket);
    let runtime = NriRuntime::bind(&socket)?;
    let mut plugin = spawn_nri_plugin(setup, &socket)?;
    let session = match runtime.accept(WAIT).await {
        Ok(session) => session,
        Err(e) => {
            return Err(match plugin.child.try_wait() {
                Ok(Some(status)) => RepinError::Exited {
                    status: status.to_string(),
                    log: plugin.log(),
                },
                _ => e.into(),
            })
        }
    };
    // NRI 0.12.1: pool changes may come as unsolicited updates, which the
    // runtime applies as they arrive.
    session.configure("containerd", "2.2.0", "v0.12.1").await?;
    // Containers are shown once nri-plugin has dra-plugin's state, so what
    // is judged is that state's placement, not the race with the CDI
    // fallback it starts from.
    plugin
        .wait_for("apply dra-plugin's snapshot", |p| {
            Box::pin(
                async move { p.metric("nri_plugin_coordination_connected").await == Some(1.0) },
            )
        })
        .await?;

    let nri_container =
        |c: &Planned| nri_runtime::container(&c.id, &c.name, &c.pod_uid, &c.env, c.shares(), "");
    let nri_pod = |c: &Planned| nri_runtime::pod(&c.pod_uid, &format!("pod-{}", c.id), NAMESPACE);
    let (synced, created): (Vec<&Planned>, Vec<&Planned>) =
        planned.iter().partition(|c| c.phase == Phase::Synchronize);
    session
        .synchronize(
            synced.iter().map(|c| nri_pod(c)).collect(),
            synced.iter().map(|c| nri_container(c)).collect(),
        )
        .await?;
    for c in created {
        session
            .create_container(nri_pod(c), nri_container(c))
            .await?;
    }
    // Nothing pending: every update nri-plugin means to send has been sent.
    plugin
        .wait_for("send every pending update", |p| {
            Box::pin(async move {
                let applied = p.metric("nri_plugin_applied_revision").await;
                applied.is_some() && applied == p.metric("nri_plugin_view_revision").await
            })
        })
        .await?;
    let verdict = judge(planned, truth, allocatable, &session.state());
    let _ = plugin.child.start_kill();
    let _ = plugin.child.wait().await;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn uid(i: usize) -> String {
        format!("c1a1{i:04x}-0000-4000-8000-000000000000")
    }

    fn recreated(cpus: &[&str]) -> Vec<Recreated> {
        cpus.iter()
            .enumerate()
            .map(|(i, c)| Recreated {
                claim_uid: uid(i),
                pod_uid: format!("pod{i}"),
                env_cpus: set(c),
            })
            .collect()
    }

    fn truth(r: &[Recreated]) -> BTreeMap<String, CpuSet> {
        r.iter()
            .map(|r| (r.claim_uid.clone(), r.env_cpus.clone()))
            .collect()
    }

    fn kinds(p: &[Planned]) -> Vec<(Kind, Phase)> {
        p.iter().map(|c| (c.kind, c.phase)).collect()
    }

    #[test]
    fn plan_shows_each_kind_in_synchronize_and_in_create() {
        use Kind::*;
        use Phase::*;
        let r = recreated(&["0-1", "2-3", "4-5", "6-7"]);
        let p = plan(&r, true);
        assert_eq!(
            kinds(&p),
            vec![
                (Mixed, Synchronize),
                (Exclusive, Synchronize),
                (Mixed, Create),
                (Exclusive, Create),
                (Shared, Synchronize),
                (Shared, Synchronize),
                (Shared, Create),
            ]
        );
        assert_eq!(p[1].env, vec![format!("DRA_CPUSET_{}=2-3", uid(1))]);
        assert_eq!(p[1].pod_uid, "pod1");
        // Without mixed mode, every claim container is exclusive.
        let p = plan(&r, false);
        assert!(p.iter().all(|c| c.kind != Mixed), "{p:?}");
        // No claims: only the shared containers; one claim: created.
        assert_eq!(plan(&[], true).len(), 3);
        assert_eq!(kinds(&plan(&r[..1], true))[0], (Exclusive, Create));
        assert_eq!(
            kinds(&plan(&r[..2], true))[..2],
            [(Mixed, Create), (Exclusive, Create)]
        );
    }

    #[test]
    fn expected_cpusets_follow_the_kind() {
        let r = recreated(&["0-1", "4-5"]);
        let p = plan(&r, true);
        let t = truth(&r);
        let all = set("0-7");
        // p[0] mixed on claim 0, p[1] exclusive on claim 1, p[2] shared.
        assert_eq!(expected(&p[0], &t, &all), Some(set("0-3,6-7")));
        assert_eq!(expected(&p[1], &t, &all), Some(set("4-5")));
        assert_eq!(expected(&p[2], &t, &all), Some(set("2-3,6-7")));
        // A claim kubelet does not know has no right cpuset.
        let mut lost = t.clone();
        lost.remove(&uid(1));
        assert_eq!(expected(&p[1], &lost, &all), None);
    }

    #[test]
    fn judge_counts_right_and_names_wrong_unpinned_and_refused() {
        let r = recreated(&["0-1", "4-5", "6"]);
        let p = plan(&r, false);
        let t = truth(&r);
        let all = set("0-7");
        let mut state = RuntimeState::default();
        for c in &p {
            let cpus = expected(c, &t, &all).map(|s| s.to_cpulist());
            state.cpusets.insert(c.id.clone(), cpus);
        }
        assert_eq!(
            judge(&p, &t, &all, &state),
            Verdict {
                repinned: 6,
                wrong: Vec::new()
            }
        );

        state.cpusets.insert("claim0".into(), Some("0-1,7".into()));
        state.cpusets.insert("shared0".into(), None);
        state.cpusets.insert("claim2".into(), None);
        state
            .refused
            .insert("claim2".into(), "claim not prepared".into());
        let v = judge(&p, &t, &all, &state);
        assert_eq!(v.repinned, 3, "{v:?}");
        assert_eq!(v.wrong.len(), 3, "{v:?}");
        assert!(
            v.wrong[0].contains("on 0-1,7") && v.wrong[0].contains("wanted 0-1"),
            "{v:?}"
        );
        assert!(v.wrong[1].contains("refused: claim not prepared"), "{v:?}");
        assert!(
            v.wrong[2].contains("shared0 ") && v.wrong[2].contains("unpinned"),
            "{v:?}"
        );
    }
}
