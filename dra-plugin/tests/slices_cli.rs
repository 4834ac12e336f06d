//! `dra-plugin slices`, run as the built binary over every named machine in
//! both device modes, with and without the node-allocatable mapping; the
//! printed objects are checked against the Kubernetes 1.34 and 1.37 schemas.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{printed_slices, slices_output, written_tree};
use dra_cpu_tests::apiserver::schema::validate_k8s_objects;
use serde_json::Value;
use shared_state::topology::sysfs_tree;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn devices(slices: &[Value]) -> Vec<&Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect()
}

fn online_count(root: &Path) -> usize {
    let text = std::fs::read_to_string(root.join("sys/devices/system/cpu/online")).expect("online");
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

fn without_mapping(mut object: Value) -> Value {
    if let Some(devices) = object
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
    {
        for d in devices {
            if let Some(d) = d.as_object_mut() {
                d.remove("nodeAllocatableResources");
            }
        }
    }
    object
}

const MODES: [&[&str]; 4] = [
    &["--cpu-device-mode", "individual"],
    &["--cpu-device-mode", "grouped", "--group-by", "numanode"],
    &["--cpu-device-mode", "grouped", "--group-by", "socket"],
    &["--cpu-device-mode", "grouped", "--group-by", "machine"],
];

/// Every fixture, every layout, mapping on and off: the pool covers exactly
/// the online CPUs, respects the per-slice limit, and is schema-valid.
#[test]
fn every_fixture_in_every_mode_is_valid_for_1_34_and_1_37() {
    let mut for_1_37 = Vec::new();
    let mut for_1_34 = Vec::new();
    for name in sysfs_tree::NAMED {
        let dir = written_tree(name);
        let online = online_count(dir.path());
        for mode in MODES {
            for mapping in [true, false] {
                let mut args = mode.to_vec();
                if !mapping {
                    args.push("--disable-node-allocatable-mapping");
                }
                let what = format!("{name} {args:?}");
                let objects = printed_slices(dir.path(), &args);
                let count = objects.len();
                assert!(count >= 1, "{what}");
                let all = devices(&objects);
                let names: BTreeSet<&str> = all.iter().filter_map(|d| d["name"].as_str()).collect();
                assert_eq!(names.len(), all.len(), "{what}: unique device names");
                for s in &objects {
                    assert_eq!(s["spec"]["pool"]["name"], "node-1", "{what}");
                    assert_eq!(s["spec"]["pool"]["resourceSliceCount"], count, "{what}");
                    assert!(s["spec"]["devices"].as_array().unwrap().len() <= 128);
                }
                if mode[1] == "individual" {
                    assert_eq!(all.len(), online, "{what}: one device per online CPU");
                } else {
                    let capacity: usize = all
                        .iter()
                        .map(|d| {
                            d["capacity"]["dra.cpu/cpu"]["value"]
                                .as_str()
                                .unwrap()
                                .parse::<usize>()
                                .unwrap()
                        })
                        .sum();
                    assert_eq!(capacity, online, "{what}: capacities add up");
                }
                for d in &all {
                    assert_eq!(
                        d.get("nodeAllocatableResources").is_some(),
                        mapping,
                        "{what}"
                    );
                }
                for_1_34.extend(objects.iter().cloned().map(without_mapping));
                for_1_37.extend(objects);
            }
        }
    }
    validate_k8s_objects(&for_1_37, &["1.37.0"]).unwrap();
    // The 1.34 schema has no nodeAllocatableResources.
    validate_k8s_objects(&for_1_34, &["1.34.0"]).unwrap();
}

#[test]
fn individual_devices_follow_the_machine() {
    // Siblings N and N+64: consecutive device numbers, one full slice.
    let dir = written_tree("intel-2s-snc2-ht-128");
    let objects = printed_slices(dir.path(), &["--cpu-device-mode", "individual"]);
    assert_eq!(objects.len(), 1);
    let all = devices(&objects);
    assert_eq!(all.len(), 128);
    let cpu_ids: Vec<i64> = all[..4]
        .iter()
        .map(|d| d["attributes"]["dra.cpu/cpuID"]["int"].as_i64().unwrap())
        .collect();
    assert_eq!(cpu_ids, vec![0, 64, 1, 65]);
    assert_eq!(all[1]["name"], "cpudev001");
    assert_eq!(all[1]["attributes"]["dra.cpu/smtEnabled"]["bool"], true);
    // CPU 100 is in socket 1, NUMA node 3 (32 CPUs per node, split siblings).
    let d100 = all
        .iter()
        .find(|d| d["attributes"]["dra.cpu/cpuID"]["int"] == 100)
        .unwrap();
    assert_eq!(d100["attributes"]["dra.cpu/socketID"]["int"], 1);
    assert_eq!(
        d100["attributes"]["resource.kubernetes.io/numaNode"]["int"],
        d100["attributes"]["dra.cpu/numaNodeID"]["int"]
    );

    // Siblings numbered adjacently, two CPUs offline, reserved CPUs left out.
    let dir = written_tree("intel-2s-ht-adjacent-offline-96");
    let objects = printed_slices(
        dir.path(),
        &["--cpu-device-mode", "individual", "--reserved-cpus", "0-1"],
    );
    let all = devices(&objects);
    assert_eq!(all.len(), 92);
    assert_eq!(all[0]["attributes"]["dra.cpu/cpuID"]["int"], 2);
    assert_eq!(all[0]["name"], "cpudev000");
    assert!(all
        .iter()
        .all(|d| d["attributes"]["dra.cpu/cpuID"]["int"].as_i64().unwrap() >= 2));

    // Arm without L3 and SMT.
    let dir = written_tree("arm-1s-80c-nosmt");
    let all_arm = printed_slices(dir.path(), &["--cpu-device-mode", "individual"]);
    let arm = devices(&all_arm);
    assert_eq!(arm[0]["attributes"]["dra.cpu/smtEnabled"]["bool"], false);
    assert_eq!(arm[0]["attributes"]["dra.cpu/cacheL3ID"]["int"], -1);

    // Hybrid part: both core types appear.
    let dir = written_tree("hybrid-8p16e-32");
    let hybrid = printed_slices(dir.path(), &["--cpu-device-mode", "individual"]);
    let types: BTreeSet<&str> = devices(&hybrid)
        .iter()
        .filter_map(|d| d["attributes"]["dra.cpu/coreType"]["string"].as_str())
        .collect();
    assert_eq!(types, BTreeSet::from(["e-core", "p-core"]));
}

#[test]
fn grouped_devices_per_numa_node_with_capacity_and_mapping() {
    let dir = written_tree("intel-2s-snc2-ht-128");
    let objects = printed_slices(dir.path(), &["--reserved-cpus", "0,64"]);
    assert_eq!(objects.len(), 1);
    let s = &objects[0];
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(s["kind"], "ResourceSlice");
    assert_eq!(s["metadata"]["name"], "node-1-dra.cpu-0");
    assert_eq!(s["spec"]["driver"], "dra.cpu");
    assert_eq!(s["spec"]["nodeName"], "node-1");
    assert_eq!(s["spec"]["pool"]["generation"], 1);
    assert!(s["metadata"].get("ownerReferences").is_none());
    let all = devices(&objects);
    let summary: Vec<(&str, &str)> = all
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap(),
                d["capacity"]["dra.cpu/cpu"]["value"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("cpudevnuma000", "30"),
            ("cpudevnuma001", "32"),
            ("cpudevnuma002", "32"),
            ("cpudevnuma003", "32")
        ]
    );
    assert_eq!(all[0]["allowMultipleAllocations"], true);
    assert_eq!(all[0]["attributes"]["dra.cpu/numCPUs"]["int"], 30);
    assert_eq!(all[2]["attributes"]["dra.cpu/socketID"]["int"], 1);
    assert_eq!(
        all[0]["nodeAllocatableResources"],
        serde_json::json!({"cpu": {"mapping": {"capacityKey": "dra.cpu/cpu", "capacityMultiplier": "1"}}})
    );
}

