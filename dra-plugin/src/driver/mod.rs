//! The state of prepared claims on this node and the two operations that
//! change it, prepare and unprepare.
//!
//! Concurrent changes are group-committed. A prepare picks its CPUs under
//! the state mutex against every committed claim and every claim still being
//! committed, so two prepares never pick the same CPU; it then queues its
//! store op and waits (an async prepare on a notification, without a thread
//! of its own). Whoever queues a change while no commit runs becomes the
//! committer, on a blocking thread: it takes the whole queue and commits it
//! in one store transaction and one fsync, each op with its own revision;
//! then writes the CDI specs (each fsynced); then, under the mutex, applies
//! the changes and tells subscribers in revision order; then wakes the
//! waiters, and goes on with whatever queued meanwhile. Nobody is answered
//! before their change is on disk, and a batch that fails fails each of its
//! changes and leaves nothing behind. The store is the source of truth; the
//! in-memory map mirrors it so that a decision does not read the disk.

use crate::cdi::CdiDir;
use crate::device_metadata::DeviceMetadata;
use crate::devices::DeviceCatalog;
use crate::metrics::upstream::AllocationState;
use crate::metrics::Metrics;
use crate::prepare::shared_pool::check_shared_pool_floor;
use crate::prepare::validation::parse_claim;
use crate::prepare::{
    opaque_cpusets, requested_tuning, resolve_cpus_configured, ClaimRef, HeldCpus, PrepareError,
};
use crate::tuning::{NodeTuner, Pass as TuningPass, TuningError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use shared_state::alloc::{Allocator, Policy};
use shared_state::cdi_spec::device_id;
use shared_state::store::{AssignmentStore, StoreError};
use shared_state::topology::discover::read_online_cpus;
use shared_state::topology::Topology;
use shared_state::tuning::plan::TunedClaim;
use shared_state::tuning::support::NodeSupport;
use shared_state::{ClaimAssignment, CpuSet, NodeSnapshot};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

mod claim_files;
mod commit;
pub mod crash_points;
mod group_commit;
pub mod reconcile;

use commit::Settled;
use group_commit::{CommitQueue, Enqueued, GroupCommit, Queued};

/// Events a subscriber lags behind by before it is sent a fresh snapshot
/// instead of the deltas it missed.
pub const EVENT_BUFFER: usize = 1024;

/// A committed change, in store revision order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateEvent {
    Prepared {
        revision: u64,
        assignment: ClaimAssignment,
    },
    Unprepared {
        revision: u64,
        claim_uid: String,
    },
    /// The node changed under the claims (a CPU went offline or came back
    /// online): the whole state, its `allocatable` without the offline
    /// CPUs, at the current revision. Boxed: it carries every claim.
    Node(Box<NodeSnapshot>),
}

/// One reading of the node's offline CPUs, numbered in the order the
/// readings began.
#[derive(Debug)]
struct OfflineReading {
    number: u64,
    offline: CpuSet,
}

/// What the driver needs to know about its node and its options.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    pub driver_name: String,
    pub node_name: String,
    pub reserved: CpuSet,
    pub policy: Policy,
    pub mixed_allocation_mode: bool,
    /// A prepare that would leave the shared pool fewer CPUs is refused.
    pub min_shared_cpus: u32,
}

#[derive(Debug)]
struct State {
    claims: BTreeMap<String, ClaimAssignment>,
    revision: u64,
    /// Claims with a change queued or being committed, with the CPUs a
    /// queued prepare holds (empty for an unprepare, whose CPUs are still in
    /// `claims`). A second change of such a claim waits for the first.
    in_flight: BTreeMap<String, CpuSet>,
    /// Changes waiting for or in the group commit, and their answers.
    commits: CommitQueue<Pending, Result<(), PrepareError>>,
    /// CPUs of the node that were online at start-up and are offline now,
    /// as last read (by a prepare or [`Driver::follow_online_cpus`]): left
    /// out of the shared pool the snapshots describe.
    offline: CpuSet,
    /// The number of the reading `offline` comes from: a reading begun
    /// before it never replaces it.
    offline_reading: u64,
}

/// A change waiting for the group commit.
#[derive(Debug)]
struct Pending {
    claim: ClaimRef,
    change: Change,
}

