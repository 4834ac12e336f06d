//! `dra-plugin inspect`: the prepared claims, the pools and the revision.
//!
//! While the daemon runs, sled's lock keeps anyone else out of the store,
//! so the state is read through the coordination socket (the snapshot a
//! subscriber gets first). When the daemon is stopped the store is opened
//! directly; nothing is written to its records.

use crate::config::{COORDINATION_SOCKET_NAME, DEFAULT_STATE_DIR, STORE_DIR_NAME};
use anyhow::Context;
use clap::Args;
use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::transport::connect_unix;
use serde::Serialize;
use shared_state::store::{AssignmentStore, SledStore};
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// How long to wait for the daemon's first answer before reading the store.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The daemon's state directory (store and coordination socket).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The coordination socket; `<state-dir>/coordination.sock` by default.
    #[arg(long)]
    pub coordination_socket: Option<PathBuf>,
    /// Read the store even if the daemon answers on the socket.
    #[arg(long)]
    pub from_store: bool,
    /// For the pools when reading the store: the sysfs root of this node.
    #[arg(long, env = "HOST_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// For the pools when reading the store: the daemon's --reserved-cpus.
    #[arg(long, default_value = "")]
    pub reserved_cpus: CpuSet,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub consumer_pods: Vec<String>,
    pub cpus: String,
    pub prepared_at_unix_ms: u64,
}

/// What `inspect` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateReport {
    /// `socket` (the running daemon answered) or `store`.
    pub source: &'static str,
    pub revision: u64,
    pub allocatable: String,
    pub reserved: String,
    pub exclusive: String,
    pub shared: String,
    pub claims: Vec<ClaimView>,
}

impl StateReport {
    fn new(
        source: &'static str,
        revision: u64,
        allocatable: CpuSet,
        reserved: CpuSet,
        claims: Vec<ClaimView>,
        cpus: Vec<CpuSet>,
    ) -> StateReport {
        let exclusive = cpus.iter().fold(CpuSet::new(), |acc, c| acc.union(c));
        StateReport {
            source,
            revision,
            shared: shared_state::pool::shared_pool(&allocatable, &exclusive).to_cpulist(),
            allocatable: allocatable.to_cpulist(),
            reserved: reserved.to_cpulist(),
            exclusive: exclusive.to_cpulist(),
            claims,
        }
    }
}

/// The first Watch event of the daemon: its snapshot.
pub async fn from_socket(socket: &std::path::Path) -> anyhow::Result<StateReport> {
    let channel = connect_unix(socket).await?;
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    let mut stream = client
        .watch(coord::WatchRequest {
            from_revision: 0,
            subscriber: "dra-plugin inspect".into(),
        })
        .await
        .context("Watch")?
        .into_inner();
    let first = stream
        .message()
        .await
        .context("reading the snapshot")?
        .and_then(|e| e.event);
    let Some(coord::watch_event::Event::Snapshot(snapshot)) = first else {
        anyhow::bail!("the daemon's first event is not a snapshot");
    };
    let parse = |what: &str, list: &str| {
        CpuSet::parse_cpulist(list)
            .with_context(|| format!("the daemon sent a bad {what} {list:?}"))
    };
    let mut claims = Vec::new();
    let mut cpus = Vec::new();
    for c in snapshot.claims {
        cpus.push(parse("claim cpulist", &c.cpus)?);
        claims.push(ClaimView {
            uid: c.uid,
            namespace: c.namespace,
            name: c.name,
            consumer_pods: c.consumer_pod_uids,
            cpus: c.cpus,
            prepared_at_unix_ms: c.prepared_at_unix_ms,
        });
    }
    Ok(StateReport::new(
        "socket",
        snapshot.revision,
        parse("allocatable cpulist", &snapshot.allocatable)?,
        parse("reserved cpulist", &snapshot.reserved)?,
        claims,
        cpus,
    ))
}

/// Read the stopped daemon's store.
pub fn from_store(args: &InspectArgs) -> anyhow::Result<StateReport> {
    let dir = args.state_dir.join(STORE_DIR_NAME);
    if !dir.exists() {
        anyhow::bail!("no store at {}", dir.display());
    }
    let store =
        SledStore::open(&dir).with_context(|| format!("opening the store {}", dir.display()))?;
    let records = store.list()?;
    let revision = store.revision()?;
    let allocatable = match Topology::discover(&args.sysfs_root) {
        Ok(topology) => topology.online().difference(&args.reserved_cpus),
        Err(e) => {
            tracing::warn!(error = %e, "cannot discover the topology; pools are left empty");
            CpuSet::new()
        }
    };
    let cpus = records.iter().map(|r| r.cpus.clone()).collect();
    let claims = records
        .into_iter()
        .map(|r| ClaimView {
            uid: r.claim_uid,
            namespace: r.namespace,
            name: r.name,
            consumer_pods: r.consumer_pods,
            cpus: r.cpus.to_cpulist(),
            prepared_at_unix_ms: r.prepared_at_unix_ms,
        })
        .collect();
    Ok(StateReport::new(
        "store",
        revision,
        allocatable,
        args.reserved_cpus.clone(),
        claims,
        cpus,
    ))
}

/// `dra-plugin inspect`.
pub fn inspect(args: &InspectArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let socket = args
        .coordination_socket
        .clone()
        .unwrap_or_else(|| args.state_dir.join(COORDINATION_SOCKET_NAME));
    let live = if args.from_store || !socket.exists() {
        None
    } else {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a runtime")?;
        match runtime
            .block_on(async { tokio::time::timeout(SOCKET_TIMEOUT, from_socket(&socket)).await })
        {
            Ok(Ok(report)) => Some(report),
            Ok(Err(e)) => {
                eprintln!(
                    "the daemon does not answer on {} ({e:#}); reading the store",
                    socket.display()
                );
                None
            }
            Err(_) => {
                eprintln!(
                    "the daemon did not answer on {} within {SOCKET_TIMEOUT:?}; reading the store",
                    socket.display()
                );
                None
            }
        }
    };
    let report = match live {
        Some(report) => report,
        None => from_store(args)?,
    };
    serde_json::to_writer_pretty(&mut *out, &report)?;
    writeln!(out)?;
    Ok(())
}
