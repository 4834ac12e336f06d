//! `dra-plugin inspect --format table` and `--watch` as the built binary
//! against a live daemon: the grid of the fixture machine, a new frame when
//! a claim is prepared and when it is unprepared, and a clean exit on Ctrl-C.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cpus_of, pod_uid, prepare_ok, Node, WAIT};
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_plugin::devices::DeviceMode;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

/// The line that ends every table frame.
const FRAME_END: &str = "Containers are not shown";

fn inspect(node: &Node) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dra-plugin"));
    command
        .arg("inspect")
        .arg("--state-dir")
        .arg(&node.config.state_dir)
        .arg("--sysfs-root")
        .arg(&node.config.sysfs_root)
        .env_remove("HOST_ROOT")
        .env_remove("NO_COLOR");
    command
}

/// Frames of a running `inspect --watch`, read on a thread.
struct Frames {
    child: Child,
    frames: mpsc::Receiver<String>,
}

impl Frames {
    fn start(node: &Node) -> Frames {
        let mut child = inspect(node)
            .args(["--watch", "--format", "table"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn inspect --watch");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            let mut frame = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Frames in a pipe are separated by a blank line.
                if frame.is_empty() && line.is_empty() {
                    continue;
                }
                frame.push_str(&line);
                frame.push('\n');
                if line.starts_with(FRAME_END) && tx.send(std::mem::take(&mut frame)).is_err() {
                    break;
                }
            }
        });
        Frames { child, frames }
    }

    /// The next frame, within [`WAIT`].
    fn next(&mut self, what: &str) -> String {
        match self.frames.recv_timeout(WAIT) {
            Ok(frame) => frame,
            Err(e) => {
                let _ = self.child.kill();
                let output = self.child.wait_with_output_ref();
                panic!("no frame {what} within {WAIT:?} ({e}); stderr: {output}");
            }
        }
    }
}

trait StderrOf {
    fn wait_with_output_ref(&mut self) -> String;
}

impl StderrOf for Child {
    fn wait_with_output_ref(&mut self) -> String {
        let _ = self.wait();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        stderr
    }
}

fn header_line(frame: &str) -> &str {
    frame.lines().next().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_on_prepare_and_unprepare_and_exits_on_ctrl_c() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let mut frames = Frames::start(&node);

    let first = frames.next("at subscription");
    assert!(
        header_line(&first).ends_with("read from the running dra-plugin"),
        "{first}"
    );
    assert!(
        first.contains("128 online: 0 reserved, 0 in 0 claims, 128 shared"),
        "{first}"
    );
    // The fixture's 2 sockets and 4 NUMA nodes, siblings N and N+64 in one
    // cell.
    for heading in [
        "socket 0\n  NUMA node 0: CPUs 0-15,64-79 (32)\n    [  0.  64.] [  1.  65.]",
        "socket 1\n  NUMA node 2: CPUs 32-47,96-111 (32)\n",
    ] {
        assert!(first.contains(heading), "{heading:?} missing:\n{first}");
    }

    let claim = node.claim("web", &[("cpudevnuma001", Some("4"))], &pod_uid(1));
    prepare_ok(&running.kubelet, &claim).await;
    let cpus = cpus_of(&node, &claim);

    let after_prepare = frames.next("after the prepare");
    assert_ne!(header_line(&after_prepare), header_line(&first));
    let key_line = format!(
        "  A  default/web  CPUs {cpus} (4)  pod {}  claim {}",
        pod_uid(1),
        claim.uid
    );
    assert!(
        after_prepare.contains(&key_line),
        "{key_line:?} missing:\n{after_prepare}"
    );
    for cpu in &cpus {
        assert!(
            after_prepare.contains(&format!("{cpu:>3}A")),
            "CPU {cpu} not marked A:\n{after_prepare}"
        );
    }
    assert!(
        after_prepare.contains("128 online: 0 reserved, 4 in 1 claim, 124 shared"),
        "{after_prepare}"
    );

    // A one-shot table of the same state is the same page.
    let once = {
        let command = inspect(&node).args(["--format", "table"]).output();
        tokio::task::spawn_blocking(move || command)
            .await
            .expect("join")
            .expect("inspect --format table")
    };
    assert!(
        once.status.success(),
        "{}",
        String::from_utf8_lossy(&once.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&once.stdout), after_prepare);
    assert!(!after_prepare.contains('\x1b'), "colour in a pipe");

    running
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .expect("unprepare");
    let after_unprepare = frames.next("after the unprepare");
    assert!(!after_unprepare.contains("  A  "), "{after_unprepare}");
    assert!(
        after_unprepare.contains("0 in 0 claims, 128 shared"),
        "{after_unprepare}"
    );

    // Ctrl-C ends the watch with success.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(frames.child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = frames.child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = frames.child.kill();
            panic!("inspect --watch did not exit on SIGINT within {WAIT:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let stderr = frames.child.wait_with_output_ref();
    assert!(status.success(), "exit {status:?}: {stderr}");
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_as_json_prints_one_line_per_change() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let mut child = inspect(&node)
        .args(["--watch", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| -> serde_json::Value {
        let line = lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("no line {what}: {e}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: {e}: {line}"))
    };
    let first = next("at subscription");
    assert_eq!(first["claims"], serde_json::json!([]));
    let claim = node.claim("db", &[("cpudevnuma002", Some("2"))], &pod_uid(2));
    running
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .expect("prepare");
    let second = next("after the prepare");
    assert_eq!(second["claims"][0]["uid"], claim.uid.as_str());
    assert_eq!(
        second["exclusive"],
        cpus_of(&node, &claim).to_cpulist().as_str()
    );
    assert!(second["revision"].as_u64() > first["revision"].as_u64());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "exit {status:?}");
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_the_daemon_through_a_restart() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let mut frames = Frames::start(&node);
    frames.next("at subscription");
    let claim = node.claim("kept", &[("cpudevnuma003", Some("2"))], &pod_uid(3));
    running
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .expect("prepare");
    let prepared = frames.next("after the prepare");
    assert!(prepared.contains("  A  default/kept  CPUs "), "{prepared}");

    running.stop().await.expect("clean stop");
    // Away for about four retries: the watch waits, saying so once (twice
    // at most, if the restarting daemon's socket answers differently).
    tokio::time::sleep(std::time::Duration::from_millis(4500)).await;
    let running = node.start(DraVersion::V1).await;
    let after_restart = frames.next("after the daemon's restart");
    // The restarted daemon's snapshot: the claim kept its CPUs.
    assert_eq!(after_restart, prepared);

    let pid = nix::unistd::Pid::from_raw(i32::try_from(frames.child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let stderr = tokio::task::spawn_blocking(move || frames.child.wait_with_output_ref())
        .await
        .expect("join");
    let reports = stderr.matches("no stream from the daemon").count();
    assert!((1..=2).contains(&reports), "{stderr}");
    running.stop().await.expect("clean stop");
}

#[test]
fn watch_refuses_the_store() {
    let output = Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .args(["inspect", "--watch", "--from-store"])
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--from-store"), "{stderr}");
}
