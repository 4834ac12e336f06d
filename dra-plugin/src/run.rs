//! `dra-plugin run`: the daemon.
//!
//! Start order is chosen so that each peer finds what it needs ready:
//! the store is opened and the CDI directory reconciled first (nothing is
//! served from a state that disagrees with disk), then the coordination
//! socket (nri-plugin needs only the store, not the API server), then the
//! DRA socket, and last the registration socket, whose appearance makes
//! kubelet call us. Shutdown runs the other way: registration goes first so
//! kubelet stops sending work, in-flight prepares finish, sockets are
//! removed.

use crate::cdi::CdiDir;
use crate::config::Config;
use crate::coordination_server::{CoordinationService, DEFAULT_HEARTBEAT};
use crate::device_metadata::{DeviceMetadata, PublishedAttributes};
use crate::devices::{DeviceCatalog, DeviceMode, DeviceOptions};
use crate::driver::{Driver, DriverOptions};
use crate::health::Health;
use crate::kubelet::device_health::HealthTiming;
use crate::kubelet::dra_service::{ClaimSource, DraService, DraV1, DraV1beta1, KubeClaims};
use crate::kubelet::registration::Registrar;
use crate::metrics::Metrics;
use crate::publisher::{DesiredDevices, FallbackBuildError, FallbackDevices, Publisher};
use crate::slices::device_attributes::{add_tuning_attributes, LeftOutRoots};
use crate::slices::{devices_with_pcie_roots, ATTR_PCIE_ROOT};
use crate::tuning::kernel::KernelPaths;
use crate::tuning::NodeTuner;
use anyhow::{bail, Context};
use dra_cpu_proto::coordination::v1::coordination_server::CoordinationServer;
use dra_cpu_proto::kubelet::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration};
use dra_cpu_transport::{
    bind_unix, incoming_for_kubelet, incoming_with_peer_check, PeerPolicy, OWNER_ONLY_SOCKET_MODE,
};
use k8s_openapi::api::resource::v1::Device;
use shared_state::store::sled_store::SledStore;
use shared_state::store::AssignmentStore;
use shared_state::topology::pcie::PcieRoots;
use shared_state::topology::Topology;
use shared_state::tuning::support::NodeSupport;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

/// Kubelet runs as root; our own uid is admitted too so that the plugin can
/// be run and tested unprivileged.
fn kubelet_peers() -> PeerPolicy {
    PeerPolicy::allow_uids([0, nix::unistd::geteuid().as_raw()])
}

/// Remove our socket files; missing ones are fine.
fn remove_sockets(paths: &[&Path]) {
    for path in paths {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(socket = %path.display(), error = %e, "cannot remove socket"),
        }
    }
}

/// The PCIe roots for `--expose-pcie-roots`, with what was found in the log.
fn discover_pcie_roots(config: &Config, topology: &Topology) -> anyhow::Result<PcieRoots> {
    let devices = config.sysfs_root.join("sys/devices");
    let roots = PcieRoots::discover(&config.sysfs_root).with_context(|| {
        format!(
            "--expose-pcie-roots: discovering the PCIe roots under {}",
            devices.display()
        )
    })?;
    if roots.is_empty() {
        tracing::warn!(dir = %devices.display(), "--expose-pcie-roots: no PCIe root complex found, no device will carry {ATTR_PCIE_ROOT}");
        return Ok(roots);
    }
    for (node, names) in roots.by_numa_node(topology) {
        tracing::info!(numa_node = node, roots = ?names, "PCIe roots local to the CPUs of a NUMA node");
    }
    let without = roots.cpus_without_root(topology);
    if !without.is_empty() {
        tracing::info!(cpus = %without, "CPUs local to no PCIe root: their individual devices carry no {ATTR_PCIE_ROOT}");
    }
    Ok(roots)
}

/// At most this many glibc malloc arenas (glibc's default is 8 per CPU).
/// Every thread that allocates gets an arena of its own up to that limit:
/// the async workers, the group commit's committer and the blocking threads
/// of retried prepares and start-up. Each arena holds freed memory behind
/// (measured when every prepare ran on a blocking thread of its own: on the
/// benchmark's node 1 MiB of resident size idle, 1.7 MiB with 1000 claims,
/// against the default of 16 arenas there). Two arenas keep two threads
/// allocating at once.
pub const MALLOC_ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]; call before any thread
/// is started. An operator's `MALLOC_ARENA_MAX` in the environment is left
/// to glibc, as are other C libraries.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: sets one of glibc's documented malloc parameters; no
        // other thread runs yet. A refusal leaves glibc's default.
        let _ = unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
    }
}

