//! The on-disk [`AssignmentStore`], on sled 0.34.
//!
//! sled flushes in the background only every 500 ms, so every mutation here
//! calls `flush()` before returning. On Linux sled 0.34.7's flush ends in
//! `sync_file_range`, which writes the pages but neither the file's size
//! metadata nor the disk's write cache; a log that grows at its tail is lost
//! on power failure that way. So after sled's flush we `fdatasync` its data
//! file through a descriptor of our own: an `Ok` means the change survives
//! kill -9 and power loss. sled holds an exclusive lock on its data
//! file for as long as the store is open; `owner.pid` next to it lets a
//! refused opener say who holds it.
//!
//! sled recovers a damaged log as its longest valid prefix: a data file
//! cut short opens as an older, self-consistent store, with no error and
//! with the claims committed after the cut silently gone. A counter kept
//! inside sled is cut with it, so the revision of the last durable commit
//! is also written to `committed-revision` beside the data file; `open`
//! refuses a store whose data holds an older revision than that file
//! records, naming the revisions that are missing.
//!
//! sled rewrites parts of its files while opening them (it grows the log to
//! a whole segment, zeroes a torn tail), even when it then turns out to be
//! damaged. So an existing store is first opened on a copy, under a lock on
//! its data file; only a copy that opens cleanly lets the store itself be
//! opened, and a refused store is left byte for byte as found.

mod recovery;

use recovery::{
    check_on_copy, committed_text, open_committed, open_waiting_for_release, read_revision,
};

use super::{
    claim_key, decode_record, number_ops, parse_counter, validate_ops, AssignmentStore, BadRecord,
    LenientListing, StoreError, StoreOp, CLAIM_KEY_PREFIX, COMMITTED_FILE, INITIALIZED_FILE,
    OWNER_PID_FILE, REVISION_KEY, SCHEMA_KEY, SCHEMA_VERSION,
};
use crate::assignment::ClaimAssignment;
use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// sled's wording when another open file description holds its lock
/// (0.34.7, `Config::try_lock`).
const SLED_LOCK_MESSAGE: &str = "could not acquire lock";

/// sled's log file inside the store directory (0.34.7, `Config::db_path`).
const SLED_DATA_FILE: &str = "db";

/// Digits in [`COMMITTED_FILE`]: every value has the same length, so an
/// update is one overwrite of one sector, never a size change.
const COMMITTED_WIDTH: usize = 20;

/// A claim record encoded for writing: key and, for puts, the JSON value.
type EncodedOp = (String, Option<Vec<u8>>);

/// Assignment store in a sled database directory.
pub struct SledStore {
    db: sled::Db,
    dir: PathBuf,
    /// sled's log file, opened separately only to fdatasync it. flock
    /// (which sled uses) belongs to sled's own descriptor, so this one
    /// neither takes nor releases the lock.
    #[cfg_attr(feature = "unsafe-no-sync", allow(dead_code))]
    data_file: std::fs::File,
    /// [`COMMITTED_FILE`], overwritten in place after every durable commit.
    committed: std::fs::File,
    /// Serializes writers: one commit-and-fsync at a time keeps the
    /// revision bump and the "did anything change" answer exact.
    writer: Mutex<()>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").field("dir", &self.dir).finish()
    }
}

