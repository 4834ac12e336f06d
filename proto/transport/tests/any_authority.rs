//! A tonic server reached by a raw HTTP/2 client that sends, as grpc-go does
//! for kubelet's registration dial, the socket path percent-encoded as
//! `:authority`. Served straight from the socket (the control), h2 refuses
//! the call with RST_STREAM PROTOCOL_ERROR; served through
//! `incoming_for_kubelet`, whose connections rewrite such an authority,
//! the call succeeds. The client's frames are built by hand because the `h2`
//! client, like `http::Uri`, cannot send an invalid authority.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use dra_cpu_proto::kubelet::registration;
use dra_cpu_transport::hpack::{encode_literal, Decoder, HeaderField};
use dra_cpu_transport::{bind_unix, incoming_for_kubelet, PeerPolicy};
use support::h2::{frame, PREFACE};
use support::kubelet::dra_plugin_info;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

const PROTOCOL_ERROR: u32 = 0x1;
const TIMEOUT: Duration = Duration::from_secs(10);
const SOCKET_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdra.cpu-reg.sock";

struct Registrar;

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(dra_plugin_info()))
    }

    async fn notify_registration_status(
        &self,
        _: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

fn router() -> tonic::transport::server::Router {
    Server::builder().add_service(registration::registration_server::RegistrationServer::new(
        Registrar,
    ))
}

fn own_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Serves through `incoming_for_kubelet` (with the authority rewrite).
fn serve_wrapped(path: &Path) {
    let listener = bind_unix(path, 0o600).unwrap();
    let incoming = incoming_for_kubelet(listener, PeerPolicy::allow_uids([own_uid()]));
    tokio::spawn(router().serve_with_incoming(incoming));
}

/// Serves the bare socket: h2 sees the client's bytes as they are.
fn serve_bare(path: &Path) {
    let listener = UnixListener::bind(path).unwrap();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    tokio::spawn(router().serve_with_incoming(incoming));
}

#[derive(Debug, PartialEq)]
enum Outcome {
    /// The server reset the stream with this HTTP/2 error code.
    Reset(u32),
    /// The call completed: its grpc-status and the response bytes.
    Completed { grpc_status: String, data: usize },
}

fn literal(name: &str, value: &[u8]) -> HeaderField {
    HeaderField {
        name: name.as_bytes().to_vec(),
        value: value.to_vec(),
        never_indexed: false,
    }
}

/// GetInfo over a raw HTTP/2 connection with `authority` as `:authority`.
async fn raw_get_info(path: &Path, authority: &[u8]) -> Outcome {
    let mut stream = UnixStream::connect(path).await.unwrap();
    let mut block = Vec::new();
    for field in [
        literal(":method", b"POST"),
        literal(":scheme", b"http"),
        literal(":path", b"/pluginregistration.Registration/GetInfo"),
        literal(":authority", authority),
        literal("content-type", b"application/grpc"),
        literal("te", b"trailers"),
    ] {
        encode_literal(&mut block, &field);
    }
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    // An empty InfoRequest: uncompressed, zero length.
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    stream.write_all(&out).await.unwrap();

    let mut decoder = Decoder::new(4096);
    let mut data = 0;
    loop {
        let mut header = [0u8; 9];
        stream
            .read_exact(&mut header)
            .await
            .expect("a frame from the server");
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (frame_type, flags) = (header[3], header[4]);
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).await.unwrap();
        match frame_type {
            // SETTINGS (not an ACK): acknowledge.
            0x4 if flags & 0x1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(),
            0x3 if id == 1 => {
                return Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()))
            }
            0x0 if id == 1 => data += len,
            0x1 if id == 1 => {
                assert_ne!(flags & 0x4, 0, "the server's headers fit one frame");
                let mut grpc_status = None;
                decoder
                    .decode(&payload, |f| {
                        if f.name == b"grpc-status" {
                            grpc_status = Some(String::from_utf8_lossy(&f.value).into_owned());
                        }
                    })
                    .expect("the server's header block decodes");
                if flags & 0x1 != 0 {
                    return Outcome::Completed {
                        grpc_status: grpc_status.unwrap_or_default(),
                        data,
                    };
                }
            }
            0x7 => panic!("GOAWAY: {payload:?}"),
            _ => {}
        }
    }
}

async fn outcome(path: &Path, authority: &[u8]) -> Outcome {
    tokio::time::timeout(TIMEOUT, raw_get_info(path, authority))
        .await
        .expect("the server answers")
}

fn completed(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Completed { grpc_status, data } if grpc_status == "0" && *data > 5)
}

#[tokio::test]
async fn h2_refuses_a_socket_path_authority_that_the_wrapped_server_serves() {
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare.sock");
    let wrapped = dir.path().join("wrapped.sock");
    serve_bare(&bare);
    serve_wrapped(&wrapped);
    for authority in [
        SOCKET_AUTHORITY.as_bytes(),
        b"/var/lib/kubelet/plugins_registry/dra.cpu-reg.sock",
    ] {
        // The control: h2 itself refuses the authority.
        assert_eq!(
            outcome(&bare, authority).await,
            Outcome::Reset(PROTOCOL_ERROR)
        );
        let served = outcome(&wrapped, authority).await;
        assert!(completed(&served), "{served:?}");
    }
    // A valid authority is served either way.
    for path in [&bare, &wrapped] {
        let served = outcome(path, b"localhost").await;
        assert!(completed(&served), "{}: {served:?}", path.display());
    }
}

#[tokio::test]
async fn a_malformed_header_block_ends_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wrapped.sock");
    serve_wrapped(&path);
    let mut stream = UnixStream::connect(&path).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    // Index 70: in neither table.
    out.extend(frame(0x1, 0x5, 1, &[0x80 | 70]));
    stream.write_all(&out).await.unwrap();
    let mut received = Vec::new();
    // Ends (EOF or reset) instead of hanging: the timeout is the failure.
    let _ = tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut received))
        .await
        .expect("the server ends the connection");
    let mut frames = Vec::new();
    let mut rest = received.as_slice();
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        frames.push((rest[3], id));
        rest = &rest[(9 + len).min(rest.len())..];
    }
    assert!(
        !frames.contains(&(0x1, 1)),
        "the request was not answered: {frames:?}"
    );
}
