//! Synthetic sysfs trees: the files a kernel shows under
//! `sys/devices/system/{cpu,node}` (and `sys/devices/cpu_{core,atom}` on
//! hybrid parts) for a machine of a given shape, written to a directory so
//! that discovery, the daemons and `lscpu --sysroot` can read it as they
//! read a node.
//!
//! What is written, per online CPU: `topology/` (package, die, core and
//! cluster ids, and the sibling sets as lists and masks), `cache/index0-3`
//! (L1 data and instruction, L2, and the L3 unless the machine has none),
//! and a `nodeM` entry; per NUMA node: `cpulist`, `cpumap`, `distance`,
//! `meminfo`; at the top: `online`, `offline`, `possible`, `present`,
//! `isolated`, `smt/`, and `proc/cpuinfo` for lscpu. An offline CPU keeps
//! only its `online` file, as Linux removes the rest while it is down.
//!
//! [`NAMED`] lists the machines the tests use by name; [`Machine::named`]
//! gives their shapes.

use super::synthetic::{Shape, SiblingNumbering};
use crate::cpuset::{CpuSet, MAX_CPUS};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// A machine to write: a regular [`Shape`] plus what real parts add to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The cores of every socket; the P-cores where `e_cores_per_socket`
    /// is not 0.
    pub shape: Shape,
    /// Single-threaded efficiency cores after the P-cores of every socket
    /// (in its last NUMA node and L3), listed in `devices/cpu_atom/cpus`
    /// with the P-cores in `devices/cpu_core/cpus`. 0: not a hybrid part.
    pub e_cores_per_socket: u32,
    /// Whether the CPUs have a level-3 cache entry (some Arm parts do not).
    pub l3: bool,
    /// Cores per `cluster_id` within a socket (Arm); `None` writes the same
    /// id, 65535, for every core.
    pub cores_per_cluster: Option<u32>,
    /// CPUs the kernel has taken offline.
    pub offline: CpuSet,
    /// The `cpu/isolated` list.
    pub isolated: CpuSet,
}

/// The machines of the tests, by name, in name order:
///
/// | name | CPUs | sockets | NUMA | L3 | SMT |
/// |---|---|---|---|---|---|
/// | `amd-epyc-1s-8ccx-ht-128` | 128 | 1 | 1 | 8 CCX of 8 cores | siblings N, N+64 |
/// | `arm-1s-80c-nosmt` | 80 | 1 | 1 | none (clusters of 2) | none |
/// | `hybrid-8p16e-32` | 32 | 1 | 1 | 1 | 8 P-cores (N, N+24); 16 E-cores 8-23 |
/// | `intel-2s-ht-adjacent-offline-96` | 96, 94-95 offline, 2-3 isolated | 2 | 2 | 2 | siblings 2k, 2k+1 |
/// | `intel-2s-snc2-ht-128` | 128 | 2 | 4 (sub-NUMA clusters) | 4 | siblings N, N+64 |
/// | `vm-2c-nosmt` | 2 | 1 | 1 | 1 | none |
pub const NAMED: [&str; 6] = [
    "amd-epyc-1s-8ccx-ht-128",
    "arm-1s-80c-nosmt",
    "hybrid-8p16e-32",
    "intel-2s-ht-adjacent-offline-96",
    "intel-2s-snc2-ht-128",
    "vm-2c-nosmt",
];

/// One socket, one NUMA node, one L3, `cores` cores of `threads` threads,
/// threads numbered last.
const fn simple(cores: u32, threads: u32) -> Shape {
    Shape {
        sockets: 1,
        numa_per_socket: 1,
        l3_per_numa: 1,
        cores_per_l3: cores,
        threads_per_core: threads,
        sibling_numbering: SiblingNumbering::Split,
    }
}

impl From<Shape> for Machine {
    /// A plain machine of `shape`: an L3 per group, every CPU online.
    fn from(shape: Shape) -> Machine {
        Machine {
            shape,
            e_cores_per_socket: 0,
            l3: true,
            cores_per_cluster: None,
            offline: CpuSet::new(),
            isolated: CpuSet::new(),
        }
    }
}

