//! Planning cost of the node view at the size of a big node: 512 allocatable
//! CPUs, 100 claims of 4 CPUs, 500 containers (400 shared, 50 exclusive,
//! 50 mixed). nri-plugin runs these on every NRI event.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use shared_state::claim_env::EnvClaim;
use shared_state::pool::state::PoolState;
use shared_state::{ClaimAssignment, CpuSet};
use std::hint::black_box;

const CLAIMS: u32 = 100;
const CPUS_PER_CLAIM: u32 = 4;
const SHARED_CONTAINERS: usize = 400;

fn claim_uid(i: u32) -> String {
    format!("{i:08x}-0000-4000-8000-000000000000")
}

fn claim(i: u32) -> ClaimAssignment {
    let base = 8 + i * CPUS_PER_CLAIM;
    ClaimAssignment {
        claim_uid: claim_uid(i),
        namespace: "bench".into(),
        name: format!("claim-{i}"),
        consumer_pods: vec![format!("pod-claim-{i}")],
        devices: Vec::new(),
        cpus: (base..base + CPUS_PER_CLAIM).collect(),
        prepared_at_unix_ms: 0,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

fn claim_ref(i: u32) -> EnvClaim {
    let c = claim(i);
    EnvClaim {
        claim_uid: c.claim_uid,
        cpus: c.cpus,
    }
}

/// A converged node with `claims` claims prepared, each named by one
/// container (even: exclusive, odd: mixed), plus the shared containers.
fn node(claims: u32) -> PoolState {
    let allocatable: CpuSet = (0..512).collect();
    let mut state = PoolState::new(allocatable, CpuSet::new(), true);
    for i in 0..SHARED_CONTAINERS {
        state
            .admit(
                &format!("shared-{i:04}"),
                &format!("pod-{i}"),
                "app",
                &[],
                None,
            )
            .expect("shared container");
    }
    for i in 0..claims {
        state.add_claim(claim(i)).expect("disjoint claim");
        let shares = if i % 2 == 0 { None } else { Some(512) };
        state
            .admit(
                &format!("claim-{i:04}"),
                &format!("pod-claim-{i}"),
                "app",
                &[claim_ref(i)],
                shares,
            )
            .expect("claim container");
        let updates = state.plan_updates();
        state.mark_applied(&updates);
    }
    state
}

fn benches(c: &mut Criterion) {
    let with_99 = node(CLAIMS - 1);
    let full = node(CLAIMS);
    assert_eq!(full.containers().len(), 500);
    // The update counts the bench names promise: 400 shared + 49 mixed shrink;
    // freeing claim 0 grows 400 shared + 50 mixed and moves its orphaned
    // exclusive container onto the pool.
    assert_eq!(
        with_99
            .clone()
            .add_claim(claim(CLAIMS - 1))
            .map(|u| u.len()),
        Ok(449)
    );
    assert_eq!(full.clone().remove_claim(&claim_uid(0)).len(), 451);

    c.bench_function("add_claim, 449 shrinks", |b| {
        b.iter_batched(
            || (with_99.clone(), claim(CLAIMS - 1)),
            |(mut state, a)| {
                let updates = state.add_claim(a).expect("disjoint claim");
                black_box(updates.len());
                state
            },
            BatchSize::LargeInput,
        )
    });

    c.bench_function("remove_claim, 451 grows", |b| {
        b.iter_batched(
            || full.clone(),
            |mut state| {
                black_box(state.remove_claim(&claim_uid(0)).len());
                state
            },
            BatchSize::LargeInput,
        )
    });

    c.bench_function("admit exclusive, converged node", |b| {
        let mut state = full.clone();
        state.remove_container("claim-0050");
        let refs = [claim_ref(50)];
        b.iter(|| {
            let a = state
                .admit("claim-0050", "pod-claim-50", "app", black_box(&refs), None)
                .expect("admit");
            black_box(a.updates.len())
        })
    });

    c.bench_function("admit shared, 449 shrinks pending", |b| {
        let mut state = with_99.clone();
        let pending = state.add_claim(claim(CLAIMS - 1)).expect("claim");
        b.iter(|| {
            let a = state
                .admit("new-shared", "pod-new", "app", &[], Some(100))
                .expect("admit");
            assert_eq!(a.updates.len(), pending.len());
            black_box(a.updates.len())
        })
    });

    c.bench_function("plan_updates, converged node", |b| {
        b.iter(|| black_box(full.plan_updates().len()))
    });

    c.bench_function("plan_updates, 449 changes", |b| {
        let mut state = with_99.clone();
        let _pending = state.add_claim(claim(CLAIMS - 1)).expect("claim");
        b.iter(|| black_box(state.plan_updates().len()))
    });
}

criterion_group!(pool, benches);
criterion_main!(pool);
