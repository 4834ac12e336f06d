//! One group commit's work: the I/O of a batch of changes (CDI specs
//! removed, one store transaction, CDI specs written, failed specs undone)
//! without the state mutex, then its results applied to the state under the
//! mutex, subscribers told in revision order, and each caller answered.

use super::claim_files::in_parallel;
use super::crash_points::crash_point;
use super::group_commit::Queued;
use super::{Change, Driver, Pending, State, StateEvent};
use crate::prepare::PrepareError;
use shared_state::store::StoreOp;
use shared_state::ClaimAssignment;

/// What a group commit did to one change.
#[derive(Debug)]
pub(super) enum Settled {
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

impl Driver {
    /// The I/O of one group commit, without the state mutex. Returns what
    /// happened to each change, in batch order, and the last revision of
    /// undoing commits whose CDI spec failed.
    pub(super) fn commit_batch(&self, batch: &[Queued<Pending>]) -> (Vec<Settled>, Option<u64>) {
        let batch: Vec<&Pending> = batch.iter().map(|queued| &queued.change).collect();
        let mut settled: Vec<Option<Settled>> = batch.iter().map(|_| None).collect();
        // Unprepare removes the spec first: a claim whose record is gone
        // must have no spec the runtime could still hand to a container.
        let removals: Vec<usize> = (0..batch.len())
            .filter(|&i| matches!(batch[i].change, Change::Unprepare))
            .collect();
        let removed = in_parallel(&removals, self.claim_file_workers, |&i| {
            self.remove_claim_files(&batch[i].claim)
        });
        for (&i, result) in removals.iter().zip(removed) {
            if let Err(error) = result {
                settled[i] = Some(Settled::Failed(PrepareError::Cdi {
                    claim: batch[i].claim.to_string(),
                    reason: error.to_string(),
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
                Change::Prepare(assignment) | Change::Reserve(assignment) => {
                    StoreOp::Put((**assignment).clone())
                }
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
                return (fail_rest(&batch, settled, &reason), None);
            }
            Err(e) => return (fail_rest(&batch, settled, &e.to_string()), None),
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
                Change::Prepare(assignment) => Some((i, &**assignment, revision)),
                Change::Unprepare => {
                    settled[i] = Some(Settled::Unprepared(revision));
                    None
                }
                // Its CPUs are tuned and its spec written already.
                Change::Reserve(_) => {
                    settled[i] = Some(Settled::Prepared(revision.unwrap_or_default()));
                    None
                }
            })
            .collect();
        for (i, settled) in settled.iter().enumerate() {
            if matches!(settled, Some(Settled::Unprepared(_))) {
                self.untune(&batch[i].claim.uid);
            }
        }
        // The node is tuned before the spec exists, so no container of the
        // claim starts on CPUs not tuned yet.
        let mut failed_writes = Vec::new();
        let mut to_write = Vec::with_capacity(writes.len());
        for &(i, assignment, revision) in &writes {
            match self.tune(assignment) {
                Ok(()) => to_write.push((i, assignment, revision)),
                Err(error) => failed_writes.push((
                    i,
                    revision.unwrap_or_default(),
                    PrepareError::Tuning {
                        claim: batch[i].claim.to_string(),
                        reason: error.to_string(),
                    },
                )),
            }
        }
        let written = in_parallel(&to_write, self.claim_file_workers, |(_, a, _)| {
            self.write_claim(a)
        });
        for ((i, _, revision), result) in to_write.iter().zip(written) {
            // A put always changes the store, so it always has a revision.
            let revision = revision.unwrap_or_default();
            match result {
                Ok(()) => settled[*i] = Some(Settled::Prepared(revision)),
                Err(error) => {
                    self.untune(&batch[*i].claim.uid);
                    failed_writes.push((
                        *i,
                        revision,
                        PrepareError::Cdi {
                            claim: batch[*i].claim.to_string(),
                            reason: error.to_string(),
                        },
                    ));
                }
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
            for (i, revision, error) in failed_writes {
                settled[i] = Some(match &undo_result {
                    Ok(_) => Settled::Failed(error),
                    Err(undo) => {
                        tracing::error!(claim = %batch[i].claim, error = %undo, "cannot undo the store commit of a claim whose tuning or CDI spec failed");
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
    pub(super) fn apply_settled(
        &self,
        state: &mut State,
        batch: Vec<Queued<Pending>>,
        settled: Vec<Settled>,
        undone: Option<u64>,
    ) -> Vec<(u64, Result<(), PrepareError>)> {
        let mut answers = Vec::with_capacity(batch.len());
        for (queued, settled) in batch.into_iter().zip(settled) {
            let Queued {
                ticket,
                change: Pending { claim, change },
            } = queued;
            state.in_flight.remove(&claim.uid);
            let committed = |state: &mut State, revision: u64, change: Change| {
                state.revision = state.revision.max(revision);
                if let Change::Prepare(assignment) | Change::Reserve(assignment) = change {
                    let assignment = *assignment;
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
            answers.push((ticket, outcome));
        }
        if let Some(undone) = undone {
            state.revision = state.revision.max(undone);
        }
        answers
    }

    /// A group commit panicked part way: its changes may or may not have
    /// landed. Fail them all and re-read the store, the source of truth, so
    /// that no CPU it holds can be picked again.
    pub(super) fn recover_from_panic(
        &self,
        state: &mut State,
        batch: Vec<Queued<Pending>>,
    ) -> Vec<(u64, Result<(), PrepareError>)> {
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
        let mut answers = Vec::with_capacity(batch.len());
        for Queued { ticket, change } in batch {
            state.in_flight.remove(&change.claim.uid);
            answers.push((
                ticket,
                Err(PrepareError::Store {
                    claim: change.claim.to_string(),
                    reason: "the commit of this change failed unexpectedly; retry".into(),
                }),
            ));
        }
        answers
    }
}

/// The batch failed in the store: every change not already settled fails
/// with `reason`, and nothing of it was committed.
fn fail_rest(batch: &[&Pending], settled: Vec<Option<Settled>>, reason: &str) -> Vec<Settled> {
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