impl Machine {
    /// The machine called `name` (one of [`NAMED`]).
    pub fn named(name: &str) -> Option<Machine> {
        let machine = match name {
            "amd-epyc-1s-8ccx-ht-128" => Machine::from(Shape {
                l3_per_numa: 8,
                ..simple(8, 2)
            }),
            "arm-1s-80c-nosmt" => Machine {
                l3: false,
                cores_per_cluster: Some(2),
                ..Machine::from(simple(80, 1))
            },
            "hybrid-8p16e-32" => Machine {
                e_cores_per_socket: 16,
                ..Machine::from(simple(8, 2))
            },
            "intel-2s-ht-adjacent-offline-96" => Machine {
                offline: [94, 95].into_iter().collect(),
                isolated: [2, 3].into_iter().collect(),
                ..Machine::from(Shape {
                    sockets: 2,
                    sibling_numbering: SiblingNumbering::Adjacent,
                    ..simple(24, 2)
                })
            },
            "intel-2s-snc2-ht-128" => Machine::from(Shape {
                sockets: 2,
                numa_per_socket: 2,
                ..simple(16, 2)
            }),
            "vm-2c-nosmt" => Machine::from(simple(2, 1)),
            _ => return None,
        };
        Some(machine)
    }

    /// Logical CPUs, online or not.
    pub fn cpus_total(&self) -> u32 {
        self.shape.cpus_total() + self.shape.sockets * self.e_cores_per_socket
    }

    /// Write the tree under `root` (which becomes the sysfs root: the
    /// directory holding `sys/` and `proc/`). Files already there are
    /// overwritten; nothing else is removed.
    pub fn write(&self, root: &Path) -> io::Result<()> {
        let total = self.cpus_total();
        if total == 0 || total > MAX_CPUS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a machine of {total} CPUs (1 to {MAX_CPUS} can be written)"),
            ));
        }
        let cores = self.cores();
        let cpus = number(&cores, self.shape.sibling_numbering);
        Layout::new(self, &cores, &cpus).write(&Files::new(root, total))
    }

    /// Every core, socket by socket: the P-cores (or all cores) of the
    /// shape in NUMA and L3 order, then the socket's E-cores.
    fn cores(&self) -> Vec<Core> {
        let s = &self.shape;
        let mut cores =
            Vec::with_capacity((s.cores_total() + s.sockets * self.e_cores_per_socket) as usize);
        for socket in 0..s.sockets {
            let mut core_id = 0;
            for n in 0..s.numa_per_socket {
                let numa = socket * s.numa_per_socket + n;
                for l in 0..s.l3_per_numa {
                    for _ in 0..s.cores_per_l3 {
                        cores.push(Core {
                            socket,
                            numa,
                            l3: numa * s.l3_per_numa + l,
                            core_id,
                            threads: s.threads_per_core,
                            efficiency: false,
                        });
                        core_id += 1;
                    }
                }
            }
            let last_numa = (socket + 1) * s.numa_per_socket - 1;
            for _ in 0..self.e_cores_per_socket {
                cores.push(Core {
                    socket,
                    numa: last_numa,
                    l3: (last_numa + 1) * s.l3_per_numa - 1,
                    core_id,
                    threads: 1,
                    efficiency: true,
                });
                core_id += 1;
            }
        }
        cores
    }
}

/// Write the machine called `name` (one of [`NAMED`]) under `root`.
pub fn write_named(name: &str, root: &Path) -> io::Result<()> {
    let machine = Machine::named(name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no machine is called {name:?}; the names are {NAMED:?}"),
        )
    })?;
    machine.write(root)
}

#[derive(Debug, Clone, Copy)]
struct Core {
    socket: u32,
    numa: u32,
    /// Global L3 index.
    l3: u32,
    /// `core_id`: restarts in every socket.
    core_id: u32,
    threads: u32,
    efficiency: bool,
}

