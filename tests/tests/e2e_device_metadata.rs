//! End-to-end KEP-5304 device metadata on a real node: containerd applies
//! the claim's CDI spec, whose mount shows the request's metadata file at
//! the kubelet plugin helper's path inside the container; a process in the
//! container reads it, and its CPUs are the container's cgroup cpuset.
//! After a dra-plugin restart that finds the CDI directory and the file
//! gone (a reboot), a new container reads it again; after unprepare the
//! file is gone. Needs root and `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::{PodIdentity, RunningPod};
use dra_cpu_tests::node::Node;
use e2e_common::{claim_env, node};
use serde_json::Value;
use shared_state::CpuSet;
use std::path::PathBuf;

const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// The objects of a metadata file (a JSON stream, one per API version).
fn objects(text: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .must("the metadata file is a JSON stream")
}

/// `cat` of the claim's metadata file, run inside container `id`.
async fn read_inside(node: &mut Node, id: &str, claim_name: &str) -> String {
    let path = format!("{CONTAINER_DIR}/resourceclaims/{claim_name}/cpus/dra.cpu-metadata.json");
    node.cri
        .exec_ok(id, &["cat", &path])
        .await
        .must(&format!("reading {path} inside the container"))
}

/// The checks on what the container read: the format, the claim, and the
/// device's CPUs equal to `cgroup_cpus`.
fn check_metadata(text: &str, claim_uid: &str, claim_name: &str, cgroup_cpus: &CpuSet) {
    let objects = objects(text);
    let versions: Vec<&str> = objects
        .iter()
        .map(|o| o["apiVersion"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        versions,
        [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1"
        ],
        "{text}"
    );
    for doc in &objects {
        assert_eq!(doc["kind"], "DeviceMetadata", "{text}");
        assert_eq!(doc["metadata"]["uid"], claim_uid, "{text}");
        assert_eq!(doc["metadata"]["name"], claim_name, "{text}");
        let request = &doc["requests"][0];
        assert_eq!(request["name"], "cpus", "{text}");
        let devices = request["devices"].as_array().cloned().unwrap_or_default();
        assert_eq!(devices.len(), 1, "{text}");
        let device = &devices[0];
        assert_eq!(device["driver"], "dra.cpu");
        let attributes = &device["attributes"];
        let cpus = attributes["dra.cpu/cpus"]["string"]
            .as_str()
            .map(|s| CpuSet::parse_cpulist(s).must("dra.cpu/cpus is a cpulist"));
        assert_eq!(
            cpus.as_ref(),
            Some(cgroup_cpus),
            "the metadata's CPUs are the container's cgroup cpuset: {text}"
        );
        assert_eq!(
            attributes["dra.cpu/allocatedNumCPUs"]["int"].as_u64(),
            Some(cgroup_cpus.len() as u64),
            "{text}"
        );
        // The device's published attributes come along.
        assert!(attributes["dra.cpu/numCPUs"]["int"].is_u64(), "{text}");
        assert!(
            attributes["dra.cpu/smtEnabled"]["bool"].is_boolean(),
            "{text}"
        );
    }
}

/// A pod started by `start_and_read_metadata`.
struct MetadataPod {
    running: RunningPod,
    /// The container `app`.
    id: String,
    /// Its cgroup cpuset once pinned.
    cpus: CpuSet,
    /// The metadata file it read.
    text: String,
}

/// Starts `pod` with one container `app` on `claim`, waits until it is
/// pinned to the claim's CPUs, and checks the metadata file it reads.
async fn start_and_read_metadata(
    node: &mut Node,
    pod: &PodIdentity,
    claim: &PreparedClaim,
) -> MetadataPod {
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let running = node.start_pod(pod, &[spec]).await.must("starting the pod");
    let id = running.id("app").to_string();
    let pinned = node
        .wait_cpus(&id, &claim.cpus)
        .await
        .must("the container pinned to its claim");
    let text = read_inside(node, &id, &claim.claim.name).await;
    check_metadata(
        &text,
        &claim.claim.uid,
        &claim.claim.name,
        &pinned.cgroup.cpus,
    );
    MetadataPod {
        running,
        id,
        cpus: pinned.cgroup.cpus,
        text,
    }
}

#[tokio::test]
async fn a_claim_container_reads_its_device_metadata_and_a_reboot_rebuilds_it() {
    let mut node = node(NodeOptions::default()).await;
    let pod = PodIdentity::new("pod-meta");
    let claim = node
        .create_claim("meta-cpu", 1, &pod)
        .await
        .must("preparing the claim");
    let MetadataPod {
        running,
        id,
        cpus,
        text,
    } = start_and_read_metadata(&mut node, &pod, &claim).await;
    assert_eq!(
        claim_env(&mut node, &id, &claim.claim.uid).await,
        Some(cpus),
        "the env and the metadata agree"
    );
    // Read-only inside the container.
    let write = node
        .cri
        .exec_sync(
            &id,
            &[
                "sh",
                "-c",
                &format!(
                    "echo x > {CONTAINER_DIR}/resourceclaims/meta-cpu/cpus/dra.cpu-metadata.json"
                ),
            ],
        )
        .await
        .must("trying to write the metadata file");
    assert_ne!(write.exit_code, 0, "the metadata file is mounted read-only");

    // A reboot: dra-plugin down, the CDI directory (tmpfs) and the metadata
    // file lost. The restart rebuilds both before it registers.
    let host: PathBuf = node
        .layout()
        .kubelet_root()
        .join("plugins/dra.cpu/dra-device-metadata")
        .join(format!("default_{}", claim.claim.name))
        .join("cpus/metadata.json");
    let written = std::fs::read_to_string(&host).must("the metadata file on the host");
    assert_eq!(written, text, "the container sees the host's file");
    node.kill_dra_plugin();
    std::fs::remove_file(&host).must("losing the metadata file");
    let spec_file = node
        .layout()
        .cdi_dir
        .join(format!("dra.k8s.io-cpu_claim-{}.json", claim.claim.uid));
    std::fs::remove_file(&spec_file).must("losing the CDI spec");
    node.start_dra_plugin().await.must("restarting dra-plugin");
    node.wait_nri_ready(true).await.must("nri-plugin back on");
    assert_eq!(
        std::fs::read_to_string(&host).must("the rebuilt metadata file"),
        written
    );
    assert_eq!(node.claim_cpus(&claim.claim.uid), Some(claim.cpus.clone()));

    // The container is created again in the same sandbox and reads it.
    node.cri
        .stop_container(&id, 0)
        .await
        .must("stopping the container");
    node.cri
        .remove_container(&id)
        .await
        .must("removing the container");
    let again = node
        .cri
        .run_container(
            &running.sandbox,
            &ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device),
        )
        .await
        .must("creating the container again");
    let pinned = node
        .wait_cpus(&again, &claim.cpus)
        .await
        .must("the new container pinned");
    let text = read_inside(&mut node, &again, &claim.claim.name).await;
    check_metadata(
        &text,
        &claim.claim.uid,
        &claim.claim.name,
        &pinned.cgroup.cpus,
    );

    node.delete_pod(&running).await.must("deleting the pod");
    node.unprepare(&claim.claim).await.must("unpreparing");
    assert!(!host.exists(), "unprepare removes the metadata file");
    assert!(
        !host
            .parent()
            .and_then(|p| p.parent())
            .is_some_and(|d| d.exists()),
        "and the claim's directory"
    );
}