impl SledStore {
    /// Open (creating if needed, mode 0700) the store in `dir`.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| StoreError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        check_on_copy(dir)?;
        SledStore::open_in_place(dir)
    }

    fn open_in_place(dir: &Path) -> Result<SledStore, StoreError> {
        let db = open_waiting_for_release(dir)?;
        let data_path = dir.join(SLED_DATA_FILE);
        let data_file = std::fs::File::open(&data_path).map_err(|source| StoreError::DataFile {
            path: data_path,
            source,
        })?;
        let revision = read_revision(&db, dir)?;
        let committed = open_committed(dir, revision)?;
        let store = SledStore {
            db,
            data_file,
            committed,
            dir: dir.to_path_buf(),
            writer: Mutex::new(()),
        };
        store.check_schema()?;
        store.write_owner_pid()?;
        Ok(store)
    }

    /// Record that every commit up to `revision` is durable. Written after
    /// the data file's fdatasync and not synced itself: the value on disk
    /// may lag the data (a later open then raises it) but never lead it,
    /// and a fixed-width overwrite inside one sector is never torn.
    fn record_committed(&self, revision: u64) -> Result<(), StoreError> {
        self.committed
            .write_all_at(committed_text(revision).as_bytes(), 0)
            .map_err(|source| StoreError::CommittedRevision {
                path: self.dir.join(COMMITTED_FILE),
                source,
            })
    }

    /// The directory this store lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn check_schema(&self) -> Result<(), StoreError> {
        self.shielded("read schema", || {
            match self
                .db
                .get(SCHEMA_KEY)
                .map_err(|e| self.backend("read schema", e))?
            {
                Some(raw) => match parse_counter(&raw) {
                    Some(found) if found > SCHEMA_VERSION => Err(StoreError::NewerSchema {
                        path: self.dir.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    }),
                    Some(found) if found >= 1 => {
                        // A crash between the schema flush and the marker
                        // write leaves no marker: write it now.
                        let marker = self.dir.join(INITIALIZED_FILE);
                        if marker.exists() {
                            Ok(())
                        } else {
                            self.write_marker(&marker)
                        }
                    }
                    _ => Err(self.corrupt(format!(
                        "key {SCHEMA_KEY} holds {:?}, not a schema version",
                        String::from_utf8_lossy(&raw)
                    ))),
                },
                None => {
                    let holds_data = self
                        .db
                        .first()
                        .map_err(|e| self.backend("read schema", e))?
                        .is_some();
                    if holds_data {
                        return Err(self.corrupt(format!("data present but no {SCHEMA_KEY} key")));
                    }
                    let marker = self.dir.join(INITIALIZED_FILE);
                    if marker.exists() {
                        return Err(self.corrupt(format!(
                            "{} exists but the database is empty: its data file was \
                             truncated or replaced, prepared claims are lost",
                            marker.display()
                        )));
                    }
                    self.db
                        .insert(SCHEMA_KEY, SCHEMA_VERSION.to_string().as_bytes())
                        .map_err(|e| self.backend("write schema", e))?;
                    self.flush()?;
                    self.write_marker(&marker)
                }
            }
        })
    }

    /// Record durably that this directory holds an initialized store.
    fn write_marker(&self, marker: &Path) -> Result<(), StoreError> {
        let marker_error = |source| StoreError::Marker {
            path: marker.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::create(marker).map_err(marker_error)?;
        writeln!(file, "dra-cpu assignment store, schema {SCHEMA_VERSION}")
            .map_err(marker_error)?;
        file.sync_all().map_err(marker_error)?;
        // The marker's directory entry must be durable too.
        std::fs::File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(marker_error)
    }

    fn write_owner_pid(&self) -> Result<(), StoreError> {
        let path = self.dir.join(OWNER_PID_FILE);
        let tmp = self.dir.join(format!("{OWNER_PID_FILE}.tmp"));
        let pid_error = |source| StoreError::OwnerPid {
            path: path.clone(),
            source,
        };
        // Written beside and renamed, so a reader never sees half a number.
        let mut file = std::fs::File::create(&tmp).map_err(pid_error)?;
        writeln!(file, "{}", std::process::id()).map_err(pid_error)?;
        file.sync_all().map_err(pid_error)?;
        std::fs::rename(&tmp, &path).map_err(pid_error)?;
        Ok(())
    }

    fn lock_writer(&self) -> MutexGuard<'_, ()> {
        // The guarded value is (); a panicking writer leaves nothing to repair.
        crate::sync::lock(&self.writer)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| self.backend("flush", e))?;
        self.sync_data_file()
    }

    #[cfg(not(feature = "unsafe-no-sync"))]
    fn sync_data_file(&self) -> Result<(), StoreError> {
        self.data_file
            .sync_data()
            .map_err(|source| StoreError::DataFile {
                path: self.dir.join(SLED_DATA_FILE),
                source,
            })
    }

    fn backend(&self, operation: &'static str, source: sled::Error) -> StoreError {
        StoreError::Backend {
            path: self.dir.clone(),
            operation,
            source,
        }
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            path: self.dir.clone(),
            detail,
        }
    }

    fn shielded<T>(
        &self,
        operation: &'static str,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        shielded(&self.dir, operation, f)
    }

    /// The revision as a transaction sees it; 0 for a store never written.
    fn revision_in(
        &self,
        tx: &TransactionalTree,
    ) -> Result<u64, ConflictableTransactionError<StoreError>> {
        match tx.get(REVISION_KEY)? {
            None => Ok(0),
            Some(raw) => parse_counter(&raw).ok_or_else(|| {
                ConflictableTransactionError::Abort(self.corrupt(format!(
                    "key {REVISION_KEY} holds {:?}, not a revision",
                    String::from_utf8_lossy(&raw)
                )))
            }),
        }
    }

    /// Commit the encoded ops and the revision bump in one transaction.
    /// Returns the revision after it and whether anything changed.
    fn commit(&self, encoded: &[EncodedOp]) -> Result<(u64, bool), StoreError> {
        let result = self.db.transaction(|tx| {
            let mut changed = false;
            for (key, value) in encoded {
                match value {
                    Some(value) => {
                        tx.insert(key.as_bytes(), value.as_slice())?;
                        changed = true;
                    }
                    None => changed |= tx.remove(key.as_bytes())?.is_some(),
                }
            }
            let current = self.revision_in(tx)?;
            if !changed {
                return Ok((current, false));
            }
            let next = current.checked_add(1).ok_or_else(|| {
                ConflictableTransactionError::Abort(StoreError::RevisionExhausted {
                    path: self.dir.clone(),
                    current,
                })
            })?;
            tx.insert(REVISION_KEY, next.to_string().as_bytes())?;
            Ok((next, true))
        });
        result.map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => self.backend("commit", e),
        })
    }
}

