//! The durable record of prepared claims.
//!
//! dra-plugin acknowledges a prepare only after its assignment is committed
//! here and fsynced, so a crash never forgets a claim kubelet believes is
//! prepared. The store is a trait so that callers can be tested against the
//! in-memory [`MemoryStore`] and so that the on-disk engine (sled, which its
//! maintainers call beta) stays replaceable.
//!
//! Every mutation bumps one revision counter in the same atomic commit as the
//! records it changes. The revision is what the Watch stream orders deltas by
//! and what nri-plugin reports back, so it must never go backwards, not even
//! across a restart.

pub mod memory;
pub mod sled_store;

use crate::assignment::ClaimAssignment;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Schema version this build writes and the newest it can read.
pub const SCHEMA_VERSION: u64 = 1;

/// Key prefix of claim records; the claim UID follows it.
pub const CLAIM_KEY_PREFIX: &str = "claim/";
/// Key of the revision counter (ASCII decimal).
pub const REVISION_KEY: &str = "meta/revision";
/// Key of the schema version (ASCII decimal).
pub const SCHEMA_KEY: &str = "meta/schema";
/// File in the store directory naming the process that holds it open.
pub const OWNER_PID_FILE: &str = "owner.pid";
/// File in the store directory written once the schema key is durable. sled
/// opens a zeroed or replaced data file as an empty database; this marker
/// lets us tell that apart from a new store instead of silently forgetting
/// every prepared claim.
pub const INITIALIZED_FILE: &str = "initialized";
/// File in the store directory holding the revision of the last commit
/// known durable, outside the database: a data file cut back to an older
/// revision is refused instead of opening without the later claims.
pub const COMMITTED_FILE: &str = "committed-revision";

impl StoreError {
    /// The store path the error names, if it names one.
    pub fn path_mut(&mut self) -> Option<&mut PathBuf> {
        match self {
            StoreError::CreateDir { path, .. }
            | StoreError::Locked { path, .. }
            | StoreError::NewerSchema { path, .. }
            | StoreError::Corrupt { path, .. }
            | StoreError::Backend { path, .. }
            | StoreError::OwnerPid { path, .. }
            | StoreError::DataFile { path, .. }
            | StoreError::Marker { path, .. }
            | StoreError::CommittedRevision { path, .. }
            | StoreError::RevisionExhausted { path, .. } => Some(path),
            StoreError::BadRecord { .. }
            | StoreError::EmptyClaimUid
            | StoreError::Encode { .. } => None,
        }
    }
}

/// The key under which a claim's record is stored.
pub fn claim_key(claim_uid: &str) -> String {
    format!("{CLAIM_KEY_PREFIX}{claim_uid}")
}

/// One mutation inside a batch given to [`AssignmentStore::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// Insert or replace the record of `ClaimAssignment::claim_uid`.
    Put(ClaimAssignment),
    /// Remove the record of this claim UID; nothing happens if it is absent.
    Remove(String),
}

/// A stored value that could not be read as a claim record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// The raw key, lossily decoded, e.g. `claim/5f1c…`.
    pub key: String,
    /// Why it could not be decoded.
    pub error: String,
}

/// Every record that decodes, plus the keys of those that do not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LenientListing {
    /// Good records, sorted by claim UID.
    pub records: Vec<ClaimAssignment>,
    /// Records that failed to decode, sorted by key.
    pub bad: Vec<BadRecord>,
}

