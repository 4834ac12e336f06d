//! Crash recovery of the real `dra-plugin run` process: a concurrent
//! prepare/unprepare storm while the process is SIGKILLed at random moments,
//! and aborts at the named points between the store commit, the CDI write
//! and the notification. After every restart: the store opens, no
//! acknowledged prepare or unprepare is lost, no CPU belongs to two claims,
//! the CDI directory holds exactly the stored claims' specs, and repeating
//! the interrupted kubelet call converges.
//!
//! A full disk under the store or the CDI directory (small tmpfs mounts, so
//! root is needed) refuses the prepare with its cause and loses nothing.
//!
//! `DRA_CPU_CRASH_KILLS` sets the number of random kills (200 by default),
//! `DRA_CPU_CRASH_SEED` replays a run.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    pod_uid, prepare_answer, prepare_ok, prepare_one, snapshot, storm_claims, unprepare_all,
    unprepare_one, Known, Node, DRIVER, WAIT,
};
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra, KubeletDraError};
use dra_cpu_tests::seed::{seed_from_env, XorShift};
use dra_plugin::cdi::CdiDir;
use dra_plugin::cli::inspect_state::StateReport;
use dra_plugin::devices::DeviceMode;
use dra_plugin::driver::crash_points::CRASH_AT_ENV;
use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// Claims in the storm; 2 CPUs each, spread over the four NUMA nodes, so
/// they always fit together (32 × 2 of 128 CPUs).
const CLAIMS: usize = 32;
/// Concurrent kubelet callers; each owns the claims `i, i + WORKERS, ...`,
/// so the calls for one claim are sequential and their outcome is known.
const WORKERS: usize = 4;
/// Aborts at each named point.
const NAMED_ROUNDS: usize = 5;

#[derive(Default, Debug)]
struct Figures {
    random_kills: usize,
    named_aborts: usize,
    acknowledged_prepares: usize,
    acknowledged_unprepares: usize,
    interrupted_calls: usize,
    restarts: usize,
    /// Most claims prepared after any random kill, once converged.
    most_prepared_after_a_kill: usize,
    /// Claims prepared when the random kills end.
    prepared_after_storm: usize,
    /// Claims unprepared before a named abort because none was left.
    freed_for_named_aborts: usize,
}

struct Daemon {
    child: Child,
    kubelet: Arc<KubeletDra>,
}

/// Start the process and register it; `crash_at` arms a named crash point.
async fn spawn(node: &Node, crash_at: Option<&str>) -> Daemon {
    // A SIGKILLed daemon leaves its registration socket; kubelet would fail
    // to connect to it, so wait for the new one instead.
    let _ = std::fs::remove_file(node.config.registration_socket());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(node.dir.path().join("dra-plugin.log"))
        .expect("log file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_dra-plugin"));
    command
        .args(node.grouped_run_args(&[]))
        .env("RUST_LOG", "warn")
        .env_remove(CRASH_AT_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    if let Some(point) = crash_at {
        assert!(
            dra_plugin::driver::crash_points::enabled(),
            "this build has no crash points: build with --features dra-plugin/crash-points"
        );
        command.env(CRASH_AT_ENV, point);
    }
    let mut child = command.spawn().expect("spawning dra-plugin run");
    let deadline = Instant::now() + WAIT;
    let registered = loop {
        match KubeletDra::register(&node.registry_dir(), DRIVER, DraVersion::V1, WAIT).await {
            // The socket file exists from bind(2) on, but connections are
            // refused until listen(2): kubelet's plugin watcher retries too.
            Err(KubeletDraError::Connect { .. })
                if Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => break other,
        }
    };
    match registered {
        Ok(kubelet) => Daemon {
            child,
            kubelet: Arc::new(kubelet),
        },
        Err(e) => {
            let _ = child.start_kill();
            let log =
                std::fs::read_to_string(node.dir.path().join("dra-plugin.log")).unwrap_or_default();
            panic!("registration after start: {e}\n--- daemon log ---\n{log}");
        }
    }
}

