//! The small HTTP server for Prometheus metrics, `/healthz` and `/readyz`.

use crate::metrics::Metrics;
use crate::run::Health;
use dra_cpu_proto::http::{self, Method, Reply, StatusCode, PROMETHEUS_TEXT, TEXT};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// The answer to one request: status, content type, body.
pub fn respond(method: &Method, path: &str, metrics: &Metrics, health: &Health) -> Reply {
    if let Some(refused) = http::refuse_method(method) {
        return refused;
    }
    // A store that failed a write may stay broken until the process
    // restarts: unhealthy, so that the liveness probe restarts it.
    if let (Some(error), "/healthz" | "/readyz") = (health.store.error(), path) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!("store write failed: {error}\n"),
        );
    }
    match path {
        "/metrics" => (StatusCode::OK, PROMETHEUS_TEXT, metrics.render()),
        "/healthz" => (StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match health.unready_reason() {
            None => (StatusCode::OK, TEXT, "ready\n".into()),
            Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{reason}\n")),
        },
        _ => http::not_found(),
    }
}

/// Bind `addr` and serve until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    http::serve(
        addr,
        move |method, path| respond(method, path, &metrics, &health),
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn routes() {
        let metrics = Metrics::new();
        let health = Health::default();
        let cases = [
            (Method::GET, "/healthz", StatusCode::OK),
            (Method::GET, "/readyz", StatusCode::SERVICE_UNAVAILABLE),
            (Method::GET, "/metrics", StatusCode::OK),
            (Method::GET, "/nope", StatusCode::NOT_FOUND),
            (Method::POST, "/metrics", StatusCode::METHOD_NOT_ALLOWED),
        ];
        for (method, path, want) in cases {
            assert_eq!(
                respond(&method, path, &metrics, &health).0,
                want,
                "{method} {path}"
            );
        }
        health.serving.store(true, Ordering::Relaxed);
        assert_eq!(
            respond(&Method::GET, "/readyz", &metrics, &health).0,
            StatusCode::OK
        );
        let (_, _, body) = respond(&Method::GET, "/metrics", &metrics, &health);
        assert!(body.contains("dra_cpu_prepares_total"));
        health
            .publishing
            .set_failure(Some("applying ResourceSlice x: refused".into()));
        let (code, _, body) = respond(&Method::GET, "/readyz", &metrics, &health);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "applying ResourceSlice x: refused\n");
        assert_eq!(
            respond(&Method::GET, "/healthz", &metrics, &health).0,
            StatusCode::OK,
            "a publishing problem is not a reason to restart"
        );
    }
}
