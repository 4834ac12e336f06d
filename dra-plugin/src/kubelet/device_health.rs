//! Device health for kubelet: the `DRAResourceHealth` stream in both API
//! versions kubelets call (`v1`, preferred from 1.37; `v1alpha1`, called by
//! 1.34-1.36 kubelets).
//!
//! A CPU device is healthy while every CPU it was published with is online.
//! Taking a CPU offline (sysfs `cpu/online`) turns its device Unhealthy with
//! a message naming the offline CPUs; bringing it back turns it Healthy.
//!
//! Kubelet stamps each report on receipt and marks a device Unknown when no
//! report named it for 30 s (`pkg/kubelet/cm/dra/healthinfo.go`,
//! `healthTimeout`), so the full report is sent again every
//! [`HealthTiming::report_every`] even when nothing changed, as upstream's Go
//! driver does every 10 s. A change is sent at the next poll of the online
//! list, without waiting for the period.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use dra_cpu_proto::kubelet::{health_v1, health_v1alpha1};
use shared_state::topology::discover::read_online_cpus;
use shared_state::CpuSet;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// How often the report goes out and how often the online list is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthTiming {
    /// A full report at least this often: a third of kubelet's 30 s
    /// timeout, so two lost reports still leave a device known.
    pub report_every: Duration,
    /// The online list is read this often; a change is reported at once.
    pub poll_every: Duration,
}

impl Default for HealthTiming {
    fn default() -> Self {
        HealthTiming {
            report_every: Duration::from_secs(10),
            poll_every: Duration::from_secs(1),
        }
    }
}

/// `DeviceHealth.health_check_timeout_seconds`: kubelet's own default (30 s),
/// stated so that a kubelet with another default still waits three periods.
pub const HEALTH_CHECK_TIMEOUT_SECONDS: i64 = 30;

/// Kubelet truncates longer messages (`v1.DeviceHealth.message`).
const MAX_MESSAGE_CHARS: usize = 1024;

/// The health of one published device, as decided from the online CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    pub device: String,
    pub healthy: bool,
    /// Why the device is unhealthy; empty when healthy.
    pub message: String,
}

/// Each device's health: healthy while all its CPUs are online.
pub fn assess<'a>(
    devices: impl IntoIterator<Item = (&'a str, &'a CpuSet)>,
    online: &CpuSet,
) -> Vec<DeviceHealth> {
    devices
        .into_iter()
        .map(|(device, cpus)| {
            let offline = cpus.difference(online);
            let message = if offline.is_empty() {
                String::new()
            } else {
                let mut message = format!("CPUs {offline} of this device are offline");
                message.truncate(MAX_MESSAGE_CHARS);
                message
            };
            DeviceHealth {
                device: device.to_string(),
                healthy: offline.is_empty(),
                message,
            }
        })
        .collect()
}

/// One report of the stream: every device's health and when it was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    pub devices: Vec<DeviceHealth>,
    /// Unix seconds.
    pub decided_at: i64,
}

/// The node's published devices and where to read which CPUs are online;
/// cheap to clone, each watch stream holding one.
#[derive(Clone)]
pub struct Health(std::sync::Arc<HealthSource>);

struct HealthSource {
    pool: String,
    devices: Vec<(String, CpuSet)>,
    sysfs_root: PathBuf,
    timing: HealthTiming,
    stopping: CancellationToken,
    /// The last read of the online list failed (logged once per failure run).
    online_unreadable: std::sync::atomic::AtomicBool,
}

