//! The daemon end to end: registration for both DRA API versions, grouped
//! and individual prepare, idempotent prepare and unprepare, every refusal
//! with its message, concurrent prepares, restart from the store.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cpus_of, pod_uid, prepare_answer, prepare_ok, unprepare_one, Node, DRIVER, NODE};
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra};
use dra_plugin::devices::DeviceMode;
use shared_state::CpuSet;
use std::collections::BTreeSet;

fn ok_devices(
    answers: &std::collections::BTreeMap<String, dra_cpu_tests::kubelet_dra::PrepareOutcome>,
    claim: &Claim,
) -> Vec<dra_cpu_tests::kubelet_dra::PreparedDevice> {
    let outcome = answers
        .get(&claim.uid)
        .unwrap_or_else(|| panic!("no answer for {}", claim.uid));
    assert_eq!(outcome.error, "", "claim {} failed", claim.name);
    outcome.devices.clone()
}

/// Kubelet's NodePrepareResources for one claim, which must be refused:
/// the error, with no device.
async fn prepare_refused(kubelet: &KubeletDra, claim: &Claim) -> String {
    let outcome = prepare_answer(kubelet, claim).await;
    assert!(outcome.devices.is_empty(), "{outcome:?}");
    outcome.error
}

/// `dra-plugin inspect --state-dir` of the node, with `extra` arguments:
/// its JSON report.
fn inspect(node: &Node, extra: &[&std::ffi::OsStr]) -> serde_json::Value {
    let inspect = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .args(["inspect", "--state-dir"])
        .arg(&node.config.state_dir)
        .args(extra)
        .output()
        .expect("inspect");
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    serde_json::from_slice(&inspect.stdout).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_prepares_over_v1_and_v1beta1() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    assert_eq!(running.kubelet.info.r#type, "DRAPlugin");
    assert_eq!(running.kubelet.info.name, DRIVER);
    assert_eq!(
        running.kubelet.info.supported_versions,
        vec![
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    assert_eq!(
        running.kubelet.info.endpoint,
        node.config.dra_socket().to_string_lossy()
    );
    let a = node.claim("a", &[("cpudevnuma000", Some("2"))], &pod_uid(1));
    assert_eq!(prepare_ok(&running.kubelet, &a).await.devices.len(), 1);

    // An older kubelet registers the same plugin over v1beta1.
    let beta = KubeletDra::register(
        &node.registry_dir(),
        DRIVER,
        DraVersion::V1beta1,
        common::WAIT,
    )
    .await
    .expect("v1beta1 registration");
    let b = node.claim("b", &[("cpudevnuma000", Some("2"))], &pod_uid(2));
    let devices = prepare_ok(&beta, &b).await.devices;
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![format!("dra.k8s.io/cpu=claim-{}", b.uid)]
    );
    assert!(cpus_of(&node, &a).is_disjoint(&cpus_of(&node, &b)));
    let errors = beta
        .unprepare(&[a.clone(), b.clone()])
        .await
        .expect("v1beta1 unprepare");
    assert_eq!(errors.get(&a.uid).map(String::as_str), Some(""));
    assert_eq!(errors.get(&b.uid).map(String::as_str), Some(""));

    running.stop().await.expect("clean stop");
    for socket in dra_plugin::run::sockets(&node.config) {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_prepare_is_idempotent_and_unprepare_too() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let claim = node.claim("web", &[("cpudevnuma001", Some("4"))], &pod_uid(1));
    let devices = prepare_ok(&running.kubelet, &claim).await.devices;
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].pool_name, NODE);
    assert_eq!(devices[0].device_name, "cpudevnuma001");
    assert_eq!(devices[0].request_names, vec!["cpus0"]);
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![format!("dra.k8s.io/cpu=claim-{}", claim.uid)]
    );
    let cpus = cpus_of(&node, &claim);
    assert_eq!(cpus.len(), 4);
    assert!(cpus.is_subset(&node.topology.cpus_in_numa(1)), "{cpus}");
    // 4 CPUs on an SMT-2 machine: two whole cores.
    for cpu in &cpus {
        let core = node.topology.core_of(cpu).cloned().unwrap_or_default();
        assert!(core.is_subset(&cpus), "core of {cpu} split in {cpus}");
    }
    let spec = node.cdi_spec(&claim.uid).expect("CDI spec");
    assert_eq!(spec["kind"], "dra.k8s.io/cpu");
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"][0],
        format!("DRA_CPUSET_{}={cpus}", claim.uid)
    );

    // Kubelet retries: the same CPUs, even with another claim prepared in
    // between and the spec deleted behind our back.
    let other = node.claim("other", &[("cpudevnuma001", Some("4"))], &pod_uid(2));
    prepare_ok(&running.kubelet, &other).await;
    std::fs::remove_file(dra_plugin::cdi::CdiDir::new(&node.config.cdi_dir).spec_path(&claim.uid))
        .expect("remove spec");
    assert_eq!(prepare_ok(&running.kubelet, &claim).await.devices, devices);
    assert_eq!(cpus_of(&node, &claim), cpus);

    unprepare_one(&running.kubelet, &claim)
        .await
        .expect("unprepare");
    assert_eq!(node.cdi_cpus(&claim.uid), None);
    unprepare_one(&running.kubelet, &claim)
        .await
        .expect("unprepare again");
    let unknown = Claim {
        namespace: "default".into(),
        name: "never".into(),
        uid: "0badc0de-0000-4000-8000-000000000000".into(),
    };
    unprepare_one(&running.kubelet, &unknown)
        .await
        .expect("unknown");

    // The freed CPUs can be given again.
    let third = node.claim("third", &[("cpudevnuma001", Some("28"))], &pod_uid(3));
    prepare_ok(&running.kubelet, &third).await;
    assert!(cpus_of(&node, &third).is_disjoint(&cpus_of(&node, &other)));
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn individual_prepare_gives_the_named_cpus() {
    let node = Node::new(DeviceMode::Individual);
    let running = node.start(DraVersion::V1).await;
    // Siblings are numbered consecutively: cpudev000/001 are CPU 0 and its
    // sibling 64.
    let claim = node.claim(
        "pinned",
        &[("cpudev000", None), ("cpudev001", None)],
        &pod_uid(1),
    );
    let devices = prepare_ok(&running.kubelet, &claim).await.devices;
    let names: Vec<&str> = devices.iter().map(|d| d.device_name.as_str()).collect();
    assert_eq!(names, vec!["cpudev000", "cpudev001"]);
    assert_eq!(
        cpus_of(&node, &claim),
        CpuSet::parse_cpulist("0,64").expect("cpulist")
    );
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_says_what_is_wrong_and_leaves_nothing_behind() {
    let individual = Node::new(DeviceMode::Individual);
    let running = individual.start(DraVersion::V1).await;
    let holder = individual.claim("holder", &[("cpudev005", None)], &pod_uid(1));
    prepare_ok(&running.kubelet, &holder).await;
    let raw = |driver: &str, pool: &str, device: &str, cap: Option<&str>| {
        Some(vec![(
            driver.to_string(),
            pool.to_string(),
            device.to_string(),
            cap.map(str::to_string),
        )])
    };
    let pod = pod_uid(2);
    let cases: Vec<(Claim, String)> = vec![
        (
            Claim {
                namespace: "default".into(),
                name: "ghost".into(),
                uid: "0badc0de-0000-4000-8000-000000000001".into(),
            },
            "claim default/ghost (0badc0de-0000-4000-8000-000000000001) not found".into(),
        ),
        (
            individual.claim_raw("unallocated", None, None),
            "is not allocated".into(),
        ),
        (
            individual.claim_raw(
                "elsewhere",
                raw(DRIVER, "node-b", "cpudev001", None),
                Some(&pod),
            ),
            "is allocated from pool node-b, not from this node node-a".into(),
        ),
        (
            individual.claim_raw(
                "gpu",
                raw("gpu.example.com", NODE, "gpu0", None),
                Some(&pod),
            ),
            "has no allocation result for driver dra.cpu".into(),
        ),
        (
            individual.claim_raw("nodevice", raw(DRIVER, NODE, "cpudev999", None), Some(&pod)),
            "device cpudev999 (request cpus0) is not a device of this node".into(),
        ),
        (
            individual.claim_raw("taken", raw(DRIVER, NODE, "cpudev005", None), Some(&pod)),
            format!("are already held by claim {}", holder.uid),
        ),
        (
            individual.claim_raw("nopod", raw(DRIVER, NODE, "cpudev007", None), None),
            "is not reserved for any pod".into(),
        ),
    ];
    for (claim, want) in &cases {
        let error = prepare_refused(&running.kubelet, claim).await;
        assert!(error.contains(want.as_str()), "{}: {error}", claim.name);
        assert_eq!(
            individual.cdi_cpus(&claim.uid),
            None,
            "{}: CDI spec left",
            claim.name
        );
    }
    // All refused claims in one request: every one is answered.
    let all: Vec<Claim> = cases.iter().map(|(c, _)| c.clone()).collect();
    let answers = running.kubelet.prepare(&all).await.expect("batch");
    assert_eq!(answers.len(), all.len());
    assert!(answers.values().all(|a| !a.error.is_empty()));
    running.stop().await.expect("clean stop");

    let grouped = Node::new(DeviceMode::Grouped);
    let running = grouped.start(DraVersion::V1).await;
    let cases = [
        (
            "fraction",
            "1500m",
            "consumedCapacity dra.cpu/cpu \"1500m\" is not a whole positive number of CPUs",
        ),
        ("zero", "0", "\"0\" is not a whole positive number of CPUs"),
        (
            "toomany",
            "33",
            "33 CPUs requested but only 32 CPUs of the group",
        ),
    ];
    for (name, cap, want) in cases {
        let claim = grouped.claim(name, &[("cpudevnuma002", Some(cap))], &pod_uid(3));
        let error = prepare_refused(&running.kubelet, &claim).await;
        assert!(error.contains(want), "{name}: {error}");
        assert_eq!(grouped.cdi_cpus(&claim.uid), None);
    }
    // A refusal took nothing: the whole group is still free.
    let whole = grouped.claim("whole", &[("cpudevnuma002", Some("32"))], &pod_uid(4));
    prepare_ok(&running.kubelet, &whole).await;
    assert_eq!(cpus_of(&grouped, &whole), grouped.topology.cpus_in_numa(2));
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_prepares_never_share_a_cpu() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    // 10 claims of 4 CPUs on a 32-CPU NUMA node: exactly 8 fit.
    let claims: Vec<Claim> = (0..10)
        .map(|i| {
            node.claim(
                &format!("c{i}"),
                &[("cpudevnuma003", Some("4"))],
                &pod_uid(i),
            )
        })
        .collect();
    let mut tasks = Vec::new();
    for claim in &claims {
        let kubelet = running.kubelet.clone();
        let claim = claim.clone();
        tasks.push(tokio::spawn(async move {
            let answers = kubelet
                .prepare(std::slice::from_ref(&claim))
                .await
                .expect("prepare");
            answers.get(&claim.uid).cloned().expect("answer")
        }));
    }
    let mut granted: Vec<CpuSet> = Vec::new();
    let mut refused = 0;
    for (claim, task) in claims.iter().zip(tasks) {
        let outcome = task.await.expect("task");
        if outcome.error.is_empty() {
            granted.push(cpus_of(&node, claim));
        } else {
            assert!(
                outcome.error.contains("CPUs of the group"),
                "{}",
                outcome.error
            );
            refused += 1;
        }
    }
    assert_eq!(granted.len(), 8);
    assert_eq!(refused, 2);
    let mut seen = CpuSet::new();
    for cpus in &granted {
        assert_eq!(cpus.len(), 4);
        assert!(cpus.is_disjoint(&seen), "{cpus} overlaps {seen}");
        seen = seen.union(cpus);
    }
    assert_eq!(seen, node.topology.cpus_in_numa(3));
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_serves_the_stored_assignments_and_reconciles_cdi() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let a = node.claim("a", &[("cpudevnuma000", Some("6"))], &pod_uid(1));
    let b = node.claim("b", &[("cpudevnuma000", Some("2"))], &pod_uid(2));
    let answers = running
        .kubelet
        .prepare(&[a.clone(), b.clone()])
        .await
        .expect("prepare");
    let a_devices = ok_devices(&answers, &a);
    ok_devices(&answers, &b);
    let (a_cpus, b_cpus) = (cpus_of(&node, &a), cpus_of(&node, &b));
    running.stop().await.expect("clean stop");

    // While it was down: a spec lost, an orphan left, and the API server
    // no longer has claim a (restart must not need it).
    let cdi = dra_plugin::cdi::CdiDir::new(&node.config.cdi_dir);
    std::fs::remove_file(cdi.spec_path(&b.uid)).expect("remove spec");
    let orphan = "0dd0dd00-0000-4000-8000-000000000000";
    cdi.write(orphan, &CpuSet::parse_cpulist("100").expect("cpulist"))
        .expect("orphan");
    let report = inspect(
        &node,
        &["--sysfs-root".as_ref(), node.config.sysfs_root.as_os_str()],
    );
    assert_eq!(report["source"], "store");
    assert_eq!(report["claims"].as_array().map(Vec::len), Some(2));
    assert_eq!(report["exclusive"], a_cpus.union(&b_cpus).to_cpulist());

    let running = node.start(DraVersion::V1).await;
    assert_eq!(
        node.cdi_cpus(&b.uid),
        Some(b_cpus.clone()),
        "missing spec rewritten"
    );
    assert_eq!(node.cdi_cpus(orphan), None, "orphan removed");
    let again = running
        .kubelet
        .prepare(&[a.clone(), b.clone()])
        .await
        .expect("prepare");
    assert_eq!(ok_devices(&again, &a), a_devices);
    assert_eq!(cpus_of(&node, &a), a_cpus);
    assert_eq!(cpus_of(&node, &b), b_cpus);
    // New claims still avoid the stored CPUs.
    let c = node.claim("c", &[("cpudevnuma000", Some("24"))], &pod_uid(3));
    prepare_ok(&running.kubelet, &c).await;
    let c_cpus = cpus_of(&node, &c);
    assert!(c_cpus.is_disjoint(&a_cpus.union(&b_cpus)));

    // inspect reads through the socket while the daemon holds the store.
    let report = inspect(&node, &[]);
    assert_eq!(report["source"], "socket");
    let uids: BTreeSet<String> = report["claims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["uid"].as_str().map(str::to_string))
        .collect();
    assert_eq!(uids, [a.uid.clone(), b.uid.clone(), c.uid.clone()].into());
    let allocatable = node.topology.online();
    let exclusive = a_cpus.union(&b_cpus).union(&c_cpus);
    assert_eq!(
        report["shared"],
        allocatable.difference(&exclusive).to_cpulist()
    );
    running.stop().await.expect("clean stop");
}
