//! The kernel values a node should hold for its tuned claims, and the
//! record of what the values were before any claim changed them. The
//! record is written (durably, by dra-plugin) before a value is changed and
//! emptied only once the value is back, so a crash or a power cut at any
//! point leaves either the original value in the kernel or the record of
//! it; start-up puts the node back in line with the stored claims.

use super::request::Tuning;
use crate::cpuset::CpuSet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One prepared claim's CPUs and what it asked of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunedClaim {
    pub claim_uid: String,
    pub cpus: CpuSet,
    pub tuning: Tuning,
}

/// Values as they were before tuning changed them, in the kernel's own
/// text, keyed by IRQ number or CPU id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Baseline {
    /// `/proc/irq/<n>/smp_affinity_list`.
    #[serde(default)]
    pub irq_affinity: BTreeMap<u32, String>,
    /// `/proc/irq/default_smp_affinity` (a hex mask).
    #[serde(default)]
    pub default_irq_affinity: Option<String>,
    /// `/sys/devices/system/cpu/cpu<n>/power/pm_qos_resume_latency_us`.
    #[serde(default)]
    pub idle_latency: BTreeMap<u32, String>,
    /// `/sys/devices/system/cpu/cpu<n>/cpufreq/scaling_governor`.
    #[serde(default)]
    pub governor: BTreeMap<u32, String>,
    /// The CPUs a running irqbalance banned before it was told to keep
    /// interrupts off tuned CPUs too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irqbalance: Option<IrqBalanceBaseline>,
}

/// An irqbalance's own banned CPUs, and which daemon they were read from
/// (a restarted irqbalance starts from its configuration again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IrqBalanceBaseline {
    /// Its socket's file name, `irqbalance<pid>.sock`.
    pub daemon: String,
    /// A cpulist.
    pub banned: String,
}

impl Baseline {
    pub fn is_empty(&self) -> bool {
        *self == Baseline::default()
    }
}

/// What the tuned claims want of the node, per knob.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// CPUs no device interrupt may target.
    pub irq_isolated: CpuSet,
    /// Per CPU, the `pm_qos_resume_latency_us` text to write.
    pub idle_latency: BTreeMap<u32, String>,
    /// Per CPU, the governor to set.
    pub governor: BTreeMap<u32, String>,
}

/// The text `pm_qos_resume_latency_us` takes for a bound: the kernel reads
/// `0` as "no constraint" and `n/a` as "no latency at all", so a bound of
/// zero is written `n/a`.
pub fn resume_latency_text(us: u32) -> String {
    if us == 0 {
        "n/a".to_string()
    } else {
        us.to_string()
    }
}

/// What the claims want. Claims hold disjoint CPUs, so a CPU has at most
/// one claim's value; should two overlap anyway, the lower latency wins.
pub fn wanted(claims: &[TunedClaim]) -> Wanted {
    let mut wanted = Wanted::default();
    let mut latency_us: BTreeMap<u32, u32> = BTreeMap::new();
    for claim in claims {
        if claim.tuning.isolate_irqs {
            wanted.irq_isolated = wanted.irq_isolated.union(&claim.cpus);
        }
        for cpu in claim.cpus.iter() {
            if let Some(us) = claim.tuning.max_idle_latency_us {
                let entry = latency_us.entry(cpu).or_insert(us);
                *entry = (*entry).min(us);
            }
            if let Some(governor) = &claim.tuning.governor {
                wanted.governor.insert(cpu, governor.clone());
            }
        }
    }
    wanted.idle_latency = latency_us
        .into_iter()
        .map(|(cpu, us)| (cpu, resume_latency_text(us)))
        .collect();
    wanted
}

