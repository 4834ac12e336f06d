//! Start-up both daemons share: the `--log-format` flag, the log set-up,
//! and running the daemon until SIGTERM or SIGINT.

use std::future::Future;
use tokio_util::sync::CancellationToken;

/// How log lines are written to stderr.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Logs to stderr as text or JSON; `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests running a daemon twice) keeps the first.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// SIGTERM or SIGINT.
pub async fn termination_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            // Without signal handlers the process can only be killed; wait
            // for Ctrl-C through the portable path instead.
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Settings read from command-line flags alone (`args` without the program
/// name), as the daemon's own parser reads them.
pub fn parse_flags<S: clap::Args>(args: &[&str]) -> Result<S, clap::Error> {
    let parser = S::augment_args(clap::Command::new("flags").no_binary_name(true));
    S::from_arg_matches(&parser.try_get_matches_from(args)?)
}

/// The async runtime could not be started.
#[derive(Debug, thiserror::Error)]
#[error("starting the async runtime")]
pub struct RuntimeStartError(#[source] std::io::Error);

/// Logging, then `daemon` on a new runtime until SIGTERM or SIGINT cancels
/// the shutdown token it is given.
pub fn serve<F, E>(
    log_format: LogFormat,
    daemon: impl FnOnce(CancellationToken) -> F,
) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
    E: From<RuntimeStartError>,
{
    init_logging(log_format);
    let runtime = tokio::runtime::Runtime::new().map_err(RuntimeStartError)?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        tokio::spawn(async move {
            termination_signal().await;
            on_signal.cancel();
        });
        daemon(shutdown).await
    })
}
