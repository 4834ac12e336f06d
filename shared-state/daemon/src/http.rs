//! The plain HTTP/1 endpoints each process serves beside its real protocols:
//! Prometheus `/metrics` and the kubelet probes `/healthz` and `/readyz`,
//! routed and served by axum.
//!
//! What each answer says is the process's ([`Endpoints`]); the routes, the
//! refusals (405 for a method other than GET and HEAD, 404 for any other
//! path) and the socket are the same for both processes and live here.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use ::http::{Method, StatusCode};

/// Content type of the probes' and errors' answers.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// Content type of the Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The answer to one request: status, content type, body.
pub type Reply = (StatusCode, &'static str, String);

/// What one process answers on its endpoints.
pub trait Endpoints: Send + Sync + 'static {
    /// The text exposition of the process's metrics.
    fn metrics(&self) -> String;
    /// `/healthz`: a failed answer makes the kubelet restart the process.
    fn health(&self) -> Reply;
    /// `/readyz`.
    fn readiness(&self) -> Reply;
}

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

fn response((status, content_type, body): Reply) -> Response {
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The routes of `/metrics`, `/healthz` and `/readyz` over `endpoints`. A
/// GET route answers HEAD too, without the body.
pub fn router<E: Endpoints>(endpoints: Arc<E>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(e): State<Arc<E>>| async move {
                response((StatusCode::OK, PROMETHEUS_TEXT, e.metrics()))
            }),
        )
        .route(
            "/healthz",
            get(|State(e): State<Arc<E>>| async move { response(e.health()) }),
        )
        .route(
            "/readyz",
            get(|State(e): State<Arc<E>>| async move { response(e.readiness()) }),
        )
        .method_not_allowed_fallback(|method: Method| async move {
            response(refuse_method(&method).unwrap_or_else(not_found))
        })
        // Any method on an unknown path is refused as a method first, as
        // on a known one.
        .fallback(|method: Method| async move {
            response(refuse_method(&method).unwrap_or_else(not_found))
        })
        .with_state(endpoints)
}

/// A listening socket on `addr`. The unspecified IPv6 address (`[::]`, the
/// default) takes IPv4 too whatever the host's `net.ipv6.bindv6only`, so
/// kubelet's probes reach it on single-stack clusters of either family;
/// on a kernel without IPv6 it falls back to `0.0.0.0` of the same port.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let bound = bind_socket(addr);
    match bound {
        Err(e) if addr.is_ipv6() && addr.ip().is_unspecified() && no_ipv6(&e) => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            match bind_socket(v4) {
                Ok(listener) => {
                    tracing::warn!(
                        address = %addr, error = %e, fallback = %v4,
                        "no IPv6 on this host: the endpoints listen on IPv4 only"
                    );
                    Ok(listener)
                }
                Err(_) => Err(e),
            }
        }
        other => other,
    }
}

/// The errors of a kernel without IPv6 (booted `ipv6.disable=1`, or built
/// without it); any other error is the address's own.
fn no_ipv6(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
    )
}

