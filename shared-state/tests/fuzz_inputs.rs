//! Hostile input to the parsers of the pure core, proptest-driven so that it
//! runs in CI for a bounded number of cases: cpulists and hex masks,
//! `DRA_CPUSET_*` container environments, stored records, and sysfs trees
//! with files garbled. No input panics, none makes a set past `MAX_CPUS`,
//! and every refusal names what it refused.
//!
//! `DRA_CPU_FUZZ_CASES` sets the cases per target (256 by default).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use shared_state::claim_env::{parse_claim_env, validate_claims, ClaimEnvError, CPUSET_ENV_PREFIX};
use shared_state::cpuset::MAX_CPUS;
use shared_state::store::{claim_key, decode_record};
use shared_state::topology::{sysfs_tree, Topology};
use shared_state::{ClaimAssignment, CpuSet, CpuSetError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn cases() -> u32 {
    std::env::var("DRA_CPU_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Shrinking a found failure is worth it; a bounded one keeps CI bounded.
        max_shrink_iters: 256,
        // A failure prints its minimal input; no regression files in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings near the cpulist grammar: digits, separators, whitespace, signs,
/// huge numbers, and the odd non-ASCII character.
fn cpulist_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9,\\- \n\t]{0,40}",
        "[0-9]{1,25}(-[0-9]{1,25})?(,[0-9]{1,25}(-[0-9]{1,25})?){0,5}",
        any::<String>(),
        "[0-9a-fA-Fx,+:é\u{0}]{0,30}",
    ]
}

fn hex_mask_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-fA-F,]{0,80}",
        "([0-9a-f]{1,9},){0,300}[0-9a-f]{0,9}",
        any::<String>(),
    ]
}

const POD: &str = "d1e2f3a4-b5c6-4d7e-8f90-a1b2c3d4e5f6";

fn uid_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-8[0-9a-f]{3}-[0-9a-f]{12}",
        "[0-9a-zA-Z\\-_./ ]{0,70}",
        Just(String::new()),
    ]
}

fn env_entry() -> impl Strategy<Value = String> {
    prop_oneof![
        (uid_like(), cpulist_like()).prop_map(|(u, c)| format!("{CPUSET_ENV_PREFIX}{u}={c}")),
        uid_like().prop_map(|u| format!("{CPUSET_ENV_PREFIX}{u}")),
        "[A-Z_]{1,12}=[ -~]{0,20}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cpulist_parsing_never_panics_and_names_the_input(input in cpulist_like()) {
        parses_back_or_names_the_input(&input, CpuSet::parse_cpulist, CpuSet::to_cpulist)?;
    }

    #[test]
    fn hex_mask_parsing_never_panics_and_names_the_input(input in hex_mask_like()) {
        parses_back_or_names_the_input(&input, CpuSet::parse_hex_mask, CpuSet::to_hex_mask)?;
    }

    /// A pod spec can carry any env: the parser refuses with the offending
    /// variable named, and what it accepts is well formed.
    #[test]
    fn claim_env_parsing_never_panics(env in proptest::collection::vec(env_entry(), 0..6)) {
        match parse_claim_env(&env) {
            Ok(refs) => {
                for r in refs {
                    prop_assert!(shared_state::claim_env::is_claim_uid(&r.claim_uid), "{:?}", r);
                    prop_assert!(!r.cpus.is_empty());
                }
            }
            Err(e) => {
                let message = e.to_string();
                let named = env.iter().any(|entry| {
                    let var = entry.split_once('=').map_or(entry.as_str(), |(v, _)| v);
                    message.contains(&format!("{var:?}"))
                        || message.contains(&format!("{entry:?}"))
                        || e_names_claim_of(&e, entry)
                });
                prop_assert!(named, "{} names none of {:?}", message, env);
            }
        }
    }

    /// Forged environment: a container is trusted only with exactly the
    /// prepared CPUs of a claim whose consumer is its own pod.
    #[test]
    fn forged_claim_env_is_refused(
        prepared_cpus in "[0-9]{1,2}(-[0-9]{1,2})?",
        env_cpus in "[0-9]{1,2}(-[0-9]{1,2})?",
        prepared in any::<bool>(),
        own_pod in any::<bool>(),
    ) {
        let uid = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
        let (Ok(prepared_set), Ok(env_set)) =
            (CpuSet::parse_cpulist(&prepared_cpus), CpuSet::parse_cpulist(&env_cpus))
        else {
            return Ok(());
        };
        let consumer = if own_pod { POD } else { "00000000-0000-4000-8000-00000000beef" };
        let mut known: HashMap<String, ClaimAssignment> = HashMap::new();
        if prepared {
            known.insert(uid.to_string(), ClaimAssignment {
                claim_uid: uid.to_string(),
                namespace: "default".into(),
                name: "c".into(),
                consumer_pods: vec![consumer.to_string()],
                devices: vec![],
                cpus: prepared_set.clone(),
                prepared_at_unix_ms: 0,
                pod_claim_name: None,
                tuning: Default::default(),
            });
        }
        let env = vec![format!("{CPUSET_ENV_PREFIX}{uid}={env_cpus}")];
        let refs = match parse_claim_env(&env) {
            Ok(refs) => refs,
            // An empty or malformed list is refused before any lookup.
            Err(_) => return Ok(()),
        };
        let verdict = validate_claims(&refs, POD, |u| known.get(u));
        let trusted = prepared && own_pod && prepared_set == env_set;
        match verdict {
            Ok(cpus) => {
                prop_assert!(trusted, "trusted a forged env: {:?}", env);
                prop_assert_eq!(cpus, prepared_set);
            }
            Err(e) => {
                prop_assert!(!trusted, "refused a genuine claim: {}", e);
                prop_assert!(e.to_string().contains(uid), "{}", e);
            }
        }
    }

    /// Any bytes under any claim key: a clear refusal naming the key, or a
    /// record that belongs under exactly that key.
    #[test]
    fn store_records_decode_or_name_the_key(
        uid in uid_like(),
        value in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            any::<String>().prop_map(String::into_bytes),
            record_like().prop_map(String::into_bytes),
        ],
    ) {
        let key = claim_key(&uid);
        match decode_record(&key, &value) {
            Ok(record) => prop_assert_eq!(claim_key(&record.claim_uid), key),
            Err(bad) => {
                prop_assert_eq!(&bad.key, &key);
                prop_assert!(!bad.error.is_empty());
            }
        }
    }
}

