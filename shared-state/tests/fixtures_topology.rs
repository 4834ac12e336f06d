//! Discovery over the sysfs trees of the named machines
//! (`shared_state::topology::sysfs_tree`), checked against what each machine
//! is, as written down in the table below independently of the generator,
//! and, where `lscpu` is installed, against `lscpu --sysroot` reading the
//! same tree.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared_state::topology::sysfs_tree::{self, NAMED};
use shared_state::topology::{CoreType, Topology, TopologyReport};
use shared_state::CpuSet;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// How the hardware threads of a core are numbered.
#[derive(Debug, Clone, Copy)]
enum Siblings {
    /// No SMT: every CPU is its own core.
    Single,
    /// Threads-last numbering: CPU N and N+offset share a core.
    PlusOffset(u32),
    /// CPU 2k and 2k+1 share a core.
    Adjacent,
}

impl Siblings {
    fn of(self, cpu: u32) -> CpuSet {
        match self {
            Siblings::Single => [cpu].into_iter().collect(),
            Siblings::PlusOffset(n) => [cpu % n, cpu % n + n].into_iter().collect(),
            Siblings::Adjacent => [cpu & !1, cpu | 1].into_iter().collect(),
        }
    }
}

/// What one named machine is.
struct Expected {
    name: &'static str,
    online: &'static str,
    offline: &'static str,
    /// Online CPUs in each socket, NUMA node and L3 group, in id order; the
    /// number of entries is the count of each.
    socket_sizes: &'static [usize],
    numa_sizes: &'static [usize],
    l3_sizes: &'static [usize],
    smt_width: usize,
    /// Sibling pattern of the standard / P-core CPUs.
    siblings: Siblings,
    isolated: &'static str,
    /// E-cores of a hybrid part (single-threaded); empty elsewhere.
    e_cores: &'static str,
    /// CPUs sharing a `cluster_id` where the machine describes clusters.
    cpus_per_cluster: Option<usize>,
}

const EXPECTED: &[Expected] = &[
    Expected {
        name: "intel-2s-snc2-ht-128",
        online: "0-127",
        offline: "",
        socket_sizes: &[64, 64],
        numa_sizes: &[32; 4],
        l3_sizes: &[32; 4],
        smt_width: 2,
        siblings: Siblings::PlusOffset(64),
        isolated: "",
        e_cores: "",
        cpus_per_cluster: None,
    },
    Expected {
        name: "amd-epyc-1s-8ccx-ht-128",
        online: "0-127",
        offline: "",
        socket_sizes: &[128],
        numa_sizes: &[128],
        l3_sizes: &[16; 8],
        smt_width: 2,
        siblings: Siblings::PlusOffset(64),
        isolated: "",
        e_cores: "",
        cpus_per_cluster: None,
    },
    Expected {
        name: "arm-1s-80c-nosmt",
        online: "0-79",
        offline: "",
        socket_sizes: &[80],
        numa_sizes: &[80],
        l3_sizes: &[],
        smt_width: 1,
        siblings: Siblings::Single,
        isolated: "",
        e_cores: "",
        cpus_per_cluster: Some(2),
    },
    Expected {
        name: "hybrid-8p16e-32",
        online: "0-31",
        offline: "",
        socket_sizes: &[32],
        numa_sizes: &[32],
        l3_sizes: &[32],
        smt_width: 2,
        // 8 two-thread P-cores and 16 E-cores: thread 0 of every core is
        // 0-23, thread 1 of the P-cores is 24-31.
        siblings: Siblings::PlusOffset(24),
        isolated: "",
        e_cores: "8-23",
        cpus_per_cluster: None,
    },
    Expected {
        name: "vm-2c-nosmt",
        online: "0-1",
        offline: "",
        socket_sizes: &[2],
        numa_sizes: &[2],
        l3_sizes: &[2],
        smt_width: 1,
        siblings: Siblings::Single,
        isolated: "",
        e_cores: "",
        cpus_per_cluster: None,
    },
    Expected {
        name: "intel-2s-ht-adjacent-offline-96",
        online: "0-93",
        offline: "94-95",
        socket_sizes: &[48, 46],
        numa_sizes: &[48, 46],
        l3_sizes: &[48, 46],
        smt_width: 2,
        siblings: Siblings::Adjacent,
        isolated: "2-3",
        e_cores: "",
        cpus_per_cluster: None,
    },
];

fn set(s: &str) -> CpuSet {
    CpuSet::parse_cpulist(s).expect("cpulist")
}

/// The tree of machine `name`, written into a fresh temporary directory
/// (removed when the returned guard is dropped).
fn written(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    sysfs_tree::write_named(name, dir.path()).unwrap_or_else(|e| panic!("writing {name}: {e}"));
    dir
}

