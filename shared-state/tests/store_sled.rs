//! The sled-backed assignment store against real files in a temp directory.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use shared_state::store::memory::MemoryStore;
use shared_state::store::sled_store::SledStore;
use shared_state::store::{AssignmentStore, StoreError, StoreOp, SCHEMA_VERSION};
use shared_state::{AllocatedDevice, ClaimAssignment, CpuSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

fn record(uid: &str, cpus: &str) -> ClaimAssignment {
    ClaimAssignment {
        claim_uid: uid.to_string(),
        namespace: "team-a".to_string(),
        name: format!("claim-{uid}"),
        consumer_pods: vec![format!("pod-{uid}")],
        devices: vec![AllocatedDevice {
            request: "cpus".to_string(),
            pool: "node-a".to_string(),
            device: "cpudevnuma000".to_string(),
            consumed_cpus: Some(2),
            share_id: None,
        }],
        cpus: CpuSet::parse_cpulist(cpus).unwrap(),
        prepared_at_unix_ms: 1_700_000_000_000,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

fn uids(records: &[ClaimAssignment]) -> Vec<&str> {
    records.iter().map(|r| r.claim_uid.as_str()).collect()
}

/// Open the database underneath the store, as an attacker or a damaged disk
/// would see it. The lock of a just-dropped handle is released a few
/// milliseconds late (its background threads still hold the file), so wait.
fn raw_open(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(err) if err.to_string().contains("could not acquire lock") => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "lock never released: {err}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(err) => panic!("raw open of {}: {err}", dir.display()),
        }
    }
}

/// Write raw keys with sled itself, as a damaged or future store would hold.
fn write_raw(dir: &Path, entries: &[(&str, &[u8])]) {
    let db = raw_open(dir);
    for (key, value) in entries {
        db.insert(key.as_bytes(), *value).unwrap();
    }
    db.flush().unwrap();
}

#[test]
fn round_trip_put_get_list_remove() {
    let tmp = tempfile::tempdir().unwrap();
    let store = SledStore::open(&tmp.path().join("store")).unwrap();
    assert_eq!(store.revision().unwrap(), 0);
    assert_eq!(store.get("a").unwrap(), None);

    assert_eq!(store.put(&record("c", "4-5")).unwrap(), 1);
    assert_eq!(store.put(&record("a", "0-1")).unwrap(), 2);
    assert_eq!(store.put(&record("b", "2-3")).unwrap(), 3);
    assert_eq!(store.get("a").unwrap(), Some(record("a", "0-1")));
    assert_eq!(uids(&store.list().unwrap()), ["a", "b", "c"]);

    // Replacing a record is a change and moves the revision.
    assert_eq!(store.put(&record("a", "6")).unwrap(), 4);
    assert_eq!(store.get("a").unwrap().unwrap().cpus.to_cpulist(), "6");

    assert_eq!(store.remove("b").unwrap(), Some(5));
    assert_eq!(store.remove("b").unwrap(), None, "remove is idempotent");
    assert_eq!(store.remove("never").unwrap(), None);
    assert_eq!(
        store.revision().unwrap(),
        5,
        "a no-op remove keeps the revision"
    );
    assert_eq!(uids(&store.list().unwrap()), ["a", "c"]);
}

#[test]
fn directory_is_created_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nested/store");
    let _store = SledStore::open(&dir).unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn reopen_keeps_records_and_revision() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    {
        let store = SledStore::open(&dir).unwrap();
        store.put(&record("a", "0")).unwrap();
        store.put(&record("b", "1")).unwrap();
        store.remove("a").unwrap();
        assert_eq!(store.revision().unwrap(), 3);
    }
    let store = SledStore::open(&dir).unwrap();
    assert_eq!(store.revision().unwrap(), 3);
    assert_eq!(store.list().unwrap(), vec![record("b", "1")]);
    assert_eq!(
        store.put(&record("c", "2")).unwrap(),
        4,
        "revision keeps growing after reopen"
    );
    drop(store);
    let store = SledStore::open(&dir).unwrap();
    assert_eq!(store.revision().unwrap(), 4);
}

#[test]
fn apply_batch_is_one_revision() {
    let tmp = tempfile::tempdir().unwrap();
    let store = SledStore::open(&tmp.path().join("store")).unwrap();
    store.put(&record("old", "7")).unwrap();
    let ops = vec![
        StoreOp::Put(record("a", "0")),
        StoreOp::Put(record("b", "1")),
        StoreOp::Remove("old".to_string()),
        StoreOp::Put(record("a", "2")),
    ];
    assert_eq!(store.apply(&ops).unwrap(), 2);
    assert_eq!(
        store.list().unwrap(),
        vec![record("a", "2"), record("b", "1")]
    );

    assert_eq!(store.apply(&[]).unwrap(), 2, "empty batch");
    assert_eq!(
        store.apply(&[StoreOp::Remove("old".into())]).unwrap(),
        2,
        "batch of no-op removes"
    );

    let refused = store.apply(&[
        StoreOp::Put(record("z", "3")),
        StoreOp::Remove(String::new()),
    ]);
    assert!(matches!(refused, Err(StoreError::EmptyClaimUid)));
    assert_eq!(
        store.get("z").unwrap(),
        None,
        "a refused batch writes nothing"
    );
    assert_eq!(store.revision().unwrap(), 2);
}

