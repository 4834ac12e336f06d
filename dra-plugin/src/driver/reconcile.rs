//! Start-up reconciliation: the CDI specs and device metadata files on
//! disk brought in line with the stored claims.

use super::Driver;
use crate::device_metadata::host_files::MetadataPlan;
use crate::device_metadata::MetadataError;
use shared_state::cdi_spec::ClaimSpec;

impl Driver {
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
