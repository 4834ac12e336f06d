//! Prometheus metrics of dra-plugin, rendered in the text exposition format.
//!
//! A handful of counters, gauges and two latency histograms do not justify
//! a metrics framework; they live here as atomics and small maps.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histogram buckets: a prepare is a
/// few fsyncs, so the interesting range is 100 µs to a few seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    /// Sum in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Every metric of the process.
#[derive(Debug, Default)]
pub struct Metrics {
    pub prepares: AtomicU64,
    pub unprepares: AtomicU64,
    pub prepare_latency: Histogram,
    pub unprepare_latency: Histogram,
    /// Failed claims by [`crate::prepare::PrepareError::reason`].
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    pub exclusive_cpus: AtomicU64,
    pub shared_cpus: AtomicU64,
    pub subscribers: AtomicU64,
    pub revision: AtomicU64,
    /// Last revision each subscriber reported as applied.
    applied: Mutex<BTreeMap<String, u64>>,
    /// Failed ResourceSlice publishes by stage (`apply`, `list`, ...) and
    /// HTTP status code (0: no answer from the server).
    publish_failures: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// 1 when the API server drops `allowMultipleAllocations`
    /// (`DRAConsumableCapacity` off): grouped devices cannot be shared there.
    pub grouped_mode_unsupported: AtomicU64,
    /// 1 while the published devices carry the KEP-5517 mapping.
    pub node_allocatable_mapping_published: AtomicU64,
    /// 1 while the published devices carry `resource.kubernetes.io/pcieRoot`.
    pub pcie_roots_published: AtomicU64,
    /// The upstream Go driver's series, exported as well.
    pub upstream: shared_state::upstream_metrics::DriverMetrics,
    /// Claim device-status writes (KEP-4817), done and failed.
    pub claim_status: std::sync::Arc<crate::claim_status::StatusWriteStats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding a metrics lock leaves plain numbers
    // behind, still fine to read.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Count a failed claim; `operation` is `prepare` or `unprepare`.
    pub fn error(&self, operation: &'static str, reason: &'static str) {
        *lock(&self.errors).entry((operation, reason)).or_default() += 1;
    }

    pub fn errors(&self, operation: &'static str, reason: &'static str) -> u64 {
        lock(&self.errors)
            .get(&(operation, reason))
            .copied()
            .unwrap_or(0)
    }

    /// Count a failed ResourceSlice publish.
    pub fn publish_failure(&self, stage: &'static str, code: u16) {
        *lock(&self.publish_failures)
            .entry((stage, code))
            .or_default() += 1;
    }

    pub fn publish_failures(&self, stage: &'static str, code: u16) -> u64 {
        lock(&self.publish_failures)
            .get(&(stage, code))
            .copied()
            .unwrap_or(0)
    }

    pub fn applied(&self, subscriber: &str, revision: u64) {
        lock(&self.applied).insert(subscriber.to_string(), revision);
    }

    /// How far the furthest-behind subscriber is from the current revision.
    pub fn applied_lag(&self) -> u64 {
        let current = self.revision.load(Ordering::Relaxed);
        lock(&self.applied)
            .values()
            .map(|applied| current.saturating_sub(*applied))
            .max()
            .unwrap_or(0)
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        counter(
            &mut out,
            "dra_cpu_prepares_total",
            "Claims prepared (including idempotent repeats).",
            self.prepares.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "dra_cpu_unprepares_total",
            "Claims unprepared (including unknown claims).",
            self.unprepares.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP dra_cpu_claim_errors_total Claims that failed, by operation and reason.\n# TYPE dra_cpu_claim_errors_total counter"
        );
        for ((operation, reason), value) in lock(&self.errors).iter() {
            let _ = writeln!(
                out,
                "dra_cpu_claim_errors_total{{operation=\"{operation}\",reason=\"{reason}\"}} {value}"
            );
        }
        self.prepare_latency.render(
            "dra_cpu_prepare_duration_seconds",
            "Time to prepare one claim, store fsync and CDI write included.",
            &mut out,
        );
        self.unprepare_latency.render(
            "dra_cpu_unprepare_duration_seconds",
            "Time to unprepare one claim, store fsync included.",
            &mut out,
        );
        counter(
            &mut out,
            "dra_cpu_claim_status_writes_total",
            "Claim device statuses written (after prepare and unprepare).",
            self.claim_status.written.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "dra_cpu_claim_status_write_failures_total",
            "Claim device-status writes that failed; the prepares themselves succeeded.",
            self.claim_status.failed.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_exclusive_cpus",
            "CPUs held by prepared claims.",
            self.exclusive_cpus.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_shared_pool_cpus",
            "Allocatable CPUs not held by any claim.",
            self.shared_cpus.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_coordination_subscribers",
            "Open Watch streams on the coordination socket.",
            self.subscribers.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_store_revision",
            "Revision of the assignment store.",
            self.revision.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_applied_revision_lag",
            "Revisions the furthest-behind subscriber has not applied yet.",
            self.applied_lag(),
        );
        let _ = writeln!(
            out,
            "# HELP dra_cpu_slice_publish_failures_total Failed ResourceSlice publishes, by stage and HTTP status code (0: no answer).\n# TYPE dra_cpu_slice_publish_failures_total counter"
        );
        for ((stage, code), value) in lock(&self.publish_failures).iter() {
            let _ = writeln!(
                out,
                "dra_cpu_slice_publish_failures_total{{stage=\"{stage}\",code=\"{code}\"}} {value}"
            );
        }
        gauge(
            &mut out,
            "dra_cpu_grouped_mode_unsupported",
            "1 when the API server drops allowMultipleAllocations (DRAConsumableCapacity off).",
            self.grouped_mode_unsupported.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_node_allocatable_mapping_published",
            "1 while the published devices carry the KEP-5517 node-allocatable mapping.",
            self.node_allocatable_mapping_published
                .load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "dra_cpu_pcie_roots_published",
            "1 while the published devices carry resource.kubernetes.io/pcieRoot (--expose-pcie-roots, kept by the API server).",
            self.pcie_roots_published.load(Ordering::Relaxed),
        );
        self.upstream.render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let mut out = String::new();
        h.render("x", "help", &mut out);
        assert!(out.contains("x_bucket{le=\"0.0001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"2.5\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
    }

    /// Every family with at least one sample, as after a busy while.
    fn populated() -> Metrics {
        use shared_state::upstream_metrics::OpResult;
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