impl Health {
    /// `stopping` cancelled ends the streams, so shutdown does not wait
    /// for kubelet to hang up.
    pub fn new(
        pool: String,
        devices: Vec<(String, CpuSet)>,
        sysfs_root: PathBuf,
        timing: HealthTiming,
        stopping: CancellationToken,
    ) -> Health {
        Health(std::sync::Arc::new(HealthSource {
            pool,
            devices,
            sysfs_root,
            timing,
            stopping,
            online_unreadable: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The devices' health now. When the online list cannot be read, every
    /// CPU is taken as online (the one the node started with): an unreadable
    /// sysfs says nothing about the CPUs, and is logged.
    fn assess_now(&self) -> Vec<DeviceHealth> {
        let source = &self.0;
        let online = match read_online_cpus(&source.sysfs_root) {
            Ok(online) => {
                source
                    .online_unreadable
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                online
            }
            Err(e) => {
                if !source
                    .online_unreadable
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(error = %e, "cannot read the online CPUs; reporting every device healthy until it can be read");
                }
                source
                    .devices
                    .iter()
                    .fold(CpuSet::new(), |all, (_, cpus)| all.union(cpus))
            }
        };
        assess(source.devices.iter().map(|(d, c)| (d.as_str(), c)), &online)
    }

    /// Reports: one at once, then one whenever the health changes (checked
    /// every `poll_every`) or `report_every` passed since the last, until
    /// the daemon stops.
    fn reports(&self) -> ReportStream<HealthReport> {
        struct Cursor {
            health: Health,
            last: Option<(Vec<DeviceHealth>, tokio::time::Instant)>,
        }
        let cursor = Cursor {
            health: self.clone(),
            last: None,
        };
        let stream = futures::stream::unfold(cursor, |mut cursor| async move {
            loop {
                if let Some((_, sent_at)) = &cursor.last {
                    let next_poll = tokio::time::Instant::now() + cursor.health.0.timing.poll_every;
                    tokio::time::sleep_until(
                        next_poll.min(*sent_at + cursor.health.0.timing.report_every),
                    )
                    .await;
                }
                let devices = cursor.health.assess_now();
                let now = tokio::time::Instant::now();
                let due = match &cursor.last {
                    None => true,
                    Some((previous, sent_at)) => {
                        *previous != devices
                            || now >= *sent_at + cursor.health.0.timing.report_every
                    }
                };
                if due {
                    cursor.last = Some((devices.clone(), now));
                    let report = HealthReport {
                        devices,
                        decided_at: unix_now(),
                    };
                    return Some((Ok(report), cursor));
                }
            }
        });
        Box::pin(futures::StreamExt::take_until(
            stream,
            self.0.stopping.clone().cancelled_owned(),
        ))
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

type ReportStream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// `DRAResourceHealth` of one API version over [`Health`]'s reports; the
/// versions carry the same messages under different module paths.
macro_rules! health_service {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_resource_health_server::DraResourceHealth for Health {
            type NodeWatchResourcesStream = ReportStream<$api::NodeWatchResourcesResponse>;

            #[tracing::instrument(name = "NodeWatchResources", skip_all, fields(api = stringify!($api)))]
            async fn node_watch_resources(
                &self,
                _request: Request<$api::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let pool = self.0.pool.clone();
                let stream = futures::StreamExt::map(self.reports(), move |report| {
                    report.map(|report| $api::NodeWatchResourcesResponse {
                        devices: report
                            .devices
                            .into_iter()
                            .map(|d| $api::DeviceHealth {
                                device: Some($api::DeviceIdentifier {
                                    pool_name: pool.clone(),
                                    device_name: d.device,
                                }),
                                health: if d.healthy {
                                    $api::HealthStatus::Healthy as i32
                                } else {
                                    $api::HealthStatus::Unhealthy as i32
                                },
                                last_updated_time: report.decided_at,
                                health_check_timeout_seconds: HEALTH_CHECK_TIMEOUT_SECONDS,
                                message: d.message,
                            })
                            .collect(),
                    })
                });
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

health_service!(health_v1);
health_service!(health_v1alpha1);

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_cpulist(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn a_device_is_unhealthy_exactly_when_one_of_its_cpus_is_offline() {
        struct Case {
            name: &'static str,
            online: &'static str,
            want: &'static [(&'static str, bool, &'static str)],
        }
        let devices = [
            ("numa0", set("0-3")),
            ("numa1", set("4-7")),
            ("cpu8", set("8")),
        ];
        let cases = [
            Case {
                name: "all online",
                online: "0-8",
                want: &[("numa0", true, ""), ("numa1", true, ""), ("cpu8", true, "")],
            },
            Case {
                name: "one CPU of a group offline",
                online: "0-4,6-8",
                want: &[
                    ("numa0", true, ""),
                    ("numa1", false, "CPUs 5 of this device are offline"),
                    ("cpu8", true, ""),
                ],
            },
            Case {
                name: "an individual device offline, more online than published",
                online: "0-7,9-15",
                want: &[
                    ("numa0", true, ""),
                    ("numa1", true, ""),
                    ("cpu8", false, "CPUs 8 of this device are offline"),
                ],
            },
            Case {
                name: "nothing online",
                online: "",
                want: &[
                    ("numa0", false, "CPUs 0-3 of this device are offline"),
                    ("numa1", false, "CPUs 4-7 of this device are offline"),
                    ("cpu8", false, "CPUs 8 of this device are offline"),
                ],
            },
        ];
        for case in cases {
            let got = assess(devices.iter().map(|(d, c)| (*d, c)), &set(case.online));
            let want: Vec<DeviceHealth> = case
                .want
                .iter()
                .map(|(device, healthy, message)| DeviceHealth {
                    device: device.to_string(),
                    healthy: *healthy,
                    message: message.to_string(),
                })
                .collect();
            assert_eq!(got, want, "{}", case.name);
        }
    }

    struct Sysfs {
        root: tempfile::TempDir,
    }

    impl Sysfs {
        fn new(online: &str) -> Sysfs {
            let root = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir_all(root.path().join("sys/devices/system/cpu")).expect("mkdir");
            let sysfs = Sysfs { root };
            sysfs.set_online(online);
            sysfs
        }

        fn set_online(&self, online: &str) {
            std::fs::write(
                self.root.path().join("sys/devices/system/cpu/online"),
                format!("{online}\n"),
            )
            .expect("write online");
        }
    }

    fn health(sysfs: &Sysfs, timing: HealthTiming) -> (Health, CancellationToken) {
        let stop = CancellationToken::new();
        let health = Health::new(
            "node-a".into(),
            vec![("numa0".into(), set("0-1")), ("numa1".into(), set("2-3"))],
            sysfs.root.path().to_path_buf(),
            timing,
            stop.clone(),
        );
        (health, stop)
    }

    fn healthy(report: &HealthReport) -> Vec<bool> {
        report.devices.iter().map(|d| d.healthy).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_report_is_repeated_every_period_and_a_change_goes_out_at_the_next_poll() {
        let sysfs = Sysfs::new("0-3");
        let timing = HealthTiming {
            report_every: Duration::from_secs(10),
            poll_every: Duration::from_secs(1),
        };
        let (health, stop) = health(&sysfs, timing);
        let mut reports = health.reports();
        let start = tokio::time::Instant::now();

        let first = reports.next().await.expect("first report").expect("ok");
        assert_eq!(healthy(&first), [true, true]);
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the first report goes at once"
        );

        // Nothing changes: the same report again after one period.
        let second = reports.next().await.expect("second").expect("ok");
        assert_eq!(healthy(&second), [true, true]);
        assert_eq!(start.elapsed(), Duration::from_secs(10));

        // CPU 3 goes offline: reported at the next poll, not the next period.
        sysfs.set_online("0-2");
        let changed = reports.next().await.expect("change").expect("ok");
        assert_eq!(healthy(&changed), [true, false]);
        assert_eq!(
            changed.devices[1].message,
            "CPUs 3 of this device are offline"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(11));

        // Back online: Healthy at the next poll.
        sysfs.set_online("0-3");
        let back = reports.next().await.expect("back").expect("ok");
        assert_eq!(healthy(&back), [true, true]);
        assert_eq!(start.elapsed(), Duration::from_secs(12));

        // Then the period runs from the last report again.
        let repeated = reports.next().await.expect("repeated").expect("ok");
        assert_eq!(healthy(&repeated), [true, true]);
        assert_eq!(start.elapsed(), Duration::from_secs(22));

        // Stopping ends the stream.
        stop.cancel();
        assert!(
            reports.next().await.is_none(),
            "the stream ends at shutdown"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreadable_online_list_keeps_the_devices_healthy_and_reporting() {
        let sysfs = Sysfs::new("0-3");
        let (health, _stop) = health(&sysfs, HealthTiming::default());
        let mut reports = health.reports();
        reports.next().await.expect("first").expect("ok");
        std::fs::remove_file(sysfs.root.path().join("sys/devices/system/cpu/online"))
            .expect("remove online");
        let next = reports.next().await.expect("next").expect("ok");
        assert_eq!(healthy(&next), [true, true]);
    }
}
