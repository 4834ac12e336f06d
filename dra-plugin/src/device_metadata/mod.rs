//! KEP-5304 device metadata: a JSON file per request of a prepared claim,
//! bind-mounted read-only into the claim's container, that tells the
//! workload which devices it got, with their attributes and this driver's
//! own `dra.cpu/allocatedNumCPUs` and `dra.cpu/cpus`.
//!
//! What the Go kubelet plugin helper does when a driver starts it with
//! `EnableDeviceMetadata` (k8s.io/dynamic-resource-allocation: read in
//! `kubeletplugin/metadata.go` and `kubeletplugin/draplugin.go` of the
//! published module at 2026-07-01 (3d03671) and of kubernetes/kubernetes'
//! staging tree, in `api/metadata/{doc,types,helpers}.go`,
//! `api/metadata/v1beta1/{types,register}.go` and the compatibility
//! fixture `api/metadata/testdata/HEAD/metadata.json` (v1beta1 then
//! v1alpha1) of the staging tree; the 1.37 `metadata.go`, which routes its
//! file writes through a `MetadataFileOperations` hook, was not available
//! to read, so its write mechanics are not compared here; upstream
//! dra-driver-cpu main de98098 calls it as
//! `EnableDeviceMetadata(true, []schema.GroupVersion{metadata v1beta1})` in
//! `pkg/driver/driver.go` and fills `Device.Metadata` in
//! `pkg/driver/dra_hooks.go` `prepareDevices`), and what this module does:
//!
//! - **Gate.** None: KEP-5304's kep.yaml lists `feature-gates: NA`; the
//!   driver opts in (alpha in 1.36, beta in 1.37). Kubelet only passes the
//!   extra CDI device id on to the runtime, which every DRA kubelet does;
//!   the runtime must apply CDI `mounts` (containerd >= 1.7 with CDI on,
//!   CRI-O >= 1.23). Here it is on by default and
//!   `--disable-device-metadata` turns it off.
//! - **File on the host.** `<plugin data dir>/dra-device-metadata/
//!   <namespace>_<claim name>/<request>/metadata.json`; the plugin data
//!   dir is `<kubelet root>/plugins/<driver>` (upstream passes exactly that
//!   as `PluginDataDirectoryPath`). One file per request, the request's
//!   base name (a `firstAvailable` subrequest `req/sub` is filed under
//!   `req`), mode 0644, directories 0755.
//! - **File in the container.** `/var/run/kubernetes.io/
//!   dra-device-attributes/resourceclaims/<claim name>/<request>/
//!   <driver>-metadata.json` for a claim the pod names directly, or
//!   `.../resourceclaimtemplates/<pod claim name>/<request>/
//!   <driver>-metadata.json` for a claim made from a template, the pod
//!   claim name being the claim's `resource.kubernetes.io/pod-claim-name`
//!   annotation (a template claim's own name is generated and not known
//!   when the pod spec is written).
//! - **Format.** A JSON stream: the same `DeviceMetadata` object once per
//!   API version, newest first, each followed by a newline; a reader takes
//!   the first version it knows (`devicemetadata.DecodeMetadataFromStream`).
//!   Object: `kind: DeviceMetadata`, `apiVersion:
//!   metadata.resource.k8s.io/<version>`, `metadata: {name, namespace,
//!   uid, generation}` (the claim's; generation 1 at prepare, raised only
//!   by `UpdateRequestMetadata`, which a CPU driver never needs),
//!   `podClaimName` (only for template claims), `requests: [{name,
//!   devices: [{driver, pool, name, attributes}]}]` where `name` is the
//!   full request reference (with a subrequest) and `attributes` has the
//!   ResourceSlice form (`{"int": 4}`, `{"bool": true}`, `{"string": ..}`,
//!   `{"version": ..}`). v1beta1 and v1alpha1 have the same fields. This
//!   module writes v1beta1 then v1alpha1, as the 1.37 helper does when a
//!   driver lists both: 1.37 readers find v1beta1, readers built against
//!   the 1.36 library (which knows only v1alpha1) still find theirs.
//!   Upstream lists v1beta1 only.
//! - **How it reaches the container.** The helper writes a second CDI spec
//!   per request, `<cdi dir>/<driver>_metadata_<claim uid>_<request>.json`,
//!   kind `<driver>/metadata`, device `<claim uid>_<request>`, whose only
//!   edit is the mount `{hostPath, containerPath, options: [ro, bind]}`,
//!   and appends `<driver>/metadata=<uid>_<request>` to the CDI ids of the
//!   first device of that request in the NodePrepareResources answer. This
//!   driver already answers one CDI device per claim (`claim-<uid>`, given
//!   to every request of it, since one claim belongs to one container), so
//!   the same mounts go into that device's `containerEdits.mounts`
//!   ([`shared_state::cdi_spec::ClaimSpec::with_mounts`]): the container
//!   sees the same files at the same paths, with no second spec to write,
//!   fsync and keep consistent with the first. A container naming only one
//!   request of a multi-request claim sees every request's file (it sees
//!   every request's CPUs in its env already).
//! - **When.** Written at prepare before the answer (the helper writes
//!   after the driver's prepare returns, plain `os.WriteFile`), removed at
//!   unprepare (the helper removes the `<namespace>_<claim name>`
//!   directory and the metadata CDI specs). The helper does nothing at
//!   start-up; here [`DeviceMetadata::reconcile`] rebuilds every stored
//!   claim's files (and removes others') before registration, with the CDI
//!   specs.
//! - **Attributes.** Upstream attaches the device's published slice
//!   attributes plus `dra.cpu/allocatedNumCPUs` (int, from the result's
//!   consumed capacity; upstream only on grouped devices). Here every
//!   device gets both, `allocatedNumCPUs` being the consumed capacity or,
//!   for an individual device, its CPU count (1), and also `dra.cpu/cpus`:
//!   the exact CPUs of the claim on that device as a cpulist string. When
//!   two requests of one claim consume from the same grouped device, each
//!   lists the claim's CPUs on that device (which of them went to which
//!   request is not recorded).
//!
//! Durability: a file is written to a temporary name in its directory and
//! renamed, so a reader never sees half of one, but not fsynced: the store
//! record, committed and fsynced first, is the durable copy, and only a
//! power loss or kernel crash can lose the page cache; the node then
//! reboots and start-up reconciliation rewrites every file whose bytes
//! differ before kubelet can call us, as it does for the CDI specs. A
//! prepare therefore adds no fsync.