/// The CPU ids of every core. Split numbering gives thread 0 of every core
/// first, then thread 1 of every core that has one, and so on; adjacent
/// numbering gives each core consecutive ids.
fn number(cores: &[Core], numbering: SiblingNumbering) -> Vec<CpuSet> {
    let mut cpus = vec![CpuSet::new(); cores.len()];
    let mut next = 0u32;
    match numbering {
        SiblingNumbering::Adjacent => {
            for (set, core) in cpus.iter_mut().zip(cores) {
                for _ in 0..core.threads {
                    set.insert(next);
                    next += 1;
                }
            }
        }
        SiblingNumbering::Split => {
            let widest = cores.iter().map(|c| c.threads).max().unwrap_or(0);
            for thread in 0..widest {
                for (set, core) in cpus.iter_mut().zip(cores) {
                    if thread < core.threads {
                        set.insert(next);
                        next += 1;
                    }
                }
            }
        }
    }
    cpus
}

/// The groups of online CPUs every file is written from.
struct Layout<'a> {
    machine: &'a Machine,
    cores: &'a [Core],
    /// Every CPU of each core, online or not.
    threads: &'a [CpuSet],
    /// Online CPUs of each core.
    core_cpus: Vec<CpuSet>,
    all: CpuSet,
    online: CpuSet,
    socket_cpus: BTreeMap<u32, CpuSet>,
    numa_cpus: BTreeMap<u32, CpuSet>,
    l3_cpus: BTreeMap<u32, CpuSet>,
    /// (socket, cluster) → CPUs, where the machine has clusters.
    cluster_cpus: BTreeMap<(u32, u32), CpuSet>,
    p_cpus: CpuSet,
    e_cpus: CpuSet,
}

