//! Unix-socket transport for the gRPC services of both processes: kubelet's
//! registration and DRA sockets, and the coordination socket between
//! dra-plugin and nri-plugin.
//!
//! Servers bind with [`bind_unix`] and serve [`incoming_with_peer_check`]
//! (or, for the sockets kubelet dials, [`incoming_for_kubelet`]) through
//! `tonic::transport::Server::serve_with_incoming`; clients get a channel
//! from [`connect_unix`] or [`connect_unix_lazy`]. Kubelet's connections
//! are wrapped in [`authority::AnyAuthority`], so Go and C-core clients,
//! which send an `:authority` h2 refuses, are served too; the coordination
//! socket, whose client is nri-plugin's tonic, takes its bytes as they come.

pub mod authority;
pub mod hpack;

use std::collections::BTreeSet;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::net::unix::UCred;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// Longest path that fits in `sockaddr_un.sun_path` (108 bytes with the NUL).
pub const MAX_UNIX_SOCKET_PATH_BYTES: usize = 107;

/// Mode for sockets only their owner (root) may connect to.
pub const OWNER_ONLY_SOCKET_MODE: u32 = 0o600;

/// After a failed `accept` (e.g. out of file descriptors) the listener is
/// retried after this pause, so a persistent failure cannot spin a core.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// HTTP/2 needs an authority; the connector ignores it and dials the socket.
const PLACEHOLDER_URI: &str = "http://[::]:50051";

/// Errors of the Unix-socket transport; each names the socket path.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(
        "unix socket path {} is {len} bytes long; at most {MAX_UNIX_SOCKET_PATH_BYTES} bytes fit",
        path.display()
    )]
    PathTooLong { path: PathBuf, len: usize },
    #[error("unix socket path is empty")]
    EmptyPath,
    #[error("binding unix socket {} needs a Tokio runtime with I/O enabled", path.display())]
    NoRuntime { path: PathBuf },
    #[error("creating socket directory {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("inspecting existing socket path {}: {source}", path.display())]
    Inspect { path: PathBuf, source: io::Error },
    #[error("removing stale socket {}: {source}", path.display())]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("binding unix socket {}: {source}", path.display())]
    Bind { path: PathBuf, source: io::Error },
    #[error("moving listening socket {} onto {}: {source}", from.display(), path.display())]
    Rename {
        from: PathBuf,
        path: PathBuf,
        source: io::Error,
    },
    #[error("setting mode {mode:04o} on socket {}: {source}", path.display())]
    SetMode {
        path: PathBuf,
        mode: u32,
        source: io::Error,
    },
    #[error("connecting to unix socket {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// Checks that `path` can be a Unix socket address.