pub mod host_files;
mod render;

use crate::publisher::DesiredDevices;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use shared_state::cdi_spec::Mount;
use shared_state::{ClaimAssignment, CpuSet};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The versions written, newest first.
pub const API_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];
pub const KIND: &str = "DeviceMetadata";
/// Where the files appear inside a container.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// Under [`CONTAINER_DIR`], claims a pod names directly.
pub const RESOURCE_CLAIMS_SUBDIR: &str = "resourceclaims";
/// Under [`CONTAINER_DIR`], claims made from a template.
pub const RESOURCE_CLAIM_TEMPLATES_SUBDIR: &str = "resourceclaimtemplates";
/// Under the plugin data directory, on the host: where the files go unless
/// `--device-metadata-dir` names another directory (the Go helper's place).
pub const HOST_SUBDIR: &str = "dra-device-metadata";
pub const HOST_FILE_NAME: &str = "metadata.json";
/// Metadata only (not published): CPUs of the device given to the claim.
pub const ATTR_ALLOCATED_NUM_CPUS: &str = "dra.cpu/allocatedNumCPUs";
/// Metadata only, this project's own: the claim's CPUs on the device.
pub const ATTR_CPUS: &str = "dra.cpu/cpus";
/// A temporary file ends so; it sits beside the file it replaces.
const TEMP_SUFFIX: &str = ".tmp";

/// The published attributes of each device, by device name: an index over
/// the devices the publisher holds, shared with it rather than copied (on
/// a 1024-CPU node a copy of the individual devices' attributes is about
/// 2 MiB).
#[derive(Debug, Clone, Default)]
pub struct PublishedAttributes {
    devices: Arc<DesiredDevices>,
    /// Device name: where in the preferred list.
    index: BTreeMap<String, usize>,
    /// Device name: where in the fallback list, made when a name is not in
    /// the preferred list (the fallback is built then if it was not yet).
    fallback_index: OnceLock<BTreeMap<String, usize>>,
}