#[derive(Debug)]
enum Change {
    /// Boxed: an assignment is large beside an unprepare.
    Prepare(Box<ClaimAssignment>),
    Unprepare,
    /// A prepared claim's record with more consumer pods: only the store
    /// changes (the CPUs, the tuning and the CDI spec stay).
    Reserve(Box<ClaimAssignment>),
}

/// Why the driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("reading the assignment store: {0}")]
    Store(#[from] StoreError),
}

/// The last failed store write, until a later write succeeds. A store that
/// has failed a write (sled after a full disk) may keep failing even once
/// space returns; `/healthz` reports this so that the liveness probe
/// restarts the process, which reopens the store.
#[derive(Debug, Default)]
pub struct StoreFault {
    error: Mutex<Option<String>>,
}

impl StoreFault {
    /// The error of the last store write, if no write has succeeded since.
    pub fn error(&self) -> Option<String> {
        self.slot().clone()
    }

    /// Note the outcome of one store write.
    pub fn record<T>(&self, result: &Result<T, StoreError>) {
        *self.slot() = result.as_ref().err().map(ToString::to_string);
    }

    fn slot(&self) -> MutexGuard<'_, Option<String>> {
        // A plain value: a poisoned lock still holds a valid one.
        shared_state::sync::lock(&self.error)
    }
}

/// A prepared claim, as answered to kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub assignment: ClaimAssignment,
    /// `dra.k8s.io/cpu=claim-<uid>`.
    pub cdi_device_id: String,
}

pub struct Driver {
    options: DriverOptions,
    catalog: DeviceCatalog,
    allocator: Allocator,
    store: Arc<dyn AssignmentStore>,
    cdi: CdiDir,
    /// KEP-5304 device metadata files, written with each CDI spec; `None`
    /// when turned off.
    metadata: Option<DeviceMetadata>,
    /// Threads writing one batch's claim files (see
    /// [`claim_files::claim_file_workers`]).
    claim_file_workers: usize,
    state: GroupCommit<State>,
    events: broadcast::Sender<StateEvent>,
    metrics: Arc<Metrics>,
    store_fault: Arc<StoreFault>,
    /// Sets the node's side of claims' tuning; `None` in tools and tests
    /// that leave the kernel alone, where no tuning is honoured.
    tuner: Option<Arc<NodeTuner>>,
    /// Where the online CPUs are read at every prepare (`with_online_cpus`).
    online_cpus_root: Option<PathBuf>,
    /// Readings of the online list begun so far, numbering each.
    online_readings: AtomicU64,
    tuning_support: NodeSupport,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("options", &self.options)
            .field("cdi", &self.cdi)
            .finish()
    }
}

