//! The `DRA_CPUSET_<claimUID>=<cpulist>` environment contract between the CDI
//! spec written by dra-plugin and the containers nri-plugin pins.
//!
//! The variable comes from a pod spec as easily as from a CDI spec, so parsing
//! is strict and one function, [`check_env_claim`], is the rule a named claim
//! must pass: prepared, with the prepared CPUs, for one of the claim's pods.
//! A claim named in the environment is an [`EnvClaim`]; dra-plugin's
//! `ClaimRef` is the other thing, kubelet's name of a claim.

use crate::assignment::ClaimAssignment;
use crate::cpuset::{CpuSet, CpuSetError};

/// Every claim variable starts with this; the claim UID follows it.
pub const CPUSET_ENV_PREFIX: &str = "DRA_CPUSET_";

/// Longest accepted claim UID: the canonical 36-character UUID form.
pub const MAX_CLAIM_UID_LEN: usize = 36;

/// One claim a container names in its environment, with the CPUs the
/// environment says it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvClaim {
    pub claim_uid: String,
    pub cpus: CpuSet,
}

/// Why a container's claim environment was refused. Every variant names the
/// variable or claim at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimEnvError {
    #[error("env entry {entry:?}: a {CPUSET_ENV_PREFIX}* variable needs the form {CPUSET_ENV_PREFIX}<claimUID>=<cpulist>")]
    MissingValue { entry: String },
    #[error("env variable {var:?}: the claim UID after {CPUSET_ENV_PREFIX} is empty")]
    EmptyClaimUid { var: String },
    #[error("env variable {var:?}: {claim_uid:?} is not a Kubernetes UID (lowercase hex digits and dashes, at most {MAX_CLAIM_UID_LEN} characters)")]
    BadClaimUid { var: String, claim_uid: String },
    #[error("env variable {var:?}: bad cpulist: {source}")]
    BadCpuList {
        var: String,
        #[source]
        source: CpuSetError,
    },
    #[error("env variable {var:?}: the cpulist is empty")]
    EmptyCpuList { var: String },
    #[error("claim {claim_uid} is named twice with different CPUs: {first} and {second}")]
    ConflictingDuplicate {
        claim_uid: String,
        first: CpuSet,
        second: CpuSet,
    },
    #[error("claim {claim_uid} is not prepared on this node")]
    UnknownClaim { claim_uid: String },
    #[error("claim {claim_uid}: the container environment says CPUs {env} but the claim was prepared with {prepared}")]
    CpusMismatch {
        claim_uid: String,
        env: CpuSet,
        prepared: CpuSet,
    },
    #[error("claim {claim_uid} is reserved for pods [{}], not for pod {pod_uid}", consumers.join(", "))]
    WrongPod {
        claim_uid: String,
        pod_uid: String,
        consumers: Vec<String>,
    },
}

impl ClaimEnvError {
    /// The claim to look up before retrying, when the refusal is only that the
    /// claim is not known yet (a container can be created right after Prepare).
    pub fn unknown_claim(&self) -> Option<&str> {
        match self {
            ClaimEnvError::UnknownClaim { claim_uid } => Some(claim_uid),
            _ => None,
        }
    }
}

/// The environment entry (`KEY=VALUE`) a CDI spec injects for a claim.
pub fn cdi_env_var(claim_uid: &str, cpus: &CpuSet) -> String {
    format!("{CPUSET_ENV_PREFIX}{claim_uid}={cpus}")
}

/// Whether `uid` has the shape of a Kubernetes object UID. Real UIDs are
/// lowercase RFC 4122 UUIDs; the check accepts any lowercase hex and dashes up
/// to that length rather than the exact 8-4-4-4-12 grouping.
pub fn is_claim_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= MAX_CLAIM_UID_LEN
        && uid.bytes().any(|b| b != b'-')
        && uid
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

