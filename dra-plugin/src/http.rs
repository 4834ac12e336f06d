//! What dra-plugin answers on `/metrics`, `/healthz` and `/readyz`; the
//! routes and the server are `dra_cpu_daemon::http`'s.

use crate::health::Health;
use crate::metrics::Metrics;
use ::http::StatusCode;
use dra_cpu_daemon::http::{self, Endpoints, Reply, TEXT};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// dra-plugin's endpoints: its metrics and its health.
pub struct DraEndpoints {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

impl DraEndpoints {
    /// A store that failed a write may stay broken until the process
    /// restarts: unhealthy, so that the liveness probe restarts it.
    fn store_failure(&self) -> Option<Reply> {
        self.health.store.error().map(|error| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("store write failed: {error}\n"),
            )
        })
    }
}

impl Endpoints for DraEndpoints {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn health(&self) -> Reply {
        self.store_failure()
            .unwrap_or_else(|| (StatusCode::OK, TEXT, "ok\n".into()))
    }

    fn readiness(&self) -> Reply {
        self.store_failure()
            .unwrap_or_else(|| match self.health.unready_reason() {
                None => (StatusCode::OK, TEXT, "ready\n".into()),
                Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{reason}\n")),
            })
    }
}

/// Bind `addr` and serve until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let endpoints = Arc::new(DraEndpoints { metrics, health });
    http::serve(addr, http::router(endpoints), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn answers() {
        let endpoints = DraEndpoints {
            metrics: Arc::new(Metrics::new()),
            health: Arc::new(Health::default()),
        };
        assert_eq!(endpoints.health().0, StatusCode::OK);
        assert_eq!(endpoints.readiness().0, StatusCode::SERVICE_UNAVAILABLE);
        endpoints.health.serving.store(true, Ordering::Relaxed);
        assert_eq!(endpoints.readiness().0, StatusCode::OK);
        assert!(endpoints.metrics().contains("dra_cpu_prepares_total"));
        endpoints
            .health
            .publishing
            .set_failure(Some("applying ResourceSlice x: refused".into()));
        let (code, _, body) = endpoints.readiness();
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "applying ResourceSlice x: refused\n");
        assert_eq!(
            endpoints.health().0,
            StatusCode::OK,
            "a publishing problem is not a reason to restart"
        );
    }
}
