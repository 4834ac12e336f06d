//! `dra-plugin inspect --format table`: the node's CPUs as a grid a person
//! reads at a glance, by socket, NUMA node and physical core, each CPU
//! marked reserved, shared or with the key of the claim holding it.
//!
//! Pure rendering over plain data: the caller discovers the topology and
//! reads the daemon's state; this module only turns them into text.
//!
//! Two layouts:
//! - `full` (machines up to [`FULL_LAYOUT_MAX_CPUS`] online CPUs): every CPU
//!   with its id and mark, SMT siblings side by side in one `[...]` cell,
//!   eight cores a row.
//! - `compact` (bigger machines): one character a CPU, siblings adjacent,
//!   32 cores a row, each row labelled with the cpulist of its CPUs. A
//!   1024-CPU, 2-socket SMT machine then takes 16 grid rows instead of the
//!   64 the full layout needs, so a `--watch` frame still fits one terminal
//!   screen and redraws in place instead of scrolling: the whole page is 32
//!   lines of at most 117 columns (a row of 32 two-thread cores is 95
//!   characters plus its label). Core boundaries stay visible (a space
//!   between cores), which is what shows a half-used core.

use super::inspect_marks::{marks, Mark, Marks};
use super::node_state::NodeState;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Above this many online CPUs, `auto` picks the compact layout.
pub const FULL_LAYOUT_MAX_CPUS: usize = 256;
const FULL_CORES_PER_ROW: usize = 8;
const COMPACT_CORES_PER_ROW: usize = 32;

/// How the grid is laid out; `Auto` chooses by the number of online CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    Auto,
    Full,
    Compact,
}

/// What the grid shows besides the daemon's state.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub layout: Layout,
    /// ANSI colours for claim keys and marks.
    pub colour: bool,
}

/// Whether to colour: only on a terminal, and never with `NO_COLOR` set to
/// anything non-empty (<https://no-color.org>).
pub fn use_colour(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The whole page: header, grid, legend.
///
/// `offline` holds the CPUs sysfs lists as present but not online; the
/// kernel gives no topology for them, so they are listed, not placed.
pub fn render(topology: &Topology, offline: &CpuSet, state: &NodeState, style: Style) -> String {
    let online = topology.online();
    let layout = match style.layout {
        Layout::Auto if online.len() > FULL_LAYOUT_MAX_CPUS => Layout::Compact,
        Layout::Auto => Layout::Full,
        other => other,
    };
    let marks = marks(topology, state);
    let held: CpuSet = state
        .claims
        .iter()
        .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus));
    let shared = state.allocatable.difference(&held);
    // CPUs the daemon counts but the kernel no longer has online.
    let gone = state
        .allocatable
        .union(&state.reserved)
        .union(&held)
        .difference(&online);
    let offline = offline.union(&gone);

    let mut out = String::new();
    let source = match state.source.as_str() {
        "socket" => "the running dra-plugin",
        "store" => "the store (dra-plugin is not running)",
        other => other,
    };
    let _ = writeln!(
        out,
        "CPUs of this node, revision {}, read from {source}",
        state.revision
    );
    let _ = writeln!(
        out,
        "{} online: {} reserved, {} in {} claim{}, {} shared{}",
        online.len(),
        state.reserved.len(),
        held.len(),
        state.claims.len(),
        if state.claims.len() == 1 { "" } else { "s" },
        shared.len(),
        if offline.is_empty() {
            String::new()
        } else {
            format!("; offline: {offline}")
        },
    );
    grid(&mut out, topology, &marks, layout, style.colour);
    legend(&mut out, state, &marks, &shared, &offline, style.colour);
    out
}

/// Cores grouped by socket and NUMA node, each core's threads in id order.
fn cores_by_place(topology: &Topology) -> BTreeMap<(u32, u32), Vec<CpuSet>> {
    let mut places: BTreeMap<(u32, u32), Vec<CpuSet>> = BTreeMap::new();
    for core in topology.cores() {
        let Some(cpu) = core.first().and_then(|id| topology.cpu(id)) else {
            continue;
        };
        places.entry((cpu.socket, cpu.numa)).or_default().push(core);
    }
    places
}