impl<'a> Layout<'a> {
    fn new(machine: &'a Machine, cores: &'a [Core], cpus: &'a [CpuSet]) -> Layout<'a> {
        let all = cpus.iter().fold(CpuSet::new(), |acc, c| acc.union(c));
        let online = all.difference(&machine.offline);
        let mut layout = Layout {
            machine,
            cores,
            threads: cpus,
            core_cpus: cpus.iter().map(|c| c.intersection(&online)).collect(),
            all,
            online,
            socket_cpus: BTreeMap::new(),
            numa_cpus: BTreeMap::new(),
            l3_cpus: BTreeMap::new(),
            cluster_cpus: BTreeMap::new(),
            p_cpus: CpuSet::new(),
            e_cpus: CpuSet::new(),
        };
        for (core, set) in cores.iter().zip(&layout.core_cpus) {
            let add = |group: &mut CpuSet| *group = group.union(set);
            add(layout.socket_cpus.entry(core.socket).or_default());
            add(layout.numa_cpus.entry(core.numa).or_default());
            add(layout.l3_cpus.entry(core.l3).or_default());
            if let Some(cluster) = layout.cluster_of(core) {
                add(layout
                    .cluster_cpus
                    .entry((core.socket, cluster))
                    .or_default());
            }
            add(if core.efficiency {
                &mut layout.e_cpus
            } else {
                &mut layout.p_cpus
            });
        }
        // Every node of the shape exists, even one whose CPUs are all offline.
        let s = &machine.shape;
        for node in 0..s.sockets * s.numa_per_socket {
            layout.numa_cpus.entry(node).or_default();
        }
        layout
    }

    fn cluster_of(&self, core: &Core) -> Option<u32> {
        self.machine
            .cores_per_cluster
            .filter(|n| *n > 0)
            .map(|n| core.core_id / n)
    }

    fn write(&self, files: &Files) -> io::Result<()> {
        let m = self.machine;
        let s = &m.shape;
        files.list("cpu/possible", &self.all)?;
        files.list("cpu/present", &self.all)?;
        files.list("cpu/online", &self.online)?;
        files.list("cpu/offline", &m.offline.intersection(&self.all))?;
        files.list("cpu/isolated", &m.isolated)?;
        let smt = s.threads_per_core > 1;
        files.put("cpu/smt/control", if smt { "on" } else { "notsupported" })?;
        files.put("cpu/smt/active", if smt { "1" } else { "0" })?;
        if m.e_cores_per_socket > 0 {
            files.list("../cpu_core/cpus", &self.p_cpus)?;
            files.list("../cpu_atom/cpus", &self.e_cpus)?;
        }
        for (index, (core, threads)) in self.cores.iter().zip(self.threads).enumerate() {
            for cpu in threads {
                self.write_cpu(files, index, core, cpu)?;
            }
        }
        self.write_nodes(files)?;
        self.write_cpuinfo(files)
    }

    /// CPU `cpu`, a thread of core `index`.
    fn write_cpu(&self, files: &Files, index: usize, core: &Core, cpu: u32) -> io::Result<()> {
        let dir = format!("cpu/cpu{cpu}");
        // cpu0 cannot be taken offline on most machines: no `online` file.
        if cpu != 0 {
            let up = self.online.contains(cpu);
            files.put(&format!("{dir}/online"), if up { "1" } else { "0" })?;
        }
        if !self.online.contains(cpu) {
            return Ok(());
        }
        let empty = CpuSet::new();
        let threads = &self.core_cpus[index];
        let package = self.socket_cpus.get(&core.socket).unwrap_or(&empty);
        let cluster = match self.cluster_of(core) {
            Some(c) => self.cluster_cpus.get(&(core.socket, c)).unwrap_or(&empty),
            None => threads,
        };
        let topo = format!("{dir}/topology");
        files.put(
            &format!("{topo}/physical_package_id"),
            &core.socket.to_string(),
        )?;
        files.put(&format!("{topo}/die_id"), "0")?;
        files.put(&format!("{topo}/core_id"), &core.core_id.to_string())?;
        let cluster_id = match self.cluster_of(core) {
            Some(c) => core.socket * 1000 + c,
            None => 65535,
        };
        files.put(&format!("{topo}/cluster_id"), &cluster_id.to_string())?;
        for (name, set) in [
            ("thread_siblings", threads),
            ("core_cpus", threads),
            ("core_siblings", package),
            ("package_cpus", package),
            ("die_cpus", package),
            ("cluster_cpus", cluster),
        ] {
            files.mask(&format!("{topo}/{name}"), set)?;
            files.list(&format!("{topo}/{name}_list"), set)?;
        }

        // L1 and L2 belong to the core: their id is its index.
        let core_index = index as u32;
        let mut caches = vec![
            (1, "Data", "48K", threads, core_index),
            (1, "Instruction", "32K", threads, core_index),
            (2, "Unified", "2048K", threads, core_index),
        ];
        if self.machine.l3 {
            let shared = self.l3_cpus.get(&core.l3).unwrap_or(&empty);
            caches.push((3, "Unified", "32768K", shared, core.l3));
        }
        for (k, (level, kind, size, shared, id)) in caches.into_iter().enumerate() {
            let cache = format!("{dir}/cache/index{k}");
            files.put(&format!("{cache}/level"), &level.to_string())?;
            files.put(&format!("{cache}/type"), kind)?;
            files.put(&format!("{cache}/size"), size)?;
            files.put(&format!("{cache}/id"), &id.to_string())?;
            files.list(&format!("{cache}/shared_cpu_list"), shared)?;
            files.mask(&format!("{cache}/shared_cpu_map"), shared)?;
        }
        files.dir(&format!("{dir}/node{}", core.numa))
    }

    fn write_nodes(&self, files: &Files) -> io::Result<()> {
        let per_socket = self.machine.shape.numa_per_socket.max(1);
        let nodes: Vec<u32> = self.numa_cpus.keys().copied().collect();
        for (node, cpus) in &self.numa_cpus {
            let dir = format!("node/node{node}");
            files.list(&format!("{dir}/cpulist"), cpus)?;
            files.mask(&format!("{dir}/cpumap"), cpus)?;
            let distance: Vec<&str> = nodes
                .iter()
                .map(|other| match other {
                    o if o == node => "10",
                    o if o / per_socket == node / per_socket => "12",
                    _ => "21",
                })
                .collect();
            files.put(&format!("{dir}/distance"), &distance.join(" "))?;
            files.put(
                &format!("{dir}/meminfo"),
                &format!("Node {node} MemTotal:       65536000 kB"),
            )?;
        }
        let all_nodes = match nodes.len() {
            0 | 1 => "0".to_string(),
            n => format!("0-{}", n - 1),
        };
        for name in [
            "online",
            "possible",
            "has_cpu",
            "has_memory",
            "has_normal_memory",
        ] {
            files.put(&format!("node/{name}"), &all_nodes)?;
        }
        Ok(())
    }

    /// A minimal `/proc/cpuinfo`: lscpu wants one `processor` stanza per
    /// online CPU.
    fn write_cpuinfo(&self, files: &Files) -> io::Result<()> {
        let mut text = String::new();
        for cpu in &self.online {
            text.push_str(&format!(
                "processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: synthetic\n\n"
            ));
        }
        let path = files.root.join("proc/cpuinfo");
        create_parent(&path)?;
        std::fs::write(&path, text).map_err(|e| at(&path, e))
    }
}

/// Writes files under `<root>/sys/devices/system`, each with a trailing
/// newline as the kernel prints them.
struct Files {
    root: PathBuf,
    system: PathBuf,
    /// Bits in a mask: the possible CPUs.
    width: u32,
}

impl Files {
    fn new(root: &Path, width: u32) -> Files {
        Files {
            root: root.to_path_buf(),
            system: root.join("sys/devices/system"),
            width,
        }
    }

