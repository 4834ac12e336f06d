//! A CPU taken offline after dra-plugin started goes to no claim: the
//! driver reads the node's online list at every prepare (the sysfs tree of
//! a fixture machine, its `online` file rewritten as the kernel rewrites it).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{numbered_claim, written_tree, FIXTURE_NUMA_DEVICES, NODE};
use dra_plugin::cdi::CdiDir;
use dra_plugin::devices::{DeviceCatalog, DeviceMode, GroupBy};
use dra_plugin::driver::{Driver, DriverOptions};
use dra_plugin::metrics::Metrics;
use shared_state::alloc::Policy;
use shared_state::store::memory::MemoryStore;
use shared_state::topology::discover::read_online_cpus;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::path::Path;
use std::sync::Arc;

fn driver(root: &Path, cdi: &Path, watch_online: bool) -> Driver {
    let topology = Topology::discover(root).expect("fixture topology");
    let catalog = DeviceCatalog::new(
        &topology,
        &CpuSet::new(),
        DeviceMode::Grouped,
        GroupBy::Numanode,
    )
    .expect("catalog");
    let driver = Driver::open(
        DriverOptions {
            driver_name: common::DRIVER.into(),
            node_name: NODE.into(),
            reserved: CpuSet::new(),
            policy: Policy::Packed,
            mixed_allocation_mode: false,
            min_shared_cpus: 0,
        },
        catalog,
        &topology,
        Arc::new(MemoryStore::default()),
        CdiDir::new(cdi),
        Arc::new(Metrics::new()),
    )
    .expect("driver");
    if watch_online {
        driver.with_online_cpus(root.to_path_buf())
    } else {
        driver
    }
}

#[test]
fn a_cpu_taken_offline_after_start_goes_to_no_claim() {
    for watch_online in [true, false] {
        let tree = written_tree(common::FIXTURE);
        let cdi = tempfile::tempdir().unwrap();
        let driver = driver(tree.path(), cdi.path(), watch_online);
        let online = read_online_cpus(tree.path()).unwrap();
        let numa0 = driver
            .catalog()
            .cpus_of(FIXTURE_NUMA_DEVICES[0])
            .cloned()
            .unwrap();
        // The kernel's list after `echo 0 > cpuN/online` of the group's
        // first CPU.
        let gone = numa0.first().unwrap();
        let now = online.difference(&CpuSet::parse_cpulist(&gone.to_string()).unwrap());
        std::fs::write(
            tree.path().join("sys/devices/system/cpu/online"),
            format!("{}\n", now.to_cpulist()),
        )
        .unwrap();

        // The whole group: one CPU too many for what is online.
        let (whole, whole_object) =
            numbered_claim(1, NODE, FIXTURE_NUMA_DEVICES[0], numa0.len() as u32);
        let answer = driver.prepare(&whole, &whole_object);
        // All but one: every online CPU of the group.
        let (rest, rest_object) =
            numbered_claim(2, NODE, FIXTURE_NUMA_DEVICES[0], numa0.len() as u32 - 1);
        if watch_online {
            let error = answer.expect_err("more CPUs than the group has online");
            assert_eq!(error.reason(), "too_few_free", "{error}");
            let got = driver
                .prepare(&rest, &rest_object)
                .expect("the online rest");
            assert!(
                !got.assignment.cpus.contains(gone),
                "{}",
                got.assignment.cpus
            );
        } else {
            // Control: without the online list the offline CPU is given.
            let got = answer.expect("the whole group, offline CPU included");
            assert!(got.assignment.cpus.contains(gone));
        }
    }
}