fn grid(out: &mut String, topology: &Topology, marks: &Marks, layout: Layout, colour: bool) {
    let width = topology
        .cpus
        .last()
        .map(|c| c.id.to_string().len())
        .unwrap_or(1);
    let threads = topology.smt_width().max(1);
    let places = cores_by_place(topology);
    let per_row = match layout {
        Layout::Compact => COMPACT_CORES_PER_ROW,
        _ => FULL_CORES_PER_ROW,
    };
    // One label width for the whole machine, so every row's cells line up.
    let label_width = match layout {
        Layout::Compact => places
            .values()
            .flat_map(|cores| cores.chunks(per_row))
            .map(|row| row_cpus(row).to_string().len())
            .max()
            .unwrap_or(0),
        _ => 0,
    };
    let mut last_socket = None;
    for ((socket, numa), cores) in places {
        if last_socket != Some(socket) {
            let _ = writeln!(out, "\nsocket {socket}");
            last_socket = Some(socket);
        }
        let cpus: CpuSet = cores.iter().fold(CpuSet::new(), |acc, c| acc.union(c));
        let _ = writeln!(out, "  NUMA node {numa}: CPUs {cpus} ({})", cpus.len());
        for row in cores.chunks(per_row) {
            let cells: Vec<String> = row
                .iter()
                .map(|core| cell(core, marks, layout, width, threads, colour))
                .collect();
            let line = match layout {
                Layout::Compact => format!(
                    "    {:>label_width$}  {}",
                    row_cpus(row).to_string(),
                    cells.join(" ")
                ),
                _ => format!("    {}", cells.join(" ")),
            };
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
}

fn row_cpus(row: &[CpuSet]) -> CpuSet {
    row.iter().fold(CpuSet::new(), |acc, c| acc.union(c))
}

/// One physical core: `[ 1A  9A]` (full) or `AA` (compact), padded to the
/// machine's widest core so columns line up on hybrid parts.
fn cell(
    core: &CpuSet,
    marks: &Marks,
    layout: Layout,
    width: usize,
    threads: usize,
    colour: bool,
) -> String {
    let mut parts = Vec::with_capacity(threads);
    for cpu in core {
        let mark = marks.by_cpu.get(&cpu).copied().unwrap_or(Mark::Unknown);
        let text = match layout {
            Layout::Compact => mark.char().to_string(),
            _ => format!("{cpu:>width$}{}", mark.char()),
        };
        parts.push(mark.paint(&text, colour));
    }
    let blank = match layout {
        Layout::Compact => " ".to_string(),
        _ => " ".repeat(width + 1),
    };
    while parts.len() < threads {
        parts.push(blank.clone());
    }
    match layout {
        Layout::Compact => parts.concat(),
        _ => format!("[{}]", parts.join(" ")),
    }
}

fn legend(
    out: &mut String,
    state: &NodeState,
    marks: &Marks,
    shared: &CpuSet,
    offline: &CpuSet,
    colour: bool,
) {
    let _ = writeln!(out);
    let line = |out: &mut String, mark: Mark, text: &str| {
        let _ = writeln!(
            out,
            "  {}  {text}",
            mark.paint(&mark.char().to_string(), colour)
        );
    };
    line(
        out,
        Mark::Reserved,
        &format!(
            "reserved for system daemons: {}",
            list_or_none(&state.reserved)
        ),
    );
    line(
        out,
        Mark::Shared,
        &format!("shared pool: {}", list_or_none(shared)),
    );
    let overlap: Vec<u32> = marks
        .by_cpu
        .iter()
        .filter(|(_, m)| **m == Mark::Overlap)
        .map(|(cpu, _)| *cpu)
        .collect();
    if !overlap.is_empty() {
        let set: CpuSet = overlap.into_iter().collect();
        line(
            out,
            Mark::Overlap,
            &format!("held by two claims (a bug, please report it): {set}"),
        );
    }
    let unknown: CpuSet = marks
        .by_cpu
        .iter()
        .filter(|(_, m)| **m == Mark::Unknown)
        .map(|(cpu, _)| *cpu)
        .collect();
    if !unknown.is_empty() {
        line(
            out,
            Mark::Unknown,
            &format!("online but unknown to dra-plugin (came online after it started): {unknown}"),
        );
    }
    for (mark, i) in &marks.keyed {
        let claim = &state.claims[*i];
        let pods = match claim.pods.as_slice() {
            [] => "no pod".to_string(),
            [one] => format!("pod {one}"),
            many => format!("pods {}", many.join(",")),
        };
        let gone = claim.cpus.intersection(offline);
        let gone = if gone.is_empty() {
            String::new()
        } else {
            format!(", offline: {gone}")
        };
        line(
            out,
            *mark,
            &format!(
                "{}/{}  CPUs {} ({}{gone})  {pods}  claim {}  prepared {}",
                claim.namespace,
                claim.name,
                claim.cpus,
                claim.cpus.len(),
                claim.uid,
                utc_time(claim.prepared_at_unix_ms),
            ),
        );
    }
    // dra-plugin records claims and the pods they are reserved for;
    // containers exist only in nri-plugin's memory.
    let _ = writeln!(
        out,
        "Containers are not shown: dra-plugin knows claims and their pods, only nri-plugin knows containers."
    );
}

fn list_or_none(set: &CpuSet) -> String {
    if set.is_empty() {
        "none".to_string()
    } else {
        format!("{set} ({})", set.len())
    }
}

/// `2026-12-03 22:40:05 UTC` from milliseconds since the Unix epoch.
pub fn utc_time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::node_state::ClaimCpus;
    use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};

    fn cs(list: &str) -> CpuSet {
        CpuSet::parse_cpulist(list).expect("cpulist")
    }

    fn claim(uid: &str, name: &str, cpus: &str, pods: &[&str]) -> ClaimCpus {
        ClaimCpus {
            uid: uid.into(),
            namespace: "default".into(),
            name: name.into(),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            cpus: cs(cpus),
            prepared_at_unix_ms: 1_796_256_005_000,
        }
    }

    /// 2 sockets, one NUMA node each, 4 cores × 2 threads; siblings N, N+8.
    fn two_socket() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    fn plain(layout: Layout) -> Style {
        Style {
            layout,
            colour: false,
        }
    }

    #[test]
    fn two_socket_numa_smt_grid() {
        let state = NodeState {
            source: "socket".into(),
            revision: 7,
            allocatable: cs("1-7,9-15"),
            reserved: cs("0,8"),
            claims: vec![
                claim("uid-b", "batch", "4,12", &["pod-2"]),
                claim("uid-w", "web", "1-2,9-10", &["pod-1"]),
            ],
        };
        let text = render(&two_socket(), &CpuSet::new(), &state, plain(Layout::Auto));
        let expected = "\
CPUs of this node, revision 7, read from the running dra-plugin
16 online: 2 reserved, 6 in 2 claims, 8 shared

socket 0
  NUMA node 0: CPUs 0-3,8-11 (8)
    [ 0=  8=] [ 1A  9A] [ 2A 10A] [ 3. 11.]

socket 1
  NUMA node 1: CPUs 4-7,12-15 (8)
    [ 4B 12B] [ 5. 13.] [ 6. 14.] [ 7. 15.]

  =  reserved for system daemons: 0,8 (2)
  .  shared pool: 3,5-7,11,13-15 (8)
  A  default/web  CPUs 1-2,9-10 (4)  pod pod-1  claim uid-w  prepared 2026-12-03 00:00:05 UTC
  B  default/batch  CPUs 4,12 (2)  pod pod-2  claim uid-b  prepared 2026-12-03 00:00:05 UTC
Containers are not shown: dra-plugin knows claims and their pods, only nri-plugin knows containers.
";
        assert_eq!(text, expected, "\n{text}");
    }

    /// The VM node's shape (`scripts/vm-node.sh` defaults): 2 sockets × 2
    /// cores × 2 threads, one NUMA node per socket, siblings adjacent.
    #[test]
    fn vm_node_grid() {
        let topology = build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 2,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        let state = NodeState {
            source: "socket".into(),
            revision: 2,
            allocatable: cs("1-7"),
            reserved: cs("0"),
            claims: vec![claim("c1", "rt", "4-5", &["pod-rt"])],
        };
        let text = render(&topology, &CpuSet::new(), &state, plain(Layout::Auto));
        let grid = "
socket 0
  NUMA node 0: CPUs 0-3 (4)
    [0= 1.] [2. 3.]

socket 1
  NUMA node 1: CPUs 4-7 (4)
    [4A 5A] [6. 7.]
";
        assert!(text.contains(grid), "\n{text}");
        assert!(text.starts_with("CPUs of this node, revision 2, read from the running dra-plugin\n8 online: 1 reserved, 2 in 1 claim, 5 shared\n"), "\n{text}");
    }

    #[test]
    fn offline_unknown_and_overlapping_cpus_are_called_out() {
        let mut topology = two_socket();
        // CPU 15 came online after the daemon read the topology; CPU 16 is
        // one the daemon counts but the kernel took offline.
        let state = NodeState {
            source: "store".into(),
            revision: 3,
            allocatable: cs("0-14,16"),
            reserved: CpuSet::new(),
            claims: vec![
                claim("u1", "a", "1,16", &[]),
                claim("u2", "b", "1,2", &["p1", "p2"]),
            ],
        };
        topology.isolated = CpuSet::new();
        let text = render(&topology, &cs("17"), &state, plain(Layout::Full));
        let expected = "\
CPUs of this node, revision 3, read from the store (dra-plugin is not running)
16 online: 0 reserved, 3 in 2 claims, 13 shared; offline: 16-17

socket 0
  NUMA node 0: CPUs 0-3,8-11 (8)
    [ 0.  8.] [ 1!  9.] [ 2B 10.] [ 3. 11.]

socket 1
  NUMA node 1: CPUs 4-7,12-15 (8)
    [ 4. 12.] [ 5. 13.] [ 6. 14.] [ 7. 15?]

  =  reserved for system daemons: none
  .  shared pool: 0,3-14 (13)
  !  held by two claims (a bug, please report it): 1
  ?  online but unknown to dra-plugin (came online after it started): 15
  A  default/a  CPUs 1,16 (2, offline: 16)  no pod  claim u1  prepared 2026-12-03 00:00:05 UTC
  B  default/b  CPUs 1-2 (2)  pods p1,p2  claim u2  prepared 2026-12-03 00:00:05 UTC
Containers are not shown: dra-plugin knows claims and their pods, only nri-plugin knows containers.
";
        assert_eq!(text, expected, "\n{text}");
    }

    /// 1024 CPUs: 2 sockets × 2 NUMA nodes × 128 cores × 2 threads,
    /// siblings N and N+512, as big x86 servers number them.
    #[test]
    fn a_1024_cpu_machine_stays_on_one_screen() {
        let topology = build(&Shape {
            sockets: 2,
            numa_per_socket: 2,
            l3_per_numa: 8,
            cores_per_l3: 16,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        });
        assert_eq!(topology.cpus.len(), 1024);
        let state = NodeState {
            source: "socket".into(),
            revision: 40,
            allocatable: cs("1-511,513-1023"),
            reserved: cs("0,512"),
            claims: vec![
                claim("u1", "dpdk", "1-16,513-528", &["p1"]),
                claim("u2", "trader", "300-301,812-813", &["p2"]),
            ],
        };
        let text = render(&topology, &CpuSet::new(), &state, plain(Layout::Auto));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 32, "\n{text}");
        assert_eq!(lines.iter().map(|l| l.len()).max(), Some(117), "\n{text}");
        let grid_start = "\
socket 0
  NUMA node 0: CPUs 0-127,512-639 (256)
        0-31,512-543  == AA AA AA AA AA AA AA AA AA AA AA AA AA AA AA AA .. .. .. .. .. .. .. .. .. .. .. .. .. .. ..
       32-63,544-575  .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. ..
";
        assert!(text.contains(grid_start), "\n{text}");
        let trader = "\
  NUMA node 2: CPUs 256-383,768-895 (256)
     256-287,768-799  .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. ..
     288-319,800-831  .. .. .. .. .. .. .. .. .. .. .. .. BB BB .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. .. ..
";
        assert!(text.contains(trader), "\n{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("  NUMA node"))
                .count(),
            4
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("    ") && l.contains(".."))
                .count(),
            16,
            "\n{text}"
        );
    }

    #[test]
    fn adjacent_siblings_sit_side_by_side_and_hybrid_cores_are_padded() {
        // 1 socket, 2 cores × 2 threads, adjacent numbering, then core 1
        // loses its second thread (offline): the cell keeps its width.
        let mut topology = build(&Shape {
            sockets: 1,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 2,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        topology.cpus.retain(|c| c.id != 3);
        if let Some(cpu) = topology.cpus.iter_mut().find(|c| c.id == 2) {
            cpu.siblings = cs("2");
        }
        let state = NodeState {
            source: "socket".into(),
            revision: 1,
            allocatable: cs("0-2"),
            reserved: CpuSet::new(),
            claims: vec![claim("u", "c", "2", &["p"])],
        };
        let text = render(&topology, &cs("3"), &state, plain(Layout::Full));
        assert!(text.contains("    [0. 1.] [2A   ]\n"), "\n{text}");
        let text = render(&topology, &cs("3"), &state, plain(Layout::Compact));
        assert!(text.contains("    0-2  .. A\n"), "\n{text}");
    }

    #[test]
    fn colour_only_when_asked() {
        let state = NodeState {
            source: "socket".into(),
            revision: 1,
            allocatable: cs("1-15"),
            reserved: cs("0"),
            claims: vec![claim("u", "c", "4", &["p"])],
        };
        let topology = two_socket();
        let coloured = render(
            &topology,
            &CpuSet::new(),
            &state,
            Style {
                layout: Layout::Full,
                colour: true,
            },
        );
        assert!(coloured.contains("\x1b[1;31m 4A\x1b[0m"), "{coloured:?}");
        assert!(coloured.contains("\x1b[2m 0=\x1b[0m"), "{coloured:?}");
        let plain_text = render(&topology, &CpuSet::new(), &state, plain(Layout::Full));
        assert!(!plain_text.contains('\x1b'), "{plain_text:?}");
    }

    #[test]
    fn colour_decision_follows_terminal_and_no_color() {
        use std::ffi::OsStr;
        let cases = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (false, None, false),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(
                use_colour(terminal, no_color.map(OsStr::new)),
                want,
                "{terminal} {no_color:?}"
            );
        }
    }

    #[test]
    fn more_claims_than_keys_share_the_plus_key() {
        let topology = build(&Shape {
            sockets: 1,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 64,
            threads_per_core: 1,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        let claims: Vec<ClaimCpus> = (0..54)
            .map(|i| claim(&format!("u{i:02}"), "c", &i.to_string(), &[]))
            .collect();
        let state = NodeState {
            source: "socket".into(),
            revision: 1,
            allocatable: cs("0-63"),
            reserved: CpuSet::new(),
            claims,
        };
        let text = render(&topology, &CpuSet::new(), &state, plain(Layout::Compact));
        assert!(
            text.contains(
                "     0-31  A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f\n"
            ),
            "\n{text}"
        );
        assert!(
            text.contains(
                "    32-63  g h i j k l m n o p q r s t u v w x y z + + . . . . . . . . . .\n"
            ),
            "\n{text}"
        );
        assert_eq!(text.lines().filter(|l| l.starts_with("  +  ")).count(), 2);
    }

    #[test]
    fn utc_times() {
        let cases = [
            (0, "1970-01-01 00:00:00 UTC"),
            (951_782_400_000, "2000-02-29 00:00:00 UTC"),
            (1_796_256_005_999, "2026-12-03 00:00:05 UTC"),
            (4_107_542_399_000, "2100-02-28 23:59:59 UTC"),
        ];
        for (ms, want) in cases {
            assert_eq!(utc_time(ms), want, "{ms}");
        }
    }
}