/// Run the plugin until `shutdown` is cancelled, then stop gracefully.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Shared with the fallback devices, which are built from it later.
    let topology = Arc::new(Topology::discover(&config.sysfs_root).with_context(|| {
        format!(
            "discovering the CPU topology under {}",
            config.sysfs_root.display()
        )
    })?);
    // Two owners of exclusive CPUs give one CPU to two workloads.
    let (cpu_manager_state, verdict) = crate::kubelet::kubelet_cpu_manager::check(
        &config.kubelet_root_dir,
        config.allow_kubelet_static_cpu_manager,
    );
    match verdict {
        crate::kubelet::kubelet_cpu_manager::Verdict::Proceed => {
            tracing::debug!(state = %cpu_manager_state.display(), "kubelet's CPU manager policy is none")
        }
        crate::kubelet::kubelet_cpu_manager::Verdict::Warn(warning) => tracing::warn!("{warning}"),
        crate::kubelet::kubelet_cpu_manager::Verdict::Refuse(reason) => bail!(reason),
    }
    let online = topology.online();
    if !config.reserved_cpus.is_subset(&online) {
        bail!(
            "--reserved-cpus {}: CPUs {} are not online on this node (online: {online})",
            config.reserved_cpus,
            config.reserved_cpus.difference(&online)
        );
    }
    let pcie_roots = if config.expose_pcie_roots {
        Some(discover_pcie_roots(&config, &topology)?)
    } else {
        None
    };
    let catalog = DeviceCatalog::for_modes(
        &topology,
        &config.reserved_cpus,
        config.device_mode.modes(),
        config.group_by,
    )
    .context("planning the node's devices")?;
    let allocatable = catalog.allocatable().len();
    if config.min_shared_cpus as usize >= allocatable {
        // Still served: slices, health and unprepare of claims already
        // prepared work, and each prepare says why it is refused.
        tracing::warn!(
            min_shared_cpus = config.min_shared_cpus,
            allocatable,
            "--min-shared-cpus keeps every allocatable CPU in the shared pool: every claim will be refused at prepare (lower it, or reserve fewer CPUs)"
        );
    }
    // The client is built (no request made) before anything is served, so
    // a configuration it cannot use stops the start with nothing to undo.
    let client = crate::api_client::kube_client(config.kubeconfig.as_deref()).await?;
    let store_dir = config.store_dir();
    let store: Arc<dyn AssignmentStore> = Arc::new(
        SledStore::open(&store_dir)
            .with_context(|| format!("opening the assignment store {}", store_dir.display()))?,
    );
    let metrics = Arc::new(Metrics::new());
    let tuner = Arc::new(
        NodeTuner::open(
            KernelPaths {
                procfs: config.procfs_root.clone(),
                host_root: config.sysfs_root.clone(),
                cgroup_root: config.cgroup_root.clone(),
                irqbalance_dir: config.irqbalance_dir.clone(),
            },
            config.tuning_record(),
            online.clone(),
            catalog.allocatable(),
            config.low_latency_tuning,
        )
        .context("reading the tuning record")?,
    );
    if config.low_latency_tuning {
        tracing::info!(support = ?tuner.support(), "low-latency tuning this node can honour");
    }
    // The devices this node may publish, in every mode it may publish:
    // one copy, shared by the publisher and the device metadata.
    let build_devices = {
        let topology = topology.clone();
        let pcie_roots = pcie_roots.clone();
        let support = tuner.support().clone();
        let low_latency_tuning = config.low_latency_tuning;
        move |options: &DeviceOptions| {
            let (devices, left_out) = node_devices(
                options,
                &topology,
                pcie_roots.as_ref(),
                low_latency_tuning.then_some(&support),
            )?;
            for LeftOutRoots { device, roots } in left_out {
                tracing::warn!(%device, ?roots, "PCIe roots left out of {ATTR_PCIE_ROOT}: the device has no room for more attribute values");
            }
            anyhow::Ok(devices)
        }
    };
    let desired = Arc::new(match config.device_mode.modes() {
        [preferred, fallback @ ..] => DesiredDevices {
            devices: build_devices(&device_options(&config, *preferred))?,
            without_consumable_capacity: match fallback.first() {
                Some(&mode) => {
                    // Built when a server first needs them. The catalog
                    // planned them above from the same topology and
                    // reserved CPUs, so a node that cannot have them has
                    // failed its start already.
                    let options = device_options(&config, mode);
                    Some(Arc::new(FallbackDevices::lazy(move || {
                        build_devices(&options).map_err(FallbackBuildError::from)
                    })))
                }
                None => None,
            },
        },
        [] => DesiredDevices::default(),
    });
    let device_metadata = if config.device_metadata {
        // Files an earlier start left in the default place are mounted by
        // no future container once the specs name the configured one.
        let default_root = crate::device_metadata::default_host_root(&config.plugin_data_dir());
        if default_root != config.device_metadata_dir
            && crate::device_metadata::host_files::remove_all(&default_root)
                .context("removing device metadata files from their earlier directory")?
        {
            tracing::info!(
                from = %default_root.display(),
                to = %config.device_metadata_dir.display(),
                "device metadata moved: removed the files of the earlier directory"
            );
        }
        Some(DeviceMetadata::new(
            &config.driver_name,
            &config.device_metadata_dir,
            // The attributes as published (PCIe roots included).
            PublishedAttributes::of(desired.clone()),
            catalog
                .devices()
                .map(|(name, cpus)| (name.to_string(), cpus.clone()))
                .collect(),
        ))
    } else {
        if crate::device_metadata::host_files::remove_all(&config.device_metadata_dir)
            .context("removing device metadata files (--disable-device-metadata)")?
        {
            tracing::info!("device metadata is off: removed the files written while it was on");
        }
        None
    };
    let driver = Arc::new(
        Driver::open(
            DriverOptions {
                driver_name: config.driver_name.clone(),
                node_name: config.node_name.clone(),
                reserved: config.reserved_cpus.clone(),
                policy: config.allocation_policy,
                mixed_allocation_mode: config.mixed_allocation_mode,
                min_shared_cpus: config.min_shared_cpus,
            },
            catalog,
            &topology,
            store,
            CdiDir::new(&config.cdi_dir),
            metrics.clone(),
        )
        .context("loading prepared claims")?
        .with_device_metadata(device_metadata)
        .with_online_cpus(config.sysfs_root.clone())
        .with_tuner(tuner.clone()),
    );
    // Not fatal: the claims' CPUs are right without it, the record keeps
    // what is to be put back, and the repair pass retries.
    match driver.reconcile_tuning() {
        Ok(tuned) if tuned != Default::default() => tracing::info!(
            tuned = tuned.tuned, restored = tuned.restored, unmovable_irqs = ?tuned.unmovable_irqs,
            "node tuning reconciled with the store"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "tuning the node for the stored claims (and putting back what no claim holds) failed; retried every {TUNING_REPAIR_PERIOD:?}")
        }
    }
    let plan = driver
        .reconcile_cdi()
        .context("reconciling the CDI directory and device metadata with the store")?;
    tracing::info!(
        claims = driver.snapshot().claims.len(),
        revision = driver.revision(),
        rewritten = plan.cdi.write.len(),
        removed = plan.cdi.remove.len(),
        metadata_rewritten = plan.metadata.write.len(),
        metadata_removed = plan.metadata.remove.len(),
        "state loaded"
    );

    let health = Arc::new(Health {
        store: driver.store_fault().clone(),
        ..Health::default()
    });
    // Everything but registration stops on this one, after registration.
    let stop = CancellationToken::new();

    // Where prepares read their claims, and the coordination service a
    // claim's reservedFor for a pod that came after the claim's prepare.
    let claims: Arc<dyn ClaimSource> = Arc::new(KubeClaims::new(client.clone()));
    // Coordination: served from the store, and from the API server only for
    // a pod a claim's record does not name.
    let coordination_socket = config.coordination_socket.clone();
    let listener = bind_unix(&coordination_socket, OWNER_ONLY_SOCKET_MODE)
        .context("binding the coordination socket")?;
    let policy = PeerPolicy::allow_uids(config.coordination_allowed_uids.iter().copied());
    let coordination = tokio::spawn(
        Server::builder()
            .add_service(CoordinationServer::new(
                CoordinationService::new(driver.clone(), DEFAULT_HEARTBEAT, stop.clone())
                    .with_claims(claims.clone()),
            ))
            .serve_with_incoming_shutdown(
                incoming_with_peer_check(listener, policy),
                stop.clone().cancelled_owned(),
            ),
    );

    // Metrics, /healthz, /readyz.
    let http = crate::http::serve(
        config.metrics_address,
        metrics.clone(),
        health.clone(),
        stop.clone().cancelled_owned(),
    )
    .await
    .with_context(|| format!("binding the metrics address {}", config.metrics_address))?;

    // Kubelet DRA services.
    let service = DraService::new(driver.clone(), claims).with_claim_status(
        crate::claim_status::ClaimStatusWriter::new(
            Arc::new(crate::claim_status::KubeClaimStatus::new(client.clone())),
            &config.driver_name,
            metrics.claim_status.clone(),
        ),
        crate::claim_status::CpuPlaces::of(&topology),
    );
    let dra_socket = config.dra_socket();
    // Kubelet runs as root; nobody else has business on this socket.
    let listener =
        bind_unix(&dra_socket, OWNER_ONLY_SOCKET_MODE).context("binding the DRA socket")?;
    // Device health, in both versions kubelets call.
    let device_health = crate::kubelet::device_health::Health::new(
        config.node_name.clone(),
        driver
            .catalog()
            .devices()
            .map(|(name, cpus)| (name.to_string(), cpus.clone()))
            .collect(),
        config.sysfs_root.clone(),
        HealthTiming::default(),
        stop.clone(),
    );
    let dra = tokio::spawn(
        Server::builder()
            .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(DraV1(
                service.clone(),
            )))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
                DraV1beta1(service),
            ))
            .add_service(
                health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                    device_health.clone(),
                ),
            )
            .add_service(
                health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                    device_health,
                ),
            )
            .serve_with_incoming_shutdown(
                incoming_for_kubelet(listener, kubelet_peers()),
                stop.clone().cancelled_owned(),
            ),
    );

    // Registration last: its socket appearing is what makes kubelet call.
    let registration_socket = config.registration_socket();
    let registration_stop = CancellationToken::new();
    let listener = bind_unix(&registration_socket, OWNER_ONLY_SOCKET_MODE)
        .context("binding the registration socket")?;
    let registrar = Registrar::new(
        config.driver_name.clone(),
        dra_socket.clone(),
        health.registration.clone(),
    );
    let registration = tokio::spawn(
        Server::builder()
            .add_service(registration::registration_server::RegistrationServer::new(
                registrar,
            ))
            .serve_with_incoming_shutdown(
                incoming_for_kubelet(listener, kubelet_peers()),
                registration_stop.clone().cancelled_owned(),
            ),
    );

    // ResourceSlices, in the background: the API server may be away.
    let (_devices_tx, devices_rx) = watch::channel(desired);
    let publisher = tokio::spawn(
        Publisher::new(client.clone(), &config.driver_name, &config.node_name)
            .with_reporting(health.publishing.clone(), metrics.clone())
            .run(devices_rx, stop.clone().cancelled_owned()),
    );

    let repair = tokio::spawn(repair_tuning(tuner.clone(), stop.clone()));
    let online_cpus = tokio::spawn(follow_online_cpus(driver.clone(), stop.clone()));
    // Whether `helm uninstall` removes this plugin (see tuning::owner).
    let uninstalled = Arc::new(AtomicBool::new(false));
    let owner_watch = match (&config.daemonset, config.low_latency_tuning) {
        (Some(owner), true) => Some(tokio::spawn(crate::tuning::owner::watch(
            client.clone(),
            owner.clone(),
            uninstalled.clone(),
            stop.clone(),
        ))),
        _ => None,
    };

    health.serving.store(true, Ordering::Relaxed);
    tracing::info!(
        driver = %config.driver_name, node = %config.node_name,
        registration = %registration_socket.display(), endpoint = %dra_socket.display(),
        coordination = %coordination_socket.display(), "dra-plugin serving"
    );

    shutdown.cancelled().await;
    tracing::info!("shutting down");
    health.serving.store(false, Ordering::Relaxed);
    // Kubelet first: no new work once the registration socket is gone.
    registration_stop.cancel();
    remove_sockets(&[&registration_socket]);
    let _ = join_server("registration", registration).await;
    stop.cancel();
    // Graceful: the DRA server finishes requests in flight before returning.
    let dra_result = join_server("DRA", dra).await;
    let coordination_result = join_server("coordination", coordination).await;
    let _ = publisher.await;
    let _ = repair.await;
    let _ = online_cpus.await;
    if let Some(watch) = owner_watch {
        let _ = watch.await;
    }
    let _ = http.await;
    remove_sockets(&[&dra_socket, &coordination_socket]);
    if uninstalled.load(Ordering::SeqCst) {
        // No kubelet call will unprepare the claims tuned here once the
        // driver is gone: their tuning goes with it. A later install tunes
        // the claims still stored again at its start.
        match tokio::task::spawn_blocking(move || tuner.reconcile(Vec::new())).await {
            Ok(Ok(pass)) => tracing::info!(
                restored = pass.restored,
                "the driver is being removed: the node's tuning is put back"
            ),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the driver is being removed, but putting the node's tuning back failed")
            }
            Err(e) => tracing::error!(error = %e, "putting the node's tuning back failed"),
        }
    }
    dra_result.and(coordination_result)
}