/// The invariants after a restart, against what acknowledged calls said.
fn check_state(node: &Node, claims: &[Claim], known: &[Known], report: &StateReport, when: &str) {
    let stored: BTreeMap<String, CpuSet> = report
        .claims
        .iter()
        .map(|c| {
            let cpus = CpuSet::parse_cpulist(&c.cpus).expect("daemon cpulist");
            (c.uid.clone(), cpus)
        })
        .collect();
    // No CPU in two claims, none outside the node.
    let allocatable = CpuSet::parse_cpulist(&report.allocatable).expect("allocatable");
    let mut seen = CpuSet::new();
    for (uid, cpus) in &stored {
        assert!(
            cpus.is_subset(&allocatable),
            "{when}: claim {uid} holds {cpus} outside {allocatable}"
        );
        assert!(
            seen.is_disjoint(cpus),
            "{when}: claim {uid} holds {cpus}, some already held by another claim ({seen})"
        );
        seen = seen.union(cpus);
    }
    // Nothing acknowledged is lost.
    for (claim, known) in claims.iter().zip(known) {
        match known {
            Known::Prepared(cpus) => assert_eq!(
                stored.get(&claim.uid),
                Some(cpus),
                "{when}: acknowledged prepare of {} lost or changed",
                claim.name
            ),
            Known::Unprepared => assert!(
                !stored.contains_key(&claim.uid),
                "{when}: acknowledged unprepare of {} came back",
                claim.name
            ),
            Known::PrepareInFlight | Known::UnprepareInFlight => {}
        }
    }
    // The CDI directory is exactly the store.
    let cdi = CdiDir::new(&node.config.cdi_dir);
    let on_disk = cdi.list().expect("listing CDI specs");
    let stored_uids: std::collections::BTreeSet<String> = stored.keys().cloned().collect();
    assert_eq!(
        on_disk, stored_uids,
        "{when}: CDI specs differ from the store"
    );
    for (uid, cpus) in &stored {
        assert_eq!(
            cdi.read_cpus(uid).as_ref(),
            Some(cpus),
            "{when}: CDI spec of {uid}"
        );
    }
    // Nothing else a runtime would read (temp files are dot-prefixed).
    if let Ok(entries) = std::fs::read_dir(&node.config.cdi_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                let uid = shared_state::cdi_spec::claim_uid_of_file(&name);
                assert!(
                    uid.is_some_and(|u| stored.contains_key(u)),
                    "{when}: stray file {name} in the CDI directory"
                );
            }
        }
    }
}

/// Repeat every interrupted call, as kubelet does, and check it converges:
/// a claim the store kept keeps its CPUs.
/// After a restart: check the state against what the test knows, converge
/// it by repeating the calls left in flight, and check it again. Returns
/// the converged state.
async fn recover(
    daemon: &Daemon,
    node: &Node,
    claims: &[Claim],
    known: &mut [Known],
    report: &StateReport,
    figures: &mut Figures,
    when: &str,
) -> StateReport {
    check_state(node, claims, known, report, when);
    converge(daemon, node, claims, known, report, figures).await;
    let converged = snapshot(node).await;
    check_state(
        node,
        claims,
        known,
        &converged,
        &format!("{when}, converged"),
    );
    converged
}

async fn converge(
    daemon: &Daemon,
    node: &Node,
    claims: &[Claim],
    known: &mut [Known],
    report: &StateReport,
    figures: &mut Figures,
) {
    for (claim, state) in claims.iter().zip(known.iter_mut()) {
        let kept = report
            .claims
            .iter()
            .find(|c| c.uid == claim.uid)
            .map(|c| CpuSet::parse_cpulist(&c.cpus).expect("cpulist"));
        match state {
            Known::PrepareInFlight => {
                figures.interrupted_calls += 1;
                let cpus = prepare_one(&daemon.kubelet, node, claim)
                    .await
                    .expect("repeated prepare answers");
                if let Some(kept) = kept {
                    assert_eq!(
                        cpus, kept,
                        "repeated prepare of {} moved its CPUs",
                        claim.name
                    );
                }
                *state = Known::Prepared(cpus);
            }
            Known::UnprepareInFlight => {
                figures.interrupted_calls += 1;
                unprepare_one(&daemon.kubelet, claim)
                    .await
                    .expect("repeated unprepare answers");
                assert_eq!(
                    node.cdi_cpus(&claim.uid),
                    None,
                    "{} spec after unprepare",
                    claim.name
                );
                *state = Known::Unprepared;
            }
            Known::Prepared(_) | Known::Unprepared => {}
        }
    }
}