fn tuned_claim(assignment: &ClaimAssignment) -> TunedClaim {
    TunedClaim {
        claim_uid: assignment.claim_uid.clone(),
        cpus: assignment.cpus.clone(),
        tuning: assignment.tuning.clone(),
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Driver {
    /// Load the prepared claims from `store`.
    pub fn open(
        options: DriverOptions,
        catalog: DeviceCatalog,
        topology: &Topology,
        store: Arc<dyn AssignmentStore>,
        cdi: CdiDir,
        metrics: Arc<Metrics>,
    ) -> Result<Driver, DriverError> {
        let claims: BTreeMap<String, ClaimAssignment> = store
            .list()?
            .into_iter()
            .map(|a| (a.claim_uid.clone(), a))
            .collect();
        let revision = store.revision()?;
        for claim in claims.values() {
            if !claim.cpus.is_subset(catalog.allocatable()) {
                tracing::warn!(
                    claim_uid = %claim.claim_uid, cpus = %claim.cpus,
                    allocatable = %catalog.allocatable(),
                    "a prepared claim holds CPUs that are no longer allocatable on this node"
                );
            }
        }
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let claim_file_workers = claim_files::claim_file_workers(&[cdi.path()]);
        let driver = Driver {
            options,
            catalog,
            allocator: Allocator::new(topology),
            store,
            cdi,
            metadata: None,
            claim_file_workers,
            state: GroupCommit::new(State {
                claims,
                revision,
                in_flight: BTreeMap::new(),
                commits: CommitQueue::default(),
                offline: CpuSet::new(),
                offline_reading: 0,
            }),
            events,
            metrics,
            store_fault: Arc::default(),
            tuner: None,
            online_cpus_root: None,
            online_readings: AtomicU64::new(0),
            tuning_support: NodeSupport::none(
                "low-latency tuning is off on this node (dra-plugin --low-latency-tuning)",
            ),
        };
        driver.update_gauges(&driver.lock());
        Ok(driver)
    }

    /// Write device metadata for every prepared claim (see
    /// [`crate::device_metadata`]).
    pub fn with_device_metadata(mut self, metadata: Option<DeviceMetadata>) -> Driver {
        let mut dirs = vec![self.cdi.path()];
        dirs.extend(metadata.as_ref().map(DeviceMetadata::host_root));
        self.claim_file_workers = claim_files::claim_file_workers(&dirs);
        self.metadata = metadata;
        self
    }

    /// Read the online CPUs under `sysfs_root` at every prepare, so a CPU
    /// taken offline since start-up is given to no claim, and whenever
    /// [`Driver::follow_online_cpus`] is called, so the shared pool leaves
    /// it too.
    pub fn with_online_cpus(mut self, sysfs_root: PathBuf) -> Driver {
        self.online_cpus_root = Some(sysfs_root);
        self
    }

    /// The CPUs online at start-up that are offline now, numbered in the
    /// order the readings began; `None` when the online list is not watched
    /// or cannot be read. An empty list is taken as unreadable: a kernel
    /// always has a CPU online, and a file caught while being rewritten must
    /// not empty the shared pool.
    fn read_offline(&self) -> Option<OfflineReading> {
        let root = self.online_cpus_root.as_ref()?;
        let number = self.online_readings.fetch_add(1, Ordering::Relaxed) + 1;
        match read_online_cpus(root) {
            Ok(online) if online.is_empty() => {
                tracing::debug!("the online CPU list is empty; keeping the last reading");
                None
            }
            Ok(online) => Some(OfflineReading {
                number,
                offline: self.catalog.node_cpus().online.difference(&online),
            }),
            Err(error) => {
                tracing::debug!(%error, "cannot read the online CPUs");
                None
            }
        }
    }

    /// Read the online CPUs (see [`Driver::with_online_cpus`]) and, when
    /// the offline ones changed since the last read, tell subscribers the
    /// whole state with the shared pool's CPUs as they are now
    /// ([`StateEvent::Node`]), so nri-plugin moves running containers off
    /// a CPU that went offline and back onto one that returned. Returns the
    /// offline CPUs when they changed. A CPU that was offline at start-up
    /// is not published and stays out until a restart. Takes the state lock
    /// (which a repeated prepare holds across a CDI spec write): call from a
    /// blocking thread.
    pub fn follow_online_cpus(&self) -> Option<CpuSet> {
        let reading = self.read_offline()?;
        let offline = reading.offline.clone();
        let mut state = self.lock();
        self.note_offline(&mut state, reading).then_some(offline)
    }

    /// Record a reading of the offline CPUs unless one begun later is
    /// recorded already; when it differs from the last, tell subscribers
    /// before any later event (the caller holds the state lock). Returns
    /// whether it changed.
    fn note_offline(&self, state: &mut State, reading: OfflineReading) -> bool {
        if reading.number <= state.offline_reading {
            return false;
        }
        state.offline_reading = reading.number;
        if state.offline == reading.offline {
            return false;
        }
        let previous = std::mem::replace(&mut state.offline, reading.offline);
        tracing::warn!(
            offline = %state.offline,
            went_offline = %state.offline.difference(&previous),
            came_online = %previous.difference(&state.offline),
            "the node's online CPUs changed: the shared pool follows, claims keep their CPUs"
        );
        self.update_gauges(state);
        let _ = self
            .events
            .send(StateEvent::Node(Box::new(self.snapshot_of(state))));
        true
    }

    /// Tune the node for claims that ask for it (see [`crate::tuning`]).
    pub fn with_tuner(mut self, tuner: Arc<NodeTuner>) -> Driver {
        self.tuning_support = tuner.support().clone();
        self.tuner = Some(tuner);
        self
    }

    /// What this node honours of claims' tuning.
    pub fn tuning_support(&self) -> &NodeSupport {
        &self.tuning_support
    }

    /// Start-up: the node tuned for exactly the stored claims, and what an
    /// earlier run tuned for claims no longer stored put back.
    pub fn reconcile_tuning(&self) -> Result<TuningPass, TuningError> {
        let Some(tuner) = &self.tuner else {
            return Ok(TuningPass::default());
        };
        let claims = self.lock().claims.values().map(tuned_claim).collect();
        tuner.reconcile(claims)
    }

    /// Tune the node for a claim being prepared.
    fn tune(&self, assignment: &ClaimAssignment) -> Result<(), TuningError> {
        match &self.tuner {
            Some(tuner) if assignment.tuning.touches_node() => tuner
                .add(tuned_claim(assignment))
                .map(|pass| {
                    tracing::info!(claim_uid = %assignment.claim_uid, knobs = ?assignment.tuning.knobs(), tuned = pass.tuned, unmovable_irqs = ?pass.unmovable_irqs, "claim's CPUs tuned");
                }),
            _ => Ok(()),
        }
    }

    /// Put back what was tuned for a claim no longer prepared. A failure is
    /// logged: the record keeps the values and the repair pass retries.
    fn untune(&self, claim_uid: &str) {
        if let Some(tuner) = &self.tuner {
            match tuner.remove(claim_uid) {
                Ok(pass) if pass.restored > 0 => {
                    tracing::info!(
                        claim_uid,
                        restored = pass.restored,
                        "claim's tuning put back"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(claim_uid, error = %e, "cannot put back the claim's tuning; retried by the repair pass");
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.state.wait(state)
    }

    /// Wait until no change of `claim_uid` is queued or being committed.
    fn lock_idle(&self, claim_uid: &str) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        while state.in_flight.contains_key(claim_uid) {
            state = self.wait(state);
        }
        state
    }

    fn update_gauges(&self, state: &State) {
        let exclusive = state
            .claims
            .values()
            .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus));
        let shared = self
            .catalog
            .allocatable()
            .difference(&exclusive)
            .difference(&state.offline);
        self.metrics
            .exclusive_cpus
            .store(exclusive.len() as u64, Ordering::Relaxed);
        self.metrics
            .shared_cpus
            .store(shared.len() as u64, Ordering::Relaxed);
        self.metrics
            .revision
            .store(state.revision, Ordering::Relaxed);
        self.metrics.upstream.set_allocation_state(AllocationState {
            allocated_cpus: exclusive.len() as u64,
            available_cpus: shared.len() as u64,
            reserved_cpus: self.options.reserved.len() as u64,
            active_claims: state.claims.len() as u64,
        });
    }

    pub fn options(&self) -> &DriverOptions {
        &self.options
    }

    pub fn catalog(&self) -> &DeviceCatalog {
        &self.catalog
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn cdi(&self) -> &CdiDir {
        &self.cdi
    }

    /// The last store write failure not yet followed by a successful write.
    pub fn store_fault(&self) -> &Arc<StoreFault> {
        &self.store_fault
    }

    /// The record of a prepared claim.
    pub fn prepared(&self, claim_uid: &str) -> Option<ClaimAssignment> {
        self.lock().claims.get(claim_uid).cloned()
    }

    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// A prepared claim's record and the store revision the state stands
    /// at, read under one lock: the record is exactly what that revision
    /// holds.
    pub fn prepared_at(&self, claim_uid: &str) -> (Option<ClaimAssignment>, u64) {
        let state = self.lock();
        (state.claims.get(claim_uid).cloned(), state.revision)
    }

    /// Changes waiting for the next group commit (not counting the one
    /// running): how much a commit is lagging behind its callers.
    pub fn queued(&self) -> usize {
        self.lock().commits.len()
    }

    /// The current state and a receiver of every change after it.
    pub fn subscribe(&self) -> (NodeSnapshot, broadcast::Receiver<StateEvent>) {
        let state = self.lock();
        let receiver = self.events.subscribe();
        (self.snapshot_of(&state), receiver)
    }

    pub fn snapshot(&self) -> NodeSnapshot {
        self.snapshot_of(&self.lock())
    }

    fn snapshot_of(&self, state: &State) -> NodeSnapshot {
        NodeSnapshot {
            revision: state.revision,
            allocatable: self.catalog.allocatable().difference(&state.offline),
            reserved: self.options.reserved.clone(),
            mixed_allocation_mode: self.options.mixed_allocation_mode,
            claims: state.claims.values().cloned().collect(),
        }
    }

    /// Whether [`Driver::already_prepared`] would answer `None` for this
    /// claim (it is not prepared, or is being changed right now). Takes the
    /// state lock only briefly and does no I/O, so a first prepare may ask
    /// this on an async worker instead of hopping to a blocking thread.
    pub fn needs_claim_object(&self, claim_uid: &str) -> bool {
        let state = self.lock();
        state.in_flight.contains_key(claim_uid) || !state.claims.contains_key(claim_uid)
    }

    /// Answer for a claim that is already prepared, making sure its CDI spec
    /// is on disk (it may have been removed behind our back).
    pub fn already_prepared(&self, claim: &ClaimRef) -> Option<Result<Prepared, PrepareError>> {
        // Held across the spec check so that a concurrent unprepare cannot
        // remove the claim between the check and a rewrite of its spec.
        let state = self.lock();
        if state.in_flight.contains_key(&claim.uid) {
            // Being unprepared (or prepared) right now: the full path waits.
            return None;
        }
        let assignment = state.claims.get(&claim.uid).cloned()?;
        let answer = self.ensure_cdi(claim, assignment);
        drop(state);
        Some(answer)
    }

    fn ensure_cdi(
        &self,
        claim: &ClaimRef,
        assignment: ClaimAssignment,
    ) -> Result<Prepared, PrepareError> {
        let failed = |reason: String| PrepareError::Cdi {
            claim: claim.to_string(),
            reason,
        };
        let (spec, files) = self
            .claim_spec(&assignment)
            .map_err(|e| failed(e.to_string()))?;
        if let (Some(metadata), Some(files)) = (&self.metadata, &files) {
            if !metadata.is_current(files) {
                metadata.write(files).map_err(|e| failed(e.to_string()))?;
            }
        }
        if self.cdi.read_spec(&claim.uid).as_ref() != Some(&spec) {
            self.cdi
                .write_spec(&claim.uid, &spec)
                .map_err(|e| failed(e.to_string()))?;
        }
        Ok(Prepared {
            cdi_device_id: device_id(&claim.uid),
            assignment,
        })
    }

    /// Prepare a claim read from the API server: pick CPUs, commit, write
    /// the CDI spec, notify. A repeat returns the recorded CPUs. On error
    /// nothing of the claim is left in the store or the CDI directory.
    /// Blocks on fsync: call from a blocking thread (or use
    /// [`Driver::prepare_async`]).
    pub fn prepare(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Prepared, PrepareError> {
        let started = Instant::now();
        let result = self.prepare_inner(claim, object);
        self.record_prepare(started, &result);
        result
    }

    /// [`Driver::prepare`] without a thread of its own while it waits: the
    /// decision runs on the calling task, the group commit on a blocking
    /// thread only when no commit is running already, and the task waits for
    /// its answer. Whatever becomes of the returned future, a change once
    /// queued is committed and settled.
    pub async fn prepare_async(
        self: Arc<Self>,
        claim: ClaimRef,
        object: ResourceClaim,
    ) -> Result<Prepared, PrepareError> {
        let started = Instant::now();
        let result = self.prepare_async_inner(&claim, &object).await;
        self.record_prepare(started, &result);
        result
    }

    fn record_prepare(&self, started: Instant, result: &Result<Prepared, PrepareError>) {
        self.metrics.prepare_latency.observe(started.elapsed());
        self.metrics.prepares.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            self.metrics.error("prepare", e.reason());
        }
    }

    fn prepare_inner(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Prepared, PrepareError> {
        // Read before the lock: concurrent prepares wait for nothing slower.
        let reading = self.read_offline();
        let mut state = self.lock_idle(&claim.uid);
        match self.decide_prepare(&mut state, claim, object, reading)? {
            Decided::Known(assignment) => {
                let answer = self.ensure_cdi(claim, assignment);
                drop(state);
                answer
            }
            Decided::New(assignment) => {
                self.submit(state, claim, Change::Prepare(Box::new(assignment.clone())))?;
                Ok(self.prepared_new(claim, assignment))
            }
        }
    }

    async fn prepare_async_inner(
        self: &Arc<Self>,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Prepared, PrepareError> {
        let mut reading = self.read_offline();
        loop {
            // Once no change of this claim is being committed.
            let decided = self
                .state
                .until(|state| {
                    if state.in_flight.contains_key(&claim.uid) {
                        return None;
                    }
                    Some(
                        self.decide_prepare(state, claim, object, reading.take())
                            .map(|decided| match decided {
                                Decided::Known(_) => None,
                                Decided::New(assignment) => {
                                    let change = Change::Prepare(Box::new(assignment.clone()));
                                    Some((self.enqueue(state, claim, change), assignment))
                                }
                            }),
                    )
                })
                .await?;
            let Some((enqueued, assignment)) = decided else {
                // Prepared by a concurrent call: answered as a retry is, off
                // the async workers (its spec may be rewritten).
                let (driver, task_claim) = (self.clone(), claim.clone());
                let known =
                    tokio::task::spawn_blocking(move || driver.already_prepared(&task_claim))
                        .await
                        .unwrap_or_else(|e| Some(Err(task_failed(claim, &e))));
                match known {
                    Some(answer) => return answer,
                    // Changed again meanwhile: decide anew.
                    None => continue,
                }
            };
            self.wait_committed(enqueued).await?;
            return Ok(self.prepared_new(claim, assignment));
        }
    }

    /// Under the state lock, with no change of the claim in flight: the
    /// claim's recorded assignment, or the CPUs picked for it now (then the
    /// claim is marked in flight with them and the caller must queue it).
    fn decide_prepare(
        &self,
        state: &mut State,
        claim: &ClaimRef,
        object: &ResourceClaim,
        reading: Option<OfflineReading>,
    ) -> Result<Decided, PrepareError> {
        if let Some(assignment) = state.claims.get(&claim.uid).cloned() {
            return Ok(Decided::Known(assignment));
        }
        // A change is told to subscribers before this claim's event, so
        // nri-plugin never learns a claim on a CPU its pool does not know
        // yet. Unreadable, or older than one recorded, the last stands.
        if let Some(reading) = reading {
            self.note_offline(state, reading);
        }
        let offline = state.offline.clone();
        let parsed = parse_claim(
            claim,
            object,
            &self.options.driver_name,
            &self.options.node_name,
        )?;
        // CPUs of claims still being committed are as taken as committed ones.
        let held = HeldCpus::others_than(
            &claim.uid,
            state
                .claims
                .iter()
                .map(|(uid, a)| (uid.as_str(), &a.cpus))
                .chain(
                    state
                        .in_flight
                        .iter()
                        .map(|(uid, cpus)| (uid.as_str(), cpus)),
                ),
        );
        let cpusets = opaque_cpusets(claim, object, &parsed, &self.options.driver_name)?;
        let tuning = requested_tuning(
            claim,
            object,
            &parsed,
            &self.options.driver_name,
            &self.tuning_support,
        )?;
        let cpus = resolve_cpus_configured(
            claim,
            &parsed,
            &cpusets,
            &self.catalog,
            &self.allocator,
            &held,
            &offline,
            self.options.policy,
        )?;
        // An offline CPU left over shares nothing.
        check_shared_pool_floor(
            claim,
            &cpus,
            &self.catalog.allocatable().difference(&offline),
            &held,
            self.options.min_shared_cpus,
        )?;
        let assignment = ClaimAssignment {
            claim_uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            consumer_pods: parsed.consumer_pods,
            devices: parsed.devices,
            cpus,
            prepared_at_unix_ms: now_unix_ms(),
            pod_claim_name: parsed.pod_claim_name,
            tuning,
        };
        // A name that cannot be a metadata path is refused before anything
        // is committed.
        if self.metadata.is_some() {
            crate::device_metadata::check_names(&assignment).map_err(|e| PrepareError::Cdi {
                claim: claim.to_string(),
                reason: e.to_string(),
            })?;
        }
        state
            .in_flight
            .insert(claim.uid.clone(), assignment.cpus.clone());
        Ok(Decided::New(assignment))
    }

    /// A new claim's answer once its change is committed.
    fn prepared_new(&self, claim: &ClaimRef, assignment: ClaimAssignment) -> Prepared {
        self.metrics
            .upstream
            .record_claim_allocated_cpus(assignment.cpus.len());
        tracing::info!(
            claim = %claim, cpus = %assignment.cpus, pods = ?assignment.consumer_pods,
            "claim prepared"
        );
        Prepared {
            cdi_device_id: device_id(&claim.uid),
            assignment,
        }
    }

    /// Record the consumer pods of a prepared claim again. Kubelet prepares
    /// a claim once per node, so a pod added to its `status.reservedFor`
    /// later (a pod sharing the claim by name, started while another still
    /// holds it) is not in the record; `reserved_for` is what the claim's
    /// `reservedFor` names now, read from the API server, and becomes the
    /// record's consumers (recorded ones first): a pod gone from it runs no
    /// container that could ask, and the list does not grow with every pod
    /// that ever shared the claim. Durable, and told to subscribers as the
    /// claim's record changing. `Ok(None)`: the claim is not prepared.
    /// Blocks on fsync.
    pub fn add_consumers(
        &self,
        claim_uid: &str,
        reserved_for: &[String],
    ) -> Result<Option<ClaimAssignment>, PrepareError> {
        let mut state = self.lock_idle(claim_uid);
        let Some(recorded) = state.claims.get(claim_uid).cloned() else {
            return Ok(None);
        };
        let mut updated = recorded.clone();
        updated
            .consumer_pods
            .retain(|pod| reserved_for.contains(pod));
        for pod in reserved_for {
            if !pod.is_empty() && !updated.consumer_pods.contains(pod) {
                updated.consumer_pods.push(pod.clone());
            }
        }
        if updated.consumer_pods.is_empty() || updated.consumer_pods == recorded.consumer_pods {
            return Ok(Some(recorded));
        }
        let claim = ClaimRef {
            namespace: recorded.namespace.clone(),
            name: recorded.name.clone(),
            uid: recorded.claim_uid.clone(),
        };
        state
            .in_flight
            .insert(claim.uid.clone(), updated.cpus.clone());
        self.submit(state, &claim, Change::Reserve(Box::new(updated.clone())))?;
        tracing::info!(
            claim = %claim, pods = ?updated.consumer_pods,
            "claim's consumer pods recorded again from its reservedFor"
        );
        Ok(Some(updated))
    }

    /// Unprepare a claim: remove its CDI spec, release its CPUs, notify.
    /// Unknown claims succeed. Blocks on fsync (or use
    /// [`Driver::unprepare_async`]).
    pub fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let started = Instant::now();
        let result = self.unprepare_inner(claim);
        self.record_unprepare(started, &result);
        result
    }

    /// [`Driver::unprepare`] without a thread of its own while it waits (see
    /// [`Driver::prepare_async`]).
    pub async fn unprepare_async(self: Arc<Self>, claim: ClaimRef) -> Result<(), PrepareError> {
        let started = Instant::now();
        let result = self.unprepare_async_inner(&claim).await;
        self.record_unprepare(started, &result);
        result
    }

    fn record_unprepare(&self, started: Instant, result: &Result<(), PrepareError>) {
        self.metrics.unprepare_latency.observe(started.elapsed());
        self.metrics.unprepares.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            self.metrics.error("unprepare", e.reason());
        }
    }

    fn unprepare_inner(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let mut state = self.lock_idle(&claim.uid);
        if !state.claims.contains_key(&claim.uid) {
            return self.remove_unknown_claim_files(claim);
        }
        state.in_flight.insert(claim.uid.clone(), CpuSet::new());
        self.submit(state, claim, Change::Unprepare)
    }

    async fn unprepare_async_inner(self: &Arc<Self>, claim: &ClaimRef) -> Result<(), PrepareError> {
        // Once no change of this claim is being committed.
        let enqueued = self
            .state
            .until(|state| {
                if state.in_flight.contains_key(&claim.uid) {
                    return None;
                }
                if !state.claims.contains_key(&claim.uid) {
                    return Some(None);
                }
                state.in_flight.insert(claim.uid.clone(), CpuSet::new());
                Some(Some(self.enqueue(state, claim, Change::Unprepare)))
            })
            .await;
        if let Some(enqueued) = enqueued {
            return self.wait_committed(enqueued).await;
        }
        let (driver, task_claim) = (self.clone(), claim.clone());
        tokio::task::spawn_blocking(move || {
            // Under the lock, as the blocking path: a prepare of the claim
            // cannot begin between the check and the removal.
            let state = driver.lock_idle(&task_claim.uid);
            if state.claims.contains_key(&task_claim.uid) {
                drop(state);
                return driver.unprepare_inner(&task_claim);
            }
            driver.remove_unknown_claim_files(&task_claim)
        })
        .await
        .unwrap_or_else(|e| Err(task_failed(claim, &e)))
    }

    /// Files of a claim the driver does not hold, left by a crash between
    /// removal steps.
    fn remove_unknown_claim_files(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        self.remove_claim_files(claim)
            .map_err(|error| PrepareError::Cdi {
                claim: claim.to_string(),
                reason: error.to_string(),
            })
    }

    /// Queue a change and return its answer once it is committed. The
    /// caller has marked the claim in flight.
    fn submit<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        claim: &ClaimRef,
        change: Change,
    ) -> Result<(), PrepareError> {
        self.state.submit(
            state,
            commits_of,
            Pending {
                claim: claim.clone(),
                change,
            },
            |batch| self.commit_batch(batch),
            |state, batch, committed| self.settle(state, batch, committed),
        )
    }

    /// Queue a change for an async waiter. The caller has marked the claim
    /// in flight and must hand the result to [`Driver::wait_committed`].
    fn enqueue(&self, state: &mut State, claim: &ClaimRef, change: Change) -> Enqueued<Pending> {
        self.state.enqueue(
            state,
            commits_of,
            Pending {
                claim: claim.clone(),
                change,
            },
        )
    }

    /// Commit what `enqueue` made this caller the committer of (on a
    /// blocking thread, detached: the commit ends whatever becomes of the
    /// waiter), then wait for the change's answer.
    async fn wait_committed(
        self: &Arc<Self>,
        enqueued: Enqueued<Pending>,
    ) -> Result<(), PrepareError> {
        let Enqueued { ticket, batch } = enqueued;
        if let Some(batch) = batch {
            let driver = self.clone();
            // What the commit logs goes in the span of the change that
            // started it, as a blocking committer's does.
            let span = tracing::Span::current();
            let committer = tokio::task::spawn_blocking(move || {
                span.in_scope(|| {
                    driver.state.drain(
                        batch,
                        commits_of,
                        |batch| driver.commit_batch(batch),
                        |state, batch, committed| driver.settle(state, batch, committed),
                    )
                })
            });
            // Detached: the commit ends whatever becomes of this waiter. It
            // is dropped unrun only when the runtime shuts down, and then the
            // process ends with nothing of the batch written.
            drop(committer);
        }
        self.state
            .until(|state| self.state.take_answer(state, commits_of, ticket))
            .await
    }

    fn settle(
        &self,
        state: &mut State,
        batch: Vec<Queued<Pending>>,
        committed: std::thread::Result<(Vec<Settled>, Option<u64>)>,
    ) -> Vec<(u64, Result<(), PrepareError>)> {
        let answers = match committed {
            Ok((settled, undone)) => self.apply_settled(state, batch, settled, undone),
            Err(_) => self.recover_from_panic(state, batch),
        };
        self.update_gauges(state);
        answers
    }
}

/// The queue of the driver's group commit.
fn commits_of(state: &mut State) -> &mut CommitQueue<Pending, Result<(), PrepareError>> {
    &mut state.commits
}

/// What a prepare found under the state lock.
#[derive(Debug)]
enum Decided {
    /// The claim is prepared already: its record.
    Known(ClaimAssignment),
    /// CPUs picked now; the claim is marked in flight and must be queued.
    New(ClaimAssignment),
}

/// A blocking task of a prepare or unprepare that panicked or was cancelled.
fn task_failed(claim: &ClaimRef, error: &tokio::task::JoinError) -> PrepareError {
    PrepareError::Internal {
        claim: claim.to_string(),
        reason: format!("the claim's task failed: {error}"),
    }
}