/// Reads the node's online CPUs as often as device health does, and lets
/// the driver tell nri-plugin when they changed (see
/// [`Driver::follow_online_cpus`]): a CPU going offline leaves the shared
/// pool of running containers within about a second, before the kernel
/// refuses (on cgroup v1) a cpuset that names it.
async fn follow_online_cpus(driver: Arc<Driver>, stop: CancellationToken) {
    // The state lock may be held across a CDI spec write.
    every_period_on_a_blocking_thread(
        HealthTiming::default().poll_every,
        stop,
        move || driver.follow_online_cpus(),
        |done| {
            if let Err(e) = done {
                tracing::error!(error = %e, "reading the online CPUs failed");
            }
        },
    )
    .await
}

/// Runs `work` every `period` until `stop`, each time on a blocking thread
/// (it waits on locks or files, which an async worker must not), and hands
/// what it returned, or how its task failed, to `report`. A pass that
/// overruns the period delays the next instead of bunching them.
async fn every_period_on_a_blocking_thread<T: Send + 'static>(
    period: std::time::Duration,
    stop: CancellationToken,
    work: impl Fn() -> T + Clone + Send + 'static,
    report: impl Fn(Result<T, tokio::task::JoinError>),
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        report(tokio::task::spawn_blocking(work.clone()).await);
    }
}

