//! Rows that need a real containerd (the node of [`dra_cpu_tests::node`]):
//! container create+start with nri-plugin registered against no NRI plugin
//! at all and against the Go reference plugin, interleaved (rows 4 and 4b),
//! and the time from NodeUnprepareResources returning to a shared
//! container's cgroup showing the grown pool (row 5). Measured on Debian's
//! containerd 1.7 and again, as rows 4c, 4d and 5c, on a build of the newest
//! supported containerd 2.x when `scripts/perf.sh` provides one.

use super::{summarize, Goal, Row, Verdict};
use anyhow::{bail, Context};
use dra_cpu_tests::cgroup;
use dra_cpu_tests::containerd::config::ContainerdOptions;
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::Node;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CREATE_WHAT: &str = "container create+start through containerd, nri-plugin registered as the chart runs it (host cgroups read-only)";
const CONVERGE_WHAT: &str =
    "NodeUnprepareResources return → shared container cgroup shows the grown pool";
const GO_WHAT: &str =
    "container create+start, nri-plugin vs a Go reference plugin (official NRI stub, same cpuset adjustment)";

const CREATE_GOAL: Goal = Goal::RatioAtMost(1.05);
const GO_GOAL: Goal = Goal::RatioAtMost(1.0);
const CONVERGE_GOAL: Goal = Goal::AtMost(Duration::from_millis(100));

/// The containerd the rows run on, and the ids its rows get.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Named in each row's description.
    pub name: String,
    /// `containerd`, `ctr` and the runc shim ([`ContainerdOptions::bin_dir`]).
    pub bin_dir: PathBuf,
    /// The Go reference plugin built with this runtime's NRI module.
    pub go_reference: Option<PathBuf>,
    /// Ids of the create, Go reference and convergence rows.
    pub ids: [&'static str; 3],
}

impl Runtime {
    /// Debian's containerd 1.7 and the Go reference plugin built with the
    /// NRI it was built with (`NRI_GO_REFERENCE_BIN`, set by scripts/perf.sh).
    pub fn debian() -> Runtime {
        let go_reference = std::env::var_os("NRI_GO_REFERENCE_BIN")
            .map(PathBuf::from)
            .filter(|p| p.is_file());
        Runtime {
            name: "containerd 1.7".into(),
            bin_dir: ContainerdOptions::default().bin_dir,
            go_reference,
            ids: ["4", "4b", "5"],
        }
    }

    /// The containerd 2.x build scripts/perf.sh names in
    /// `DRA_CPU_CONTAINERD2_DIR` (its version in `DRA_CPU_CONTAINERD2_VERSION`),
    /// with the Go reference plugin built from the NRI module that release
    /// requires (`NRI_GO_REFERENCE2_BIN`). `None` when none is named.
    pub fn containerd2() -> Option<Runtime> {
        let bin_dir = PathBuf::from(std::env::var_os("DRA_CPU_CONTAINERD2_DIR")?);
        let version = std::env::var("DRA_CPU_CONTAINERD2_VERSION").unwrap_or_else(|_| "2.x".into());
        let go_reference = std::env::var_os("NRI_GO_REFERENCE2_BIN")
            .map(PathBuf::from)
            .filter(|p| p.is_file());
        Some(Runtime {
            name: format!("containerd {version}"),
            bin_dir,
            go_reference,
            ids: ["4c", "4d", "5c"],
        })
    }

    fn what(&self, what: &str) -> String {
        format!("{what} ({})", self.name)
    }

