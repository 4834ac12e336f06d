//! Which tuning knobs a node can honour, found once at start-up by
//! dra-plugin, published as device attributes (so a selector can require
//! them) and checked at prepare (so a claim sent here anyway is refused by
//! name, with nothing applied).

use super::request::Tuning;
use std::collections::BTreeSet;

/// Why a knob cannot be honoured on this node; `None` where it can.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSupport {
    /// `irqs: isolate`: `/proc/irq` is writable.
    pub irqs: Option<String>,
    /// `cfsQuota: off`: set through NRI by nri-plugin.
    pub cfs_quota: Option<String>,
    /// `loadBalancing: off`.
    pub load_balancing: Option<String>,
    /// `idle`: each CPU's `power/pm_qos_resume_latency_us` is writable.
    pub idle: Option<String>,
    /// `governor`: the governors every allocatable CPU offers (empty: no
    /// cpufreq), and why none can be set when that is so.
    pub governors: BTreeSet<String>,
    pub governor: Option<String>,
}

/// What the node's cgroup mount says about isolated partitions, read by
/// dra-plugin from `--cgroup-root`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupFacts {
    /// The root's `cgroup.controllers` (`None`: not a cgroup v2 root).
    pub v2_controllers: Option<String>,
    /// What the cgroup v1 cpuset hierarchy's root `cpuset.sched_load_balance`
    /// reads (at the root or under `cpuset/`), `None` where there is none.
    pub v1_root_load_balance: Option<String>,
    /// The v2 root has `cpuset.cpus.isolated` (Linux 6.7+: remote
    /// partitions, which a container's cgroup deep in kubelet's tree needs).
    pub isolated_file: bool,
}

/// Why `loadBalancing: off` cannot be honoured with this cgroup mount, or
/// `None` when it can: on cgroup v2 the claim's container becomes an
/// isolated cpuset partition; on cgroup v1 every cpuset of kubelet's tree
/// holding the claim's CPUs stops balancing (`cpuset.sched_load_balance`
/// 0), which the kernel honours only when the root's is 0 too. Turning the
/// root's off changes how the whole node is balanced, so that is left to
/// the node's operator (docs/user/tuning.md), and checked here.
pub fn isolated_partition_support(root: &str, facts: &CgroupFacts) -> Option<String> {
    let Some(controllers) = &facts.v2_controllers else {
        return match facts.v1_root_load_balance.as_deref().map(str::trim) {
            Some("0") => None,
            Some(value) => Some(format!("{root} is cgroup v1 and its root cpuset balances every CPU (cpuset.sched_load_balance reads {value:?}): a CPU leaves the scheduler's load balancing only when no cpuset holding it balances, the root's included; prepare the node as docs/user/tuning.md says (the root's off, the system's processes in a balanced cpuset of their own), or use cgroup v2 (Linux 6.7+)")),
            None => Some(format!("no cgroup v2 hierarchy at {root} (dra-plugin --cgroup-root)")),
        };
    };
    if !controllers.split_whitespace().any(|c| c == "cpuset") {
        return Some(format!(
            "the cpuset controller is not available in {root} (cgroup.controllers: {:?})",
            controllers.trim()
        ));
    }
    if !facts.isolated_file {
        return Some(format!("the kernel has no remote cpuset partitions ({root}/cpuset.cpus.isolated is missing; Linux 6.7+)"));
    }
    None
}

/// A knob a claim asked for that this node cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tuning.{knob} cannot be honoured on this node: {reason}")]
pub struct Unsupported {
    pub knob: &'static str,
    pub reason: String,
}

impl NodeSupport {
    /// A node that honours nothing, each knob for the same reason.
    pub fn none(reason: &str) -> NodeSupport {
        NodeSupport {
            irqs: Some(reason.to_string()),
            cfs_quota: Some(reason.to_string()),
            load_balancing: Some(reason.to_string()),
            idle: Some(reason.to_string()),
            governors: BTreeSet::new(),
            governor: Some(reason.to_string()),
        }
    }

