//! The small HTTP server for Prometheus metrics, `/healthz` and `/readyz`.

use crate::metrics::Metrics;
use crate::run::Health;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// The answer to one request: status, content type, body.
pub fn respond(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    health: &Health,
) -> (StatusCode, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET and HEAD\n".into(),
        );
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
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        "/healthz" => (StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if health.ready() => (StatusCode::OK, TEXT, "ready\n".into()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not serving yet\n".into(),
        ),
        _ => (StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

/// Bind `addr` and serve until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %listener.local_addr().unwrap_or(addr), "metrics and health endpoints listening");
    Ok(tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else { continue };
            let metrics = metrics.clone();
            let health = health.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (status, content_type, body) =
                        respond(request.method(), request.uri().path(), &metrics, &health);
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    response.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static(content_type),
                    );
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                // A client hanging up early is its business.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
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
    }
}
