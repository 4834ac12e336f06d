//! Rows that need a real containerd (the node of [`crate::node`]):
//! container create+start with nri-plugin registered against no NRI plugin
//! at all, interleaved (row 4), and the time from NodeUnprepareResources
//! returning to a shared container's cgroup showing the grown pool (row 5).

use super::{summarize, Goal, Row, Verdict};
use crate::cgroup;
use crate::cri::ContainerSpec;
use crate::node::{Node, NodeOptions, PodIdentity};
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CREATE_WHAT: &str = "container create+start through containerd, nri-plugin registered";
const CONVERGE_WHAT: &str =
    "NodeUnprepareResources return → shared container cgroup shows the grown pool";
const GO_WHAT: &str = "create+start vs a Go reference plugin (official NRI stub)";

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
        .run_pod(&pod.name, crate::node::NAMESPACE, &pod.uid)
        .await?;
    let started = Instant::now();
    let result = node.cri.run_container(&sandbox, &shared_spec()).await;
    let took = started.elapsed();
    node.cri.delete_pod(&sandbox.id).await?;
    result?;
    Ok(took)
}

async fn create_rows(node: &mut Node, samples: usize) -> anyhow::Result<Row> {
    // One of each first, untimed: image and runtime caches warm.
    create_start(node, 0).await?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..samples {
        with.push(create_start(node, 2 * i + 1).await?);
        node.kill_nri_plugin();
        without.push(create_start(node, 2 * i + 2).await?);
        node.start_nri_plugin().await?;
    }
    let (Some(w), Some(wo)) = (summarize(&with), summarize(&without)) else {
        bail!("no samples");
    };
    Ok(Row::timed(
        "4",
        CREATE_WHAT,
        Goal::RatioAtMost(1.05),
        &w,
        Some(("no NRI plugin, interleaved", &wo)),
        w.median,
        true,
    ))
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

/// Rows 4, 4b and 5. The Go reference plugin is not built by this table.
pub async fn rows(samples: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let go = Row::not_measured(
        "4b",
        GO_WHAT,
        Goal::RatioAtMost(1.0),
        "the Go reference plugin is not in the bench folder yet",
    );
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
        Ok(r) => rows.push(r),
        Err(e) => rows.push(Row::not_measured(
            "4",
            CREATE_WHAT,
            ROWS[0].2,
            format!("{e:#}"),
        )),
    }
    rows.push(go);
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