    /// Every knob the claim asks for that this node cannot honour, the
    /// first one as the error.
    pub fn check(&self, tuning: &Tuning) -> Result<(), Unsupported> {
        let refuse = |knob: &'static str, reason: &Option<String>| match reason {
            Some(reason) => Err(Unsupported {
                knob,
                reason: reason.clone(),
            }),
            None => Ok(()),
        };
        if tuning.isolate_irqs {
            refuse("irqs", &self.irqs)?;
        }
        if tuning.cfs_quota_off {
            refuse("cfsQuota", &self.cfs_quota)?;
        }
        if tuning.load_balancing_off {
            refuse("loadBalancing", &self.load_balancing)?;
        }
        if tuning.max_idle_latency_us.is_some() {
            refuse("idle", &self.idle)?;
        }
        if let Some(governor) = &tuning.governor {
            refuse("governor", &self.governor)?;
            if !self.governors.contains(governor) {
                return Err(Unsupported {
                    knob: "governor",
                    reason: format!(
                        "governor {governor:?} is not offered (the CPUs offer {})",
                        self.governors_text()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The governors, comma-separated, as the device attribute carries them.
    pub fn governors_text(&self) -> String {
        self.governors
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn everything() -> NodeSupport {
        NodeSupport {
            governors: ["performance".to_string(), "powersave".to_string()].into(),
            ..NodeSupport::default()
        }
    }

    #[test]
    fn isolated_partition_support_table() {
        let v2 = |controllers: &str, isolated_file| CgroupFacts {
            v2_controllers: Some(controllers.into()),
            v1_root_load_balance: None,
            isolated_file,
        };
        let cases: Vec<(&str, CgroupFacts, Option<&str>)> = vec![
            ("v2, 6.7+", v2("cpuset cpu io memory pids\n", true), None),
            ("v2 before 6.7", v2("cpuset cpu", false), Some("cpuset.cpus.isolated is missing")),
            ("v2 without cpuset", v2("cpu memory", true), Some("cpuset controller is not available")),
            (
                "v1, the root balancing",
                CgroupFacts { v1_root_load_balance: Some("1\n".into()), ..CgroupFacts::default() },
                Some("is cgroup v1 and its root cpuset balances every CPU (cpuset.sched_load_balance reads \"1\")"),
            ),
            (
                "v1, the root prepared by the operator",
                CgroupFacts { v1_root_load_balance: Some("0\n".into()), ..CgroupFacts::default() },
                None,
            ),
            ("nothing mounted", CgroupFacts::default(), Some("no cgroup v2 hierarchy at /sys/fs/cgroup")),
        ];
        for (name, facts, want) in cases {
            let got = isolated_partition_support("/sys/fs/cgroup", &facts);
            match (got, want) {
                (None, None) => {}
                (Some(why), Some(needle)) => assert!(why.contains(needle), "{name}: {why}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn check_table() {
        let irqs = Tuning {
            isolate_irqs: true,
            ..Tuning::default()
        };
        let governor = |name: &str| Tuning {
            governor: Some(name.into()),
            ..Tuning::default()
        };
        let no_cpufreq = NodeSupport {
            governor: Some("the node has no cpufreq".into()),
            governors: BTreeSet::new(),
            ..NodeSupport::default()
        };
        let cases: Vec<(&str, NodeSupport, Tuning, Result<(), String>)> = vec![
            ("nothing asked, nothing offered", NodeSupport::none("off"), Tuning::default(), Ok(())),
            ("everything offered", everything(), irqs.clone(), Ok(())),
            (
                "interrupts not writable",
                NodeSupport { irqs: Some("/proc/irq is read-only".into()), ..everything() },
                irqs,
                Err("tuning.irqs cannot be honoured on this node: /proc/irq is read-only".into()),
            ),
            ("an offered governor", everything(), governor("performance"), Ok(())),
            (
                "a governor not offered",
                everything(),
                governor("ondemand"),
                Err("tuning.governor cannot be honoured on this node: governor \"ondemand\" is not offered (the CPUs offer performance,powersave)".into()),
            ),
            (
                "no cpufreq",
                no_cpufreq,
                governor("performance"),
                Err("tuning.governor cannot be honoured on this node: the node has no cpufreq".into()),
            ),
        ];
        for (name, support, tuning, want) in cases {
            assert_eq!(
                support.check(&tuning).map_err(|e| e.to_string()),
                want,
                "{name}"
            );
        }
    }
}
