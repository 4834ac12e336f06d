//! What the inspect grid marks each CPU with: reserved, shared, the key of
//! the claim holding it, an overlap of two claims (a bug worth seeing) or
//! unknown, and the colour of each mark.

use super::node_state::NodeState;
use shared_state::topology::Topology;
use std::collections::BTreeMap;

/// Keys of the first claims, in order of their lowest CPU; later claims
/// share [`MORE_CLAIMS_MARK`].
pub(super) const CLAIM_KEYS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
pub(super) const MORE_CLAIMS_MARK: char = '+';
pub(super) const RESERVED_MARK: char = '=';
pub(super) const SHARED_MARK: char = '.';
/// A CPU two claims hold: the daemon never hands a CPU out twice, so this
/// is a bug worth seeing.
pub(super) const OVERLAP_MARK: char = '!';
/// An online CPU the daemon neither allocates nor reserves (it came online
/// after the daemon read the topology).
pub(super) const UNKNOWN_MARK: char = '?';

/// Colours cycled over claim keys (red, green, yellow, blue, magenta, cyan).
const CLAIM_COLOURS: [u8; 6] = [31, 32, 33, 34, 35, 36];

/// The mark of each CPU, and the key of each claim.
pub(super) struct Marks {
    pub by_cpu: BTreeMap<u32, Mark>,
    /// Claims in key order, with their key.
    pub keyed: Vec<(Mark, usize)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    Reserved,
    Shared,
    Claim(char, usize),
    Overlap,
    Unknown,
}

impl Mark {
    pub fn char(self) -> char {
        match self {
            Mark::Reserved => RESERVED_MARK,
            Mark::Shared => SHARED_MARK,
            Mark::Claim(c, _) => c,
            Mark::Overlap => OVERLAP_MARK,
            Mark::Unknown => UNKNOWN_MARK,
        }
    }

    /// The ANSI SGR code of this mark, if it has a colour.
    pub fn sgr(self) -> Option<String> {
        match self {
            Mark::Reserved => Some("2".into()),
            Mark::Shared => None,
            Mark::Claim(_, n) => Some(format!("1;{}", CLAIM_COLOURS[n % CLAIM_COLOURS.len()])),
            Mark::Overlap | Mark::Unknown => Some("1;7;31".into()),
        }
    }

    pub fn paint(self, text: &str, colour: bool) -> String {
        match (colour, self.sgr()) {
            (true, Some(code)) => format!("\x1b[{code}m{text}\x1b[0m"),
            _ => text.to_string(),
        }
    }
}

pub(super) fn marks(topology: &Topology, state: &NodeState) -> Marks {
    // Keys follow the claims' lowest CPU, so the grid reads A, B, C from
    // the first socket on; claims without CPUs go last.
    let mut order: Vec<usize> = (0..state.claims.len()).collect();
    order.sort_by_key(|&i| {
        (
            state.claims[i].cpus.first().unwrap_or(u32::MAX),
            state.claims[i].uid.clone(),
        )
    });
    let mut keyed = Vec::with_capacity(order.len());
    let mut holder: BTreeMap<u32, Mark> = BTreeMap::new();
    for (n, &i) in order.iter().enumerate() {
        let key = CLAIM_KEYS
            .get(n)
            .map(|&b| char::from(b))
            .unwrap_or(MORE_CLAIMS_MARK);
        let mark = Mark::Claim(key, n);
        keyed.push((mark, i));
        for cpu in &state.claims[i].cpus {
            holder
                .entry(cpu)
                .and_modify(|m| *m = Mark::Overlap)
                .or_insert(mark);
        }
    }
    let mut by_cpu = BTreeMap::new();
    for cpu in topology.cpus.iter().map(|c| c.id) {
        let mark = if let Some(m) = holder.get(&cpu) {
            *m
        } else if state.reserved.contains(cpu) {
            Mark::Reserved
        } else if state.allocatable.contains(cpu) {
            Mark::Shared
        } else {
            Mark::Unknown
        };
        by_cpu.insert(cpu, mark);
    }
    Marks { by_cpu, keyed }
}
