//! Prometheus metrics of dra-plugin: each series registered once with a
//! `prometheus-client` registry under the name dashboards know, and kept
//! here as handles the driver updates without a lock (counters and gauges
//! are atomics).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use dra_cpu_daemon::exposition::{
    self, register, AtomicCounter, AtomicGauge, Computed, Declared, DurationHistogram,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub mod upstream;

/// Upper bounds (seconds) of the latency histogram buckets: a prepare is a
/// few fsyncs, so the interesting range is 100 µs to a few seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// Label set `operation="...",reason="..."`.
type OperationReason = [(&'static str, &'static str); 2];
/// Label set `stage="...",code="..."`.
type StageCode = ([(&'static str, &'static str); 1], [(&'static str, u16); 1]);

/// Every metric of the process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub prepares: AtomicCounter,
    pub unprepares: AtomicCounter,
    pub prepare_latency: DurationHistogram,
    pub unprepare_latency: DurationHistogram,
    /// Failed claims by [`crate::prepare::PrepareError::reason`].
    errors: Declared<Family<OperationReason, Counter>>,
    pub exclusive_cpus: AtomicGauge,
    pub shared_cpus: AtomicGauge,
    pub subscribers: AtomicGauge,
    pub revision: AtomicGauge,
    /// Last revision each subscriber reported as applied.
    applied: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Failed ResourceSlice publishes by stage (`apply`, `list`, ...) and
    /// HTTP status code (0: no answer from the server).
    publish_failures: Declared<Family<StageCode, Counter>>,
    /// 1 when the API server drops `allowMultipleAllocations`
    /// (`DRAConsumableCapacity` off): grouped devices cannot be shared there.
    pub grouped_mode_unsupported: AtomicGauge,
    /// 1 while the published devices carry the KEP-5517 mapping.
    pub node_allocatable_mapping_published: AtomicGauge,
    /// 1 while the published devices carry `resource.kubernetes.io/pcieRoot`.
    pub pcie_roots_published: AtomicGauge,
    /// The upstream Go driver's series, exported as well.
    pub upstream: upstream::DriverMetrics,
    /// Claim device-status writes (KEP-4817), done and failed.
    pub claim_status: Arc<crate::claim_status::StatusWriteStats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding a metrics lock leaves plain numbers
    // behind, still fine to read.
    shared_state::sync::lock(m)
}

/// How far the furthest-behind subscriber is from `current`.
fn lag(current: u64, applied: &Mutex<BTreeMap<String, u64>>) -> u64 {
    lock(applied)
        .values()
        .map(|applied| current.saturating_sub(*applied))
        .max()
        .unwrap_or(0)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            prepares: AtomicCounter::default(),
            unprepares: AtomicCounter::default(),
            prepare_latency: DurationHistogram::new(&LATENCY_BUCKETS),
            unprepare_latency: DurationHistogram::new(&LATENCY_BUCKETS),
            errors: Declared::default(),
            exclusive_cpus: AtomicGauge::default(),
            shared_cpus: AtomicGauge::default(),
            subscribers: AtomicGauge::default(),
            revision: AtomicGauge::default(),
            applied: Arc::default(),
            publish_failures: Declared::default(),
            grouped_mode_unsupported: AtomicGauge::default(),
            node_allocatable_mapping_published: AtomicGauge::default(),
            pcie_roots_published: AtomicGauge::default(),
            upstream: Default::default(),
            claim_status: Arc::default(),
        };
        m.register_all();
        m
    }

    /// Put every series in the registry, in the order they are served.
    fn register_all(&mut self) {
        let r = &mut self.registry;
        register(
            r,
            "dra_cpu_prepares_total",
            "Claims prepared (including idempotent repeats).",
            self.prepares.clone(),
        );
        register(
            r,
            "dra_cpu_unprepares_total",
            "Claims unprepared (including unknown claims).",
            self.unprepares.clone(),
        );
        register(
            r,
            "dra_cpu_claim_errors_total",
            "Claims that failed, by operation and reason.",
            self.errors.clone(),
        );
        register(
            r,
            "dra_cpu_prepare_duration_seconds",
            "Time to prepare one claim, store fsync and CDI write included.",
            self.prepare_latency.clone(),
        );
        register(
            r,
            "dra_cpu_unprepare_duration_seconds",
            "Time to unprepare one claim, store fsync included.",
            self.unprepare_latency.clone(),
        );
        let stats = self.claim_status.clone();
        register(
            r,
            "dra_cpu_claim_status_writes_total",
            "Claim device statuses written (after prepare and unprepare).",
            Computed::counter(move || stats.written.load(Ordering::Relaxed)),
        );
        let stats = self.claim_status.clone();
        register(
            r,
            "dra_cpu_claim_status_write_failures_total",
            "Claim device-status writes that failed; the prepares themselves succeeded.",
            Computed::counter(move || stats.failed.load(Ordering::Relaxed)),
        );
        register(
            r,
            "dra_cpu_exclusive_cpus",
            "CPUs held by prepared claims.",
            self.exclusive_cpus.clone(),
        );
        register(
            r,
            "dra_cpu_shared_pool_cpus",
            "Allocatable CPUs online and not held by any claim.",
            self.shared_cpus.clone(),
        );
        register(
            r,
            "dra_cpu_coordination_subscribers",
            "Open Watch streams on the coordination socket.",
            self.subscribers.clone(),
        );
        register(
            r,
            "dra_cpu_store_revision",
            "Revision of the assignment store.",
            self.revision.clone(),
        );
        let (revision, applied) = (self.revision.clone(), self.applied.clone());
        register(
            r,
            "dra_cpu_applied_revision_lag",
            "Revisions the furthest-behind subscriber has not applied yet.",
            Computed::gauge(move || lag(revision.load(Ordering::Relaxed), &applied)),
        );
        register(
            r,
            "dra_cpu_slice_publish_failures_total",
            "Failed ResourceSlice publishes, by stage and HTTP status code (0: no answer).",
            self.publish_failures.clone(),
        );
        register(
            r,
            "dra_cpu_grouped_mode_unsupported",
            "1 when the API server drops allowMultipleAllocations (DRAConsumableCapacity off).",
            self.grouped_mode_unsupported.clone(),
        );
        register(
            r,
            "dra_cpu_node_allocatable_mapping_published",
            "1 while the published devices carry the KEP-5517 node-allocatable mapping.",
            self.node_allocatable_mapping_published.clone(),
        );
        register(
            r,
            "dra_cpu_pcie_roots_published",
            "1 while the published devices carry resource.kubernetes.io/pcieRoot (--expose-pcie-roots, kept by the API server).",
            self.pcie_roots_published.clone(),
        );
        self.upstream.register(r);
    }

    /// Count a failed claim; `operation` is `prepare` or `unprepare`.
    pub fn error(&self, operation: &'static str, reason: &'static str) {
        self.errors
            .get_or_create(&[("operation", operation), ("reason", reason)])
            .inc();
    }

    pub fn errors(&self, operation: &'static str, reason: &'static str) -> u64 {
        self.errors
            .get(&[("operation", operation), ("reason", reason)])
            .map_or(0, |c| c.get())
    }

    /// Count a failed ResourceSlice publish.
    pub fn publish_failure(&self, stage: &'static str, code: u16) {
        self.publish_failures
            .get_or_create(&([("stage", stage)], [("code", code)]))
            .inc();
    }

    pub fn publish_failures(&self, stage: &'static str, code: u16) -> u64 {
        self.publish_failures
            .get(&([("stage", stage)], [("code", code)]))
            .map_or(0, |c| c.get())
    }

    pub fn applied(&self, subscriber: &str, revision: u64) {
        lock(&self.applied).insert(subscriber.to_string(), revision);
    }

    /// How far the furthest-behind subscriber is from the current revision.
    pub fn applied_lag(&self) -> u64 {
        lag(self.revision.load(Ordering::Relaxed), &self.applied)
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        exposition::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.prepare_latency.observe(Duration::from_micros(50));
        m.prepare_latency.observe(Duration::from_millis(3));
        m.prepare_latency.observe(Duration::from_secs(10));
        let out = m.render();
        let x = "dra_cpu_prepare_duration_seconds";
        assert!(
            out.contains(&format!("{x}_bucket{{le=\"0.0001\"}} 1\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("{x}_bucket{{le=\"0.005\"}} 2\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("{x}_bucket{{le=\"2.5\"}} 2\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("{x}_bucket{{le=\"+Inf\"}} 3\n")),
            "{out}"
        );
        assert!(out.contains(&format!("{x}_count 3\n")), "{out}");
    }

    /// Every family with at least one sample, as after a busy while.
    fn populated() -> Metrics {
        use dra_cpu_daemon::upstream_metrics::OpResult;
        let m = Metrics::new();
        m.prepares.fetch_add(1, Ordering::Relaxed);
        m.unprepares.fetch_add(1, Ordering::Relaxed);
        m.prepare_latency.observe(Duration::from_millis(2));
        m.unprepare_latency.observe(Duration::from_millis(1));
        m.error("prepare", "claim_not_found");
        m.error("unprepare", "store");
        m.publish_failure("apply", 500);
        m.applied("nri-plugin/a", 1);
        m.upstream
            .record_prepare(OpResult::Success, Duration::from_millis(2));
        m.upstream
            .record_unprepare(OpResult::Error, Duration::from_millis(1));
        m.upstream.record_claim_allocated_cpus(4);
        m
    }

    #[test]
    fn served_series_match_the_golden_file() {
        let text = populated().render();
        if let Err(problems) = dra_cpu_tests::metrics_golden::check("dra-plugin", &text) {
            panic!("{problems}");
        }
    }

    #[test]
    fn render_has_every_family_and_lag() {
        let m = Metrics::new();
        m.error("prepare", "claim_not_found");
        m.error("prepare", "claim_not_found");
        m.revision.store(10, Ordering::Relaxed);
        m.applied("nri-plugin/a", 7);
        m.applied("nri-plugin/b", 10);
        m.publish_failure("apply", 500);
        m.grouped_mode_unsupported.store(1, Ordering::Relaxed);
        assert_eq!(m.applied_lag(), 3);
        let out = m.render();
        for family in [
            "dra_cpu_prepares_total 0",
            "dra_cpu_claim_errors_total{operation=\"prepare\",reason=\"claim_not_found\"} 2",
            "dra_cpu_prepare_duration_seconds_count 0",
            "dra_cpu_unprepare_duration_seconds_count 0",
            "dra_cpu_exclusive_cpus 0",
            "dra_cpu_shared_pool_cpus 0",
            "dra_cpu_coordination_subscribers 0",
            "dra_cpu_store_revision 10",
            "dra_cpu_applied_revision_lag 3",
            "dra_cpu_slice_publish_failures_total{stage=\"apply\",code=\"500\"} 1",
            "dra_cpu_grouped_mode_unsupported 1",
            "dra_cpu_node_allocatable_mapping_published 0",
            "dra_cpu_pcie_roots_published 0",
        ] {
            assert!(out.contains(family), "missing {family}:\n{out}");
        }
    }
}
