//! What nri-plugin answers on `/metrics`, `/healthz` and `/readyz`; the
//! routes and the server are `dra_cpu_daemon::http`'s.

use crate::health::Health;
use crate::metrics::Metrics;
use ::http::StatusCode;
use dra_cpu_daemon::http::{self, Endpoints, Reply, TEXT};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// What the endpoints answer from.
pub struct NriEndpoints {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

impl Endpoints for NriEndpoints {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn health(&self) -> Reply {
        (StatusCode::OK, TEXT, "ok\n".into())
    }

    fn readiness(&self) -> Reply {
        match self.health.unready_reason() {
            None => (
                StatusCode::OK,
                TEXT,
                "registered with the NRI runtime\n".into(),
            ),
            Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{reason}\n")),
        }
    }
}

/// Bind `addr` and serve until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    endpoints: NriEndpoints,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    http::serve(addr, http::router(Arc::new(endpoints)), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        let health = Arc::new(Health::default());
        let endpoints = NriEndpoints {
            metrics: Arc::new(Metrics::watching(&health)),
            health: health.clone(),
        };
        assert_eq!(endpoints.health().0, StatusCode::OK);
        let (status, _, body) = endpoints.readiness();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not registered with the NRI runtime\n");
        assert!(Endpoints::metrics(&endpoints).contains("nri_plugin_nri_registered 0"));
        health.set_nri_registered(true);
        assert_eq!(endpoints.readiness().0, StatusCode::OK);
        assert!(Endpoints::metrics(&endpoints).contains("nri_plugin_nri_registered 1"));
    }
}