impl SledStore {
    /// The power-cut storm's control (scripts/power-cut-storm.sh
    /// --no-sync-control): sled's own flush still runs (its writes reach the
    /// disk through sync_file_range, so a SIGKILL loses nothing), but the
    /// data file's size and block map are left to the filesystem's next
    /// journal commit. A cut before that commit must lose acknowledged
    /// claims, or the storm could not tell a store that syncs from one that
    /// does not.
    #[cfg(feature = "unsafe-no-sync")]
    fn sync_data_file(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Commit the encoded ops in one transaction, each op that changes
    /// something taking the next revision. Returns the revision of each op.
    fn commit_numbered(&self, encoded: &[EncodedOp]) -> Result<Vec<Option<u64>>, StoreError> {
        let result = self.db.transaction(|tx| {
            // Recomputed on every attempt: sled may rerun a transaction.
            let mut changed = Vec::with_capacity(encoded.len());
            for (key, value) in encoded {
                changed.push(match value {
                    Some(value) => {
                        tx.insert(key.as_bytes(), value.as_slice())?;
                        true
                    }
                    None => tx.remove(key.as_bytes())?.is_some(),
                });
            }
            let current = self.revision_in(tx)?;
            let numbered = number_ops(current, &changed, &self.dir)
                .map_err(ConflictableTransactionError::Abort)?;
            if let Some(last) = numbered.iter().flatten().last() {
                tx.insert(REVISION_KEY, last.to_string().as_bytes())?;
            }
            Ok(numbered)
        });
        result.map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => self.backend("commit", e),
        })
    }
}

fn encode_ops(ops: &[StoreOp]) -> Result<Vec<EncodedOp>, StoreError> {
    validate_ops(ops)?;
    ops.iter()
        .map(|op| match op {
            StoreOp::Put(assignment) => serde_json::to_vec(assignment)
                .map(|value| (claim_key(&assignment.claim_uid), Some(value)))
                .map_err(|e| StoreError::Encode {
                    claim_uid: assignment.claim_uid.clone(),
                    error: e.to_string(),
                }),
            StoreOp::Remove(claim_uid) => Ok((claim_key(claim_uid), None)),
        })
        .collect()
}

impl Drop for SledStore {
    fn drop(&mut self) {
        // Still holding the lock here (the Db drops after this body), so no
        // other process can have written its own pid yet.
        let _ = std::fs::remove_file(self.dir.join(OWNER_PID_FILE));
    }
}

impl AssignmentStore for SledStore {
    fn get(&self, claim_uid: &str) -> Result<Option<ClaimAssignment>, StoreError> {
        let key = claim_key(claim_uid);
        self.shielded("get", || {
            let Some(raw) = self.db.get(&key).map_err(|e| self.backend("get", e))? else {
                return Ok(None);
            };
            decode_record(&key, &raw)
                .map(Some)
                .map_err(|bad| StoreError::BadRecord {
                    key: bad.key,
                    error: bad.error,
                })
        })
    }

