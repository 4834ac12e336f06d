//! The tuner against a fake `/proc` and `/sys` in a temporary directory:
//! plain files stand in for the kernel's, so these show the bookkeeping
//! (what is recorded, written and put back, across a crash and a reboot);
//! tests/tests/vm_node.rs shows it on a real kernel.

use super::*;
use shared_state::tuning::request::Tuning;

struct FakeNode {
    dir: tempfile::TempDir,
    paths: KernelPaths,
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse_cpulist(s).expect("cpulist")
}

impl FakeNode {
    /// Four CPUs, interrupts 1 (on 0-3), 2 (on 2) and 3 (on 0-1), idle
    /// bounds and governors on every CPU.
    fn new() -> FakeNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = KernelPaths::under(dir.path());
        let node = FakeNode { dir, paths };
        node.put(
            &node.paths.procfs.join("sys/kernel/random/boot_id"),
            "boot-1",
        );
        for (irq, cpus) in [(1, "0-3"), (2, "2"), (3, "0-1")] {
            node.put(&node.paths.irq_affinity(irq), cpus);
        }
        node.put(&node.paths.default_irq_affinity(), "f");
        for cpu in 0..4 {
            node.put(&node.paths.idle_latency(cpu), "0");
            node.put(&node.paths.governor(cpu), "powersave");
            node.put(
                &node.paths.host_root.join(format!(
                    "sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_available_governors"
                )),
                "performance powersave",
            );
        }
        node
    }

    fn put(&self, path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, format!("{text}\n")).expect("write");
    }

    fn get(&self, path: &Path) -> String {
        read_value(path).expect("read")
    }

    fn record(&self) -> PathBuf {
        self.dir.path().join("state/tuning-baseline.json")
    }

    fn tuner(&self) -> Result<NodeTuner, TuningError> {
        std::fs::create_dir_all(self.dir.path().join("state")).expect("mkdir");
        NodeTuner::open(
            self.paths.clone(),
            self.record(),
            set("0-3"),
            &set("0-3"),
            true,
        )
    }

    fn irqs(&self) -> Vec<String> {
        (1..=3)
            .map(|irq| self.get(&self.paths.irq_affinity(irq)))
            .collect()
    }

    /// Every value the tuner may change, to compare before and after.
    fn everything(&self) -> Vec<String> {
        let mut values = self.irqs();
        values.push(self.get(&self.paths.default_irq_affinity()));
        for cpu in 0..4 {
            values.push(self.get(&self.paths.idle_latency(cpu)));
            values.push(self.get(&self.paths.governor(cpu)));
        }
        values
    }
}

fn claim(uid: &str, cpus: &str, tuning: Tuning) -> TunedClaim {
    TunedClaim {
        claim_uid: uid.into(),
        cpus: set(cpus),
        tuning,
    }
}

fn isolated(uid: &str, cpus: &str) -> TunedClaim {
    claim(
        uid,
        cpus,
        Tuning {
            isolate_irqs: true,
            ..Tuning::default()
        },
    )
}

#[test]
fn interrupts_leave_the_claims_cpus_and_come_back_at_release() {
    let node = FakeNode::new();
    let before = node.everything();
    let tuner = node.tuner().expect("tuner");
    assert_eq!(tuner.support().check(&isolated("a", "2-3").tuning), Ok(()));
    tuner.add(isolated("a", "2-3")).expect("add");
    // 1 loses 2-3; 2 was only on 2, so it goes to the CPUs not isolated; 3 keeps 0-1.
    assert_eq!(node.irqs(), ["0-1", "0-1", "0-1"]);
    assert_eq!(
        CpuSet::parse_hex_mask(&node.get(&node.paths.default_irq_affinity())).expect("mask"),
        set("0-1")
    );
    assert!(node.record().exists(), "nothing recorded before the change");
    // A second claim narrows it further; releasing the first widens it again.
    tuner.add(isolated("b", "1")).expect("add b");
    assert_eq!(node.irqs(), ["0", "0", "0"]);
    tuner.remove("a").expect("remove a");
    assert_eq!(node.irqs(), ["0,2-3", "2", "0"]);
    tuner.remove("b").expect("remove b");
    assert_eq!(node.everything(), before);
    assert!(!node.record().exists(), "the record outlived the tuning");
}

