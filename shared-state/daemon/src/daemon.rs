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
/// Text is coloured only on a terminal (see [`colour_text_logs`]).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = colour_text_logs(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // A second initialisation (tests running a daemon twice) keeps the first.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Whether text log lines carry ANSI colour codes: only when stderr is a
/// terminal (in a pod it is a pipe or file, where `kubectl logs` would show
/// the escape sequences), and never when `NO_COLOR` is set to anything but
/// the empty string (<https://no-color.org>).
pub fn colour_text_logs(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
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

/// The most async worker threads a daemon runs, whatever the node's size.
pub const MAX_WORKER_THREADS: usize = 4;

/// Async worker threads for a process allowed `parallelism` CPUs: one per
/// CPU up to [`MAX_WORKER_THREADS`]. The daemons wait on sockets, the disk
/// and the API server, and their handlers take microseconds; a worker per
/// CPU of a 256-CPU node would be 256 threads, each with its stack and
/// allocator cache, in the shared pool beside the workloads. Blocking work
/// (store commits, file writes) has tokio's own pool, which grows with the
/// concurrent prepares and shrinks when idle.
pub fn worker_threads(parallelism: usize) -> usize {
    parallelism.clamp(1, MAX_WORKER_THREADS)
}

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
    let parallelism = std::thread::available_parallelism().map_or(1, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads(parallelism))
        .enable_all()
        .build()
        .map_err(RuntimeStartError)?;
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

#[cfg(test)]
mod tests {
    use super::colour_text_logs;
    use std::ffi::OsStr;

    #[test]
    fn worker_threads_follow_the_cpus_up_to_the_cap() {
        use super::{worker_threads, MAX_WORKER_THREADS};
        let cases = [
            (0, 1),
            (1, 1),
            (2, 2),
            (MAX_WORKER_THREADS, MAX_WORKER_THREADS),
            (MAX_WORKER_THREADS + 1, MAX_WORKER_THREADS),
            (256, MAX_WORKER_THREADS),
        ];
        for (cpus, want) in cases {
            assert_eq!(worker_threads(cpus), want, "{cpus} CPUs");
        }
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let cases: [(bool, Option<&str>, bool); 8] = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("0"), false),
            (true, Some("false"), false),
            (false, None, false),
            (false, Some(""), false),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(
                colour_text_logs(terminal, no_color.map(OsStr::new)),
                want,
                "terminal={terminal} NO_COLOR={no_color:?}"
            );
        }
    }
}
