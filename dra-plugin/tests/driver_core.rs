//! The driver core without sockets: a store that fails, a CDI directory
//! that cannot be written, and a subscriber too slow to keep up.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::checked_store::{disk_error, CheckedStore, CommitCheck};
use dra_cpu_daemon::http::Endpoints;
use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::coordination::v1::coordination_server::Coordination;
use dra_plugin::cdi::CdiDir;
use dra_plugin::coordination_server::CoordinationService;
use dra_plugin::driver::{Driver, EVENT_BUFFER};
use dra_plugin::health::Health;
use dra_plugin::http::DraEndpoints;
use dra_plugin::prepare::ClaimRef;
use futures::StreamExt;
use http::StatusCode;
use k8s_openapi::api::resource::v1::ResourceClaim;
use shared_state::store::memory::MemoryStore;
use shared_state::store::{AssignmentStore, StoreError, StoreOp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const NODE: &str = "node-a";

/// Commits fail while `failing` is set, as a full disk or an I/O error
/// would make sled's fail.
#[derive(Default)]
struct Failing {
    failing: AtomicBool,
}

impl Failing {
    fn check(&self) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(disk_error(libc::ENOSPC));
        }
        Ok(())
    }
}

impl CommitCheck for Failing {
    fn apply(&self, _ops: &[StoreOp]) -> Result<(), StoreError> {
        self.check()
    }
    fn apply_numbered(&self, _ops: &[StoreOp]) -> Result<(), StoreError> {
        self.check()
    }
}

/// A real in-memory store whose commits fail while `failing` is set.
fn faulty_store() -> Arc<CheckedStore<Failing>> {
    CheckedStore::new(Arc::new(MemoryStore::new()), Failing::default())
}

fn driver(store: Arc<dyn AssignmentStore>, cdi: CdiDir) -> Arc<Driver> {
    common::in_process_driver(
        store,
        cdi,
        NODE,
        dra_plugin::config::DEFAULT_MIN_SHARED_CPUS,
    )
}

fn claim(n: usize, cpus: u32) -> (ClaimRef, ResourceClaim) {
    common::numbered_claim(n, NODE, "cpudevnuma000", cpus)
}

#[test]
fn a_store_failure_is_a_claim_error_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = faulty_store();
    let cdi = CdiDir::new(dir.path());
    let driver = driver(store.clone(), cdi.clone());
    let (reference, object) = claim(1, 2);
    store.failing.store(true, Ordering::SeqCst);
    let error = driver
        .prepare(&reference, &object)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("store failure"), "{error}");
    assert!(error.contains("/var/lib/dra-cpu/store/db"), "{error}");
    assert!(driver.prepared(&reference.uid).is_none());
    assert!(cdi.list().expect("list").is_empty());
    assert_eq!(driver.metrics().errors("prepare", "store"), 1);
    // The disk recovers: kubelet's retry succeeds.
    store.failing.store(false, Ordering::SeqCst);
    let prepared = driver.prepare(&reference, &object).expect("retry");
    assert_eq!(prepared.assignment.cpus.len(), 2);
    assert_eq!(
        cdi.read_cpus(&reference.uid),
        Some(prepared.assignment.cpus)
    );
}

