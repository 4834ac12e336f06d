//! Group commit of concurrent prepares and unprepares: changes queued while
//! a commit runs share the next one, yet each keeps its own revision and
//! event, a failed batch leaves nothing behind, and what was acknowledged is
//! on disk.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::checked_store::{disk_error, CheckedStore, CommitCheck};
use dra_plugin::cdi::CdiDir;
use dra_plugin::driver::{Driver, Prepared, StateEvent};
use dra_plugin::prepare::{ClaimRef, PrepareError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use shared_state::store::memory::MemoryStore;
use shared_state::store::sled_store::SledStore;
use shared_state::store::{AssignmentStore, StoreError, StoreOp};
use shared_state::{ClaimAssignment, CpuSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

const NODE: &str = "node-a";
/// CPUs per NUMA group of the test topology.
const GROUP: u32 = 16;

/// Records the size of every numbered batch, can hold the first such commit
/// until the test releases it, and fails every numbered commit from the
/// `fail_from`-th on (counting from 0).
struct Gated {
    hold_first: AtomicBool,
    fail_from: AtomicUsize,
    gate: Mutex<Gate>,
    changed: Condvar,
}

#[derive(Default)]
struct Gate {
    batches: Vec<usize>,
    held: bool,
    released: bool,
}

/// A real store behind [`Gated`].
type GatedStore = CheckedStore<Gated>;

fn gated_store(inner: Arc<dyn AssignmentStore>, hold_first: bool) -> Arc<GatedStore> {
    CheckedStore::new(
        inner,
        Gated {
            hold_first: AtomicBool::new(hold_first),
            fail_from: AtomicUsize::new(usize::MAX),
            gate: Mutex::new(Gate::default()),
            changed: Condvar::new(),
        },
    )
}

impl Gated {
    /// Wait until the first commit is inside the store, held.
    fn wait_held(&self) {
        let mut gate = self.gate.lock().unwrap();
        while !gate.held {
            gate = self.changed.wait(gate).unwrap();
        }
    }

    fn release(&self) {
        self.gate.lock().unwrap().released = true;
        self.changed.notify_all();
    }

    fn batches(&self) -> Vec<usize> {
        self.gate.lock().unwrap().batches.clone()
    }
}

impl CommitCheck for Gated {
    fn apply_numbered(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        let index = {
            let mut gate = self.gate.lock().unwrap();
            gate.batches.push(ops.len());
            if self.hold_first.swap(false, Ordering::SeqCst) {
                gate.held = true;
                self.changed.notify_all();
                while !gate.released {
                    gate = self.changed.wait(gate).unwrap();
                }
            }
            gate.batches.len() - 1
        };
        if index >= self.fail_from.load(Ordering::SeqCst) {
            return Err(disk_error(libc::EIO));
        }
        Ok(())
    }
}

fn driver(store: Arc<dyn AssignmentStore>, cdi: CdiDir) -> Arc<Driver> {
    // The bursts claim every CPU of the node; the shared pool's floor is
    // another test's subject.
    common::in_process_driver(store, cdi, NODE, 0)
}

/// Claim `n` for `cpus` CPUs of NUMA group `group`.
fn claim(n: usize, group: usize, cpus: u32) -> (ClaimRef, ResourceClaim) {
    common::numbered_claim(n, NODE, &format!("cpudevnuma{group:03}"), cpus)
}

/// Run `first` alone into a held commit, then `rest` concurrently so that
/// they all queue behind it, then release. Returns every answer in order.
fn burst<T: Send>(
    driver: &Arc<Driver>,
    store: &GatedStore,
    first: impl FnOnce() -> T + Send,
    rest: Vec<Box<dyn FnOnce() -> T + Send + '_>>,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let leader = scope.spawn(first);
        store.wait_held();
        let count = rest.len();
        let followers: Vec<_> = rest.into_iter().map(|job| scope.spawn(job)).collect();
        // Waiting for a state, not for a time: every follower has queued.
        while driver.queued() < count {
            std::thread::yield_now();
        }
        store.release();
        let mut answers = vec![leader.join().expect("leader")];
        answers.extend(followers.into_iter().map(|f| f.join().expect("follower")));
        answers
    })
}