#[test]
fn every_machine_has_expectations_and_every_expectation_a_machine() {
    let named: BTreeSet<String> = NAMED.iter().map(|n| n.to_string()).collect();
    let listed: BTreeSet<String> = EXPECTED.iter().map(|e| e.name.to_string()).collect();
    assert_eq!(named, listed, "named machines vs. the expectations table");
}

#[test]
fn every_machine_discovers_as_described() {
    for want in EXPECTED {
        let root = written(want.name);
        let topo = Topology::discover(root.path()).unwrap_or_else(|e| panic!("{}: {e}", want.name));
        check_description(want, &topo);
        check_invariants(want.name, &topo);
        check_report(want.name, &topo);
        check_against_lscpu(want.name, root.path(), &topo);
    }
}

fn check_description(want: &Expected, topo: &Topology) {
    let name = want.name;
    assert_eq!(topo.online(), set(want.online), "{name}: online");
    assert!(
        topo.online().is_disjoint(&set(want.offline)),
        "{name}: offline CPUs skipped"
    );
    let socket_sizes: Vec<usize> = topo
        .sockets()
        .iter()
        .map(|s| topo.cpus_in_socket(*s).len())
        .collect();
    assert_eq!(socket_sizes, want.socket_sizes, "{name}: CPUs per socket");
    let numa_sizes: Vec<usize> = topo
        .numa_nodes()
        .iter()
        .map(|n| topo.cpus_in_numa(*n).len())
        .collect();
    assert_eq!(numa_sizes, want.numa_sizes, "{name}: CPUs per NUMA node");
    assert_eq!(topo.l3_groups(), want.l3_sizes.len(), "{name}: L3 groups");
    assert_eq!(topo.smt_width(), want.smt_width, "{name}: SMT width");
    assert_eq!(topo.isolated, set(want.isolated), "{name}: isolated");

    let e_cores = set(want.e_cores);
    for cpu in &topo.cpus {
        let expected_siblings = if e_cores.contains(cpu.id) {
            Siblings::Single.of(cpu.id)
        } else {
            want.siblings.of(cpu.id)
        };
        assert_eq!(
            cpu.siblings, expected_siblings,
            "{name}: siblings of CPU {}",
            cpu.id
        );
        let expected_type = match (want.e_cores.is_empty(), e_cores.contains(cpu.id)) {
            (true, _) => CoreType::Standard,
            (false, true) => CoreType::Efficiency,
            (false, false) => CoreType::Performance,
        };
        assert_eq!(
            cpu.core_type, expected_type,
            "{name}: core type of CPU {}",
            cpu.id
        );
    }

    let mut l3_sizes: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for cpu in &topo.cpus {
        if let Some(l3) = cpu.l3 {
            *l3_sizes.entry((cpu.socket, l3)).or_default() += 1;
        }
    }
    for ((socket, l3), n) in &l3_sizes {
        assert_eq!(
            topo.cpus_in_l3(*socket, *l3).len(),
            *n,
            "{name}: cpus_in_l3({socket}, {l3})"
        );
    }
    let l3_sizes: Vec<usize> = l3_sizes.into_values().collect();
    assert_eq!(l3_sizes, want.l3_sizes, "{name}: CPUs per L3");
    if let Some(per_cluster) = want.cpus_per_cluster {
        let mut clusters: BTreeMap<(u32, u32), usize> = BTreeMap::new();
        for cpu in &topo.cpus {
            *clusters.entry((cpu.socket, cpu.cluster)).or_default() += 1;
        }
        assert_eq!(
            clusters.len(),
            topo.cpus.len() / per_cluster,
            "{name}: clusters"
        );
        assert!(
            clusters.values().all(|n| *n == per_cluster),
            "{name}: cluster sizes {clusters:?}"
        );
    }
    if want.l3_sizes.is_empty() {
        assert!(
            topo.cpus.iter().all(|c| c.l3.is_none()),
            "{name}: no L3 anywhere"
        );
    }
}

/// What must hold on any machine.
fn check_invariants(name: &str, topo: &Topology) {
    assert!(
        topo.cpus.windows(2).all(|w| w[0].id < w[1].id),
        "{name}: sorted by id"
    );
    assert!(
        topo.isolated.is_subset(&topo.online()),
        "{name}: isolated CPUs are online"
    );
    let mut covered = CpuSet::new();
    for core in topo.cores() {
        assert!(
            covered.is_disjoint(&core),
            "{name}: cores overlap at {core}"
        );
        covered = covered.union(&core);
        // A physical core sits in one socket, one node, one L3, one core_id.
        let members: Vec<_> = core.iter().filter_map(|c| topo.cpu(c)).collect();
        assert_eq!(
            members.len(),
            core.len(),
            "{name}: core {core} has unknown CPUs"
        );
        let first = members[0];
        for m in &members {
            assert_eq!(
                (m.socket, m.numa, m.l3, m.core, m.core_type),
                (
                    first.socket,
                    first.numa,
                    first.l3,
                    first.core,
                    first.core_type
                ),
                "{name}: core {core} is split"
            );
        }
    }
    assert_eq!(
        covered,
        topo.online(),
        "{name}: cores cover the online CPUs"
    );
    // core_id alone is only unique within a socket; (socket, die, core_id)
    // must name the same cores as the sibling sets.
    let by_core_id: BTreeSet<(u32, u32, u32)> = topo
        .cpus
        .iter()
        .map(|c| (c.socket, c.die, c.core))
        .collect();
    assert_eq!(
        by_core_id.len(),
        topo.cores().len(),
        "{name}: core ids vs. sibling sets"
    );
}

