//! `/proc/interrupts` read per CPU, and a process's involuntary context
//! switches: what the tuning noise measurement (`src/bin/tuning-noise.rs`)
//! counts on a claim's CPUs; and the node-wide values claims' tuning
//! changes, as the kernel reports them, for the tests that read them back.

use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::io;

/// The node-wide values claims' tuning may change, as this kernel reports
/// them: every interrupt's affinity, new interrupts' affinity, and each
/// online CPU's idle-state bound (`None` where the kernel has no such file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTuning {
    pub irq_affinity: BTreeMap<u32, CpuSet>,
    pub default_irq_affinity: CpuSet,
    pub idle_latency: BTreeMap<u32, Option<String>>,
}

/// `/sys/devices/system/cpu/cpu<n>/power/pm_qos_resume_latency_us`.
pub fn idle_latency_path(cpu: u32) -> String {
    format!("/sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us")
}

fn read_trimmed(path: &str) -> io::Result<String> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

impl KernelTuning {
    /// Reads them now, for the CPUs of `online`.
    pub fn read(online: &CpuSet) -> io::Result<KernelTuning> {
        let mut irq_affinity = BTreeMap::new();
        for entry in std::fs::read_dir("/proc/irq")?.flatten() {
            let Some(irq) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // An interrupt without an affinity file (or gone since the
            // listing) is not one tuning moves.
            if let Ok(text) = std::fs::read_to_string(entry.path().join("smp_affinity_list")) {
                irq_affinity.insert(
                    irq,
                    CpuSet::parse_cpulist(text.trim()).map_err(io::Error::other)?,
                );
            }
        }
        let default_irq_affinity =
            CpuSet::parse_hex_mask(&read_trimmed("/proc/irq/default_smp_affinity")?)
                .map_err(io::Error::other)?;
        let idle_latency = online
            .iter()
            .map(|cpu| (cpu, read_trimmed(&idle_latency_path(cpu)).ok()))
            .collect();
        Ok(KernelTuning {
            irq_affinity,
            default_irq_affinity,
            idle_latency,
        })
    }

    /// Interrupts that still target one of `cpus`, leaving out those the
    /// kernel lets nobody move (writing their own affinity back fails).
    pub fn movable_irqs_on(&self, cpus: &CpuSet) -> Vec<u32> {
        self.irq_affinity
            .iter()
            .filter(|(_, affinity)| !affinity.is_disjoint(cpus))
            .filter(|(irq, affinity)| {
                std::fs::write(
                    format!("/proc/irq/{irq}/smp_affinity_list"),
                    affinity.to_cpulist(),
                )
                .is_ok()
            })
            .map(|(irq, _)| *irq)
            .collect()
    }

    /// How many interrupts have another affinity than in `before`.
    pub fn moved_since(&self, before: &KernelTuning) -> usize {
        self.irq_affinity
            .iter()
            .filter(|(irq, affinity)| before.irq_affinity.get(irq) != Some(*affinity))
            .count()
    }
}

/// Interrupt counts per CPU, by source: a number for a device interrupt,
/// a name (`LOC`, `RES`, `CAL`, ...) for the architecture's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterruptCounts {
    pub by_source: BTreeMap<String, Vec<u64>>,
}

/// Reads the text of `/proc/interrupts`: a header of `CPUn` columns, then a
/// line per source with one count per column (sources with fewer counts,
/// such as `ERR`, are left out).
pub fn parse_interrupts(text: &str) -> InterruptCounts {
    let mut lines = text.lines();
    let columns: Vec<u32> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect();
    let mut by_source = BTreeMap::new();
    for line in lines {
        let Some((source, rest)) = line.split_once(':') else {
            continue;
        };
        let counts: Vec<u64> = rest
            .split_whitespace()
            .take(columns.len())
            .map_while(|c| c.parse().ok())
            .collect();
        if counts.len() != columns.len() {
            continue;
        }
        // Indexed by CPU id: columns list only online CPUs.
        let size = columns.iter().max().map_or(0, |m| *m as usize + 1);
        let mut per_cpu = vec![0; size];
        for (cpu, count) in columns.iter().zip(counts) {
            per_cpu[*cpu as usize] = count;
        }
        by_source.insert(source.trim().to_string(), per_cpu);
    }
    InterruptCounts { by_source }
}

impl InterruptCounts {
    /// What happened between `earlier` and `self` on `cpus`: device
    /// interrupts (numbered sources) and all interrupts.
    pub fn since(&self, earlier: &InterruptCounts, cpus: &CpuSet) -> (u64, u64) {
        let mut device = 0;
        let mut all = 0;
        for (source, counts) in &self.by_source {
            let before = earlier.by_source.get(source);
            let delta: u64 = cpus
                .iter()
                .map(|cpu| {
                    let now = counts.get(cpu as usize).copied().unwrap_or(0);
                    let then = before
                        .and_then(|b| b.get(cpu as usize).copied())
                        .unwrap_or(0);
                    now.saturating_sub(then)
                })
                .sum();
            all += delta;
            if source.parse::<u32>().is_ok() {
                device += delta;
            }
        }
        (device, all)
    }
}

/// `nonvoluntary_ctxt_switches` of a `/proc/<pid>/status` text: how often
/// the process was switched out while it wanted to run.
pub fn involuntary_switches(status: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        line.strip_prefix("nonvoluntary_ctxt_switches:")?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "           CPU0       CPU1       CPU2
  0:         45          0          0  IR-IO-APIC    2-edge      timer
 24:        100         20          3  PCI-MSI 512000-edge      virtio0-req.0
LOC:       5000       4000        300   Local timer interrupts
ERR:          0
";

    #[test]
    fn counts_per_cpu_and_deltas_on_a_set() {
        let before = parse_interrupts(SAMPLE);
        assert_eq!(before.by_source["24"], vec![100, 20, 3]);
        assert!(!before.by_source.contains_key("ERR"));
        let after = parse_interrupts(
            &SAMPLE
                .replace("20          3", "25          9")
                .replace("4000        300", "4100        310"),
        );
        let cpus = CpuSet::parse_cpulist("1-2").expect("cpus");
        assert_eq!(after.since(&before, &cpus), (11, 121));
    }

    #[test]
    fn involuntary_switches_are_read() {
        let status = "Name:\tsh\nvoluntary_ctxt_switches:\t3\nnonvoluntary_ctxt_switches:\t42\n";
        assert_eq!(involuntary_switches(status), Some(42));
        assert_eq!(involuntary_switches("Name:\tsh\n"), None);
    }
}
