//! Builders shared by the unit tests of the crate: CPU sets, claims,
//! containers, a view, and a resolver answering from a table.

use std::collections::HashMap;
use std::sync::Mutex;

use shared_state::pool::Update;
use shared_state::{ClaimAssignment, CpuSet};

use crate::resolve::{ClaimResolver, Resolution};
use crate::view::{ContainerInfo, NodeView};

pub const POD_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
pub const POD_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";
pub const CLAIM_1: &str = "c1c1c1c1-0000-4000-8000-000000000001";
pub const CLAIM_2: &str = "c2c2c2c2-0000-4000-8000-000000000002";

/// The store revision of the tables' answers: newer than any view of the
/// tests has applied, so the answer decides.
pub const ANSWERED_AT: u64 = 1_000_000;

/// dra-plugin's answer: `claim` is prepared (at [`ANSWERED_AT`]).
pub fn prepared(claim: ClaimAssignment) -> Resolution {
    Resolution::Prepared {
        claim,
        revision: ANSWERED_AT,
    }
}

/// dra-plugin's answer: not prepared (at [`ANSWERED_AT`]).
pub fn not_prepared() -> Resolution {
    Resolution::NotPrepared {
        revision: ANSWERED_AT,
    }
}

pub fn set(s: &str) -> CpuSet {
    CpuSet::parse_cpulist(s).expect("cpulist")
}

pub fn claim(uid: &str, cpus: &str, pod: &str) -> ClaimAssignment {
    ClaimAssignment {
        claim_uid: uid.into(),
        namespace: "default".into(),
        name: "c".into(),
        consumer_pods: vec![pod.into()],
        devices: Vec::new(),
        cpus: set(cpus),
        prepared_at_unix_ms: 1,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

pub fn container(id: &str, pod: &str, env: &[&str], shares: Option<u64>) -> ContainerInfo {
    ContainerInfo {
        id: id.into(),
        name: format!("n-{id}"),
        pod_uid: pod.into(),
        env: env.iter().map(|e| e.to_string()).collect(),
        cpu_shares: shares,
        ..Default::default()
    }
}

pub fn env(uid: &str, cpus: &str) -> String {
    format!("DRA_CPUSET_{uid}={cpus}")
}

pub fn view(mixed: bool) -> NodeView {
    NodeView::new(set("0-7"), set("0"), mixed, None)
}

/// A view that follows dra-plugin at `revision`: an empty snapshot of CPUs
/// 1-7, CPU 0 reserved, applied.
pub fn view_at(revision: u64) -> NodeView {
    let mut v = view(false);
    v.apply_snapshot(shared_state::NodeSnapshot {
        revision,
        allocatable: set("1-7"),
        reserved: set("0"),
        mixed_allocation_mode: false,
        claims: vec![],
    })
    .expect("an empty snapshot applies");
    v
}

pub fn updates(list: &[(&str, &str)]) -> Vec<Update> {
    list.iter()
        .map(|(i, c)| Update::cpuset(*i, set(c)))
        .collect()
}

/// A resolver answering from a table and counting calls.
#[derive(Default)]
pub struct TableResolver {
    pub answers: HashMap<String, Resolution>,
    /// Answers when asked about a claim for a pod (by claim UID); calls
    /// are counted as `<claim> for <pod>`.
    pub for_pod: HashMap<String, Resolution>,
    pub calls: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl ClaimResolver for TableResolver {
    async fn resolve(&self, claim_uid: &str) -> Resolution {
        lock_calls(&self.calls).push(claim_uid.to_string());
        self.answers
            .get(claim_uid)
            .cloned()
            .unwrap_or_else(|| Resolution::Unverifiable("no answer in table".into()))
    }

    async fn resolve_for_pod(&self, claim_uid: &str, pod_uid: &str) -> Resolution {
        lock_calls(&self.calls).push(format!("{claim_uid} for {pod_uid}"));
        self.for_pod
            .get(claim_uid)
            .cloned()
            .unwrap_or_else(|| Resolution::Unverifiable("no answer in table".into()))
    }
}

pub fn lock_calls(m: &Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
    m.lock().expect("calls")
}

pub fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}