impl PublishedAttributes {
    /// The attributes of every device `desired` may publish, in either list.
    pub fn of(desired: Arc<DesiredDevices>) -> PublishedAttributes {
        let index = names_index(&desired.devices);
        PublishedAttributes {
            devices: desired,
            index,
            fallback_index: OnceLock::new(),
        }
    }

    /// The published attributes of the device named `name`.
    pub fn get(&self, name: &str) -> Option<&BTreeMap<String, DeviceAttribute>> {
        let device = match self.index.get(name) {
            Some(&i) => self.devices.devices.get(i)?,
            None => {
                let fallback = self
                    .devices
                    .without_consumable_capacity
                    .as_deref()?
                    .get()
                    .ok()?;
                let index = self.fallback_index.get_or_init(|| names_index(fallback));
                fallback.get(*index.get(name)?)?
            }
        };
        device.attributes.as_ref()
    }
}

fn names_index(devices: &[Device]) -> BTreeMap<String, usize> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.clone(), i))
        .collect()
}

/// The attributes of `devices` as published.
pub fn published_attributes<'a>(
    devices: impl IntoIterator<Item = &'a Device>,
) -> PublishedAttributes {
    let devices: Vec<Device> = devices.into_iter().cloned().collect();
    PublishedAttributes::of(Arc::new(DesiredDevices::from(devices)))
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("claim {claim}: {what} {value:?} cannot name a device metadata path (a DNS name is expected)")]
    BadName {
        claim: String,
        what: &'static str,
        value: String,
    },
    #[error("device metadata {path}: {operation} failed: {source}")]
    Io {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path, operation: &'static str) -> impl FnOnce(std::io::Error) -> MetadataError {
    let path = path.to_path_buf();
    move |source| MetadataError::Io {
        path,
        operation,
        source,
    }
}

/// One request's file: where it is on the host and in the container, and
/// its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataFile {
    pub host_path: PathBuf,
    pub container_path: String,
    pub body: Vec<u8>,
}

/// Every file of one prepared claim, all inside `claim_dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMetadata {
    pub claim_dir: PathBuf,
    pub files: Vec<MetadataFile>,
}

impl ClaimMetadata {
    /// The CDI mounts that show the files in the container.
    pub fn mounts(&self) -> Vec<Mount> {
        self.files
            .iter()
            .map(|f| Mount::read_only_file(&f.host_path.to_string_lossy(), &f.container_path))
            .collect()
    }
}

/// A name that can be one path segment: what the API server allows for
/// namespaces, claim names and request names (DNS labels and subdomains),
/// so never empty, `.`, `..` or holding `/`.
fn is_path_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// `req` of `req/sub`.
fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// What a driver writes for its prepared claims.
#[derive(Debug, Clone)]
pub struct DeviceMetadata {
    driver_name: String,
    /// `--device-metadata-dir`, by default `<plugin data dir>/dra-device-metadata`.
    host_root: PathBuf,
    attributes: PublishedAttributes,
    device_cpus: BTreeMap<String, CpuSet>,
}

impl DeviceMetadata {
    /// `host_root` is the host directory the files go under (see
    /// [`default_host_root`]); `device_cpus` the CPUs each device stands for.
    pub fn new(
        driver_name: &str,
        host_root: &Path,
        attributes: PublishedAttributes,
        device_cpus: BTreeMap<String, CpuSet>,
    ) -> DeviceMetadata {
        DeviceMetadata {
            driver_name: driver_name.to_string(),
            host_root: host_root.to_path_buf(),
            attributes,
            device_cpus,
        }
    }

    pub fn host_root(&self) -> &Path {
        &self.host_root
    }

    /// The directory of a claim's files.
    pub fn claim_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.host_root.join(claim_dir_name(namespace, name))
    }
}

/// The longest file name Linux file systems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// `<namespace>_<name>`, the helper's name, when it fits in one file name.
/// A namespace (63 bytes) and a claim name (253) can pass [`NAME_MAX`]
/// together, where the helper's directory could not be made and the claim
/// could not be prepared; such a name keeps as much of the claim's name as
/// fits and ends in a hash of the whole, so two claims that share the kept
/// part still differ. Only the host directory is named so: the path in the
/// container has the claim name alone, which always fits.
fn claim_dir_name(namespace: &str, name: &str) -> String {
    let full = format!("{namespace}_{name}");
    if full.len() <= NAME_MAX {
        return full;
    }
    // FNV-1a, 64 bits: stable across builds and releases, which the
    // directories outlive.
    let hash = full.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let suffix = format!("-{hash:016x}");
    let mut keep = NAME_MAX - suffix.len();
    while !full.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &full[..keep])
}

