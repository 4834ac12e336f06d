//! The kernel files tuning reads and writes, and what this node supports,
//! found from them.

use shared_state::tuning::support::{isolated_partition_support, CgroupFacts, NodeSupport};
use shared_state::CpuSet;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

/// Where the host's `/proc` and `/sys` are seen from this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPaths {
    /// The host's `/proc` (holding `irq/`).
    pub procfs: PathBuf,
    /// The host's `/` (holding `sys/devices/system/cpu`), as `--sysfs-root`.
    pub host_root: PathBuf,
    /// The host's cgroup hierarchy, as `--cgroup-root` (read only here).
    pub cgroup_root: PathBuf,
    /// Where a running irqbalance has its socket, as `--irqbalance-dir`.
    pub irqbalance_dir: PathBuf,
}

impl KernelPaths {
    /// A host laid out below `root` as it is below `/`: the tests' fake
    /// nodes.
    #[cfg(test)]
    pub(crate) fn under(root: &Path) -> KernelPaths {
        KernelPaths {
            procfs: root.join("proc"),
            host_root: root.to_path_buf(),
            cgroup_root: root.join("cgroup"),
            irqbalance_dir: root.join("run/irqbalance"),
        }
    }

    fn irq_dir(&self) -> PathBuf {
        self.procfs.join("irq")
    }

    /// `/proc/irq/<n>/smp_affinity_list`.
    pub fn irq_affinity(&self, irq: u32) -> PathBuf {
        self.irq_dir()
            .join(irq.to_string())
            .join("smp_affinity_list")
    }

    /// `/proc/irq/default_smp_affinity`: the affinity a new interrupt gets.
    pub fn default_irq_affinity(&self) -> PathBuf {
        self.irq_dir().join("default_smp_affinity")
    }

    fn cpu_dir(&self, cpu: u32) -> PathBuf {
        self.host_root
            .join("sys/devices/system/cpu")
            .join(format!("cpu{cpu}"))
    }

    /// The CPU's PM QoS resume latency bound, which cpuidle governors obey.
    pub fn idle_latency(&self, cpu: u32) -> PathBuf {
        self.cpu_dir(cpu).join("power/pm_qos_resume_latency_us")
    }

    pub fn governor(&self, cpu: u32) -> PathBuf {
        self.cpu_dir(cpu).join("cpufreq/scaling_governor")
    }

    fn available_governors(&self, cpu: u32) -> PathBuf {
        self.cpu_dir(cpu)
            .join("cpufreq/scaling_available_governors")
    }

    /// The interrupts of the node, by number.
    pub fn irqs(&self) -> io::Result<Vec<u32>> {
        let mut irqs: Vec<u32> = std::fs::read_dir(self.irq_dir())?
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect();
        irqs.sort_unstable();
        Ok(irqs)
    }

    /// What this node can honour for claims on `cpus`.
    pub fn support(&self, cpus: &CpuSet) -> NodeSupport {
        let mut support = NodeSupport::default();
        if let Err(why) = writable(&self.default_irq_affinity()) {
            support.irqs = Some(why.to_string());
        }
        if let Some(why) = cpus
            .iter()
            .find_map(|cpu| writable(&self.idle_latency(cpu)).err())
        {
            support.idle = Some(why.to_string());
        }
        match self.governors_of(cpus) {
            Ok(governors) if governors.is_empty() => {
                support.governor = Some("the CPUs share no cpufreq governor".into());
            }
            Ok(governors) => support.governors = governors,
            Err(why) => support.governor = Some(why.to_string()),
        }
        support.load_balancing = isolated_partition_support(
            &self.cgroup_root.display().to_string(),
            &self.cgroup_facts(),
        );
        support
    }

    /// What the cgroup mount says about isolated partitions.
    fn cgroup_facts(&self) -> CgroupFacts {
        let root = &self.cgroup_root;
        CgroupFacts {
            v2_controllers: std::fs::read_to_string(root.join("cgroup.controllers")).ok(),
            v1_root_load_balance: [
                // As nri-plugin looks for the hierarchy: `cpuset/` first.
                "cpuset/cpuset.sched_load_balance",
                "cpuset.sched_load_balance",
            ]
            .iter()
            .find_map(|file| std::fs::read_to_string(root.join(file)).ok()),
            isolated_file: root.join("cpuset.cpus.isolated").exists(),
        }
    }

