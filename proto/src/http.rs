//! The plain HTTP/1 endpoints each process serves beside its real protocols:
//! Prometheus `/metrics` and the kubelet probes `/healthz` and `/readyz`.
//!
//! Routing is the caller's: a plain function from method and path to a
//! [`Reply`], testable without a socket. This module is the socket side,
//! the same for both processes.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use hyper::{Method, StatusCode};

/// Content type of the probes' and errors' answers.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// Content type of the Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The answer to one request: status, content type, body.
pub type Reply = (StatusCode, &'static str, String);

/// The answer to a method other than GET and HEAD, which every endpoint
/// refuses; `None` for those two.
pub fn refuse_method(method: &Method) -> Option<Reply> {
    (method != Method::GET && method != Method::HEAD).then(|| {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET and HEAD\n".to_string(),
        )
    })
}

/// The answer to a path no endpoint serves.
pub fn not_found() -> Reply {
    (StatusCode::NOT_FOUND, TEXT, "not found\n".to_string())
}

/// Bind `addr` and answer every request with `respond` until `shutdown`
/// completes. Binding errors are returned; errors of one connection (a
/// client hanging up early) end that connection only.
pub async fn serve<F>(
    addr: SocketAddr,
    respond: F,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>>
where
    F: Fn(&Method, &str) -> Reply + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        address = %listener.local_addr().unwrap_or(addr),
        "metrics and health endpoints listening"
    );
    let respond = Arc::new(respond);
    Ok(tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else { continue };
            let respond = respond.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (status, content_type, body) =
                        respond(request.method(), request.uri().path());
                    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn only_get_and_head_are_served() {
        assert_eq!(refuse_method(&Method::GET), None);
        assert_eq!(refuse_method(&Method::HEAD), None);
        for method in [Method::POST, Method::PUT, Method::DELETE] {
            let refused = refuse_method(&method).map(|r| r.0);
            assert_eq!(refused, Some(StatusCode::METHOD_NOT_ALLOWED), "{method}");
        }
    }

    /// One raw HTTP/1.0 exchange over a real socket.
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn serves_the_routed_reply_and_survives_garbage_until_shutdown() {
        // Bind an ephemeral port, learn it, and serve on it.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve(
            addr,
            |method, path| match (refuse_method(method), path) {
                (Some(refused), _) => refused,
                (None, "/healthz") => (StatusCode::OK, TEXT, "ok\n".to_string()),
                (None, _) => not_found(),
            },
            async move {
                let _ = stopped.await;
            },
        )
        .await
        .unwrap();

        let ok = exchange(addr, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; charset=utf-8"),
            "{ok}"
        );
        assert!(ok.ends_with("\r\n\r\nok\n"), "{ok}");
        let missing = exchange(addr, "GET /nope HTTP/1.0\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        let refused = exchange(addr, "POST /healthz HTTP/1.0\r\n\r\n").await;
        assert!(refused.starts_with("HTTP/1.0 405"), "{refused}");
        // Garbage ends that connection only.
        let garbage = exchange(addr, "\x00\x01 not http\r\n\r\n").await;
        assert!(!garbage.contains("200 OK"), "{garbage}");
        let again = exchange(addr, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.0 200 OK"), "{again}");

        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
