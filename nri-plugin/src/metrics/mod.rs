//! Prometheus metrics of nri-plugin, each series registered once with a
//! `prometheus-client` registry under the name dashboards know; `http.rs`
//! serves them with `/healthz` and `/readyz`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::health::Health;
use dra_cpu_daemon::exposition::{
    self, register, AtomicGauge, Computed, Declared, DurationHistogram,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub mod upstream;

/// Upper bounds (seconds) of the reply latency buckets: a reply is planned
/// in microseconds; a claim lookup may take up to half a second.
const LATENCY_BUCKETS: [f64; 14] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5,
    1.0,
];

fn reply_histogram() -> DurationHistogram {
    DurationHistogram::new(&LATENCY_BUCKETS)
}

/// Label set of one label.
type Label = [(&'static str, &'static str); 1];
/// Counts by one label value, declared before the first count.
type LabelledCounter = Declared<Family<Label, Counter>>;
/// Reply latencies by event, declared before the first event.
type LatencyByEvent = Declared<Family<Label, DurationHistogram, fn() -> DurationHistogram>>;

/// Every metric of the process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// (event, result) → count.
    events: Declared<Family<[(&'static str, &'static str); 2], Counter>>,
    /// event → reply latency.
    latency: LatencyByEvent,
    /// path (reply, unsolicited, synchronize) → container updates sent.
    updates: LabelledCounter,
    /// way (unsolicited, deferred) → pool changes after a coordination event.
    pool_changes: LabelledCounter,
    refused: LabelledCounter,
    /// result (ok, failed) → writes of a host cgroup's cpuset.cpus.
    host_cgroup_writes: LabelledCounter,
    /// verdict (repaired, given_up) → containers whose cgroup was found
    /// holding another cpuset than the one applied.
    cpuset_drifts: LabelledCounter,
    pub applied_revision: AtomicGauge,
    pub view_revision: AtomicGauge,
    pub shared_cpus: AtomicGauge,
    pub exclusive_cpus: AtomicGauge,
    pub containers: AtomicGauge,
    /// Containers left on a stale cpuset because the shared pool is empty.
    pub over_committed: AtomicGauge,
    /// The connection flags the two connection gauges show.
    health: WatchedFlags,
    /// The upstream Go driver's NRI callback series, exported as well.
    pub upstream: upstream::NriMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn count(family: &LabelledCounter, label: &'static str, value: &'static str) -> u64 {
    family.get(&[(label, value)]).map_or(0, |c| c.get())
}

/// The flags of a [`Health`] the gauges read.
#[derive(Debug)]
struct WatchedFlags {
    coordination_connected: Arc<AtomicBool>,
    nri_registered: Arc<AtomicBool>,
}

impl Metrics {
    /// Series with the connection gauges of a [`Health`] of their own,
    /// which nothing sets (tests and benchmarks).
    pub fn new() -> Self {
        Self::watching(&Health::default())
    }

