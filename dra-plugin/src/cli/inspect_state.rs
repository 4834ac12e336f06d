//! `dra-plugin inspect`: the prepared claims, the pools and the revision,
//! as JSON or as a grid of the node's CPUs (`inspect_table`); `--watch`
//! follows the daemon's coordination stream and prints every change.
//!
//! While the daemon runs, sled's lock keeps anyone else out of the store,
//! so the state is read through the coordination socket (the snapshot a
//! subscriber gets first). When the daemon is stopped the store is opened
//! directly; nothing is written to its records.

use crate::cli::inspect_table::{self, Layout, Style};
use crate::cli::node_state::{ClaimCpus, NodeState};
use crate::config::{COORDINATION_SOCKET_NAME, DEFAULT_STATE_DIR, STORE_DIR_NAME};
use anyhow::Context;
use clap::{Args, ValueEnum};
use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_transport::connect_unix;
use serde::Serialize;
use shared_state::store::sled_store::SledStore;
use shared_state::store::AssignmentStore;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long to wait for the daemon's first answer before reading the store.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause before `--watch` subscribes again after losing the daemon.
const WATCH_RETRY: Duration = Duration::from_secs(1);
/// Clears a terminal and homes the cursor, so each frame replaces the last.
const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

/// What `inspect` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The CPUs as a grid by socket, NUMA node and core (for a person).
    Table,
    /// The state as JSON (for programs); one line per change with `--watch`.
    Json,
}

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
    /// table or json; table when stdout is a terminal, else json.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// The table's layout: full (every CPU id), compact (one character per
    /// CPU) or auto (compact above 256 online CPUs).
    #[arg(long, value_enum, default_value = "auto")]
    pub grid: Layout,
    /// Keep following the running daemon and print the state again on every
    /// prepare and unprepare, until interrupted (Ctrl-C).
    #[arg(long, conflicts_with = "from_store")]
    pub watch: bool,
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
            shared: shared_state::pool::arithmetic::shared_pool(&allocatable, &exclusive)
                .to_cpulist(),
            allocatable: allocatable.to_cpulist(),
            reserved: reserved.to_cpulist(),
            exclusive: exclusive.to_cpulist(),
            claims,
        }
    }
}

/// The daemon's state as a Watch subscriber keeps it: the snapshot, then
/// every delta applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveState {
    pub revision: u64,
    pub allocatable: CpuSet,
    pub reserved: CpuSet,
    claims: BTreeMap<String, (ClaimView, CpuSet)>,
}

fn parse_cpulist(what: &str, list: &str) -> anyhow::Result<CpuSet> {
    CpuSet::parse_cpulist(list).with_context(|| format!("the daemon sent a bad {what} {list:?}"))
}

fn claim_view(c: coord::Claim) -> anyhow::Result<(ClaimView, CpuSet)> {
    let cpus = parse_cpulist("claim cpulist", &c.cpus)?;
    Ok((
        ClaimView {
            uid: c.uid,
            namespace: c.namespace,
            name: c.name,
            consumer_pods: c.consumer_pod_uids,
            cpus: c.cpus,
            prepared_at_unix_ms: c.prepared_at_unix_ms,
        },
        cpus,
    ))
}

