//! The state of prepared claims on this node and the two operations that
//! change it, prepare and unprepare.
//!
//! One mutex covers the whole decision: pick CPUs, commit to the store
//! (fsynced), write the CDI spec, tell subscribers. Two prepares can
//! therefore never pick the same CPU, and subscribers receive changes in
//! exactly the order of their store revisions. The store is the source of
//! truth; the in-memory map mirrors it so that a decision does not read the
//! disk.

use crate::cdi::{device_id, CdiDir};
use crate::metrics::Metrics;
use crate::prepare::{parse_claim, resolve_cpus, ClaimRef, DeviceCatalog, PrepareError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use shared_state::alloc::{Allocator, Policy};
use shared_state::store::{AssignmentStore, StoreError};
use shared_state::topology::Topology;
use shared_state::{ClaimAssignment, CpuSet};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
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

/// The whole state at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSnapshot {
    pub revision: u64,
    pub allocatable: CpuSet,
    pub reserved: CpuSet,
    pub mixed_allocation_mode: bool,
    pub claims: Vec<ClaimAssignment>,
}

/// What the driver needs to know about its node and its options.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    pub driver_name: String,
    pub node_name: String,
    pub reserved: CpuSet,
    pub policy: Policy,
    pub mixed_allocation_mode: bool,
}

