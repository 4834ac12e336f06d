//! Topology discovery from a sysfs root.
//!
//! The root is the directory that holds `sys/devices/system/cpu`: `/` on a
//! node, the host mount inside a container, a generated tree in tests.
//! Reading is strict: a required file that is missing or does not parse is an
//! error naming the full path and the content, because a guessed topology
//! would pin latency-critical work to the wrong CPUs.
//!
//! What is required and what has a default:
//! - `cpu/online` is required; a CPU is discovered when it is listed there
//!   and has a `cpuN/topology/` directory (Linux removes it while a CPU is
//!   offline).
//! - per CPU: `topology/physical_package_id`, `topology/core_id` and the
//!   sibling list (`thread_siblings_list`, or the `thread_siblings` mask on
//!   kernels without the list form) are required; `die_id` and `cluster_id`
//!   default to 0 when absent. The kernel writes `-1` for ids the firmware
//!   does not describe; that reads as 0 too.
//! - NUMA node: `node/nodeM/cpulist`, else a `cpuN/nodeM` entry, else 0 (a
//!   kernel built without NUMA has no `node/` directory).
//! - L3: the `cache/indexK` whose `level` is 3, identified by its `id` file,
//!   or by the lowest CPU of its `shared_cpu_list` on kernels that do not
//!   write `id`; `None` where no L3 entry exists.
//! - core type: `devices/cpu_core/cpus` (P-cores) and `devices/cpu_atom/cpus`
//!   (E-cores) on hybrid parts; `standard` everywhere else.
//! - `cpu/isolated`: absent means empty.

pub(super) mod files;

use super::{CoreType, CpuInfo, Topology};
use crate::cpuset::CpuSet;
use files::{
    numbered_entries, parse_cpulist_at, parse_u32_at, quote, read_cpulist, read_id, read_optional,
    read_optional_id, read_u32,
};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Why discovery refused a sysfs tree. Every variant names the offending path
/// (and content, where there is one).
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("required file {} is missing", path.display())]
    Missing { path: PathBuf },
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: malformed content {content:?}: {reason}", path.display())]
    Malformed {
        path: PathBuf,
        content: String,
        reason: String,
    },
    #[error("{}: no online CPU has a topology directory", path.display())]
    NoCpus { path: PathBuf },
    #[error(
        "CPU {cpu} has thread siblings {siblings} ({}) but CPU {other} has {other_siblings}",
        path.display()
    )]
    InconsistentSiblings {
        cpu: u32,
        siblings: CpuSet,
        other: u32,
        other_siblings: CpuSet,
        path: PathBuf,
    },
    #[error("CPU {cpu} is listed by both {} and {}", first.display(), second.display())]
    ListedTwice {
        cpu: u32,
        first: PathBuf,
        second: PathBuf,
    },
}

/// The CPUs the kernel lists as online under `sysfs_root` (the directory
/// containing `sys/devices/system/cpu`), read afresh: a CPU taken offline
/// after discovery shows here, which device health reports.
pub fn read_online_cpus(sysfs_root: &Path) -> Result<CpuSet, TopologyError> {
    read_cpulist(&sysfs_root.join("sys/devices/system/cpu/online"))
}

