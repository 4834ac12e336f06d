//! The nri-plugin daemon: the node view started from the CDI specs on disk,
//! the enforcer, the coordination subscription to dra-plugin, the NRI
//! connection to the runtime, metrics, and the order they stop in.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dra_cpu_nri::client::{run_with_reconnect, NriClientOptions, NriUpdater, SocketSource};
use shared_state::topology::Topology;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::coordination;
use crate::cpuset_check::{CgroupCpusets, CpusetReadBack};
use crate::enforcer::Enforcer;
use crate::health::{follow_registration, Health};
use crate::host_cgroups::HostCgroups;
use crate::http::{self, NriEndpoints};
use crate::metrics::Metrics;
use crate::nri::DraCpuPlugin;
use crate::partition::IsolatedPartitions;
use crate::resolve::{scan_claims, CoordinationResolver};
use crate::view::admission::cdi_claim;
use crate::view::claims::ClaimOrigin;
use crate::view::numa::NumaMap;
use crate::view::NodeView;

/// How often host cgroups are checked for a cpuset changed by someone else.
const HOST_CGROUP_CHECK: Duration = Duration::from_secs(10);

/// Run the plugin until `shutdown` is cancelled (or the NRI connection ends
/// for good), then give the host cgroups back and stop.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
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
    for (uid, cpus) in scan_claims(&config.cdi_dir) {
        if let Err(e) = view.learn_claim(cdi_claim(&uid, cpus), ClaimOrigin::CdiSpec) {
            tracing::warn!(claim = %uid, error = %e, "ignoring CDI spec");
        }
    }
    tracing::info!(
        allocatable = %view.pool().allocatable(), claims_from_cdi = view.pool().claims().len(),
        "starting view"
    );

    let health = Arc::new(Health::default());
    let metrics = Arc::new(Metrics::watching(&health));
    // Everything stops on this one, after the host cgroups are given back.
    let stop = CancellationToken::new();
    http::serve(
        config.metrics_address,
        NriEndpoints {
            metrics: metrics.clone(),
            health: health.clone(),
        },
        stop.clone().cancelled_owned(),
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
    )
    .with_health(health.clone());
    let enforcer = match IsolatedPartitions::writable(&config.cgroup_root) {
        Some(partitions) => enforcer.with_isolated_partitions(partitions),
        None => {
            tracing::info!(
                cgroup_root = %config.cgroup_root.display(),
                "the cgroup root is not writable: no isolated partitions (tuning.loadBalancing off) are made, and a container of a claim asking for one is refused"
            );
            enforcer
        }
    };
    let enforcer = if host_cgroups.paths().is_empty() {
        enforcer
    } else {
        enforcer.with_host_cgroups(host_cgroups)
    };
    let cpuset_check = config
        .cpuset_check
        .and_then(|every| Some((every, CgroupCpusets::find(&config.cgroup_root)?)));
    let enforcer = Arc::new(match &cpuset_check {
        Some((every, cgroups)) => {
            tracing::info!(every = ?every, cgroup_root = %config.cgroup_root.display(), "containers' cpusets are read back from their cgroups");
            enforcer.with_cpuset_check(CpusetReadBack::new(cgroups.clone()))
        }
        None => {
            if config.cpuset_check.is_some() {
                tracing::warn!(
                    cgroup_root = %config.cgroup_root.display(),
                    "no cgroup hierarchy at the cgroup root: containers' cpusets are not read back"
                );
            }
            enforcer
        }
    });
    enforcer.sync_host_cgroups();
    let resolver = Arc::new(CoordinationResolver::new(
        config.coordination_socket.clone(),
        config.cdi_dir.clone(),
    )?);
    let subscriber = format!(
        "nri-plugin/{}",
        std::env::var("NODE_NAME").unwrap_or_else(|_| "node".to_string())
    );
    let subscription = tokio::spawn(coordination::run(
        enforcer.clone(),
        config.coordination_socket.clone(),
        subscriber,
        stop.clone().cancelled_owned(),
    ));

    // The connection can drop without a Shutdown (containerd killed): the
    // registered gauge follows the connection itself.
    let monitor = tokio::spawn(follow_registration(updater.connection(), health.clone()));
    // Someone else (systemd applying a unit's AllowedCPUs=) may rewrite a
    // host cgroup's cpuset between pool changes.
    let host_repair = {
        let enforcer = enforcer.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HOST_CGROUP_CHECK);
            loop {
                tick.tick().await;
                enforcer.repair_host_cgroups();
                // A partition the kernel refused a running container
                // (CPUs still exclusive to a cgroup on its way out) is
                // tried again.
                enforcer.reconcile_partitions();
            }
        })
    };
    // An update the runtime dropped while reporting success, or a cpuset
    // someone else wrote, is found in the cgroup and sent again.
    let read_back = cpuset_check.map(|(every, _)| {
        let enforcer = enforcer.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                enforcer.check_container_cpusets().await;
            }
        })
    });
    // An unsolicited update the runtime refused or did not answer in time
    // goes again, without waiting for an event that may not come.
    let resend = {
        let enforcer = enforcer.clone();
        tokio::spawn(async move { enforcer.resend_failed_updates().await })
    };
    let plugin = Arc::new(DraCpuPlugin::new(enforcer.clone(), resolver));
    let source = SocketSource::from_env_or(&config.nri_socket)?;
    let options = NriClientOptions::new(&config.plugin_name, &config.plugin_index);
    let nri = tokio::spawn(run_with_reconnect(
        plugin,
        source,
        options,
        updater,
        stop.clone().cancelled_owned(),
    ));
    tokio::select! {
        () = shutdown.cancelled() => tracing::info!("stopping"),
        ended = nri => {
            stop.cancel();
            monitor.abort();
            host_repair.abort();
            resend.abort();
            if let Some(task) = &read_back {
                task.abort();
            }
            enforcer.restore_host_cgroups();
            ended.context("NRI task")?.context("NRI connection")?;
            return Ok(());
        }
    }
    // Host daemons get their CPUs back first: the rest of the stop may
    // wait on the coordination stream.
    host_repair.abort();
    resend.abort();
    if let Some(task) = &read_back {
        task.abort();
    }
    enforcer.restore_host_cgroups();
    stop.cancel();
    let _ = subscription.await;
    monitor.abort();
    Ok(())
}