#[derive(Debug)]
struct State {
    claims: BTreeMap<String, ClaimAssignment>,
    revision: u64,
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
    state: Mutex<State>,
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

/// Env var naming a point of the prepare path where the process aborts, for
/// crash-recovery tests: `after-store-commit` or `after-cdi-write`. Read once.
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
            state: Mutex::new(State { claims, revision }),
            events,
            metrics,
            store_fault: Arc::default(),
        };
        driver.update_gauges(&driver.lock());
        Ok(driver)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation leaves `State` consistent before any call that could
        // panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The current state and a receiver of every change after it.
    pub fn subscribe(&self) -> (StateSnapshot, broadcast::Receiver<StateEvent>) {
        let state = self.lock();
        let receiver = self.events.subscribe();
        (self.snapshot_of(&state), receiver)
    }

    pub fn snapshot(&self) -> StateSnapshot {
        self.snapshot_of(&self.lock())
    }

    fn snapshot_of(&self, state: &State) -> StateSnapshot {
        StateSnapshot {
            revision: state.revision,
            allocatable: self.catalog.allocatable().clone(),
            reserved: self.options.reserved.clone(),
            mixed_allocation_mode: self.options.mixed_allocation_mode,
            claims: state.claims.values().cloned().collect(),
        }
    }

    /// Answer for a claim that is already prepared, making sure its CDI spec
    /// is on disk (it may have been removed behind our back).
    pub fn already_prepared(&self, claim: &ClaimRef) -> Option<Result<Prepared, PrepareError>> {
        // Held across the spec check so that a concurrent unprepare cannot
        // remove the claim between the check and a rewrite of its spec.
        let state = self.lock();
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
        if self.cdi.read_cpus(&claim.uid).as_ref() != Some(&assignment.cpus) {
            self.cdi
                .write(&claim.uid, &assignment.cpus)
                .map_err(|e| PrepareError::Cdi {
                    claim: claim.to_string(),
                    reason: e.to_string(),
                })?;
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
        let mut state = self.lock();
        if let Some(assignment) = state.claims.get(&claim.uid).cloned() {
            return self.ensure_cdi(claim, assignment);
        }
        let parsed = parse_claim(
            claim,
            object,
            &self.options.driver_name,
            &self.options.node_name,
        )?;
        let held: BTreeMap<String, CpuSet> = state
            .claims
            .iter()
            .map(|(uid, a)| (uid.clone(), a.cpus.clone()))
            .collect();
        let cpus = resolve_cpus(
            claim,
            &parsed,
            &self.catalog,
            &self.allocator,
            &held,
            self.options.policy,
        )?;
        let assignment = ClaimAssignment {
            claim_uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            consumer_pods: parsed.consumer_pods,
            devices: parsed.devices,
            cpus,
            prepared_at_unix_ms: now_unix_ms(),
        };
        let put = self.store.put(&assignment);
        self.store_fault.record(&put);
        let revision = put.map_err(|e| PrepareError::Store {
            claim: claim.to_string(),
            reason: e.to_string(),
        })?;
        crash_point("after-store-commit");
        if let Err(e) = self.cdi.write(&claim.uid, &assignment.cpus) {
            // Undo the commit so a failed claim leaves nothing behind; if even
            // that fails the record stays, and CDI reconciliation at the next
            // start rewrites the spec, so the CPUs are never given twice.
            let reason = e.to_string();
            let undo = self.store.remove(&claim.uid);
            self.store_fault.record(&undo);
            match undo {
                Ok(Some(undone)) => state.revision = undone,
                Ok(None) => state.revision = revision,
                Err(undo) => {
                    tracing::error!(claim = %claim, error = %undo, "cannot undo the store commit of a claim whose CDI spec failed");
                    state.revision = revision;
                    state.claims.insert(claim.uid.clone(), assignment);
                }
            }
            self.update_gauges(&state);
            return Err(PrepareError::Cdi {
                claim: claim.to_string(),
                reason,
            });
        }
        crash_point("after-cdi-write");
        state.revision = revision;
        state.claims.insert(claim.uid.clone(), assignment.clone());
        self.update_gauges(&state);
        // No receiver is not an error: nri-plugin may not be connected.
        let _ = self.events.send(StateEvent::Prepared {
            revision,
            assignment: assignment.clone(),
        });
        drop(state);
        tracing::info!(
            claim = %claim, cpus = %assignment.cpus, pods = ?assignment.consumer_pods, revision,
            "claim prepared"
        );
        Ok(Prepared {
            cdi_device_id: device_id(&claim.uid),
            assignment,
        })
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
        let mut state = self.lock();
        let cdi_error = |e: crate::cdi::CdiError| PrepareError::Cdi {
            claim: claim.to_string(),
            reason: e.to_string(),
        };
        if !state.claims.contains_key(&claim.uid) {
            // Also clears a spec left by a crash between its removal steps.
            return match self.cdi.remove(&claim.uid) {
                Ok(()) => Ok(()),
                // A UID we could never have written a spec for: nothing to do.
                Err(crate::cdi::CdiError::BadClaimUid(_)) => Ok(()),
                Err(e) => Err(cdi_error(e)),
            };
        }
        self.cdi.remove(&claim.uid).map_err(cdi_error)?;
        let removed = self.store.remove(&claim.uid);
        self.store_fault.record(&removed);
        let removed = removed.map_err(|e| PrepareError::Store {
            claim: claim.to_string(),
            reason: e.to_string(),
        })?;
        let revision = removed.unwrap_or(state.revision);
        state.revision = revision;
        let released = state.claims.remove(&claim.uid);
        self.update_gauges(&state);
        let _ = self.events.send(StateEvent::Unprepared {
            revision,
            claim_uid: claim.uid.clone(),
        });
        drop(state);
        tracing::info!(
            claim = %claim,
            cpus = %released.map(|a| a.cpus).unwrap_or_default(),
            revision,
            "claim unprepared"
        );
        Ok(())
    }

    /// Rewrite missing or stale CDI specs of stored claims and remove specs
    /// of ours whose claim is not stored.
    pub fn reconcile_cdi(&self) -> Result<crate::cdi::CdiPlan, crate::cdi::CdiError> {
        let state = self.lock();
        let stored: Vec<(String, CpuSet)> = state
            .claims
            .values()
            .map(|a| (a.claim_uid.clone(), a.cpus.clone()))
            .collect();
        self.cdi.reconcile(&stored)
    }
}
