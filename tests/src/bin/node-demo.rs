//! The node demo: one private node (containerd with NRI, the fake API
//! server, dra-plugin and nri-plugin as their own processes), three pods as
//! a scheduler and kubelet would run them, one more started while
//! nri-plugin is away, and a table of every container's cpuset after each
//! step, read from its cgroup and from inside it.
//!
//! Run it through `scripts/demo.sh` (installs what it needs and builds
//! first); it needs root, like containerd.

// Test support: a panic here fails the test or measurement that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::Context;
use dra_cpu_tests::apiserver::FakeApiServerOptions;
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::{PodIdentity, RunningPod};
use dra_cpu_tests::node::Node;
use std::fmt::Write;

/// One container shown in the table.
struct Shown {
    pod: String,
    container: String,
    kind: &'static str,
    id: String,
}

struct Demo {
    node: Node,
    shown: Vec<Shown>,
    step: usize,
}

impl Demo {
    fn show(&mut self, pod: &RunningPod, kind: &'static str) {
        for (name, id) in &pod.containers {
            self.shown.push(Shown {
                pod: pod.sandbox.name.clone(),
                container: name.clone(),
                kind,
                id: id.clone(),
            });
        }
    }

    fn forget(&mut self, pod: &RunningPod) {
        self.shown.retain(|s| s.pod != pod.sandbox.name);
    }