#[tokio::test]
async fn with_device_metadata_off_the_container_gets_only_its_cpus() {
    let mut node = node(NodeOptions {
        device_metadata: false,
        ..NodeOptions::default()
    })
    .await;
    let pod = PodIdentity::new("pod-plain");
    let claim = node
        .create_claim("plain-cpu", 1, &pod)
        .await
        .must("preparing the claim");
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let running = node.start_pod(&pod, &[spec]).await.must("starting the pod");
    let id = running.id("app").to_string();
    node.wait_cpus(&id, &claim.cpus)
        .await
        .must("the container pinned to its claim");
    let listing = node
        .cri
        .exec_sync(&id, &["ls", CONTAINER_DIR])
        .await
        .must("listing the metadata directory");
    assert_ne!(
        listing.exit_code, 0,
        "no metadata directory in the container: {listing:?}"
    );
    let spec_text = std::fs::read_to_string(
        node.layout()
            .cdi_dir
            .join(format!("dra.k8s.io-cpu_claim-{}.json", claim.claim.uid)),
    )
    .must("the claim's CDI spec");
    assert!(!spec_text.contains("mounts"), "{spec_text}");
    assert!(!node
        .layout()
        .kubelet_root()
        .join("plugins/dra.cpu/dra-device-metadata")
        .exists());
}

/// The longest claim name the API server takes (253 bytes): with the
/// namespace it passes a file name's 255 bytes on the host, where the
/// claim's directory is then shortened; inside the container the path has
/// the whole name, and the container reads its file.
#[tokio::test]
async fn a_claim_with_the_longest_name_gets_its_device_metadata() {
    let mut node = node(NodeOptions::default()).await;
    let pod = PodIdentity::new("pod-long");
    let name = format!("{}-cpu", "long".repeat(62));
    assert_eq!(name.len(), 252);
    let claim = node
        .create_claim(&format!("{name}x"), 1, &pod)
        .await
        .must("preparing the claim of the longest name");
    assert_eq!(claim.claim.name.len(), 253);
    let running = start_and_read_metadata(&mut node, &pod, &claim)
        .await
        .running;
    let root = node
        .layout()
        .kubelet_root()
        .join("plugins/dra.cpu/dra-device-metadata");
    let dirs: Vec<String> = std::fs::read_dir(&root)
        .must("the metadata root")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(
        dirs[0].len() <= 255 && dirs[0].starts_with(&format!("default_{}", &name[..200])),
        "{dirs:?}"
    );
    node.delete_pod(&running).await.must("deleting the pod");
    node.unprepare(&claim.claim).await.must("unpreparing");
    let left: Vec<_> = std::fs::read_dir(&root)
        .must("the metadata root")
        .filter_map(|e| e.ok())
        .collect();
    assert!(
        left.is_empty(),
        "unprepare removes the claim's directory: {left:?}"
    );
}