    /// The rows of this runtime with their goals, for reports that skip them.
    pub fn rows(&self) -> [(&'static str, String, Goal); 3] {
        [
            (self.ids[0], self.what(CREATE_WHAT), CREATE_GOAL),
            (self.ids[1], self.what(GO_WHAT), GO_GOAL),
            (self.ids[2], self.what(CONVERGE_WHAT), CONVERGE_GOAL),
        ]
    }
}

fn shared_spec() -> ContainerSpec {
    ContainerSpec::sleeper("app").with_cpu(Some(100), None)
}

/// Create+start of one shared container in a fresh pod; the pod is made
/// before and deleted after the timed part.
async fn create_start(node: &mut Node, n: usize) -> anyhow::Result<Duration> {
    let pod = PodIdentity::new(&format!("bench-{n}"));
    let sandbox = node
        .cri
        .run_pod(&pod.name, dra_cpu_tests::node::NAMESPACE, &pod.uid)
        .await?;
    let started = Instant::now();
    let result = node.cri.run_container(&sandbox, &shared_spec()).await;
    let took = started.elapsed();
    node.cri.delete_pod(&sandbox.id).await?;
    result?;
    Ok(took)
}

/// The Go reference plugin registered with the node's containerd.
struct GoReference {
    child: Child,
}

impl GoReference {
    /// Starts it and waits until the runtime has synchronized it.
    fn start(bin: &std::path::Path, node: &Node) -> anyhow::Result<GoReference> {
        let cpus = node.allocatable()?.to_cpulist();
        let mut child = Command::new(bin)
            .arg("--nri-socket")
            .arg(&node.layout().nri_socket)
            .args(["--cpus", &cpus])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("Go reference stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("synchronized") {
                    let _ = tx.send(());
                }
            }
        });
        let mut reference = GoReference { child };
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            reference.stop();
            bail!("the Go reference plugin did not register within 30 s");
        }
        Ok(reference)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for GoReference {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Container starts of each variant per round of rows 4 and 4b.
const PER_ROUND: usize = 4;

/// Row 4 (ours against no plugin) and 4b (ours against the Go reference),
/// all three interleaved round by round.
async fn create_rows(
    node: &mut Node,
    runtime: &Runtime,
    samples: usize,
) -> anyhow::Result<Vec<Row>> {
    // One first, untimed: image and runtime caches warm.
    create_start(node, 0).await?;
    let go = &runtime.go_reference;
    let (mut ours, mut none, mut reference) = (Vec::new(), Vec::new(), Vec::new());
    // Several starts per variant each round: a round restarts the plugins,
    // which costs far more than a start, and container starts on two shared
    // cores spread widely, so the medians need many samples to settle.
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    for _ in 0..samples {
        for _ in 0..PER_ROUND {
            ours.push(create_start(node, next()).await?);
        }
        node.kill_nri_plugin();
        for _ in 0..PER_ROUND {
            none.push(create_start(node, next()).await?);
        }
        if let Some(bin) = &go {
            let mut plugin = GoReference::start(bin, node)?;
            for _ in 0..PER_ROUND {
                reference.push(create_start(node, next()).await?);
            }
            plugin.stop();
        }
        node.start_nri_plugin().await?;
    }
    let (Some(w), Some(wo)) = (summarize(&ours), summarize(&none)) else {
        bail!("no samples");
    };
    let [create_id, go_id, _] = runtime.ids;
    let mut rows = vec![Row::timed(
        create_id,
        &runtime.what(CREATE_WHAT),
        CREATE_GOAL,
        &w,
        Some(("no NRI plugin, interleaved", &wo)),
        w.median,
        true,
    )];
    rows.push(match summarize(&reference) {
        Some(g) => Row::timed(
            go_id,
            &runtime.what(GO_WHAT),
            GO_GOAL,
            &w,
            Some(("Go reference plugin, interleaved", &g)),
            w.median,
            true,
        ),
        None => Row::not_measured(
            go_id,
            &runtime.what(GO_WHAT),
            GO_GOAL,
            "the Go reference plugin is not built (scripts/perf.sh builds it with Go)",
        ),
    });
    Ok(rows)
}

fn cgroup_cpus(dir: &std::path::Path) -> Option<shared_state::CpuSet> {
    cgroup::cpuset::read_cpuset_dir(dir).ok().map(|c| c.cpus)
}

/// Polls `dir` every millisecond until it says `want`.
async fn wait_cgroup(dir: &std::path::Path, want: &shared_state::CpuSet) -> anyhow::Result<()> {
    let started = Instant::now();
    while cgroup_cpus(dir).as_ref() != Some(want) {
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "{} still {:?}, want {want}",
                dir.display(),
                cgroup_cpus(dir).map(|c| c.to_cpulist())
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

async fn convergence_row(
    node: &mut Node,
    runtime: &Runtime,
    samples: usize,
) -> anyhow::Result<Row> {
    let all = node.allocatable()?;
    if all.len() < 2 {
        bail!("needs at least 2 CPUs, the node has {all}");
    }
    let pod = PodIdentity::new("shared");
    let running = node.start_pod(&pod, &[shared_spec()]).await?;
    let id = running.id("app").to_string();
    let pid = node.cri.container_pid(&id).await?;
    let dir: PathBuf =
        cgroup::hierarchy::cpuset_dir_of(pid).context("shared container's cgroup")?;
    wait_cgroup(&dir, &all).await?;
    let unsolicited = node.unsolicited_updates_safe() == Some(true);
    let mut times = Vec::new();
    for i in 0..samples {
        let owner = PodIdentity::new(&format!("owner-{i}"));
        let prepared = node.create_claim(&format!("conv-{i}"), 1, &owner).await?;
        // The shrink reaches the container with the next event reply.
        node.nudge().await?;
        wait_cgroup(&dir, &all.difference(&prepared.cpus)).await?;
        node.unprepare(&prepared.claim).await?;
        let started = Instant::now();
        node.after_unprepare().await?;
        wait_cgroup(&dir, &all).await?;
        times.push(started.elapsed());
    }
    node.delete_pod(&running).await?;
    let Some(s) = summarize(&times) else {
        bail!("no samples");
    };
    let mut row = Row::timed(
        runtime.ids[2],
        &runtime.what(CONVERGE_WHAT),
        CONVERGE_GOAL,
        &s,
        None,
        s.median,
        true,
    );
    if unsolicited {
        row.baseline = "unsolicited update (runtime allows it)".into();
    } else {
        row.baseline = "runtime's NRI is not safe for unsolicited updates: grown at the next event (a container start)".into();
        // The goal is for runtimes that allow unsolicited updates.
        row.verdict = Verdict::Info;
    }
    Ok(row)
}

/// Rows 4, 4b and 5 on `runtime` (4c, 4d and 5c on containerd 2.x).
pub async fn rows(runtime: &Runtime, samples: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let [create, go, converge] = runtime.rows();
    let mut options = NodeOptions::default();
    options.containerd.bin_dir = runtime.bin_dir.clone();
    // The chart's default: no isolated partitions, so no StartContainer.
    options.read_only_cgroups = true;
    let mut node = match Node::start(options).await {
        Ok(n) => n,
        Err(e) => {
            for (id, what, goal) in [create, go, converge] {
                rows.push(Row::not_measured(id, &what, goal, format!("node: {e}")));
            }
            return rows;
        }
    };
    match create_rows(&mut node, runtime, samples).await {
        Ok(r) => rows.extend(r),
        Err(e) => {
            for (id, what, goal) in [create, go] {
                rows.push(Row::not_measured(id, &what, goal, format!("{e:#}")));
            }
        }
    }
    match convergence_row(&mut node, runtime, samples).await {
        Ok(r) => rows.push(r),
        Err(e) => {
            let (id, what, goal) = converge;
            rows.push(Row::not_measured(id, &what, goal, format!("{e:#}")))
        }
    }
    rows
}
