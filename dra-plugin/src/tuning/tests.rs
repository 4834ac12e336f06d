//! The tuner against a fake `/proc` and `/sys` in a temporary directory:
//! plain files stand in for the kernel's, so these show the bookkeeping
//! (what is recorded, written and put back, across a crash and a reboot);
//! tests/tests/vm_node.rs shows it on a real kernel.

use super::*;
use shared_state::tuning::Tuning;

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
        let paths = KernelPaths {
            procfs: dir.path().join("proc"),
            host_root: dir.path().to_path_buf(),
            cgroup_root: dir.path().join("cgroup"),
        };
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