/// One worker's calls until the daemon dies under it.
async fn storm_worker(
    kubelet: Arc<KubeletDra>,
    node: Arc<Node>,
    claims: Arc<Vec<Claim>>,
    known: Arc<Mutex<Vec<Known>>>,
    worker: usize,
    seed: u64,
) -> (usize, usize) {
    let mut rng = XorShift::new(seed);
    let mine: Vec<usize> = (worker..claims.len()).step_by(WORKERS).collect();
    let (mut prepares, mut unprepares) = (0, 0);
    loop {
        let i = mine[rng.below(mine.len() as u64) as usize];
        let claim = &claims[i];
        let prepared = matches!(known.lock().expect("lock")[i], Known::Prepared(_));
        if prepared {
            known.lock().expect("lock")[i] = Known::UnprepareInFlight;
            match unprepare_one(&kubelet, claim).await {
                Some(()) => {
                    known.lock().expect("lock")[i] = Known::Unprepared;
                    unprepares += 1;
                }
                None => return (prepares, unprepares),
            }
        } else {
            known.lock().expect("lock")[i] = Known::PrepareInFlight;
            match prepare_one(&kubelet, &node, claim).await {
                Some(cpus) => {
                    known.lock().expect("lock")[i] = Known::Prepared(cpus);
                    prepares += 1;
                }
                None => return (prepares, unprepares),
            }
        }
    }
}

