//! Hostile coordination messages as nri-plugin takes them: claims and
//! snapshots with arbitrary fields (the bytes themselves are fuzzed through
//! protobuf decoding in the proto crate), turned into the view's claims and
//! snapshots. Nothing panics; a
//! bad cpulist refuses the claim (and a snapshot holding it, whole) with an
//! error naming the claim, field and value; what is accepted has CPUs.
//!
//! `DRA_CPU_FUZZ_CASES` sets the cases per target (256 by default).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::coordination::{claim_from_message, snapshot_from_message, MessageError};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("DRA_CPU_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        max_shrink_iters: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn cpulist_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,3}(-[0-9]{1,3})?(,[0-9]{1,3}){0,3}",
        "[0-9,\\- ]{0,12}",
        any::<String>(),
        Just("0-4294967295".to_string()),
    ]
}

fn claim_strategy() -> impl Strategy<Value = coord::Claim> {
    (
        "[0-9a-f\\-]{0,40}|[ -~]{0,20}",
        "[a-z]{0,10}",
        "[a-z0-9\\-]{0,12}",
        proptest::collection::vec("[0-9a-f\\-]{0,36}", 0..3),
        cpulist_like(),
        any::<u64>(),
    )
        .prop_map(|(uid, namespace, name, pods, cpus, at)| coord::Claim {
            uid,
            namespace,
            name,
            consumer_pod_uids: pods,
            cpus,
            prepared_at_unix_ms: at,
            tuning: None,
        })
}

fn check_claim(claim: &coord::Claim) -> Result<(), TestCaseError> {
    match claim_from_message(claim) {
        Ok(view) => {
            prop_assert!(!view.cpus.is_empty());
            prop_assert_eq!(&view.claim_uid, &claim.uid);
            prop_assert_eq!(
                view.cpus,
                shared_state::CpuSet::parse_cpulist(&claim.cpus).expect("accepted")
            );
        }
        Err(e) => {
            let message = e.to_string();
            prop_assert!(
                message.contains(&claim.uid),
                "{} lacks {:?}",
                message,
                claim.uid
            );
            if let MessageError::BadCpus { value, .. } = &e {
                prop_assert_eq!(value, &claim.cpus);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn claims_with_any_fields_are_taken_or_refused_by_name(claim in claim_strategy()) {
        check_claim(&claim)?;
    }

    /// One bad claim refuses the whole snapshot: a partial one would free
    /// CPUs that are in use.
    #[test]
    fn snapshots_are_taken_whole_or_not_at_all(
        claims in proptest::collection::vec(claim_strategy(), 0..5),
        allocatable in cpulist_like(),
        reserved in cpulist_like(),
        revision in any::<u64>(),
    ) {
        let snapshot = coord::Snapshot {
            revision,
            allocatable,
            reserved,
            claims: claims.clone(),
            ..Default::default()
        };
        let all_good = claims.iter().all(|c| claim_from_message(c).is_ok())
            && shared_state::CpuSet::parse_cpulist(&snapshot.allocatable).is_ok()
            && shared_state::CpuSet::parse_cpulist(&snapshot.reserved).is_ok();
        match snapshot_from_message(&snapshot) {
            Ok(view) => {
                prop_assert!(all_good);
                prop_assert_eq!(view.claims.len(), claims.len());
                prop_assert_eq!(view.revision, revision);
            }
            Err(e) => {
                prop_assert!(!all_good, "refused a good snapshot: {}", e);
            }
        }
    }
}