#[test]
fn driver_name_and_node_uid_flags() {
    let dir = written_tree("vm-2c-nosmt");
    let objects = printed_slices(
        dir.path(),
        &[
            "--driver-name",
            "cpu.example.com",
            "--node-uid",
            "1234-abcd",
            "--group-by",
            "machine",
        ],
    );
    let s = &objects[0];
    assert_eq!(s["metadata"]["name"], "node-1-cpu.example.com-0");
    assert_eq!(s["spec"]["driver"], "cpu.example.com");
    assert_eq!(s["metadata"]["labels"]["dra.cpu/driver"], "cpu.example.com");
    assert_eq!(
        s["metadata"]["ownerReferences"],
        serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "1234-abcd", "controller": true}])
    );
    assert_eq!(devices(&objects)[0]["name"], "cpudevmachine");
}

#[test]
fn bad_input_fails_with_a_message_naming_it() {
    let dir = written_tree("vm-2c-nosmt");
    let out = slices_output(dir.path(), &["--reserved-cpus", "1-3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CPUs 2-3 are not online"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("slices")
        .arg("--sysfs-root")
        .arg(dir.path())
        .args(["--node-name", "Node_1"])
        .output()
        .expect("running dra-plugin");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"Node_1\""), "{err}");

    let out = slices_output(Path::new("/nonexistent-sysfs"), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent-sysfs"), "{err}");
}