/// Discover the online CPUs under `sysfs_root` (the directory containing
/// `sys/devices/system/cpu`).
pub fn discover(sysfs_root: &Path) -> Result<Topology, TopologyError> {
    let system = sysfs_root.join("sys/devices/system");
    let cpu_dir = system.join("cpu");

    let online_path = cpu_dir.join("online");
    let listed_online = read_cpulist(&online_path)?;
    let isolated = read_optional(&cpu_dir.join("isolated"))?
        .map(|(path, text)| parse_cpulist_at(&path, &text))
        .transpose()?
        .unwrap_or_default();

    // Linux removes topology/ while a CPU is offline; a CPU without it cannot
    // be placed, so it is treated as offline even if `online` lists it.
    let present: CpuSet = listed_online
        .iter()
        .filter(|cpu| cpu_dir.join(format!("cpu{cpu}/topology")).is_dir())
        .collect();
    if present.is_empty() {
        return Err(TopologyError::NoCpus { path: online_path });
    }

    let numa_of = numa_from_node_dir(&system.join("node"))?;
    let core_types = core_types(&sysfs_root.join("sys/devices"))?;

    let mut cpus = Vec::with_capacity(present.len());
    for id in &present {
        let dir = cpu_dir.join(format!("cpu{id}"));
        let topo = dir.join("topology");
        let socket = read_id(&topo.join("physical_package_id"))?;
        let die = read_optional_id(&topo.join("die_id"))?;
        let cluster = read_optional_id(&topo.join("cluster_id"))?;
        let core = read_u32(&topo.join("core_id"))?;
        let (siblings_path, listed_siblings) = read_siblings(&topo)?;
        if !listed_siblings.contains(id) {
            return Err(TopologyError::Malformed {
                content: quote(&listed_siblings.to_cpulist()),
                path: siblings_path,
                reason: format!("does not contain CPU {id} itself"),
            });
        }
        // Siblings that were skipped as offline are not part of the machine
        // we hand out.
        let siblings = listed_siblings.intersection(&present);
        let numa = match numa_of.get(&id) {
            Some((node, _)) => *node,
            None => numa_from_cpu_link(&dir)?.unwrap_or(0),
        };
        let l3 = l3_id(&dir.join("cache"))?;
        let core_type = core_types.get(&id).copied().unwrap_or(CoreType::Standard);
        cpus.push(CpuInfo {
            id,
            socket,
            die,
            cluster,
            core,
            numa,
            l3,
            core_type,
            siblings,
        });
    }
    check_sibling_symmetry(&cpus, &cpu_dir)?;
    Ok(Topology { cpus, isolated })
}

/// The sibling set is used as the identity of a physical core, so every CPU
/// of a core must report the same set; anything else is a broken tree.
fn check_sibling_symmetry(cpus: &[CpuInfo], cpu_dir: &Path) -> Result<(), TopologyError> {
    let by_id: BTreeMap<u32, &CpuInfo> = cpus.iter().map(|c| (c.id, c)).collect();
    for cpu in cpus {
        for other in &cpu.siblings {
            if let Some(o) = by_id.get(&other) {
                if o.siblings != cpu.siblings {
                    return Err(TopologyError::InconsistentSiblings {
                        cpu: cpu.id,
                        siblings: cpu.siblings.clone(),
                        other,
                        other_siblings: o.siblings.clone(),
                        path: cpu_dir.join(format!("cpu{}/topology/thread_siblings_list", cpu.id)),
                    });
                }
            }
        }
    }
    Ok(())
}

/// CPU → (node, the cpulist file that named it), from `node/node*/cpulist`.
/// An absent `node/` directory is a kernel without NUMA: empty map.
fn numa_from_node_dir(node_dir: &Path) -> Result<BTreeMap<u32, (u32, PathBuf)>, TopologyError> {
    let mut map: BTreeMap<u32, (u32, PathBuf)> = BTreeMap::new();
    for (node, entry) in numbered_entries(node_dir, "node")? {
        if !entry.is_dir() {
            continue;
        }
        let path = entry.join("cpulist");
        for cpu in &read_cpulist(&path)? {
            if let Some((_, first)) = map.get(&cpu) {
                return Err(TopologyError::ListedTwice {
                    cpu,
                    first: first.clone(),
                    second: path,
                });
            }
            map.insert(cpu, (node, path.clone()));
        }
    }
    Ok(map)
}

/// The node of a CPU from its `cpuN/nodeM` entry, for trees whose node
/// cpulists do not mention it.
fn numa_from_cpu_link(cpu_dir: &Path) -> Result<Option<u32>, TopologyError> {
    Ok(numbered_entries(cpu_dir, "node")?
        .into_iter()
        .map(|(node, _)| node)
        .next())
}

/// CPU → core type from the hybrid PMU device lists.
fn core_types(devices: &Path) -> Result<BTreeMap<u32, CoreType>, TopologyError> {
    let mut map = BTreeMap::new();
    let mut origin: BTreeMap<u32, PathBuf> = BTreeMap::new();
    for (sub, kind) in [
        ("cpu_core/cpus", CoreType::Performance),
        ("cpu_atom/cpus", CoreType::Efficiency),
    ] {
        let path = devices.join(sub);
        let Some((path, text)) = read_optional(&path)? else {
            continue;
        };
        for cpu in &parse_cpulist_at(&path, &text)? {
            if let Some(first) = origin.get(&cpu) {
                return Err(TopologyError::ListedTwice {
                    cpu,
                    first: first.clone(),
                    second: path,
                });
            }
            origin.insert(cpu, path.clone());
            map.insert(cpu, kind);
        }
    }
    Ok(map)
}