#[test]
fn a_store_write_failure_makes_the_process_unhealthy_until_a_write_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = faulty_store();
    let driver = driver(store.clone(), CdiDir::new(dir.path()));
    let endpoints = DraEndpoints {
        metrics: driver.metrics().clone(),
        health: Arc::new(Health {
            serving: AtomicBool::new(true),
            store: driver.store_fault().clone(),
            ..Health::default()
        }),
    };
    let health = &endpoints.health;
    let get = |path: &str| match path {
        "/healthz" => endpoints.health(),
        _ => endpoints.readiness(),
    };
    assert_eq!(get("/healthz").0, StatusCode::OK);
    assert_eq!(get("/readyz").0, StatusCode::OK);

    let (first, first_object) = claim(1, 2);
    driver.prepare(&first, &first_object).expect("prepare");
    // The disk fills: an unprepare cannot commit.
    store.failing.store(true, Ordering::SeqCst);
    assert!(driver.unprepare(&first).is_err());
    for path in ["/healthz", "/readyz"] {
        let (status, _, body) = get(path);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert!(body.contains("/var/lib/dra-cpu/store/db"), "{path}: {body}");
        assert!(body.contains("No space left"), "{path}: {body}");
    }
    assert!(!health.ready());
    // Reads do not clear it; only a write that succeeds does.
    assert!(driver.prepared(&first.uid).is_some());
    assert_eq!(get("/healthz").0, StatusCode::SERVICE_UNAVAILABLE);

    store.failing.store(false, Ordering::SeqCst);
    let (second, second_object) = claim(2, 2);
    driver.prepare(&second, &second_object).expect("prepare");
    assert_eq!(driver.store_fault().error(), None);
    assert_eq!(
        get("/healthz"),
        (StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into())
    );
    assert_eq!(get("/readyz").0, StatusCode::OK);
}

#[test]
fn a_cdi_failure_undoes_the_store_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_dir = dir.path().join("cdi");
    std::fs::write(&not_a_dir, b"a file where the CDI directory should be").expect("file");
    let store = Arc::new(MemoryStore::new());
    let driver = driver(store.clone(), CdiDir::new(&not_a_dir));
    let (reference, object) = claim(1, 4);
    let error = driver
        .prepare(&reference, &object)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("writing its CDI spec failed"), "{error}");
    assert_eq!(store.get(&reference.uid).expect("get"), None);
    assert!(driver.prepared(&reference.uid).is_none());
    // The CPUs are free again: a claim for the whole group fits.
    std::fs::remove_file(&not_a_dir).expect("rm");
    let (whole, object) = claim(2, 16);
    assert_eq!(
        driver
            .prepare(&whole, &object)
            .expect("whole group")
            .assignment
            .cpus
            .len(),
        16
    );
}

#[tokio::test]
async fn a_slow_subscriber_never_blocks_a_prepare_and_gets_a_fresh_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(Arc::new(MemoryStore::new()), CdiDir::new(dir.path()));
    let service = CoordinationService::new(
        driver.clone(),
        Duration::from_secs(3600),
        tokio_util::sync::CancellationToken::new(),
    );
    let mut stream = service
        .watch(tonic::Request::new(coord::WatchRequest {
            from_revision: 0,
            subscriber: "slow".into(),
        }))
        .await
        .expect("watch")
        .into_inner();
    // The subscriber reads nothing while more changes than the buffer holds
    // are committed; every one of them completes.
    let (reference, object) = claim(1, 1);
    let rounds = EVENT_BUFFER; // 2 events per round
    for _ in 0..rounds {
        driver.prepare(&reference, &object).expect("prepare");
        driver.unprepare(&reference).expect("unprepare");
    }
    driver.prepare(&reference, &object).expect("last prepare");
    let final_revision = driver.revision();
    assert_eq!(final_revision, 2 * rounds as u64 + 1);

    let first = stream
        .next()
        .await
        .and_then(|e| e.ok())
        .and_then(|e| e.event);
    let Some(coord::watch_event::Event::Snapshot(initial)) = first else {
        panic!("first event is not a snapshot: {first:?}");
    };
    assert_eq!(initial.revision, 0);
    let second = stream
        .next()
        .await
        .and_then(|e| e.ok())
        .and_then(|e| e.event);
    let Some(coord::watch_event::Event::Snapshot(fresh)) = second else {
        panic!("a lagging subscriber must get a fresh snapshot, got {second:?}");
    };
    assert_eq!(fresh.revision, final_revision);
    assert_eq!(fresh.claims.len(), 1);
    assert_eq!(fresh.claims[0].uid, reference.uid);
}
