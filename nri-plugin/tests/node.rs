//! nri-plugin on a real node: the harness's containerd 1.7 with NRI, the real
//! `dra-plugin run` (fake API server, kubelet DRA stand-in) and this crate's
//! `nri-plugin` binary, both as separate OS processes with their real flags.
//! Every cpuset is read back from the container's cgroup and from inside it.
//!
//! This machine has CPUs 0-1 and nothing reserved: a one-CPU claim leaves a
//! one-CPU shared pool, a second one leaves it empty.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::containerd::ContainerdError;
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::read_back::metric_value;
use dra_cpu_tests::node::{Node, NodeError, NAMESPACE};
use dra_cpu_tests::served_series::{check_served, Series};
use dra_cpu_tests::skip::skip_or_fail_in_ci;
use shared_state::CpuSet;
use std::time::Duration;

/// Starts a node, or `None` (test skipped) where containerd is missing;
/// in CI a missing containerd fails the test.
async fn node(mixed: bool) -> Option<Node> {
    // The binary under test, whatever target directory cargo uses.
    std::env::set_var("NRI_PLUGIN_BIN", env!("CARGO_BIN_EXE_nri-plugin"));
    let options = NodeOptions {
        mixed_allocation_mode: mixed,
        // These tests drive the shared pool empty to see what nri-plugin
        // does then; dra-plugin's floor would refuse that claim first.
        min_shared_cpus: Some(0),
        ..Default::default()
    };
    match Node::start(options).await {
        Ok(node) => Some(node),
        Err(NodeError::Containerd(e @ ContainerdError::NotInstalled { .. })) => {
            skip_or_fail_in_ci(e);
            None
        }
        Err(e) => panic!("starting the node: {e}"),
    }
}

fn claim_container(name: &str, claim: &PreparedClaim) -> ContainerSpec {
    ContainerSpec::sleeper(name).with_cdi_device(&claim.cdi_device)
}

async fn nri_metric(node: &Node, name: &str) -> Option<f64> {
    metric_at(node.layout().nri_metrics, name).await
}