fn bind_socket(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    // A restarted daemon binds again while its old connections linger.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Bind `addr` and serve `router` until `shutdown` completes. Binding
/// errors are returned; errors of one connection (a client hanging up
/// early, garbage) end that connection only.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::from_std(listen(addr)?)?;
    tracing::info!(
        address = %listener.local_addr().unwrap_or(addr),
        "metrics and health endpoints listening"
    );
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!(error = %e, "metrics and health endpoints stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that listen on every address of this network
    /// namespace: a `[::]` listener could take the ephemeral port another
    /// test picked and let go of, and answer for it.
    static ANY_ADDRESS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
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

    struct Fixed;

    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "# TYPE x gauge\nx 1\n".into()
        }
        fn health(&self) -> Reply {
            (StatusCode::OK, TEXT, "ok\n".to_string())
        }
        fn readiness(&self) -> Reply {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                "not yet\n".to_string(),
            )
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

    /// `[::]` answers on IPv4 in a network namespace whose
    /// `net.ipv6.bindv6only` is 1, where a plain IPv6 socket would not.
    /// Needs root (a namespace of its own); elsewhere it says so and passes.
    #[test]
    fn the_unspecified_ipv6_address_takes_ipv4_when_the_host_says_v6_only() {
        let outcome = std::thread::spawn(|| -> Result<(), String> {
            // SAFETY: unshare(2) with CLONE_NEWNET moves only this thread,
            // which ends with the test, into a new network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(format!(
                    "no network namespace: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let lo_up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .map_err(|e| format!("ip: {e}"))?;
            if !lo_up.success() {
                return Err("ip link set lo up failed".into());
            }
            std::fs::write("/proc/sys/net/ipv6/bindv6only", "1")
                .map_err(|e| format!("bindv6only: {e}"))?;
            let listener = listen("[::]:0".parse().unwrap()).unwrap();
            let port = listener.local_addr().unwrap().port();
            std::net::TcpStream::connect(("127.0.0.1", port))
                .map(|_| ())
                .map_err(|e| panic!("IPv4 to [::]:{port} with bindv6only 1: {e}"))
        })
        .join()
        .expect("the namespace thread");
        if let Err(why) = outcome {
            eprintln!("skipped: {why}");
        }
    }

    /// `[::]` answers on IPv4 as well as IPv6 loopback (IPv4 alone on a
    /// host without IPv6).
    #[tokio::test]
    async fn the_unspecified_ipv6_address_takes_both_families() {
        let _alone = ANY_ADDRESS.lock().await;
        let listener = listen("[::]:0".parse().unwrap()).unwrap();
        let local = listener.local_addr().unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let accepting = tokio::spawn(async move {
            for _ in 0..2 {
                if listener.accept().await.is_err() {
                    return;
                }
            }
        });
        let v4 = SocketAddr::from(([127, 0, 0, 1], local.port()));
        tokio::net::TcpStream::connect(v4)
            .await
            .unwrap_or_else(|e| panic!("{v4} (listening on {local}): {e}"));
        if local.is_ipv6() {
            let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, local.port()));
            tokio::net::TcpStream::connect(v6)
                .await
                .unwrap_or_else(|e| panic!("{v6}: {e}"));
        }
        accepting.abort();
    }

    #[tokio::test]
    async fn serves_the_routed_reply_and_survives_garbage_until_shutdown() {
        let _alone = ANY_ADDRESS.lock().await;
        // Bind an ephemeral port, learn it, and serve on it.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve(addr, router(Arc::new(Fixed)), async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();

        let ok = exchange(addr, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; charset=utf-8"),
            "{ok}"
        );
        assert!(ok.ends_with("\r\n\r\nok\n"), "{ok}");
        let metrics = exchange(addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(metrics.contains(&format!("content-type: {PROMETHEUS_TEXT}")));
        assert!(
            metrics.ends_with("\r\n\r\n# TYPE x gauge\nx 1\n"),
            "{metrics}"
        );
        let head = exchange(addr, "HEAD /metrics HTTP/1.0\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.0 200 OK\r\n"), "{head}");
        assert!(
            head.ends_with("\r\n\r\n"),
            "a HEAD answer has no body: {head}"
        );
        let unready = exchange(addr, "GET /readyz HTTP/1.0\r\n\r\n").await;
        assert!(unready.starts_with("HTTP/1.0 503"), "{unready}");
        assert!(unready.ends_with("\r\n\r\nnot yet\n"), "{unready}");
        let missing = exchange(addr, "GET /nope HTTP/1.0\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        assert!(missing.ends_with("\r\n\r\nnot found\n"), "{missing}");
        for request in [
            "POST /healthz HTTP/1.0\r\n\r\n",
            "DELETE /metrics HTTP/1.0\r\n\r\n",
            "POST /nope HTTP/1.0\r\n\r\n",
        ] {
            let refused = exchange(addr, request).await;
            assert!(refused.starts_with("HTTP/1.0 405"), "{request}: {refused}");
            assert!(
                refused.ends_with("\r\n\r\nonly GET and HEAD\n"),
                "{refused}"
            );
        }
        // Garbage ends that connection only.
        let garbage = exchange(addr, "\x00\x01 not http\r\n\r\n").await;
        assert!(!garbage.contains("200 OK"), "{garbage}");
        let again = exchange(addr, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.0 200 OK"), "{again}");

        stop.send(()).unwrap();
        server.await.unwrap();
        // A child another test forks holds a copy of every socket until it
        // execs, so a connection can still be taken for that moment: the
        // listener must be gone within a while, not at the first try.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{addr} still accepts after the shutdown"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
