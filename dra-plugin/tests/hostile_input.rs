//! The running daemon against hostile peers and hostile claims: clients
//! that send garbage to or stall on the coordination socket, the modes of
//! every socket, and allocation results that are malformed, name devices of
//! other nodes or ask for more CPUs than exist. Each bad claim gets its own
//! error naming it, leaves nothing on disk, and the daemon keeps serving.
//!
//! `DRA_CPU_FUZZ_CASES` sets the number of generated claims (64 by default).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pod_uid, prepare_ok, Node, RawResult, DRIVER, NODE, WAIT};
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_plugin::devices::DeviceMode;
use proptest::strategy::{Strategy, ValueTree};
use shared_state::CpuSet;
use std::os::unix::fs::PermissionsExt;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

fn cases() -> usize {
    std::env::var("DRA_CPU_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Values drawn from `strategy` with a deterministic runner; the daemon is
/// async, so the cases are drawn first and then run one by one.
fn draw<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .expect("a value from the strategy")
                .current()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_are_owner_only() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    for socket in dra_plugin::run::sockets(&node.config) {
        let mode = std::fs::metadata(&socket)
            .unwrap_or_else(|e| panic!("{}: {e}", socket.display()))
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "{} has mode {mode:o}",
            socket.display()
        );
    }
    let store = node.config.store_dir();
    let mode = std::fs::metadata(&store)
        .expect("store dir")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o077,
        0,
        "store {} has mode {mode:o}",
        store.display()
    );
    running.stop().await.expect("clean stop");
}

/// Garbage writers and stallers on the coordination socket hold no lock
/// that a prepare or another subscriber needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_stalled_coordination_clients_block_nobody() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let socket = node.config.coordination_socket.clone();
    let garbage = draw(
        proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        24,
    );
    let mut held = Vec::new();
    for (i, bytes) in garbage.iter().enumerate() {
        let mut stream = UnixStream::connect(&socket).await.expect("connect");
        match i % 3 {
            // Raw garbage.
            0 => {
                let _ = stream.write_all(bytes).await;
            }
            // The HTTP/2 preface, then garbage frames.
            1 => {
                let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
                let _ = stream.write_all(bytes).await;
            }
            // Connects and says nothing.
            _ => {}
        }
        held.push(stream);
    }
    // Half a preface: a client that stalls mid-handshake.
    let mut half = UnixStream::connect(&socket).await.expect("connect");
    half.write_all(b"PRI * HTTP/2").await.expect("half preface");
    held.push(half);

    let claim = node.claim("busy", &[("cpudevnuma002", Some("4"))], &pod_uid(7));
    let answers = tokio::time::timeout(WAIT, running.kubelet.prepare(std::slice::from_ref(&claim)))
        .await
        .expect("prepare answers while clients stall")
        .expect("prepare");
    assert_eq!(answers[&claim.uid].error, "");
    let report = tokio::time::timeout(WAIT, dra_plugin::cli::inspect_state::from_socket(&socket))
        .await
        .expect("a subscriber is served while others stall")
        .expect("snapshot");
    let held_cpus: Vec<&str> = report
        .claims
        .iter()
        .filter(|c| c.uid == claim.uid)
        .map(|c| c.cpus.as_str())
        .collect();
    assert_eq!(held_cpus.len(), 1, "{report:?}");
    assert_eq!(
        CpuSet::parse_cpulist(held_cpus[0]).expect("cpulist").len(),
        4
    );
    drop(held);
    running
        .stop()
        .await
        .expect("clean stop while clients were stalled");
}

/// One generated allocation result. Names are ones the API server accepts
/// (it validates them): the hostility is in what they refer to.
fn result_strategy() -> impl Strategy<Value = RawResult> {
    use proptest::prelude::*;
    let driver = prop_oneof![
        4 => Just(DRIVER.to_string()),
        1 => "[a-z]{1,8}(\\.[a-z]{1,5})?",
    ];
    let pool = prop_oneof![
        4 => Just(NODE.to_string()),
        1 => Just("node-b".to_string()),
        1 => "[a-z0-9]{1,8}(-[a-z0-9]{1,4})?",
    ];
    let device = prop_oneof![
        3 => (0u32..6).prop_map(|n| format!("cpudevnuma{n:03}")),
        1 => (0u32..300).prop_map(|n| format!("cpudev{n:03}")),
        1 => Just("cpudevmachine".to_string()),
        1 => "[a-z0-9]{1,12}",
    ];
    let capacity = prop_oneof![
        3 => (0i64..40).prop_map(|n| Some(n.to_string())),
        1 => Just(None),
        1 => prop_oneof![
            Just("1.5"), Just("-2"), Just("2k"), Just("1e9"), Just("100Mi"),
            Just("99999999999999999999"), Just("500m"), Just("0.001"),
        ].prop_map(|s| Some(s.to_string())),
    ];
    (driver, pool, device, capacity)
}

