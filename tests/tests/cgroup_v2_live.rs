//! Pod cgroup cleanup on a real cgroup2 hierarchy: the host's cgroup2 mount
//! (`/sys/fs/cgroup` on a v2 host, `/sys/fs/cgroup/unified` on a hybrid one
//! like this machine) gets a pod-shaped tree with a live process in a leaf;
//! the process's `/proc/<pid>/cgroup` names it on its `0::` line, and
//! removing the tree kills it and leaves nothing. Needs root.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use dra_cpu_tests::cgroup::hierarchy::CpusetHierarchy;
use dra_cpu_tests::cgroup::mounts::{cgroup_mounts, parse_proc_cgroup};
use dra_cpu_tests::cgroup::removal::remove_cgroup_tree;
use dra_cpu_tests::skip::skip_or_fail_in_ci;

fn cgroup2_mount() -> Option<PathBuf> {
    cgroup_mounts()
        .ok()?
        .into_iter()
        .find(|m| m.unified)
        .map(|m| m.mount_point)
}

#[test]
fn a_v2_pod_tree_is_killed_and_removed_leaf_first() {
    if !nix::unistd::geteuid().is_root() {
        skip_or_fail_in_ci("creating cgroups needs root");
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        skip_or_fail_in_ci("no cgroup2 hierarchy is mounted");
        return;
    };
    let top = mount.join(format!("dcpu-cgtest-{}", std::process::id()));
    let leaf = top.join("pod/c");
    std::fs::create_dir_all(&leaf).expect("create the cgroup tree");
    let mut sleeper = Command::new("sleep")
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    let pid = sleeper.id();
    std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).expect("move into the leaf");

    // The process names its cgroup on the single v2 line.
    let source = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&source).expect("read /proc/pid/cgroup");
    let entries = parse_proc_cgroup(&text, &source).expect("parse");
    let v2 = CpusetHierarchy::V2 {
        mount_point: mount.clone(),
    };
    let path = v2.path_of(&entries).expect("a 0:: line");
    assert_eq!(v2.dir_of(path), leaf, "{text}");

    let uses_kill = top.join("cgroup.kill").exists();
    remove_cgroup_tree(&top).expect("remove the tree");
    let status = sleeper.wait().expect("wait for sleep");
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert!(!top.exists(), "{} left", top.display());
    eprintln!(
        "killed through {}",
        if uses_kill {
            "cgroup.kill"
        } else {
            "SIGKILL to cgroup.procs"
        }
    );
}
