//! A real store behind a check of every commit, for tests that make the
//! disk fail or hold a commit while others queue behind it.

use shared_state::store::{AssignmentStore, LenientListing, StoreError, StoreOp};
use shared_state::ClaimAssignment;
use std::sync::Arc;

/// What a test does with a commit before the real store sees it: `Err`
/// refuses the commit, as a failing disk would.
pub trait CommitCheck: Send + Sync {
    /// Before a single commit (`apply`).
    fn apply(&self, _ops: &[StoreOp]) -> Result<(), StoreError> {
        Ok(())
    }

    /// Before a batch with a revision for each op (`apply_numbered`).
    fn apply_numbered(&self, _ops: &[StoreOp]) -> Result<(), StoreError> {
        Ok(())
    }
}

/// `inner` with every commit passed through `check` first; reads go
/// straight to `inner`. The check's own state is reached through `Deref`.
pub struct CheckedStore<C> {
    inner: Arc<dyn AssignmentStore>,
    check: C,
}

impl<C: CommitCheck> CheckedStore<C> {
    pub fn new(inner: Arc<dyn AssignmentStore>, check: C) -> Arc<CheckedStore<C>> {
        Arc::new(CheckedStore { inner, check })
    }
}

impl<C> std::ops::Deref for CheckedStore<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.check
    }
}

impl<C: CommitCheck> AssignmentStore for CheckedStore<C> {
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
        self.check.apply(ops)?;
        self.inner.apply(ops)
    }
    fn apply_numbered(&self, ops: &[StoreOp]) -> Result<Vec<Option<u64>>, StoreError> {
        self.check.apply_numbered(ops)?;
        self.inner.apply_numbered(ops)
    }
}

/// The error a sled commit gives when the disk under it fails with `errno`.
pub fn disk_error(errno: i32) -> StoreError {
    StoreError::DataFile {
        path: "/var/lib/dra-cpu/store/db".into(),
        source: std::io::Error::from_raw_os_error(errno),
    }
}