pub fn check_socket_path(path: &Path) -> Result<(), TransportError> {
    let len = path.as_os_str().as_bytes().len();
    if len == 0 {
        return Err(TransportError::EmptyPath);
    }
    if len > MAX_UNIX_SOCKET_PATH_BYTES {
        return Err(TransportError::PathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    Ok(())
}

/// Binds a Unix socket at `path` with file mode `mode` (e.g.
/// [`OWNER_ONLY_SOCKET_MODE`]).
///
/// Creates the parent directory if missing and replaces a stale socket left by
/// an earlier run; any other kind of file at `path` is an error, never deleted.
/// Must be called inside a Tokio runtime (an error otherwise).
///
/// Clients (kubelet's plugin watcher, nri-plugin) poll for the socket file and
/// connect as soon as it appears, so the file must not appear before it
/// listens with its final mode: the socket is bound, listening and given its
/// mode under a temporary name in the same directory, then renamed onto
/// `path`, which atomically replaces a stale socket. Only when no temporary
/// name fits the address limit is `path` bound directly.
pub fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener, TransportError> {
    check_socket_path(path)?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(TransportError::NoRuntime {
            path: path.to_path_buf(),
        });
    }
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| TransportError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let Some(temporary) = temporary_socket_path(path) else {
        remove_stale_socket(path)?;
        return listen_with_mode(path, mode);
    };
    refuse_non_socket(path)?;
    // Left by an earlier run with the same pid (pid 1 in a container).
    remove_stale_socket(&temporary)?;
    let listener = listen_with_mode(&temporary, mode)?;
    if let Err(source) = std::fs::rename(&temporary, path) {
        // Nobody can have connected by a name nobody knows: drop it.
        let _ = std::fs::remove_file(&temporary);
        return Err(TransportError::Rename {
            from: temporary,
            path: path.to_path_buf(),
            source,
        });
    }
    Ok(listener)
}

/// `.<name>.<pid>.tmp` beside `path`, or `.<pid>.tmp` if that is too long for
/// a socket address; `None` if neither fits.
fn temporary_socket_path(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let pid = std::process::id();
    let mut long = std::ffi::OsString::from(".");
    long.push(name);
    long.push(format!(".{pid}.tmp"));
    [long, format!(".{pid}.tmp").into()]
        .into_iter()
        .map(|candidate| path.with_file_name(candidate))
        .find(|candidate| check_socket_path(candidate).is_ok())
}

/// `bind(2)` and `listen(2)` at `path`, then `chmod` to `mode`; on a failed
/// `chmod` the socket file is removed again.
fn listen_with_mode(path: &Path, mode: u32) -> Result<UnixListener, TransportError> {
    let listener = UnixListener::bind(path).map_err(|source| TransportError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    if let Err(source) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        drop(listener);
        let _ = std::fs::remove_file(path);
        return Err(TransportError::SetMode {
            path: path.to_path_buf(),
            mode,
            source,
        });
    }
    Ok(listener)
}

/// An error if something other than a socket is at `path`.
fn refuse_non_socket(path: &Path) -> Result<(), TransportError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(TransportError::Inspect {
            path: path.to_path_buf(),
            source,
        }),
        Ok(meta) if !meta.file_type().is_socket() => Err(TransportError::NotASocket {
            path: path.to_path_buf(),
        }),
        Ok(_) => Ok(()),
    }
}

fn remove_stale_socket(path: &Path) -> Result<(), TransportError> {
    refuse_non_socket(path)?;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(TransportError::RemoveStale {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Which peers may talk to a server, by the uid the kernel reports for the
/// connecting process (SO_PEERCRED). An empty set admits nobody.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    allowed_uids: BTreeSet<u32>,
}

impl PeerPolicy {
    /// Admits exactly the given uids.
    pub fn allow_uids(uids: impl IntoIterator<Item = u32>) -> Self {
        Self {
            allowed_uids: uids.into_iter().collect(),
        }
    }

    /// Admits only root, the default for the coordination socket.
    pub fn root_only() -> Self {
        Self::allow_uids([0])
    }

    /// The admitted uids, ascending.
    pub fn allowed_uids(&self) -> impl Iterator<Item = u32> + '_ {
        self.allowed_uids.iter().copied()
    }

    /// Decides on a peer from its credentials, or from the failure to read them.
    pub fn admit(&self, peer: io::Result<PeerIdentity>) -> Result<PeerIdentity, PeerRefusal> {
        let peer = peer.map_err(|source| PeerRefusal::CredentialsUnavailable { source })?;
        if self.allowed_uids.contains(&peer.uid) {
            Ok(peer)
        } else {
            Err(PeerRefusal::UidNotAllowed {
                uid: peer.uid,
                pid: peer.pid,
                allowed: self.allowed_uids.iter().copied().collect(),
            })
        }
    }
}

/// The kernel's view of a connected peer process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIdentity {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

impl From<UCred> for PeerIdentity {
    fn from(cred: UCred) -> Self {
        Self {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
        }
    }
}

/// Why a peer was turned away.
#[derive(Debug, thiserror::Error)]
pub enum PeerRefusal {
    #[error("peer uid {uid} (pid {pid:?}) is not among the allowed uids {allowed:?}")]
    UidNotAllowed {
        uid: u32,
        pid: Option<i32>,
        allowed: Vec<u32>,
    },
    #[error("peer credentials unavailable: {source}")]
    CredentialsUnavailable {
        #[source]
        source: io::Error,
    },
}

/// The connections accepted on `listener` whose peer `policy` admits, for
/// `tonic::transport::Server::serve_with_incoming`.
///
/// A refused peer is logged and its connection closed before any byte is
/// read, so it never reaches a service. Accept failures are logged and
/// retried; the stream never ends on its own.
pub fn incoming_with_peer_check(
    listener: UnixListener,
    policy: PeerPolicy,
) -> impl Stream<Item = io::Result<UnixStream>> + Send + 'static {
    let socket = listener
        .local_addr()
        .ok()
        .and_then(|addr| addr.as_pathname().map(Path::to_path_buf))
        .unwrap_or_default();
    futures::stream::unfold(
        (listener, policy, socket),
        |(listener, policy, socket)| async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let peer = stream.peer_cred().map(PeerIdentity::from);
                        match policy.admit(peer) {
                            Ok(peer) => {
                                tracing::debug!(
                                    socket = %socket.display(), uid = peer.uid, pid = ?peer.pid,
                                    "peer admitted"
                                );
                                return Some((Ok(stream), (listener, policy, socket)));
                            }
                            Err(refusal) => {
                                tracing::warn!(
                                    socket = %socket.display(), %refusal,
                                    "refusing connection"
                                );
                                drop(stream);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(socket = %socket.display(), error = %e, "accept failed");
                        tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                    }
                }
            }
        },
    )
}