fn check_report(name: &str, topo: &Topology) {
    let reserved = set("0");
    let report = topo.report(&reserved);
    let json = serde_json::to_value(&report).expect("serialize report");
    assert_eq!(
        json["online"],
        topo.online().to_cpulist(),
        "{name}: report online"
    );
    assert_eq!(
        json["sockets"],
        topo.sockets().len(),
        "{name}: report sockets"
    );
    assert_eq!(json["numaNodes"], topo.numa_nodes().len(), "{name}");
    assert_eq!(json["l3Groups"], topo.l3_groups(), "{name}");
    assert_eq!(json["smtWidth"], topo.smt_width(), "{name}");
    assert_eq!(json["reserved"], "0", "{name}");
    let cpus = json["cpus"].as_array().expect("cpus array");
    assert_eq!(cpus.len(), topo.cpus.len(), "{name}: report CPUs");
    for (row, cpu) in cpus.iter().zip(&topo.cpus) {
        assert_eq!(row["id"], cpu.id, "{name}");
        assert_eq!(row["siblings"], cpu.siblings.to_cpulist(), "{name}");
        assert_eq!(row["coreType"], cpu.core_type.as_str(), "{name}");
        match cpu.l3 {
            Some(l3) => assert_eq!(row["l3"], l3, "{name}"),
            None => assert!(row["l3"].is_null(), "{name}: l3 null"),
        }
    }
    let back: TopologyReport = serde_json::from_value(json).expect("parse report");
    assert_eq!(back, report, "{name}: report round-trips");
}

/// Cross-check with util-linux reading the same tree. lscpu numbers cores
/// and sockets with its own logical ids, so those are compared as
/// partitions of the CPUs; node ids are the kernel's and compared directly.
fn check_against_lscpu(name: &str, root: &Path, topo: &Topology) {
    let output = match Command::new("lscpu")
        .arg("--sysroot")
        .arg(root)
        .arg("-p=CPU,CORE,SOCKET,NODE")
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            // CI installs util-linux: there a missing lscpu is a failure.
            let ci = std::env::var("CI").is_ok_and(|v| {
                !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false")
            });
            assert!(!ci, "{name}: CI is set and lscpu is not available: {e}");
            println!("{name}: lscpu not available ({e}); skipping the lscpu cross-check");
            return;
        }
    };
    assert!(
        output.status.success(),
        "{name}: lscpu failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("lscpu output is UTF-8");

    let mut cpus = CpuSet::new();
    let mut by_core: BTreeMap<u32, CpuSet> = BTreeMap::new();
    let mut by_socket: BTreeMap<u32, CpuSet> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let fields: Vec<u32> = line
            .split(',')
            .map(|f| {
                f.parse()
                    .unwrap_or_else(|_| panic!("{name}: lscpu line {line:?}"))
            })
            .collect();
        let [cpu, core, socket, node] = fields[..] else {
            panic!("{name}: lscpu line {line:?} does not have 4 fields");
        };
        cpus.insert(cpu);
        by_core.entry(core).or_default().insert(cpu);
        by_socket.entry(socket).or_default().insert(cpu);
        let ours = topo
            .cpu(cpu)
            .unwrap_or_else(|| panic!("{name}: lscpu lists CPU {cpu}, we do not"));
        assert_eq!(ours.numa, node, "{name}: NUMA node of CPU {cpu} vs. lscpu");
    }
    assert_eq!(cpus, topo.online(), "{name}: online CPUs vs. lscpu");
    let lscpu_cores: BTreeSet<CpuSet> = by_core.into_values().collect();
    let our_cores: BTreeSet<CpuSet> = topo.cores().into_iter().collect();
    assert_eq!(lscpu_cores, our_cores, "{name}: cores vs. lscpu");
    let lscpu_sockets: BTreeSet<CpuSet> = by_socket.into_values().collect();
    let our_sockets: BTreeSet<CpuSet> = topo
        .sockets()
        .into_iter()
        .map(|s| topo.cpus_in_socket(s))
        .collect();
    assert_eq!(lscpu_sockets, our_sockets, "{name}: sockets vs. lscpu");
}
