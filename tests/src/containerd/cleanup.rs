//! Cleaning up after a containerd, by PID and by path: its processes, pod
//! cgroups, mounts and shim sockets, and the directories of crashed runs.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::config::{shim_socket_path, InstancePaths};
use super::{CRI_NAMESPACE, INSTANCE_PREFIX};
use crate::cgroup;
use crate::cri::spec::pod_cgroup_parent;

/// Field 22 (start time in clock ticks) of `/proc/<pid>/stat` text; the
/// command name before it may contain spaces and parentheses.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // after_name starts with field 3 (state); field 22 is 19 further.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

pub(super) fn process_start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The owner record `"<pid> <start time>"` of an instance directory.
pub fn parse_owner(text: &str) -> Option<(u32, u64)> {
    let mut parts = text.split_whitespace();
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    Some((pid, start))
}

fn owner_alive(owner_file: &Path) -> bool {
    let Some((pid, start)) = std::fs::read_to_string(owner_file)
        .ok()
        .as_deref()
        .and_then(parse_owner)
    else {
        return false;
    };
    process_start_time(pid) == Some(start)
}

/// Processes whose command line says they belong to the instance at
/// `paths`: its containerd (`--config <dir>/config.toml`) and its shims
/// (`-address <dir>/cri.sock`).
pub fn instance_processes(paths: &InstancePaths) -> Vec<u32> {
    let config = paths.config().to_string_lossy().to_string();
    let address = paths.cri_socket().to_string_lossy().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own_pid = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own_pid)
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.windows(2).any(|pair| {
                let (flag, value) = (pair[0], pair[1]);
                ((flag == b"--config" || flag == b"-c") && value == config.as_bytes())
                    || ((flag == b"-address" || flag == b"--address")
                        && value == address.as_bytes())
            })
        })
        .collect()
}

fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        // A zombie child of ours still has a /proc entry; reap it if it is one.
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid as i32),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if state
            .rsplit_once(')')
            .map(|(_, s)| s.trim_start().starts_with('Z'))
            == Some(true)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Mount points under `dir` in this mount namespace, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Task ids (containers and sandboxes) containerd keeps state for.
fn task_ids(paths: &InstancePaths) -> Vec<String> {
    let dir = paths
        .state()
        .join("io.containerd.runtime.v2.task")
        .join(CRI_NAMESPACE);
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes everything an instance left: processes, pod cgroups, mounts,
/// shim sockets, its directory. Used by `stop`, by `Drop` and by the reaper.
/// Returns what could not be cleaned.
pub fn clean_instance(paths: &InstancePaths) -> Vec<String> {
    let mut problems = Vec::new();
    // Shim sockets are named by task id; learn the ids before state goes.
    let ids = task_ids(paths);
    for pid in instance_processes(paths) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        if !wait_gone(pid, Duration::from_secs(5)) {
            problems.push(format!("process {pid} survived SIGKILL"));
        }
    }
    let uids = std::fs::read_to_string(paths.pod_ledger()).unwrap_or_default();
    for uid in uids.lines().map(str::trim).filter(|u| !u.is_empty()) {
        if let Err(e) = cgroup::removal::remove_everywhere(&pod_cgroup_parent(uid)) {
            problems.push(e.to_string());
        }
    }
    for point in mounts_under(&paths.dir) {
        if let Err(e) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
            problems.push(format!("cannot unmount {}: {e}", point.display()));
        }
    }
    for id in &ids {
        let socket = shim_socket_path(&paths.cri_socket(), CRI_NAMESPACE, id);
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => problems.push(format!("cannot remove {}: {e}", socket.display())),
        }
    }
    let left_mounted = mounts_under(&paths.dir);
    if !left_mounted.is_empty() {
        // Deleting through a live mount could reach files that are not ours.
        problems.push(format!("still mounted, directory kept: {left_mounted:?}"));
        return problems;
    }
    match std::fs::remove_dir_all(&paths.dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => problems.push(format!("cannot remove {}: {e}", paths.dir.display())),
    }
    problems
}

/// Cleans every instance directory under `parent` whose owner process is
/// gone (a crashed or killed test run). Returns the directories reaped.
pub fn reap_stale_instances(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut reaped = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(INSTANCE_PREFIX) {
            continue;
        }
        let paths = InstancePaths { dir: entry.path() };
        // Only directories this harness made carry an owner file; one being
        // created right now has its owner alive.
        if !paths.owner().exists() || owner_alive(&paths.owner()) {
            continue;
        }
        let problems = clean_instance(&paths);
        if !problems.is_empty() {
            eprintln!(
                "containerd harness: stale instance {} not fully cleaned: {problems:?}",
                paths.dir.display()
            );
        }
        reaped.push(paths.dir);
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerd::OWNER_FILE;

    #[test]
    fn start_time_parsing_survives_odd_command_names() {
        let fields_after: String = (3..=52).map(|i| format!(" {i}")).collect();
        let table = [
            (format!("1 (sleep){fields_after}"), Some(22)),
            (format!("77 (a b) (c){fields_after}"), Some(22)),
            ("1 (x) S 1".to_string(), None),
            ("garbage".to_string(), None),
        ];
        for (stat, expected) in table {
            assert_eq!(parse_start_time(&stat), expected, "{stat}");
        }
        let own = process_start_time(std::process::id());
        assert!(own.is_some());
    }

    #[test]
    fn owner_records_parse() {
        let table = [
            ("12 345\n", Some((12, 345))),
            ("12", None),
            ("x 1", None),
            ("", None),
        ];
        for (text, expected) in table {
            assert_eq!(parse_owner(text), expected, "{text:?}");
        }
    }

    #[test]
    fn reaper_cleans_dead_owners_and_keeps_live_ones() {
        let parent = tempfile::tempdir().unwrap();
        let dead = parent.path().join(format!("{INSTANCE_PREFIX}dead"));
        let live = parent.path().join(format!("{INSTANCE_PREFIX}live"));
        let foreign = parent.path().join(format!("{INSTANCE_PREFIX}foreign"));
        for dir in [&dead, &live, &foreign] {
            std::fs::create_dir_all(dir.join("state")).unwrap();
        }
        // A pid that cannot exist (above pid_max) stands for a dead owner.
        std::fs::write(dead.join(OWNER_FILE), "4194304999 1\n").unwrap();
        let me = std::process::id();
        let start = process_start_time(me).unwrap();
        std::fs::write(live.join(OWNER_FILE), format!("{me} {start}\n")).unwrap();
        let reaped = reap_stale_instances(parent.path());
        assert_eq!(reaped, vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(live.exists());
        assert!(
            foreign.exists(),
            "a directory without an owner file is not ours"
        );
    }
}
