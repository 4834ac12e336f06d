//! Prometheus metrics of nri-plugin in the text exposition format, and the
//! small HTTP server for `/metrics`, `/healthz` and `/readyz`.
//!
//! A few labelled counters, gauges and one histogram per event type do not
//! justify a metrics framework; they live here as atomics and small maps.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_cpu_proto::http::{self, Method, Reply, StatusCode, PROMETHEUS_TEXT, TEXT};

/// Upper bounds (seconds) of the reply latency buckets: a reply is planned
/// in microseconds; a claim lookup may take up to half a second.
const LATENCY_BUCKETS: [f64; 14] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5,
    1.0,
];

#[derive(Debug, Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum_ns: u128,
}

impl Histogram {
    fn observe(&mut self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(self.buckets.iter_mut()) {
            if secs <= *bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum_ns += elapsed.as_nanos();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain numbers survive a panic elsewhere well enough to be read.
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Counts by one label value.
type LabelledCounter = Mutex<BTreeMap<&'static str, u64>>;

/// Every metric of the process.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (event, result) → count.
    events: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
    /// path (reply, unsolicited, synchronize) → container updates sent.
    updates: LabelledCounter,
    /// way (unsolicited, deferred) → pool changes after a coordination event.
    pool_changes: LabelledCounter,
    refused: LabelledCounter,
    /// result (ok, failed) → writes of a host cgroup's cpuset.cpus.
    host_cgroup_writes: LabelledCounter,
    pub applied_revision: AtomicU64,
    pub view_revision: AtomicU64,
    pub shared_cpus: AtomicU64,
    pub exclusive_cpus: AtomicU64,
    pub containers: AtomicU64,
    /// Containers left on a stale cpuset because the shared pool is empty.
    pub over_committed: AtomicU64,
    pub coordination_connected: AtomicBool,
    pub nri_registered: AtomicBool,
    /// The upstream Go driver's NRI callback series, exported as well.
    pub upstream: shared_state::upstream_metrics::NriMetrics,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn event(&self, event: &'static str, result: &'static str, elapsed: Duration) {
        *lock(&self.events).entry((event, result)).or_default() += 1;
        lock(&self.latency)
            .entry(event)
            .or_default()
            .observe(elapsed);
    }

    pub fn updates_sent(&self, path: &'static str, count: usize) {
        if count > 0 {
            *lock(&self.updates).entry(path).or_default() += count as u64;
        }
    }

    pub fn pool_change(&self, way: &'static str) {
        *lock(&self.pool_changes).entry(way).or_default() += 1;
    }

    pub fn refused(&self, reason: &'static str) {
        *lock(&self.refused).entry(reason).or_default() += 1;
    }

    pub fn host_cgroup_writes(&self, written: usize, failed: usize) {
        let mut map = lock(&self.host_cgroup_writes);
        for (result, n) in [("ok", written), ("failed", failed)] {
            if n > 0 {
                *map.entry(result).or_default() += n as u64;
            }
        }
    }

    pub fn host_cgroup_write_count(&self, result: &str) -> u64 {
        lock(&self.host_cgroup_writes)
            .get(result)
            .copied()
            .unwrap_or(0)
    }

    pub fn pool_change_count(&self, way: &str) -> u64 {
        lock(&self.pool_changes).get(way).copied().unwrap_or(0)
    }

    pub fn refused_count(&self, reason: &str) -> u64 {
        lock(&self.refused).get(reason).copied().unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP nri_plugin_events_total NRI events handled, by event and result."
        );
        let _ = writeln!(out, "# TYPE nri_plugin_events_total counter");
        for ((event, result), n) in lock(&self.events).iter() {
            let _ = writeln!(
                out,
                "nri_plugin_events_total{{event=\"{event}\",result=\"{result}\"}} {n}"
            );
        }
        let name = "nri_plugin_reply_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to build the reply to an NRI event, in the plugin."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (event, h) in lock(&self.latency).iter() {
            for (bound, n) in LATENCY_BUCKETS.iter().zip(&h.buckets) {
                let _ = writeln!(out, "{name}_bucket{{event=\"{event}\",le=\"{bound}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "{name}_bucket{{event=\"{event}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "{name}_sum{{event=\"{event}\"}} {}",
                h.sum_ns as f64 / 1e9
            );
            let _ = writeln!(out, "{name}_count{{event=\"{event}\"}} {}", h.count);
        }
        let labelled: [(&str, &str, &str, &LabelledCounter); 4] = [
            ("nri_plugin_container_updates_total", "Container cpuset updates sent, by path.", "path", &self.updates),
            ("nri_plugin_pool_changes_total", "Pool changes from claims, by how they reached containers (unsolicited now, or deferred to the next event reply).", "way", &self.pool_changes),
            ("nri_plugin_refused_containers_total", "Containers refused at creation, by reason.", "reason", &self.refused),
            ("nri_plugin_host_cgroup_writes_total", "Writes of a host cgroup's cpuset.cpus (--host-cgroups), by result (ok, failed).", "result", &self.host_cgroup_writes),
        ];
        for (name, help, label, map) in labelled {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (value, n) in lock(map).iter() {
                let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
            }
        }
        let gauges: [(&str, &str, u64); 8] = [
            (
                "nri_plugin_applied_revision",
                "Highest dra-plugin revision whose effects are on containers.",
                self.applied_revision.load(Ordering::Relaxed),
            ),
            (
                "nri_plugin_view_revision",
                "dra-plugin revision of the plugin's view.",
                self.view_revision.load(Ordering::Relaxed),
            ),
            (
                "nri_plugin_shared_pool_cpus",
                "CPUs in the shared pool.",
                self.shared_cpus.load(Ordering::Relaxed),
            ),
            (
                "nri_plugin_exclusive_cpus",
                "CPUs held by prepared claims.",
                self.exclusive_cpus.load(Ordering::Relaxed),
            ),
            (
                "nri_plugin_containers",
                "Containers in the plugin's view.",
                self.containers.load(Ordering::Relaxed),
            ),
            (
                "nri_plugin_over_committed_containers",
                "Containers kept on a stale cpuset because the shared pool is empty.",
                self.over_committed.load(Ordering::Relaxed),
            ),
            (
                "nri_plugin_coordination_connected",
                "1 while subscribed to dra-plugin.",
                u64::from(self.coordination_connected.load(Ordering::Relaxed)),
            ),
            (
                "nri_plugin_nri_registered",
                "1 while registered with the NRI runtime.",
                u64::from(self.nri_registered.load(Ordering::Relaxed)),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        }
        self.upstream.render(&mut out);
        out
    }
}

/// The answer to one request: status, content type, body.
pub fn respond(method: &Method, path: &str, metrics: &Metrics) -> Reply {
    if let Some(refused) = http::refuse_method(method) {
        return refused;
    }
    match path {
        "/metrics" => (StatusCode::OK, PROMETHEUS_TEXT, metrics.render()),
        "/healthz" => (StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if metrics.nri_registered.load(Ordering::Relaxed) => (
            StatusCode::OK,
            TEXT,
            "registered with the NRI runtime\n".into(),
        ),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not registered with the NRI runtime\n".into(),
        ),
        _ => http::not_found(),
    }
}

/// Bind `addr` and serve until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    http::serve(
        addr,
        move |method, path| respond(method, path, &metrics),
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let metrics = Metrics::new();
        let cases = [
            (Method::GET, "/healthz", StatusCode::OK),
            (Method::GET, "/readyz", StatusCode::SERVICE_UNAVAILABLE),
            (Method::GET, "/metrics", StatusCode::OK),
            (Method::GET, "/nope", StatusCode::NOT_FOUND),
            (Method::POST, "/metrics", StatusCode::METHOD_NOT_ALLOWED),
        ];
        for (method, path, want) in cases {
            assert_eq!(respond(&method, path, &metrics).0, want, "{method} {path}");
        }
        metrics.nri_registered.store(true, Ordering::Relaxed);
        assert_eq!(respond(&Method::GET, "/readyz", &metrics).0, StatusCode::OK);
    }

    /// Every family with at least one sample, as after a busy while.
    fn populated() -> Metrics {
        use shared_state::upstream_metrics::{CpuAllocationMode, NriCallback, OpResult};
        let m = Metrics::new();
        m.event("CreateContainer", "ok", Duration::from_micros(30));
        m.updates_sent("reply", 1);
        m.pool_change("deferred");
        m.refused("cpus-mismatch");
        m.host_cgroup_writes(1, 1);
        m.upstream
            .record_synchronize(OpResult::Success, Duration::from_micros(50));
        for callback in [
            NriCallback::CreateContainer,
            NriCallback::StopContainer,
            NriCallback::RemoveContainer,
        ] {
            m.upstream.record_container(
                callback,
                OpResult::Error,
                CpuAllocationMode::Unknown,
                Duration::from_micros(300),
            );
        }
        m
    }

    #[test]
    fn served_series_match_the_golden_file() {
        if let Err(problems) =
            dra_cpu_tests::metrics_golden::check("nri-plugin", &populated().render())
        {
            panic!("{problems}");
        }
    }

    #[test]
    fn render_counts_and_buckets() {
        let m = Metrics::new();
        m.event("CreateContainer", "ok", Duration::from_micros(30));
        m.event("CreateContainer", "refused", Duration::from_millis(2));
        m.refused("cpus-mismatch");
        m.updates_sent("reply", 3);
        m.updates_sent("reply", 0);
        m.pool_change("deferred");
        m.host_cgroup_writes(2, 1);
        m.host_cgroup_writes(1, 0);
        m.applied_revision.store(7, Ordering::Relaxed);
        let text = m.render();
        for line in [
            "nri_plugin_events_total{event=\"CreateContainer\",result=\"ok\"} 1",
            "nri_plugin_events_total{event=\"CreateContainer\",result=\"refused\"} 1",
            "nri_plugin_reply_latency_seconds_bucket{event=\"CreateContainer\",le=\"0.00005\"} 1",
            "nri_plugin_reply_latency_seconds_bucket{event=\"CreateContainer\",le=\"0.0025\"} 2",
            "nri_plugin_reply_latency_seconds_count{event=\"CreateContainer\"} 2",
            "nri_plugin_refused_containers_total{reason=\"cpus-mismatch\"} 1",
            "nri_plugin_container_updates_total{path=\"reply\"} 3",
            "nri_plugin_pool_changes_total{way=\"deferred\"} 1",
            "nri_plugin_applied_revision 7",
            "nri_plugin_host_cgroup_writes_total{result=\"ok\"} 3",
            "nri_plugin_host_cgroup_writes_total{result=\"failed\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_eq!(m.refused_count("cpus-mismatch"), 1);
    }
}
