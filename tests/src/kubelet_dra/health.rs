//! Device health: which stream a kubelet of a given release opens, and what
//! it holds of the reports.

use dra_cpu_proto::kubelet::{
    health_v1, health_v1alpha1, HEALTH_V1ALPHA1_VERSION, HEALTH_V1_VERSION,
};
use std::collections::BTreeMap;

use super::{KubeletDra, KubeletDraError, HEALTH_TIMEOUT};

/// The kubelet release whose health behaviour the stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletRelease {
    /// 1.34-1.36.0 with `ResourceHealthStatus` on: the v1alpha1 stream is
    /// opened for every plugin, whatever it advertises.
    V1_34,
    /// 1.37 (and 1.36.x with the backport of kubernetes #139477): the stream
    /// is opened only when advertised, v1 preferred (`pickHealthService`).
    V1_37,
}

/// The health API a kubelet opens a stream on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthApi {
    V1,
    V1alpha1,
}

impl KubeletRelease {
    /// Which health stream this kubelet opens for a plugin advertising
    /// `supported`, if any.
    pub fn health_api(self, supported: &[String]) -> Option<HealthApi> {
        let advertised = |v: &str| supported.iter().any(|s| s == v);
        match self {
            KubeletRelease::V1_34 => Some(HealthApi::V1alpha1),
            KubeletRelease::V1_37 if advertised(HEALTH_V1_VERSION) => Some(HealthApi::V1),
            KubeletRelease::V1_37 if advertised(HEALTH_V1ALPHA1_VERSION) => {
                Some(HealthApi::V1alpha1)
            }
            KubeletRelease::V1_37 => None,
        }
    }
}

/// A device's health as kubelet holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceHealthState {
    Healthy,
    Unhealthy {
        message: String,
    },
    /// Never reported, or not for [`HEALTH_TIMEOUT`].
    Unknown,
}

/// What one report said of a device, stamped on receipt as kubelet does.
#[derive(Debug, Clone)]
struct Received {
    healthy: bool,
    message: String,
    at: tokio::time::Instant,
}

type ReceivedMap = std::sync::Arc<std::sync::Mutex<BTreeMap<(String, String), Received>>>;

/// An open health stream, read in the background as kubelet reads it.
pub struct HealthWatch {
    pub api: HealthApi,
    received: ReceivedMap,
    reports: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    reader: tokio::task::JoinHandle<Result<(), tonic::Status>>,
}

/// Reads `$stream` of `$api` messages into `$received` until it ends.
macro_rules! read_health {
    ($api:ident, $stream:expr, $received:expr, $reports:expr) => {{
        let mut stream = $stream;
        let received: ReceivedMap = $received;
        let reports = $reports;
        tokio::spawn(async move {
            while let Some(message) = stream.message().await? {
                let at = tokio::time::Instant::now();
                let mut map = shared_state::sync::lock(&received);
                for device in message.devices {
                    let Some(id) = device.device else { continue };
                    map.insert(
                        (id.pool_name, id.device_name),
                        Received {
                            healthy: device.health == $api::HealthStatus::Healthy as i32,
                            message: device.message,
                            at,
                        },
                    );
                }
                reports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
    }};
}

impl HealthWatch {
    /// The state of `device` of `pool` now.
    pub fn state(&self, pool: &str, device: &str) -> DeviceHealthState {
        let map = shared_state::sync::lock(&self.received);
        match map.get(&(pool.to_string(), device.to_string())) {
            Some(r) if r.at.elapsed() <= HEALTH_TIMEOUT && r.healthy => DeviceHealthState::Healthy,
            Some(r) if r.at.elapsed() <= HEALTH_TIMEOUT => DeviceHealthState::Unhealthy {
                message: r.message.clone(),
            },
            _ => DeviceHealthState::Unknown,
        }
    }

    /// Every device reported so far, with its state now.
    pub fn states(&self) -> BTreeMap<(String, String), DeviceHealthState> {
        let keys: Vec<(String, String)> = shared_state::sync::lock(&self.received)
            .keys()
            .cloned()
            .collect();
        keys.into_iter()
            .map(|(pool, device)| {
                let state = self.state(&pool, &device);
                ((pool, device), state)
            })
            .collect()
    }

    /// Reports received so far.
    pub fn reports(&self) -> usize {
        self.reports.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the stream is still open.
    pub fn is_open(&self) -> bool {
        !self.reader.is_finished()
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl KubeletDra {
    /// Opens the health stream a kubelet of `release` opens for this plugin,
    /// or `None` when that kubelet opens none.
    pub async fn watch_health(
        &self,
        release: KubeletRelease,
    ) -> Result<Option<HealthWatch>, KubeletDraError> {
        let Some(api) = release.health_api(&self.info.supported_versions) else {
            return Ok(None);
        };
        let received = ReceivedMap::default();
        let reports = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let call_error = |status| KubeletDraError::Call {
            call: "NodeWatchResources",
            path: self.endpoint(),
            status,
        };
        let reader = match api {
            HealthApi::V1 => {
                let stream = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
                    self.channel.clone(),
                )
                .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                .await
                .map_err(call_error)?
                .into_inner();
                read_health!(health_v1, stream, received.clone(), reports.clone())
            }
            HealthApi::V1alpha1 => {
                let stream =
                    health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
                        self.channel.clone(),
                    )
                    .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
                    .await
                    .map_err(call_error)?
                    .into_inner();
                read_health!(health_v1alpha1, stream, received.clone(), reports.clone())
            }
        };
        Ok(Some(HealthWatch {
            api,
            received,
            reports,
            reader,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_cpu_proto::kubelet::DRA_V1_VERSION;

    #[test]
    fn health_stream_choice_follows_pick_health_service() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases = [
            (KubeletRelease::V1_37, list(&[DRA_V1_VERSION]), None),
            (
                KubeletRelease::V1_37,
                list(&[DRA_V1_VERSION, HEALTH_V1ALPHA1_VERSION]),
                Some(HealthApi::V1alpha1),
            ),
            (
                KubeletRelease::V1_37,
                list(&[HEALTH_V1ALPHA1_VERSION, HEALTH_V1_VERSION]),
                Some(HealthApi::V1),
            ),
            (
                KubeletRelease::V1_34,
                list(&[DRA_V1_VERSION]),
                Some(HealthApi::V1alpha1),
            ),
            (
                KubeletRelease::V1_34,
                list(&[HEALTH_V1_VERSION]),
                Some(HealthApi::V1alpha1),
            ),
        ];
        for (release, supported, want) in cases {
            assert_eq!(
                release.health_api(&supported),
                want,
                "{release:?} {supported:?}"
            );
        }
    }
}