    fn list_lenient(&self) -> Result<LenientListing, StoreError> {
        self.shielded("list", || {
            let mut listing = LenientListing::default();
            for item in self.db.scan_prefix(CLAIM_KEY_PREFIX) {
                let (key, value) = item.map_err(|e| self.backend("list", e))?;
                let key = String::from_utf8_lossy(&key).into_owned();
                match decode_record(&key, &value) {
                    Ok(record) => listing.records.push(record),
                    Err(bad) => listing.bad.push(bad),
                }
            }
            // Keys are scanned in byte order, which is the UID's string order;
            // sort anyway so the contract does not rest on the engine.
            listing
                .records
                .sort_by(|a, b| a.claim_uid.cmp(&b.claim_uid));
            listing.bad.sort_by(|a: &BadRecord, b| a.key.cmp(&b.key));
            Ok(listing)
        })
    }

    fn remove(&self, claim_uid: &str) -> Result<Option<u64>, StoreError> {
        validate_ops(&[StoreOp::Remove(claim_uid.to_string())])?;
        let encoded = [(claim_key(claim_uid), None)];
        let _writer = self.lock_writer();
        self.shielded("remove", || {
            let (revision, changed) = self.commit(&encoded)?;
            // Flush even when nothing changed: a retried remove whose first
            // attempt committed but failed to flush must not be acknowledged
            // before the removal is durable.
            self.flush()?;
            self.record_committed(revision)?;
            Ok(changed.then_some(revision))
        })
    }

    fn revision(&self) -> Result<u64, StoreError> {
        read_revision(&self.db, &self.dir)
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<u64, StoreError> {
        let encoded = encode_ops(ops)?;
        let _writer = self.lock_writer();
        self.shielded("apply", || {
            let (revision, _changed) = self.commit(&encoded)?;
            self.flush()?;
            self.record_committed(revision)?;
            Ok(revision)
        })
    }

    fn apply_numbered(&self, ops: &[StoreOp]) -> Result<Vec<Option<u64>>, StoreError> {
        let encoded = encode_ops(ops)?;
        let _writer = self.lock_writer();
        self.shielded("apply", || {
            let numbered = self.commit_numbered(&encoded)?;
            // Flushed even when nothing changed, as `remove` does: a retry of
            // a commit that landed but failed to flush must not be
            // acknowledged before it is durable.
            self.flush()?;
            if let Some(last) = numbered.iter().flatten().last() {
                self.record_committed(*last)?;
            }
            Ok(numbered)
        })
    }
}

/// Run a storage-engine call, turning a panic inside it into
/// `StoreError::Corrupt`: sled asserts on some damaged files instead of
/// returning an error, and a damaged file is input, not a bug of ours.
fn shielded<T>(
    dir: &Path,
    operation: &'static str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        Err(StoreError::Corrupt {
            path: dir.to_path_buf(),
            detail: format!("storage engine panicked during {operation}: {message}"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_numbered_batch, record, refused_batch};
    use super::*;

    #[test]
    fn shielded_turns_panic_into_corrupt() {
        let dir = Path::new("/var/lib/dra-cpu/store");
        let result: Result<(), StoreError> = shielded(dir, "open", || panic!("bad segment"));
        match result {
            Err(StoreError::Corrupt { path, detail }) => {
                assert_eq!(path, dir);
                assert!(detail.contains("bad segment"), "{detail}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn numbered_batch_is_durable_with_one_revision_per_change() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let store = SledStore::open(&dir).unwrap();
        check_numbered_batch(&store);
        assert!(matches!(
            store.apply_numbered(&refused_batch()),
            Err(StoreError::EmptyClaimUid)
        ));
        drop(store);
        let reopened = SledStore::open(&dir).unwrap();
        assert_eq!(reopened.revision().unwrap(), 4);
        assert_eq!(
            reopened.list().unwrap(),
            vec![record("a", "0"), record("b", "1")]
        );
    }

    #[test]
    fn owner_pid_written_and_removed_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let store = SledStore::open(&dir).unwrap();
        let text = std::fs::read_to_string(dir.join(OWNER_PID_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        assert_eq!(store.put(&record("a", "1")).unwrap(), 1);
        drop(store);
        assert!(!dir.join(OWNER_PID_FILE).exists());
    }
}
