//! The NRI client: connects to the runtime, serves the plugin, registers it,
//! sends unsolicited updates, and reconnects when the runtime goes away.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use ttrpc::r#async::transport::{Listener, Socket};

use crate::mux::{Multiplexer, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::plugin::service::{PluginService, RuntimeInfoCell};
use crate::plugin::{NriPlugin, RuntimeInfo, DEFAULT_HANDLER_TIMEOUT};
use dra_cpu_proto::nri::api;
use dra_cpu_proto::nri::api_ttrpc::RuntimeClient;

/// Default socket of the runtime's NRI service.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";
/// Environment variable through which a runtime that launched the plugin
/// hands over an already connected socket (a file descriptor number).
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// How long registration may take, as the runtime allows.
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of an unsolicited update call of `containers` updates. The
/// runtime passes it on to its handler, which gives up the rest of the call
/// when it passes; containerd runs `runc update` for each container in turn,
/// tens of milliseconds each on a quiet node and seconds on a loaded one, so
/// it grows with the count.
pub fn update_deadline(containers: usize) -> Duration {
    const BASE: Duration = Duration::from_secs(5);
    const PER_CONTAINER: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(30);
    BASE.saturating_add(PER_CONTAINER.saturating_mul(u32::try_from(containers).unwrap_or(u32::MAX)))
        .min(MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum NriError {
    #[error("connecting to the NRI socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{PLUGIN_SOCKET_ENV}={value:?} is not an open file descriptor: {reason}")]
    InvalidInheritedSocket { value: String, reason: String },
    #[error("plugin index {0:?} must be exactly two digits, e.g. \"10\"")]
    InvalidIndex(String),
    #[error("plugin name {0:?} must be non-empty and must not contain '-' or whitespace")]
    InvalidName(String),
    #[error(
        "the inherited NRI socket was already used; a runtime-launched plugin cannot reconnect"
    )]
    InheritedSocketConsumed,
    #[error("starting the plugin service: {0}")]
    Serve(String),
    #[error("registering plugin {name} with the runtime: {message}")]
    Register { name: String, message: String },
    #[error("UpdateContainers: {0}")]
    Update(String),
    #[error("not connected to the runtime")]
    NotConnected,
    #[error("NRI connection: {0}")]
    Mux(#[from] MuxError),
}

/// Where the runtime is.
#[derive(Debug)]
pub enum SocketSource {
    /// A Unix socket path to connect to (and reconnect to).
    Path(PathBuf),
    /// An already connected socket from the runtime; usable once.
    Inherited(Mutex<Option<OwnedFd>>),
}

impl SocketSource {
    /// The inherited socket if `NRI_PLUGIN_SOCKET` is set, else `path`.
    pub fn from_env_or(path: impl Into<PathBuf>) -> Result<Self, NriError> {
        match std::env::var(PLUGIN_SOCKET_ENV) {
            Ok(value) if !value.is_empty() => Self::inherited(&value),
            _ => Ok(SocketSource::Path(path.into())),
        }
    }

    /// Takes ownership of the descriptor named by `value`, after checking it
    /// is open.
    pub fn inherited(value: &str) -> Result<Self, NriError> {
        let invalid = |reason: String| NriError::InvalidInheritedSocket {
            value: value.to_string(),
            reason,
        };
        let fd: i32 = value.trim().parse().map_err(|e| invalid(format!("{e}")))?;
        if fd < 0 {
            return Err(invalid("negative".into()));
        }
        // SAFETY: fcntl(F_GETFD) only queries descriptor flags.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(invalid(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: the descriptor is open and was handed to this process for
        // exclusive use by the runtime; nothing else in the process owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SocketSource::Inherited(Mutex::new(Some(owned))))
    }

    /// Whether a lost connection can be re-established.
    pub fn can_reconnect(&self) -> bool {
        matches!(self, SocketSource::Path(_))
    }

    async fn connect(&self) -> Result<tokio::net::UnixStream, NriError> {
        match self {
            SocketSource::Path(path) => {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|source| NriError::Connect {
                        path: path.clone(),
                        source,
                    })
            }
            SocketSource::Inherited(slot) => {
                let fd = shared_state::sync::lock(slot)
                    .take()
                    .ok_or(NriError::InheritedSocketConsumed)?;
                let path = PathBuf::from(format!("fd:{}", fd.as_raw_fd()));
                let std_stream = std::os::unix::net::UnixStream::from(fd);
                std_stream
                    .set_nonblocking(true)
                    .map_err(|source| NriError::Connect {
                        path: path.clone(),
                        source,
                    })?;
                tokio::net::UnixStream::from_std(std_stream)
                    .map_err(|source| NriError::Connect { path, source })
            }
        }
    }
}

/// Identity and behaviour of a plugin connection.
#[derive(Debug, Clone)]
pub struct NriClientOptions {
    /// Plugin name shown by the runtime (`<index>-<name>`).
    pub plugin_name: String,
    /// Two-digit invocation index; plugins are called in ascending order.
    pub plugin_index: String,
    pub handler_timeout: Duration,
    pub registration_timeout: Duration,
    /// First reconnect delay; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl NriClientOptions {
    pub fn new(plugin_name: impl Into<String>, plugin_index: impl Into<String>) -> Self {
        NriClientOptions {
            plugin_name: plugin_name.into(),
            plugin_index: plugin_index.into(),
            handler_timeout: DEFAULT_HANDLER_TIMEOUT,
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }

    /// Checks name and index the way the runtime does.
    pub fn validate(&self) -> Result<(), NriError> {
        let idx = &self.plugin_index;
        if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NriError::InvalidIndex(idx.clone()));
        }
        let name = &self.plugin_name;
        if name.is_empty() || name.contains('-') || name.chars().any(char::is_whitespace) {
            return Err(NriError::InvalidName(name.clone()));
        }
        Ok(())
    }
}