/// Whether every name of a claim that goes into a metadata path can be
/// one path segment; what [`DeviceMetadata::render`] checks first, cheap
/// enough for prepare to ask before it commits.
pub fn check_names(claim: &ClaimAssignment) -> Result<(), MetadataError> {
    let check = |what: &'static str, value: &str| {
        if is_path_segment(value) {
            Ok(())
        } else {
            Err(MetadataError::BadName {
                claim: format!("{}/{} ({})", claim.namespace, claim.name, claim.claim_uid),
                what,
                value: value.to_string(),
            })
        }
    };
    check("namespace", &claim.namespace)?;
    check("name", &claim.name)?;
    if let Some(pod_claim_name) = claim.pod_claim_name.as_deref().filter(|n| !n.is_empty()) {
        check("pod claim name", pod_claim_name)?;
    }
    for device in &claim.devices {
        check("request", base_request(&device.request))?;
    }
    Ok(())
}

/// `<plugin data dir>/dra-device-metadata`, where the Go helper writes the
/// files and where they go unless `--device-metadata-dir` says otherwise.
pub fn default_host_root(plugin_data_dir: &Path) -> PathBuf {
    plugin_data_dir.join(HOST_SUBDIR)
}

/// Why `dir` cannot hold the device metadata files, if it cannot: dra-plugin
/// owns that directory (it removes whatever no stored claim explains), so
/// it must be an absolute path of its own, not one that holds the CDI
/// specs, the store or kubelet's files.
pub fn dir_problem(
    dir: &Path,
    cdi_dir: &Path,
    state_dir: &Path,
    kubelet_root_dir: &Path,
) -> Option<&'static str> {
    use std::path::Component;
    if !dir.is_absolute() {
        return Some("must be an absolute path");
    }
    if dir.components().any(|c| matches!(c, Component::ParentDir)) {
        return Some("must not contain '..'");
    }
    if dir.parent().is_none() {
        return Some("must not be the root directory");
    }
    [
        (cdi_dir, "must not be or hold the CDI directory"),
        (state_dir, "must not be or hold the state directory"),
        (
            kubelet_root_dir,
            "must not be or hold kubelet's root directory",
        ),
    ]
    .into_iter()
    .find_map(|(owned, why)| owned.starts_with(dir).then_some(why))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_claim_directory_name_fits_one_file_name() {
        use super::{claim_dir_name, NAME_MAX};
        let name_253 = "a".repeat(253);
        let cases: [(&str, &str, Option<&str>); 3] = [
            ("team", "web-cpu", Some("team_web-cpu")),
            // 191 + 1 + 63 = 255: still the helper's name.
            (&"n".repeat(63), &"b".repeat(191), None),
            (&"n".repeat(63), &name_253, None),
        ];
        for (namespace, name, want) in cases {
            let got = claim_dir_name(namespace, name);
            assert!(got.len() <= NAME_MAX, "{} bytes", got.len());
            let full = format!("{namespace}_{name}");
            if full.len() <= NAME_MAX {
                assert_eq!(got, full);
            } else {
                assert_eq!(got.len(), NAME_MAX);
                assert!(full.starts_with(&got[..NAME_MAX - 17]), "{got}");
            }
            if let Some(want) = want {
                assert_eq!(got, want);
            }
            // Stable: the same claim always has the same directory.
            assert_eq!(got, claim_dir_name(namespace, name));
        }
        let other = format!("{}b", "a".repeat(252));
        assert_ne!(
            claim_dir_name(&"n".repeat(63), &name_253),
            claim_dir_name(&"n".repeat(63), &other)
        );
    }

    use super::*;

    #[test]
    fn a_metadata_dir_must_be_a_directory_of_its_own() {
        let (cdi, state, kubelet) = (
            Path::new("/var/run/cdi"),
            Path::new("/var/lib/dra-cpu"),
            Path::new("/var/lib/kubelet"),
        );
        for (dir, problem) in [
            ("/var/run/dra-cpu/device-metadata", None),
            ("/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata", None),
            ("/var/run/cdi/metadata", None),
            ("run/md", Some("must be an absolute path")),
            ("/var/run/../md", Some("must not contain '..'")),
            ("/", Some("must not be the root directory")),
            ("/var/run", Some("must not be or hold the CDI directory")),
            (
                "/var/run/cdi",
                Some("must not be or hold the CDI directory"),
            ),
            ("/var/lib", Some("must not be or hold the state directory")),
            (
                "/var/lib/kubelet",
                Some("must not be or hold kubelet's root directory"),
            ),
        ] {
            assert_eq!(
                dir_problem(Path::new(dir), cdi, state, kubelet),
                problem,
                "{dir}"
            );
        }
    }
}

