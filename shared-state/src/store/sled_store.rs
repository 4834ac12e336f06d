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

use super::{
    claim_key, decode_record, number_ops, parse_counter, validate_ops, AssignmentStore, BadRecord,
    LenientListing, StoreError, StoreOp, CLAIM_KEY_PREFIX, COMMITTED_FILE, INITIALIZED_FILE,
    OWNER_PID_FILE, REVISION_KEY, SCHEMA_KEY, SCHEMA_VERSION,
};
use crate::assignment::ClaimAssignment;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// Subdirectory of the store in which `open` checks a copy of it.
const CHECK_DIR: &str = "open-check";

/// Open a copy of the store in `dir`, if it holds one, and relay any
/// refusal naming `dir`. The check is skipped, leaving the open in place
/// to answer, when the data file is locked by another opener or the copy
/// cannot be made (a full disk).
fn check_on_copy(dir: &Path) -> Result<(), StoreError> {
    let Some(_lock) = lock_data_file(dir) else {
        return Ok(());
    };
    let check = dir.join(CHECK_DIR);
    let _ = std::fs::remove_dir_all(&check);
    let result = match copy_store(dir, &check) {
        Ok(()) => SledStore::open_in_place(&check).map(drop),
        Err(_) => Ok(()),
    };
    let _ = std::fs::remove_dir_all(&check);
    result.map_err(|e| relocate(e, &check, dir))
}

/// An exclusive flock on the store's data file (which sled's own lock
/// conflicts with), or `None` if there is no data file or another live
/// process holds it; a lock held by nobody is waited for, as sled's is.
fn lock_data_file(dir: &Path) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(dir.join(SLED_DATA_FILE)).ok()?;
    waiting_for_release(|| {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            Ok(())
        } else {
            Err(StoreError::Locked {
                path: dir.to_path_buf(),
                holder: read_holder(dir),
            })
        }
    })
    .ok()?;
    Some(file)
}

/// Copy the files of the store in `dir` (and its `blobs` directory) into a
/// new directory `to`.
fn copy_store(dir: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(to)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == CHECK_DIR || name == OWNER_PID_FILE {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_file() {
            std::fs::copy(entry.path(), to.join(&name))?;
        } else if kind.is_dir() {
            copy_store(&entry.path(), &to.join(&name))?;
        }
    }
    Ok(())
}

/// `err` as raised on the copy in `from`, naming the store in `to`.
fn relocate(mut err: StoreError, from: &Path, to: &Path) -> StoreError {
    if let Some(path) = err.path_mut() {
        if let Ok(rest) = path.strip_prefix(from) {
            // `join("")` would add a trailing separator.
            *path = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
        }
    }
    if let StoreError::Corrupt { detail, .. } = &mut err {
        *detail = detail.replace(&from.display().to_string(), &to.display().to_string());
    }
    err
}

/// The revision counter held in `db`; 0 for a store never written.
fn read_revision(db: &sled::Db, dir: &Path) -> Result<u64, StoreError> {
    shielded(dir, "read revision", || {
        match db.get(REVISION_KEY).map_err(|source| StoreError::Backend {
            path: dir.to_path_buf(),
            operation: "read revision",
            source,
        })? {
            None => Ok(0),
            Some(raw) => parse_counter(&raw).ok_or_else(|| StoreError::Corrupt {
                path: dir.to_path_buf(),
                detail: format!(
                    "key {REVISION_KEY} holds {:?}, not a revision",
                    String::from_utf8_lossy(&raw)
                ),
            }),
        }
    })
}

fn committed_text(revision: u64) -> String {
    format!("{revision:0width$}\n", width = COMMITTED_WIDTH)
}