    /// The governors every CPU of `cpus` offers and can be set to.
    fn governors_of(&self, cpus: &CpuSet) -> Result<BTreeSet<String>, KnobError> {
        let mut common: Option<BTreeSet<String>> = None;
        for cpu in cpus.iter() {
            let path = self.available_governors(cpu);
            let text = match read_value(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(KnobError::NoCpufreq(path))
                }
                Err(source) => return Err(KnobError::Read { path, source }),
            };
            writable(&self.governor(cpu))?;
            let offered: BTreeSet<String> = text.split_whitespace().map(str::to_string).collect();
            common = Some(match common {
                Some(common) => common.intersection(&offered).cloned().collect(),
                None => offered,
            });
        }
        Ok(common.unwrap_or_default())
    }
}

/// Why a kernel knob cannot be used here.
#[derive(Debug, thiserror::Error)]
enum KnobError {
    #[error("the node has no cpufreq ({} is missing)", .0.display())]
    NoCpufreq(PathBuf),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not writable: {}", path.display(), errno.desc())]
    NotWritable {
        path: PathBuf,
        #[source]
        errno: nix::errno::Errno,
    },
}

/// Whether this process may write `path`, and why not.
fn writable(path: &Path) -> Result<(), KnobError> {
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).map_err(|errno| {
        KnobError::NotWritable {
            path: path.to_path_buf(),
            errno,
        }
    })
}

/// A kernel value's text, trimmed.
pub fn read_value(path: &Path) -> io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_string())
}

/// Writes a kernel value in one write, as sysfs and procfs want it (opened
/// as a shell's `>` opens it; the kernel ignores the truncation).
pub fn write_value(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn support_follows_the_files_the_node_has() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = KernelPaths::under(dir.path());
        let cpus = CpuSet::parse_cpulist("0-1").expect("cpus");
        // A node without any of the files.
        let bare = paths.support(&cpus);
        assert!(bare
            .irqs
            .as_deref()
            .is_some_and(|why| why.contains("default_smp_affinity")));
        assert!(bare.idle.as_deref().is_some_and(|why| why.contains("cpu0")));
        assert!(bare
            .governor
            .as_deref()
            .is_some_and(|why| why.contains("no cpufreq")));
        assert!(bare
            .load_balancing
            .as_deref()
            .is_some_and(|why| why.contains("no cgroup v2 hierarchy")));
        // cgroup v1: honoured only once the root cpuset stops balancing.
        let v1_root = paths.cgroup_root.join("cpuset/cpuset.sched_load_balance");
        put(&v1_root, "1\n");
        assert!(paths
            .support(&cpus)
            .load_balancing
            .is_some_and(|why| why.contains("its root cpuset balances every CPU")));
        put(&v1_root, "0\n");
        assert_eq!(paths.support(&cpus).load_balancing, None);
        std::fs::remove_file(&v1_root).expect("back to no hierarchy");

        put(&paths.default_irq_affinity(), "3\n");
        for cpu in 0..2 {
            put(&paths.idle_latency(cpu), "0\n");
            put(&paths.governor(cpu), "powersave\n");
        }
        put(&paths.available_governors(0), "performance powersave\n");
        put(
            &paths.available_governors(1),
            "performance schedutil powersave\n",
        );
        put(
            &paths.cgroup_root.join("cgroup.controllers"),
            "cpuset cpu memory\n",
        );
        put(&paths.cgroup_root.join("cpuset.cpus.isolated"), "\n");
        let full = paths.support(&cpus);
        assert_eq!(full.load_balancing, None);
        assert_eq!(full.irqs, None);
        assert_eq!(full.idle, None);
        assert_eq!(full.governor, None);
        assert_eq!(full.governors_text(), "performance,powersave");
    }

    #[test]
    fn irqs_are_the_numbered_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = KernelPaths {
            procfs: dir.path().to_path_buf(),
            host_root: dir.path().to_path_buf(),
            cgroup_root: dir.path().join("cgroup"),
            irqbalance_dir: dir.path().join("run/irqbalance"),
        };
        for irq in ["10", "2", "default_smp_affinity_dir", "0"] {
            std::fs::create_dir_all(dir.path().join("irq").join(irq)).expect("mkdir");
        }
        assert_eq!(paths.irqs().expect("irqs"), vec![0, 2, 10]);
    }
}