/// One registered connection to the runtime.
pub struct NriClient {
    runtime: RuntimeClient,
    runtime_info: RuntimeInfoCell,
    mux: Multiplexer,
    server: ttrpc::r#async::Server,
}

impl NriClient {
    /// Connects, starts serving `plugin` and registers it. The runtime then
    /// calls `Configure` and `Synchronize` on the plugin.
    pub async fn connect<P: NriPlugin>(
        plugin: Arc<P>,
        source: &SocketSource,
        options: &NriClientOptions,
    ) -> Result<Self, NriError> {
        options.validate()?;
        let stream = source.connect().await?;
        Self::over(stream, plugin, options).await
    }

    /// Like [`NriClient::connect`] over an already connected trunk.
    pub async fn over<T, P>(
        trunk: T,
        plugin: Arc<P>,
        options: &NriClientOptions,
    ) -> Result<Self, NriError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
        P: NriPlugin,
    {
        options.validate()?;
        let (mux, mut conns) =
            Multiplexer::start(trunk, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN])?;
        let (Some(runtime_conn), Some(plugin_conn)) = (conns.pop(), conns.pop()) else {
            return Err(NriError::Serve(
                "multiplexer returned too few connections".into(),
            ));
        };

        let runtime_info = RuntimeInfoCell::default();
        let service = PluginService::new(plugin, runtime_info.clone(), options.handler_timeout);
        // The ttrpc server accepts exactly one connection: the plugin
        // service connection. The stream stays open afterwards so the
        // server does not treat the listener as gone.
        let accepted = futures::stream::once(async move { Ok::<_, std::io::Error>(plugin_conn) });
        let listener = Listener::new(futures::StreamExt::chain(
            accepted,
            futures::stream::pending(),
        ));
        let mut server = ttrpc::r#async::Server::new()
            .add_listener(listener)
            .register_service(service.into_services());
        server
            .start()
            .await
            .map_err(|e| NriError::Serve(e.to_string()))?;

        let runtime = RuntimeClient::new(ttrpc::r#async::Client::new(Socket::new(runtime_conn)));
        let mut req = api::RegisterPluginRequest::new();
        req.plugin_name = options.plugin_name.clone();
        req.plugin_idx = options.plugin_index.clone();
        let ctx = ttrpc::context::with_duration(options.registration_timeout);
        let registered = tokio::time::timeout(
            options.registration_timeout,
            runtime.register_plugin(ctx, &req),
        )
        .await;
        let name = format!("{}-{}", options.plugin_index, options.plugin_name);
        match registered {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(NriError::Register {
                    name,
                    message: e.to_string(),
                })
            }
            Err(_) => {
                return Err(NriError::Register {
                    name,
                    message: format!("no answer within {:?}", options.registration_timeout),
                })
            }
        }
        tracing::info!(plugin = %name, "registered with the NRI runtime");
        Ok(NriClient {
            runtime,
            runtime_info,
            mux,
            server,
        })
    }

    /// The runtime's self-description, once it has called `Configure`.
    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        self.runtime_info.get()
    }

    /// A cloneable handle for unsolicited updates on this connection.
    pub fn updater(&self) -> ConnectionUpdater {
        ConnectionUpdater {
            runtime: self.runtime.clone(),
            runtime_info: self.runtime_info.clone(),
        }
    }

    /// Requests updates of running containers outside any event. Returns
    /// the updates the runtime failed to apply. See
    /// [`RuntimeInfo::unsolicited_updates_safe`] before using this.
    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
    ) -> Result<Vec<api::ContainerUpdate>, NriError> {
        self.updater().update_containers(update).await
    }

    /// Waits until the runtime closes the connection (or it breaks).
    pub async fn closed(&mut self) -> Result<(), NriError> {
        self.mux.closed().await.map_err(NriError::from)
    }

    /// Stops serving and drops the connection.
    pub async fn shutdown(mut self) {
        self.mux.shutdown();
        let _ = self.server.shutdown().await;
    }
}

