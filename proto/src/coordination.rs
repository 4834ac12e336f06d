//! The dra-plugin/nri-plugin coordination protocol `dracpu.v1` (tonic).
//!
//! See `proto/dracpu/coordination.proto` for the meaning of every field. CPU
//! sets are cpulist strings on the wire; [`claim_message`] and
//! [`snapshot_message`] (dra-plugin's side) and [`claim_from_message`] and
//! [`snapshot_from_message`] (nri-plugin's side) are the one conversion
//! between them and the shared types.

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
}
