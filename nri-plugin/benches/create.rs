//! CreateContainer handling in the plugin, without the wire: lock the view,
//! decide, build the NRI reply, record what was sent. The node has 512 CPUs
//! (2 sockets, 4 NUMA nodes, SMT) and 100 running containers: 70 shared,
//! 20 exclusive and 10 mixed, each claim container holding 4 CPUs.
//!
//! Two cases: a shared container when nothing is pending (the common one),
//! and a claim container right after its claim was prepared, whose reply
//! must also shrink all 80 shared and mixed containers (the worst one).
//! After criterion's report, the median and p99 of single calls are printed
//! for each case, since a reply deadline is about the tail.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use nri_plugin::nri::messages::creation_reply;
use nri_plugin::view::numa::NumaMap;
use nri_plugin::view::{ContainerInfo, NodeView};
use shared_state::topology::synthetic::{build, MACHINE_512};
use shared_state::{ClaimAssignment, CpuSet};

// The allocator the nri-plugin binary ships with.
nri_plugin::install_process_allocator!();

const CLAIM_CPUS: u32 = 4;

fn uid(i: u32) -> String {
    format!("{i:08x}-0000-4000-8000-000000000000")
}

fn claim(i: u32, pod: &str) -> ClaimAssignment {
    let first = 8 + i * CLAIM_CPUS;
    ClaimAssignment {
        claim_uid: uid(i),
        namespace: "default".into(),
        name: format!("claim-{i}"),
        consumer_pods: vec![pod.to_string()],
        devices: Vec::new(),
        cpus: (first..first + CLAIM_CPUS).collect(),
        prepared_at_unix_ms: 0,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

fn info(id: &str, pod: &str, claim: Option<&ClaimAssignment>, shares: u64) -> ContainerInfo {
    ContainerInfo {
        id: id.to_string(),
        name: "app".into(),
        pod_uid: pod.to_string(),
        env: claim
            .map(|c| vec![format!("DRA_CPUSET_{}={}", c.claim_uid, c.cpus)])
            .unwrap_or_default(),
        cpu_shares: Some(shares),
        ..Default::default()
    }
}

/// The node with its 100 running containers, every update sent.
fn node() -> Mutex<NodeView> {
    let topology = build(&MACHINE_512);
    assert_eq!(topology.cpus.len(), 512);
    let mut view = NodeView::new(
        topology.online(),
        (0..4).collect::<CpuSet>(),
        true,
        Some(NumaMap::from_topology(&topology)),
    );
    let mut revision = 0;
    for i in 0..100u32 {
        let pod = format!("pod-{i}");
        let (claim, shares) = match i {
            0..=69 => (None, 102),
            70..=89 => (Some(claim(i, &pod)), 2),
            _ => (Some(claim(i, &pod)), 1024),
        };
        if let Some(c) = &claim {
            revision += 1;
            let up = view.apply_prepared(revision, c.clone()).expect("claim");
            view.mark_applied(&up);
        }
        let d = view
            .create(&info(&format!("c{i:03}"), &pod, claim.as_ref(), shares))
            .decided()
            .expect("admit");
        view.mark_applied(&d.updates);
    }
    assert_eq!(view.pool().containers().len(), 100);
    assert!(view.pending_updates().is_empty());
    Mutex::new(view)
}

/// One CreateContainer as the plugin handles it; returns the updates count.
fn handle(view: &Mutex<NodeView>, container: &ContainerInfo) -> usize {
    let mut v = view.lock().expect("view");
    let decision = v.create(container).decided().expect("admit");
    let reply = creation_reply(&decision);
    v.mark_applied(&decision.updates);
    reply.update.len()
}

/// The decision alone, without building the NRI reply.
fn decide(view: &Mutex<NodeView>, container: &ContainerInfo) -> usize {
    let mut v = view.lock().expect("view");
    let decision = v.create(container).decided().expect("admit");
    v.mark_applied(&decision.updates);
    decision.updates.len()
}

/// Undo a case so every iteration starts from the same node.
fn reset(view: &Mutex<NodeView>, container_id: &str, claim_uid: Option<(&str, &mut u64)>) {
    let mut v = view.lock().expect("view");
    v.remove_container(container_id);
    if let Some((uid, revision)) = claim_uid {
        *revision += 1;
        let up = v.apply_unprepared(*revision, uid).expect("unprepare");
        v.mark_applied(&up);
    }
}

struct Case {
    view: Mutex<NodeView>,
    revision: u64,
}

impl Case {
    fn new() -> Self {
        Case {
            view: node(),
            revision: 1000,
        }
    }

    fn shared(&mut self) -> Duration {
        let c = info("new-shared", "pod-new", None, 102);
        let started = Instant::now();
        let n = handle(&self.view, &c);
        let took = started.elapsed();
        assert_eq!(n, 0);
        reset(&self.view, "new-shared", None);
        took
    }

    fn claim_with_shrink(&mut self) -> Duration {
        self.claim_case(handle)
    }

    fn claim_case(&mut self, step: fn(&Mutex<NodeView>, &ContainerInfo) -> usize) -> Duration {
        let new_claim = claim(110, "pod-new");
        self.revision += 1;
        let pending = self
            .view
            .lock()
            .expect("view")
            .apply_prepared(self.revision, new_claim.clone())
            .expect("prepare");
        assert_eq!(
            pending.len(),
            80,
            "every shared and mixed container shrinks"
        );
        let c = info("new-claim", "pod-new", Some(&new_claim), 2);
        let started = Instant::now();
        let n = step(&self.view, &c);
        let took = started.elapsed();
        assert_eq!(n, 80);
        let mut revision = self.revision;
        reset(
            &self.view,
            "new-claim",
            Some((&new_claim.claim_uid, &mut revision)),
        );
        self.revision = revision;
        took
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("create_container_100_running_512_cpus");
    let mut case = Case::new();
    group.bench_function("shared_nothing_pending", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| case.shared()).sum())
    });
    group.bench_function("claim_container_shrinks_80", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| case.claim_with_shrink()).sum())
    });
    group.finish();
}

fn percentiles(name: &str, mut run: impl FnMut() -> Duration) {
    const CALLS: usize = 20_000;
    let mut samples: Vec<Duration> = (0..CALLS).map(|_| run()).collect();
    samples.sort();
    let at = |q: f64| samples[((CALLS as f64 * q) as usize).min(CALLS - 1)];
    println!(
        "{name}: median {:?}, p99 {:?}, max {:?} over {CALLS} calls",
        at(0.5),
        at(0.99),
        samples[CALLS - 1]
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    let mut case = Case::new();
    percentiles("create shared, nothing pending", || case.shared());
    percentiles("create claim container, 80 shrinks in the reply", || {
        case.claim_with_shrink()
    });
    percentiles("  of which the decision alone", || case.claim_case(decide));
}