impl LiveState {
    /// Apply one Watch event; true when the state changed (heartbeats and
    /// repeated deltas do not).
    pub fn apply(&mut self, event: coord::watch_event::Event) -> anyhow::Result<bool> {
        use coord::watch_event::Event;
        match event {
            Event::Snapshot(snapshot) => {
                let mut claims = BTreeMap::new();
                for c in snapshot.claims {
                    let (view, cpus) = claim_view(c)?;
                    claims.insert(view.uid.clone(), (view, cpus));
                }
                *self = LiveState {
                    revision: snapshot.revision,
                    allocatable: parse_cpulist("allocatable cpulist", &snapshot.allocatable)?,
                    reserved: parse_cpulist("reserved cpulist", &snapshot.reserved)?,
                    claims,
                };
                Ok(true)
            }
            Event::ClaimPrepared(prepared) => {
                let Some(claim) = prepared.claim else {
                    anyhow::bail!(
                        "the daemon sent a prepare without its claim at revision {}",
                        prepared.revision
                    );
                };
                let (view, cpus) = claim_view(claim)?;
                let changed = self.claims.get(&view.uid) != Some(&(view.clone(), cpus.clone()))
                    || self.revision != prepared.revision;
                self.revision = prepared.revision;
                self.claims.insert(view.uid.clone(), (view, cpus));
                Ok(changed)
            }
            Event::ClaimUnprepared(unprepared) => {
                let removed = self.claims.remove(&unprepared.claim_uid).is_some();
                let changed = removed || self.revision != unprepared.revision;
                self.revision = unprepared.revision;
                Ok(changed)
            }
            Event::Heartbeat(_) => Ok(false),
        }
    }

    pub fn report(&self, source: &'static str) -> StateReport {
        let (claims, cpus) = self.claims.values().cloned().unzip();
        StateReport::new(
            source,
            self.revision,
            self.allocatable.clone(),
            self.reserved.clone(),
            claims,
            cpus,
        )
    }
}

/// Subscribe to the daemon's Watch stream.
async fn subscribe(socket: &Path) -> anyhow::Result<tonic::Streaming<coord::WatchEvent>> {
    let channel = connect_unix(socket).await?;
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    Ok(client
        .watch(coord::WatchRequest {
            from_revision: 0,
            subscriber: "dra-plugin inspect".into(),
        })
        .await
        .context("Watch")?
        .into_inner())
}

