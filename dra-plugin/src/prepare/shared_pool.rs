//! The floor of the shared pool: the CPUs no claim holds, which the
//! containers without a claim run on, are never prepared away below
//! `--min-shared-cpus`.

use super::{ClaimRef, HeldCpus, PrepareError};
use shared_state::CpuSet;

/// Refuse `cpus` for `claim` when they would leave the shared pool
/// (allocatable CPUs no claim holds) with fewer than `min` CPUs.
///
/// dra-plugin does not see containers, but every node runs some without a
/// claim (the CNI, kube-proxy, this driver's own pods), and an empty pool
/// can only be answered by refusing them or by leaving them on CPUs a claim
/// now holds exclusively. So the last CPUs are kept back at prepare, where
/// the pod waits with a reason, instead of breaking exclusivity later.
pub fn check_shared_pool_floor(
    claim: &ClaimRef,
    cpus: &CpuSet,
    allocatable: &CpuSet,
    held: &HeldCpus<'_>,
    min: u32,
) -> Result<(), PrepareError> {
    let left = allocatable.difference(cpus).difference(held.taken());
    if left.len() >= min as usize {
        return Ok(());
    }
    Err(PrepareError::SharedPoolFloor {
        claim: claim.to_string(),
        cpus: cpus.clone(),
        left,
        min,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::tests::{claim_ref, set, UID_A};
    use std::collections::BTreeMap;

    #[test]
    fn the_shared_pool_keeps_its_floor_of_cpus() {
        // (allocatable, other claims, this claim's CPUs, floor, refused with left)
        type Case<'a> = (&'a str, &'a [&'a str], &'a str, u32, Option<&'a str>);
        let cases: &[Case] = &[
            ("0-7", &[], "0-6", 1, None),
            ("0-7", &[], "0-7", 1, Some("")),
            ("0-7", &["0-3"], "4-6", 1, None),
            ("0-7", &["0-3"], "4-7", 1, Some("")),
            ("0-7", &["0-3"], "4-5", 3, Some("6-7")),
            ("0-7", &["0-3"], "4-5", 2, None),
            // A floor of 0 lets a claim take every CPU.
            ("0-7", &["0-3"], "4-7", 0, None),
            // The claim's own earlier CPUs (a retried prepare) are not
            // counted twice.
            ("0-3", &[UID_A], "2", 1, None),
        ];
        for (allocatable, others, cpus, min, refused) in cases {
            let mut held = BTreeMap::new();
            for (i, other) in others.iter().enumerate() {
                if *other == UID_A {
                    held.insert(UID_A.to_string(), set(cpus));
                } else {
                    held.insert(format!("other-{i}"), set(other));
                }
            }
            let result = check_shared_pool_floor(
                &claim_ref(UID_A),
                &set(cpus),
                &set(allocatable),
                &HeldCpus::of_map(UID_A, &held),
                *min,
            );
            match (refused, result) {
                (None, Ok(())) => {}
                (
                    Some(left),
                    Err(PrepareError::SharedPoolFloor {
                        left: got,
                        min: m,
                        cpus: c,
                        ..
                    }),
                ) => {
                    assert_eq!(got, set(left), "{allocatable} {others:?} {cpus} {min}");
                    assert_eq!((m, c), (*min, set(cpus)));
                }
                (want, got) => {
                    panic!("{allocatable} {others:?} {cpus} {min}: want {want:?}, got {got:?}")
                }
            }
        }
        let message = check_shared_pool_floor(
            &claim_ref(UID_A),
            &set("0-3"),
            &set("0-3"),
            &HeldCpus::default(),
            1,
        )
        .expect_err("every CPU")
        .to_string();
        assert!(
            message.contains("leave 0 CPU(s)") && message.contains("--min-shared-cpus"),
            "{message}"
        );
    }
}
