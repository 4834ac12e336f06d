//! The Prometheus text exposition (format 0.0.4) both processes serve on
//! `/metrics`, built on `prometheus-client`, with the series names,
//! help texts and declared-but-empty families a scraper saw before the
//! crate was used, so that dashboards and the README table stay right.
//!
//! `prometheus-client` has OpenMetrics habits this module undoes at
//! registration: it appends `_total` to a counter's name (so a counter is
//! registered without it), appends a `.` to every help text (so one is
//! taken off), and leaves out a labelled family before its first sample
//! (so [`Declared`] keeps it, as Prometheus' Go client does). The 0.0.4
//! encoder writes no `# EOF` and, with no unit registered, no `# UNIT`.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Metric;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Register `metric` so that it is served as `name` with `help`, both as
/// written here: a counter's `name` ends in `_total` like its samples.
pub fn register(registry: &mut Registry, name: &str, help: &str, metric: impl Metric) {
    let name = match metric.metric_type() {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    // The registry appends a full stop to every help text.
    let help = help.strip_suffix('.').unwrap_or(help);
    registry.register(name, help, metric);
}

/// The text exposition of every metric of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String does not fail; an error of an encoder would
    // leave a shorter text, which is still the best there is to serve.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// A metric that is declared (`# HELP`, `# TYPE`) even before its first
/// sample: a labelled family such as an error counter, which the README
/// documents and dashboards query from the start.
#[derive(Debug, Clone, Default)]
pub struct Declared<M>(pub M);

impl<M> Deref for Declared<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.0
    }
}

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.0.encode(encoder)
    }
    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
    fn is_empty(&self) -> bool {
        false
    }
}

/// A gauge its owner reads and writes as a plain `AtomicU64` (`store`,
/// `load`, `fetch_add`), served by the registry it is registered with.
#[derive(Debug, Clone, Default)]
pub struct AtomicGauge(Gauge<u64, AtomicU64>);

impl Deref for AtomicGauge {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        self.0.inner()
    }
}

impl EncodeMetric for AtomicGauge {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.0.encode(encoder)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// A counter its owner increments as a plain `AtomicU64`.
#[derive(Debug, Clone, Default)]
pub struct AtomicCounter(Counter<u64, AtomicU64>);

impl Deref for AtomicCounter {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        self.0.inner()
    }
}

impl EncodeMetric for AtomicCounter {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.0.encode(encoder)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A counter or gauge whose value is read at scrape time (a flag, a lag
/// computed from other numbers, a count kept by another module).
pub struct Computed<F> {
    kind: MetricType,
    read: F,
}

impl<F: Fn() -> u64> Computed<F> {
    pub fn gauge(read: F) -> Self {
        Computed {
            kind: MetricType::Gauge,
            read,
        }
    }

    pub fn counter(read: F) -> Self {
        Computed {
            kind: MetricType::Counter,
            read,
        }
    }
}

impl<F> fmt::Debug for Computed<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Computed")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl<F: Fn() -> u64> EncodeMetric for Computed<F> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let value = (self.read)();
        match self.kind {
            MetricType::Counter => encoder.encode_counter::<NoLabelSet, u64, u64>(&value, None),
            _ => encoder.encode_gauge(&value),
        }
    }
    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

/// A histogram of durations in seconds, with fixed bucket bounds, kept in
/// atomics: observing takes no lock, so it may sit on the prepare and
/// CreateContainer paths. prometheus-client's own histogram takes a mutex.
#[derive(Debug, Clone)]
pub struct DurationHistogram {
    bounds: &'static [f64],
    inner: Arc<HistogramCounts>,
}

#[derive(Debug)]
struct HistogramCounts {
    /// Observations in each bucket alone (not cumulative), by bound.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    /// Sum in nanoseconds.
    sum_ns: AtomicU64,
}

impl DurationHistogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        DurationHistogram {
            bounds,
            inner: Arc::new(HistogramCounts {
                buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
                count: AtomicU64::new(0),
                sum_ns: AtomicU64::new(0),
            }),
        }
    }

    pub fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let counts = &self.inner;
        // The count before the bucket, the encoder reads them the other
        // way round: a scrape racing an observation does not show more in
        // the buckets than in +Inf.
        counts.count.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = self.bounds.iter().position(|bound| secs <= *bound) {
            if let Some(bucket) = counts.buckets.get(i) {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        counts.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed)
    }
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let counts = &self.inner;
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(counts.buckets.iter())
            .map(|(bound, n)| (*bound, n.load(Ordering::Relaxed)))
            .collect();
        let count = counts.count.load(Ordering::Relaxed);
        let sum = counts.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::family::Family;

    #[test]
    fn names_and_help_are_served_as_registered() {
        let mut registry = Registry::default();
        let counter = AtomicCounter::default();
        let gauge = AtomicGauge::default();
        let errors: Declared<Family<[(&'static str, &'static str); 1], Counter>> =
            Declared::default();
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let read = flag.clone();
        register(&mut registry, "a_total", "Things done.", counter.clone());
        register(&mut registry, "b", "A level.", gauge.clone());
        register(
            &mut registry,
            "e_total",
            "Errors, by reason.",
            errors.clone(),
        );
        register(
            &mut registry,
            "f",
            "1 while up.",
            Computed::gauge(move || u64::from(read.load(Ordering::Relaxed))),
        );
        counter.fetch_add(2, Ordering::Relaxed);
        gauge.store(7, Ordering::Relaxed);
        assert_eq!(
            encode(&registry),
            "# HELP a_total Things done.\n# TYPE a_total counter\na_total 2\n\
             # HELP b A level.\n# TYPE b gauge\nb 7\n\
             # HELP e_total Errors, by reason.\n# TYPE e_total counter\n\
             # HELP f 1 while up.\n# TYPE f gauge\nf 1\n"
        );
        errors.get_or_create(&[("reason", "x")]).inc();
        flag.store(false, Ordering::Relaxed);
        let text = encode(&registry);
        assert!(text.contains("\ne_total{reason=\"x\"} 1\n"), "{text}");
        assert!(text.ends_with("\nf 0\n"), "{text}");
    }

    #[test]
    fn histogram_le_labels_are_written_as_go_writes_them() {
        let mut registry = Registry::default();
        let h = DurationHistogram::new(&[0.0001, 0.005, 1.0, 10.0]);
        register(&mut registry, "x_seconds", "Latency.", h.clone());
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(20));
        let text = encode(&registry);
        for line in [
            "x_seconds_bucket{le=\"0.0001\"} 1",
            "x_seconds_bucket{le=\"0.005\"} 2",
            "x_seconds_bucket{le=\"1\"} 2",
            "x_seconds_bucket{le=\"10\"} 2",
            "x_seconds_bucket{le=\"+Inf\"} 3",
            "x_seconds_count 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }
}
