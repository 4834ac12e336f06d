//! The state of prepared claims on this node and the two operations that
//! change it, prepare and unprepare.
//!
//! Concurrent changes are group-committed. A prepare picks its CPUs under
//! the state mutex against every committed claim and every claim still being
//! committed, so two prepares never pick the same CPU; it then queues its
//! store op and waits. Whichever waiter finds no commit running takes the
//! whole queue and commits it in one store transaction and one fsync, each op
//! with its own revision; then writes the CDI specs (each fsynced); then,
//! under the mutex, applies the changes and tells subscribers in revision
//! order; then wakes the waiters. Nobody is answered before their change is
//! on disk, and a batch that fails fails each of its changes and leaves
//! nothing behind. The store is the source of truth; the in-memory map
//! mirrors it so that a decision does not read the disk.

use crate::cdi::{device_id, CdiDir, ClaimSpec};
use crate::device_metadata::{ClaimMetadata, DeviceMetadata, MetadataError, MetadataPlan};
use crate::metrics::Metrics;
use crate::prepare::{
    check_shared_pool_floor, opaque_cpusets, parse_claim, resolve_cpus_configured, ClaimRef,
    DeviceCatalog, PrepareError,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use shared_state::alloc::{Allocator, Policy};
use shared_state::store::{AssignmentStore, StoreError, StoreOp};
use shared_state::topology::Topology;
use shared_state::upstream_metrics::AllocationState;
use shared_state::{ClaimAssignment, CpuSet, NodeSnapshot};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

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

/// Most threads writing or removing the CDI specs of one batch at once:
/// their fsyncs overlap instead of queueing one behind another.
const CDI_WORKERS: usize = 16;

#[derive(Debug)]
struct State {
    claims: BTreeMap<String, ClaimAssignment>,
    revision: u64,
    /// Claims with a change queued or being committed, with the CPUs a
    /// queued prepare holds (empty for an unprepare, whose CPUs are still in
    /// `claims`). A second change of such a claim waits for the first.
    in_flight: BTreeMap<String, CpuSet>,
    /// Changes waiting for the next group commit, in arrival order.
    queue: Vec<Pending>,
    /// A group commit is running outside the mutex.
    committing: bool,
    /// Answers of committed changes not yet collected by their caller.
    outcomes: BTreeMap<u64, Result<(), PrepareError>>,
    next_ticket: u64,
}

/// A change waiting for the group commit.
#[derive(Debug)]
struct Pending {
    ticket: u64,
    claim: ClaimRef,
    change: Change,
}

#[derive(Debug)]
enum Change {
    Prepare(ClaimAssignment),
    Unprepare,
}

/// What a group commit did to one change.
#[derive(Debug)]
enum Settled {
    /// Committed at this revision, CDI spec written.
    Prepared(u64),
    /// Spec removed and record removed at this revision (`None`: the store
    /// did not hold it).
    Unprepared(Option<u64>),
    /// Nothing of this change is left.
    Failed(PrepareError),
    /// The CDI spec failed and undoing the commit failed too: the record
    /// stays (at this revision), so its CPUs are never given twice, and CDI
    /// reconciliation at the next start rewrites the spec.
    FailedButCommitted(u64, PrepareError),
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
        self.error.lock().unwrap_or_else(|p| p.into_inner())
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
    state: Mutex<State>,
    /// Signalled whenever a group commit ends.
    settled: Condvar,
    events: broadcast::Sender<StateEvent>,
    metrics: Arc<Metrics>,
    store_fault: Arc<StoreFault>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("options", &self.options)
            .field("cdi", &self.cdi)
            .finish()
    }
}

/// Env var naming a point where the process aborts, for crash-recovery
/// tests. On the prepare path: `after-store-commit` (committed, no CDI spec
/// yet) or `after-cdi-write` (spec written, caller not yet answered). On the
/// unprepare path: `unprepare-after-cdi-remove` (spec removed, record still
/// stored) or `unprepare-after-store-commit` (record removed, caller not yet
/// answered). Read once.
pub const CRASH_AT_ENV: &str = "DRA_CPU_CRASH_AT";