/// [`incoming_with_peer_check`] for the sockets kubelet dials (registration
/// and DRA): each admitted connection accepts any `:authority`
/// ([`authority::AnyAuthority`]), which kubelet's grpc-go sends as the
/// socket's path.
pub fn incoming_for_kubelet(
    listener: UnixListener,
    policy: PeerPolicy,
) -> impl Stream<Item = io::Result<authority::AnyAuthority<UnixStream>>> + Send + 'static {
    use futures::StreamExt;
    incoming_with_peer_check(listener, policy)
        .map(|accepted| accepted.map(authority::AnyAuthority::new))
}

fn unix_connector(
    path: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = io::Error,
    Future = impl std::future::Future<Output = io::Result<TokioIo<UnixStream>>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    })
}

/// An endpoint for [`connect_unix_with`]; set timeouts or keepalive on it.
pub fn unix_endpoint() -> Endpoint {
    Endpoint::from_static(PLACEHOLDER_URI)
}

/// Connects a gRPC channel to the server on the Unix socket at `path`.
pub async fn connect_unix(path: &Path) -> Result<Channel, TransportError> {
    connect_unix_with(unix_endpoint(), path).await
}

/// Like [`connect_unix`], with the caller's endpoint settings (e.g.
/// `connect_timeout`, `http2_keep_alive_interval`); its URI is ignored.
pub async fn connect_unix_with(endpoint: Endpoint, path: &Path) -> Result<Channel, TransportError> {
    check_socket_path(path)?;
    endpoint
        .connect_with_connector(unix_connector(path.to_path_buf()))
        .await
        .map_err(|source| TransportError::Connect {
            path: path.to_path_buf(),
            source,
        })
}