/// [`burst`] of prepares: `first`, then every claim of `rest` queued
/// behind it.
fn burst_prepares(
    driver: &Arc<Driver>,
    store: &GatedStore,
    first: &(ClaimRef, ResourceClaim),
    rest: &[(ClaimRef, ResourceClaim)],
) -> Vec<Result<Prepared, PrepareError>> {
    burst(
        driver,
        store,
        || driver.prepare(&first.0, &first.1),
        rest.iter()
            .map(|(r, o)| Box::new(move || driver.prepare(r, o)) as Box<dyn FnOnce() -> _ + Send>)
            .collect(),
    )
}

fn drain(receiver: &mut tokio::sync::broadcast::Receiver<StateEvent>) -> Vec<StateEvent> {
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    events
}

fn revision_of(event: &StateEvent) -> u64 {
    match event {
        StateEvent::Prepared { revision, .. } | StateEvent::Unprepared { revision, .. } => {
            *revision
        }
        StateEvent::Node(snapshot) => snapshot.revision,
    }
}

#[test]
fn prepares_queued_behind_a_commit_share_the_next_one_and_each_get_a_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gated_store(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let driver = driver(store.clone(), cdi.clone());
    let (_, mut events) = driver.subscribe();
    let claims: Vec<_> = (0..32).map(|n| claim(n, n % 2, 1)).collect();
    let (first, rest) = claims.split_first().expect("claims");
    let answers = burst_prepares(&driver, &store, first, rest);
    assert_eq!(store.batches(), vec![1, 31], "one commit for the 31 queued");
    let mut union = CpuSet::new();
    for (answer, (reference, _)) in answers.iter().zip(&claims) {
        let prepared = answer.as_ref().expect("prepared");
        assert_eq!(prepared.assignment.cpus.len(), 1);
        assert!(
            union.intersection(&prepared.assignment.cpus).is_empty(),
            "{} shares a CPU: {}",
            reference.uid,
            prepared.assignment.cpus
        );
        union = union.union(&prepared.assignment.cpus);
        assert_eq!(
            cdi.read_cpus(&reference.uid),
            Some(prepared.assignment.cpus.clone())
        );
    }
    let revisions: Vec<u64> = drain(&mut events).iter().map(revision_of).collect();
    assert_eq!(revisions, (1..=32).collect::<Vec<u64>>());
    assert_eq!(driver.revision(), 32);
    assert_eq!(store.revision().expect("revision"), 32);
    assert_eq!(driver.snapshot().claims.len(), 32);
}

#[test]
fn a_failed_batch_fails_each_change_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gated_store(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    // The disk fails from the second commit on.
    store.fail_from.store(1, Ordering::SeqCst);
    let driver = driver(store.clone(), cdi.clone());
    let (_, mut events) = driver.subscribe();
    let leader = claim(100, 0, 1);
    // Together these want every other CPU of group 0.
    let queued: Vec<_> = (0..(GROUP as usize - 1)).map(|n| claim(n, 0, 1)).collect();
    let answers = burst_prepares(&driver, &store, &leader, &queued);
    assert_eq!(store.batches(), vec![1, GROUP as usize - 1]);
    let (first, failed) = answers.split_first().expect("answers");
    assert!(first.is_ok(), "{first:?}");
    for (answer, (reference, _)) in failed.iter().zip(&queued) {
        match answer {
            Err(PrepareError::Store { claim, reason }) => {
                assert!(claim.contains(&reference.uid), "{claim}");
                assert!(reason.contains("/var/lib/dra-cpu/store/db"), "{reason}");
            }
            other => panic!("{}: expected a store error, got {other:?}", reference.uid),
        }
        assert!(driver.prepared(&reference.uid).is_none());
        assert_eq!(store.get(&reference.uid).expect("get"), None);
        assert_eq!(cdi.read_cpus(&reference.uid), None);
    }
    assert_eq!(cdi.list().expect("list").len(), 1, "only the leader's spec");
    assert_eq!(drain(&mut events).len(), 1, "only the leader's event");
    assert_eq!(driver.revision(), 1);
    // The reservations of the failed batch are released: once the disk
    // recovers, the rest of the group fits in one claim.
    store.fail_from.store(usize::MAX, Ordering::SeqCst);
    let (rest, rest_object) = claim(200, 0, GROUP - 1);
    let prepared = driver.prepare(&rest, &rest_object).expect("rest of group");
    assert_eq!(prepared.assignment.cpus.len(), GROUP as usize - 1);
    assert_eq!(driver.revision(), 2);
}