/// The id of the level-3 cache under `cache_dir`, if there is one.
fn l3_id(cache_dir: &Path) -> Result<Option<u32>, TopologyError> {
    for (_, index) in numbered_entries(cache_dir, "index")? {
        if !index.is_dir() {
            continue;
        }
        if read_u32(&index.join("level"))? != 3 {
            continue;
        }
        let id_path = index.join("id");
        if let Some((path, text)) = read_optional(&id_path)? {
            return parse_u32_at(&path, &text).map(Some);
        }
        // Kernels that do not write `id` still say who shares the cache; its
        // lowest CPU names the group unambiguously.
        let shared_path = index.join("shared_cpu_list");
        let shared = match read_optional(&shared_path)? {
            Some((path, text)) => parse_cpulist_at(&path, &text)?,
            None => return Err(TopologyError::Missing { path: id_path }),
        };
        return match shared.first() {
            Some(first) => Ok(Some(first)),
            None => Err(TopologyError::Malformed {
                path: shared_path,
                content: String::new(),
                reason: "an L3 cache shared by no CPU".into(),
            }),
        };
    }
    Ok(None)
}

fn read_siblings(topo: &Path) -> Result<(PathBuf, CpuSet), TopologyError> {
    let list = topo.join("thread_siblings_list");
    if let Some((path, text)) = read_optional(&list)? {
        let set = parse_cpulist_at(&path, &text)?;
        return Ok((path, set));
    }
    if let Some((path, text)) = read_optional(&topo.join("thread_siblings"))? {
        let set = CpuSet::parse_hex_mask(&text).map_err(|e| TopologyError::Malformed {
            content: quote(&text),
            path: path.clone(),
            reason: e.to_string(),
        })?;
        return Ok((path, set));
    }
    Err(TopologyError::Missing { path: list })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fs;

    /// A hand-made sysfs tree in a tempdir.
    struct Tree {
        dir: tempfile::TempDir,
    }

    impl Tree {
        fn new() -> Self {
            Tree {
                dir: tempfile::tempdir().expect("tempdir"),
            }
        }
        fn root(&self) -> &Path {
            self.dir.path()
        }
        fn path(&self, rel: &str) -> PathBuf {
            self.root().join("sys/devices/system").join(rel)
        }
        /// Write `content` to `sys/devices/system/<rel>`.
        fn write(&self, rel: &str, content: &str) -> &Self {
            let p = self.path(rel);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(&p, content).expect("write");
            self
        }
        fn mkdir(&self, rel: &str) -> &Self {
            fs::create_dir_all(self.path(rel)).expect("mkdir");
            self
        }
        fn remove(&self, rel: &str) -> &Self {
            let p = self.path(rel);
            if p.is_dir() {
                fs::remove_dir_all(p).expect("rm dir");
            } else {
                fs::remove_file(p).expect("rm");
            }
            self
        }
        /// One CPU with the required files plus an L3 and a node link.
        fn cpu(
            &self,
            id: u32,
            socket: u32,
            core: u32,
            siblings: &str,
            l3: Option<u32>,
            node: u32,
        ) -> &Self {
            let t = format!("cpu/cpu{id}/topology");
            self.write(&format!("{t}/physical_package_id"), &format!("{socket}\n"));
            self.write(&format!("{t}/die_id"), "0\n");
            self.write(&format!("{t}/core_id"), &format!("{core}\n"));
            self.write(
                &format!("{t}/thread_siblings_list"),
                &format!("{siblings}\n"),
            );
            self.write(&format!("cpu/cpu{id}/cache/index0/level"), "1\n");
            self.write(
                &format!("cpu/cpu{id}/cache/index0/id"),
                &format!("{core}\n"),
            );
            if let Some(l3) = l3 {
                self.write(&format!("cpu/cpu{id}/cache/index3/level"), "3\n");
                self.write(&format!("cpu/cpu{id}/cache/index3/id"), &format!("{l3}\n"));
            }
            self.mkdir(&format!("cpu/cpu{id}/node{node}"));
            self
        }
    }

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    /// Two cores, two threads each (siblings N and N+2), one L3, one node.
    fn small() -> Tree {
        let t = Tree::new();
        t.write("cpu/online", "0-3\n");
        for cpu in 0..4 {
            let core = cpu % 2;
            let sib = format!("{core},{}", core + 2);
            t.cpu(cpu, 0, core, &sib, Some(0), 0);
        }
        t.write("node/node0/cpulist", "0-3\n");
        t
    }

    #[test]
    fn discovers_a_small_machine() {
        let t = small();
        let topo = discover(t.root()).expect("discover");
        assert_eq!(topo.online(), set("0-3"));
        assert_eq!(topo.smt_width(), 2);
        assert_eq!(topo.isolated, CpuSet::new());
        let c2 = topo.cpu(2).expect("cpu 2");
        assert_eq!((c2.socket, c2.core, c2.numa, c2.l3), (0, 0, 0, Some(0)));
        assert_eq!(c2.siblings, set("0,2"));
        assert_eq!(c2.core_type, CoreType::Standard);
        assert_eq!((c2.die, c2.cluster), (0, 0));
    }

    #[test]
    fn missing_required_files_are_errors_naming_the_path() {
        let cases = [
            "cpu/online",
            "cpu/cpu1/topology/physical_package_id",
            "cpu/cpu1/topology/core_id",
            "cpu/cpu1/topology/thread_siblings_list",
            "cpu/cpu1/cache/index3/level",
            "node/node0/cpulist",
        ];
        for rel in cases {
            let t = small();
            t.remove(rel);
            let err = discover(t.root()).expect_err(rel);
            let want = t.path(rel);
            assert!(
                matches!(&err, TopologyError::Missing { path } if *path == want),
                "{rel}: {err}"
            );
            assert!(
                err.to_string().contains(&want.display().to_string()),
                "{rel}: {err}"
            );
        }
    }

    #[test]
    fn malformed_files_are_errors_naming_path_and_content() {
        let cases = [
            ("cpu/online", "0-3,,5"),
            ("cpu/online", "3-0"),
            ("cpu/isolated", "x"),
            ("cpu/cpu0/topology/thread_siblings_list", "0,2-"),
            ("cpu/cpu0/topology/core_id", "zero"),
            ("cpu/cpu0/topology/core_id", "-1"),
            ("cpu/cpu0/topology/core_id", "99999999999"),
            ("cpu/cpu0/topology/physical_package_id", ""),
            ("cpu/cpu0/topology/die_id", "1.5"),
            ("cpu/cpu0/cache/index3/id", "l3"),
            ("cpu/cpu0/cache/index3/level", "three"),
            ("node/node0/cpulist", "0-3 4"),
        ];
        for (rel, content) in cases {
            let t = small();
            t.write(rel, content);
            let err = discover(t.root()).expect_err(rel);
            let msg = err.to_string();
            assert!(
                matches!(err, TopologyError::Malformed { .. }),
                "{rel}: {msg}"
            );
            assert!(
                msg.contains(&t.path(rel).display().to_string()),
                "{rel}: {msg}"
            );
            assert!(msg.contains(&format!("{content:?}")), "{rel}: {msg}");
        }
    }

    #[test]
    fn siblings_must_contain_the_cpu_and_agree() {
        let t = small();
        t.write("cpu/cpu0/topology/thread_siblings_list", "2\n");
        let msg = discover(t.root()).expect_err("self missing").to_string();
        assert!(msg.contains("does not contain CPU 0"), "{msg}");

        let t = small();
        t.write("cpu/cpu0/topology/thread_siblings_list", "0-2\n");
        let err = discover(t.root()).expect_err("asymmetric");
        assert!(
            matches!(err, TopologyError::InconsistentSiblings { cpu: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_cpu_in_two_nodes_is_an_error() {
        let t = small();
        t.write("node/node1/cpulist", "3\n");
        let err = discover(t.root()).expect_err("twice");
        assert!(
            matches!(err, TopologyError::ListedTwice { cpu: 3, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("node1/cpulist"), "{err}");
    }

    #[test]
    fn offline_cpus_are_skipped() {
        // CPU 3 absent from `online`; CPU 2 listed but without topology/.
        let t = small();
        t.write("cpu/online", "0-2\n");
        t.remove("cpu/cpu2/topology");
        let topo = discover(t.root()).expect("discover");
        assert_eq!(topo.online(), set("0-1"));
        assert!(topo.cpu(2).is_none() && topo.cpu(3).is_none());
        // The siblings of an offline thread are trimmed to online CPUs.
        assert_eq!(topo.cpu(0).expect("cpu0").siblings, set("0"));
        assert_eq!(topo.smt_width(), 1);
    }

    #[test]
    fn no_online_cpu_is_an_error() {
        let t = small();
        t.write("cpu/online", "\n");
        let err = discover(t.root()).expect_err("none online");
        assert!(matches!(err, TopologyError::NoCpus { .. }), "{err}");
    }

    #[test]
    fn four_wide_smt() {
        // 2 cores x 4 threads, threads-last numbering: core c has c, c+2, c+4, c+6.
        let t = Tree::new();
        t.write("cpu/online", "0-7");
        for cpu in 0..8 {
            let core = cpu % 2;
            let sib = format!("{core},{},{},{}", core + 2, core + 4, core + 6);
            t.cpu(cpu, 0, core, &sib, Some(0), 0);
        }
        let topo = discover(t.root()).expect("discover");
        assert_eq!(topo.smt_width(), 4);
        assert_eq!(topo.cpu(5).expect("cpu5").siblings, set("1,3,5,7"));
        assert_eq!(topo.cores(), vec![set("0,2,4,6"), set("1,3,5,7")]);
    }

    #[test]
    fn no_l3_and_no_node_dir() {
        let t = Tree::new();
        t.write("cpu/online", "0-1");
        t.cpu(0, 0, 0, "0", None, 0).cpu(1, 0, 1, "1", None, 0);
        t.remove("cpu/cpu0/node0").remove("cpu/cpu1/node0");
        let topo = discover(t.root()).expect("discover");
        assert!(topo.cpus.iter().all(|c| c.l3.is_none() && c.numa == 0));
        assert_eq!(topo.l3_groups(), 0);
        assert_eq!(topo.numa_nodes(), vec![0]);
    }

    #[test]
    fn numa_from_cpu_link_when_node_cpulists_are_silent() {
        let t = Tree::new();
        t.write("cpu/online", "0-1");
        t.cpu(0, 0, 0, "0", Some(0), 0)
            .cpu(1, 1, 0, "1", Some(1), 1);
        let topo = discover(t.root()).expect("discover");
        assert_eq!(topo.cpu(1).expect("cpu1").numa, 1);
        assert_eq!(topo.cpus_in_numa(1), set("1"));
        assert_eq!(topo.sockets(), vec![0, 1]);
    }

    #[test]
    fn node_cpulist_wins_over_cpu_link() {
        let t = small();
        t.write("node/node0/cpulist", "0-2")
            .write("node/node5/cpulist", "3");
        let topo = discover(t.root()).expect("discover");
        assert_eq!(topo.cpu(3).expect("cpu3").numa, 5);
        assert_eq!(topo.numa_nodes(), vec![0, 5]);
    }

    #[test]
    fn hybrid_core_types() {
        // 1 P-core with 2 threads (0,2), 2 single-thread E-cores (1, 3).
        let t = Tree::new();
        t.write("cpu/online", "0-3");
        t.cpu(0, 0, 0, "0,2", Some(0), 0)
            .cpu(2, 0, 0, "0,2", Some(0), 0)
            .cpu(1, 0, 1, "1", Some(0), 0)
            .cpu(3, 0, 2, "3", Some(0), 0);
        fs::create_dir_all(t.root().join("sys/devices/cpu_core")).expect("mkdir");
        fs::create_dir_all(t.root().join("sys/devices/cpu_atom")).expect("mkdir");
        fs::write(t.root().join("sys/devices/cpu_core/cpus"), "0,2\n").expect("write");
        fs::write(t.root().join("sys/devices/cpu_atom/cpus"), "1,3\n").expect("write");
        let topo = discover(t.root()).expect("discover");
        let kinds: Vec<CoreType> = topo.cpus.iter().map(|c| c.core_type).collect();
        use CoreType::{Efficiency as E, Performance as P};
        assert_eq!(kinds, vec![P, E, P, E]);
        assert_eq!(topo.smt_width(), 2);

        fs::write(t.root().join("sys/devices/cpu_atom/cpus"), "1-2\n").expect("write");
        let err = discover(t.root()).expect_err("both lists");
        assert!(
            matches!(err, TopologyError::ListedTwice { cpu: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn optional_ids_and_fallbacks() {
        let t = small();
        t.remove("cpu/cpu0/topology/die_id");
        t.write("cpu/cpu1/topology/physical_package_id", "-1\n");
        t.write("cpu/cpu2/topology/cluster_id", "7\n");
        // thread_siblings mask instead of the list form.
        t.remove("cpu/cpu3/topology/thread_siblings_list");
        t.write("cpu/cpu3/topology/thread_siblings", "0000000a\n");
        // An L3 without an `id` is named by the lowest CPU sharing it.
        t.remove("cpu/cpu0/cache/index3/id");
        t.write("cpu/cpu0/cache/index3/shared_cpu_list", "0-3\n");
        t.write("cpu/isolated", "1\n");
        let topo = discover(t.root()).expect("discover");
        assert_eq!(topo.cpu(0).expect("cpu0").die, 0);
        assert_eq!(topo.cpu(1).expect("cpu1").socket, 0);
        assert_eq!(topo.cpu(2).expect("cpu2").cluster, 7);
        assert_eq!(topo.cpu(3).expect("cpu3").siblings, set("1,3"));
        assert_eq!(topo.cpu(0).expect("cpu0").l3, Some(0));
        assert_eq!(topo.isolated, set("1"));

        t.remove("cpu/cpu0/cache/index3/shared_cpu_list");
        let err = discover(t.root()).expect_err("no id, no shared list");
        assert!(err.to_string().contains("cpu0/cache/index3/id"), "{err}");
    }

    #[test]
    fn long_garbage_is_quoted_shortened() {
        let t = small();
        t.write("cpu/cpu0/topology/core_id", &"x".repeat(10_000));
        let msg = discover(t.root()).expect_err("garbage").to_string();
        assert!(msg.len() < 600, "{} bytes", msg.len());
        assert!(msg.contains("core_id"), "{msg}");
    }

    /// Write a regular machine of the given shape.
    fn shaped(sockets: u32, cores_per_socket: u32, threads: u32, adjacent: bool) -> Tree {
        let t = Tree::new();
        let cores = sockets * cores_per_socket;
        let total = cores * threads;
        let cpu_of = |core: u32, thread: u32| {
            if adjacent {
                core * threads + thread
            } else {
                thread * cores + core
            }
        };
        t.write("cpu/online", &format!("0-{}", total - 1));
        for core in 0..cores {
            let socket = core / cores_per_socket;
            let sib: CpuSet = (0..threads).map(|th| cpu_of(core, th)).collect();
            for th in 0..threads {
                let cpu = cpu_of(core, th);
                t.cpu(
                    cpu,
                    socket,
                    core % cores_per_socket,
                    &sib.to_cpulist(),
                    Some(socket),
                    socket,
                );
            }
        }
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn regular_shapes_are_discovered(
            sockets in 1u32..4, cores in 1u32..6, threads in 1u32..5, adjacent in any::<bool>()
        ) {
            let t = shaped(sockets, cores, threads, adjacent);
            let topo = discover(t.root()).expect("discover");
            prop_assert_eq!(topo.online().len() as u32, sockets * cores * threads);
            prop_assert_eq!(topo.smt_width() as u32, threads);
            prop_assert_eq!(topo.sockets().len() as u32, sockets);
            prop_assert_eq!(topo.l3_groups() as u32, sockets);
            let physical = topo.cores();
            prop_assert_eq!(physical.len() as u32, sockets * cores);
            // The cores partition the online CPUs.
            let mut union = CpuSet::new();
            for c in &physical {
                prop_assert!(union.is_disjoint(c));
                union = union.union(c);
            }
            prop_assert_eq!(union, topo.online());
            for s in topo.sockets() {
                prop_assert_eq!(topo.cpus_in_socket(s), topo.cpus_in_numa(s));
            }
        }

        #[test]
        fn garbage_in_any_file_is_an_error_not_a_panic(
            which in 0usize..6, content in "\\PC{0,24}"
        ) {
            let rels = [
                "cpu/online",
                "cpu/isolated",
                "cpu/cpu1/topology/core_id",
                "cpu/cpu1/topology/thread_siblings_list",
                "cpu/cpu1/cache/index3/id",
                "node/node0/cpulist",
            ];
            let t = small();
            t.write(rels[which], &content);
            if let Err(e) = discover(t.root()) {
                let msg = e.to_string();
                prop_assert!(msg.contains("sys/devices/system"), "{}", msg);
            }
        }
    }
}