/// Abort here if [`CRASH_AT_ENV`] names `point`: lets a test stop the daemon
/// exactly between two durable steps, which random kills rarely hit.
fn crash_point(point: &str) {
    static CRASH_AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if CRASH_AT
        .get_or_init(|| std::env::var(CRASH_AT_ENV).ok())
        .as_deref()
        == Some(point)
    {
        std::process::abort();
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
        let driver = Driver {
            options,
            catalog,
            allocator: Allocator::new(topology),
            store,
            cdi,
            metadata: None,
            state: Mutex::new(State {
                claims,
                revision,
                in_flight: BTreeMap::new(),
                queue: Vec::new(),
                committing: false,
                outcomes: BTreeMap::new(),
                next_ticket: 0,
            }),
            settled: Condvar::new(),
            events,
            metrics,
            store_fault: Arc::default(),
        };
        driver.update_gauges(&driver.lock());
        Ok(driver)
    }

    /// Write device metadata for every prepared claim (see
    /// [`crate::device_metadata`]).
    pub fn with_device_metadata(mut self, metadata: Option<DeviceMetadata>) -> Driver {
        self.metadata = metadata;
        self
    }

    /// The CDI spec a prepared claim should have, and its metadata files
    /// when those are on.
    fn claim_spec(
        &self,
        assignment: &ClaimAssignment,
    ) -> Result<(ClaimSpec, Option<ClaimMetadata>), MetadataError> {
        let spec = ClaimSpec::new(&assignment.claim_uid, &assignment.cpus);
        match &self.metadata {
            None => Ok((spec, None)),
            Some(metadata) => {
                let files = metadata.render(assignment)?;
                Ok((spec.with_mounts(files.mounts()), Some(files)))
            }
        }
    }

    /// Metadata files then the CDI spec that mounts them, so the runtime
    /// never finds a spec whose files are not there yet.
    fn write_claim(&self, assignment: &ClaimAssignment) -> Result<(), String> {
        let (spec, files) = self.claim_spec(assignment).map_err(|e| e.to_string())?;
        if let (Some(metadata), Some(files)) = (&self.metadata, &files) {
            metadata.write(files).map_err(|e| e.to_string())?;
        }
        self.cdi
            .write_spec(&assignment.claim_uid, &spec)
            .map_err(|e| e.to_string())
    }

    /// The CDI spec first (no container can be given the claim any more),
    /// then the metadata files it mounted.
    fn remove_claim_files(&self, claim: &ClaimRef) -> Result<(), String> {
        match self.cdi.remove(&claim.uid) {
            Ok(()) => {}
            // A UID we could never have written a spec for: nothing to do.
            Err(crate::cdi::CdiError::BadClaimUid(_)) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
        if let Some(metadata) = &self.metadata {
            metadata
                .remove(&claim.namespace, &claim.name, &claim.uid)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation leaves `State` consistent before any call that could
        // panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.settled.wait(state).unwrap_or_else(|p| p.into_inner())
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
        let shared = self.catalog.allocatable().difference(&exclusive);
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

    /// Changes waiting for the next group commit (not counting the one
    /// running): how much a commit is lagging behind its callers.
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
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
            allocatable: self.catalog.allocatable().clone(),
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
    /// Blocks on fsync: call from a blocking thread.
    pub fn prepare(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Prepared, PrepareError> {
        let started = Instant::now();
        let result = self.prepare_inner(claim, object);
        self.metrics.prepare_latency.observe(started.elapsed());
        self.metrics.prepares.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            self.metrics.error("prepare", e.reason());
        }
        result
    }

    fn prepare_inner(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Prepared, PrepareError> {
        let mut state = self.lock_idle(&claim.uid);
        if let Some(assignment) = state.claims.get(&claim.uid).cloned() {
            return self.ensure_cdi(claim, assignment);
        }
        let parsed = parse_claim(
            claim,
            object,
            &self.options.driver_name,
            &self.options.node_name,
        )?;
        // CPUs of claims still being committed are as taken as committed ones.
        let held: BTreeMap<String, CpuSet> = state
            .claims
            .iter()
            .map(|(uid, a)| (uid.clone(), a.cpus.clone()))
            .chain(state.in_flight.iter().map(|(u, c)| (u.clone(), c.clone())))
            .collect();
        let cpusets = opaque_cpusets(claim, object, &parsed, &self.options.driver_name)?;
        let cpus = resolve_cpus_configured(
            claim,
            &parsed,
            &cpusets,
            &self.catalog,
            &self.allocator,
            &held,
            self.options.policy,
        )?;
        check_shared_pool_floor(
            claim,
            &cpus,
            self.catalog.allocatable(),
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
        self.submit(state, claim, Change::Prepare(assignment.clone()))?;
        self.metrics
            .upstream
            .record_claim_allocated_cpus(assignment.cpus.len());
        tracing::info!(
            claim = %claim, cpus = %assignment.cpus, pods = ?assignment.consumer_pods,
            "claim prepared"
        );
        Ok(Prepared {
            cdi_device_id: device_id(&claim.uid),
            assignment,
        })
    }

    /// Queue a change and return its answer once it is committed. The
    /// caller has marked the claim in flight. Whoever finds the queue
    /// non-empty and no commit running commits the whole queue.
    fn submit<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        claim: &ClaimRef,
        change: Change,
    ) -> Result<(), PrepareError> {
        let ticket = state.next_ticket;
        state.next_ticket = state.next_ticket.wrapping_add(1);
        state.queue.push(Pending {
            ticket,
            claim: claim.clone(),
            change,
        });
        loop {
            if let Some(outcome) = state.outcomes.remove(&ticket) {
                return outcome;
            }
            if !state.committing && !state.queue.is_empty() {
                state.committing = true;
                let batch = std::mem::take(&mut state.queue);
                drop(state);
                let committed = catch_unwind(AssertUnwindSafe(|| self.commit_batch(&batch)));
                state = self.lock();
                match committed {
                    Ok((settled, undone)) => self.apply_settled(&mut state, batch, settled, undone),
                    Err(_) => self.recover_from_panic(&mut state, batch),
                }
                state.committing = false;
                self.update_gauges(&state);
                self.settled.notify_all();
                continue;
            }
            state = self.wait(state);
        }
    }

    /// The I/O of one group commit, without the state mutex. Returns what
    /// happened to each change, in batch order, and the last revision of
    /// undoing commits whose CDI spec failed.
    fn commit_batch(&self, batch: &[Pending]) -> (Vec<Settled>, Option<u64>) {
        let mut settled: Vec<Option<Settled>> = batch.iter().map(|_| None).collect();
        // Unprepare removes the spec first: a claim whose record is gone
        // must have no spec the runtime could still hand to a container.
        let removals: Vec<usize> = (0..batch.len())
            .filter(|&i| matches!(batch[i].change, Change::Unprepare))
            .collect();
        let removed = in_parallel(&removals, |&i| self.remove_claim_files(&batch[i].claim));
        for (&i, result) in removals.iter().zip(removed) {
            if let Err(reason) = result {
                settled[i] = Some(Settled::Failed(PrepareError::Cdi {
                    claim: batch[i].claim.to_string(),
                    reason,
                }));
            }
        }
        if removals.iter().any(|&i| settled[i].is_none()) {
            crash_point("unprepare-after-cdi-remove");
        }
        let to_commit: Vec<usize> = (0..batch.len()).filter(|&i| settled[i].is_none()).collect();
        let ops: Vec<StoreOp> = to_commit
            .iter()
            .map(|&i| match &batch[i].change {
                Change::Prepare(assignment) => StoreOp::Put(assignment.clone()),
                Change::Unprepare => StoreOp::Remove(batch[i].claim.uid.clone()),
            })
            .collect();
        let applied = self.store.apply_numbered(&ops);
        self.store_fault.record(&applied);
        let revisions = match applied {
            Ok(revisions) if revisions.len() == ops.len() => revisions,
            Ok(revisions) => {
                let reason = format!(
                    "the store numbered {} of {} changes",
                    revisions.len(),
                    ops.len()
                );
                return (fail_rest(batch, settled, &reason), None);
            }
            Err(e) => return (fail_rest(batch, settled, &e.to_string()), None),
        };
        let has_prepares = ops.iter().any(|op| matches!(op, StoreOp::Put(_)));
        if has_prepares {
            crash_point("after-store-commit");
        }
        if ops.iter().any(|op| matches!(op, StoreOp::Remove(_))) {
            crash_point("unprepare-after-store-commit");
        }
        let writes: Vec<(usize, &ClaimAssignment, Option<u64>)> = to_commit
            .iter()
            .zip(&revisions)
            .filter_map(|(&i, &revision)| match &batch[i].change {
                Change::Prepare(assignment) => Some((i, assignment, revision)),
                Change::Unprepare => {
                    settled[i] = Some(Settled::Unprepared(revision));
                    None
                }
            })
            .collect();
        let written = in_parallel(&writes, |(_, a, _)| self.write_claim(a));
        let mut failed_writes = Vec::new();
        for ((i, _, revision), result) in writes.iter().zip(written) {
            // A put always changes the store, so it always has a revision.
            let revision = revision.unwrap_or_default();
            match result {
                Ok(()) => settled[*i] = Some(Settled::Prepared(revision)),
                Err(reason) => failed_writes.push((*i, revision, reason)),
            }
        }
        if has_prepares && failed_writes.len() < writes.len() {
            crash_point("after-cdi-write");
        }
        let mut undone = None;
        if !failed_writes.is_empty() {
            // Undo the commits so a failed claim leaves nothing behind.
            let undo: Vec<StoreOp> = failed_writes
                .iter()
                .map(|(i, _, _)| StoreOp::Remove(batch[*i].claim.uid.clone()))
                .collect();
            let undo_result = self.store.apply_numbered(&undo);
            self.store_fault.record(&undo_result);
            if let Ok(revisions) = &undo_result {
                undone = revisions.iter().flatten().max().copied();
            }
            for (i, revision, reason) in failed_writes {
                let error = PrepareError::Cdi {
                    claim: batch[i].claim.to_string(),
                    reason,
                };
                settled[i] = Some(match &undo_result {
                    Ok(_) => Settled::Failed(error),
                    Err(undo) => {
                        tracing::error!(claim = %batch[i].claim, error = %undo, "cannot undo the store commit of a claim whose CDI spec failed");
                        Settled::FailedButCommitted(revision, error)
                    }
                });
            }
        }
        let settled = settled
            .into_iter()
            .map(|s| {
                s.unwrap_or_else(|| {
                    Settled::Failed(PrepareError::Store {
                        claim: String::new(),
                        reason: "change left unsettled by its group commit".into(),
                    })
                })
            })
            .collect();
        (settled, undone)
    }

    /// Apply a group commit's results to the state, telling subscribers in
    /// revision order, and leave each caller its answer.
    fn apply_settled(
        &self,
        state: &mut State,
        batch: Vec<Pending>,
        settled: Vec<Settled>,
        undone: Option<u64>,
    ) {
        for (pending, settled) in batch.into_iter().zip(settled) {
            let Pending {
                ticket,
                claim,
                change,
            } = pending;
            state.in_flight.remove(&claim.uid);
            let committed = |state: &mut State, revision: u64, change: Change| {
                state.revision = state.revision.max(revision);
                if let Change::Prepare(assignment) = change {
                    state
                        .claims
                        .insert(assignment.claim_uid.clone(), assignment.clone());
                    // No receiver is not an error: nri-plugin may not be connected.
                    let _ = self.events.send(StateEvent::Prepared {
                        revision,
                        assignment,
                    });
                }
            };
            let outcome = match settled {
                Settled::Prepared(revision) => {
                    committed(state, revision, change);
                    Ok(())
                }
                Settled::FailedButCommitted(revision, error) => {
                    committed(state, revision, change);
                    Err(error)
                }
                Settled::Unprepared(revision) => {
                    let released = state.claims.remove(&claim.uid);
                    if let Some(revision) = revision {
                        state.revision = state.revision.max(revision);
                        let _ = self.events.send(StateEvent::Unprepared {
                            revision,
                            claim_uid: claim.uid.clone(),
                        });
                    }
                    tracing::info!(
                        claim = %claim,
                        cpus = %released.map(|a| a.cpus).unwrap_or_default(),
                        revision = revision.unwrap_or(state.revision),
                        "claim unprepared"
                    );
                    Ok(())
                }
                Settled::Failed(error) => Err(match error {
                    PrepareError::Store { claim: c, reason } if c.is_empty() => {
                        PrepareError::Store {
                            claim: claim.to_string(),
                            reason,
                        }
                    }
                    other => other,
                }),
            };
            state.outcomes.insert(ticket, outcome);
        }
        if let Some(undone) = undone {
            state.revision = state.revision.max(undone);
        }
    }

    /// A group commit panicked part way: its changes may or may not have
    /// landed. Fail them all and re-read the store, the source of truth, so
    /// that no CPU it holds can be picked again.
    fn recover_from_panic(&self, state: &mut State, batch: Vec<Pending>) {
        tracing::error!(
            changes = batch.len(),
            "a group commit panicked; re-reading the store"
        );
        match (self.store.list(), self.store.revision()) {
            (Ok(claims), Ok(revision)) => {
                state.claims = claims
                    .into_iter()
                    .map(|a| (a.claim_uid.clone(), a))
                    .collect();
                state.revision = state.revision.max(revision);
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot re-read the store after a failed group commit");
            }
        }
        for pending in batch {
            state.in_flight.remove(&pending.claim.uid);
            state.outcomes.insert(
                pending.ticket,
                Err(PrepareError::Store {
                    claim: pending.claim.to_string(),
                    reason: "the commit of this change failed unexpectedly; retry".into(),
                }),
            );
        }
    }

    /// Unprepare a claim: remove its CDI spec, release its CPUs, notify.
    /// Unknown claims succeed. Blocks on fsync.
    pub fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let started = Instant::now();
        let result = self.unprepare_inner(claim);
        self.metrics.unprepare_latency.observe(started.elapsed());
        self.metrics.unprepares.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            self.metrics.error("unprepare", e.reason());
        }
        result
    }

    fn unprepare_inner(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let mut state = self.lock_idle(&claim.uid);
        if !state.claims.contains_key(&claim.uid) {
            // Also clears files left by a crash between removal steps.
            return self
                .remove_claim_files(claim)
                .map_err(|reason| PrepareError::Cdi {
                    claim: claim.to_string(),
                    reason,
                });
        }
        state.in_flight.insert(claim.uid.clone(), CpuSet::new());
        self.submit(state, claim, Change::Unprepare)
    }

    /// Rewrite missing or stale CDI specs of stored claims and remove specs
    /// of ours whose claim is not stored; the same for device metadata
    /// files when those are on.
    pub fn reconcile_cdi(&self) -> Result<Reconciled, ReconcileError> {
        // No change in flight, so the specs being written or removed by a
        // group commit are not mistaken for stale or orphaned ones.
        let mut state = self.lock();
        while !state.in_flight.is_empty() {
            state = self.wait(state);
        }
        let mut specs = Vec::with_capacity(state.claims.len());
        let mut files = Vec::new();
        for assignment in state.claims.values() {
            let (spec, claim_files) = match self.claim_spec(assignment) {
                Ok(rendered) => rendered,
                Err(e) => {
                    // Checked at prepare; a record from before that check
                    // keeps its CPUs, without metadata.
                    tracing::warn!(claim_uid = %assignment.claim_uid, error = %e, "no device metadata for a stored claim");
                    (
                        ClaimSpec::new(&assignment.claim_uid, &assignment.cpus),
                        None,
                    )
                }
            };
            specs.push((assignment.claim_uid.clone(), spec));
            files.extend(claim_files);
        }
        // Files before the specs that mount them.
        let metadata = match &self.metadata {
            Some(metadata) => metadata.reconcile(&files)?,
            None => MetadataPlan::default(),
        };
        let cdi = self.cdi.reconcile(&specs)?;
        Ok(Reconciled { cdi, metadata })
    }
}

/// What start-up reconciliation changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub cdi: crate::cdi::CdiPlan,
    pub metadata: MetadataPlan,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Cdi(#[from] crate::cdi::CdiError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// The batch failed in the store: every change not already settled fails
/// with `reason`, and nothing of it was committed.
fn fail_rest(batch: &[Pending], settled: Vec<Option<Settled>>, reason: &str) -> Vec<Settled> {
    batch
        .iter()
        .zip(settled)
        .map(|(pending, s)| {
            s.unwrap_or_else(|| {
                Settled::Failed(PrepareError::Store {
                    claim: pending.claim.to_string(),
                    reason: reason.to_string(),
                })
            })
        })
        .collect()
}

/// `f` over `items` on up to [`CDI_WORKERS`] threads, results in order. A
/// panic in a worker is re-raised here.
fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(items.len().min(CDI_WORKERS));
    let f = &f;
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}