/// The affinity an interrupt gets while `isolated` CPUs are kept free: its
/// original CPUs without the isolated ones, or, when that leaves none
/// (a queue interrupt bound to an isolated CPU), the online CPUs that are
/// not isolated. When every online CPU is isolated the original stays:
/// an interrupt must go somewhere.
pub fn irq_affinity(original: &CpuSet, isolated: &CpuSet, online: &CpuSet) -> CpuSet {
    let kept = original.difference(isolated);
    if !kept.is_empty() {
        return kept;
    }
    let housekeeping = online.difference(isolated);
    if housekeeping.is_empty() {
        original.clone()
    } else {
        housekeeping
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn claim(uid: &str, cpus: &str, tuning: Tuning) -> TunedClaim {
        TunedClaim {
            claim_uid: uid.into(),
            cpus: set(cpus),
            tuning,
        }
    }

    #[test]
    fn irq_affinity_table() {
        let online = set("0-7");
        let cases = [
            ("disjoint keeps its CPUs", "0-3", "4-5", "0-3"),
            ("loses the isolated ones", "0-7", "2-3", "0-1,4-7"),
            (
                "bound to isolated CPUs goes to the rest",
                "3",
                "2-3",
                "0-1,4-7",
            ),
            ("nothing isolated", "5", "", "5"),
            ("everything isolated keeps the original", "1", "0-7", "1"),
        ];
        for (name, original, isolated, want) in cases {
            assert_eq!(
                irq_affinity(&set(original), &set(isolated), &online),
                set(want),
                "{name}"
            );
        }
    }

    #[test]
    fn wanted_collects_each_knob_per_cpu() {
        let claims = [
            claim(
                "a",
                "2-3",
                Tuning {
                    isolate_irqs: true,
                    max_idle_latency_us: Some(0),
                    ..Tuning::default()
                },
            ),
            claim(
                "b",
                "4",
                Tuning {
                    max_idle_latency_us: Some(20),
                    governor: Some("performance".into()),
                    ..Tuning::default()
                },
            ),
            claim("c", "5", Tuning::default()),
        ];
        let wanted = wanted(&claims);
        assert_eq!(wanted.irq_isolated, set("2-3"));
        assert_eq!(
            wanted.idle_latency,
            BTreeMap::from([(2, "n/a".into()), (3, "n/a".into()), (4, "20".into())])
        );
        assert_eq!(
            wanted.governor,
            BTreeMap::from([(4, "performance".to_string())])
        );
    }

    #[test]
    fn the_record_reads_back_and_refuses_unknown_fields() {
        let baseline = Baseline {
            irq_affinity: BTreeMap::from([(24, "0-7".to_string())]),
            default_irq_affinity: Some("ff".into()),
            idle_latency: BTreeMap::from([(3, "0".to_string())]),
            governor: BTreeMap::new(),
            irqbalance: Some(IrqBalanceBaseline {
                daemon: "irqbalance812.sock".into(),
                banned: "0".into(),
            }),
        };
        let text = serde_json::to_string(&baseline).expect("serialise");
        assert_eq!(
            serde_json::from_str::<Baseline>(&text).expect("read back"),
            baseline
        );
        assert!(serde_json::from_str::<Baseline>(r#"{"irqs": {}}"#).is_err());
        // A record written before irqbalance was told reads as none told.
        assert_eq!(
            serde_json::from_str::<Baseline>(r#"{"irqAffinity": {"24": "0-7"}}"#)
                .expect("an earlier record")
                .irqbalance,
            None
        );
    }

    proptest! {
        #[test]
        fn an_interrupt_never_lands_on_an_isolated_cpu_while_another_is_online(
            original in proptest::collection::btree_set(0u32..16, 1..16),
            isolated in proptest::collection::btree_set(0u32..16, 0..16),
        ) {
            let online = set("0-15");
            let original: CpuSet = original.into_iter().collect();
            let isolated: CpuSet = isolated.into_iter().collect();
            let got = irq_affinity(&original, &isolated, &online);
            prop_assert!(!got.is_empty());
            if isolated != online {
                prop_assert!(got.is_disjoint(&isolated));
            }
            if original.is_disjoint(&isolated) {
                prop_assert_eq!(got, original);
            }
        }
    }
}