/// How often the node's tuning is checked against what the claims want.
pub const TUNING_REPAIR_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Sets back, every [`TUNING_REPAIR_PERIOD`], tuning something else undid
/// (an irqbalance moving interrupts back onto tuned CPUs), tunes interrupts
/// that appeared since, and retries what a failed unprepare left.
async fn repair_tuning(tuner: Arc<NodeTuner>, stop: CancellationToken) {
    every_period_on_a_blocking_thread(
        TUNING_REPAIR_PERIOD,
        stop,
        move || tuner.repair(),
        |done| match done {
            Ok(Ok(pass)) if pass.tuned + pass.restored > 0 => tracing::warn!(
                tuned = pass.tuned,
                restored = pass.restored,
                "node tuning had drifted from the claims' and was set again"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "repairing the node's tuning failed"),
            Err(e) => tracing::error!(error = %e, "the tuning repair task failed"),
        },
    )
    .await
}

async fn join_server(
    name: &str,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) -> anyhow::Result<()> {
    match task.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context(format!("the {name} server failed"))),
        Err(e) => Err(anyhow::anyhow!("the {name} server task failed: {e}")),
    }
}

/// The devices this node publishes in `mode`, and the PCIe roots that found
/// no room on them.
fn node_devices(
    options: &DeviceOptions,
    topology: &Topology,
    pcie_roots: Option<&PcieRoots>,
    tuning: Option<&NodeSupport>,
) -> anyhow::Result<(Vec<Device>, Vec<LeftOutRoots>)> {
    let (mut devices, left_out) = devices_with_pcie_roots(topology, options, pcie_roots)
        .with_context(|| format!("building the node's {} devices", options.mode))?;
    if let Some(tuning) = tuning {
        let without = add_tuning_attributes(&mut devices, tuning);
        if !without.is_empty() {
            tracing::warn!(devices = ?without, "no room for the tuning attributes on these devices (their PCIe roots filled the attribute limits)");
        }
    }
    Ok((devices, left_out))
}

/// How the node's devices in `mode` are cut, as configured.
fn device_options(config: &Config, mode: DeviceMode) -> DeviceOptions {
    DeviceOptions {
        mode,
        group_by: config.group_by,
        reserved: config.reserved_cpus.clone(),
        node_allocatable_mapping: config.node_allocatable_mapping,
    }
}

/// Paths the daemon creates, for tests and for `inspect`.
pub fn sockets(config: &Config) -> [PathBuf; 3] {
    [
        config.registration_socket(),
        config.dra_socket(),
        config.coordination_socket.clone(),
    ]
}

/// Arguments of `dra-plugin run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// YAML config file; its keys are the flag names. Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: crate::settings::Settings,
}

impl RunArgs {
    /// Flags over the config file over defaults.
    pub fn resolve(self) -> anyhow::Result<Config> {
        let file = match &self.config {
            Some(path) => crate::config::load_file(path)?,
            None => crate::settings::Settings::default(),
        };
        let env_node = std::env::var(crate::config::NODE_NAME_ENV).ok();
        Ok(self.settings.or(file).resolve(env_node)?)
    }
}