/// Everything that can go wrong opening or using a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store {path} is locked by another process ({})", holder_text(*.holder))]
    Locked { path: PathBuf, holder: Option<u32> },
    #[error(
        "store {path} was written with schema version {found}, this build supports up to {supported}"
    )]
    NewerSchema {
        path: PathBuf,
        found: u64,
        supported: u64,
    },
    #[error("store {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("record {key} does not decode: {error}")]
    BadRecord { key: String, error: String },
    #[error("claim record has an empty claim UID")]
    EmptyClaimUid,
    #[error("cannot encode record of claim {claim_uid}: {error}")]
    Encode { claim_uid: String, error: String },
    #[error("store {path}: {operation} failed: {source}")]
    Backend {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: sled::Error,
    },
    #[error("cannot write owner pid file {path}: {source}")]
    OwnerPid {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open or fsync store data file {path}: {source}")]
    DataFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write store marker {path}: {source}")]
    Marker {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write store revision record {path}: {source}")]
    CommittedRevision {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("revision counter of store {path} cannot grow past {current}")]
    RevisionExhausted { path: PathBuf, current: u64 },
}

fn holder_text(holder: Option<u32>) -> String {
    match holder {
        Some(pid) => format!("held by pid {pid}"),
        None => "holder unknown".to_string(),
    }
}

/// Durable map from claim UID to its assignment, with a revision counter.
///
/// Mutations are atomic (records and revision together) and durable when
/// they return `Ok`.
pub trait AssignmentStore: Send + Sync {
    /// The record of one claim, if prepared.
    fn get(&self, claim_uid: &str) -> Result<Option<ClaimAssignment>, StoreError>;

    /// Every record and the keys that fail to decode, for diagnostics.
    fn list_lenient(&self) -> Result<LenientListing, StoreError>;

    /// Every record, sorted by claim UID. Refuses, naming the key, if any
    /// record does not decode: a silently skipped claim would let its CPUs be
    /// handed out twice.
    fn list(&self) -> Result<Vec<ClaimAssignment>, StoreError> {
        let listing = self.list_lenient()?;
        match listing.bad.into_iter().next() {
            Some(bad) => Err(StoreError::BadRecord {
                key: bad.key,
                error: bad.error,
            }),
            None => Ok(listing.records),
        }
    }

    /// Insert or replace one record; returns the new revision.
    fn put(&self, assignment: &ClaimAssignment) -> Result<u64, StoreError> {
        self.apply(std::slice::from_ref(&StoreOp::Put(assignment.clone())))
    }

    /// Remove one record; returns the new revision, or `None` if the claim
    /// was not stored (nothing changed, the revision did not move).
    fn remove(&self, claim_uid: &str) -> Result<Option<u64>, StoreError> {
        let before = self.revision()?;
        let after = self.apply(&[StoreOp::Remove(claim_uid.to_string())])?;
        Ok((after != before).then_some(after))
    }

    /// The current revision; 0 for a store never written.
    fn revision(&self) -> Result<u64, StoreError>;

    /// Apply `ops` in order as one atomic, durable commit and return the
    /// revision after it. The revision moves by exactly one if anything
    /// changed (a put always changes; a remove only if the claim was stored)
    /// and not at all otherwise.
    fn apply(&self, ops: &[StoreOp]) -> Result<u64, StoreError>;

    /// Apply `ops` in order as one atomic, durable commit (one flush), giving
    /// each op that changes something its own revision, consecutive from the
    /// revision before the commit. Returns, per op, the revision it was given,
    /// or `None` for a remove of an absent claim. This is the group commit of
    /// concurrent prepares: one fsync for the batch, yet every change keeps
    /// the strictly increasing revision its Watch event is ordered by.
    fn apply_numbered(&self, ops: &[StoreOp]) -> Result<Vec<Option<u64>>, StoreError>;
}

/// The revision each op of a batch is given, from the revision `before` it
/// and whether each op changes something. Errors if the counter would wrap.
pub fn number_ops(
    before: u64,
    changed: &[bool],
    path: &std::path::Path,
) -> Result<Vec<Option<u64>>, StoreError> {
    let mut current = before;
    changed
        .iter()
        .map(|&changes| {
            if !changes {
                return Ok(None);
            }
            current = current
                .checked_add(1)
                .ok_or_else(|| StoreError::RevisionExhausted {
                    path: path.to_path_buf(),
                    current,
                })?;
            Ok(Some(current))
        })
        .collect()
}

/// What a batch does to a map of records, op by op: whether each op changed
/// anything. Nothing is changed if the batch is refused.
pub fn apply_to_map_each(
    records: &mut BTreeMap<String, ClaimAssignment>,
    ops: &[StoreOp],
) -> Result<Vec<bool>, StoreError> {
    validate_ops(ops)?;
    Ok(ops
        .iter()
        .map(|op| match op {
            StoreOp::Put(assignment) => {
                records.insert(assignment.claim_uid.clone(), assignment.clone());
                true
            }
            StoreOp::Remove(claim_uid) => records.remove(claim_uid).is_some(),
        })
        .collect())
}

/// What a batch does to a map of records: the pure rule both stores follow.
/// Returns whether anything changed.
pub fn apply_to_map(
    records: &mut BTreeMap<String, ClaimAssignment>,
    ops: &[StoreOp],
) -> Result<bool, StoreError> {
    Ok(apply_to_map_each(records, ops)?.into_iter().any(|c| c))
}

/// Refuse a batch naming an empty claim UID before anything is written.
fn validate_ops(ops: &[StoreOp]) -> Result<(), StoreError> {
    let empty = ops.iter().any(|op| match op {
        StoreOp::Put(assignment) => assignment.claim_uid.is_empty(),
        StoreOp::Remove(claim_uid) => claim_uid.is_empty(),
    });
    if empty {
        return Err(StoreError::EmptyClaimUid);
    }
    Ok(())
}

/// Decode one stored record, checking that it sits under its own UID's key.
pub fn decode_record(key: &str, value: &[u8]) -> Result<ClaimAssignment, BadRecord> {
    let assignment: ClaimAssignment = serde_json::from_slice(value).map_err(|e| BadRecord {
        key: key.to_string(),
        error: e.to_string(),
    })?;
    let expected = claim_key(&assignment.claim_uid);
    if expected != key {
        return Err(BadRecord {
            key: key.to_string(),
            error: format!(
                "record names claim {:?} but is stored under another key",
                assignment.claim_uid
            ),
        });
    }
    Ok(assignment)
}

/// Parse an ASCII decimal counter stored under a meta key.
fn parse_counter(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::AllocatedDevice;
    use crate::cpuset::CpuSet;
    use proptest::prelude::*;

    pub(crate) fn record(uid: &str, cpus: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: uid.to_string(),
            namespace: "default".to_string(),
            name: format!("claim-{uid}"),
            consumer_pods: vec![format!("pod-{uid}")],
            devices: vec![AllocatedDevice {
                request: "cpus".to_string(),
                pool: "node-a".to_string(),
                device: "cpudevnuma000".to_string(),
                consumed_cpus: Some(2),
                share_id: None,
            }],
            cpus: CpuSet::parse_cpulist(cpus).unwrap_or_default(),
            prepared_at_unix_ms: 1_700_000_000_000,
            pod_claim_name: None,
            tuning: Default::default(),
        }
    }

    /// With "old" stored at revision 1, one numbered batch (put a, remove
    /// an absent claim, remove old, put b) gives each change its own
    /// revision and the no-op none. Leaves a and b at revision 4.
    pub(crate) fn check_numbered_batch(store: &dyn AssignmentStore) {
        assert_eq!(store.put(&record("old", "7")).ok(), Some(1));
        let ops = [
            StoreOp::Put(record("a", "0")),
            StoreOp::Remove("absent".into()),
            StoreOp::Remove("old".into()),
            StoreOp::Put(record("b", "1")),
        ];
        assert_eq!(
            store.apply_numbered(&ops).ok(),
            Some(vec![Some(2), None, Some(3), Some(4)])
        );
    }

    /// A batch the store must refuse whole: a put, then an op with an empty
    /// claim UID.
    pub(crate) fn refused_batch() -> [StoreOp; 2] {
        [
            StoreOp::Put(record("z", "1")),
            StoreOp::Remove(String::new()),
        ]
    }

    #[test]
    fn apply_to_map_table() {
        struct Case {
            name: &'static str,
            initial: &'static [&'static str],
            ops: Vec<StoreOp>,
            changed: bool,
            after: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "empty batch changes nothing",
                initial: &["a"],
                ops: vec![],
                changed: false,
                after: &["a"],
            },
            Case {
                name: "put adds",
                initial: &[],
                ops: vec![StoreOp::Put(record("a", "1"))],
                changed: true,
                after: &["a"],
            },
            Case {
                name: "put of an existing claim still counts as a change",
                initial: &["a"],
                ops: vec![StoreOp::Put(record("a", "1"))],
                changed: true,
                after: &["a"],
            },
            Case {
                name: "remove of an absent claim is a no-op",
                initial: &["a"],
                ops: vec![StoreOp::Remove("b".into())],
                changed: false,
                after: &["a"],
            },
            Case {
                name: "remove of a stored claim",
                initial: &["a", "b"],
                ops: vec![StoreOp::Remove("a".into())],
                changed: true,
                after: &["b"],
            },
            Case {
                name: "ops apply in order: put then remove",
                initial: &[],
                ops: vec![StoreOp::Put(record("a", "1")), StoreOp::Remove("a".into())],
                changed: true,
                after: &[],
            },
        ];
        for case in cases {
            let mut map: BTreeMap<String, ClaimAssignment> = case
                .initial
                .iter()
                .map(|uid| (uid.to_string(), record(uid, "0")))
                .collect();
            let changed = apply_to_map(&mut map, &case.ops);
            assert_eq!(changed.ok(), Some(case.changed), "{}", case.name);
            let keys: Vec<&str> = map.keys().map(String::as_str).collect();
            assert_eq!(keys, case.after, "{}", case.name);
        }
    }

    #[test]
    fn empty_uid_refused_before_any_change() {
        let mut map = BTreeMap::new();
        let ops = [
            StoreOp::Put(record("a", "1")),
            StoreOp::Remove(String::new()),
        ];
        assert!(matches!(
            apply_to_map(&mut map, &ops),
            Err(StoreError::EmptyClaimUid)
        ));
        assert!(map.is_empty());
    }

    #[test]
    fn decode_record_table() {
        let good = serde_json::to_vec(&record("a", "0-3")).unwrap_or_default();
        let cases: [(&str, &[u8], Result<&str, &str>); 4] = [
            ("claim/a", &good, Ok("a")),
            ("claim/b", &good, Err("stored under another key")),
            ("claim/a", b"{not json", Err("key must be a string")),
            ("claim/a", b"", Err("EOF")),
        ];
        for (key, value, want) in cases {
            match (decode_record(key, value), want) {
                (Ok(got), Ok(uid)) => assert_eq!(got.claim_uid, uid),
                (Err(bad), Err(fragment)) => {
                    assert_eq!(bad.key, key);
                    assert!(bad.error.contains(fragment), "{key}: {}", bad.error);
                }
                (got, want) => panic!("{key}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_pod_claim_name_is_kept_and_older_records_still_read() {
        let mut templated = record("a", "0-3");
        templated.pod_claim_name = Some("cpu".into());
        let bytes = serde_json::to_vec(&templated).unwrap_or_default();
        assert_eq!(
            decode_record("claim/a", &bytes).map(|r| r.pod_claim_name),
            Ok(Some("cpu".to_string()))
        );
        // A record without the field is written as before, and one written
        // before the field existed reads as a claim named in the pod spec.
        let plain = serde_json::to_vec(&record("a", "0-3")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&plain).contains("pod_claim_name"));
        let older = br#"{"claim_uid":"a","namespace":"ns","name":"n","consumer_pods":[],"devices":[],"cpus":"0-3","prepared_at_unix_ms":1}"#;
        assert_eq!(
            decode_record("claim/a", older).map(|r| r.pod_claim_name),
            Ok(None)
        );
    }

    #[test]
    fn locked_error_names_the_holder() {
        let known = StoreError::Locked {
            path: "/var/lib/dra-cpu/store".into(),
            holder: Some(42),
        };
        assert!(known.to_string().contains("held by pid 42"));
        let unknown = StoreError::Locked {
            path: "/x".into(),
            holder: None,
        };
        assert!(unknown.to_string().contains("holder unknown"));
    }

    #[test]
    fn parse_counter_table() {
        let cases: [(&[u8], Option<u64>); 5] = [
            (b"0", Some(0)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"", None),
            (b"-1", None),
            (b"\xff", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_counter(raw), want, "{raw:?}");
        }
    }

    fn arb_op() -> impl Strategy<Value = StoreOp> {
        let uid = "[a-d]";
        prop_oneof![
            (uid, 0u32..8).prop_map(|(u, cpu)| StoreOp::Put(record(&u, &cpu.to_string()))),
            uid.prop_map(StoreOp::Remove),
        ]
    }

    #[test]
    fn number_ops_table() {
        let path = std::path::Path::new("/var/lib/dra-cpu/store");
        /// `None` as the answer: the counter would wrap.
        type Numbered = Option<Vec<Option<u64>>>;
        let cases: [(u64, &[bool], Numbered); 5] = [
            (0, &[], Some(vec![])),
            (
                4,
                &[true, true, true],
                Some(vec![Some(5), Some(6), Some(7)]),
            ),
            (4, &[true, false, true], Some(vec![Some(5), None, Some(6)])),
            (9, &[false], Some(vec![None])),
            (u64::MAX - 1, &[true, true], None),
        ];
        for (before, changed, want) in cases {
            let got = number_ops(before, changed, path);
            match want {
                Some(want) => assert_eq!(got.ok(), Some(want), "{before} {changed:?}"),
                None => assert!(
                    matches!(got, Err(StoreError::RevisionExhausted { current, .. }) if current == u64::MAX),
                    "{before} {changed:?}"
                ),
            }
        }
    }

    proptest! {
        /// Numbered revisions are consecutive from `before`, one per change.
        #[test]
        fn numbered_revisions_are_consecutive(before in 0u64..1_000_000, changed in proptest::collection::vec(any::<bool>(), 0..40)) {
            let path = std::path::Path::new("/x");
            let numbered = number_ops(before, &changed, path).unwrap_or_default();
            let given: Vec<u64> = numbered.iter().flatten().copied().collect();
            let want: Vec<u64> = (1..=changed.iter().filter(|c| **c).count() as u64).map(|k| before + k).collect();
            prop_assert_eq!(given, want);
            for (n, c) in numbered.iter().zip(&changed) {
                prop_assert_eq!(n.is_some(), *c);
            }
        }

        /// Applying a batch equals applying its ops one by one, and "changed"
        /// is true exactly when some op was a put or removed a stored claim.
        #[test]
        fn batch_equals_sequence(ops in proptest::collection::vec(arb_op(), 0..12)) {
            let mut batched = BTreeMap::new();
            let batch_changed = apply_to_map(&mut batched, &ops).unwrap_or(false);
            let mut sequential = BTreeMap::new();
            let mut any = false;
            for op in &ops {
                any |= apply_to_map(&mut sequential, std::slice::from_ref(op)).unwrap_or(false);
            }
            prop_assert_eq!(&batched, &sequential);
            prop_assert_eq!(batch_changed, any);
        }
    }
}
