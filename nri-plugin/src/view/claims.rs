//! The claims in the view: dra-plugin's snapshot and deltas (checked to move
//! forward in revision), and claims learned outside the watch stream, from a
//! Lookup answer or, provisionally, from a CDI spec.

use shared_state::claim_env::EnvClaim;
use shared_state::pool::{PoolError, Update};
use shared_state::{ClaimAssignment, NodeSnapshot};

use super::{NodeView, ViewError};

/// Where the CPUs of a claim came from when the view learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOrigin {
    /// dra-plugin's snapshot, a delta, or a Lookup answer.
    DraPlugin,
    /// The claim's CDI spec on disk, read while dra-plugin was unreachable.
    /// Such a claim is provisional: the CDI spec names its CPUs but not the
    /// pod it is reserved for, so the first pod whose container names it
    /// becomes its consumer, and the next snapshot replaces it.
    CdiSpec,
}

impl NodeView {
    /// A provisional claim has no known consumer; the first pod naming it
    /// becomes one, after which the usual one-container rule protects it.
    /// Returns the UIDs of the claims adopted, for
    /// [`restore_provisional`](Self::restore_provisional) when the
    /// container is refused after all.
    pub(super) fn adopt_provisional(&mut self, refs: &[EnvClaim], pod_uid: &str) -> Vec<String> {
        let mut adopted_uids = Vec::new();
        for r in refs {
            if !self.provisional.contains(&r.claim_uid) {
                continue;
            }
            let Some(claim) = self.pool.claim(&r.claim_uid) else {
                continue;
            };
            if !claim.consumer_pods.is_empty() {
                continue;
            }
            let mut adopted = claim.clone();
            adopted.consumer_pods.push(pod_uid.to_string());
            // Replacing a claim with the same CPUs cannot fail validation.
            if self.pool.add_claim(adopted).is_err() {
                tracing::warn!(claim = %r.claim_uid, "could not adopt a provisional claim");
                continue;
            }
            adopted_uids.push(r.claim_uid.clone());
        }
        adopted_uids
    }

    /// Undo [`adopt_provisional`](Self::adopt_provisional) for a container
    /// that was refused: a pod whose container was not admitted does not
    /// keep the claim from its real pod.
    pub(super) fn restore_provisional(&mut self, adopted_uids: Vec<String>) {
        for uid in adopted_uids {
            let Some(claim) = self.pool.claim(&uid) else {
                continue;
            };
            let mut unadopted = claim.clone();
            unadopted.consumer_pods.clear();
            if self.pool.add_claim(unadopted).is_err() {
                tracing::warn!(claim = %uid, "could not restore a provisional claim");
            }
        }
    }

    /// Add a claim learned outside the watch stream (a Lookup answer or a
    /// CDI spec). Returns the updates it makes due; they are not applied.
    pub fn learn_claim(
        &mut self,
        assignment: ClaimAssignment,
        origin: ClaimOrigin,
    ) -> Result<Vec<Update>, PoolError> {
        let uid = assignment.claim_uid.clone();
        let updates = match origin {
            ClaimOrigin::DraPlugin => self.pool.add_stored_claim(assignment)?,
            ClaimOrigin::CdiSpec => self.pool.add_claim(assignment)?,
        };
        match origin {
            ClaimOrigin::DraPlugin => self.provisional.remove(&uid),
            ClaimOrigin::CdiSpec => self.provisional.insert(uid),
        };
        Ok(updates)
    }

    /// Replace claims and CPUs with a snapshot; containers stay.
    pub fn apply_snapshot(&mut self, snapshot: NodeSnapshot) -> Result<Vec<Update>, ViewError> {
        if snapshot.mixed_allocation_mode != self.mixed_mode {
            tracing::warn!(
                dra_plugin = snapshot.mixed_allocation_mode,
                nri_plugin = self.mixed_mode,
                "dra-plugin and nri-plugin disagree on --mixed-allocation-mode; nri-plugin's setting decides container kinds"
            );
        }
        for claim in &snapshot.claims {
            let outside = claim.cpus.difference(&snapshot.allocatable);
            if !outside.is_empty() {
                tracing::warn!(
                    claim_uid = %claim.claim_uid, cpus = %claim.cpus, %outside,
                    "a prepared claim holds CPUs that are no longer allocatable (offline or reserved since it was prepared): kept for its containers, never shared"
                );
            }
        }
        let updates = self.pool.resync(
            snapshot.allocatable,
            snapshot.reserved,
            self.mixed_mode,
            snapshot.claims,
        )?;
        self.provisional.clear();
        self.revision = snapshot.revision;
        self.following = true;
        Ok(updates)
    }

    fn check_revision(&self, revision: u64) -> Result<(), ViewError> {
        if revision <= self.revision {
            return Err(ViewError::StaleRevision {
                got: revision,
                applied: self.revision,
            });
        }
        Ok(())
    }

    /// A claim was prepared. Refused if the revision goes backwards.
    pub fn apply_prepared(
        &mut self,
        revision: u64,
        assignment: ClaimAssignment,
    ) -> Result<Vec<Update>, ViewError> {
        self.check_revision(revision)?;
        let updates = self.learn_claim(assignment, ClaimOrigin::DraPlugin)?;
        self.revision = revision;
        Ok(updates)
    }

    /// A claim was unprepared: its CPUs return to the shared pool.
    pub fn apply_unprepared(
        &mut self,
        revision: u64,
        claim_uid: &str,
    ) -> Result<Vec<Update>, ViewError> {
        self.check_revision(revision)?;
        self.provisional.remove(claim_uid);
        self.revision = revision;
        Ok(self.pool.remove_claim(claim_uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;

    #[test]
    fn stale_revisions_are_refused() {
        let mut v = view_at(5);
        let err = v
            .apply_prepared(5, claim(CLAIM_1, "2", POD_A))
            .expect_err("stale");
        assert_eq!(err, ViewError::StaleRevision { got: 5, applied: 5 });
        assert!(v.pool().claim(CLAIM_1).is_none());
        assert!(v.apply_unprepared(4, CLAIM_1).is_err());
        v.apply_prepared(6, claim(CLAIM_1, "2", POD_A))
            .expect("next");
        assert_eq!(v.revision(), 6);
    }

    #[test]
    fn a_claim_of_dra_plugins_store_on_a_cpu_no_longer_allocatable_is_kept() {
        // CPU 7 went offline between the claim's decision and its event.
        let mut v = view(false);
        v.apply_snapshot(NodeSnapshot {
            revision: 5,
            allocatable: set("1-6"),
            reserved: set("0"),
            mixed_allocation_mode: false,
            claims: vec![],
        })
        .expect("snapshot");
        v.apply_prepared(6, claim(CLAIM_1, "6-7", POD_A))
            .expect("dra-plugin's claim is kept");
        assert_eq!(
            v.pool().claim(CLAIM_1).map(|c| c.cpus.clone()),
            Some(set("6-7"))
        );
        assert_eq!(v.pool().shared(), set("1-5"));
        // Learned from a CDI spec alone, such a claim is refused.
        assert!(matches!(
            v.learn_claim(claim(CLAIM_2, "7", POD_B), ClaimOrigin::CdiSpec),
            Err(PoolError::ClaimOutsideAllocatable { .. })
        ));
    }
}
