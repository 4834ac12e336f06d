//! The nri-plugin binary refuses bad settings at start, naming what is wrong.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-plugin"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run nri-plugin");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_settings_are_refused_with_the_offending_value() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("nri-plugin.yaml");
    std::fs::write(&config, "plugin-indx: \"10\"\n").expect("config");
    let config = config.to_string_lossy().into_owned();
    let missing_sysfs = dir.path().join("no-sysfs").to_string_lossy().into_owned();
    let cases: [(&[&str], &str); 4] = [
        (&["--config", &config], "unknown field `plugin-indx`"),
        (
            &["--plugin-index", "1"],
            "plugin index \"1\" must be exactly two digits",
        ),
        (&["--unsolicited-updates", "sometimes"], "sometimes"),
        (&["--sysfs-root", &missing_sysfs], "discovering CPUs under"),
    ];
    for (args, needle) in cases {
        let (ok, stderr) = run(args);
        assert!(!ok, "{args:?} must fail");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("Stack backtrace"), "{stderr}");
    }
}

#[test]
fn a_refused_host_cgroup_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("cgroup");
    std::fs::create_dir_all(root.join("kubepods.slice")).expect("mkdir");
    std::fs::create_dir_all(root.join("all.slice/kubepods")).expect("mkdir");
    for d in [root.clone(), root.join("all.slice")] {
        std::fs::write(d.join("cgroup.controllers"), "cpuset\n").expect("controllers");
    }
    let root = root.to_string_lossy().into_owned();
    let state = dir.path().join("state").to_string_lossy().into_owned();
    let cases: [(&str, &str); 4] = [
        ("../etc", "'..' would leave the cgroup root"),
        ("kubepods.slice", "holds pod cgroups"),
        ("all.slice", "all.slice/kubepods"),
        ("system.slice", "does not exist"),
    ];
    for (path, needle) in cases {
        let (ok, stderr) = run(&[
            "--host-cgroups",
            path,
            "--cgroup-root",
            &root,
            "--state-dir",
            &state,
            "--metrics-address",
            "127.0.0.1:0",
        ]);
        assert!(!ok, "{path} must be refused");
        assert!(
            stderr.contains(needle) && stderr.contains("--host-cgroups"),
            "{path}: {stderr}"
        );
    }
}

#[test]
fn every_flag_is_offered() {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-plugin"))
        .arg("--help")
        .output()
        .expect("help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    for flag in [
        "--nri-socket",
        "--plugin-name",
        "--plugin-index",
        "--coordination-socket",
        "--cdi-dir",
        "--mixed-allocation-mode",
        "--unsolicited-updates",
        "--align-memory",
        "--metrics-address",
        "--log-format",
        "--sysfs-root",
        "--reserved-cpus",
        "--host-cgroups",
        "--cgroup-root",
        "--state-dir",
        "--config",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}
