//! The dra-plugin/nri-plugin coordination protocol `dracpu.v1` (tonic).
//!
//! See `proto/dracpu/coordination.proto` for the meaning of every field. CPU
//! sets are cpulist strings on the wire. This module is the one conversion
//! between the wire and the shared types, both directions side by side:
//! dra-plugin sends through [`claim_message`], [`snapshot_message`] and the
//! Watch event builders ([`snapshot_event`], [`prepared_event`],
//! [`unprepared_event`], [`heartbeat_event`]); nri-plugin reads through
//! [`claim_from_message`] and [`snapshot_from_message`]. The wire carries
//! neither a claim's devices nor its pod claim name: those stay in
//! dra-plugin and read back empty.

use shared_state::tuning::request::Tuning;
use shared_state::{ClaimAssignment, CpuSet, NodeSnapshot};

/// `dracpu.v1`: Coordination (Watch, Lookup, ReportApplied).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("dracpu.v1");
}

/// Encoded `google.protobuf.FileDescriptorSet` of `dracpu.v1`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/coordination_descriptor.bin"));

/// Why a message from dra-plugin cannot be taken as it is.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("claim {claim_uid}: {field} {value:?} is not a cpulist: {source}")]
    BadCpus {
        claim_uid: String,
        field: &'static str,
        value: String,
        #[source]
        source: shared_state::CpuSetError,
    },
    #[error("claim {claim_uid}: the claim has no CPUs")]
    EmptyClaim { claim_uid: String },
}

/// A prepared claim as sent.
pub fn claim_message(a: &ClaimAssignment) -> v1::Claim {
    v1::Claim {
        uid: a.claim_uid.clone(),
        namespace: a.namespace.clone(),
        name: a.name.clone(),
        consumer_pod_uids: a.consumer_pods.clone(),
        cpus: a.cpus.to_cpulist(),
        prepared_at_unix_ms: a.prepared_at_unix_ms,
        tuning: (!a.tuning.is_empty()).then(|| tuning_message(&a.tuning)),
    }
}

fn tuning_message(t: &Tuning) -> v1::ClaimTuning {
    v1::ClaimTuning {
        isolate_irqs: t.isolate_irqs,
        cfs_quota_off: t.cfs_quota_off,
        load_balancing_off: t.load_balancing_off,
        max_idle_latency_us: t.max_idle_latency_us,
        governor: t.governor.clone().unwrap_or_default(),
    }
}

fn tuning_from_message(t: &v1::ClaimTuning) -> Tuning {
    Tuning {
        isolate_irqs: t.isolate_irqs,
        cfs_quota_off: t.cfs_quota_off,
        load_balancing_off: t.load_balancing_off,
        max_idle_latency_us: t.max_idle_latency_us,
        governor: Some(t.governor.clone()).filter(|g| !g.is_empty()),
    }
}

/// The whole state as sent.
pub fn snapshot_message(s: &NodeSnapshot) -> v1::Snapshot {
    v1::Snapshot {
        revision: s.revision,
        allocatable: s.allocatable.to_cpulist(),
        reserved: s.reserved.to_cpulist(),
        mixed_allocation_mode: s.mixed_allocation_mode,
        claims: s.claims.iter().map(claim_message).collect(),
    }
}

/// The Watch event that carries a whole snapshot.
pub fn snapshot_event(s: &NodeSnapshot) -> v1::WatchEvent {
    watch_event(v1::watch_event::Event::Snapshot(snapshot_message(s)))
}

/// The Watch event of a claim prepared at `revision`.
pub fn prepared_event(revision: u64, claim: &ClaimAssignment) -> v1::WatchEvent {
    watch_event(v1::watch_event::Event::ClaimPrepared(v1::ClaimPrepared {
        revision,
        claim: Some(claim_message(claim)),
    }))
}

/// The Watch event of a claim unprepared at `revision`.
pub fn unprepared_event(revision: u64, claim_uid: &str) -> v1::WatchEvent {
    watch_event(v1::watch_event::Event::ClaimUnprepared(
        v1::ClaimUnprepared {
            revision,
            claim_uid: claim_uid.to_string(),
        },
    ))
}

/// The Watch event a quiet stream gets, with the current revision.
pub fn heartbeat_event(revision: u64) -> v1::WatchEvent {
    watch_event(v1::watch_event::Event::Heartbeat(v1::Heartbeat {
        revision,
    }))
}

fn watch_event(event: v1::watch_event::Event) -> v1::WatchEvent {
    v1::WatchEvent { event: Some(event) }
}

