//! The upstream Go driver's NRI callback series nri-plugin exports
//! (kubernetes-sigs/dra-driver-cpu, `pkg/metrics/metrics.go`), with its
//! names, types, label names and values, help strings and buckets, so that
//! dashboards and alerts written for it read this driver too; next to
//! nri-plugin's own series, on the same `/metrics`.

use std::time::Duration;

use dra_cpu_daemon::exposition::{register, DurationHistogram};
use dra_cpu_daemon::upstream_metrics::{result_label, Descriptor, OpResult, ResultLabel};
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Upstream's buckets of the NRI callback duration histograms.
pub const NRI_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5,
    2.0, 5.0,
];

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

/// Upstream's series that nri-plugin exports.
pub const NRI_SERIES: [Descriptor; 4] = [
    NRI_SYNCHRONIZE_DURATION,
    NRI_CREATE_CONTAINER_DURATION,
    NRI_STOP_CONTAINER_DURATION,
    NRI_REMOVE_CONTAINER_DURATION,
];

/// Label set `result="...",cpu_allocation_mode="..."`.
type ResultModeLabels = [(&'static str, &'static str); 2];

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

    use dra_cpu_daemon::exposition::encode;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
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
