//! Group commit of concurrent prepares and unprepares: changes queued while
//! a commit runs share the next one, yet each keeps its own revision and
//! event, a failed batch leaves nothing behind, and what was acknowledged is
//! on disk.

use dra_plugin::cdi::CdiDir;
use dra_plugin::config::{DeviceMode, GroupBy};
use dra_plugin::devices::DeviceCatalog;
use dra_plugin::driver::{Driver, DriverOptions, StateEvent};
use dra_plugin::metrics::Metrics;
use dra_plugin::prepare::{ClaimRef, PrepareError};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use shared_state::alloc::Policy;
use shared_state::store::{
    AssignmentStore, LenientListing, MemoryStore, SledStore, StoreError, StoreOp,
};
use shared_state::topology::synthetic;
use shared_state::{ClaimAssignment, CpuSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

const NODE: &str = "node-a";
/// CPUs per NUMA group of the test topology.
const GROUP: u32 = 16;

/// A real store that records the size of every numbered batch, can hold the
/// first such commit until the test releases it, and fails every numbered
/// commit from the `fail_from`-th on (counting from 0).
struct GatedStore {
    inner: Arc<dyn AssignmentStore>,
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

impl GatedStore {
    fn new(inner: Arc<dyn AssignmentStore>, hold_first: bool) -> Arc<GatedStore> {
        Arc::new(GatedStore {
            inner,
            hold_first: AtomicBool::new(hold_first),
            fail_from: AtomicUsize::new(usize::MAX),
            gate: Mutex::new(Gate::default()),
            changed: Condvar::new(),
        })
    }

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

impl AssignmentStore for GatedStore {
    fn get(&self, uid: &str) -> Result<Option<ClaimAssignment>, StoreError> {
        self.inner.get(uid)
    }
    fn list_lenient(&self) -> Result<LenientListing, StoreError> {
        self.inner.list_lenient()
    }
    fn revision(&self) -> Result<u64, StoreError> {
        self.inner.revision()
    }
    fn apply(&self, ops: &[StoreOp]) -> Result<u64, StoreError> {
        self.inner.apply(ops)
    }
    fn apply_numbered(&self, ops: &[StoreOp]) -> Result<Vec<Option<u64>>, StoreError> {
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
            return Err(StoreError::DataFile {
                path: "/var/lib/dra-cpu/store/db".into(),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        self.inner.apply_numbered(ops)
    }
}

fn driver(store: Arc<dyn AssignmentStore>, cdi: CdiDir) -> Arc<Driver> {
    let topo = synthetic::build(&synthetic::Shape {
        sockets: 2,
        numa_per_socket: 1,
        l3_per_numa: 1,
        cores_per_l3: 8,
        threads_per_core: 2,
        sibling_numbering: synthetic::SiblingNumbering::Split,
    });
    let catalog = DeviceCatalog::new(
        &topo,
        &CpuSet::new(),
        DeviceMode::Grouped,
        GroupBy::Numanode,
    )
    .expect("catalog");
    let options = DriverOptions {
        driver_name: "dra.cpu".into(),
        node_name: NODE.into(),
        reserved: CpuSet::new(),
        policy: Policy::Packed,
        mixed_allocation_mode: false,
        // The bursts claim every CPU of the node; the shared pool's floor
        // is another test's subject.
        min_shared_cpus: 0,
    };
    Arc::new(
        Driver::open(
            options,
            catalog,
            &topo,
            store,
            cdi,
            Arc::new(Metrics::new()),
        )
        .expect("driver"),
    )
}

fn uid(n: usize) -> String {
    format!("{n:08x}-0000-4000-8000-000000000000")
}

/// Claim `n` for `cpus` CPUs of NUMA group `group`.
fn claim(n: usize, group: usize, cpus: u32) -> (ClaimRef, ResourceClaim) {
    let reference = ClaimRef {
        namespace: "default".into(),
        name: format!("c{n}"),
        uid: uid(n),
    };
    let object = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(reference.name.clone()),
            namespace: Some("default".into()),
            uid: Some(reference.uid.clone()),
            ..Default::default()
        },
        spec: None,
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "cpus".into(),
                        driver: "dra.cpu".into(),
                        pool: NODE.into(),
                        device: format!("cpudevnuma{group:03}"),
                        consumed_capacity: Some(
                            [("dra.cpu/cpu".to_string(), Quantity(cpus.to_string()))].into(),
                        ),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: "pod".into(),
                uid: "feedbeef-0000-4000-8000-000000000000".into(),
            }]),
            ..Default::default()
        }),
    };
    (reference, object)
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
    }
}

#[test]
fn prepares_queued_behind_a_commit_share_the_next_one_and_each_get_a_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = GatedStore::new(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    let driver = driver(store.clone(), cdi.clone());
    let (_, mut events) = driver.subscribe();
    let claims: Vec<_> = (0..32).map(|n| claim(n, n % 2, 1)).collect();
    let (first, rest) = claims.split_first().expect("claims");
    let d = &driver;
    let answers = burst(
        &driver,
        &store,
        move || d.prepare(&first.0, &first.1),
        rest.iter()
            .map(|(r, o)| Box::new(move || d.prepare(r, o)) as Box<dyn FnOnce() -> _ + Send>)
            .collect(),
    );
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
    let store = GatedStore::new(Arc::new(MemoryStore::new()), true);
    let cdi = CdiDir::new(dir.path().join("cdi"));
    // The disk fails from the second commit on.
    store.fail_from.store(1, Ordering::SeqCst);
    let driver = driver(store.clone(), cdi.clone());
    let (_, mut events) = driver.subscribe();
    let (leader, leader_object) = claim(100, 0, 1);
    // Together these want every other CPU of group 0.
    let queued: Vec<_> = (0..(GROUP as usize - 1)).map(|n| claim(n, 0, 1)).collect();
    let d = &driver;
    let answers = burst(
        &driver,
        &store,
        move || d.prepare(&leader, &leader_object),
        queued
            .iter()
            .map(|(r, o)| Box::new(move || d.prepare(r, o)) as Box<dyn FnOnce() -> _ + Send>)
            .collect(),
    );
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
    let store = GatedStore::new(Arc::new(MemoryStore::new()), false);
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
    let store = GatedStore::new(sled, true);
    let claims: Vec<_> = (0..24).map(|n| claim(n, n % 2, 1)).collect();
    let acknowledged: Vec<ClaimAssignment> = {
        let driver = driver(store.clone(), cdi.clone());
        let (first, rest) = claims.split_first().expect("claims");
        let d = &driver;
        let answers = burst(
            &driver,
            &store,
            move || d.prepare(&first.0, &first.1),
            rest.iter()
                .map(|(r, o)| Box::new(move || d.prepare(r, o)) as Box<dyn FnOnce() -> _ + Send>)
                .collect(),
        );
        answers
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
    let store = GatedStore::new(Arc::new(MemoryStore::new()), true);
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