    /// Series whose connection gauges show `health`.
    pub fn watching(health: &Health) -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            events: Declared::default(),
            latency: Declared(Family::new_with_constructor(
                reply_histogram as fn() -> DurationHistogram,
            )),
            updates: Declared::default(),
            pool_changes: Declared::default(),
            refused: Declared::default(),
            host_cgroup_writes: Declared::default(),
            cpuset_drifts: Declared::default(),
            applied_revision: AtomicGauge::default(),
            view_revision: AtomicGauge::default(),
            shared_cpus: AtomicGauge::default(),
            exclusive_cpus: AtomicGauge::default(),
            containers: AtomicGauge::default(),
            over_committed: AtomicGauge::default(),
            health: WatchedFlags {
                coordination_connected: health.coordination_connected.clone(),
                nri_registered: health.nri_registered.clone(),
            },
            upstream: Default::default(),
        };
        m.register_all();
        m
    }

    /// Put every series in the registry, in the order they are served.
    fn register_all(&mut self) {
        let r = &mut self.registry;
        register(
            r,
            "nri_plugin_events_total",
            "NRI events handled, by event and result.",
            self.events.clone(),
        );
        register(
            r,
            "nri_plugin_reply_latency_seconds",
            "Time to build the reply to an NRI event, in the plugin.",
            self.latency.clone(),
        );
        for (name, help, family) in [
            ("nri_plugin_container_updates_total", "Container cpuset updates sent, by path.", &self.updates),
            ("nri_plugin_pool_changes_total", "Pool changes from claims, by how they reached containers (unsolicited now, or deferred to the next event reply).", &self.pool_changes),
            ("nri_plugin_refused_containers_total", "Containers refused at creation, by reason.", &self.refused),
            ("nri_plugin_host_cgroup_writes_total", "Writes of a host cgroup's cpuset.cpus (--host-cgroups), by result (ok, failed).", &self.host_cgroup_writes),
            ("nri_plugin_cpuset_drifts_total", "Containers whose cgroup was found holding another cpuset than the one applied, by verdict (repaired: sent again; given_up: its repairs did not hold).", &self.cpuset_drifts),
        ] {
            register(r, name, help, family.clone());
        }
        for (name, help, gauge) in [
            (
                "nri_plugin_applied_revision",
                "Highest dra-plugin revision whose effects are on containers.",
                &self.applied_revision,
            ),
            (
                "nri_plugin_view_revision",
                "dra-plugin revision of the plugin's view.",
                &self.view_revision,
            ),
            (
                "nri_plugin_shared_pool_cpus",
                "CPUs in the shared pool.",
                &self.shared_cpus,
            ),
            (
                "nri_plugin_exclusive_cpus",
                "CPUs held by prepared claims.",
                &self.exclusive_cpus,
            ),
            (
                "nri_plugin_containers",
                "Containers in the plugin's view.",
                &self.containers,
            ),
            (
                "nri_plugin_over_committed_containers",
                "Containers kept on a stale cpuset because the shared pool is empty.",
                &self.over_committed,
            ),
        ] {
            register(r, name, help, gauge.clone());
        }
        for (name, help, flag) in [
            (
                "nri_plugin_coordination_connected",
                "1 while subscribed to dra-plugin.",
                &self.health.coordination_connected,
            ),
            (
                "nri_plugin_nri_registered",
                "1 while registered with the NRI runtime.",
                &self.health.nri_registered,
            ),
        ] {
            let flag = flag.clone();
            register(
                r,
                name,
                help,
                Computed::gauge(move || u64::from(flag.load(Ordering::Relaxed))),
            );
        }
        self.upstream.register(r);
    }

    pub fn event(&self, event: &'static str, result: &'static str, elapsed: Duration) {
        self.events
            .get_or_create(&[("event", event), ("result", result)])
            .inc();
        self.latency
            .get_or_create(&[("event", event)])
            .observe(elapsed);
    }

    pub fn updates_sent(&self, path: &'static str, count: usize) {
        if count > 0 {
            self.updates
                .get_or_create(&[("path", path)])
                .inc_by(count as u64);
        }
    }

    pub fn pool_change(&self, way: &'static str) {
        self.pool_changes.get_or_create(&[("way", way)]).inc();
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&[("reason", reason)]).inc();
    }

    pub fn host_cgroup_writes(&self, written: usize, failed: usize) {
        for (result, n) in [("ok", written), ("failed", failed)] {
            if n > 0 {
                self.host_cgroup_writes
                    .get_or_create(&[("result", result)])
                    .inc_by(n as u64);
            }
        }
    }

    pub fn cpuset_drift(&self, verdict: &'static str) {
        self.cpuset_drifts
            .get_or_create(&[("verdict", verdict)])
            .inc();
    }

    pub fn cpuset_drift_count(&self, verdict: &'static str) -> u64 {
        count(&self.cpuset_drifts, "verdict", verdict)
    }

    pub fn host_cgroup_write_count(&self, result: &'static str) -> u64 {
        count(&self.host_cgroup_writes, "result", result)
    }

    pub fn pool_change_count(&self, way: &'static str) -> u64 {
        count(&self.pool_changes, "way", way)
    }

    pub fn refused_count(&self, reason: &'static str) -> u64 {
        count(&self.refused, "reason", reason)
    }

    pub fn render(&self) -> String {
        exposition::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family with at least one sample, as after a busy while.
    fn populated() -> Metrics {
        use super::upstream::{CpuAllocationMode, NriCallback};
        use dra_cpu_daemon::upstream_metrics::OpResult;
        let m = Metrics::new();
        m.event("CreateContainer", "ok", Duration::from_micros(30));
        m.updates_sent("reply", 1);
        m.pool_change("deferred");
        m.refused("cpus-mismatch");
        m.host_cgroup_writes(1, 1);
        m.cpuset_drift("repaired");
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
            // Bounds below 1e-4 are written as Go's client writes them.
            "nri_plugin_reply_latency_seconds_bucket{event=\"CreateContainer\",le=\"5e-05\"} 1",
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