/// Open [`COMMITTED_FILE`] and check it against the data's `revision`.
///
/// Refuses, changing nothing, if the file records a later revision than
/// the data holds (commits were lost) or cannot be read as a revision. A
/// missing file (a store written before it existed, or a crash before its
/// first sync) is created; one that lags the data is raised to it.
fn open_committed(dir: &Path, revision: u64) -> Result<std::fs::File, StoreError> {
    let path = dir.join(COMMITTED_FILE);
    let io_error = |source| StoreError::CommittedRevision {
        path: path.clone(),
        source,
    };
    let recorded = match std::fs::read(&path) {
        // Created but never synced before a crash: nothing was recorded.
        Ok(bytes) if bytes.iter().all(|&b| b == 0) => None,
        Ok(bytes) => Some(parse_committed(&bytes).ok_or_else(|| StoreError::Corrupt {
            path: dir.to_path_buf(),
            detail: format!(
                "{} holds {:?}, not a revision; the store is left as found",
                path.display(),
                String::from_utf8_lossy(&bytes[..bytes.len().min(64)])
            ),
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(e)),
    };
    if let Some(recorded) = recorded {
        if recorded > revision {
            return Err(StoreError::Corrupt {
                path: dir.to_path_buf(),
                detail: format!(
                    "its data holds revision {revision} but {} records that revision {recorded} \
                     was committed: the commits of revisions {} to {recorded} are missing \
                     (data file truncated, rolled back or replaced), and with them claims \
                     kubelet believes prepared; the store is left as found",
                    path.display(),
                    revision + 1,
                ),
            });
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_error)?;
    if recorded != Some(revision) {
        file.write_all_at(committed_text(revision).as_bytes(), 0)
            .map_err(io_error)?;
        if recorded.is_none() {
            // Synced once, with its directory entry, so that its size is
            // durable before any later in-place overwrite relies on it.
            file.sync_all().map_err(io_error)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_error)?;
        }
    }
    Ok(file)
}

/// The revision in [`COMMITTED_FILE`]'s contents.
fn parse_committed(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let digits = text.strip_suffix('\n')?;
    if digits.len() != COMMITTED_WIDTH || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
    waiting_for_release(|| {
        shielded(dir, "open", || {
            sled::Config::new()
                .path(dir)
                .open()
                .map_err(|source| open_error(dir, source))
        })
    })
}

/// Retry `attempt` while it meets a lock that no other live process holds
/// (sled releases its lock a few milliseconds after the last handle drops),
/// for up to [`LOCK_RELEASE_WAIT`].
fn waiting_for_release<T>(
    mut attempt: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let deadline = Instant::now() + LOCK_RELEASE_WAIT;
    let mut pause = Duration::from_millis(2);
    loop {
        match attempt() {
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

    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.is_file())
            .map(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).unwrap_or_default())
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn store_rolled_back_to_older_files_is_refused_and_left_as_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let old = tmp.path().join("old");
        let store = SledStore::open(&dir).unwrap();
        store.put(&record("a", "0")).unwrap();
        store.put(&record("b", "1")).unwrap();
        drop(store);
        // An older copy of the data (a restored backup, a cut log) ...
        std::fs::create_dir(&old).unwrap();
        for (name, bytes) in files(&dir) {
            std::fs::write(old.join(name), bytes).unwrap();
        }
        let store = SledStore::open(&dir).unwrap();
        store.put(&record("c", "2")).unwrap();
        assert_eq!(store.remove("a").unwrap(), Some(4));
        drop(store);
        let committed = std::fs::read_to_string(dir.join(COMMITTED_FILE)).unwrap();
        assert_eq!(committed, format!("{:020}\n", 4));
        // ... put back under the newer record of what was committed.
        for (name, bytes) in files(&old) {
            if name != COMMITTED_FILE {
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
        let before = files(&dir);
        let err = SledStore::open(&dir).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{text}");
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(
            text.contains("holds revision 2") && text.contains("revisions 3 to 4 are missing"),
            "{text}"
        );
        assert_eq!(files(&dir), before, "a refused store is left as found");
    }

    #[test]
    fn committed_file_created_for_older_stores_and_raised_when_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let store = SledStore::open(&dir).unwrap();
        store.put(&record("a", "0")).unwrap();
        store.put(&record("b", "1")).unwrap();
        drop(store);
        let path = dir.join(COMMITTED_FILE);
        // A store written before the file existed opens and gains it.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(SledStore::open(&dir).unwrap().revision().unwrap(), 2);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), committed_text(2));
        // A record that lags the data (not yet written back at a power
        // loss), or one created but never written, is raised to it.
        for lagging in [committed_text(1).into_bytes(), vec![0; 21], vec![]] {
            std::fs::write(&path, lagging).unwrap();
            let store = SledStore::open(&dir).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), committed_text(2));
            drop(store);
        }
        // One that is not a revision is refused, naming the file.
        std::fs::write(&path, b"fifty\n").unwrap();
        let text = SledStore::open(&dir).unwrap_err().to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert_eq!(std::fs::read(&path).unwrap(), b"fifty\n");
    }

    #[test]
    fn relocated_errors_name_the_store_not_its_copy() {
        let (store, copy) = (Path::new("/var/lib/s"), Path::new("/var/lib/s/open-check"));
        let corrupt = relocate(
            StoreError::Corrupt {
                path: copy.to_path_buf(),
                detail: "/var/lib/s/open-check/committed-revision holds 9".into(),
            },
            copy,
            store,
        );
        assert_eq!(
            corrupt.to_string(),
            "store /var/lib/s is corrupt: /var/lib/s/committed-revision holds 9"
        );
        let data = relocate(
            StoreError::DataFile {
                path: copy.join("db"),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            },
            copy,
            store,
        );
        assert!(data.to_string().contains("file /var/lib/s/db:"), "{data}");
        let locked = relocate(
            StoreError::Locked {
                path: copy.to_path_buf(),
                holder: None,
            },
            copy,
            store,
        );
        assert!(
            locked.to_string().starts_with("store /var/lib/s is locked"),
            "{locked}"
        );
    }

    #[test]
    fn parse_committed_takes_only_the_fixed_width_form() {
        assert_eq!(parse_committed(committed_text(0).as_bytes()), Some(0));
        assert_eq!(
            parse_committed(committed_text(u64::MAX).as_bytes()),
            Some(u64::MAX)
        );
        for bad in [
            &b"7\n"[..],
            b"00000000000000000007",
            b"-0000000000000000007\n",
        ] {
            assert_eq!(parse_committed(bad), None, "{bad:?}");
        }
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