    /// Prints the table once every container shows what the product
    /// promises (`expect` gives the cpulist per pod name).
    async fn table(&mut self, what: &str, expect: &[(&str, String)]) -> anyhow::Result<()> {
        self.step += 1;
        for (pod, want) in expect {
            let ids: Vec<String> = self
                .shown
                .iter()
                .filter(|s| s.pod == *pod)
                .map(|s| s.id.clone())
                .collect();
            let want = want.parse().with_context(|| format!("cpulist {want:?}"))?;
            for id in ids {
                self.node
                    .wait_cpus(&id, &want)
                    .await
                    .with_context(|| format!("step {}: {pod}", self.step))?;
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "\n[{}] {what}", self.step);
        let _ = writeln!(
            out,
            "  {:<14} {:<10} {:<10} {:<12} {:<18}",
            "pod", "container", "kind", "cpuset.cpus", "Cpus_allowed_list"
        );
        let shown: Vec<(String, String, &'static str, String)> = self
            .shown
            .iter()
            .map(|s| (s.pod.clone(), s.container.clone(), s.kind, s.id.clone()))
            .collect();
        let mut effective_shown = false;
        for (pod, container, kind, id) in shown {
            let cpus = self.node.cpus(&id).await?;
            // On cgroup v2 an unset cpuset.cpus is empty: its effective set
            // is shown instead, marked.
            let from_effective = cpus.cgroup.cpus_detail.source
                == dra_cpu_tests::cgroup::cpuset::CpusetSource::Effective;
            effective_shown |= from_effective;
            let _ = writeln!(
                out,
                "  {:<14} {:<10} {:<10} {:<12} {:<18}",
                pod,
                container,
                kind,
                format!(
                    "{}{}",
                    cpus.cgroup.cpus.to_cpulist(),
                    if from_effective { "*" } else { "" }
                ),
                cpus.allowed_inside.to_cpulist()
            );
        }
        if effective_shown {
            let _ = writeln!(
                out,
                "  * cpuset.cpus is empty (never set): cpuset.cpus.effective is shown"
            );
        }
        print!("{out}");
        Ok(())
    }
}

/// The fake API server's release and gates from `--kubernetes-version
/// 1.34|1.35|1.36|1.37` and `--feature-gates Name=bool,...`; without them a
/// 1.37 server with every gate the driver uses on.
fn api_options(args: &[String]) -> anyhow::Result<FakeApiServerOptions> {
    let value = |flag: &str| -> anyhow::Result<Option<String>> {
        let Some(i) = args.iter().position(|a| a == flag) else {
            return Ok(None);
        };
        args.get(i + 1)
            .cloned()
            .map(Some)
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
    };
    let gates = value("--feature-gates")?.unwrap_or_default();
    match value("--kubernetes-version")? {
        None if gates.is_empty() => Ok(FakeApiServerOptions::default()),
        None => Ok(FakeApiServerOptions {
            feature_gates: FakeApiServerOptions::default()
                .feature_gates
                .with_flags(&gates)
                .map_err(|e| anyhow::anyhow!("--feature-gates: {e}"))?,
            ..Default::default()
        }),
        Some(version) => FakeApiServerOptions::parse(&version, &gates)
            .map_err(|e| anyhow::anyhow!("--kubernetes-version/--feature-gates: {e}")),
    }
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let api = api_options(&args)?;
    println!(
        "dra-cpu node demo: containerd with NRI, fake API server (Kubernetes {}), dra-plugin, nri-plugin",
        api.kubernetes_version
    );
    let node = Node::start(NodeOptions {
        mixed_allocation_mode: true,
        api,
        ..Default::default()
    })
    .await
    .context("bringing up the node")?;
    let all = node.allocatable()?;
    println!(
        "node {} up: CPUs {all}; dra-plugin pid {}, nri-plugin pid {}; mixed allocation mode on",
        node.options().node_name,
        node.dra_plugin_pid().unwrap_or(0),
        node.nri_plugin_pid().unwrap_or(0),
    );
    let mut node = node;
    let runtime = node.runtime_version().await?;
    let safe = match node.unsolicited_updates_safe() {
        Some(true) => "yes: the pool grows back at once",
        Some(false) => "no: the pool grows back at the next container event",
        None => "unknown",
    };
    println!(
        "runtime {runtime} (NRI {}); unsolicited updates safe: {safe}",
        node.nri_runtime_nri_version()
            .unwrap_or_else(|| "version not reported".into())
    );
    let mut demo = Demo {
        node,
        shown: Vec::new(),
        step: 0,
    };

    let shared = PodIdentity::new("shared");
    let shared_pod = demo
        .node
        .start_pod(
            &shared,
            &[ContainerSpec::sleeper("app").with_cpu(Some(500), None)],
        )
        .await
        .context("starting the shared pod")?;
    demo.show(&shared_pod, "shared");
    demo.table(
        "shared pod (requests.cpu 500m) runs on the whole shared pool",
        &[("shared", all.to_cpulist())],
    )
    .await?;

    let (_, claim, exclusive_pod) = demo
        .node
        .start_claim_pod("exclusive", None, 1, None)
        .await
        .context("preparing the claim of exclusive and starting its pod")?;
    demo.show(&exclusive_pod, "exclusive");
    let pool = all.difference(&claim.cpus);
    demo.table(
        &format!(
            "claim of 1 CPU prepared (got {}), exclusive pod started: the shared pool shrinks",
            claim.cpus
        ),
        &[
            ("shared", pool.to_cpulist()),
            ("exclusive", claim.cpus.to_cpulist()),
        ],
    )
    .await?;

    demo.node.delete_pod(&exclusive_pod).await?;
    demo.node.unprepare(&claim.claim).await?;
    demo.node.after_unprepare().await?;
    demo.forget(&exclusive_pod);
    demo.table(
        "exclusive pod deleted, claim unprepared: the shared pool grows back",
        &[("shared", all.to_cpulist())],
    )
    .await?;

    let (_, claim, mixed_pod) = demo
        .node
        .start_claim_pod("mixed", None, 1, Some(250))
        .await
        .context("preparing the claim of mixed and starting its pod")?;
    demo.show(&mixed_pod, "mixed");
    let pool = all.difference(&claim.cpus);
    demo.table(
        &format!(
            "mixed pod (claim of 1 CPU, got {}, plus requests.cpu 250m): its CPU and the shared pool",
            claim.cpus
        ),
        &[
            ("shared", pool.to_cpulist()),
            ("mixed", claim.cpus.union(&pool).to_cpulist()),
        ],
    )
    .await?;

    // The runtime-restart window: containerd before 2.2 has no NRI validator
    // to make it wait for this plugin (`required_plugins`, docs/user/install.md),
    // so a container created while nri-plugin is away starts as the runtime
    // makes it, and nri-plugin repins it at Synchronize when it is back.
    demo.node.kill_nri_plugin();
    let away = PodIdentity::new("while-away");
    let away_pod = demo
        .node
        .start_pod(
            &away,
            &[ContainerSpec::sleeper("app").with_cpu(Some(100), None)],
        )
        .await
        .context("starting a pod while nri-plugin is away")?;
    demo.show(&away_pod, "shared");
    demo.table(
        "nri-plugin away (as after a containerd restart): a pod started now runs unpinned, on the claim's CPU too",
        &[("while-away", all.to_cpulist())],
    )
    .await?;
    demo.node
        .start_nri_plugin()
        .await
        .context("starting nri-plugin again")?;
    demo.table(
        "nri-plugin back: its Synchronize repins the pod to the shared pool (containerd 2.2+ with required_plugins refuses such pods until then)",
        &[
            ("while-away", pool.to_cpulist()),
            ("mixed", claim.cpus.union(&pool).to_cpulist()),
        ],
    )
    .await?;
    demo.node.delete_pod(&away_pod).await?;
    demo.forget(&away_pod);

    demo.node.delete_pod(&mixed_pod).await?;
    demo.node.unprepare(&claim.claim).await?;
    demo.node.after_unprepare().await?;
    demo.forget(&mixed_pod);
    demo.table(
        "mixed pod deleted, claim unprepared: the shared pool grows back",
        &[("shared", all.to_cpulist())],
    )
    .await?;

    demo.node.delete_pod(&shared_pod).await?;
    drop(demo);
    println!("\ncleaned up: processes stopped, containerd and its pods removed");
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node demo failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