/// The claims a container's environment names, in the order first named.
/// Entries without the [`CPUSET_ENV_PREFIX`] are ignored; a claim named twice
/// with the same CPUs is listed once.
pub fn parse_claim_env<S: AsRef<str>>(env: &[S]) -> Result<Vec<EnvClaim>, ClaimEnvError> {
    let mut refs: Vec<EnvClaim> = Vec::new();
    for entry in env {
        let entry = entry.as_ref();
        let Some(rest) = entry.strip_prefix(CPUSET_ENV_PREFIX) else {
            continue;
        };
        let Some((claim_uid, value)) = rest.split_once('=') else {
            return Err(ClaimEnvError::MissingValue {
                entry: entry.to_string(),
            });
        };
        let var = || format!("{CPUSET_ENV_PREFIX}{claim_uid}");
        if claim_uid.is_empty() {
            return Err(ClaimEnvError::EmptyClaimUid { var: var() });
        }
        if !is_claim_uid(claim_uid) {
            return Err(ClaimEnvError::BadClaimUid {
                var: var(),
                claim_uid: claim_uid.to_string(),
            });
        }
        let cpus = CpuSet::parse_cpulist(value)
            .map_err(|source| ClaimEnvError::BadCpuList { var: var(), source })?;
        if cpus.is_empty() {
            return Err(ClaimEnvError::EmptyCpuList { var: var() });
        }
        match refs.iter().find(|r| r.claim_uid == claim_uid) {
            Some(seen) if seen.cpus == cpus => {}
            Some(seen) => {
                return Err(ClaimEnvError::ConflictingDuplicate {
                    claim_uid: claim_uid.to_string(),
                    first: seen.cpus.clone(),
                    second: cpus,
                })
            }
            None => refs.push(EnvClaim {
                claim_uid: claim_uid.to_string(),
                cpus,
            }),
        }
    }
    Ok(refs)
}

/// The security rule of the environment contract, for one claim a
/// container names. A `DRA_CPUSET_<uid>=<cpus>` variable can come from a
/// pod spec as easily as from a CDI spec, so it is never trusted alone: it
/// is accepted only when
/// 1. the claim is prepared on this node (`prepared`: what dra-plugin says,
///    or, while dra-plugin cannot be asked, what the claim's root-owned CDI
///    spec says), else [`ClaimEnvError::UnknownClaim`] (the caller may look
///    the claim up and ask again);
/// 2. the CPUs equal the prepared CPUs, else [`ClaimEnvError::CpusMismatch`]
///    (a forged or stale variable);
/// 3. the pod is one the claim is reserved for, else
///    [`ClaimEnvError::WrongPod`]. A CDI spec names no pod: nri-plugin
///    reserves such a claim for the first pod that names it, and only that
///    pod passes afterwards.
pub fn check_env_claim(
    named: &EnvClaim,
    pod_uid: &str,
    prepared: Option<&ClaimAssignment>,
) -> Result<(), ClaimEnvError> {
    let Some(assignment) = prepared else {
        return Err(ClaimEnvError::UnknownClaim {
            claim_uid: named.claim_uid.clone(),
        });
    };
    if assignment.cpus != named.cpus {
        return Err(ClaimEnvError::CpusMismatch {
            claim_uid: named.claim_uid.clone(),
            env: named.cpus.clone(),
            prepared: assignment.cpus.clone(),
        });
    }
    if !assignment.consumer_pods.iter().any(|p| p == pod_uid) {
        return Err(ClaimEnvError::WrongPod {
            claim_uid: named.claim_uid.clone(),
            pod_uid: pod_uid.to_string(),
            consumers: assignment.consumer_pods.clone(),
        });
    }
    Ok(())
}