#[test]
fn a_batch_of_prepares_and_unprepares_gives_each_event_the_next_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gated_store(Arc::new(MemoryStore::new()), false);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let driver = driver(store.clone(), cdi.clone());
    let old: Vec<_> = (0..8).map(|n| claim(n, 1, 2)).collect();
    for (reference, object) in &old {
        driver.prepare(reference, object).expect("old claim");
    }
    assert_eq!(driver.revision(), 8);
    let (_, mut events) = driver.subscribe();
    store.hold_first.store(true, Ordering::SeqCst);
    let (leader, leader_object) = claim(50, 0, 1);
    let new: Vec<_> = (10..18).map(|n| claim(n, 0, 1)).collect();
    let d = &driver;
    let mut jobs: Vec<Box<dyn FnOnce() -> Result<(), PrepareError> + Send>> = Vec::new();
    for (reference, _) in &old {
        jobs.push(Box::new(move || d.unprepare(reference)));
    }
    for (reference, object) in &new {
        jobs.push(Box::new(move || d.prepare(reference, object).map(|_| ())));
    }
    let answers = burst(
        &driver,
        &store,
        move || d.prepare(&leader, &leader_object).map(|_| ()),
        jobs,
    );
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        store.batches().len(),
        8 + 2,
        "8 old prepares, then two batches"
    );
    let events = drain(&mut events);
    let revisions: Vec<u64> = events.iter().map(revision_of).collect();
    assert_eq!(revisions, (9..=9 + 16).collect::<Vec<u64>>());
    let unprepared = events
        .iter()
        .filter(|e| matches!(e, StateEvent::Unprepared { .. }))
        .count();
    assert_eq!(unprepared, 8);
    assert_eq!(driver.revision(), 25);
    assert_eq!(store.revision().expect("revision"), 25);
    for (reference, _) in &old {
        assert!(driver.prepared(&reference.uid).is_none());
        assert_eq!(cdi.read_cpus(&reference.uid), None);
    }
    assert_eq!(driver.snapshot().claims.len(), 9);
}

#[test]
fn acknowledged_concurrent_prepares_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join("store");
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let sled: Arc<dyn AssignmentStore> = Arc::new(SledStore::open(&store_dir).expect("open"));
    let store = gated_store(sled, true);
    let claims: Vec<_> = (0..24).map(|n| claim(n, n % 2, 1)).collect();
    let acknowledged: Vec<ClaimAssignment> = {
        let driver = driver(store.clone(), cdi.clone());
        let (first, rest) = claims.split_first().expect("claims");
        burst_prepares(&driver, &store, first, rest)
            .into_iter()
            .map(|a| a.expect("prepared").assignment)
            .collect()
    };
    assert_eq!(store.batches(), vec![1, 23]);
    drop(store);
    let reopened: Arc<dyn AssignmentStore> = Arc::new(SledStore::open(&store_dir).expect("reopen"));
    assert_eq!(reopened.revision().expect("revision"), 24);
    let driver = driver(reopened, cdi.clone());
    assert_eq!(driver.revision(), 24);
    for assignment in &acknowledged {
        assert_eq!(
            driver.prepared(&assignment.claim_uid).as_ref(),
            Some(assignment)
        );
        assert_eq!(
            cdi.read_cpus(&assignment.claim_uid),
            Some(assignment.cpus.clone())
        );
    }
}

