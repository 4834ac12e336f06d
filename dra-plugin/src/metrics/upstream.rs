//! The upstream Go driver's series dra-plugin exports
//! (kubernetes-sigs/dra-driver-cpu, `pkg/metrics/metrics.go`), with its
//! names, types, label names and values, help strings and buckets, so that
//! dashboards and alerts written for it read this driver too; next to
//! dra-plugin's own series, on the same `/metrics`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use dra_cpu_daemon::exposition::{register, AtomicGauge, DurationHistogram};
use dra_cpu_daemon::upstream_metrics::{result_label, Descriptor, OpResult, ResultLabel};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Prometheus client_golang's `DefBuckets`, which upstream's claim duration
/// histograms use.
pub const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upstream's buckets of `dra_cpu_claim_allocated_cpus`.
pub const CLAIM_CPU_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

pub const ALLOCATED_CPUS: Descriptor = Descriptor {
    name: "dra_cpu_allocated_cpus",
    kind: "gauge",
    help: "Number of CPUs currently allocated to prepared resource claims.",
    labels: &[],
};
pub const AVAILABLE_CPUS: Descriptor = Descriptor {
    name: "dra_cpu_available_cpus",
    kind: "gauge",
    help:
        "Number of CPUs available for allocation after reserved and active claim CPUs are excluded.",
    labels: &[],
};
pub const RESERVED_CPUS: Descriptor = Descriptor {
    name: "dra_cpu_reserved_cpus",
    kind: "gauge",
    help: "Number of CPUs reserved and excluded from DRA management.",
    labels: &[],
};
pub const RESOURCE_CLAIMS_ACTIVE: Descriptor = Descriptor {
    name: "dra_cpu_resource_claims_active",
    kind: "gauge",
    help: "Number of resource claims currently recorded as active by the allocation store.",
    labels: &[],
};
pub const PREPARE_CLAIMS: Descriptor = Descriptor {
    name: "dra_cpu_prepare_claims_total",
    kind: "counter",
    help: "Total number of per-claim PrepareResourceClaims results.",
    labels: &["result"],
};
pub const UNPREPARE_CLAIMS: Descriptor = Descriptor {
    name: "dra_cpu_unprepare_claims_total",
    kind: "counter",
    help: "Total number of per-claim UnprepareResourceClaims results.",
    labels: &["result"],
};
pub const PREPARE_CLAIM_DURATION: Descriptor = Descriptor {
    name: "dra_cpu_prepare_claim_duration_seconds",
    kind: "histogram",
    help: "Duration of per-claim prepare operations in seconds.",
    labels: &[],
};
pub const UNPREPARE_CLAIM_DURATION: Descriptor = Descriptor {
    name: "dra_cpu_unprepare_claim_duration_seconds",
    kind: "histogram",
    help: "Duration of per-claim unprepare operations in seconds.",
    labels: &[],
};
pub const CLAIM_ALLOCATED_CPUS: Descriptor = Descriptor {
    name: "dra_cpu_claim_allocated_cpus",
    kind: "histogram",
    help: "Number of CPUs allocated for each newly successful claim allocation.",
    labels: &[],
};
/// Upstream's series that dra-plugin exports.
pub const DRIVER_SERIES: [Descriptor; 9] = [
    ALLOCATED_CPUS,
    AVAILABLE_CPUS,
    RESERVED_CPUS,
    RESOURCE_CLAIMS_ACTIVE,
    PREPARE_CLAIMS,
    UNPREPARE_CLAIMS,
    PREPARE_CLAIM_DURATION,
    UNPREPARE_CLAIM_DURATION,
    CLAIM_ALLOCATED_CPUS,
];

/// Upstream's allocation gauges at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocationState {
    pub allocated_cpus: u64,
    pub available_cpus: u64,
    pub reserved_cpus: u64,
    pub active_claims: u64,
}

/// A counter per `result`, all three served from the start as upstream's.
#[derive(Debug)]
struct ResultCounters {
    family: Family<ResultLabel, Counter>,
    /// The family's members, by [`OpResult::index`]: no map lookup when
    /// counting.
    by_result: [Counter; 3],
}

impl Default for ResultCounters {
    fn default() -> Self {
        let family = Family::<ResultLabel, Counter>::default();
        let by_result = OpResult::ALL.map(|r| family.get_or_create(&result_label(r)).clone());
        ResultCounters { family, by_result }
    }
}

/// Upstream's driver series (dra-plugin).
#[derive(Debug)]
pub struct DriverMetrics {
    allocated_cpus: AtomicGauge,
    available_cpus: AtomicGauge,
    reserved_cpus: AtomicGauge,
    active_claims: AtomicGauge,
    prepares: ResultCounters,
    unprepares: ResultCounters,
    prepare_duration: DurationHistogram,
    unprepare_duration: DurationHistogram,
    claim_allocated_cpus: Histogram,
}

impl Default for DriverMetrics {
    fn default() -> Self {
        DriverMetrics {
            allocated_cpus: AtomicGauge::default(),
            available_cpus: AtomicGauge::default(),
            reserved_cpus: AtomicGauge::default(),
            active_claims: AtomicGauge::default(),
            prepares: ResultCounters::default(),
            unprepares: ResultCounters::default(),
            prepare_duration: DurationHistogram::new(DEFAULT_BUCKETS),
            unprepare_duration: DurationHistogram::new(DEFAULT_BUCKETS),
            claim_allocated_cpus: Histogram::new(CLAIM_CPU_BUCKETS.iter().copied()),
        }
    }
}

