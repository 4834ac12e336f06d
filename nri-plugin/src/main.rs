//! nri-plugin: the containerd NRI plugin of dra-cpu.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use dra_cpu_proto::nri::{run_with_reconnect, NriClientOptions, NriUpdater, SocketSource};
use nri_plugin::cdi_fallback;
use nri_plugin::config::{self, LogFormat, Settings};
use nri_plugin::handler::{cdi_claim, ClaimOrigin, NodeView, NumaMap};
use nri_plugin::host_cgroups::HostCgroups;
use nri_plugin::metrics::{self, Metrics};
use nri_plugin::plugin::{DraCpuPlugin, Enforcer};
use nri_plugin::subscription::{self, CoordinationResolver};
use shared_state::topology::Topology;

nri_plugin::install_process_allocator!();

/// How often host cgroups are checked for a cpuset changed by someone else.
const HOST_CGROUP_CHECK: Duration = Duration::from_secs(10);

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
        .and_then(|runtime| runtime.block_on(run()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the whole cause chain; operators read this in logs.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let file = match &cli.config {
        Some(path) => config::load_file(path)?,
        None => Settings::default(),
    };
    let config = cli.settings.or(file).resolve()?;
    init_logging(config.log_format);

    // Before anything is bound or started, so a refused path stops the
    // start. Always opened: with no list it still gives back the cgroups a
    // previous run managed (the option was removed between runs).
    let host_cgroups =
        HostCgroups::open(&config.cgroup_root, &config.host_cgroups, &config.state_dir)?;
    let topology = Topology::discover(&config.sysfs_root)
        .with_context(|| format!("discovering CPUs under {}", config.sysfs_root.display()))?;
    let numa = config
        .align_memory
        .then(|| NumaMap::from_topology(&topology));
    let mut view = NodeView::new(
        topology.online(),
        config.reserved_cpus.clone(),
        config.mixed_allocation_mode,
        numa,
    );
    // Until dra-plugin answers, the claims on disk are the best knowledge.
    for (uid, cpus) in cdi_fallback::scan_claims(&config.cdi_dir) {
        if let Err(e) = view.learn_claim(cdi_claim(&uid, cpus), ClaimOrigin::CdiSpec) {
            tracing::warn!(claim = %uid, error = %e, "ignoring CDI spec");
        }
    }
    tracing::info!(
        allocatable = %view.pool().allocatable(), claims_from_cdi = view.pool().claims().len(),
        "starting view"
    );

    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    metrics::serve(
        config.metrics_address,
        metrics.clone(),
        stopped(stop_rx.clone()),
    )
    .await
    .with_context(|| format!("binding the metrics address {}", config.metrics_address))?;

    if !host_cgroups.paths().is_empty() {
        tracing::info!(host_cgroups = ?host_cgroups.paths(), "host cgroups follow the shared pool and the reserved CPUs");
    }
    let updater = NriUpdater::new();
    let enforcer = Enforcer::new(
        view,
        metrics.clone(),
        updater.clone(),
        config.unsolicited_updates,
    );
    let enforcer = Arc::new(if host_cgroups.paths().is_empty() {
        enforcer
    } else {
        enforcer.with_host_cgroups(host_cgroups)
    });
    enforcer.sync_host_cgroups();
    let resolver = Arc::new(CoordinationResolver {
        socket: config.coordination_socket.clone(),
        cdi_dir: config.cdi_dir.clone(),
    });
    let subscriber = format!(
        "nri-plugin/{}",
        std::env::var("NODE_NAME").unwrap_or_else(|_| "node".to_string())
    );
    let subscription = tokio::spawn(subscription::run(
        enforcer.clone(),
        config.coordination_socket.clone(),
        subscriber,
        stopped(stop_rx.clone()),
    ));

    // The connection can drop without a Shutdown (containerd killed): the
    // registered gauge follows the connection itself.
    let monitor = tokio::spawn(metrics::follow_registration(
        updater.connection(),
        metrics.clone(),
    ));
    // Someone else (systemd applying a unit's AllowedCPUs=) may rewrite a
    // host cgroup's cpuset between pool changes.
    let host_repair = {
        let enforcer = enforcer.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HOST_CGROUP_CHECK);
            loop {
                tick.tick().await;
                enforcer.repair_host_cgroups();
            }
        })
    };
    let plugin = Arc::new(DraCpuPlugin::new(enforcer.clone(), resolver));
    let source = SocketSource::from_env_or(&config.nri_socket)?;
    let options = NriClientOptions::new(&config.plugin_name, &config.plugin_index);
    let nri = tokio::spawn(run_with_reconnect(
        plugin,
        source,
        options,
        updater,
        stopped(stop_rx),
    ));
    tokio::select! {
        () = shutdown_signal() => tracing::info!("stopping"),
        ended = nri => {
            let _ = stop_tx.send(true);
            monitor.abort();
            host_repair.abort();
            enforcer.restore_host_cgroups();
            ended.context("NRI task")?.context("NRI connection")?;
            return Ok(());
        }
    }
    // Host daemons get their CPUs back first: the rest of the stop may
    // wait on the coordination stream.
    host_repair.abort();
    enforcer.restore_host_cgroups();
    let _ = stop_tx.send(true);
    let _ = subscription.await;
    monitor.abort();
    Ok(())
}
