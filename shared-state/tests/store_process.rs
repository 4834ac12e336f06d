//! The assignment store across real OS processes: the exclusive lock seen
//! from a second process, and durability of acknowledged commits under
//! SIGKILL at random moments.
//!
//! The second process is this test binary run again with
//! `child_process_entry` selected and `STORE_CHILD_MODE` set.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared_state::store::sled_store::SledStore;
use shared_state::store::{apply_to_map, AssignmentStore, StoreError, StoreOp};
use shared_state::{AllocatedDevice, ClaimAssignment, CpuSet};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const MODE_ENV: &str = "STORE_CHILD_MODE";
const DIR_ENV: &str = "STORE_CHILD_DIR";
const START_ENV: &str = "STORE_CHILD_START";
const OPEN_MARK: &str = "STORE-OPEN ";
const ACK_MARK: &str = "STORE-ACK ";
/// Upper bound on ops one committing child performs if never killed.
const CHILD_MAX_OPS: u64 = 5_000;

fn record(uid: String, seq: u64) -> ClaimAssignment {
    ClaimAssignment {
        namespace: "team-a".to_string(),
        name: format!("claim-{uid}"),
        consumer_pods: vec![format!("pod-{seq}")],
        devices: vec![AllocatedDevice {
            request: "cpus".to_string(),
            pool: "node-a".to_string(),
            device: "cpudevnuma000".to_string(),
            consumed_cpus: Some(1),
            share_id: None,
        }],
        cpus: [(seq % 64) as u32].into_iter().collect::<CpuSet>(),
        prepared_at_unix_ms: seq,
        pod_claim_name: None,
        tuning: Default::default(),
        claim_uid: uid,
    }
}

/// The deterministic op sequence the committing child runs. Every op changes
/// the store, so the revision after op `i` is exactly `i + 1`.
fn op_batch(i: u64) -> Vec<StoreOp> {
    match i % 4 {
        // Remove the claim op i-1 put.
        3 => vec![StoreOp::Remove(format!("claim-{}", i - 1))],
        // A group commit of two prepares.
        2 => vec![
            StoreOp::Put(record(format!("claim-{i}"), i)),
            StoreOp::Put(record(format!("batch-{i}"), i)),
        ],
        _ => vec![StoreOp::Put(record(format!("claim-{i}"), i))],
    }
}

/// What the store holds after the first `n` ops.
fn model_after(n: u64) -> Vec<ClaimAssignment> {
    let mut map = BTreeMap::new();
    for i in 0..n {
        assert!(apply_to_map(&mut map, &op_batch(i)).unwrap());
    }
    map.into_values().collect()
}

fn random_below(bound: u64) -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    hasher.finish() % bound
}

fn spawn_child(mode: &str, dir: &Path, start: u64, stderr_path: &Path) -> Child {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env(MODE_ENV, mode)
        .env(DIR_ENV, dir)
        .env(START_ENV, start.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr_path).unwrap())
        .spawn()
        .unwrap()
}

/// Parse a protocol line; the test harness may print its own text before
/// our mark on the same line.
fn marked<'a>(line: &'a str, mark: &str) -> Option<&'a str> {
    line.find(mark).map(|at| line[at + mark.len()..].trim())
}

