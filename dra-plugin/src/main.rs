//! dra-plugin: the kubelet DRA plugin of dra-cpu.
//!
//! Subcommands besides the plugin itself inspect what the plugin would see
//! and do on this node, from the same code paths.

use dra_plugin::cli::{inspect_state, slices, topology as inspect};
use dra_plugin::run;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

// Name, version and about text are the package's own (Cargo.toml).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the plugin: serve kubelet and nri-plugin, publish ResourceSlices.
    Run(Box<run::RunArgs>),
    /// Print the prepared claims, the pools and the store revision, as a grid
    /// of the CPUs (on a terminal) or JSON; `--watch` follows every change.
    Inspect(inspect_state::InspectArgs),
    /// Print the node's CPU topology as JSON.
    Topology(inspect::TopologyArgs),
    /// Print the CPUs the allocator would choose, as a cpulist.
    Allocate(inspect::AllocateArgs),
    /// Print the ResourceSlices this node would publish, as JSON.
    Slices(slices::SlicesArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout().lock();
    let result = match cli.command {
        Command::Run(args) => serve(*args),
        Command::Inspect(args) => inspect_state::inspect(&args, &mut out),
        Command::Topology(args) => inspect::topology(&args, &mut out),
        Command::Allocate(args) => inspect::allocate(&args, &mut out),
        Command::Slices(args) => slices::print(&args, &mut out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`| head`) is not a failure worth a message.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the whole cause chain; operators read this in logs.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `dra-plugin run`: flags over the config file, logging, then the daemon
/// until SIGTERM or SIGINT cancels its shutdown token.
fn serve(args: run::RunArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    run::limit_malloc_arenas();
    dra_cpu_daemon::daemon::serve(config.log_format, |shutdown| run::run(config, shutdown))
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