/// Check each named claim with [`check_env_claim`] against the prepared
/// assignments and return the union of their CPUs. `known` looks a claim up
/// by UID (e.g. `|uid| map.get(uid)`). The first refused claim refuses all.
pub fn validate_claims<'a, F>(
    refs: &[EnvClaim],
    pod_uid: &str,
    known: F,
) -> Result<CpuSet, ClaimEnvError>
where
    F: Fn(&str) -> Option<&'a ClaimAssignment>,
{
    let mut union = CpuSet::new();
    for r in refs {
        check_env_claim(r, pod_uid, known(&r.claim_uid))?;
        union = union.union(&r.cpus);
    }
    Ok(union)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const UID_A: &str = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
    const UID_B: &str = "7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b8";
    const POD: &str = "d1e2f3a4-b5c6-4d7e-8f90-a1b2c3d4e5f6";

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("valid cpulist")
    }

    fn assignment(uid: &str, cpus: &str, pods: &[&str]) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: uid.to_string(),
            namespace: "default".to_string(),
            name: format!("claim-{uid}"),
            consumer_pods: pods.iter().map(|p| p.to_string()).collect(),
            devices: Vec::new(),
            cpus: set(cpus),
            prepared_at_unix_ms: 0,
            pod_claim_name: None,
            tuning: Default::default(),
        }
    }

    #[test]
    fn parses_claim_variables_and_ignores_others() {
        let env = [
            "PATH=/usr/bin".to_string(),
            cdi_env_var(UID_A, &set("2-3")),
            "DRA_CPUSETX=1".to_string(),
            format!("{CPUSET_ENV_PREFIX}{UID_B}=8,10"),
            cdi_env_var(UID_A, &set("2-3")),
        ];
        let refs = parse_claim_env(&env).expect("valid env");
        assert_eq!(
            refs,
            vec![
                EnvClaim {
                    claim_uid: UID_A.to_string(),
                    cpus: set("2-3")
                },
                EnvClaim {
                    claim_uid: UID_B.to_string(),
                    cpus: set("8,10")
                },
            ]
        );
        assert!(parse_claim_env::<&str>(&[]).expect("empty env").is_empty());
        assert!(parse_claim_env(&["HOME=/", "DRA_CPUSET=1"])
            .expect("no claims")
            .is_empty());
    }

    #[test]
    fn rejects_bad_claim_variables_with_the_variable_named() {
        let cases: Vec<(String, &str)> = vec![
            (
                "DRA_CPUSET_=1".into(),
                "claim UID after DRA_CPUSET_ is empty",
            ),
            ("DRA_CPUSET_abc".into(), "needs the form"),
            (
                "DRA_CPUSET_ABC=1".into(),
                "\"DRA_CPUSET_ABC\": \"ABC\" is not a Kubernetes UID",
            ),
            ("DRA_CPUSET_a b=1".into(), "is not a Kubernetes UID"),
            ("DRA_CPUSET_---=1".into(), "is not a Kubernetes UID"),
            (
                format!("DRA_CPUSET_{}=1", "a".repeat(37)),
                "is not a Kubernetes UID",
            ),
            (
                format!("DRA_CPUSET_{UID_A}=3-1"),
                "bad cpulist: cpulist \"3-1\": range \"3-1\" is reversed",
            ),
            (format!("DRA_CPUSET_{UID_A}=x"), UID_A),
            (format!("DRA_CPUSET_{UID_A}="), "the cpulist is empty"),
        ];
        for (entry, want) in cases {
            let err = parse_claim_env(&[entry.as_str()])
                .expect_err(&entry)
                .to_string();
            assert!(err.contains(want), "{entry:?}: {err}");
        }
        let twice = [cdi_env_var(UID_A, &set("1")), cdi_env_var(UID_A, &set("2"))];
        let err = parse_claim_env(&twice).expect_err("conflict");
        assert!(matches!(err, ClaimEnvError::ConflictingDuplicate { .. }));
        assert!(err
            .to_string()
            .contains("named twice with different CPUs: 1 and 2"));
    }

    #[test]
    fn accepts_real_uid_shapes() {
        for uid in [UID_A, "abc123", "0", "00000000-0000-0000-0000-000000000000"] {
            assert!(is_claim_uid(uid), "{uid}");
        }
        for uid in ["", "-", "G123", "0b4e8a52_3c1d", "0B4E8A52", "é"] {
            assert!(!is_claim_uid(uid), "{uid}");
        }
    }

    /// The security rule, case by case: the env alone never passes.
    #[test]
    fn env_claim_rule_table() {
        let named = EnvClaim {
            claim_uid: UID_A.to_string(),
            cpus: set("2-3"),
        };
        let reserved = assignment(UID_A, "2-3", &[POD]);
        let shared_by_two = assignment(UID_A, "2-3", &["other-pod", POD]);
        // A claim from a CDI spec before its first pod adopts it.
        let from_cdi_unadopted = assignment(UID_A, "2-3", &[]);
        let superset = assignment(UID_A, "2-4", &[POD]);
        let subset = assignment(UID_A, "2", &[POD]);
        let disjoint = assignment(UID_A, "6-7", &[POD]);
        let other_pod = assignment(UID_A, "2-3", &["other-pod"]);
        type Case<'a> = (
            &'a str,
            Option<&'a ClaimAssignment>,
            &'a str,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "not prepared",
                None,
                POD,
                Some("is not prepared on this node"),
            ),
            ("prepared for this pod", Some(&reserved), POD, None),
            ("one of its pods", Some(&shared_by_two), POD, None),
            (
                "prepared with more CPUs",
                Some(&superset),
                POD,
                Some("prepared with 2-4"),
            ),
            (
                "prepared with fewer CPUs",
                Some(&subset),
                POD,
                Some("prepared with 2"),
            ),
            (
                "prepared with other CPUs",
                Some(&disjoint),
                POD,
                Some("prepared with 6-7"),
            ),
            (
                "another pod's claim",
                Some(&other_pod),
                POD,
                Some("reserved for pods [other-pod]"),
            ),
            (
                "no pod yet",
                Some(&from_cdi_unadopted),
                POD,
                Some("reserved for pods []"),
            ),
            (
                "right CPUs, wrong pod",
                Some(&reserved),
                "intruder",
                Some("not for pod intruder"),
            ),
        ];
        for (what, prepared, pod, want) in cases {
            match (check_env_claim(&named, pod, prepared), want) {
                (Ok(()), None) => {}
                (Err(err), Some(text)) => assert!(err.to_string().contains(text), "{what}: {err}"),
                (got, _) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn validation_table() {
        let known: HashMap<String, ClaimAssignment> = [
            (UID_A.to_string(), assignment(UID_A, "2-3", &[POD])),
            (UID_B.to_string(), assignment(UID_B, "8", &["other-pod"])),
        ]
        .into_iter()
        .collect();
        let lookup = |uid: &str| known.get(uid);
        let r = |uid: &str, cpus: &str| EnvClaim {
            claim_uid: uid.to_string(),
            cpus: set(cpus),
        };
        let ok = validate_claims(&[r(UID_A, "2-3")], POD, lookup).expect("valid");
        assert_eq!(ok, set("2-3"));
        assert_eq!(
            validate_claims(&[], POD, lookup).expect("none"),
            CpuSet::new()
        );

        let unknown = "11111111-2222-3333-4444-555555555555";
        let cases: Vec<(Vec<EnvClaim>, &str, &str)> = vec![
            (vec![r(unknown, "1")], POD, "is not prepared on this node"),
            (
                vec![r(UID_A, "2-4")],
                POD,
                "environment says CPUs 2-4 but the claim was prepared with 2-3",
            ),
            (vec![r(UID_A, "2-3")], "intruder", "not for pod intruder"),
            (
                vec![r(UID_A, "2-3"), r(UID_B, "8")],
                POD,
                "reserved for pods [other-pod]",
            ),
        ];
        for (refs, pod, want) in cases {
            let err = validate_claims(&refs, pod, lookup).expect_err(want);
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        let err = validate_claims(&[r(unknown, "1")], POD, lookup).expect_err("unknown");
        assert_eq!(err.unknown_claim(), Some(unknown));
        let err = validate_claims(&[r(UID_A, "9")], POD, lookup).expect_err("forged");
        assert_eq!(err.unknown_claim(), None);
    }

    proptest! {
        #[test]
        fn cdi_var_round_trips(
            uid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            cpus in proptest::collection::btree_set(0u32..1024, 1..40),
        ) {
            let cpus: CpuSet = cpus.into_iter().collect();
            let refs = parse_claim_env(&[cdi_env_var(&uid, &cpus)]).unwrap();
            prop_assert_eq!(refs, vec![EnvClaim { claim_uid: uid, cpus }]);
        }

        #[test]
        fn parser_never_panics(env in proptest::collection::vec("(DRA_CPUSET_)?[0-9a-fA-F=,\\- ]{0,20}", 0..6)) {
            let _ = parse_claim_env(&env);
        }
    }
}
