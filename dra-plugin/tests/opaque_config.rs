//! The upstream driver's opaque cpuset config through NodePrepareResources:
//! a claim whose allocation config sets `cpuConfig.cpuset` for its request
//! gets exactly those CPUs, and every invalid config fails that claim's
//! prepare with its reason and leaves no CDI spec and no CPUs taken.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cpus_of, pod_uid, Node, DRIVER, NODE};
use dra_cpu_tests::claims::AllocatedClaim;
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, PrepareOutcome};
use dra_plugin::devices::DeviceMode;
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;
use shared_state::CpuSet;
use std::collections::BTreeMap;

const REQUEST: &str = "cpus";

fn set(s: &str) -> CpuSet {
    CpuSet::parse_cpulist(s).expect("cpulist")
}

/// The first `n` CPUs of `from`.
fn take(from: &CpuSet, n: usize) -> CpuSet {
    from.iter().take(n).fold(CpuSet::new(), |mut acc, cpu| {
        acc.insert(cpu);
        acc
    })
}

fn config(source: &str, parameters: serde_json::Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: Some(vec![REQUEST.into()]),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER.into(),
            parameters: RawExtension(parameters),
        }),
    }
}

fn cpuset(cpus: &str) -> serde_json::Value {
    json!({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": cpus}})
}

/// A claim of `consumed` CPUs of `device`, request `cpus`, with `configs`
/// in its allocation, reserved for one pod, created on the API server.
fn claim(
    node: &Node,
    name: &str,
    device: &str,
    consumed: usize,
    configs: Vec<DeviceAllocationConfiguration>,
) -> Claim {
    let object = AllocatedClaim::new("default", name, NODE, device, consumed)
        .empty_spec()
        .request(REQUEST)
        .configs(configs)
        .reserved_for(&format!("pod-{name}"), &pod_uid(7))
        .build();

    let created = node.api.insert_claim(object).expect("insert claim");
    Claim {
        namespace: "default".into(),
        name: name.into(),
        uid: created.metadata.uid.expect("server-assigned uid"),
    }
}

fn outcome<'a>(answers: &'a BTreeMap<String, PrepareOutcome>, claim: &Claim) -> &'a PrepareOutcome {
    answers
        .get(&claim.uid)
        .unwrap_or_else(|| panic!("no answer for {}", claim.name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opaque_cpuset_is_prepared_exactly_and_every_invalid_one_refused() {
    let node = Node::with(DeviceMode::Grouped, |s| s.reserved_cpus = Some(set("0")));
    let running = node.start(DraVersion::V1).await;
    let kubelet = &running.kubelet;
    let numa0 = node.topology.cpus_in_numa(0);
    let numa1 = node.topology.cpus_in_numa(1);
    assert!(
        numa0.contains(0),
        "CPU 0 is on NUMA node 0 in {}",
        common::FIXTURE
    );

    // A claim without config: this driver picks its CPUs.
    let holder = claim(&node, "holder", "cpudevnuma000", 2, vec![]);
    let answers = kubelet
        .prepare(std::slice::from_ref(&holder))
        .await
        .expect("prepare");
    assert_eq!(outcome(&answers, &holder).error, "");
    let held = cpus_of(&node, &holder);

    // The scheduler's choice, prepared as written.
    let free = numa0.difference(&set("0")).difference(&held);
    let wanted = take(
        &free.iter().skip(3).fold(CpuSet::new(), |mut a, c| {
            a.insert(c);
            a
        }),
        2,
    );
    let chosen = claim(
        &node,
        "chosen",
        "cpudevnuma000",
        2,
        vec![config("FromClaim", cpuset(&wanted.to_cpulist()))],
    );
    let answers = kubelet
        .prepare(std::slice::from_ref(&chosen))
        .await
        .expect("prepare");
    assert_eq!(outcome(&answers, &chosen).error, "");
    assert_eq!(cpus_of(&node, &chosen), wanted);

    let spare = free.difference(&wanted);
    let two = take(&spare, 2).to_cpulist();
    let three = take(&spare, 3).to_cpulist();
    let one = take(&spare, 1).to_cpulist();
    let outside = take(&numa1, 1).to_cpulist();
    let cases: Vec<(&str, Vec<DeviceAllocationConfiguration>, String)> = vec![
        (
            "size",
            vec![config("FromClaim", cpuset(&three))],
            format!("request cpus: cpuset {three} has 3 CPUs but the request consumed 2"),
        ),
        (
            "offline",
            vec![config("FromClaim", cpuset(&format!("{one},500")))],
            format!("request cpus: cpuset {one},500: CPUs 500 are not online"),
        ),
        (
            "reserved",
            vec![config("FromClaim", cpuset(&format!("0,{one}")))],
            format!("request cpus: cpuset 0,{one}: CPUs 0 are reserved"),
        ),
        (
            "taken",
            vec![config("FromClaim", cpuset(&held.to_cpulist()))],
            format!("CPUs {held} are already held by claim {}", holder.uid),
        ),
        (
            "outside",
            vec![config("FromClaim", cpuset(&format!("{one},{outside}")))],
            format!("CPUs {outside} are not in device cpudevnuma000"),
        ),
        (
            "two-configs",
            vec![
                config("FromClaim", cpuset(&two)),
                config("FromClaim", cpuset(&two)),
            ],
            "request cpus: configs 0 and 1 both set its cpuset".into(),
        ),
        (
            "deviceclass",
            vec![config("FromClass", cpuset(&two))],
            "config 0 has source \"FromClass\": only \"FromClaim\" configs are honoured".into(),
        ),
        (
            "apiversion",
            vec![config(
                "FromClaim",
                json!({"apiVersion": "v1beta1", "cpuConfig": {"cpuset": two}}),
            )],
            "config 0: unsupported apiVersion \"v1beta1\", want \"v1alpha1\"".into(),
        ),
    ];
    for (name, configs, want) in cases {
        let refused = claim(&node, name, "cpudevnuma000", 2, configs);
        let answers = kubelet
            .prepare(std::slice::from_ref(&refused))
            .await
            .expect("prepare");
        let got = outcome(&answers, &refused);
        assert!(got.devices.is_empty(), "{name}: {got:?}");
        assert!(
            got.error.contains("opaque cpuset config"),
            "{name}: {}",
            got.error
        );
        assert!(
            got.error.contains(&want),
            "{name}: {}\nwant: {want}",
            got.error
        );
        assert_eq!(node.cdi_cpus(&refused.uid), None, "{name}: CDI spec left");
    }
    // The refusals took nothing: every other CPU of the group is still free.
    let rest = numa0.len() - 1 - held.len() - wanted.len();
    let whole = claim(&node, "rest", "cpudevnuma000", rest, vec![]);
    let answers = kubelet
        .prepare(std::slice::from_ref(&whole))
        .await
        .expect("prepare");
    assert_eq!(outcome(&answers, &whole).error, "");
    assert_eq!(cpus_of(&node, &whole), free.difference(&wanted));
    running.stop().await.expect("clean stop");
}
