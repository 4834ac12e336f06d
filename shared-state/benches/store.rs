//! Cost of a durable commit in the assignment store, against the floor set
//! by the disk: writing and fsyncing one small file in the same directory.
//! Every prepare pays one commit; `apply` lets a burst of prepares share one.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use shared_state::store::sled_store::SledStore;
use shared_state::store::{AssignmentStore, StoreOp};
use shared_state::{AllocatedDevice, ClaimAssignment, CpuSet};
use std::hint::black_box;
use std::io::Write;

const BATCH: usize = 32;
/// Distinct claims cycled through, so the store stays at a realistic size.
const CLAIMS: usize = 128;

fn record(i: usize) -> ClaimAssignment {
    let base = (i % 64) as u32 * 4;
    ClaimAssignment {
        claim_uid: format!("{i:08x}-0000-4000-8000-000000000000"),
        namespace: "bench".into(),
        name: format!("claim-{i}"),
        consumer_pods: vec![format!("{i:08x}-1111-4000-8000-000000000000")],
        devices: vec![AllocatedDevice {
            request: "cpus".into(),
            pool: "node-a".into(),
            device: "cpudevnuma000".into(),
            consumed_cpus: Some(4),
            share_id: None,
        }],
        cpus: (base..base + 4).collect::<CpuSet>(),
        prepared_at_unix_ms: 1_700_000_000_000,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

fn durable_commit(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = SledStore::open(&tmp.path().join("store")).expect("open store");
    let records: Vec<ClaimAssignment> = (0..CLAIMS).map(record).collect();
    let payload = serde_json::to_vec(&records[0]).expect("encode");
    let bare_file = tmp.path().join("bare.json");

    let mut group = c.benchmark_group("store");
    let mut next = 0usize;
    group.bench_function("put_with_flush", |b| {
        b.iter(|| {
            next = (next + 1) % CLAIMS;
            black_box(store.put(&records[next]).expect("put"))
        })
    });
    group.bench_function("bare_write_fsync", |b| {
        b.iter(|| {
            let mut file = std::fs::File::create(&bare_file).expect("create");
            file.write_all(&payload).expect("write");
            file.sync_all().expect("fsync");
        })
    });
    let mut offset = 0usize;
    group.bench_function("apply_32_puts", |b| {
        b.iter(|| {
            offset = (offset + BATCH) % CLAIMS;
            let ops: Vec<StoreOp> = (0..BATCH)
                .map(|k| StoreOp::Put(records[(offset + k) % CLAIMS].clone()))
                .collect();
            black_box(store.apply(&ops).expect("apply"))
        })
    });
    group.finish();
}

criterion_group!(benches, durable_commit);
criterion_main!(benches);
