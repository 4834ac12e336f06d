//! Opening a store that may be damaged or rolled back: the check on a copy,
//! the committed-revision file that catches a log cut short, and waiting
//! for sled's file lock to be released.

use super::{shielded, SledStore, COMMITTED_WIDTH, SLED_DATA_FILE, SLED_LOCK_MESSAGE};
use crate::store::{parse_counter, StoreError, COMMITTED_FILE, OWNER_PID_FILE, REVISION_KEY};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Subdirectory of the store in which `open` checks a copy of it.
const CHECK_DIR: &str = "open-check";

/// Open a copy of the store in `dir`, if it holds one, and relay any
/// refusal naming `dir`. The check is skipped, leaving the open in place
/// to answer, when the data file is locked by another opener or the copy
/// cannot be made (a full disk).
pub(super) fn check_on_copy(dir: &Path) -> Result<(), StoreError> {
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
pub(super) fn lock_data_file(dir: &Path) -> Option<std::fs::File> {
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
pub(super) fn copy_store(dir: &Path, to: &Path) -> std::io::Result<()> {
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
pub(super) fn relocate(mut err: StoreError, from: &Path, to: &Path) -> StoreError {
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
pub(super) fn read_revision(db: &sled::Db, dir: &Path) -> Result<u64, StoreError> {
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

pub(super) fn committed_text(revision: u64) -> String {
    format!("{revision:0width$}\n", width = COMMITTED_WIDTH)
}

/// Open [`COMMITTED_FILE`] and check it against the data's `revision`.
///
/// Refuses, changing nothing, if the file records a later revision than
/// the data holds (commits were lost) or cannot be read as a revision. A
/// missing file (a store written before it existed, or a crash before its
/// first sync) is created; one that lags the data is raised to it.
pub(super) fn open_committed(dir: &Path, revision: u64) -> Result<std::fs::File, StoreError> {
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
pub(super) fn parse_committed(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let digits = text.strip_suffix('\n')?;
    if digits.len() != COMMITTED_WIDTH || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// How long `open` waits for a lock that no other live process holds.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(3);

/// sled's page cache. The store holds one small record per prepared claim;
/// sled's default (1 GiB) exceeds a pod's memory limit, and sled then logs
/// an ERROR at every start (`cache capacity is limited to the cgroup memory
/// limit`) although nothing is wrong.
const STORE_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Open the sled database, waiting a bounded time for a lock that is
/// being released.
///
/// sled drops its file lock only when its background threads let go of the
/// data file, a few milliseconds after the last handle is dropped, so a
/// reopen in the same process (a store reopened after a fault, every test)
/// can find the lock still held by nobody. A lock whose recorded holder is
/// another live process is refused at once, naming it (a second
/// dra-plugin); a holder that cannot be named is waited for, then refused.
pub(super) fn open_waiting_for_release(dir: &Path) -> Result<sled::Db, StoreError> {
    waiting_for_release(|| {
        shielded(dir, "open", || {
            sled::Config::new()
                .path(dir)
                .cache_capacity(STORE_CACHE_BYTES)
                .open()
                .map_err(|source| open_error(dir, source))
        })
    })
}

/// Retry `attempt` while it meets a lock that no other live process holds
/// (sled releases its lock a few milliseconds after the last handle drops),
/// for up to [`LOCK_RELEASE_WAIT`].
pub(super) fn waiting_for_release<T>(
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
pub(super) fn open_error(dir: &Path, source: sled::Error) -> StoreError {
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
pub(super) fn read_holder(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join(OWNER_PID_FILE)).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    Path::new("/proc")
        .join(pid.to_string())
        .exists()
        .then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::super::SledStore;
    use super::*;
    use crate::store::tests::record;
    use crate::store::AssignmentStore;

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
}
