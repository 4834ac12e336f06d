//! The metric series of the upstream Go driver (kubernetes-sigs/dra-driver-cpu,
//! `pkg/metrics/metrics.go`), with its names, types, label names and values,
//! help strings and buckets, so that dashboards and alerts written for it
//! read this driver too. dra-plugin exports [`DriverMetrics`], nri-plugin
//! [`NriMetrics`]; each next to its own series, on the same `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain numbers survive a panic elsewhere well enough to be read.
    crate::sync::lock(m)
}

#[derive(Debug, Clone, Default)]
struct HistogramData {
    /// Observations at or below each bound (not yet cumulative).
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

/// A histogram with fixed bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    data: Mutex<HistogramData>,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            data: Mutex::new(HistogramData {
                buckets: vec![0; bounds.len()],
                ..HistogramData::default()
            }),
        }
    }

    pub fn observe(&self, value: f64) {
        let mut data = lock(&self.data);
        if let Some(i) = self.bounds.iter().position(|bound| value <= *bound) {
            if let Some(bucket) = data.buckets.get_mut(i) {
                *bucket += 1;
            }
        }
        data.count += 1;
        data.sum += value;
    }

    pub fn observe_duration(&self, elapsed: Duration) {
        self.observe(elapsed.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        lock(&self.data).count
    }

    /// The sample lines of this histogram; `labels` is `a="x",b="y"` or empty.
    fn render_samples(&self, name: &str, labels: &str, out: &mut String) {
        let data = lock(&self.data).clone();
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&data.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            data.count
        );
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), data.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), data.count);
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
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

/// Upstream's driver series (dra-plugin).
#[derive(Debug)]
pub struct DriverMetrics {
    allocated_cpus: AtomicU64,
    available_cpus: AtomicU64,
    reserved_cpus: AtomicU64,
    active_claims: AtomicU64,
    prepares: [AtomicU64; 3],
    unprepares: [AtomicU64; 3],
    prepare_duration: Histogram,
    unprepare_duration: Histogram,
    claim_allocated_cpus: Histogram,
}

impl Default for DriverMetrics {
    fn default() -> Self {
        DriverMetrics {
            allocated_cpus: AtomicU64::new(0),
            available_cpus: AtomicU64::new(0),
            reserved_cpus: AtomicU64::new(0),
            active_claims: AtomicU64::new(0),
            prepares: Default::default(),
            unprepares: Default::default(),
            prepare_duration: Histogram::new(DEFAULT_BUCKETS),
            unprepare_duration: Histogram::new(DEFAULT_BUCKETS),
            claim_allocated_cpus: Histogram::new(CLAIM_CPU_BUCKETS),
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
        self.prepares[result.index()].fetch_add(1, Ordering::Relaxed);
        self.prepare_duration.observe_duration(elapsed);
    }

    /// One claim of a NodeUnprepareResources call.
    pub fn record_unprepare(&self, result: OpResult, elapsed: Duration) {
        self.unprepares[result.index()].fetch_add(1, Ordering::Relaxed);
        self.unprepare_duration.observe_duration(elapsed);
    }

    /// A claim newly given `cpus` CPUs (not a repeated prepare).
    pub fn record_claim_allocated_cpus(&self, cpus: usize) {
        self.claim_allocated_cpus.observe(cpus as f64);
    }

    pub fn prepares(&self, result: OpResult) -> u64 {
        self.prepares[result.index()].load(Ordering::Relaxed)
    }

    pub fn render(&self, out: &mut String) {
        for (d, value) in [
            (ALLOCATED_CPUS, &self.allocated_cpus),
            (AVAILABLE_CPUS, &self.available_cpus),
            (RESERVED_CPUS, &self.reserved_cpus),
            (RESOURCE_CLAIMS_ACTIVE, &self.active_claims),
        ] {
            header(out, d.name, d.kind, d.help);
            let _ = writeln!(out, "{} {}", d.name, value.load(Ordering::Relaxed));
        }
        for (d, counts) in [
            (PREPARE_CLAIMS, &self.prepares),
            (UNPREPARE_CLAIMS, &self.unprepares),
        ] {
            header(out, d.name, d.kind, d.help);
            for result in OpResult::ALL {
                let _ = writeln!(
                    out,
                    "{}{{result=\"{}\"}} {}",
                    d.name,
                    result.label(),
                    counts[result.index()].load(Ordering::Relaxed)
                );
            }
        }
        for (d, histogram) in [
            (PREPARE_CLAIM_DURATION, &self.prepare_duration),
            (UNPREPARE_CLAIM_DURATION, &self.unprepare_duration),
            (CLAIM_ALLOCATED_CPUS, &self.claim_allocated_cpus),
        ] {
            header(out, d.name, d.kind, d.help);
            histogram.render_samples(d.name, "", out);
        }
    }
}

/// The NRI callbacks upstream times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NriCallback {
    CreateContainer,
    StopContainer,
    RemoveContainer,
}

