//! A CPU taken offline after dra-plugin started goes to no claim and
//! leaves the shared pool: the driver reads the node's online list at every
//! prepare and when it is asked to follow it (the sysfs tree of a fixture
//! machine, its `online` file rewritten as the kernel rewrites it).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{numbered_claim, written_tree, FIXTURE_NUMA_DEVICES, NODE};
use dra_plugin::cdi::CdiDir;
use dra_plugin::devices::{DeviceCatalog, DeviceMode, GroupBy};
use dra_plugin::driver::{Driver, DriverOptions, StateEvent};
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

fn write_online(root: &Path, online: &CpuSet) {
    std::fs::write(
        root.join("sys/devices/system/cpu/online"),
        format!("{}\n", online.to_cpulist()),
    )
    .unwrap();
}

#[test]
fn the_shared_pool_follows_cpus_going_offline_and_coming_back() {
    for watch_online in [true, false] {
        let tree = written_tree(common::FIXTURE);
        let cdi = tempfile::tempdir().unwrap();
        let driver = driver(tree.path(), cdi.path(), watch_online);
        let online = read_online_cpus(tree.path()).unwrap();
        let numa1 = driver
            .catalog()
            .cpus_of(FIXTURE_NUMA_DEVICES[1])
            .cloned()
            .unwrap();
        // A claim holds NUMA node 1; CPUs going offline are one of its own
        // and one of the shared pool's.
        let (claim, object) = numbered_claim(1, NODE, FIXTURE_NUMA_DEVICES[1], 2);
        let held = driver.prepare(&claim, &object).unwrap().assignment.cpus;
        let (_, mut events) = driver.subscribe();
        let revision = driver.revision();
        let claim_cpu = held.first().unwrap();
        let shared_cpu = driver
            .catalog()
            .allocatable()
            .difference(&numa1)
            .iter()
            .last()
            .unwrap();
        let gone = CpuSet::parse_cpulist(&format!("{claim_cpu},{shared_cpu}")).unwrap();

        assert_eq!(driver.follow_online_cpus(), None, "nothing changed yet");
        write_online(tree.path(), &online.difference(&gone));
        let followed = driver.follow_online_cpus();
        // Read again without a change: no second event.
        let again = driver.follow_online_cpus();
        write_online(tree.path(), &online);
        let back = driver.follow_online_cpus();
        if !watch_online {
            // Control: without the online list nothing is followed.
            assert_eq!((followed, again, back), (None, None, None));
            assert!(events.try_recv().is_err());
            assert!(driver.snapshot().allocatable.contains(shared_cpu));
            continue;
        }
        assert_eq!(followed, Some(gone.clone()));
        assert_eq!(again, None);
        assert_eq!(back, Some(CpuSet::new()));
        let Ok(StateEvent::Node(offline)) = events.try_recv() else {
            panic!("a node event when the CPUs went offline");
        };
        assert_eq!(offline.revision, revision, "no store change");
        assert_eq!(
            offline.allocatable,
            driver.catalog().allocatable().difference(&gone)
        );
        // The claim keeps its CPUs, the offline one too: it is the claim's
        // own, and nri-plugin keeps a stored claim as it is.
        assert_eq!(offline.claims.len(), 1);
        assert_eq!(offline.claims[0].cpus, held);
        let Ok(StateEvent::Node(online_again)) = events.try_recv() else {
            panic!("a node event when the CPUs came back");
        };
        assert_eq!(&online_again.allocatable, driver.catalog().allocatable());
        assert!(events.try_recv().is_err(), "one event per change");
        // An unreadable or empty list says nothing: the last reading stands.
        write_online(tree.path(), &online.difference(&gone));
        assert_eq!(driver.follow_online_cpus(), Some(gone.clone()));
        write_online(tree.path(), &CpuSet::new());
        assert_eq!(driver.follow_online_cpus(), None, "an empty list");
        std::fs::remove_file(tree.path().join("sys/devices/system/cpu/online")).unwrap();
        assert_eq!(driver.follow_online_cpus(), None, "no list");
        assert!(!driver.snapshot().allocatable.contains(shared_cpu));
    }
}

/// A prepare reads the online list itself: a change it finds first goes to
/// subscribers before the claim's own event, so nri-plugin's pool knows a
/// CPU back online before a claim on it arrives.
#[test]
fn a_prepare_tells_subscribers_of_a_change_before_its_claim() {
    let tree = written_tree(common::FIXTURE);
    let cdi = tempfile::tempdir().unwrap();
    let driver = driver(tree.path(), cdi.path(), true);
    let online = read_online_cpus(tree.path()).unwrap();
    let numa0 = driver
        .catalog()
        .cpus_of(FIXTURE_NUMA_DEVICES[0])
        .cloned()
        .unwrap();
    let gone = numa0.first().unwrap();
    let without: CpuSet = online.iter().filter(|&c| c != gone).collect();
    write_online(tree.path(), &without);
    assert!(driver.follow_online_cpus().is_some());
    let (_, mut events) = driver.subscribe();

    // Back online; the next tick has not come, the prepare finds it.
    write_online(tree.path(), &online);
    let (whole, object) = numbered_claim(1, NODE, FIXTURE_NUMA_DEVICES[0], numa0.len() as u32);
    let got = driver
        .prepare(&whole, &object)
        .expect("the whole group, back online");
    assert!(got.assignment.cpus.contains(gone));
    let Ok(StateEvent::Node(node)) = events.try_recv() else {
        panic!("the change comes first");
    };
    assert!(node.allocatable.contains(gone));
    assert!(matches!(events.try_recv(), Ok(StateEvent::Prepared { .. })));
    assert_eq!(driver.follow_online_cpus(), None, "already told");
}
