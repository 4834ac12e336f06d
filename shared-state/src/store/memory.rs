//! An [`AssignmentStore`] held in memory, for tests of its callers.

use super::{
    apply_to_map, apply_to_map_each, number_ops, AssignmentStore, LenientListing, StoreError,
    StoreOp,
};
use crate::assignment::ClaimAssignment;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    records: BTreeMap<String, ClaimAssignment>,
    revision: u64,
}

/// Same semantics as [`super::SledStore`], nothing on disk.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another thread cannot leave State half-updated: every
        // mutation is applied to a copy and swapped in whole.
        crate::sync::lock(&self.state)
    }
}

impl AssignmentStore for MemoryStore {
    fn get(&self, claim_uid: &str) -> Result<Option<ClaimAssignment>, StoreError> {
        Ok(self.lock().records.get(claim_uid).cloned())
    }

    fn list_lenient(&self) -> Result<LenientListing, StoreError> {
        Ok(LenientListing {
            records: self.lock().records.values().cloned().collect(),
            bad: Vec::new(),
        })
    }

    fn revision(&self) -> Result<u64, StoreError> {
        Ok(self.lock().revision)
    }

    fn remove(&self, claim_uid: &str) -> Result<Option<u64>, StoreError> {
        // Check and apply under one lock so a concurrent writer cannot make
        // the revision comparison of the default method lie.
        let mut state = self.lock();
        if !state.records.contains_key(claim_uid) {
            return Ok(None);
        }
        apply_locked(&mut state, &[StoreOp::Remove(claim_uid.to_string())]).map(Some)
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<u64, StoreError> {
        apply_locked(&mut self.lock(), ops)
    }

    fn apply_numbered(&self, ops: &[StoreOp]) -> Result<Vec<Option<u64>>, StoreError> {
        let mut state = self.lock();
        let mut records = state.records.clone();
        let changed = apply_to_map_each(&mut records, ops)?;
        let numbered = number_ops(state.revision, &changed, std::path::Path::new("memory"))?;
        if let Some(last) = numbered.iter().flatten().last() {
            state.revision = *last;
        }
        state.records = records;
        Ok(numbered)
    }
}

fn apply_locked(state: &mut State, ops: &[StoreOp]) -> Result<u64, StoreError> {
    let mut records = state.records.clone();
    if !apply_to_map(&mut records, ops)? {
        return Ok(state.revision);
    }
    let revision = state
        .revision
        .checked_add(1)
        .ok_or(StoreError::RevisionExhausted {
            path: "memory".into(),
            current: state.revision,
        })?;
    state.records = records;
    state.revision = revision;
    Ok(revision)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_numbered_batch, record, refused_batch};
    use super::*;

    /// The claim UIDs stored, in order.
    fn uids(store: &MemoryStore) -> Vec<String> {
        store
            .list()
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.claim_uid)
            .collect()
    }

    #[test]
    fn round_trip_and_revisions() {
        let store = MemoryStore::new();
        assert_eq!(store.revision().ok(), Some(0));
        assert_eq!(store.put(&record("b", "2")).ok(), Some(1));
        assert_eq!(store.put(&record("a", "1")).ok(), Some(2));
        assert_eq!(store.get("a").ok().flatten(), Some(record("a", "1")));
        assert_eq!(uids(&store), ["a", "b"]);
        assert_eq!(store.remove("a").ok(), Some(Some(3)));
        assert_eq!(store.remove("a").ok(), Some(None));
        assert_eq!(store.revision().ok(), Some(3));
    }

    #[test]
    fn numbered_batch_gives_one_revision_per_change() {
        let store = MemoryStore::new();
        check_numbered_batch(&store);
        assert_eq!(store.revision().ok(), Some(4));
        assert_eq!(uids(&store), ["a", "b"]);
        assert!(store.apply_numbered(&refused_batch()).is_err());
        assert_eq!(store.revision().ok(), Some(4));
        assert_eq!(store.get("z").ok(), Some(None));
    }

    #[test]
    fn refused_batch_leaves_state_untouched() {
        let store = MemoryStore::new();
        let ops = [
            StoreOp::Put(record("a", "1")),
            StoreOp::Remove(String::new()),
        ];
        assert!(store.apply(&ops).is_err());
        assert_eq!(store.get("a").ok(), Some(None));
        assert_eq!(store.revision().ok(), Some(0));
    }
}
