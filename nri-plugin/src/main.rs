//! nri-plugin: the containerd NRI plugin of dra-cpu.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use nri_plugin::config::{self, Settings};

nri_plugin::install_process_allocator!();

// Name, version and about text are the package's own (Cargo.toml).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// YAML config file; its keys are the flag names without dashes.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

fn main() -> ExitCode {
    match start() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the whole cause chain; operators read this in logs.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Flags over the config file, then the daemon until SIGTERM or SIGINT
/// cancels its shutdown token.
fn start() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let file = match &cli.config {
        Some(path) => config::load_file(path)?,
        None => Settings::default(),
    };
    let config = cli.settings.or(file).resolve()?;
    dra_cpu_daemon::daemon::serve(config.log_format, |shutdown| {
        nri_plugin::run(config, shutdown)
    })
}
