//! The `topology` and `allocate` subcommands, run as the built binary over
//! generated sysfs trees of real machine shapes.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The tree of machine `name` (kept while the returned guard lives) and the
/// sysfs root inside it.
fn tree(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = common::written_tree(name);
    let root = dir.path().to_path_buf();
    (dir, root)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .args(args)
        .env_remove("HOST_ROOT")
        .output()
        .expect("running dra-plugin")
}

fn allocate(root: &Path, extra: &[&str]) -> Output {
    let root = root.to_str().expect("utf-8 temp path");
    let mut args = vec!["allocate", "--sysfs-root", root];
    args.extend_from_slice(extra);
    run(&args)
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

#[test]
fn topology_report_of_two_socket_snc_machine() {
    let (_guard, root) = tree("intel-2s-snc2-ht-128");
    let out = run(&[
        "topology",
        "--sysfs-root",
        root.to_str().expect("utf-8"),
        "--reserved-cpus",
        "0,64",
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).expect("JSON report");
    assert_eq!(report["online"], "0-127");
    assert_eq!(report["sockets"], 2);
    assert_eq!(report["numaNodes"], 4);
    assert_eq!(report["l3Groups"], 4);
    assert_eq!(report["smtWidth"], 2);
    assert_eq!(report["reserved"], "0,64");
    let cpus = report["cpus"].as_array().expect("cpus array");
    assert_eq!(cpus.len(), 128);
    assert_eq!(cpus[5]["siblings"], "5,69");
    assert_eq!(cpus[100]["numa"], 2);
}

#[test]
fn topology_root_comes_from_host_root() {
    let (_guard, root) = tree("intel-2s-ht-adjacent-offline-96");
    let out = Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("topology")
        .env("HOST_ROOT", &root)
        .output()
        .expect("running dra-plugin");
    let report: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).expect("JSON report");
    assert_eq!(report["online"], "0-93");
    assert_eq!(report["isolated"], "2-3");
    assert_eq!(report["cpus"][2]["siblings"], "2-3");
}

#[test]
fn allocate_picks_by_topology() {
    let (_intel_guard, intel) = tree("intel-2s-snc2-ht-128");
    let (_amd_guard, amd) = tree("amd-epyc-1s-8ccx-ht-128");
    let (_adj_guard, adjacent) = tree("intel-2s-ht-adjacent-offline-96");
    let cases: Vec<(&str, &Path, Vec<&str>, &str)> = vec![
        (
            "one whole CCX on EPYC",
            &amd,
            vec!["--count", "16"],
            "0-7,64-71",
        ),
        (
            "reserved CPUs push the pick to the next whole CCX",
            &amd,
            vec!["--count", "16", "--reserved-cpus", "0,64"],
            "8-15,72-79",
        ),
        (
            "grouped pick inside NUMA node 2",
            &intel,
            vec!["--count", "4", "--numa", "2"],
            "32-33,96-97",
        ),
        (
            "a whole sub-NUMA node when the count equals it",
            &intel,
            vec!["--count", "32", "--available", "1-127"],
            "16-31,80-95",
        ),
        (
            "odd count: whole core, then the free thread of partly used core 0",
            &intel,
            vec!["--count", "3", "--available", "1-127"],
            "1,64-65",
        ),
        (
            "full cores only",
            &intel,
            vec![
                "--count",
                "4",
                "--policy",
                "full-pcpus-only",
                "--available",
                "0-127",
            ],
            "0-1,64-65",
        ),
        (
            "one thread per core: four cores, none of them split into two of its threads",
            &intel,
            vec![
                "--count",
                "4",
                "--policy",
                "distribute-across-cores",
                "--available",
                "0-127",
            ],
            "0-3",
        ),
        (
            "distribute over both NUMA nodes of the adjacent-numbered machine",
            &adjacent,
            vec!["--count", "64", "--policy", "distribute-across-numa"],
            "0-31,48-79",
        ),
    ];
    for (what, root, args, expected) in cases {
        let out = allocate(root, &args);
        assert_eq!(stdout_ok(&out).trim(), expected, "{what}");
    }
}

#[test]
fn allocate_errors_exit_non_zero_with_a_clear_message() {
    let (_guard, root) = tree("intel-2s-snc2-ht-128");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--count", "2", "--available", "120-140"],
            "CPUs 128-140 are not online",
        ),
        (
            &["--count", "2", "--available", "0-x"],
            "invalid value '0-x' for '--available",
        ),
        (
            &["--count", "9", "--available", "0-7"],
            "9 CPUs requested but only 8 are free",
        ),
        (
            &["--count", "3", "--policy", "full-pcpus-only"],
            "3 CPUs is not a multiple of the 2 hardware threads per core",
        ),
        (
            &["--count", "1", "--policy", "spread"],
            "unknown CPU allocation policy \"spread\"",
        ),
        (&["--count", "1", "--numa", "9"], "--numa 9"),
        (&["--count", "0"], "a request for 0 CPUs"),
    ];
    for (args, message) in cases {
        let out = allocate(&root, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(out.stdout.is_empty(), "{args:?} printed CPUs");
        assert!(
            stderr.contains(message),
            "{args:?}: stderr {stderr:?} lacks {message:?}"
        );
    }
}