/// Upstream's NRI callback duration series (nri-plugin).
#[derive(Debug)]
pub struct NriMetrics {
    synchronize: [Histogram; 3],
    /// By callback, result, mode.
    containers: [[[Histogram; 3]; 3]; 3],
}

impl Default for NriMetrics {
    fn default() -> Self {
        let h = || Histogram::new(NRI_BUCKETS);
        let by_result = || [h(), h(), h()];
        let by_mode = || [by_result(), by_result(), by_result()];
        NriMetrics {
            synchronize: by_result(),
            containers: [by_mode(), by_mode(), by_mode()],
        }
    }
}

impl NriMetrics {
    pub fn record_synchronize(&self, result: OpResult, elapsed: Duration) {
        self.synchronize[result.index()].observe_duration(elapsed);
    }

    pub fn record_container(
        &self,
        callback: NriCallback,
        result: OpResult,
        mode: CpuAllocationMode,
        elapsed: Duration,
    ) {
        self.containers[callback as usize][result.index()][mode.index()].observe_duration(elapsed);
    }

    pub fn container_count(
        &self,
        callback: NriCallback,
        result: OpResult,
        mode: CpuAllocationMode,
    ) -> u64 {
        self.containers[callback as usize][result.index()][mode.index()].count()
    }

    pub fn render(&self, out: &mut String) {
        let d = NRI_SYNCHRONIZE_DURATION;
        header(out, d.name, d.kind, d.help);
        for result in OpResult::ALL {
            let labels = format!("result=\"{}\"", result.label());
            self.synchronize[result.index()].render_samples(d.name, &labels, out);
        }
        for (d, callback) in [
            (NRI_CREATE_CONTAINER_DURATION, NriCallback::CreateContainer),
            (NRI_STOP_CONTAINER_DURATION, NriCallback::StopContainer),
            (NRI_REMOVE_CONTAINER_DURATION, NriCallback::RemoveContainer),
        ] {
            header(out, d.name, d.kind, d.help);
            for result in OpResult::ALL {
                for mode in CpuAllocationMode::ALL {
                    let histogram =
                        &self.containers[callback as usize][result.index()][mode.index()];
                    // Upstream creates the shared and exclusive series up
                    // front and an unknown one only once observed.
                    if mode == CpuAllocationMode::Unknown && histogram.count() == 0 {
                        continue;
                    }
                    let labels = format!(
                        "result=\"{}\",cpu_allocation_mode=\"{}\"",
                        result.label(),
                        mode.label()
                    );
                    histogram.render_samples(d.name, &labels, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_sum_is_in_units() {
        let h = Histogram::new(DEFAULT_BUCKETS);
        h.observe_duration(Duration::from_millis(3));
        h.observe_duration(Duration::from_millis(30));
        h.observe_duration(Duration::from_secs(20));
        let mut out = String::new();
        h.render_samples("x", "", &mut out);
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
        let mut out = String::new();
        m.render(&mut out);
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
        let mut out = String::new();
        m.render(&mut out);
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