#[test]
fn idle_bound_and_governor_are_per_cpu_and_come_back() {
    let node = FakeNode::new();
    let before = node.everything();
    let tuner = node.tuner().expect("tuner");
    let asked = Tuning {
        max_idle_latency_us: Some(0),
        governor: Some("performance".into()),
        ..Tuning::default()
    };
    tuner.add(claim("a", "1", asked)).expect("add");
    assert_eq!(node.get(&node.paths.idle_latency(1)), "n/a");
    assert_eq!(node.get(&node.paths.governor(1)), "performance");
    assert_eq!(
        node.get(&node.paths.idle_latency(0)),
        "0",
        "another CPU changed"
    );
    assert_eq!(node.irqs(), ["0-3", "2", "0-1"], "interrupts moved unasked");
    tuner.remove("a").expect("remove");
    assert_eq!(node.everything(), before);
}

#[test]
fn a_claim_without_node_knobs_touches_nothing() {
    let node = FakeNode::new();
    let tuner = node.tuner().expect("tuner");
    let quota_only = Tuning {
        cfs_quota_off: true,
        ..Tuning::default()
    };
    assert_eq!(
        tuner.add(claim("a", "1", quota_only)).expect("add"),
        Pass::default()
    );
    assert!(!node.record().exists());
}

#[test]
fn after_a_crash_the_next_start_puts_back_what_no_claim_holds() {
    let node = FakeNode::new();
    let before = node.everything();
    let all = Tuning {
        isolate_irqs: true,
        max_idle_latency_us: Some(10),
        governor: Some("performance".into()),
        ..Tuning::default()
    };
    node.tuner()
        .expect("tuner")
        .add(claim("a", "2-3", all.clone()))
        .expect("add");
    // The process dies here (dropped without unprepare); the claim was
    // unprepared while it was down, so the store no longer holds it.
    let restarted = node.tuner().expect("reopen");
    restarted.reconcile(Vec::new()).expect("reconcile");
    assert_eq!(node.everything(), before);
    assert!(!node.record().exists());

    // The control: the same crash without the record leaves the tuning.
    node.tuner()
        .expect("tuner")
        .add(claim("a", "2-3", all))
        .expect("add");
    let tuned = node.everything();
    std::fs::remove_file(node.record()).expect("remove the record");
    node.tuner()
        .expect("reopen")
        .reconcile(Vec::new())
        .expect("reconcile");
    assert_eq!(
        node.everything(),
        tuned,
        "something else put the values back"
    );
}

#[test]
fn a_stored_claim_is_tuned_again_at_start() {
    let node = FakeNode::new();
    let tuner = node.tuner().expect("tuner");
    tuner.add(isolated("a", "2-3")).expect("add");
    // Something else (the node's own boot scripts) reset one interrupt.
    node.put(&node.paths.irq_affinity(1), "0-3");
    drop(tuner);
    let restarted = node.tuner().expect("reopen");
    restarted
        .reconcile(vec![isolated("a", "2-3")])
        .expect("reconcile");
    assert_eq!(node.irqs(), ["0-1", "0-1", "0-1"]);
    // And its original is still the one from before the first tuning.
    restarted.remove("a").expect("remove");
    assert_eq!(node.irqs(), ["0-3", "2", "0-1"]);
}

#[test]
fn repair_undoes_a_rewrite_and_tunes_new_interrupts() {
    let node = FakeNode::new();
    let tuner = node.tuner().expect("tuner");
    tuner.add(isolated("a", "3")).expect("add");
    assert_eq!(node.irqs(), ["0-2", "2", "0-1"]);
    // An irqbalance moves interrupt 1 back; a device adds interrupt 9.
    node.put(&node.paths.irq_affinity(1), "0-3");
    node.put(&node.paths.irq_affinity(9), "3");
    let pass = tuner.repair().expect("repair");
    assert_eq!(pass.tuned, 2, "{pass:?}");
    assert_eq!(node.irqs(), ["0-2", "2", "0-1"]);
    assert_eq!(node.get(&node.paths.irq_affinity(9)), "0-2");
    tuner.remove("a").expect("remove");
    assert_eq!(node.get(&node.paths.irq_affinity(9)), "3");
    assert_eq!(node.irqs(), ["0-3", "2", "0-1"]);
}

#[test]
fn a_record_of_an_earlier_boot_is_dropped_not_written_back() {
    let node = FakeNode::new();
    node.tuner()
        .expect("tuner")
        .add(isolated("a", "2-3"))
        .expect("add");
    // Reboot: new boot id, the kernel's boot values (here: different ones).
    node.put(
        &node.paths.procfs.join("sys/kernel/random/boot_id"),
        "boot-2",
    );
    node.put(&node.paths.irq_affinity(1), "1");
    let restarted = node.tuner().expect("reopen");
    assert!(!node.record().exists(), "the old boot's record was kept");
    restarted.reconcile(Vec::new()).expect("reconcile");
    assert_eq!(node.get(&node.paths.irq_affinity(1)), "1");
}

