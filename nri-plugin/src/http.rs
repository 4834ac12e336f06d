//! What nri-plugin answers on `/metrics`, `/healthz` and `/readyz`; the
//! routes and the server are `dra_cpu_proto::http`'s.

use crate::metrics::Metrics;
use ::http::StatusCode;
use dra_cpu_proto::http::{self, Endpoints, Reply, TEXT};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Endpoints for Metrics {
    fn metrics(&self) -> String {
        self.render()
    }

    fn health(&self) -> Reply {
        (StatusCode::OK, TEXT, "ok\n".into())
    }

    fn readiness(&self) -> Reply {
        if self.nri_registered.load(Ordering::Relaxed) {
            (
                StatusCode::OK,
                TEXT,
                "registered with the NRI runtime\n".into(),
            )
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                "not registered with the NRI runtime\n".into(),
            )
        }
    }
}

/// Bind `addr` and serve until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    http::serve(addr, http::router(metrics), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        let metrics = Metrics::new();
        assert_eq!(metrics.health().0, StatusCode::OK);
        assert_eq!(metrics.readiness().0, StatusCode::SERVICE_UNAVAILABLE);
        assert!(Endpoints::metrics(&metrics).contains("nri_plugin_nri_registered 0"));
        metrics.nri_registered.store(true, Ordering::Relaxed);
        assert_eq!(metrics.readiness().0, StatusCode::OK);
    }
}