impl DriverMetrics {
    pub fn set_allocation_state(&self, state: AllocationState) {
        self.allocated_cpus
            .store(state.allocated_cpus, Ordering::Relaxed);
        self.available_cpus
            .store(state.available_cpus, Ordering::Relaxed);
        self.reserved_cpus
            .store(state.reserved_cpus, Ordering::Relaxed);
        self.active_claims
            .store(state.active_claims, Ordering::Relaxed);
    }

    /// One claim of a NodePrepareResources call.
    pub fn record_prepare(&self, result: OpResult, elapsed: Duration) {
        self.prepares.by_result[result.index()].inc();
        self.prepare_duration.observe(elapsed);
    }

    /// One claim of a NodeUnprepareResources call.
    pub fn record_unprepare(&self, result: OpResult, elapsed: Duration) {
        self.unprepares.by_result[result.index()].inc();
        self.unprepare_duration.observe(elapsed);
    }

    /// A claim newly given `cpus` CPUs (not a repeated prepare).
    pub fn record_claim_allocated_cpus(&self, cpus: usize) {
        self.claim_allocated_cpus.observe(cpus as f64);
    }

    pub fn prepares(&self, result: OpResult) -> u64 {
        self.prepares.by_result[result.index()].get()
    }

    /// Serve every series through `registry`.
    pub fn register(&self, registry: &mut Registry) {
        for (d, gauge) in [
            (ALLOCATED_CPUS, &self.allocated_cpus),
            (AVAILABLE_CPUS, &self.available_cpus),
            (RESERVED_CPUS, &self.reserved_cpus),
            (RESOURCE_CLAIMS_ACTIVE, &self.active_claims),
        ] {
            register(registry, d.name, d.help, gauge.clone());
        }
        for (d, counters) in [
            (PREPARE_CLAIMS, &self.prepares),
            (UNPREPARE_CLAIMS, &self.unprepares),
        ] {
            register(registry, d.name, d.help, counters.family.clone());
        }
        for (d, histogram) in [
            (PREPARE_CLAIM_DURATION, &self.prepare_duration),
            (UNPREPARE_CLAIM_DURATION, &self.unprepare_duration),
        ] {
            register(registry, d.name, d.help, histogram.clone());
        }
        let d = CLAIM_ALLOCATED_CPUS;
        register(registry, d.name, d.help, self.claim_allocated_cpus.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use dra_cpu_daemon::exposition::encode;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_sum_is_in_units() {
        let h = DurationHistogram::new(DEFAULT_BUCKETS);
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(20));
        let mut registry = Registry::default();
        register(&mut registry, "x", "X.", h);
        let out = encode(&registry);
        let l = lines(&out);
        for want in [
            "x_bucket{le=\"0.005\"} 1",
            "x_bucket{le=\"0.025\"} 1",
            "x_bucket{le=\"0.05\"} 2",
            "x_bucket{le=\"10\"} 2",
            "x_bucket{le=\"+Inf\"} 3",
            "x_sum 20.033",
            "x_count 3",
        ] {
            assert!(l.contains(&want), "missing {want:?} in\n{out}");
        }
    }

    #[test]
    fn driver_series_carry_upstream_names_types_and_results() {
        let m = DriverMetrics::default();
        m.set_allocation_state(AllocationState {
            allocated_cpus: 4,
            available_cpus: 10,
            reserved_cpus: 2,
            active_claims: 1,
        });
        m.record_prepare(OpResult::Success, Duration::from_millis(2));
        m.record_prepare(OpResult::Error, Duration::from_millis(2));
        m.record_unprepare(OpResult::Success, Duration::from_millis(1));
        m.record_claim_allocated_cpus(3);
        let mut registry = Registry::default();
        m.register(&mut registry);
        let out = encode(&registry);
        let l = lines(&out);
        for d in DRIVER_SERIES {
            let want = format!("# TYPE {} {}", d.name, d.kind);
            assert!(l.contains(&want.as_str()), "missing {want:?}");
            let help = format!("# HELP {} {}", d.name, d.help);
            assert!(l.contains(&help.as_str()), "missing {help:?}");
        }
        for want in [
            "dra_cpu_allocated_cpus 4",
            "dra_cpu_available_cpus 10",
            "dra_cpu_reserved_cpus 2",
            "dra_cpu_resource_claims_active 1",
            "dra_cpu_prepare_claims_total{result=\"success\"} 1",
            "dra_cpu_prepare_claims_total{result=\"error\"} 1",
            "dra_cpu_prepare_claims_total{result=\"unknown\"} 0",
            "dra_cpu_unprepare_claims_total{result=\"success\"} 1",
            "dra_cpu_prepare_claim_duration_seconds_count 2",
            "dra_cpu_unprepare_claim_duration_seconds_count 1",
            "dra_cpu_claim_allocated_cpus_bucket{le=\"2\"} 0",
            "dra_cpu_claim_allocated_cpus_bucket{le=\"4\"} 1",
        ] {
            assert!(l.contains(&want), "missing {want:?} in\n{out}");
        }
    }
}