#[test]
fn concurrent_writers_get_distinct_revisions() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(&tmp.path().join("store")).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..10)
                    .map(|i| store.put(&record(&format!("t{t}-{i}"), "0")).unwrap())
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut revisions: Vec<u64> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=40).collect::<Vec<u64>>());
    assert_eq!(store.list().unwrap().len(), 40);
}

#[test]
fn newer_schema_is_refused_with_both_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    write_raw(&dir, &[("meta/schema", b"7")]);
    match SledStore::open(&dir) {
        Err(
            err @ StoreError::NewerSchema {
                found: 7,
                supported,
                ..
            },
        ) => {
            assert_eq!(supported, SCHEMA_VERSION);
            let text = err.to_string();
            assert!(
                text.contains('7') && text.contains(&SCHEMA_VERSION.to_string()),
                "{text}"
            );
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
}

#[test]
fn schema_is_written_on_first_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    drop(SledStore::open(&dir).unwrap());
    let db = raw_open(&dir);
    assert_eq!(
        db.get("meta/schema").unwrap().as_deref(),
        Some(SCHEMA_VERSION.to_string().as_bytes())
    );
}

#[test]
fn data_without_schema_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    write_raw(&dir, &[("claim/a", b"{}")]);
    assert!(matches!(
        SledStore::open(&dir),
        Err(StoreError::Corrupt { detail, .. }) if detail.contains("meta/schema")
    ));
}

#[test]
fn garbled_revision_is_refused_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    write_raw(&dir, &[("meta/schema", b"1"), ("meta/revision", b"twelve")]);
    let opened = SledStore::open(&dir);
    assert!(
        matches!(
            &opened,
            Err(StoreError::Corrupt { detail, .. }) if detail.contains("twelve")
        ),
        "{opened:?}"
    );
}

#[test]
fn undecodable_record_is_named_not_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    {
        let store = SledStore::open(&dir).unwrap();
        store.put(&record("good", "0")).unwrap();
    }
    let misplaced = serde_json::to_vec(&record("other", "1")).unwrap();
    write_raw(
        &dir,
        &[
            ("claim/broken-uid", b"{\"claim_uid\": 5"),
            ("claim/misplaced", &misplaced),
        ],
    );
    let store = SledStore::open(&dir).unwrap();

    match store.list() {
        Err(err @ StoreError::BadRecord { .. }) => {
            let text = err.to_string();
            assert!(text.contains("claim/broken-uid"), "{text}");
            assert!(text.contains("line 1"), "serde error is included: {text}");
        }
        other => panic!("expected BadRecord, got {other:?}"),
    }
    assert!(matches!(
        store.get("broken-uid"),
        Err(StoreError::BadRecord { key, .. }) if key == "claim/broken-uid"
    ));

    let listing = store.list_lenient().unwrap();
    assert_eq!(uids(&listing.records), ["good"]);
    let bad_keys: Vec<&str> = listing.bad.iter().map(|b| b.key.as_str()).collect();
    assert_eq!(bad_keys, ["claim/broken-uid", "claim/misplaced"]);
    assert!(
        listing.bad[1].error.contains("\"other\""),
        "{}",
        listing.bad[1].error
    );

    // Removing the bad record repairs the store.
    assert!(store.remove("broken-uid").unwrap().is_some());
    assert!(store.remove("misplaced").unwrap().is_some());
    assert_eq!(uids(&store.list().unwrap()), ["good"]);
}