/// Sends unsolicited updates on one connection.
#[derive(Clone)]
pub struct ConnectionUpdater {
    runtime: RuntimeClient,
    runtime_info: RuntimeInfoCell,
}

impl ConnectionUpdater {
    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        self.runtime_info.get()
    }

    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
    ) -> Result<Vec<api::ContainerUpdate>, NriError> {
        let deadline = update_deadline(update.len());
        let mut req = api::UpdateContainersRequest::new();
        req.update = update;
        let ctx = ttrpc::context::with_duration(deadline);
        match tokio::time::timeout(deadline, self.runtime.update_containers(ctx, &req)).await {
            Ok(Ok(rsp)) => Ok(rsp.failed),
            Ok(Err(e)) => Err(NriError::Update(e.to_string())),
            Err(_) => Err(NriError::Update(format!("no answer within {deadline:?}"))),
        }
    }
}

/// Unsolicited updates through whichever connection is current, for use
/// with [`run_with_reconnect`].
#[derive(Clone)]
pub struct NriUpdater {
    current: Arc<Mutex<Option<ConnectionUpdater>>>,
    /// Whether a registered connection exists, for those who follow it.
    connected: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for NriUpdater {
    fn default() -> Self {
        NriUpdater {
            current: Arc::default(),
            connected: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl NriUpdater {
    pub fn new() -> Self {
        Self::default()
    }

    /// Follows whether a registered connection exists: changes when a
    /// connection is recorded or lost.
    pub fn connection(&self) -> tokio::sync::watch::Receiver<bool> {
        self.connected.subscribe()
    }

    fn current(&self) -> Option<ConnectionUpdater> {
        shared_state::sync::lock(&self.current).clone()
    }

    fn set(&self, value: Option<ConnectionUpdater>) {
        let connected = value.is_some();
        *shared_state::sync::lock(&self.current) = value;
        self.connected.send_if_modified(|was| {
            let changed = *was != connected;
            *was = connected;
            changed
        });
    }

    /// Whether a registered connection exists right now.
    pub fn is_connected(&self) -> bool {
        self.current().is_some()
    }

    /// The current runtime's self-description.
    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        self.current().and_then(|c| c.runtime_info())
    }

    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
    ) -> Result<Vec<api::ContainerUpdate>, NriError> {
        match self.current() {
            Some(conn) => conn.update_containers(update).await,
            None => Err(NriError::NotConnected),
        }
    }
}

/// The reconnect delays: `initial`, doubling up to `max`, without end.
/// A new schedule starts after every good connection.
pub fn reconnect_delays(initial: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(initial.min(max))
        .with_max_delay(max)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// Keeps `plugin` registered with the runtime until `stop` resolves:
/// connects, serves, and when the runtime goes away or restarts, reconnects
/// with backoff. The runtime sends `Synchronize` again on every
/// registration, so the plugin resynchronizes by itself. An inherited socket
/// cannot be re-established: then this returns when the connection ends.
pub async fn run_with_reconnect<P, S>(
    plugin: Arc<P>,
    source: SocketSource,
    options: NriClientOptions,
    updater: NriUpdater,
    stop: S,
) -> Result<(), NriError>
where
    P: NriPlugin,
    S: std::future::Future<Output = ()> + Send,
{
    options.validate()?;
    tokio::pin!(stop);
    let new_schedule = || reconnect_delays(options.initial_backoff, options.max_backoff);
    let mut delays = new_schedule();
    loop {
        let attempt = tokio::select! {
            _ = &mut stop => return Ok(()),
            attempt = NriClient::connect(plugin.clone(), &source, &options) => attempt,
        };
        match attempt {
            Ok(mut client) => {
                delays = new_schedule();
                updater.set(Some(client.updater()));
                let ended = tokio::select! {
                    _ = &mut stop => None,
                    ended = client.closed() => Some(ended),
                };
                updater.set(None);
                client.shutdown().await;
                match ended {
                    None => return Ok(()),
                    Some(Ok(())) => tracing::warn!("NRI runtime closed the connection"),
                    Some(Err(err)) => tracing::warn!(error = %err, "NRI connection lost"),
                }
            }
            Err(NriError::InheritedSocketConsumed) => {
                return Err(NriError::InheritedSocketConsumed)
            }
            Err(err) => tracing::warn!(error = %err, "cannot register with the NRI runtime"),
        }
        if !source.can_reconnect() {
            return Err(NriError::InheritedSocketConsumed);
        }
        // The schedule has no end; `max_backoff` is only its type's fallback.
        let backoff = delays.next().unwrap_or(options.max_backoff);
        tracing::info!(delay = ?backoff, "reconnecting to the NRI runtime");
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
    }
}

/// Whether `path` looks like a usable NRI socket right now.
pub fn socket_exists(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(delays: impl Iterator<Item = Duration>, n: usize) -> Vec<u128> {
        delays.take(n).map(|d| d.as_millis()).collect()
    }

    #[test]
    fn reconnect_delays_double_from_100ms_to_5s_and_never_end() {
        let defaults = NriClientOptions::new("pin", "10");
        let delays = reconnect_delays(defaults.initial_backoff, defaults.max_backoff);
        let mut seen = millis(delays, 100);
        assert_eq!(seen.len(), 100, "the schedule does not run out");
        assert!(seen.drain(7..).all(|d| d == 5000), "capped at 5 s");
        assert_eq!(seen, vec![100, 200, 400, 800, 1600, 3200, 5000]);
    }

    #[test]
    fn an_update_call_gets_longer_with_more_containers_up_to_30s() {
        let secs = |n| update_deadline(n).as_secs_f64();
        let cases = [
            (0, 5.0),
            (1, 5.2),
            (10, 7.0),
            (100, 25.0),
            (125, 30.0),
            (10_000, 30.0),
            (usize::MAX, 30.0),
        ];
        for (containers, want) in cases {
            assert!(
                (secs(containers) - want).abs() < 1e-9,
                "{containers} containers: {:?}, want {want} s",
                update_deadline(containers)
            );
        }
    }

    #[test]
    fn reconnect_delays_table() {
        let ms = Duration::from_millis;
        let cases = [
            // (initial, max, first delays)
            (ms(100), ms(5000), vec![100, 200, 400, 800]),
            (ms(1), ms(3), vec![1, 2, 3, 3]),
            // An initial delay above the cap starts at the cap.
            (ms(900), ms(500), vec![500, 500, 500]),
            (ms(250), ms(250), vec![250, 250]),
        ];
        for (initial, max, want) in cases {
            let n = want.len();
            assert_eq!(
                millis(reconnect_delays(initial, max), n),
                want,
                "{initial:?}..{max:?}"
            );
        }
    }

    #[test]
    fn options_validation_table() {
        let cases = [
            ("pin", "10", true),
            ("pin", "1", false),
            ("pin", "ab", false),
            ("pin", "100", false),
            ("", "10", false),
            ("my-plugin", "10", false),
            ("my plugin", "10", false),
        ];
        for (name, idx, ok) in cases {
            assert_eq!(
                NriClientOptions::new(name, idx).validate().is_ok(),
                ok,
                "{name:?} {idx:?}"
            );
        }
    }

    #[test]
    fn inherited_socket_must_be_an_open_fd() {
        for value in ["abc", "-3", "987654"] {
            let err = SocketSource::inherited(value).unwrap_err();
            assert!(err.to_string().contains(value), "{err}");
        }
    }

    #[tokio::test]
    async fn inherited_socket_is_used_once() {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd: OwnedFd = ours.into();
        let raw = fd.as_raw_fd();
        std::mem::forget(fd); // ownership passes to SocketSource below
        let source = SocketSource::inherited(&raw.to_string()).unwrap();
        assert!(!source.can_reconnect());
        assert!(source.connect().await.is_ok());
        assert!(matches!(
            source.connect().await,
            Err(NriError::InheritedSocketConsumed)
        ));
    }

    #[tokio::test]
    async fn updater_without_connection_says_so() {
        let updater = NriUpdater::new();
        assert!(!updater.is_connected());
        assert!(matches!(
            updater.update_containers(vec![]).await,
            Err(NriError::NotConnected)
        ));
    }
}