/// Builders the unit tests of the render and host-file rooms share.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use shared_state::AllocatedDevice;

    pub const UID: &str = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";

    pub fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    pub fn int(v: i64) -> DeviceAttribute {
        DeviceAttribute {
            int: Some(v),
            ..Default::default()
        }
    }

    fn device(name: &str, attributes: BTreeMap<String, DeviceAttribute>) -> Device {
        Device {
            name: name.to_string(),
            attributes: Some(attributes),
            ..Default::default()
        }
    }

    #[test]
    fn the_fallback_devices_are_built_only_for_a_name_of_theirs() {
        use crate::publisher::FallbackDevices;
        let desired = Arc::new(DesiredDevices {
            devices: vec![device(
                "cpudevnuma000",
                BTreeMap::from([("dra.cpu/numCPUs".to_string(), int(8))]),
            )],
            without_consumable_capacity: Some(Arc::new(FallbackDevices::lazy(|| {
                Ok(vec![device(
                    "cpudev005",
                    BTreeMap::from([("dra.cpu/cpuID".to_string(), int(5))]),
                )])
            }))),
        });
        let fallback = || desired.without_consumable_capacity.as_deref().unwrap();
        let attributes = PublishedAttributes::of(desired.clone());
        assert!(attributes.get("cpudevnuma000").is_some());
        assert!(
            fallback().if_built().is_none(),
            "a preferred device needs no fallback"
        );
        assert_eq!(
            attributes.get("cpudev005").map(|a| a["dra.cpu/cpuID"].int),
            Some(Some(5))
        );
        assert!(fallback().if_built().is_some());
        assert!(attributes.get("cpudev006").is_none());
    }

    pub fn metadata(root: &Path) -> DeviceMetadata {
        let numa0 = BTreeMap::from([
            ("resource.kubernetes.io/numaNode".to_string(), int(0)),
            ("dra.cpu/numCPUs".to_string(), int(8)),
            (
                "dra.cpu/smtEnabled".to_string(),
                DeviceAttribute {
                    bool: Some(true),
                    ..Default::default()
                },
            ),
        ]);
        let cpu5 = BTreeMap::from([("dra.cpu/cpuID".to_string(), int(5))]);
        DeviceMetadata::new(
            "dra.cpu",
            &default_host_root(root),
            published_attributes(&[device("cpudevnuma000", numa0), device("cpudev005", cpu5)]),
            BTreeMap::from([
                ("cpudevnuma000".to_string(), set("0-7")),
                ("cpudevnuma001".to_string(), set("8-15")),
                ("cpudev005".to_string(), set("5")),
            ]),
        )
    }

    pub fn claim(devices: &[(&str, &str, Option<u32>)], cpus: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: UID.into(),
            namespace: "team".into(),
            name: "web-cpu".into(),
            consumer_pods: vec!["pod-uid".into()],
            devices: devices
                .iter()
                .map(|(request, device, consumed)| AllocatedDevice {
                    request: request.to_string(),
                    pool: "node-a".into(),
                    device: device.to_string(),
                    consumed_cpus: *consumed,
                    share_id: None,
                })
                .collect(),
            cpus: set(cpus),
            prepared_at_unix_ms: 0,
            pod_claim_name: None,
            tuning: Default::default(),
        }
    }

    pub fn objects(body: &[u8]) -> Vec<serde_json::Value> {
        serde_json::Deserializer::from_slice(body)
            .into_iter::<serde_json::Value>()
            .collect::<Result<_, _>>()
            .unwrap_or_default()
    }
}