    fn put(&self, rel: &str, value: &str) -> io::Result<()> {
        let path = self.system.join(rel);
        create_parent(&path)?;
        std::fs::write(&path, format!("{value}\n")).map_err(|e| at(&path, e))
    }

    fn list(&self, rel: &str, set: &CpuSet) -> io::Result<()> {
        self.put(rel, &set.to_cpulist())
    }

    /// The hex mask padded to the width of the possible CPUs, as the
    /// kernel prints it.
    fn mask(&self, rel: &str, set: &CpuSet) -> io::Result<()> {
        self.put(rel, &padded_mask(set, self.width))
    }

    fn dir(&self, rel: &str) -> io::Result<()> {
        let path = self.system.join(rel);
        std::fs::create_dir_all(&path).map_err(|e| at(&path, e))
    }
}

fn padded_mask(set: &CpuSet, width: u32) -> String {
    let words = width.div_ceil(32).max(1) as usize;
    let mask = set.to_hex_mask();
    let have = mask.split(',').count();
    let mut out = "00000000,".repeat(words.saturating_sub(have));
    out.push_str(&mask);
    out
}

fn create_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) => std::fs::create_dir_all(parent).map_err(|e| at(parent, e)),
        None => Ok(()),
    }
}

fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{synthetic, Topology};
    use proptest::prelude::*;

    fn read(root: &Path, rel: &str) -> String {
        std::fs::read_to_string(root.join("sys/devices/system").join(rel))
            .unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn discover_written(machine: &Machine) -> (tempfile::TempDir, Topology) {
        let dir = tempfile::tempdir().expect("temp dir");
        machine.write(dir.path()).expect("write");
        let topo = Topology::discover(dir.path()).expect("discover");
        (dir, topo)
    }

    #[test]
    fn masks_are_padded_to_the_possible_cpus() {
        let set = |cpus: &[u32]| cpus.iter().copied().collect::<CpuSet>();
        assert_eq!(padded_mask(&set(&[93]), 96), "20000000,00000000,00000000");
        assert_eq!(padded_mask(&set(&[0, 1]), 2), "00000003");
        assert_eq!(padded_mask(&CpuSet::new(), 64), "00000000,00000000");
        assert_eq!(padded_mask(&set(&[32]), 33), "00000001,00000000");
    }

    #[test]
    fn every_name_has_a_machine_and_other_names_none() {
        let totals: Vec<u32> = NAMED
            .iter()
            .map(|name| Machine::named(name).expect(name).cpus_total())
            .collect();
        assert_eq!(totals, [128, 80, 32, 96, 128, 2]);
        assert!(Machine::named("intel-2s").is_none());
        let dir = tempfile::tempdir().expect("temp dir");
        let err = write_named("nope", dir.path()).expect_err("unknown name");
        assert!(err.to_string().contains("vm-2c-nosmt"), "{err}");
    }

    #[test]
    fn offline_cpus_keep_only_their_online_file() {
        let machine = Machine::named("intel-2s-ht-adjacent-offline-96").expect("named");
        let dir = tempfile::tempdir().expect("temp dir");
        machine.write(dir.path()).expect("write");
        let cpu95 = dir.path().join("sys/devices/system/cpu/cpu95");
        let entries: Vec<String> = std::fs::read_dir(&cpu95)
            .expect("cpu95")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries, ["online"]);
        assert_eq!(read(dir.path(), "cpu/cpu95/online"), "0\n");
        assert_eq!(read(dir.path(), "cpu/online"), "0-93\n");
        assert_eq!(read(dir.path(), "cpu/offline"), "94-95\n");
        assert_eq!(read(dir.path(), "cpu/possible"), "0-95\n");
        assert_eq!(read(dir.path(), "node/node1/cpulist"), "48-93\n");
        assert_eq!(
            read(dir.path(), "cpu/cpu93/topology/package_cpus"),
            "3fffffff,ffff0000,00000000\n"
        );
        assert!(!dir
            .path()
            .join("sys/devices/system/cpu/cpu0/online")
            .exists());
    }

    #[test]
    fn a_hybrid_part_lists_its_core_types() {
        let machine = Machine::named("hybrid-8p16e-32").expect("named");
        let dir = tempfile::tempdir().expect("temp dir");
        machine.write(dir.path()).expect("write");
        let devices = dir.path().join("sys/devices");
        let list = |rel: &str| std::fs::read_to_string(devices.join(rel)).expect(rel);
        assert_eq!(list("cpu_core/cpus"), "0-7,24-31\n");
        assert_eq!(list("cpu_atom/cpus"), "8-23\n");
        assert_eq!(
            read(dir.path(), "cpu/cpu24/topology/thread_siblings_list"),
            "0,24\n"
        );
        assert_eq!(
            read(dir.path(), "cpu/cpu8/topology/thread_siblings_list"),
            "8\n"
        );
        assert_eq!(read(dir.path(), "cpu/cpu8/topology/core_id"), "8\n");
    }

    #[test]
    fn too_large_or_empty_machines_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let big = Machine::from(synthetic::Shape {
            cores_per_l3: MAX_CPUS,
            ..simple(1, 2)
        });
        assert_eq!(
            big.write(dir.path()).expect_err("too large").kind(),
            io::ErrorKind::InvalidInput
        );
        let empty = Machine::from(simple(0, 2));
        assert!(empty.write(dir.path()).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// A plain machine written and discovered is the synthetic topology
        /// of the same shape (but for cluster ids, which the tree does not
        /// describe).
        #[test]
        fn plain_shapes_discover_as_their_synthetic_topology(
            sockets in 1u32..3,
            numa_per_socket in 1u32..3,
            l3_per_numa in 1u32..3,
            cores_per_l3 in 1u32..4,
            threads_per_core in 1u32..4,
            adjacent in any::<bool>(),
        ) {
            let shape = synthetic::Shape {
                sockets,
                numa_per_socket,
                l3_per_numa,
                cores_per_l3,
                threads_per_core,
                sibling_numbering: if adjacent {
                    SiblingNumbering::Adjacent
                } else {
                    SiblingNumbering::Split
                },
            };
            let (_dir, mut discovered) = discover_written(&Machine::from(shape));
            let mut built = synthetic::build(&shape);
            for cpu in discovered.cpus.iter_mut().chain(built.cpus.iter_mut()) {
                cpu.cluster = 0;
            }
            prop_assert_eq!(discovered, built);
        }
    }
}
