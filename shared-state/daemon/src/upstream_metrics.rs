//! The metric series of the upstream Go driver (kubernetes-sigs/dra-driver-cpu,
//! `pkg/metrics/metrics.go`), with its names, types, label names and values,
//! help strings and buckets, so that dashboards and alerts written for it
//! read this driver too. dra-plugin exports [`DriverMetrics`], nri-plugin
//! [`NriMetrics`]; each next to its own series, on the same `/metrics`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::exposition::{register, AtomicGauge, DurationHistogram};
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

/// Upstream's buckets of the NRI callback duration histograms.
pub const NRI_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5,
    2.0, 5.0,
];

/// Upstream's `result` label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpResult {
    Success,
    Error,
    Unknown,
}

impl OpResult {
    pub const ALL: [OpResult; 3] = [OpResult::Success, OpResult::Error, OpResult::Unknown];

    pub fn label(self) -> &'static str {
        match self {
            OpResult::Success => "success",
            OpResult::Error => "error",
            OpResult::Unknown => "unknown",
        }
    }

    pub fn of<T, E>(result: &Result<T, E>) -> OpResult {
        match result {
            Ok(_) => OpResult::Success,
            Err(_) => OpResult::Error,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upstream's `cpu_allocation_mode` label values: a container naming no
/// claim is shared, one naming any is exclusive (mixed containers included,
/// as upstream has no mixed mode), one whose claims cannot be read unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuAllocationMode {
    Shared,
    Exclusive,
    Unknown,
}

impl CpuAllocationMode {
    pub const ALL: [CpuAllocationMode; 3] = [
        CpuAllocationMode::Shared,
        CpuAllocationMode::Exclusive,
        CpuAllocationMode::Unknown,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CpuAllocationMode::Shared => "shared",
            CpuAllocationMode::Exclusive => "exclusive",
            CpuAllocationMode::Unknown => "unknown",
        }
    }

    /// The mode of a container by the number of claims it names (`None`:
    /// its claim environment could not be read).
    pub fn of_claim_count(claims: Option<usize>) -> CpuAllocationMode {
        match claims {
            None => CpuAllocationMode::Unknown,
            Some(0) => CpuAllocationMode::Shared,
            Some(_) => CpuAllocationMode::Exclusive,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One upstream series: name, type, help, label names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

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
pub const NRI_SYNCHRONIZE_DURATION: Descriptor = Descriptor {
    name: "dra_cpu_nri_synchronize_duration_seconds",
    kind: "histogram",
    help: "Duration of the NRI Synchronize callbacks in seconds.",
    labels: &["result"],
};
pub const NRI_CREATE_CONTAINER_DURATION: Descriptor = Descriptor {
    name: "dra_cpu_nri_create_container_duration_seconds",
    kind: "histogram",
    help: "Duration of the NRI CreateContainer callbacks in seconds.",
    labels: &["result", "cpu_allocation_mode"],
};
pub const NRI_STOP_CONTAINER_DURATION: Descriptor = Descriptor {
    name: "dra_cpu_nri_stop_container_duration_seconds",
    kind: "histogram",
    help: "Duration of the NRI StopContainer callbacks in seconds.",
    labels: &["result", "cpu_allocation_mode"],
};
pub const NRI_REMOVE_CONTAINER_DURATION: Descriptor = Descriptor {
    name: "dra_cpu_nri_remove_container_duration_seconds",
    kind: "histogram",
    help: "Duration of the NRI RemoveContainer callbacks in seconds.",
    labels: &["result", "cpu_allocation_mode"],
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

/// Upstream's series that nri-plugin exports.
pub const NRI_SERIES: [Descriptor; 4] = [
    NRI_SYNCHRONIZE_DURATION,
    NRI_CREATE_CONTAINER_DURATION,
    NRI_STOP_CONTAINER_DURATION,
    NRI_REMOVE_CONTAINER_DURATION,
];

/// Upstream's allocation gauges at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocationState {
    pub allocated_cpus: u64,
    pub available_cpus: u64,
    pub reserved_cpus: u64,
    pub active_claims: u64,
}

/// Label set `result="..."`.
type ResultLabel = [(&'static str, &'static str); 1];
/// Label set `result="...",cpu_allocation_mode="..."`.
type ResultModeLabels = [(&'static str, &'static str); 2];

fn result_label(result: OpResult) -> ResultLabel {
    [("result", result.label())]
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

/// The NRI callbacks upstream times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NriCallback {
    CreateContainer,
    StopContainer,
    RemoveContainer,
}

fn nri_histogram() -> DurationHistogram {
    DurationHistogram::new(NRI_BUCKETS)
}

type NriFamily<S> = Family<S, DurationHistogram, fn() -> DurationHistogram>;

/// One container callback's histograms by result and mode.
#[derive(Debug)]
struct ContainerSeries {
    family: NriFamily<ResultModeLabels>,
    /// The family's shared and exclusive members, by result: created up
    /// front as upstream's, and observed without a map lookup. An unknown
    /// mode's series is created in the family when first observed.
    known: [[DurationHistogram; 2]; 3],
}

fn mode_labels(result: OpResult, mode: CpuAllocationMode) -> ResultModeLabels {
    [
        ("result", result.label()),
        ("cpu_allocation_mode", mode.label()),
    ]
}

impl Default for ContainerSeries {
    fn default() -> Self {
        let family = NriFamily::new_with_constructor(nri_histogram as fn() -> DurationHistogram);
        let known = OpResult::ALL.map(|result| {
            [CpuAllocationMode::Shared, CpuAllocationMode::Exclusive]
                .map(|mode| family.get_or_create(&mode_labels(result, mode)).clone())
        });
        ContainerSeries { family, known }
    }
}

impl ContainerSeries {
    fn observe(&self, result: OpResult, mode: CpuAllocationMode, elapsed: Duration) {
        match self.known[result.index()].get(mode.index()) {
            Some(histogram) => histogram.observe(elapsed),
            None => self
                .family
                .get_or_create(&mode_labels(result, mode))
                .observe(elapsed),
        }
    }
}

/// Upstream's NRI callback duration series (nri-plugin).
#[derive(Debug)]
pub struct NriMetrics {
    synchronize: NriFamily<ResultLabel>,
    /// The synchronize family's members, by result.
    synchronize_by_result: [DurationHistogram; 3],
    /// By [`NriCallback`].
    containers: [ContainerSeries; 3],
}

impl Default for NriMetrics {
    fn default() -> Self {
        let synchronize =
            NriFamily::new_with_constructor(nri_histogram as fn() -> DurationHistogram);
        let synchronize_by_result =
            OpResult::ALL.map(|r| synchronize.get_or_create(&result_label(r)).clone());
        NriMetrics {
            synchronize,
            synchronize_by_result,
            containers: Default::default(),
        }
    }
}

impl NriMetrics {
    pub fn record_synchronize(&self, result: OpResult, elapsed: Duration) {
        self.synchronize_by_result[result.index()].observe(elapsed);
    }

    pub fn record_container(
        &self,
        callback: NriCallback,
        result: OpResult,
        mode: CpuAllocationMode,
        elapsed: Duration,
    ) {
        self.containers[callback as usize].observe(result, mode, elapsed);
    }

    /// Serve every series through `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let d = NRI_SYNCHRONIZE_DURATION;
        register(registry, d.name, d.help, self.synchronize.clone());
        for (d, callback) in [
            (NRI_CREATE_CONTAINER_DURATION, NriCallback::CreateContainer),
            (NRI_STOP_CONTAINER_DURATION, NriCallback::StopContainer),
            (NRI_REMOVE_CONTAINER_DURATION, NriCallback::RemoveContainer),
        ] {
            let series = &self.containers[callback as usize];
            register(registry, d.name, d.help, series.family.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::exposition::encode;

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

    #[test]
    fn nri_series_are_labelled_by_result_and_mode() {
        let m = NriMetrics::default();
        m.record_synchronize(OpResult::Success, Duration::from_micros(50));
        m.record_container(
            NriCallback::CreateContainer,
            OpResult::Error,
            CpuAllocationMode::Unknown,
            Duration::from_micros(300),
        );
        let mut registry = Registry::default();
        m.register(&mut registry);
        let out = encode(&registry);
        let l = lines(&out);
        for want in [
            "dra_cpu_nri_synchronize_duration_seconds_bucket{result=\"success\",le=\"0.0001\"} 1",
            "dra_cpu_nri_synchronize_duration_seconds_count{result=\"error\"} 0",
            "dra_cpu_nri_create_container_duration_seconds_count{result=\"error\",cpu_allocation_mode=\"unknown\"} 1",
            "dra_cpu_nri_create_container_duration_seconds_bucket{result=\"error\",cpu_allocation_mode=\"unknown\",le=\"0.00025\"} 0",
            "dra_cpu_nri_create_container_duration_seconds_bucket{result=\"error\",cpu_allocation_mode=\"unknown\",le=\"0.0005\"} 1",
            "dra_cpu_nri_stop_container_duration_seconds_count{result=\"success\",cpu_allocation_mode=\"exclusive\"} 0",
            "dra_cpu_nri_remove_container_duration_seconds_count{result=\"unknown\",cpu_allocation_mode=\"shared\"} 0",
        ] {
            assert!(l.contains(&want), "missing {want:?} in\n{out}");
        }
        // An unknown mode appears only once observed, as upstream's.
        assert!(!out.contains(
            "dra_cpu_nri_stop_container_duration_seconds_count{result=\"success\",cpu_allocation_mode=\"unknown\"}"
        ));
    }

    #[test]
    fn allocation_mode_follows_the_claim_count() {
        let cases = [
            (None, CpuAllocationMode::Unknown),
            (Some(0), CpuAllocationMode::Shared),
            (Some(1), CpuAllocationMode::Exclusive),
            (Some(3), CpuAllocationMode::Exclusive),
        ];
        for (count, want) in cases {
            assert_eq!(CpuAllocationMode::of_claim_count(count), want, "{count:?}");
        }
    }
}