async fn wait_exit(daemon: &mut Daemon) -> std::process::ExitStatus {
    tokio::time::timeout(WAIT, daemon.child.wait())
        .await
        .expect("the daemon exits")
        .expect("waiting for the daemon")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_kills_during_a_prepare_storm_and_aborts_at_named_points() {
    let kills: usize = std::env::var("DRA_CPU_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = seed_from_env("DRA_CPU_CRASH_SEED");
    eprintln!("crash storm seed {seed} (DRA_CPU_CRASH_SEED replays it)");
    let mut rng = XorShift::new(seed);
    let node = Arc::new(Node::new(DeviceMode::Grouped));
    let claims = Arc::new(storm_claims(&node, CLAIMS));
    let known = Arc::new(Mutex::new(vec![Known::Unprepared; CLAIMS]));
    let mut figures = Figures::default();
    let started = Instant::now();

    let mut daemon = spawn(&node, None).await;
    for round in 0..kills {
        // Storm, then SIGKILL at a random moment of it.
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                tokio::spawn(storm_worker(
                    daemon.kubelet.clone(),
                    node.clone(),
                    claims.clone(),
                    known.clone(),
                    w,
                    rng.next_u64(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        daemon.child.start_kill().expect("SIGKILL");
        let status = wait_exit(&mut daemon).await;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "round {round}: {status:?}"
        );
        figures.random_kills += 1;
        for w in workers {
            let (p, u) = w.await.expect("worker");
            figures.acknowledged_prepares += p;
            figures.acknowledged_unprepares += u;
        }

        daemon = spawn(&node, None).await;
        figures.restarts += 1;
        let when = format!("after kill {round}");
        let report = snapshot(&node).await;
        let mut now = known.lock().expect("lock").clone();
        recover(
            &daemon,
            &node,
            &claims,
            &mut now,
            &report,
            &mut figures,
            &when,
        )
        .await;
        let prepared = now
            .iter()
            .filter(|k| matches!(k, Known::Prepared(_)))
            .count();
        figures.most_prepared_after_a_kill = figures.most_prepared_after_a_kill.max(prepared);
        *known.lock().expect("lock") = now;
    }

    figures.prepared_after_storm = known
        .lock()
        .expect("lock")
        .iter()
        .filter(|k| matches!(k, Known::Prepared(_)))
        .count();

    // Named points: abort inside a prepare, between its durable steps.
    for point in ["after-store-commit", "after-cdi-write"] {
        for round in 0..NAMED_ROUNDS {
            let _ = daemon.child.start_kill();
            let _ = wait_exit(&mut daemon).await;
            daemon = spawn(&node, Some(point)).await;
            let mut now = known.lock().expect("lock").clone();
            let i = match now.iter().position(|k| *k == Known::Unprepared) {
                Some(i) => i,
                None => {
                    // The storm may end with every claim prepared (the
                    // faster the commits, the likelier): free one first,
                    // as kubelet would once its pod is gone. The armed
                    // point is inside a prepare only, so this unprepare
                    // is answered.
                    let i = now
                        .iter()
                        .position(|k| matches!(k, Known::Prepared(_)))
                        .expect("after converging every claim is prepared or unprepared");
                    now[i] = Known::UnprepareInFlight;
                    unprepare_one(&daemon.kubelet, &claims[i])
                        .await
                        .expect("an unprepare with a prepare point armed is answered");
                    figures.freed_for_named_aborts += 1;
                    now[i] = Known::Unprepared;
                    i
                }
            };
            now[i] = Known::PrepareInFlight;
            assert_eq!(
                prepare_one(&daemon.kubelet, &node, &claims[i]).await,
                None,
                "a prepare through {point} must not be acknowledged"
            );
            let status = wait_exit(&mut daemon).await;
            assert_eq!(status.signal(), Some(libc::SIGABRT), "{point}: {status:?}");
            figures.named_aborts += 1;

            daemon = spawn(&node, None).await;
            figures.restarts += 1;
            let when = format!("after abort {round} at {point}");
            let report = snapshot(&node).await;
            // The commit happened before the abort: the store keeps the claim
            // and the start rewrote its spec.
            assert!(
                report.claims.iter().any(|c| c.uid == claims[i].uid),
                "{when}: the committed claim {} is gone",
                claims[i].name
            );
            recover(
                &daemon,
                &node,
                &claims,
                &mut now,
                &report,
                &mut figures,
                &when,
            )
            .await;
            *known.lock().expect("lock") = now;
        }
    }

    // Everything can be released, and the node ends empty.
    unprepare_all(&daemon.kubelet, &node, &claims).await;
    assert_eq!(
        CdiDir::new(&node.config.cdi_dir).list().expect("list"),
        Default::default()
    );
    let _ = daemon.child.start_kill();
    let _ = wait_exit(&mut daemon).await;
    eprintln!(
        "crash storm: {figures:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(figures.random_kills, kills);
    assert_eq!(figures.named_aborts, 2 * NAMED_ROUNDS);
    assert!(figures.acknowledged_prepares > 0, "{figures:?}");
}

/// Aborts at the named points of the unprepare path: after the CDI spec is
/// removed but before the store commit, and after the commit but before
/// the answer. After each restart the store opens and the CDI directory is
/// exactly the store; repeating the unprepare converges, and the whole
/// NUMA node the claim held can be given to a new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_aborts_at_named_points_recover_and_free_the_cpus() {
    let node = Node::new(DeviceMode::Grouped);
    let numa0 = node.topology.cpus_in_numa(node.topology.numa_nodes()[0]);
    let whole = numa0.len().to_string();
    // A neighbour that stays prepared throughout, on another NUMA node.
    let neighbour = node.claim("neighbour", &[("cpudevnuma001", Some("2"))], &pod_uid(100));
    let mut figures = Figures::default();
    let mut daemon = spawn(&node, None).await;
    let neighbour_cpus = prepare_one(&daemon.kubelet, &node, &neighbour)
        .await
        .expect("neighbour prepared");
    for point in ["unprepare-after-cdi-remove", "unprepare-after-store-commit"] {
        for round in 0..NAMED_ROUNDS {
            let when = format!("after abort {round} at {point}");
            // Each round's claim takes the whole of NUMA node 0, so the next
            // one fits only if the aborted unprepare freed every CPU of it.
            let victim = node.claim(
                &format!("whole-{point}-{round}"),
                &[("cpudevnuma000", Some(whole.as_str()))],
                &pod_uid(round as u32),
            );
            let claims = vec![neighbour.clone(), victim.clone()];
            let victim_cpus = prepare_one(&daemon.kubelet, &node, &victim)
                .await
                .unwrap_or_else(|| panic!("{when}: prepare of the whole NUMA node 0"));
            assert_eq!(victim_cpus, numa0, "{when}: the victim holds NUMA node 0");
            let _ = daemon.child.start_kill();
            let _ = wait_exit(&mut daemon).await;

            daemon = spawn(&node, Some(point)).await;
            assert_eq!(
                unprepare_one(&daemon.kubelet, &victim).await,
                None,
                "an unprepare through {point} must not be acknowledged"
            );
            let status = wait_exit(&mut daemon).await;
            assert_eq!(status.signal(), Some(libc::SIGABRT), "{point}: {status:?}");
            figures.named_aborts += 1;

            daemon = spawn(&node, None).await;
            figures.restarts += 1;
            let report = snapshot(&node).await;
            let kept = report.claims.iter().any(|c| c.uid == victim.uid);
            match point {
                // The record was still stored: the start rewrote its spec.
                "unprepare-after-cdi-remove" => assert!(kept, "{when}: record lost"),
                // The removal was committed: it stays removed.
                _ => assert!(!kept, "{when}: a committed removal came back"),
            }
            let mut known = vec![
                Known::Prepared(neighbour_cpus.clone()),
                Known::UnprepareInFlight,
            ];
            let report = recover(
                &daemon,
                &node,
                &claims,
                &mut known,
                &report,
                &mut figures,
                &when,
            )
            .await;
            assert!(
                !report.claims.iter().any(|c| c.uid == victim.uid),
                "{when}: the claim is still stored after the repeated unprepare"
            );
            let shared = CpuSet::parse_cpulist(&report.shared).expect("shared cpulist");
            assert!(
                numa0.is_subset(&shared),
                "{when}: NUMA node 0 {numa0} not back in the shared pool {shared}"
            );
        }
    }
    // The last victim's CPUs go to a new claim.
    let next = node.claim(
        "next",
        &[("cpudevnuma000", Some(whole.as_str()))],
        &pod_uid(200),
    );
    assert_eq!(
        prepare_one(&daemon.kubelet, &node, &next).await,
        Some(numa0.clone()),
        "a new claim gets the freed NUMA node"
    );
    let _ = daemon.child.start_kill();
    let _ = wait_exit(&mut daemon).await;
    eprintln!("unprepare aborts: {figures:?}");
    assert_eq!(figures.named_aborts, 2 * NAMED_ROUNDS);
    assert_eq!(figures.interrupted_calls, 2 * NAMED_ROUNDS);
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallFs {
    path: std::path::PathBuf,
}

impl SmallFs {
    fn mount(path: std::path::PathBuf, size: &str) -> SmallFs {
        std::fs::create_dir_all(&path).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "mounting a tmpfs at {} (needs root)",
            path.display()
        );
        SmallFs { path }
    }

    /// Write zeros until the filesystem is full; returns the filler's path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 4096];
        loop {
            match file.write_all(&block) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", self.path.display()),
            }
        }
        filler
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// Claim uid → CPUs, as the running daemon's store holds them.
async fn stored_cpus(node: &Node) -> BTreeMap<String, CpuSet> {
    snapshot(node)
        .await
        .claims
        .iter()
        .map(|c| {
            (
                c.uid.clone(),
                CpuSet::parse_cpulist(&c.cpus).expect("cpulist"),
            )
        })
        .collect()
}

/// A full disk under the CDI directory, then under the store: the prepare
/// that cannot be made durable is refused with the cause, nothing of it is
/// left, claims prepared before stay, and the retry after space returns
/// succeeds. A restart finds every acknowledged claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disks_refuse_prepares_clearly_and_lose_nothing() {
    let scratch = tempfile::Builder::new()
        .prefix("dfull")
        .tempdir_in("/tmp")
        .expect("scratch");
    let state_fs = SmallFs::mount(scratch.path().join("state"), "16m");
    let cdi_fs = SmallFs::mount(scratch.path().join("cdi"), "256k");
    let node = Node::with(DeviceMode::Grouped, |s| {
        s.state_dir = Some(state_fs.path.clone());
        s.cdi_dir = Some(cdi_fs.path.clone());
    });
    let running = node.start(DraVersion::V1).await;
    let before = node.claim("before", &[("cpudevnuma000", Some("2"))], &pod_uid(1));
    prepare_ok(&running.kubelet, &before).await;
    let before_cpus = node.cdi_cpus(&before.uid).expect("spec");

    // CDI directory full.
    let filler = cdi_fs.fill();
    let cdi_full = node.claim("cdi-full", &[("cpudevnuma001", Some("2"))], &pod_uid(2));
    let error = prepare_answer(&running.kubelet, &cdi_full).await.error;
    assert!(
        error.contains("cdi-full") && error.contains("No space left"),
        "{error:?}"
    );
    let report = snapshot(&node).await;
    assert!(
        !report.claims.iter().any(|c| c.uid == cdi_full.uid),
        "a refused claim is stored"
    );
    assert_eq!(node.cdi_cpus(&cdi_full.uid), None);
    std::fs::remove_file(&filler).expect("freeing the CDI disk");
    assert_eq!(
        prepare_answer(&running.kubelet, &cdi_full).await.error,
        "",
        "the retry after space returns"
    );

    // Store full.
    let filler = state_fs.fill();
    let mut store_errors = Vec::new();
    let mut refused = Vec::new();
    // sled buffers; a few prepares in, its flush meets the full disk.
    for i in 0..8u32 {
        let claim = node.claim(
            &format!("store-full-{i}"),
            &[("cpudevnuma002", Some("2"))],
            &pod_uid(10 + i),
        );
        let error = prepare_answer(&running.kubelet, &claim).await.error;
        if !error.is_empty() {
            assert!(error.contains(&claim.name), "{error:?}");
            assert_eq!(node.cdi_cpus(&claim.uid), None, "spec of a refused claim");
            store_errors.push(error);
            refused.push(claim);
        }
    }
    eprintln!(
        "full store: {} of 8 prepares refused: {:?}",
        refused.len(),
        store_errors.first()
    );
    assert!(!refused.is_empty(), "no prepare noticed the full store");
    std::fs::remove_file(&filler).expect("freeing the store disk");
    // sled keeps an I/O error once it has seen one: until a restart the
    // store may go on refusing, but only ever with the cause named.
    let mut refused_until_restart = 0;
    for claim in &refused {
        let error = prepare_answer(&running.kubelet, claim).await.error;
        if !error.is_empty() {
            refused_until_restart += 1;
            assert!(
                error.contains(&claim.name) && error.contains("store"),
                "{error:?}"
            );
            assert_eq!(node.cdi_cpus(&claim.uid), None, "spec of a refused claim");
        }
    }
    eprintln!(
        "full store: {refused_until_restart} of {} retries refused until a restart",
        refused.len()
    );
    let acknowledged = stored_cpus(&node).await;
    running.stop().await.expect("clean stop");

    // Every acknowledged claim is there after a restart, with its CPUs.
    let running = node.start(DraVersion::V1).await;
    let after = stored_cpus(&node).await;
    assert_eq!(after, acknowledged);
    assert_eq!(after.get(&before.uid), Some(&before_cpus));
    // And the kubelet's retries converge.
    for claim in &refused {
        assert_eq!(
            prepare_answer(&running.kubelet, claim).await.error,
            "",
            "retry of {} after the restart",
            claim.name
        );
    }
    let cdi = CdiDir::new(&node.config.cdi_dir);
    let report = snapshot(&node).await;
    let stored: std::collections::BTreeSet<String> =
        report.claims.iter().map(|c| c.uid.clone()).collect();
    assert_eq!(
        cdi.list().expect("list"),
        stored,
        "CDI specs match the store"
    );
    running.stop().await.expect("clean stop");
}
