//! Claims' tuning across a power cut, on the VM node's kernel:
//! `scripts/vm-node-tests.sh` boots it with a writable disk and `--reboot`,
//! so this test runs once before the cut and once after.
//!
//! Before: a claim asking `irqs: isolate` and an idle bound of 0 is
//! prepared; the kernel is checked tuned; the power is cut (sysrq b, no
//! sync). After: the kernel holds its boot values again and dra-plugin
//! starts on the store the cut left. The claim is still prepared, so its
//! CPUs are tuned again at start (the record of the earlier boot is not
//! written back); unprepared, every value is the boot's again.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cut_power, pod_uid, prepare_one, unprepare_one, Node, DRIVER};
use dra_cpu_tests::interrupts::KernelTuning;
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_plugin::devices::DeviceMode;
use serde_json::json;
use shared_state::CpuSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// On the VM's root disk, which the cut leaves as its last flush left it.
const STATE_DIR: &str = "/var/lib/dra-cpu-tuning-cut";
/// Which side of the cut a boot is on: absent before, the claim's CPUs after.
const PHASE_FILE: &str = "/var/lib/dra-cpu-tuning-cut.phase";
/// Claim UIDs are the same on both boots.
const UID_SEED: u64 = 7;

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .trim()
        .to_string()
}

fn kernel_values() -> KernelTuning {
    let online = CpuSet::parse_cpulist(&read("/sys/devices/system/cpu/online")).expect("online");
    KernelTuning::read(&online).expect("the kernel's tuning")
}

/// The kernel holds, on `cpus`, what the claim asked, and elsewhere the
/// boot's values.
fn assert_tuned(boot: &KernelTuning, cpus: &CpuSet, when: &str) {
    let now = kernel_values();
    assert!(
        now.default_irq_affinity.is_disjoint(cpus),
        "{when}: new interrupts may target {}",
        now.default_irq_affinity
    );
    let left = now.movable_irqs_on(cpus);
    assert!(left.is_empty(), "{when}: interrupts {left:?} target {cpus}");
    for (cpu, value) in &now.idle_latency {
        // A kernel without the file has none on any CPU.
        let want = if cpus.contains(*cpu) {
            value.as_ref().map(|_| "n/a".to_string())
        } else {
            boot.idle_latency.get(cpu).cloned().flatten()
        };
        assert_eq!(value, &want, "{when}: CPU {cpu}'s idle bound");
    }
}

fn write_synced(path: &str, text: &str) {
    let mut file = std::fs::File::create(path).expect("phase file");
    file.write_all(text.as_bytes()).expect("writing the phase");
    file.sync_all().expect("syncing the phase");
    std::fs::File::open(Path::new(path).parent().expect("parent"))
        .and_then(|d| d.sync_all())
        .expect("syncing its directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "cuts the power of the machine it runs on: only in the VM node, through scripts/vm-node-tests.sh"]
async fn tuning_is_restored_for_stored_claims_and_put_back_after_a_power_cut() {
    assert!(
        std::env::var_os("DRA_CPU_VM_NODE").is_some(),
        "this test reboots the machine without syncing: run it in the VM node (scripts/vm-node-tests.sh)"
    );
    // The kernel's values of this boot, before dra-plugin starts.
    let boot = kernel_values();
    let phase = std::fs::read_to_string(PHASE_FILE).ok();
    if phase.is_none() {
        let _ = std::fs::remove_dir_all(STATE_DIR);
    }
    let node = Node::with(DeviceMode::Grouped, |s| {
        s.state_dir = Some(PathBuf::from(STATE_DIR));
        s.sysfs_root = Some(PathBuf::from("/"));
        s.low_latency_tuning = Some(true);
    });
    node.api.seed_uids(UID_SEED);
    let claim = node.claim_configured(
        "tuned",
        Some(vec![(
            DRIVER.to_string(),
            node.config.node_name.clone(),
            "cpudevnuma001".to_string(),
            Some("2".to_string()),
        )]),
        Some(&pod_uid(1)),
        Some(json!({
            "apiVersion": "v1alpha1",
            "tuning": {"irqs": "isolate", "idle": {"maxLatencyMicroseconds": 0}}
        })),
    );
    let running = node.start(DraVersion::V1).await;
    match phase {
        None => {
            let cpus = prepare_one(&running.kubelet, &node, &claim)
                .await
                .expect("the prepare answered");
            assert_tuned(&boot, &cpus, "prepared");
            eprintln!("prepared on {cpus}, tuned; cutting the power");
            write_synced(PHASE_FILE, &cpus.to_cpulist());
            cut_power();
        }
        Some(cpus) => {
            let cpus = CpuSet::parse_cpulist(cpus.trim()).expect("the phase file's CPUs");
            // The record of the earlier boot is not written back; the
            // stored claim is tuned again by the start.
            assert_tuned(&boot, &cpus, "after the cut, at start");
            unprepare_one(&running.kubelet, &claim)
                .await
                .expect("the unprepare answered");
            assert_eq!(
                kernel_values(),
                boot,
                "after the unprepare that follows the cut"
            );
            eprintln!("after the cut: {cpus} tuned again at start, and the boot's values back after unprepare");
            running.stop().await.expect("a clean stop");
            std::fs::remove_file(PHASE_FILE).expect("removing the phase file");
            let _ = std::fs::remove_dir_all(STATE_DIR);
        }
    }
}