#[test]
fn missing_sysfs_root_is_reported_by_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = allocate(dir.path(), &["--count", "1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&dir.path().display().to_string()),
        "{stderr}"
    );
}

/// `inspect --format table` of a stopped daemon's store, on a machine with
/// adjacent SMT siblings and two CPUs offline: the golden page.
#[test]
fn table_of_a_stopped_daemons_store_on_a_machine_with_offline_cpus() {
    let (_guard, root) = tree("intel-2s-ht-adjacent-offline-96");
    let state = store_with_one_claim();
    let out = run(&[
        "inspect",
        "--from-store",
        "--format",
        "table",
        "--state-dir",
        state.path().to_str().expect("utf-8"),
        "--sysfs-root",
        root.to_str().expect("utf-8"),
        "--reserved-cpus",
        "0-1",
    ]);
    let text = stdout_ok(&out);
    let head = "\
CPUs of this node, revision 1, read from the store (dra-plugin is not running)
94 online: 2 reserved, 4 in 1 claim, 88 shared; offline: 94-95

socket 0
  NUMA node 0: CPUs 0-47 (48)
    [ 0=  1=] [ 2.  3.] [ 4.  5.] [ 6.  7.] [ 8.  9.] [10. 11.] [12. 13.] [14. 15.]
";
    assert!(text.starts_with(head), "\n{text}");
    let socket1 = "\
socket 1
  NUMA node 1: CPUs 48-93 (46)
    [48A 49A] [50A 51A] [52. 53.] [54. 55.] [56. 57.] [58. 59.] [60. 61.] [62. 63.]
";
    assert!(text.contains(socket1), "\n{text}");
    let legend = "
  =  reserved for system daemons: 0-1 (2)
  .  shared pool: 2-47,52-93 (88)
  A  trading/book  CPUs 48-51 (4)  pod pod-1  claim 7f3c  prepared 2026-12-03 00:00:05 UTC
";
    assert!(text.contains(legend), "\n{text}");
    // Not a terminal: no colour, whatever NO_COLOR says.
    assert!(!text.contains('\x1b'));
}

/// A stopped daemon's state directory whose store holds one claim of CPUs
/// 48-51.
fn store_with_one_claim() -> tempfile::TempDir {
    use shared_state::assignment::{AllocatedDevice, ClaimAssignment};
    use shared_state::store::sled_store::SledStore;
    use shared_state::store::AssignmentStore;
    let state = tempfile::tempdir().expect("temp dir");
    let store = SledStore::open(&state.path().join("store")).expect("store");
    store
        .put(&ClaimAssignment {
            claim_uid: "7f3c".into(),
            namespace: "trading".into(),
            name: "book".into(),
            consumer_pods: vec!["pod-1".into()],
            devices: vec![AllocatedDevice {
                request: "cpus".into(),
                pool: "node".into(),
                device: "cpudevnuma001".into(),
                consumed_cpus: Some(4),
                share_id: None,
            }],
            cpus: shared_state::CpuSet::parse_cpulist("48-51").expect("cpulist"),
            prepared_at_unix_ms: 1_796_256_005_000,
            pod_claim_name: None,
            tuning: Default::default(),
        })
        .expect("put");
    state
}

/// `inspect` under a terminal (util-linux `script` gives it a pty): the
/// table is the default there and coloured unless NO_COLOR is set; in a
/// pipe the default stays JSON.
#[test]
fn on_a_terminal_the_table_is_the_default_and_no_color_is_respected() {
    let (_guard, root) = tree("intel-2s-ht-adjacent-offline-96");
    let state = store_with_one_claim();
    let command = format!(
        "{} inspect --from-store --state-dir {} --sysfs-root {}",
        env!("CARGO_BIN_EXE_dra-plugin"),
        state.path().display(),
        root.display()
    );
    let on_terminal = |no_color: Option<&str>| -> String {
        let mut script = Command::new("script");
        script
            .args(["--quiet", "--return", "--command", &command, "/dev/null"])
            .env_remove("HOST_ROOT")
            .env_remove("NO_COLOR");
        if let Some(value) = no_color {
            script.env("NO_COLOR", value);
        }
        let out = match script.output() {
            Ok(out) => out,
            Err(e) => {
                // util-linux's `script` is in Debian's essential bsdutils.
                panic!("running script(1) for a pty: {e}");
            }
        };
        stdout_ok(&out).replace("\r\n", "\n")
    };
    let coloured = on_terminal(None);
    assert!(
        coloured.contains("CPUs of this node, revision 1"),
        "{coloured:?}"
    );
    assert!(coloured.contains("\x1b[1;31m48A\x1b[0m"), "{coloured:?}");
    let plain = on_terminal(Some("1"));
    assert!(plain.contains("[48A 49A] [50A 51A]"), "{plain:?}");
    assert!(!plain.contains('\x1b'), "{plain:?}");

    let piped = run(&[
        "inspect",
        "--from-store",
        "--state-dir",
        state.path().to_str().expect("utf-8"),
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout_ok(&piped)).expect("JSON");
    assert_eq!(report["exclusive"], "48-51");
}