/// Damage the data file in several ways; opening must return an error or a
/// store that still answers, never panic or abort the process.
#[test]
fn damaged_files_give_errors_not_panics() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 7] = [
        ("db truncated to zero", |d| truncate(&d.join("db"), 0)),
        ("db truncated mid-file", |d| {
            let len = std::fs::metadata(d.join("db")).unwrap().len();
            truncate(&d.join("db"), len / 2)
        }),
        ("db truncated at a quarter", |d| {
            let len = std::fs::metadata(d.join("db")).unwrap().len();
            truncate(&d.join("db"), len / 4)
        }),
        ("db torn in its last write", |d| {
            let len = std::fs::metadata(d.join("db")).unwrap().len();
            truncate(&d.join("db"), len - 40)
        }),
        ("db overwritten with garbage", |d| {
            let len = std::fs::metadata(d.join("db")).unwrap().len() as usize;
            let garbage: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
            std::fs::write(d.join("db"), garbage).unwrap();
        }),
        ("conf garbled", |d| {
            std::fs::write(d.join("conf"), b"not a config").unwrap()
        }),
        ("snapshot garbled", |d| {
            for entry in std::fs::read_dir(d).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                if name.starts_with("snap.") {
                    std::fs::write(&path, b"garbage snapshot").unwrap();
                }
            }
        }),
    ];
    for (name, damage) in damages {
        let must_refuse = name.starts_with("db truncated to zero") || name.contains("garbage");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let written: Vec<ClaimAssignment> = (0..50)
            .map(|i| record(&format!("claim-{i:03}"), "0-1"))
            .collect();
        {
            let store = SledStore::open(&dir).unwrap();
            for assignment in &written {
                store.put(assignment).unwrap();
            }
        }
        damage(&dir);
        let as_found = store_files(&dir);
        // Opening and listing is what a restarting dra-plugin does; either
        // step may refuse, but neither may hand back fewer claims than were
        // written: a forgotten claim's CPUs would be given out twice.
        let outcome = SledStore::open(&dir).and_then(|store| {
            let records = store.list()?;
            let revision = store.revision()?;
            Ok((store, records, revision))
        });
        match outcome {
            Err(err) => {
                let text = err.to_string();
                assert!(
                    text.contains(&dir.display().to_string()),
                    "{name}: error names the store: {text}"
                );
                eprintln!("{name}: refused: {text}");
                assert_eq!(
                    store_files(&dir),
                    as_found,
                    "{name}: a refused store is left as found"
                );
            }
            Ok(_) if must_refuse => panic!("{name}: a wiped data file opened as an empty store"),
            Ok((store, records, revision)) => {
                eprintln!(
                    "{name}: opened with {} records at revision {revision}",
                    records.len()
                );
                assert_eq!(
                    uids(&records),
                    uids(&written),
                    "{name}: opened with records missing and no error"
                );
                assert_eq!(records, written, "{name}: records changed");
                assert_eq!(revision, written.len() as u64, "{name}: revision");
                assert!(
                    store.put(&record("after", "0")).unwrap() > revision,
                    "{name}"
                );
            }
        }
    }
}

/// Every file of the store directory and its contents, sorted by path.
fn store_files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.push((path, bytes));
            }
        }
    }
    files.sort();
    files
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn arb_op() -> impl Strategy<Value = StoreOp> {
    prop_oneof![
        ("[a-e]", 0u32..16).prop_map(|(u, cpu)| StoreOp::Put(record(&u, &cpu.to_string()))),
        "[a-e]".prop_map(StoreOp::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The sled store and the in-memory store agree on every answer for any
    /// sequence of single ops and batches, and still agree after a reopen.
    #[test]
    fn sled_store_matches_memory_store(
        steps in proptest::collection::vec(proptest::collection::vec(arb_op(), 0..4), 1..10)
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let sled_store = SledStore::open(&dir).unwrap();
        let memory = MemoryStore::new();
        for ops in &steps {
            if let [StoreOp::Remove(uid)] = ops.as_slice() {
                prop_assert_eq!(sled_store.remove(uid).unwrap(), memory.remove(uid).unwrap());
            } else {
                prop_assert_eq!(sled_store.apply(ops).unwrap(), memory.apply(ops).unwrap());
            }
            prop_assert_eq!(sled_store.list().unwrap(), memory.list().unwrap());
        }
        drop(sled_store);
        let reopened = SledStore::open(&dir).unwrap();
        prop_assert_eq!(reopened.revision().unwrap(), memory.revision().unwrap());
        prop_assert_eq!(reopened.list().unwrap(), memory.list().unwrap());
        for uid in ["a", "b", "c", "d", "e"] {
            prop_assert_eq!(reopened.get(uid).unwrap(), memory.get(uid).unwrap());
        }
    }
}

#[test]
fn reopen_right_after_drop_waits_for_the_lock_release() {
    // The lock outlives the handle by a few milliseconds; a store reopened
    // after a fault must not fail on it. Several stores cycling at once keep
    // sled's background threads busy, which widens that window.
    let tmp = tempfile::tempdir().unwrap();
    let cycles = 50u32;
    std::thread::scope(|scope| {
        for t in 0..4 {
            let dir = tmp.path().join(format!("store-{t}"));
            scope.spawn(move || {
                for i in 0..cycles {
                    let store = SledStore::open(&dir)
                        .unwrap_or_else(|e| panic!("store {t}, cycle {i}: {e}"));
                    store.put(&record(&format!("c{i}"), "0")).unwrap();
                }
                let store = SledStore::open(&dir).unwrap();
                assert_eq!(store.list().unwrap().len(), cycles as usize);
            });
        }
    });
}