/// A claim message as received; refused if its cpulist is bad or empty.
pub fn claim_from_message(claim: &v1::Claim) -> Result<ClaimAssignment, MessageError> {
    let cpus = CpuSet::parse_cpulist(&claim.cpus).map_err(|source| MessageError::BadCpus {
        claim_uid: claim.uid.clone(),
        field: "cpus",
        value: claim.cpus.clone(),
        source,
    })?;
    if cpus.is_empty() {
        return Err(MessageError::EmptyClaim {
            claim_uid: claim.uid.clone(),
        });
    }
    Ok(ClaimAssignment {
        claim_uid: claim.uid.clone(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        consumer_pods: claim.consumer_pod_uids.clone(),
        devices: Vec::new(),
        cpus,
        prepared_at_unix_ms: claim.prepared_at_unix_ms,
        pod_claim_name: None,
        tuning: claim
            .tuning
            .as_ref()
            .map(tuning_from_message)
            .unwrap_or_default(),
    })
}

/// A snapshot message as received; refused whole if any cpulist is bad,
/// since a partial snapshot would free CPUs that are in use.
pub fn snapshot_from_message(s: &v1::Snapshot) -> Result<NodeSnapshot, MessageError> {
    let parse = |field: &'static str, value: &str| {
        CpuSet::parse_cpulist(value).map_err(|source| MessageError::BadCpus {
            claim_uid: String::from("(snapshot)"),
            field,
            value: value.to_string(),
            source,
        })
    };
    Ok(NodeSnapshot {
        revision: s.revision,
        allocatable: parse("allocatable", &s.allocatable)?,
        reserved: parse("reserved", &s.reserved)?,
        mixed_allocation_mode: s.mixed_allocation_mode,
        claims: s
            .claims
            .iter()
            .map(claim_from_message)
            .collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(uid: &str, cpus: &str) -> v1::Claim {
        v1::Claim {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "n".into(),
            consumer_pod_uids: vec!["p".into()],
            cpus: cpus.into(),
            prepared_at_unix_ms: 9,
            tuning: None,
        }
    }

    #[test]
    fn claim_messages_table() {
        for (cpus, ok) in [("1-2", true), ("", false), ("2-1", false), ("x", false)] {
            let got = claim_from_message(&msg("u", cpus));
            assert_eq!(got.is_ok(), ok, "{cpus:?}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("claim u"), "{e}");
            }
        }
        let a = claim_from_message(&msg("u", "3")).expect("claim");
        assert_eq!(
            (a.consumer_pods.clone(), a.cpus.to_cpulist()),
            (vec!["p".to_string()], "3".into())
        );
        // What is sent reads back as it was.
        assert_eq!(claim_message(&a), msg("u", "3"));
    }

    #[test]
    fn a_bad_claim_drops_the_whole_snapshot() {
        let mut s = v1::Snapshot {
            revision: 4,
            allocatable: "0-3".into(),
            reserved: "".into(),
            mixed_allocation_mode: true,
            claims: vec![msg("a", "1"), msg("b", "2")],
        };
        let v = snapshot_from_message(&s).expect("good");
        assert_eq!((v.revision, v.claims.len()), (4, 2));
        assert_eq!(snapshot_message(&v), s, "round trip");
        s.claims.push(msg("c", "9-"));
        let err = snapshot_from_message(&s).expect_err("bad claim");
        assert!(err.to_string().contains("claim c"), "{err}");
        s.claims.pop();
        s.allocatable = "0-".into();
        let err = snapshot_from_message(&s).expect_err("bad allocatable");
        assert!(err.to_string().contains("allocatable"), "{err}");
    }

    use proptest::prelude::*;

    /// A claim as the wire carries it: no devices, no pod claim name.
    fn wire_claim() -> impl Strategy<Value = ClaimAssignment> {
        (
            "[a-z0-9-]{1,36}",
            "[a-z0-9-]{0,20}",
            "[a-z0-9-]{0,20}",
            proptest::collection::vec("[a-z0-9-]{1,36}", 0..3),
            proptest::collection::btree_set(0u32..512, 1..16),
            any::<u64>(),
            tuning(),
        )
            .prop_map(
                |(uid, namespace, name, pods, cpus, at, tuning)| ClaimAssignment {
                    claim_uid: uid,
                    namespace,
                    name,
                    consumer_pods: pods,
                    devices: Vec::new(),
                    cpus: cpus.into_iter().collect(),
                    prepared_at_unix_ms: at,
                    pod_claim_name: None,
                    tuning,
                },
            )
    }

    fn tuning() -> impl Strategy<Value = Tuning> {
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u32..2_000_000),
            proptest::option::of("[a-z_]{1,15}"),
        )
            .prop_map(|(irqs, quota, balancing, idle, governor)| Tuning {
                isolate_irqs: irqs,
                cfs_quota_off: quota,
                load_balancing_off: balancing,
                max_idle_latency_us: idle,
                governor,
            })
    }

    fn cpus() -> impl Strategy<Value = CpuSet> {
        proptest::collection::btree_set(0u32..512, 0..32).prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        #[test]
        fn a_claim_reads_back_as_it_was_sent(claim in wire_claim()) {
            prop_assert_eq!(claim_from_message(&claim_message(&claim)).ok(), Some(claim));
        }

        #[test]
        fn a_snapshot_reads_back_as_it_was_sent(
            revision in any::<u64>(),
            allocatable in cpus(),
            reserved in cpus(),
            mixed_allocation_mode in any::<bool>(),
            claims in proptest::collection::vec(wire_claim(), 0..5),
        ) {
            let snapshot = NodeSnapshot { revision, allocatable, reserved, mixed_allocation_mode, claims };
            let Some(v1::watch_event::Event::Snapshot(sent)) = snapshot_event(&snapshot).event else {
                return Err(TestCaseError::fail("not a snapshot event"));
            };
            prop_assert_eq!(snapshot_from_message(&sent).ok(), Some(snapshot));
        }

        #[test]
        fn delta_events_carry_their_revision_and_claim(revision in any::<u64>(), claim in wire_claim()) {
            match prepared_event(revision, &claim).event {
                Some(v1::watch_event::Event::ClaimPrepared(p)) => {
                    prop_assert_eq!(p.revision, revision);
                    let sent = p.claim.as_ref().map(claim_from_message).and_then(Result::ok);
                    prop_assert_eq!(sent, Some(claim.clone()));
                }
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
            match unprepared_event(revision, &claim.claim_uid).event {
                Some(v1::watch_event::Event::ClaimUnprepared(u)) => {
                    prop_assert_eq!((u.revision, u.claim_uid), (revision, claim.claim_uid));
                }
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
            match heartbeat_event(revision).event {
                Some(v1::watch_event::Event::Heartbeat(h)) => prop_assert_eq!(h.revision, revision),
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
        }
    }
}
