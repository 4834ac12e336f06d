//! The coordination socket of the running daemon: snapshot then ordered
//! deltas, lookup, applied-revision reports, socket mode and peer check.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pod_uid, prepare_ok, Node, WAIT};
use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_cpu_transport::connect_unix;
use dra_plugin::devices::DeviceMode;
use std::os::unix::fs::PermissionsExt;

/// The next event but heartbeats, within [`WAIT`] (heartbeats do not
/// extend it).
async fn next(stream: &mut tonic::Streaming<coord::WatchEvent>) -> coord::watch_event::Event {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let event = tokio::time::timeout_at(deadline, stream.message())
            .await
            .expect("an event within the wait bound")
            .expect("stream ok")
            .expect("stream open")
            .event
            .expect("event set");
        if !matches!(event, coord::watch_event::Event::Heartbeat(_)) {
            return event;
        }
    }
}

/// A subscriber's client and Watch stream on `node`'s coordination socket,
/// and the stream's first event, the snapshot.
async fn subscribe(
    node: &Node,
    subscriber: &str,
) -> (
    coord::coordination_client::CoordinationClient<tonic::transport::Channel>,
    tonic::Streaming<coord::WatchEvent>,
    coord::Snapshot,
) {
    let channel = connect_unix(&node.config.coordination_socket)
        .await
        .expect("connect");
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    let mut stream = client
        .watch(coord::WatchRequest {
            from_revision: 0,
            subscriber: subscriber.into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let coord::watch_event::Event::Snapshot(snapshot) = next(&mut stream).await else {
        panic!("first event is not a snapshot");
    };
    (client, stream, snapshot)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_a_snapshot_then_deltas_in_order() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let first = node.claim("first", &[("cpudevnuma000", Some("2"))], &pod_uid(1));
    prepare_ok(&running.kubelet, &first).await;

    let socket = &node.config.coordination_socket;
    let mode = std::fs::metadata(socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let channel = connect_unix(socket).await.expect("connect");
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    // Two subscribers at once; both see the same sequence.
    let mut streams = Vec::new();
    for name in ["nri-plugin/a", "nri-plugin/b"] {
        let stream = client
            .watch(coord::WatchRequest {
                from_revision: 0,
                subscriber: name.into(),
            })
            .await
            .expect("watch")
            .into_inner();
        streams.push(stream);
    }
    let mut base = 0;
    for stream in &mut streams {
        let coord::watch_event::Event::Snapshot(snapshot) = next(stream).await else {
            panic!("first event is not a snapshot");
        };
        assert_eq!(snapshot.allocatable, node.topology.online().to_cpulist());
        assert_eq!(snapshot.reserved, "");
        assert!(!snapshot.mixed_allocation_mode);
        assert_eq!(snapshot.claims.len(), 1);
        assert_eq!(snapshot.claims[0].uid, first.uid);
        assert_eq!(snapshot.claims[0].consumer_pod_uids, vec![pod_uid(1)]);
        assert_eq!(
            Some(snapshot.claims[0].cpus.clone()),
            node.cdi_cpus(&first.uid).map(|c| c.to_cpulist())
        );
        base = snapshot.revision;
    }

    let second = node.claim("second", &[("cpudevnuma001", Some("4"))], &pod_uid(2));
    prepare_ok(&running.kubelet, &second).await;
    let errors = running
        .kubelet
        .unprepare(std::slice::from_ref(&first))
        .await
        .expect("unprepare");
    assert_eq!(errors[&first.uid], "");

    for stream in &mut streams {
        match next(stream).await {
            coord::watch_event::Event::ClaimPrepared(p) => {
                assert_eq!(p.revision, base + 1);
                let claim = p.claim.expect("claim");
                assert_eq!(claim.uid, second.uid);
                assert_eq!(
                    Some(claim.cpus),
                    node.cdi_cpus(&second.uid).map(|c| c.to_cpulist())
                );
            }
            other => panic!("expected ClaimPrepared, got {other:?}"),
        }
        match next(stream).await {
            coord::watch_event::Event::ClaimUnprepared(u) => {
                assert_eq!(u.revision, base + 2);
                assert_eq!(u.claim_uid, first.uid);
            }
            other => panic!("expected ClaimUnprepared, got {other:?}"),
        }
    }

    let found = client
        .lookup(coord::LookupRequest {
            claim_uid: second.uid.clone(),
            pod_uid: String::new(),
        })
        .await
        .expect("lookup")
        .into_inner();
    assert!(found.found);
    assert_eq!(found.revision, base + 2);
    assert_eq!(found.claim.map(|c| c.uid), Some(second.uid.clone()));
    let gone = client
        .lookup(coord::LookupRequest {
            claim_uid: first.uid.clone(),
            pod_uid: String::new(),
        })
        .await
        .expect("lookup")
        .into_inner();
    assert!(!gone.found);
    assert!(gone.claim.is_none());

    let ack = client
        .report_applied(coord::AppliedRevision {
            subscriber: "nri-plugin/a".into(),
            revision: base + 1,
        })
        .await
        .expect("report")
        .into_inner();
    assert_eq!(ack.current_revision, base + 2);
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_outside_the_allowed_uids_is_refused() {
    // This test runs as root; admitting only uid 4242 makes root the
    // "other" peer, which exercises the same SO_PEERCRED refusal a
    // non-root nri-plugin would meet under the default policy.
    let node = Node::with(DeviceMode::Grouped, |s| {
        s.coordination_allowed_uids = Some(vec![4242]);
    });
    let running = node.start(DraVersion::V1).await;
    let refused = async {
        let channel = connect_unix(&node.config.coordination_socket).await?;
        let mut client = coord::coordination_client::CoordinationClient::new(channel);
        client
            .lookup(coord::LookupRequest {
                claim_uid: "x".into(),
                pod_uid: String::new(),
            })
            .await
            .map_err(anyhow::Error::from)?;
        anyhow::Ok(())
    };
    let outcome = tokio::time::timeout(WAIT, refused)
        .await
        .expect("refusal within the wait bound");
    assert!(outcome.is_err(), "a peer outside the allow-list was served");
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_process_is_refused_even_when_the_socket_mode_lets_it_connect() {
    use std::os::unix::process::CommandExt;
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let socket = node.config.coordination_socket.clone();
    // Open every directory on the way and the socket itself, as a careless
    // mode would: only the SO_PEERCRED check stands between uid 65534 and
    // the claims.
    for dir in [node.dir.path(), &node.config.state_dir] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
            .args([
                "inspect",
                "--state-dir",
                "/nonexistent",
                "--coordination-socket",
            ])
            .arg(&socket)
            .uid(65534)
            .gid(65534)
            .output()
    })
    .await
    .expect("join")
    .expect("run inspect as uid 65534");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "uid 65534 read the state: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(stderr.contains("does not answer"), "{stderr}");
    // It got through the file mode (the kernel would say EACCES) and was
    // dropped by the server after connecting.
    assert!(!stderr.contains("Permission denied"), "{stderr}");
    running.stop().await.expect("clean stop");
}

/// A CPU going offline while the daemon runs reaches subscribers as a fresh
/// snapshot whose allocatable CPUs leave it out (the daemon reads the online
/// list every second), and its return as another; the claims stay as they
/// are. The fixture's `online` file is rewritten as the kernel rewrites it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_going_offline_and_back_reaches_subscribers_as_snapshots() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let first = node.claim("first", &[("cpudevnuma000", Some("2"))], &pod_uid(1));
    prepare_ok(&running.kubelet, &first).await;

    let (_client, mut stream, before) = subscribe(&node, "nri-plugin/online").await;
    let online = node.topology.online().clone();
    assert_eq!(before.allocatable, online.to_cpulist());

    let online_file = node.config.sysfs_root.join("sys/devices/system/cpu/online");
    // Replaced whole, as the kernel's file never reads half-written.
    let write_online = |cpus: &shared_state::CpuSet| {
        let next = online_file.with_extension("next");
        std::fs::write(&next, format!("{}\n", cpus.to_cpulist())).expect("online");
        std::fs::rename(&next, &online_file).expect("online");
    };
    let gone = online.iter().last().expect("a CPU");
    let fewer: shared_state::CpuSet = online.iter().filter(|&cpu| cpu != gone).collect();
    write_online(&fewer);
    let coord::watch_event::Event::Snapshot(offline) = next(&mut stream).await else {
        panic!("a CPU going offline is not sent as a snapshot");
    };
    assert_eq!(offline.allocatable, fewer.to_cpulist());
    assert_eq!(offline.revision, before.revision, "no claim changed");
    assert_eq!(offline.claims, before.claims);

    write_online(&online);
    let coord::watch_event::Event::Snapshot(back) = next(&mut stream).await else {
        panic!("a CPU coming back is not sent as a snapshot");
    };
    assert_eq!(back.allocatable, online.to_cpulist());
}

/// As the scheduler does: claim `name`'s `status.reservedFor` becomes the
/// pods numbered `pods` (see [`pod_uid`]).
fn reserve_for(node: &Node, name: &str, pods: &[u32]) {
    let mut status = node
        .api
        .claim("default", name)
        .expect("claim")
        .status
        .expect("status");
    let template = status
        .reserved_for
        .as_ref()
        .and_then(|r| r.first().cloned())
        .expect("reserved for a pod");
    status.reserved_for = Some(
        pods.iter()
            .map(|&n| {
                let mut reference = template.clone();
                reference.uid = pod_uid(n);
                reference.name = format!("pod-{n}");
                reference
            })
            .collect(),
    );
    node.api
        .set_claim_status("default", name, status)
        .expect("reserving the claim");
}

/// Kubelet prepares a claim once per node: a pod added to the claim's
/// `reservedFor` afterwards is learned when nri-plugin's Lookup names it.
/// The control: while `reservedFor` does not name the pod, the answer does
/// not either and nothing is written; once it does, the pods it names are
/// recorded, subscribers get the record, and a restart keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_for_a_pod_added_to_reserved_for_records_it() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let shared = node.claim("shared", &[("cpudevnuma000", Some("2"))], &pod_uid(1));
    prepare_ok(&running.kubelet, &shared).await;
    let (mut client, mut stream, snapshot) = subscribe(&node, "nri-plugin/test").await;
    let lookup_for = |pod: String| coord::LookupRequest {
        claim_uid: shared.uid.clone(),
        pod_uid: pod,
    };

    let not_yet = client
        .lookup(lookup_for(pod_uid(2)))
        .await
        .expect("lookup")
        .into_inner();
    assert_eq!(
        not_yet.claim.expect("prepared").consumer_pod_uids,
        vec![pod_uid(1)],
        "not reserved for pod 2 yet"
    );

    reserve_for(&node, &shared.name, &[1, 2]);
    let now = client
        .lookup(lookup_for(pod_uid(2)))
        .await
        .expect("lookup")
        .into_inner();
    let both = vec![pod_uid(1), pod_uid(2)];
    assert_eq!(now.claim.expect("prepared").consumer_pod_uids, both);
    match next(&mut stream).await {
        coord::watch_event::Event::ClaimPrepared(p) => {
            assert_eq!(p.revision, snapshot.revision + 1);
            assert_eq!(p.claim.expect("claim").consumer_pod_uids, both);
        }
        other => panic!("expected the claim's new record, got {other:?}"),
    }
    // A Lookup without a pod, or for a pod already recorded, reads no claim.
    let claim_gets = || {
        node.api
            .requests()
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.path
                        .ends_with(&format!("/resourceclaims/{}", shared.name))
            })
            .count()
    };
    let gets = claim_gets();
    assert!(
        gets >= 3,
        "the prepare and both lookups for pod 2 read the claim: {gets}"
    );
    for pod in [String::new(), pod_uid(1), pod_uid(2)] {
        let plain = client
            .lookup(lookup_for(pod))
            .await
            .expect("lookup")
            .into_inner();
        assert_eq!(plain.claim.expect("prepared").consumer_pod_uids, both);
    }
    assert_eq!(
        claim_gets(),
        gets,
        "no claim read for a pod already recorded"
    );

    // Pod 1 is gone and pod 3 came: the record follows reservedFor.
    reserve_for(&node, &shared.name, &[2, 3]);
    let later = client
        .lookup(lookup_for(pod_uid(3)))
        .await
        .expect("lookup")
        .into_inner();
    let both = vec![pod_uid(2), pod_uid(3)];
    assert_eq!(later.claim.expect("prepared").consumer_pod_uids, both);
    drop(stream);
    running.stop().await.expect("clean stop");

    let restarted = node.start(DraVersion::V1).await;
    let channel = connect_unix(&node.config.coordination_socket)
        .await
        .expect("connect again");
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    let after = client
        .lookup(lookup_for(String::new()))
        .await
        .expect("lookup after a restart")
        .into_inner();
    assert_eq!(after.claim.expect("still prepared").consumer_pod_uids, both);
    restarted.stop().await.expect("clean stop");
}