/// Waits until dra-plugin says every subscriber applied its last revision.
async fn wait_converged(node: &Node) {
    let started = std::time::Instant::now();
    loop {
        let lag = metric_at(node.layout().dra_metrics, "dra_cpu_applied_revision_lag").await;
        if lag == Some(0.0) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nri-plugin never reported the current revision applied (lag {lag:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric_at(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    metric_value(&body, name)
}

/// Creating a container that nri-plugin must refuse; the CRI error text.
async fn refused(node: &mut Node, pod: &PodIdentity, spec: &ContainerSpec) -> String {
    let sandbox = node
        .cri
        .run_pod(&pod.name, NAMESPACE, &pod.uid)
        .await
        .expect("sandbox");
    let err = node
        .cri
        .run_container(&sandbox, spec)
        .await
        .expect_err("the container must be refused");
    err.runtime_message()
        .unwrap_or_else(|| panic!("not a runtime refusal: {err}"))
        .to_string()
}

fn all_cpus(node: &Node) -> CpuSet {
    node.allocatable().expect("online CPUs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_shrink_and_grow_shared_and_mixed_containers() {
    let Some(mut node) = node(true).await else {
        return;
    };
    let all = all_cpus(&node);
    assert!(all.len() >= 2, "needs two CPUs, has {all}");

    let web_pod = PodIdentity::new("web");
    let web = node
        .start_pod(
            &web_pod,
            &[ContainerSpec::sleeper("web").with_cpu(Some(100), None)],
        )
        .await
        .expect("shared pod");
    let web_id = web.id("web").to_string();
    node.wait_cpus(&web_id, &all)
        .await
        .expect("shared starts on every CPU");

    // An exclusive claim container gets exactly its CPU; web shrinks.
    let pod_a = PodIdentity::new("excl");
    let claim_a = node
        .create_claim("claim-a", 1, &pod_a)
        .await
        .expect("claim a");
    assert_eq!(claim_a.cpus.len(), 1);
    let running_a = node
        .start_pod(&pod_a, &[claim_container("app", &claim_a)])
        .await
        .expect("claim pod");
    let pool = all.difference(&claim_a.cpus);
    let got = node
        .wait_cpus(running_a.id("app"), &claim_a.cpus)
        .await
        .expect("exclusive cpuset");
    assert_eq!(got.cgroup.cpus, claim_a.cpus);
    node.wait_cpus(&web_id, &pool)
        .await
        .expect("web shrinks in the same reply");
    // The shrink was sent, so the claim's revision is reported applied.
    wait_converged(&node).await;

    // Unprepare grows web back (unsolicited or at the next event).
    node.delete_pod(&running_a).await.expect("delete claim pod");
    node.unprepare(&claim_a.claim).await.expect("unprepare a");
    node.after_unprepare().await.expect("nudge");
    node.wait_cpus(&web_id, &all).await.expect("web grows back");

    // A mixed container: its claim's CPU plus the shared pool.
    let pod_b = PodIdentity::new("mixed");
    let claim_b = node
        .create_claim("claim-b", 1, &pod_b)
        .await
        .expect("claim b");
    let running_b = node
        .start_pod(
            &pod_b,
            &[claim_container("mixed", &claim_b).with_cpu(Some(500), None)],
        )
        .await
        .expect("mixed pod");
    let mixed_id = running_b.id("mixed").to_string();
    node.wait_cpus(&mixed_id, &all)
        .await
        .expect("mixed = claim ∪ shared");
    let pool_b = all.difference(&claim_b.cpus);
    node.wait_cpus(&web_id, &pool_b).await.expect("web shrinks");

    // Another claim takes the last shared CPUs: the mixed container shrinks
    // to its claim, web keeps its old cpuset (never an empty one) and the
    // node reports itself over-committed.
    let pod_c = PodIdentity::new("excl-c");
    let claim_c = node
        .create_claim(
            "claim-c",
            u32::try_from(pool_b.len()).expect("CPU count"),
            &pod_c,
        )
        .await
        .expect("claim c");
    let running_c = node
        .start_pod(&pod_c, &[claim_container("app", &claim_c)])
        .await
        .expect("claim c pod");
    node.wait_cpus(running_c.id("app"), &claim_c.cpus)
        .await
        .expect("exclusive c");
    node.wait_cpus(&mixed_id, &claim_b.cpus)
        .await
        .expect("mixed shrinks to its claim");
    assert_eq!(
        node.cpus(&web_id).await.expect("web cpus").cgroup.cpus,
        pool_b,
        "web keeps its last cpuset"
    );
    assert_eq!(
        nri_metric(&node, "nri_plugin_over_committed_containers").await,
        Some(1.0)
    );

    // A new shared container is refused, saying why.
    let message = refused(
        &mut node,
        &PodIdentity::new("late"),
        &ContainerSpec::sleeper("late"),
    )
    .await;
    assert!(message.contains("the shared pool is empty"), "{message}");

    // Freeing claim c gives the pool back to web and the mixed container.
    node.delete_pod(&running_c).await.expect("delete c");
    node.unprepare(&claim_c.claim).await.expect("unprepare c");
    node.after_unprepare().await.expect("nudge");
    node.wait_cpus(&mixed_id, &all)
        .await
        .expect("mixed grows back");
    node.wait_cpus(&web_id, &pool_b)
        .await
        .expect("web back on the pool");
    assert_eq!(
        nri_metric(&node, "nri_plugin_over_committed_containers").await,
        Some(0.0)
    );
    assert_eq!(
        nri_metric(
            &node,
            "nri_plugin_refused_containers_total{reason=\"empty-shared-pool\"}"
        )
        .await,
        Some(1.0),
        "the refusal is counted by reason"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_unknown_claims_are_refused_with_the_reason() {
    let Some(mut node) = node(false).await else {
        return;
    };
    let owner = PodIdentity::new("owner");
    let claim = node.create_claim("claim", 1, &owner).await.expect("claim");
    let uid = &claim.claim.uid;
    let other_cpus = all_cpus(&node).difference(&claim.cpus);

    // The claim's variable with CPUs it does not hold.
    let forged = ContainerSpec::sleeper("forged")
        .with_env(&format!("DRA_CPUSET_{uid}"), &other_cpus.to_cpulist());
    let message = refused(&mut node, &PodIdentity::new("forger"), &forged).await;
    assert!(
        message.contains("dra-cpu refuses container")
            && message.contains("the container environment says CPUs"),
        "{message}"
    );

    // The right CPUs, copied into a pod the claim is not reserved for.
    let copied = ContainerSpec::sleeper("copy")
        .with_env(&format!("DRA_CPUSET_{uid}"), &claim.cpus.to_cpulist());
    let message = refused(&mut node, &PodIdentity::new("copier"), &copied).await;
    assert!(message.contains("not for pod"), "{message}");

    // A claim that was never prepared: nri-plugin asks dra-plugin, which
    // says so.
    let unknown = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
    let made_up = ContainerSpec::sleeper("made-up").with_env(&format!("DRA_CPUSET_{unknown}"), "1");
    let message = refused(&mut node, &PodIdentity::new("made-up"), &made_up).await;
    assert!(
        message.contains(&format!("claim {unknown} is not prepared on this node")),
        "{message}"
    );

    // The owner still gets its claim; a second container of it is refused.
    let running = node
        .start_pod(&owner, &[claim_container("app", &claim)])
        .await
        .expect("owner");
    node.wait_cpus(running.id("app"), &claim.cpus)
        .await
        .expect("owner pinned");
    let sandbox = running.sandbox.clone();
    let err = node
        .cri
        .run_container(&sandbox, &claim_container("sidecar", &claim))
        .await
        .expect_err("second container of the claim");
    let message = err.runtime_message().unwrap_or_default().to_string();
    assert!(
        message.contains("a claim serves one container"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_of_every_process_keep_or_repair_cpusets() {
    let Some(mut node) = node(false).await else {
        return;
    };
    let all = all_cpus(&node);
    let pod = PodIdentity::new("pinned");
    let claim = node.create_claim("claim", 1, &pod).await.expect("claim");
    let pool = all.difference(&claim.cpus);

    // Containers created while nri-plugin is dead run unpinned...
    node.kill_nri_plugin();
    let web = node
        .start_pod(&PodIdentity::new("web"), &[ContainerSpec::sleeper("web")])
        .await
        .expect("web");
    let running = node
        .start_pod(&pod, &[claim_container("app", &claim)])
        .await
        .expect("claim pod");
    let (web_id, app_id) = (web.id("web").to_string(), running.id("app").to_string());
    assert_eq!(node.cpus(&app_id).await.expect("cpus").cgroup.cpus, all);
    // ...until it comes back and Synchronize repairs them.
    node.start_nri_plugin().await.expect("nri-plugin back");
    node.wait_cpus(&app_id, &claim.cpus)
        .await
        .expect("claim container repaired");
    node.wait_cpus(&web_id, &pool)
        .await
        .expect("shared container repaired");

    // dra-plugin killed and restarted: running containers are not touched.
    node.kill_dra_plugin();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        node.cpus(&app_id).await.expect("app").cgroup.cpus,
        claim.cpus
    );
    assert_eq!(node.cpus(&web_id).await.expect("web").cgroup.cpus, pool);
    // nri-plugin restarted while dra-plugin is down starts from the claims'
    // CDI specs: the claim container stays pinned and a new shared container
    // still keeps off the claim's CPU.
    node.restart_nri_plugin()
        .await
        .expect("nri-plugin without dra-plugin");
    let lone = node
        .start_pod(&PodIdentity::new("lone"), &[ContainerSpec::sleeper("lone")])
        .await
        .expect("shared pod while dra-plugin is down");
    node.wait_cpus(lone.id("lone"), &pool)
        .await
        .expect("pool from the CDI view");
    assert_eq!(
        node.cpus(&app_id).await.expect("app").cgroup.cpus,
        claim.cpus
    );
    assert_eq!(node.cpus(&web_id).await.expect("web").cgroup.cpus, pool);
    node.delete_pod(&lone).await.expect("delete lone");
    // nri-plugin resubscribes by itself; the harness waits until it has.
    node.restart_dra_plugin().await.expect("dra-plugin back");
    assert_eq!(
        node.cpus(&app_id).await.expect("app").cgroup.cpus,
        claim.cpus
    );
    assert_eq!(node.cpus(&web_id).await.expect("web").cgroup.cpus, pool);

    // New claims work again after dra-plugin is back.
    node.delete_pod(&running).await.expect("delete claim pod");
    node.unprepare(&claim.claim).await.expect("unprepare");
    node.after_unprepare().await.expect("nudge");
    node.wait_cpus(&web_id, &all).await.expect("web grows back");
    let pod2 = PodIdentity::new("second");
    let claim2 = node
        .create_claim("claim-2", 1, &pod2)
        .await
        .expect("claim 2");
    let second = node
        .start_pod(&pod2, &[claim_container("app", &claim2)])
        .await
        .expect("second claim pod");
    node.wait_cpus(second.id("app"), &claim2.cpus)
        .await
        .expect("new claim pinned");
    let pool2 = all.difference(&claim2.cpus);
    node.wait_cpus(&web_id, &pool2).await.expect("web shrinks");

    // containerd restarted: nri-plugin reconnects by itself and keeps working.
    node.restart_containerd().await.expect("containerd restart");
    let after = node
        .start_pod(
            &PodIdentity::new("after"),
            &[ContainerSpec::sleeper("after")],
        )
        .await
        .expect("shared pod after the restart");
    node.wait_cpus(after.id("after"), &pool2)
        .await
        .expect("pinned by the reconnected plugin");
}

async fn metrics_text(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// The upstream Go driver's NRI callback series, as its `pkg/metrics`
/// declares them: name, type, help, label names. All are histograms.
const UPSTREAM_NRI_SERIES: [Series; 4] = [
    (
        "dra_cpu_nri_synchronize_duration_seconds",
        "histogram",
        "Duration of the NRI Synchronize callbacks in seconds.",
        &["result"],
    ),
    (
        "dra_cpu_nri_create_container_duration_seconds",
        "histogram",
        "Duration of the NRI CreateContainer callbacks in seconds.",
        &["cpu_allocation_mode", "result"],
    ),
    (
        "dra_cpu_nri_stop_container_duration_seconds",
        "histogram",
        "Duration of the NRI StopContainer callbacks in seconds.",
        &["cpu_allocation_mode", "result"],
    ),
    (
        "dra_cpu_nri_remove_container_duration_seconds",
        "histogram",
        "Duration of the NRI RemoveContainer callbacks in seconds.",
        &["cpu_allocation_mode", "result"],
    ),
];

/// Observations of one labelled histogram series (its `+Inf` bucket).
fn histogram_count(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == name
                && s.labels.len() == labels.len()
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })
        .unwrap_or_else(|| panic!("no series {name} {labels:?}"));
    let prometheus_parse::Value::Histogram(buckets) = &sample.value else {
        panic!("{name} is not a histogram: {:?}", sample.value);
    };
    buckets
        .iter()
        .find(|b| b.less_than == f64::INFINITY)
        .map(|b| b.count)
        .unwrap_or_else(|| panic!("{name} {labels:?} has no +Inf bucket"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_nri_callback_series_are_served() {
    let Some(mut node) = node(false).await else {
        return;
    };
    let shared_pod = PodIdentity::new("web");
    node.start_pod(&shared_pod, &[ContainerSpec::sleeper("web")])
        .await
        .expect("shared pod");
    let claim_pod = PodIdentity::new("excl");
    let claim = node
        .create_claim("claim-a", 1, &claim_pod)
        .await
        .expect("claim");
    let running = node
        .start_pod(&claim_pod, &[claim_container("app", &claim)])
        .await
        .expect("claim pod");
    node.wait_cpus(running.id("app"), &claim.cpus)
        .await
        .expect("exclusive cpuset");
    node.delete_pod(&running).await.expect("delete claim pod");

    let addr = node.layout().nri_metrics;
    let text = metrics_text(addr).await;
    let scrape = check_served(&text, &UPSTREAM_NRI_SERIES);
    // The runtime synchronized once at registration; each container was
    // labelled by the claims its environment names.
    let create = "dra_cpu_nri_create_container_duration_seconds";
    let exclusive = [("result", "success"), ("cpu_allocation_mode", "exclusive")];
    let shared = [("result", "success"), ("cpu_allocation_mode", "shared")];
    assert_eq!(
        histogram_count(
            &scrape,
            "dra_cpu_nri_synchronize_duration_seconds",
            &[("result", "success")]
        ),
        1.0
    );
    assert_eq!(histogram_count(&scrape, create, &exclusive), 1.0, "{text}");
    assert!(histogram_count(&scrape, create, &shared) >= 1.0, "{text}");
    assert_eq!(
        histogram_count(
            &scrape,
            create,
            &[("result", "error"), ("cpu_allocation_mode", "shared")]
        ),
        0.0
    );
    for name in [
        "dra_cpu_nri_stop_container_duration_seconds",
        "dra_cpu_nri_remove_container_duration_seconds",
    ] {
        assert_eq!(
            histogram_count(&scrape, name, &exclusive),
            1.0,
            "{name}\n{text}"
        );
    }
}
