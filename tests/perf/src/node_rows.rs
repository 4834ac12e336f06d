//! Rows that need a real containerd (the node of [`dra_cpu_tests::node`]):
//! container create+start with nri-plugin registered against no NRI plugin
//! at all, interleaved (row 4), and the time from NodeUnprepareResources
//! returning to a shared container's cgroup showing the grown pool (row 5).

use super::{summarize, Goal, Row, Verdict};
use anyhow::{bail, Context};
use dra_cpu_tests::cgroup;
use dra_cpu_tests::cri::ContainerSpec;
use dra_cpu_tests::node::{Node, NodeOptions, PodIdentity};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CREATE_WHAT: &str = "container create+start through containerd, nri-plugin registered";
const CONVERGE_WHAT: &str =
    "NodeUnprepareResources return → shared container cgroup shows the grown pool";
const GO_WHAT: &str =
    "container create+start, nri-plugin vs a Go reference plugin (official NRI stub, same cpuset adjustment)";

/// The rows of this module with their goals, for reports that skip them.
pub const ROWS: [(&str, &str, Goal); 3] = [
    ("4", CREATE_WHAT, Goal::RatioAtMost(1.05)),
    ("4b", GO_WHAT, Goal::RatioAtMost(1.0)),
    ("5", CONVERGE_WHAT, Goal::AtMost(Duration::from_millis(100))),
];

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

/// The Go reference plugin (`go-reference/main.go`), built by
/// `scripts/perf.sh` when a Go toolchain is installed.
fn go_reference_bin() -> Option<PathBuf> {
    let path = match std::env::var_os("NRI_GO_REFERENCE_BIN") {
        Some(p) => PathBuf::from(p),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/tmp/nri-go-reference"),
    };
    path.is_file().then_some(path)
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
async fn create_rows(node: &mut Node, samples: usize) -> anyhow::Result<Vec<Row>> {
    // One first, untimed: image and runtime caches warm.
    create_start(node, 0).await?;
    let go = go_reference_bin();
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
    let mut rows = vec![Row::timed(
        "4",
        CREATE_WHAT,
        Goal::RatioAtMost(1.05),
        &w,
        Some(("no NRI plugin, interleaved", &wo)),
        w.median,
        true,
    )];
    rows.push(match summarize(&reference) {
        Some(g) => Row::timed(
            "4b",
            GO_WHAT,
            Goal::RatioAtMost(1.0),
            &w,
            Some(("Go reference plugin, interleaved", &g)),
            w.median,
            true,
        ),
        None => Row::not_measured(
            "4b",
            GO_WHAT,
            Goal::RatioAtMost(1.0),
            "the Go reference plugin is not built (scripts/perf.sh builds it when Go and golang-github-containerd-nri-dev are installed)",
        ),
    });
    Ok(rows)
}

fn cgroup_cpus(dir: &std::path::Path) -> Option<shared_state::CpuSet> {
    cgroup::read_cpuset_dir(dir).ok().map(|c| c.cpus)
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

async fn convergence_row(node: &mut Node, samples: usize) -> anyhow::Result<Row> {
    let all = node.allocatable()?;
    if all.len() < 2 {
        bail!("needs at least 2 CPUs, the node has {all}");
    }
    let pod = PodIdentity::new("shared");
    let running = node.start_pod(&pod, &[shared_spec()]).await?;
    let id = running.id("app").to_string();
    let pid = node.cri.container_pid(&id).await?;
    let dir: PathBuf = cgroup::cpuset_dir_of(pid).context("shared container's cgroup")?;
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
    let goal = Goal::AtMost(Duration::from_millis(100));
    let mut row = Row::timed("5", CONVERGE_WHAT, goal, &s, None, s.median, true);
    if unsolicited {
        row.baseline = "unsolicited update (runtime allows it)".into();
    } else {
        row.baseline = "runtime's NRI is not safe for unsolicited updates: grown at the next event (a container start)".into();
        // The goal is for runtimes that allow unsolicited updates.
        row.verdict = Verdict::Info;
    }
    Ok(row)
}

/// Rows 4, 4b and 5.
pub async fn rows(samples: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut node = match Node::start(NodeOptions::default()).await {
        Ok(n) => n,
        Err(e) => {
            for (id, what, goal) in ROWS {
                rows.push(Row::not_measured(id, what, goal, format!("node: {e}")));
            }
            return rows;
        }
    };
    match create_rows(&mut node, samples).await {
        Ok(r) => rows.extend(r),
        Err(e) => {
            for (id, what, goal) in &ROWS[..2] {
                rows.push(Row::not_measured(id, what, *goal, format!("{e:#}")));
            }
        }
    }
    match convergence_row(&mut node, samples).await {
        Ok(r) => rows.push(r),
        Err(e) => rows.push(Row::not_measured(
            "5",
            CONVERGE_WHAT,
            ROWS[2].2,
            format!("{e:#}"),
        )),
    }
    rows
}