/// Entry point of the child process; does nothing when run without the
/// environment the parent tests set.
#[test]
#[ignore = "child process of the lock and kill -9 tests, which run it themselves"]
fn child_process_entry() {
    let Ok(mode) = std::env::var(MODE_ENV) else {
        return;
    };
    let dir = std::path::PathBuf::from(std::env::var(DIR_ENV).unwrap());
    let store = SledStore::open(&dir).unwrap();
    let mut out = std::io::stdout();
    match mode.as_str() {
        "hold" => {
            writeln!(out, "{OPEN_MARK}{}", std::process::id()).unwrap();
            out.flush().unwrap();
            // Hold the store until the parent closes our stdin.
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        }
        "commit" => {
            let start: u64 = std::env::var(START_ENV).unwrap().parse().unwrap();
            for i in start..start + CHILD_MAX_OPS {
                let revision = store.apply(&op_batch(i)).unwrap();
                // Printed only after apply returned: this is the acknowledgement.
                writeln!(out, "{ACK_MARK}{i} {revision}").unwrap();
                out.flush().unwrap();
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn second_process_is_refused_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut child = spawn_child("hold", &dir, 0, &tmp.path().join("stderr"));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let holder_pid: u32 = loop {
        let line = lines
            .next()
            .expect("child exited before opening the store")
            .unwrap();
        if let Some(pid) = marked(&line, OPEN_MARK) {
            break pid.parse().unwrap();
        }
    };
    assert_eq!(holder_pid, child.id());

    match SledStore::open(&dir) {
        Err(err @ StoreError::Locked { .. }) => {
            let text = err.to_string();
            let StoreError::Locked { path, holder } = err else {
                unreachable!()
            };
            assert_eq!(path, dir);
            assert_eq!(holder, Some(holder_pid));
            assert!(
                text.contains(&format!("held by pid {holder_pid}")),
                "{text}"
            );
        }
        other => panic!("expected Locked, got {other:?}"),
    }

    // Without the pid file the lock is still detected; the holder is unknown.
    std::fs::remove_file(dir.join("owner.pid")).unwrap();
    assert!(matches!(
        SledStore::open(&dir),
        Err(StoreError::Locked { holder: None, .. })
    ));

    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "holder exited with {status}");
    // The lock dies with its holder.
    let store = SledStore::open(&dir).unwrap();
    assert_eq!(store.revision().unwrap(), 0);
}

#[test]
fn acknowledged_commits_survive_sigkill() {
    const ROUNDS: usize = 20;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let stderr_path = tmp.path().join("stderr");
    // Ops known to be in the store; each round's child continues from here,
    // so later rounds also recover a store that earlier kills left behind.
    let mut committed: u64 = 0;
    let mut in_flight_landed = 0;
    for round in 0..ROUNDS {
        let acks_before_kill = random_below(40);
        let mut child = spawn_child("commit", &dir, committed, &stderr_path);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked: Vec<(u64, u64)> = Vec::new();
        while (acked.len() as u64) < acks_before_kill && read_ack(&mut lines, &mut acked) {}
        // Land the kill at a random point of the next commit.
        std::thread::sleep(std::time::Duration::from_micros(random_below(3_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        // Acknowledgements already in the pipe count too.
        while read_ack(&mut lines, &mut acked) {}
        assert!(
            status.code().is_none(),
            "round {round}: child exited on its own ({status}): {}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );

        for (n, (i, rev)) in acked.iter().enumerate() {
            assert_eq!(*i, committed + n as u64, "round {round}: acks are in order");
            assert_eq!(*rev, i + 1, "round {round}: revision after op {i}");
        }
        let last_acked = committed + acked.len() as u64;

        let store = SledStore::open(&dir).unwrap();
        let revision = store.revision().unwrap();
        assert!(
            revision == last_acked || revision == last_acked + 1,
            "round {round}: revision {revision} after {last_acked} acknowledged ops"
        );
        assert_eq!(
            store.list().unwrap(),
            model_after(revision),
            "round {round}: contents match revision {revision}"
        );
        if revision > last_acked {
            in_flight_landed += 1;
        }
        committed = revision;
    }
    eprintln!(
        "{committed} ops over {ROUNDS} kills; {in_flight_landed} unacknowledged commits landed"
    );
    assert!(committed > 0, "some commits were acknowledged");
}

/// Read up to the next acknowledgement `(op index, revision)`; false at EOF.
fn read_ack(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    acked: &mut Vec<(u64, u64)>,
) -> bool {
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(ack) = marked(&line, ACK_MARK) {
            let (i, rev) = ack.split_once(' ').unwrap();
            acked.push((i.parse().unwrap(), rev.parse().unwrap()));
            return true;
        }
    }
    false
}
