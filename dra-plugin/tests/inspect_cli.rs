//! The `topology` and `allocate` subcommands, run as the built binary over
//! unpacked sysfs fixtures of real machine shapes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures_dir() -> PathBuf {
    match std::env::var_os("DRA_CPU_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/sysfs"),
    }
}

/// Unpack `name.tar.gz` into a fresh temporary directory (kept alive by the
/// returned guard) and return the sysfs root inside it.
fn unpack(name: &str) -> (tempfile::TempDir, PathBuf) {
    let archive = fixtures_dir().join(format!("{name}.tar.gz"));
    let file = std::fs::File::open(&archive)
        .unwrap_or_else(|e| panic!("opening fixture {}: {e}", archive.display()));
    let dir = tempfile::tempdir().expect("temp dir");
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(dir.path())
        .unwrap_or_else(|e| panic!("unpacking {}: {e}", archive.display()));
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
    let (_guard, root) = unpack("intel-2s-snc2-ht-128");
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
    let (_guard, root) = unpack("intel-2s-ht-adjacent-offline-96");
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
    let (_intel_guard, intel) = unpack("intel-2s-snc2-ht-128");
    let (_amd_guard, amd) = unpack("amd-epyc-1s-8ccx-ht-128");
    let (_adj_guard, adjacent) = unpack("intel-2s-ht-adjacent-offline-96");
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
    let (_guard, root) = unpack("intel-2s-snc2-ht-128");
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