/// The first Watch event of the daemon: its snapshot.
pub async fn from_socket(socket: &Path) -> anyhow::Result<StateReport> {
    let mut stream = subscribe(socket).await?;
    let first = stream
        .message()
        .await
        .context("reading the snapshot")?
        .and_then(|e| e.event);
    let Some(snapshot @ coord::watch_event::Event::Snapshot(_)) = first else {
        anyhow::bail!("the daemon's first event is not a snapshot");
    };
    let mut state = LiveState::default();
    state.apply(snapshot)?;
    Ok(state.report("socket"))
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

/// How one state is printed.
struct Printer {
    format: Format,
    layout: Layout,
    terminal: bool,
    colour: bool,
    sysfs_root: PathBuf,
}

impl Printer {
    fn new(args: &InspectArgs) -> Printer {
        let terminal = std::io::stdout().is_terminal();
        Printer {
            format: args.format.unwrap_or(if terminal {
                Format::Table
            } else {
                Format::Json
            }),
            layout: args.grid,
            terminal,
            colour: inspect_table::use_colour(terminal, std::env::var_os("NO_COLOR").as_deref()),
            sysfs_root: args.sysfs_root.clone(),
        }
    }

    /// One frame; `watching` asks for one JSON line and a cleared screen.
    fn print(
        &self,
        report: &StateReport,
        watching: bool,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        match self.format {
            Format::Json if watching => {
                serde_json::to_writer(&mut *out, report)?;
                writeln!(out)?;
            }
            Format::Json => {
                serde_json::to_writer_pretty(&mut *out, report)?;
                writeln!(out)?;
            }
            Format::Table => {
                let page = self.table(report)?;
                if watching && self.terminal {
                    write!(out, "{CLEAR_SCREEN}")?;
                }
                write!(out, "{page}")?;
                if watching && !self.terminal {
                    // Frames in a pipe or file, one after another.
                    writeln!(out)?;
                }
            }
        }
        out.flush()?;
        Ok(())
    }

    fn table(&self, report: &StateReport) -> anyhow::Result<String> {
        let topology = Topology::discover(&self.sysfs_root).with_context(|| {
            format!(
                "discovering the CPU topology under {} for the table (set --sysfs-root or HOST_ROOT, or use --format json)",
                self.sysfs_root.display()
            )
        })?;
        let offline = present_cpus(&self.sysfs_root).difference(&topology.online());
        let state = node_state(report)?;
        Ok(inspect_table::render(
            &topology,
            &offline,
            &state,
            Style {
                layout: self.layout,
                colour: self.colour,
            },
        ))
    }
}

/// The CPUs sysfs lists as present (online or not); empty where the file
/// is missing or unreadable, which only hides offline CPUs from the table.
fn present_cpus(sysfs_root: &Path) -> CpuSet {
    std::fs::read_to_string(sysfs_root.join("sys/devices/system/cpu/present"))
        .ok()
        .and_then(|text| CpuSet::parse_cpulist(text.trim()).ok())
        .unwrap_or_default()
}

/// The table's input from a report (whose cpulists this module wrote).
pub fn node_state(report: &StateReport) -> anyhow::Result<NodeState> {
    let parse = |what: &str, list: &str| {
        CpuSet::parse_cpulist(list).with_context(|| format!("bad {what} cpulist {list:?}"))
    };
    let mut claims = Vec::with_capacity(report.claims.len());
    for c in &report.claims {
        claims.push(ClaimCpus {
            uid: c.uid.clone(),
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            pods: c.consumer_pods.clone(),
            cpus: parse("claim", &c.cpus)?,
            prepared_at_unix_ms: c.prepared_at_unix_ms,
        });
    }
    Ok(NodeState {
        source: report.source.to_string(),
        revision: report.revision,
        allocatable: parse("allocatable", &report.allocatable)?,
        reserved: parse("reserved", &report.reserved)?,
        claims,
    })
}

fn socket_path(args: &InspectArgs) -> PathBuf {
    args.coordination_socket
        .clone()
        .unwrap_or_else(|| args.state_dir.join(COORDINATION_SOCKET_NAME))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")
}

/// `dra-plugin inspect`.
pub fn inspect(args: &InspectArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let printer = Printer::new(args);
    let socket = socket_path(args);
    if args.watch {
        return runtime()?.block_on(watch(&socket, &printer, out));
    }
    let live = if args.from_store || !socket.exists() {
        None
    } else {
        match runtime()?
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
    printer.print(&report, false, out)
}

/// Follow the daemon's Watch stream, printing the state at subscription and
/// after every change, until Ctrl-C or SIGTERM. The stream is the one
/// nri-plugin subscribes to: a change is on screen as soon as it is
/// committed, and a quiet node costs nothing but heartbeats.
async fn watch(socket: &Path, printer: &Printer, out: &mut impl Write) -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let stop = async {
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("listening for Ctrl-C"),
            _ = terminate.recv() => Ok(()),
        }
    };
    tokio::pin!(stop);
    let mut state = LiveState::default();
    // The last problem reported, so a daemon that stays away is reported
    // once, not at every retry.
    let mut reported = String::new();
    loop {
        let followed = async {
            let mut stream = subscribe(socket).await?;
            reported.clear();
            while let Some(message) = stream.message().await.context("reading the stream")? {
                let Some(event) = message.event else { continue };
                if state.apply(event)? {
                    printer.print(&state.report("socket"), true, out)?;
                }
            }
            anyhow::Ok(())
        };
        let ended = tokio::select! {
            stopped = &mut stop => return stopped,
            ended = followed => ended,
        };
        // A reader that went away (`| head`) ends the watch.
        if let Err(e) = &ended {
            if e.chain().any(|cause| {
                cause
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ended;
            }
        }
        let problem = match ended {
            Ok(()) => format!(
                "the daemon closed its stream on {}; subscribing again",
                socket.display()
            ),
            Err(e) => format!(
                "no stream from the daemon on {} ({e:#}); retrying every {WATCH_RETRY:?}",
                socket.display()
            ),
        };
        if problem != reported {
            eprintln!("{problem}");
            reported = problem;
        }
        tokio::select! {
            stopped = &mut stop => return stopped,
            () = tokio::time::sleep(WATCH_RETRY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord::watch_event::Event;

    fn claim(uid: &str, cpus: &str) -> coord::Claim {
        coord::Claim {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            consumer_pod_uids: vec![format!("pod-{uid}")],
            cpus: cpus.into(),
            tuning: None,
            prepared_at_unix_ms: 5,
        }
    }

    fn snapshot(revision: u64, claims: Vec<coord::Claim>) -> Event {
        Event::Snapshot(coord::Snapshot {
            revision,
            allocatable: "1-15".into(),
            reserved: "0".into(),
            mixed_allocation_mode: false,
            claims,
        })
    }

    fn prepared(revision: u64, c: coord::Claim) -> Event {
        Event::ClaimPrepared(coord::ClaimPrepared {
            revision,
            claim: Some(c),
        })
    }

    #[test]
    fn deltas_change_the_state_and_heartbeats_do_not() {
        let mut state = LiveState::default();
        let steps: Vec<(Event, bool, u64, &str, &str)> = vec![
            (snapshot(3, vec![claim("a", "1-2")]), true, 3, "1-2", "3-15"),
            (
                Event::Heartbeat(coord::Heartbeat { revision: 3 }),
                false,
                3,
                "1-2",
                "3-15",
            ),
            (prepared(4, claim("b", "5")), true, 4, "1-2,5", "3-4,6-15"),
            // The same record again at the same revision: nothing to redraw.
            (prepared(4, claim("b", "5")), false, 4, "1-2,5", "3-4,6-15"),
            (
                Event::ClaimUnprepared(coord::ClaimUnprepared {
                    revision: 5,
                    claim_uid: "a".into(),
                }),
                true,
                5,
                "5",
                "1-4,6-15",
            ),
            (snapshot(9, vec![]), true, 9, "", "1-15"),
        ];
        for (n, (event, changed, revision, exclusive, shared)) in steps.into_iter().enumerate() {
            assert_eq!(state.apply(event).expect("apply"), changed, "step {n}");
            let report = state.report("socket");
            assert_eq!(report.revision, revision, "step {n}");
            assert_eq!(report.exclusive, exclusive, "step {n}");
            assert_eq!(report.shared, shared, "step {n}");
            assert_eq!(report.reserved, "0", "step {n}");
        }
    }

    #[test]
    fn bad_events_are_errors_naming_what_was_bad() {
        let mut state = LiveState::default();
        let err = state
            .apply(prepared(2, claim("x", "3-a")))
            .expect_err("bad cpulist");
        assert!(format!("{err:#}").contains("\"3-a\""), "{err:#}");
        let err = state
            .apply(Event::ClaimPrepared(coord::ClaimPrepared {
                revision: 2,
                claim: None,
            }))
            .expect_err("no claim");
        assert!(format!("{err:#}").contains("revision 2"), "{err:#}");
    }

    #[test]
    fn a_report_turns_back_into_the_tables_input() {
        let mut state = LiveState::default();
        state
            .apply(snapshot(3, vec![claim("a", "1-2"), claim("b", "7")]))
            .expect("apply");
        let node = node_state(&state.report("socket")).expect("node state");
        assert_eq!(node.revision, 3);
        assert_eq!(node.reserved.to_cpulist(), "0");
        assert_eq!(node.allocatable.to_cpulist(), "1-15");
        let claims: Vec<(String, String, Vec<String>)> = node
            .claims
            .iter()
            .map(|c| (c.uid.clone(), c.cpus.to_cpulist(), c.pods.clone()))
            .collect();
        assert_eq!(
            claims,
            [
                (
                    "a".to_string(),
                    "1-2".to_string(),
                    vec!["pod-a".to_string()]
                ),
                ("b".to_string(), "7".to_string(), vec!["pod-b".to_string()]),
            ]
        );
    }
}