#[test]
fn a_corrupt_record_is_refused_and_kept() {
    let node = FakeNode::new();
    std::fs::create_dir_all(node.dir.path().join("state")).expect("mkdir");
    std::fs::write(node.record(), b"{\"bootId\": 3").expect("write");
    let error = node.tuner().err().expect("a corrupt record was read");
    assert!(
        matches!(error, TuningError::CorruptRecord { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("restore them by hand"),
        "{error}"
    );
    assert!(node.record().exists());
}

#[test]
fn off_supports_nothing_but_still_restores() {
    let node = FakeNode::new();
    let before = node.everything();
    node.tuner()
        .expect("tuner")
        .add(isolated("a", "2-3"))
        .expect("add");
    let off = NodeTuner::open(
        node.paths.clone(),
        node.record(),
        set("0-3"),
        &set("0-3"),
        false,
    )
    .expect("open");
    let refused = off
        .support()
        .check(&isolated("b", "1").tuning)
        .expect_err("refused");
    assert!(
        refused.to_string().contains("--low-latency-tuning"),
        "{refused}"
    );
    off.reconcile(Vec::new()).expect("reconcile");
    assert_eq!(node.everything(), before);
}

/// A stand-in irqbalance on a socket, speaking its protocol as the real
/// one does (tests/tests/vm_node.rs talks to the real one): requests
/// without the sender's credentials go unanswered, `settings cpus` takes
/// effect at the next rescan (`rescan`), `setup` shows the banned CPUs.
struct FakeIrqBalance {
    state: std::sync::Arc<Mutex<FakeIrqBalanceState>>,
    socket: PathBuf,
}

#[derive(Debug, Default)]
struct FakeIrqBalanceState {
    /// Its configuration's banned CPUs.
    own: CpuSet,
    /// What the UI set (`settings cpus`), if anything.
    told: Option<CpuSet>,
    /// What it bans since its last rescan.
    banned: CpuSet,
    requests: Vec<String>,
}

impl FakeIrqBalance {
    fn start(dir: &Path, pid: u32, own: &str) -> FakeIrqBalance {
        use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned};
        use std::io::Write;
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(dir).expect("mkdir");
        let socket = dir.join(format!("irqbalance{pid}.sock"));
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        setsockopt(&listener, sockopt::PassCred, &true).expect("SO_PASSCRED");
        let state = std::sync::Arc::new(Mutex::new(FakeIrqBalanceState {
            own: set(own),
            banned: set(own),
            ..Default::default()
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut buf = [0u8; 4096];
                let mut cmsg = nix::cmsg_space!(libc::ucred);
                let mut iov = [std::io::IoSliceMut::new(&mut buf)];
                let Ok(msg) = recvmsg::<()>(
                    stream.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    nix::sys::socket::MsgFlags::empty(),
                ) else {
                    continue;
                };
                let root = msg.cmsgs().is_ok_and(|mut c| {
                    c.any(|c| matches!(c, ControlMessageOwned::ScmCredentials(cred) if cred.uid() == nix::unistd::getuid().as_raw()))
                });
                let len = msg.bytes;
                let text = String::from_utf8_lossy(&buf[..len]).into_owned();
                if !root {
                    continue;
                }
                let mut state = shared.lock().expect("lock");
                state.requests.push(text.clone());
                if text.starts_with("setup") {
                    let answer = format!("SLEEP 10 BANNED {}", state.banned.to_hex_mask());
                    let _ = stream.write_all(answer.as_bytes());
                } else if let Some(list) = text.strip_prefix("settings cpus ") {
                    state.told = if list.starts_with("NULL") {
                        None
                    } else {
                        Some(set(list))
                    };
                }
            }
        });
        FakeIrqBalance { state, socket }
    }

    fn rescan(&self) {
        let mut state = self.state.lock().expect("lock");
        state.banned = state.told.clone().unwrap_or_else(|| state.own.clone());
    }

    fn banned(&self) -> CpuSet {
        self.rescan();
        self.state.lock().expect("lock").banned.clone()
    }

    fn told_count(&self) -> usize {
        let state = self.state.lock().expect("lock");
        state
            .requests
            .iter()
            .filter(|r| r.starts_with("settings"))
            .count()
    }

    /// The daemon stops: its socket file stays, refusing connections.
    fn stop(self) {
        // The listener lives in its thread; a stale socket is what a killed
        // daemon leaves, so replace the file with one nobody listens on.
        std::fs::remove_file(&self.socket).expect("remove socket");
        drop(std::os::unix::net::UnixListener::bind(&self.socket).expect("stale socket"));
    }
}

#[test]
fn irqbalance_is_told_to_ban_the_isolated_cpus_with_its_own_and_handed_back() {
    let node = FakeNode::new();
    let daemon = FakeIrqBalance::start(&node.paths.irqbalance_dir, 700, "0");
    let tuner = node.tuner().expect("tuner");
    let pass = tuner.add(isolated("a", "2-3")).expect("add");
    assert_eq!(pass.irqbalance_error, None, "{pass:?}");
    assert_eq!(
        daemon.banned(),
        set("0,2-3"),
        "its own CPU was dropped: {pass:?} {:?}",
        daemon.state.lock().expect("lock")
    );
    // Its own banned CPU was recorded before it was told anything.
    let record = std::fs::read_to_string(node.record()).expect("record");
    assert!(record.contains("irqbalance700.sock"), "{record}");
    // Repair passes do not tell it again what it was told.
    tuner.repair().expect("repair");
    tuner.repair().expect("repair");
    assert_eq!(daemon.told_count(), 1);
    // A second claim widens the ban; releasing both hands it back.
    tuner.add(isolated("b", "1")).expect("add b");
    assert_eq!(daemon.banned(), set("0-3"));
    tuner.remove("a").expect("remove a");
    assert_eq!(daemon.banned(), set("0-1"));
    tuner.remove("b").expect("remove b");
    assert_eq!(daemon.banned(), set("0"));
    assert_eq!(
        daemon.state.lock().expect("lock").told,
        None,
        "not handed back to its configuration"
    );
    assert!(!node.record().exists(), "the record outlived the tuning");
}

#[test]
fn a_claim_tuned_right_after_a_release_keeps_irqbalances_own_cpus() {
    let node = FakeNode::new();
    let daemon = FakeIrqBalance::start(&node.paths.irqbalance_dir, 701, "0");
    let tuner = node.tuner().expect("tuner");
    tuner.add(isolated("a", "2-3")).expect("add");
    daemon.rescan();
    tuner.remove("a").expect("remove");
    // No rescan yet: it still shows 0,2-3 as banned.
    tuner.add(isolated("b", "1")).expect("add b");
    assert_eq!(
        daemon.banned(),
        set("0-1"),
        "the released claim's CPUs stayed banned"
    );
}

#[test]
fn a_restarted_irqbalance_is_told_again_and_a_crash_hands_it_back_at_start() {
    let node = FakeNode::new();
    let first = FakeIrqBalance::start(&node.paths.irqbalance_dir, 702, "");
    let tuner = node.tuner().expect("tuner");
    tuner.add(isolated("a", "3")).expect("add");
    assert_eq!(first.banned(), set("3"));
    // irqbalance restarts: the new daemon knows nothing of the setting.
    first.stop();
    let second = FakeIrqBalance::start(&node.paths.irqbalance_dir, 703, "1");
    let pass = tuner.repair().expect("repair");
    assert_eq!(pass.irqbalance_error, None);
    assert_eq!(second.banned(), set("1,3"));
    // dra-plugin dies; the claim is unprepared while it is away.
    drop(tuner);
    node.tuner()
        .expect("reopen")
        .reconcile(Vec::new())
        .expect("reconcile");
    assert_eq!(second.banned(), set("1"));
    assert_eq!(second.state.lock().expect("lock").told, None);
    assert!(!node.record().exists());
}

#[test]
fn an_irqbalance_that_does_not_answer_fails_nothing() {
    let node = FakeNode::new();
    let daemon = FakeIrqBalance::start(&node.paths.irqbalance_dir, 704, "");
    daemon.stop();
    let tuner = node.tuner().expect("tuner");
    let pass = tuner.add(isolated("a", "2-3")).expect("add");
    // A stale socket is no daemon: nothing to tell, and the interrupts moved.
    assert_eq!(pass.irqbalance_error, None);
    assert_eq!(node.irqs(), ["0-1", "0-1", "0-1"]);
    tuner.remove("a").expect("remove");
}
