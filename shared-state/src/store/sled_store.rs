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

use super::{
    claim_key, decode_record, number_ops, parse_counter, validate_ops, AssignmentStore, BadRecord,
    LenientListing, StoreError, StoreOp, CLAIM_KEY_PREFIX, INITIALIZED_FILE, OWNER_PID_FILE,
    REVISION_KEY, SCHEMA_KEY, SCHEMA_VERSION,
};
use crate::assignment::ClaimAssignment;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// sled's wording when another open file description holds its lock
/// (0.34.7, `Config::try_lock`).
const SLED_LOCK_MESSAGE: &str = "could not acquire lock";

/// sled's log file inside the store directory (0.34.7, `Config::db_path`).
const SLED_DATA_FILE: &str = "db";

/// A claim record encoded for writing: key and, for puts, the JSON value.
type EncodedOp = (String, Option<Vec<u8>>);

/// Assignment store in a sled database directory.
pub struct SledStore {
    db: sled::Db,
    dir: PathBuf,
    /// sled's log file, opened separately only to fdatasync it. flock
    /// (which sled uses) belongs to sled's own descriptor, so this one
    /// neither takes nor releases the lock.
    data_file: std::fs::File,
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
        let db = open_waiting_for_release(dir)?;
        let data_path = dir.join(SLED_DATA_FILE);
        let data_file = std::fs::File::open(&data_path).map_err(|source| StoreError::DataFile {
            path: data_path,
            source,
        })?;
        let store = SledStore {
            db,
            data_file,
            dir: dir.to_path_buf(),
            writer: Mutex::new(()),
        };
        store.check_schema()?;
        // Refuse to open a store whose counter cannot be read, rather than
        // fail at the first prepare.
        store.revision()?;
        store.write_owner_pid()?;
        Ok(store)
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
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| self.backend("flush", e))?;
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
            let current = match tx.get(REVISION_KEY)? {
                None => 0,
                Some(raw) => parse_counter(&raw).ok_or_else(|| {
                    ConflictableTransactionError::Abort(self.corrupt(format!(
                        "key {REVISION_KEY} holds {:?}, not a revision",
                        String::from_utf8_lossy(&raw)
                    )))
                })?,
            };
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
            let current = match tx.get(REVISION_KEY)? {
                None => 0,
                Some(raw) => parse_counter(&raw).ok_or_else(|| {
                    ConflictableTransactionError::Abort(self.corrupt(format!(
                        "key {REVISION_KEY} holds {:?}, not a revision",
                        String::from_utf8_lossy(&raw)
                    )))
                })?,
            };
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
            Ok(changed.then_some(revision))
        })
    }

    fn revision(&self) -> Result<u64, StoreError> {
        self.shielded("read revision", || {
            match self
                .db
                .get(REVISION_KEY)
                .map_err(|e| self.backend("read revision", e))?
            {
                None => Ok(0),
                Some(raw) => parse_counter(&raw).ok_or_else(|| {
                    self.corrupt(format!(
                        "key {REVISION_KEY} holds {:?}, not a revision",
                        String::from_utf8_lossy(&raw)
                    ))
                }),
            }
        })
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<u64, StoreError> {
        let encoded = encode_ops(ops)?;
        let _writer = self.lock_writer();
        self.shielded("apply", || {
            let (revision, _changed) = self.commit(&encoded)?;
            self.flush()?;
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
            Ok(numbered)
        })
    }
}

/// How long `open` waits for a lock that no other live process holds.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(3);

/// Open the sled database, waiting a bounded time for a lock that is
/// being released.
///
/// sled drops its file lock only when its background threads let go of the
/// data file, a few milliseconds after the last handle is dropped, so a
/// reopen in the same process (a store reopened after a fault, every test)
/// can find the lock still held by nobody. A lock whose recorded holder is
/// another live process is refused at once, naming it (a second
/// dra-plugin); a holder that cannot be named is waited for, then refused.
fn open_waiting_for_release(dir: &Path) -> Result<sled::Db, StoreError> {
    let deadline = Instant::now() + LOCK_RELEASE_WAIT;
    let mut pause = Duration::from_millis(2);
    loop {
        let attempt = shielded(dir, "open", || {
            sled::Config::new()
                .path(dir)
                .open()
                .map_err(|source| open_error(dir, source))
        });
        match attempt {
            Err(StoreError::Locked { holder, .. })
                if holder.is_none_or(|pid| pid == std::process::id())
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Classify an error from `sled::Config::open`.
fn open_error(dir: &Path, source: sled::Error) -> StoreError {
    match &source {
        sled::Error::Io(io) if io.to_string().contains(SLED_LOCK_MESSAGE) => StoreError::Locked {
            path: dir.to_path_buf(),
            holder: read_holder(dir),
        },
        sled::Error::Corruption { .. } => StoreError::Corrupt {
            path: dir.to_path_buf(),
            detail: source.to_string(),
        },
        _ => StoreError::Backend {
            path: dir.to_path_buf(),
            operation: "open",
            source,
        },
    }
}

/// The pid recorded by the current holder, if it names a live process.
fn read_holder(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join(OWNER_PID_FILE)).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    Path::new("/proc")
        .join(pid.to_string())
        .exists()
        .then_some(pid)
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
    use super::super::tests::record;
    use super::*;

    #[test]
    fn open_error_classifies_lock_message() {
        let dir = Path::new("/nonexistent/dra-cpu-store");
        let lock = sled::Error::Io(std::io::Error::other(
            "could not acquire lock on \"/x/db\": Os { code: 11 }",
        ));
        assert!(matches!(
            open_error(dir, lock),
            StoreError::Locked { holder: None, .. }
        ));
        let other = sled::Error::Io(std::io::Error::other("disk on fire"));
        assert!(matches!(
            open_error(dir, other),
            StoreError::Backend {
                operation: "open",
                ..
            }
        ));
    }

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
        assert_eq!(store.put(&record("old", "7")).unwrap(), 1);
        let ops = [
            StoreOp::Put(record("a", "0")),
            StoreOp::Remove("absent".into()),
            StoreOp::Remove("old".into()),
            StoreOp::Put(record("b", "1")),
        ];
        assert_eq!(
            store.apply_numbered(&ops).unwrap(),
            vec![Some(2), None, Some(3), Some(4)]
        );
        let refused = [
            StoreOp::Put(record("z", "1")),
            StoreOp::Remove(String::new()),
        ];
        assert!(matches!(
            store.apply_numbered(&refused),
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