/// JSON shaped like a record, with fields wrong in type or value.
/// One of the kernel's CPU set forms read by `parse`: what it accepts stays
/// below `MAX_CPUS` and `print`s back to the same set; what it refuses is
/// named in the error.
fn parses_back_or_names_the_input(
    input: &str,
    parse: fn(&str) -> Result<CpuSet, CpuSetError>,
    print: fn(&CpuSet) -> String,
) -> Result<(), TestCaseError> {
    match parse(input) {
        Ok(set) => {
            prop_assert!(set.iter().all(|cpu| cpu < MAX_CPUS));
            prop_assert!(set.len() <= MAX_CPUS as usize);
            let again = parse(&print(&set));
            prop_assert_eq!(again, Ok(set));
        }
        Err(e) => {
            let message = e.to_string();
            prop_assert!(
                message.contains(&format!("{input:?}")),
                "{message} does not name {input:?}"
            );
        }
    }
    Ok(())
}

fn record_like() -> impl Strategy<Value = String> {
    (
        uid_like(),
        prop_oneof![cpulist_like().prop_map(|c| format!("{c:?}")), Just("7".to_string()), Just("null".to_string())],
        prop_oneof![Just("[]".to_string()), Just("[\"p\"]".to_string()), Just("3".to_string())],
    )
        .prop_map(|(uid, cpus, pods)| {
            format!(
                r#"{{"claim_uid":{uid:?},"namespace":"default","name":"n","consumer_pods":{pods},"devices":[],"cpus":{cpus},"prepared_at_unix_ms":1}}"#
            )
        })
}

fn e_names_claim_of(e: &ClaimEnvError, entry: &str) -> bool {
    match e {
        ClaimEnvError::ConflictingDuplicate { claim_uid, .. } => entry.contains(claim_uid.as_str()),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// sysfs trees with one file garbled

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => files_under(&path, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

/// Contents a broken or hostile sysfs could hold.
fn sysfs_content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        cpulist_like().prop_map(String::into_bytes),
        hex_mask_like().prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..64),
        Just(Vec::new()),
        Just(b"0-8191\n".to_vec()),
        Just(b"4294967295\n".to_vec()),
        Just(b"-1\n".to_vec()),
    ]
}

#[test]
fn garbled_sysfs_files_are_refused_with_their_path_or_read_sanely() {
    // The small VM's tree: every case rewrites one file and restores it.
    let dir = tempfile::tempdir().expect("temp dir");
    sysfs_tree::write_named("vm-2c-nosmt", dir.path()).expect("writing the tree");
    let root = dir.path();
    let pristine = Topology::discover(root).expect("the tree discovers");
    let mut files = Vec::new();
    files_under(&root.join("sys/devices/system"), &mut files);
    files.sort();
    assert!(files.len() > 5, "the tree has {} files", files.len());

    let refused = std::cell::Cell::new(0u32);
    let accepted = std::cell::Cell::new(0u32);
    let mut runner = proptest::test_runner::TestRunner::new(config());
    runner
        .run(&(0..files.len(), sysfs_content()), |(index, content)| {
            let path = &files[index];
            let original = std::fs::read(path).expect("reading the tree's file");
            std::fs::write(path, &content).expect("garbling");
            let result = Topology::discover(root);
            std::fs::write(path, &original).expect("restoring");
            match result {
                Ok(topology) => {
                    accepted.set(accepted.get() + 1);
                    // Whatever was read stays inside the set limits.
                    prop_assert!(topology.online().iter().all(|c| c < MAX_CPUS));
                }
                Err(e) => {
                    refused.set(refused.get() + 1);
                    let message = e.to_string();
                    prop_assert!(
                        message.contains(&root.display().to_string()),
                        "garbling {} gave {message:?}, which names no path under the root",
                        path.display()
                    );
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // The tree is intact again.
    assert_eq!(
        Topology::discover(root).expect("restored").online(),
        pristine.online()
    );
    let (refused, accepted) = (refused.get(), accepted.get());
    eprintln!(
        "garbled sysfs: {refused} refused, {accepted} still read, over {} files",
        files.len()
    );
    assert!(refused > 0, "no garbled file was ever refused");
}
