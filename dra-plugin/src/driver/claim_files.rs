//! The files of a prepared claim: its CDI spec and, when on, its device
//! metadata files, written and removed in the order the runtime needs, and
//! the worker threads that write a batch's files at once.

use std::path::Path;

use super::Driver;
use crate::cdi::CdiError;
use crate::device_metadata::{ClaimMetadata, MetadataError};
use crate::prepare::ClaimRef;
use shared_state::cdi_spec::ClaimSpec;
use shared_state::ClaimAssignment;

/// Most threads writing or removing the CDI specs of one batch at once:
/// their fsyncs overlap instead of queueing one behind another.
const CDI_WORKERS: usize = 16;

/// How many threads write or remove one batch's claim files. On tmpfs (a
/// node's `/var/run/cdi`, and the chart's metadata directory under
/// `/var/run`) an fsync waits for nothing, so the committing thread writes
/// them itself: a thread started per batch would only add its start.
pub(super) fn claim_file_workers(dirs: &[&Path]) -> usize {
    if dirs.iter().all(|dir| on_tmpfs(dir)) {
        1
    } else {
        CDI_WORKERS
    }
}

/// Whether `path`, or its nearest existing ancestor (a directory made at
/// the first write), is on a tmpfs. Unknown counts as not.
fn on_tmpfs(path: &Path) -> bool {
    let Some(existing) = path.ancestors().find(|p| p.exists()) else {
        return false;
    };
    nix::sys::statfs::statfs(existing)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Why a claim's files could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ClaimFilesError {
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Cdi(#[from] CdiError),
}

impl Driver {
    /// The CDI spec a prepared claim should have, and its metadata files
    /// when those are on.
    pub(super) fn claim_spec(
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
    pub(super) fn write_claim(&self, assignment: &ClaimAssignment) -> Result<(), ClaimFilesError> {
        let (spec, files) = self.claim_spec(assignment)?;
        if let (Some(metadata), Some(files)) = (&self.metadata, &files) {
            metadata.write(files)?;
        }
        Ok(self.cdi.write_spec(&assignment.claim_uid, &spec)?)
    }

    /// The CDI spec first (no container can be given the claim any more),
    /// then the metadata files it mounted. Once the spec is gone nothing
    /// mounts those files again, so one that cannot be removed is logged and
    /// left for the next start's sweep, not made a reason to keep the
    /// claim's CPUs.
    pub(super) fn remove_claim_files(&self, claim: &ClaimRef) -> Result<(), ClaimFilesError> {
        match self.cdi.remove(&claim.uid) {
            Ok(()) => {}
            // A UID we could never have written a spec for: nothing to do.
            Err(CdiError::BadClaimUid(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        if let Some(metadata) = &self.metadata {
            if let Err(error) = metadata.remove(&claim.namespace, &claim.name, &claim.uid) {
                tracing::warn!(
                    claim_uid = %claim.uid, %error,
                    "the claim's device metadata files could not be removed; nothing mounts them any more, and each start tries again to remove what no prepared claim explains"
                );
            }
        }
        Ok(())
    }
}

/// `f` over `items` on up to `workers` threads, results in order. A panic
/// in a worker is re-raised here.
pub(super) fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 || workers <= 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(items.len().min(workers));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// On tmpfs (a directory not made yet counts by its parent) the
    /// committing thread writes the files; anywhere else, or when one of
    /// the directories is elsewhere, the fsyncs overlap on worker threads.
    #[test]
    fn claim_files_are_written_in_parallel_only_off_tmpfs() {
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("tempdir");
        assert_eq!(claim_file_workers(&[disk.path()]), CDI_WORKERS);
        assert_eq!(claim_file_workers(&[Path::new("/proc/self")]), CDI_WORKERS);
        let shm = Path::new("/dev/shm");
        if !on_tmpfs(shm) {
            eprintln!("/dev/shm is not a tmpfs here: the tmpfs cases are not checked");
            return;
        }
        let not_made = shm.join("dra-cpu-test-not-made/cdi");
        assert_eq!(claim_file_workers(&[shm, &not_made]), 1);
        assert_eq!(claim_file_workers(&[shm, disk.path()]), CDI_WORKERS);
    }

    #[test]
    fn in_parallel_keeps_the_order_with_any_number_of_workers() {
        let items: Vec<u32> = (0..37).collect();
        for workers in [0, 1, 2, 16, 64] {
            let doubled = in_parallel(&items, workers, |i| i * 2);
            assert_eq!(doubled, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        }
    }
}