/// A first prepare skips the store lookup on a blocking thread only when the
/// claim is unknown or being changed: a prepared claim is answered from the
/// store, and one whose commit is running takes the full path, which waits.
#[test]
fn only_claims_that_are_not_prepared_need_their_api_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gated_store(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let driver = driver(store.clone(), cdi);
    let (reference, object) = claim(0, 0, 2);
    assert!(driver.needs_claim_object(&reference.uid), "unknown claim");
    std::thread::scope(|scope| {
        let preparing = scope.spawn(|| driver.prepare(&reference, &object));
        store.wait_held();
        assert!(
            driver.needs_claim_object(&reference.uid),
            "claim whose commit is running"
        );
        assert!(driver.already_prepared(&reference).is_none());
        store.release();
        preparing.join().expect("prepare").expect("prepared");
    });
    assert!(!driver.needs_claim_object(&reference.uid), "prepared claim");
    assert!(matches!(driver.already_prepared(&reference), Some(Ok(_))));
    driver.unprepare(&reference).expect("unprepared");
    assert!(
        driver.needs_claim_object(&reference.uid),
        "unprepared claim"
    );
}

/// Spin until `done`, or fail the test after a minute: a change left in the
/// queue with nobody to commit it never gets there.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A runtime with a single blocking thread: a prepare that parked a thread
/// while its change waits could not queue behind a held commit.
fn one_blocking_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn async_prepares_queue_behind_a_held_commit_without_a_thread_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gated_store(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let driver = driver(store.clone(), cdi.clone());
    let claims: Vec<_> = (0..32).map(|n| claim(n, n % 2, 1)).collect();
    let runtime = one_blocking_thread();
    let (first, rest) = claims.split_first().expect("claims");
    let leader = runtime.spawn(
        driver
            .clone()
            .prepare_async(first.0.clone(), first.1.clone()),
    );
    // The leader's commit holds the only blocking thread.
    store.wait_held();
    let followers: Vec<_> = rest
        .iter()
        .map(|(r, o)| runtime.spawn(driver.clone().prepare_async(r.clone(), o.clone())))
        .collect();
    wait_until("31 prepares queued", || driver.queued() == rest.len());
    store.release();
    let answers: Vec<_> = runtime.block_on(async {
        let mut answers = vec![leader.await.expect("leader")];
        for follower in followers {
            answers.push(follower.await.expect("follower"));
        }
        answers
    });
    assert_eq!(store.batches(), vec![1, 31], "one commit for the 31 queued");
    let mut union = CpuSet::new();
    for (answer, (reference, _)) in answers.iter().zip(&claims) {
        let prepared = answer.as_ref().expect("prepared");
        assert!(union.intersection(&prepared.assignment.cpus).is_empty());
        union = union.union(&prepared.assignment.cpus);
        assert_eq!(
            cdi.read_cpus(&reference.uid),
            Some(prepared.assignment.cpus.clone())
        );
    }
    assert_eq!(driver.revision(), 32);
    // Unprepared the same way, all of them answered and gone.
    let unprepares: Vec<_> = claims
        .iter()
        .map(|(r, _)| runtime.spawn(driver.clone().unprepare_async(r.clone())))
        .collect();
    runtime.block_on(async {
        for unprepare in unprepares {
            unprepare.await.expect("task").expect("unprepared");
        }
    });
    assert!(driver.snapshot().claims.is_empty());
    assert!(claims.iter().all(|(r, _)| cdi.read_cpus(&r.uid).is_none()));
}

/// A blocking caller that commits goes on committing what queued meanwhile:
/// async waiters have no thread that would commit their changes.
#[test]
fn a_blocking_committer_also_commits_async_changes_queued_behind_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gated_store(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let driver = driver(store.clone(), cdi.clone());
    let claims: Vec<_> = (0..8).map(|n| claim(n, n % 2, 1)).collect();
    let runtime = one_blocking_thread();
    let (first, rest) = claims.split_first().expect("claims");
    std::thread::scope(|scope| {
        let leader = scope.spawn(|| driver.prepare(&first.0, &first.1));
        store.wait_held();
        let followers: Vec<_> = rest
            .iter()
            .map(|(r, o)| runtime.spawn(driver.clone().prepare_async(r.clone(), o.clone())))
            .collect();
        wait_until("7 prepares queued", || driver.queued() == rest.len());
        store.release();
        leader.join().expect("leader").expect("leader prepared");
        let answered = runtime.block_on(async {
            let answers = async {
                for follower in followers {
                    follower.await.expect("task").expect("prepared");
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(60), answers).await
        });
        answered.expect("the queued prepares were never committed");
    });
    assert_eq!(store.batches(), vec![1, 7]);
    assert_eq!(driver.snapshot().claims.len(), 8);
}