/// Generated claims, valid or not: a valid one gets exactly the asked CPUs
/// within the named group; any other is refused with an error naming the
/// claim, without a CDI spec or a store record; the daemon stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_foreign_allocation_results_are_refused_per_claim() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let cases = draw(
        (
            proptest::collection::vec(result_strategy(), 1..4),
            proptest::bool::weighted(0.9),
        ),
        cases(),
    );
    let (mut accepted, mut refused) = (0, 0);
    for (i, (results, reserved)) in cases.into_iter().enumerate() {
        let name = format!("gen{i}");
        let pod = pod_uid(1000 + i as u32);
        let claim = node.claim_raw(
            &name,
            Some(results.clone()),
            reserved.then_some(pod.as_str()),
        );
        // A good claim next to it in the same call must not be disturbed.
        let good = node.claim(
            &format!("good{i}"),
            &[("cpudevnuma003", Some("2"))],
            &pod_uid(i as u32),
        );
        let answers = running
            .kubelet
            .prepare(&[claim.clone(), good.clone()])
            .await
            .unwrap_or_else(|e| panic!("case {i} {results:?}: the call failed: {e}"));
        assert_eq!(
            answers[&good.uid].error, "",
            "case {i}: the good claim was refused"
        );
        let outcome = &answers[&claim.uid];
        if outcome.error.is_empty() {
            accepted += 1;
            let cpus = node
                .cdi_cpus(&claim.uid)
                .expect("a spec for an accepted claim");
            let mine: Vec<&RawResult> = results.iter().filter(|(d, _, _, _)| d == DRIVER).collect();
            assert!(
                !mine.is_empty(),
                "case {i}: accepted without a result of ours: {results:?}"
            );
            let mut expected_len = 0;
            let mut allowed = CpuSet::new();
            for (_, pool, device, capacity) in &mine {
                assert_eq!(pool, NODE, "case {i}: accepted a result of pool {pool:?}");
                let numa: u32 = device
                    .strip_prefix("cpudevnuma")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("case {i}: accepted device {device:?}"));
                allowed = allowed.union(&node.topology.cpus_in_numa(numa));
                let n: usize = capacity
                    .as_deref()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or_else(|| panic!("case {i}: accepted capacity {capacity:?}"));
                expected_len += n;
            }
            assert!(reserved, "case {i}: accepted a claim reserved for no pod");
            assert_eq!(cpus.len(), expected_len, "case {i}: {results:?} got {cpus}");
            assert!(
                cpus.is_subset(&allowed),
                "case {i}: {cpus} outside {allowed}"
            );
            let errors = running
                .kubelet
                .unprepare(std::slice::from_ref(&claim))
                .await
                .expect("unprepare");
            assert_eq!(errors[&claim.uid], "");
        } else {
            refused += 1;
            assert!(
                outcome.error.contains(&name) || outcome.error.contains(&claim.uid),
                "case {i}: error {:?} does not name the claim",
                outcome.error
            );
            assert!(outcome.devices.is_empty());
            assert_eq!(
                node.cdi_cpus(&claim.uid),
                None,
                "case {i}: spec of a refused claim"
            );
        }
        let errors = running
            .kubelet
            .unprepare(std::slice::from_ref(&good))
            .await
            .expect("unprepare");
        assert_eq!(errors[&good.uid], "");
    }
    // Nothing left behind: the daemon holds no claim and no spec.
    let report = dra_plugin::cli::inspect_state::from_socket(&node.config.coordination_socket)
        .await
        .expect("snapshot");
    assert!(report.claims.is_empty(), "{:?}", report.claims);
    assert!(dra_plugin::cdi::CdiDir::new(&node.config.cdi_dir)
        .list()
        .expect("list")
        .is_empty());
    eprintln!("generated claims: {accepted} accepted, {refused} refused");
    assert!(refused > 0, "no generated claim was refused");
    running.stop().await.expect("clean stop");
}

/// The named refusals: CPUs outside the node, another node's pool, more CPUs
/// than the group holds, no allocation, no consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_outside_this_node_are_refused() {
    let node = Node::new(DeviceMode::Individual);
    let running = node.start(DraVersion::V1).await;
    let raw = |device: &str, pool: &str| -> RawResult {
        (DRIVER.into(), pool.into(), device.into(), None)
    };
    let cases: Vec<(&str, Option<Vec<RawResult>>, bool, &str)> = vec![
        (
            "beyond",
            Some(vec![raw("cpudev128", NODE)]),
            true,
            "not a device of this node",
        ),
        (
            "elsewhere",
            Some(vec![raw("cpudev001", "node-b")]),
            true,
            "pool node-b",
        ),
        ("unallocated", None, true, "not allocated"),
        (
            "nobody",
            Some(vec![raw("cpudev002", NODE)]),
            false,
            "not reserved",
        ),
    ];
    for (name, results, reserved, needle) in cases {
        let claim = node.claim_raw(
            name,
            results,
            reserved.then_some("0000beef-0000-4000-8000-000000000000"),
        );
        let answers =
            tokio::time::timeout(WAIT, running.kubelet.prepare(std::slice::from_ref(&claim)))
                .await
                .expect("answer")
                .expect("prepare");
        let error = &answers[&claim.uid].error;
        assert!(error.contains(name), "{name}: {error:?}");
        assert!(error.contains(needle), "{name}: {error:?} lacks {needle:?}");
        assert_eq!(node.cdi_cpus(&claim.uid), None);
    }
    // Still serving.
    let ok = node.claim("fine", &[("cpudev004", None)], &pod_uid(3));
    prepare_ok(&running.kubelet, &ok).await;
    running.stop().await.expect("clean stop");
}