/// A gRPC channel to the Unix socket at `path` that dials on first use and
/// redials after the server goes away (for subscribers that reconnect).
pub fn connect_unix_lazy(path: &Path) -> Result<Channel, TransportError> {
    check_socket_path(path)?;
    Ok(unix_endpoint().connect_with_connector_lazy(unix_connector(path.to_path_buf())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn temporary_socket_names_sit_beside_the_socket_and_fit_the_address_limit() {
        let pid = std::process::id();
        let dir = "/run/dra";
        let short = format!("{dir}/plugin.sock");
        // Leaves room for `.<pid>.tmp` but, one byte short, not for
        // `.<name>.<pid>.tmp`, whatever the number of digits of the pid.
        let pid_len = pid.to_string().len();
        let long = format!(
            "{dir}/{}",
            "n".repeat(MAX_UNIX_SOCKET_PATH_BYTES - dir.len() - pid_len - 6)
        );
        // A one-byte name in a directory that uses up the rest of the limit.
        let full = format!("/{}/x", "d".repeat(MAX_UNIX_SOCKET_PATH_BYTES - 3));
        let cases = [
            (
                short.as_str(),
                Some(format!("{dir}/.plugin.sock.{pid}.tmp")),
            ),
            (long.as_str(), Some(format!("{dir}/.{pid}.tmp"))),
            (full.as_str(), None),
        ];
        for (path, want) in cases {
            let got = temporary_socket_path(Path::new(path));
            assert_eq!(got, want.map(PathBuf::from), "{path}");
            if let Some(got) = got {
                assert!(check_socket_path(&got).is_ok(), "{}", got.display());
            }
        }
    }

    fn peer(uid: u32) -> io::Result<PeerIdentity> {
        Ok(PeerIdentity {
            uid,
            gid: uid,
            pid: Some(42),
        })
    }

    #[test]
    fn admit_table() {
        let cases: Vec<(&[u32], io::Result<PeerIdentity>, bool)> = vec![
            (&[0], peer(0), true),
            (&[0], peer(1000), false),
            (&[0, 1000], peer(1000), true),
            (&[12345], peer(0), false),
            (&[], peer(0), false),
            (&[0], Err(io::Error::other("ENOTSOCK")), false),
        ];
        for (allowed, who, expected) in cases {
            let policy = PeerPolicy::allow_uids(allowed.iter().copied());
            let shown = format!("{who:?}");
            let got = policy.admit(who);
            assert_eq!(
                got.is_ok(),
                expected,
                "allowed {allowed:?}, peer {shown}: {got:?}"
            );
        }
    }

    #[test]
    fn refusal_names_uid_and_allowed_set() {
        let refusal = PeerPolicy::allow_uids([12345, 7])
            .admit(peer(1000))
            .unwrap_err();
        let text = refusal.to_string();
        assert!(text.contains("1000"), "{text}");
        assert!(text.contains("[7, 12345]"), "{text}");
    }

    #[test]
    fn socket_path_length_table() {
        let cases = [
            (String::new(), false),
            ("/".to_string(), true),
            (format!("/{}", "a".repeat(106)), true),
            (format!("/{}", "a".repeat(107)), false),
            (
                "/var/lib/kubelet/plugins_registry/dra.cpu-reg.sock".to_string(),
                true,
            ),
        ];
        for (path, ok) in cases {
            let got = check_socket_path(Path::new(&path));
            assert_eq!(got.is_ok(), ok, "{} bytes: {got:?}", path.len());
        }
    }

    #[test]
    fn too_long_error_names_path_and_length() {
        let path = format!("/{}", "s".repeat(120));
        let err = check_socket_path(Path::new(&path)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&path), "{text}");
        assert!(text.contains("121 bytes"), "{text}");
    }

    proptest! {
        #[test]
        fn admits_exactly_the_listed_uids(allowed in proptest::collection::btree_set(any::<u32>(), 0..8), uid in any::<u32>()) {
            let policy = PeerPolicy::allow_uids(allowed.iter().copied());
            prop_assert_eq!(policy.admit(peer(uid)).is_ok(), allowed.contains(&uid));
            prop_assert!(policy.allowed_uids().eq(allowed.iter().copied()));
        }

        #[test]
        fn path_check_matches_byte_length(len in 1usize..200) {
            let path = "p".repeat(len);
            prop_assert_eq!(check_socket_path(Path::new(&path)).is_ok(), len <= MAX_UNIX_SOCKET_PATH_BYTES);
        }
    }
}
