//! nri-plugin: the containerd NRI plugin of dra-cpu.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use nri_plugin::config::{self, LogFormat, Settings};
use tokio_util::sync::CancellationToken;

nri_plugin::install_process_allocator!();

#[derive(Debug, Parser)]
#[command(
    name = "nri-plugin",
    version,
    about = "containerd NRI plugin of dra-cpu: pins claim containers to their CPUs and keeps the others on the shared pool"
)]
struct Cli {
    /// YAML config file; its keys are the flag names without dashes.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn main() -> ExitCode {
    let result = tokio::runtime::Runtime::new()
        .context("starting the async runtime")
        .and_then(|runtime| runtime.block_on(start()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the whole cause chain; operators read this in logs.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Flags over the config file, logging, then the daemon until SIGTERM or
/// SIGINT cancels its shutdown token.
async fn start() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let file = match &cli.config {
        Some(path) => config::load_file(path)?,
        None => Settings::default(),
    };
    let config = cli.settings.or(file).resolve()?;
    init_logging(config.log_format);
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    nri_plugin::run(config, shutdown).await
}
