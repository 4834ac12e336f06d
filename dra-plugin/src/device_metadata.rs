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

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use serde::Serialize;
use shared_state::cdi_spec::Mount;
use shared_state::{ClaimAssignment, CpuSet};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// The published attributes of each device, by device name.
pub type PublishedAttributes = BTreeMap<String, BTreeMap<String, DeviceAttribute>>;

/// The attributes of `devices` as published.
pub fn published_attributes<'a>(
    devices: impl IntoIterator<Item = &'a Device>,
) -> PublishedAttributes {
    devices
        .into_iter()
        .map(|d| (d.name.clone(), d.attributes.clone().unwrap_or_default()))
        .collect()
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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: ObjectMeta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: Vec<Request<'a>>,
}

#[derive(Serialize)]
struct ObjectMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    generation: i64,
}

#[derive(Serialize)]
struct Request<'a> {
    name: &'a str,
    devices: Vec<MetaDevice<'a>>,
}

#[derive(Serialize)]
struct MetaDevice<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    attributes: BTreeMap<String, DeviceAttribute>,
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
        self.host_root.join(format!("{namespace}_{name}"))
    }

    /// The attributes of one allocated device of a claim holding `cpus`.
    fn device_attributes(
        &self,
        device: &shared_state::AllocatedDevice,
        cpus: &CpuSet,
    ) -> BTreeMap<String, DeviceAttribute> {
        let mut attributes = self
            .attributes
            .get(&device.device)
            .cloned()
            .unwrap_or_default();
        let on_device = self
            .device_cpus
            .get(&device.device)
            .map(|d| d.intersection(cpus))
            .unwrap_or_default();
        let allocated = device
            .consumed_cpus
            .map_or(on_device.len() as i64, i64::from);
        attributes.insert(
            ATTR_ALLOCATED_NUM_CPUS.to_string(),
            DeviceAttribute {
                int: Some(allocated),
                ..Default::default()
            },
        );
        attributes.insert(
            ATTR_CPUS.to_string(),
            DeviceAttribute {
                string: Some(on_device.to_cpulist()),
                ..Default::default()
            },
        );
        attributes
    }

    /// The files of a prepared claim. Refused (before anything is written)
    /// if a name of the claim cannot be a path segment.
    pub fn render(&self, claim: &ClaimAssignment) -> Result<ClaimMetadata, MetadataError> {
        check_names(claim)?;
        let pod_claim_name = claim.pod_claim_name.as_deref().filter(|n| !n.is_empty());
        // Requests in allocation order, each with its devices.
        let mut requests: Vec<(&str, &str, Vec<&shared_state::AllocatedDevice>)> = Vec::new();
        for device in &claim.devices {
            let base = base_request(&device.request);
            match requests.iter_mut().find(|(b, _, _)| *b == base) {
                Some((_, _, devices)) => devices.push(device),
                None => requests.push((base, &device.request, vec![device])),
            }
        }
        let claim_dir = self.claim_dir(&claim.namespace, &claim.name);
        let (subdir, claim_segment) = match pod_claim_name {
            Some(n) => (RESOURCE_CLAIM_TEMPLATES_SUBDIR, n),
            None => (RESOURCE_CLAIMS_SUBDIR, claim.name.as_str()),
        };
        let files = requests
            .into_iter()
            .map(|(base, reference, devices)| {
                let devices: Vec<MetaDevice> = devices
                    .into_iter()
                    .map(|d| MetaDevice {
                        driver: &self.driver_name,
                        pool: &d.pool,
                        name: &d.device,
                        attributes: self.device_attributes(d, &claim.cpus),
                    })
                    .collect();
                let mut body = Vec::new();
                let mut document = Document {
                    kind: KIND,
                    api_version: API_VERSIONS[0],
                    metadata: ObjectMeta {
                        name: &claim.name,
                        namespace: &claim.namespace,
                        uid: &claim.claim_uid,
                        generation: 1,
                    },
                    pod_claim_name,
                    requests: vec![Request {
                        name: reference,
                        devices,
                    }],
                };
                for version in API_VERSIONS {
                    document.api_version = version;
                    // Strings, numbers and maps of them always serialize.
                    body.extend(serde_json::to_vec_pretty(&document).unwrap_or_default());
                    body.push(b'\n');
                }
                MetadataFile {
                    host_path: claim_dir.join(base).join(HOST_FILE_NAME),
                    container_path: format!(
                        "{CONTAINER_DIR}/{subdir}/{claim_segment}/{base}/{}-metadata.json",
                        self.driver_name
                    ),
                    body,
                }
            })
            .collect();
        Ok(ClaimMetadata { claim_dir, files })
    }

    /// Write (or replace) a claim's files; see the module doc for why they
    /// are not fsynced.
    pub fn write(&self, claim: &ClaimMetadata) -> Result<(), MetadataError> {
        for file in &claim.files {
            write_file(&file.host_path, &file.body)?;
        }
        Ok(())
    }

    /// Whether every file of a claim is on disk with these bytes.
    pub fn is_current(&self, claim: &ClaimMetadata) -> bool {
        claim
            .files
            .iter()
            .all(|f| std::fs::read(&f.host_path).ok().as_deref() == Some(f.body.as_slice()))
    }

    /// Remove the files of claim `uid` named `namespace/name`. A file that
    /// names another claim with the same name (deleted and made again, its
    /// unprepare coming late) is left; a missing one is fine.
    pub fn remove(&self, namespace: &str, name: &str, uid: &str) -> Result<(), MetadataError> {
        if !is_path_segment(namespace) || !is_path_segment(name) {
            // Never written for such a name.
            return Ok(());
        }
        let claim_dir = self.claim_dir(namespace, name);
        let entries = match std::fs::read_dir(&claim_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&claim_dir, "list")(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_error(&claim_dir, "list"))?;
            let request_dir = entry.path();
            let owner = std::fs::read(request_dir.join(HOST_FILE_NAME))
                .ok()
                .and_then(|bytes| owner_uid(&bytes));
            if owner.is_none() || owner.as_deref() == Some(uid) {
                remove_path(&request_dir)?;
            }
        }
        match std::fs::remove_dir(&claim_dir) {
            Ok(()) => Ok(()),
            // Another claim of the same name still has files here.
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&claim_dir, "remove")(e)),
        }
    }

    /// Make the metadata directory hold exactly `expected` (the stored
    /// claims' files): rewrite files whose bytes differ, remove the rest.
    pub fn reconcile(&self, expected: &[ClaimMetadata]) -> Result<MetadataPlan, MetadataError> {
        let on_disk = list_tree(&self.host_root)?;
        let plan = plan_metadata(expected, &on_disk, |path| std::fs::read(path).ok());
        for file in &plan.write {
            write_file(&file.host_path, &file.body)?;
        }
        for path in &plan.remove {
            remove_path(path)?;
        }
        Ok(plan)
    }
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

/// Remove every metadata file under `root` (device metadata turned off
/// after it was on, or moved to another directory).
pub fn remove_all(root: &Path) -> Result<bool, MetadataError> {
    match std::fs::remove_dir_all(root) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(root, "remove")(e)),
    }
}

/// The claim UID a metadata file names (its first object's `metadata.uid`).
fn owner_uid(bytes: &[u8]) -> Option<String> {
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<serde_json::Value>();
    let first = stream.next()?.ok()?;
    first["metadata"]["uid"].as_str().map(str::to_string)
}

fn write_file(path: &Path, body: &[u8]) -> Result<(), MetadataError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_error(dir, "create"))?;
    let temp = dir.join(format!(".{HOST_FILE_NAME}{TEMP_SUFFIX}"));
    let result = std::fs::write(&temp, body)
        .map_err(io_error(&temp, "write"))
        .and_then(|()| std::fs::rename(&temp, path).map_err(io_error(path, "rename")));
    if result.is_err() {
        // Best effort: the next write replaces a leftover temp file, and
        // reconciliation removes a request directory no claim owns.
        let _ = std::fs::remove_file(&temp);
    }
    result
}

fn remove_path(path: &Path) -> Result<(), MetadataError> {
    let result = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(path, "remove")(e)),
    }
}

/// What is under the metadata root: each entry (claim directory, or
/// anything else) with the entries inside it (request directories).
fn list_tree(root: &Path) -> Result<BTreeMap<PathBuf, BTreeSet<PathBuf>>, MetadataError> {
    let read = |dir: &Path| -> Result<Vec<PathBuf>, MetadataError> {
        match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .map(|e| e.map(|e| e.path()).map_err(io_error(dir, "list")))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            // A plain file where a directory is expected: it has no entries.
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Ok(Vec::new()),
            Err(e) => Err(io_error(dir, "list")(e)),
        }
    };
    let mut tree = BTreeMap::new();
    for claim_dir in read(root)? {
        let inside = read(&claim_dir)?.into_iter().collect();
        tree.insert(claim_dir, inside);
    }
    Ok(tree)
}

/// What reconciliation changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataPlan {
    /// Files missing or with other bytes.
    pub write: Vec<MetadataFile>,
    /// Claim or request directories (or stray files) no stored claim owns.
    pub remove: Vec<PathBuf>,
}

/// Compare the expected files with what is on disk (`on_disk`: each entry
/// under the root with the entries inside it; `read`: a file's bytes).
pub fn plan_metadata(
    expected: &[ClaimMetadata],
    on_disk: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    read: impl Fn(&Path) -> Option<Vec<u8>>,
) -> MetadataPlan {
    let mut plan = MetadataPlan::default();
    let mut wanted: BTreeMap<&Path, BTreeSet<PathBuf>> = BTreeMap::new();
    for claim in expected {
        let requests = wanted.entry(claim.claim_dir.as_path()).or_default();
        for file in &claim.files {
            if let Some(request_dir) = file.host_path.parent() {
                requests.insert(request_dir.to_path_buf());
            }
            if read(&file.host_path).as_deref() != Some(file.body.as_slice()) {
                plan.write.push(file.clone());
            }
        }
    }
    for (entry, inside) in on_disk {
        match wanted.get(entry.as_path()) {
            None => plan.remove.push(entry.clone()),
            Some(requests) => plan.remove.extend(
                inside
                    .iter()
                    .filter(|path| !requests.contains(*path))
                    .cloned(),
            ),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_state::AllocatedDevice;

    const UID: &str = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    fn int(v: i64) -> DeviceAttribute {
        DeviceAttribute {
            int: Some(v),
            ..Default::default()
        }
    }

    fn metadata(root: &Path) -> DeviceMetadata {
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
            BTreeMap::from([
                ("cpudevnuma000".to_string(), numa0),
                ("cpudev005".to_string(), cpu5),
            ]),
            BTreeMap::from([
                ("cpudevnuma000".to_string(), set("0-7")),
                ("cpudevnuma001".to_string(), set("8-15")),
                ("cpudev005".to_string(), set("5")),
            ]),
        )
    }

    fn claim(devices: &[(&str, &str, Option<u32>)], cpus: &str) -> ClaimAssignment {
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
                })
                .collect(),
            cpus: set(cpus),
            prepared_at_unix_ms: 0,
            pod_claim_name: None,
        }
    }

    fn objects(body: &[u8]) -> Vec<serde_json::Value> {
        serde_json::Deserializer::from_slice(body)
            .into_iter::<serde_json::Value>()
            .collect::<Result<_, _>>()
            .unwrap_or_default()
    }

    #[test]
    fn a_grouped_claim_renders_the_golden_file() {
        let m = metadata(Path::new("/var/lib/kubelet/plugins/dra.cpu"));
        let rendered = m
            .render(&claim(&[("cpus", "cpudevnuma000", Some(2))], "2-3"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rendered.files.len(), 1);
        let file = &rendered.files[0];
        assert_eq!(
            file.host_path,
            Path::new(
                "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/team_web-cpu/cpus/metadata.json"
            )
        );
        assert_eq!(
            file.container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-cpu/cpus/dra.cpu-metadata.json"
        );
        let object = |version: &str| {
            format!(
                r#"{{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/{version}",
  "metadata": {{
    "name": "web-cpu",
    "namespace": "team",
    "uid": "{UID}",
    "generation": 1
  }},
  "requests": [
    {{
      "name": "cpus",
      "devices": [
        {{
          "driver": "dra.cpu",
          "pool": "node-a",
          "name": "cpudevnuma000",
          "attributes": {{
            "dra.cpu/allocatedNumCPUs": {{
              "int": 2
            }},
            "dra.cpu/cpus": {{
              "string": "2-3"
            }},
            "dra.cpu/numCPUs": {{
              "int": 8
            }},
            "dra.cpu/smtEnabled": {{
              "bool": true
            }},
            "resource.kubernetes.io/numaNode": {{
              "int": 0
            }}
          }}
        }}
      ]
    }}
  ]
}}
"#
            )
        };
        let golden = format!("{}{}", object("v1beta1"), object("v1alpha1"));
        assert_eq!(String::from_utf8_lossy(&file.body), golden);
        assert_eq!(
            rendered.mounts(),
            vec![Mount::read_only_file(
                "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/team_web-cpu/cpus/metadata.json",
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-cpu/cpus/dra.cpu-metadata.json",
            )]
        );
    }

    #[test]
    fn template_claims_subrequests_and_individual_devices() {
        let m = metadata(Path::new("/p"));
        let mut c = claim(
            &[
                ("big/two", "cpudev005", None),
                ("small", "cpudevnuma001", Some(1)),
            ],
            "5,9",
        );
        c.pod_claim_name = Some("cpu".into());
        let rendered = m.render(&c).unwrap_or_else(|e| panic!("{e}"));
        let paths: Vec<(&Path, &str)> = rendered
            .files
            .iter()
            .map(|f| (f.host_path.as_path(), f.container_path.as_str()))
            .collect();
        assert_eq!(
            paths,
            vec![
                (
                    Path::new("/p/dra-device-metadata/team_web-cpu/big/metadata.json"),
                    "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpu/big/dra.cpu-metadata.json"
                ),
                (
                    Path::new("/p/dra-device-metadata/team_web-cpu/small/metadata.json"),
                    "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpu/small/dra.cpu-metadata.json"
                ),
            ]
        );
        let big = objects(&rendered.files[0].body);
        assert_eq!(big.len(), 2, "one object per version");
        assert_eq!(big[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
        assert_eq!(big[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
        assert_eq!(big[0]["podClaimName"], "cpu");
        // The content names the full request reference.
        assert_eq!(big[0]["requests"][0]["name"], "big/two");
        let attrs = &big[0]["requests"][0]["devices"][0]["attributes"];
        assert_eq!(attrs["dra.cpu/cpuID"]["int"], 5);
        assert_eq!(attrs["dra.cpu/cpus"]["string"], "5");
        // An individual device counts its own CPU.
        assert_eq!(attrs["dra.cpu/allocatedNumCPUs"]["int"], 1);
        let small = objects(&rendered.files[1].body);
        let attrs = &small[0]["requests"][0]["devices"][0]["attributes"];
        // A device not in the published list still gets this driver's two.
        assert_eq!(attrs["dra.cpu/cpus"]["string"], "9");
        assert_eq!(attrs["dra.cpu/allocatedNumCPUs"]["int"], 1);
    }

    #[test]
    fn two_devices_of_one_request_share_its_file() {
        let m = metadata(Path::new("/p"));
        let rendered = m
            .render(&claim(
                &[
                    ("cpus", "cpudevnuma000", Some(1)),
                    ("cpus", "cpudevnuma001", Some(2)),
                ],
                "0,8-9",
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rendered.files.len(), 1);
        let doc = &objects(&rendered.files[0].body)[0];
        let devices = doc["requests"][0]["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let cpus: Vec<(&str, &str, i64)> = devices
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap_or_default(),
                    d["attributes"]["dra.cpu/cpus"]["string"]
                        .as_str()
                        .unwrap_or_default(),
                    d["attributes"]["dra.cpu/allocatedNumCPUs"]["int"]
                        .as_i64()
                        .unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            cpus,
            vec![("cpudevnuma000", "0", 1), ("cpudevnuma001", "8-9", 2)]
        );
    }

    #[test]
    fn names_that_are_not_path_segments_are_refused() {
        let m = metadata(Path::new("/p"));
        let good = claim(&[("cpus", "cpudevnuma000", Some(1))], "0");
        let cases: Vec<(ClaimAssignment, &str)> = vec![
            (
                ClaimAssignment {
                    namespace: "..".into(),
                    ..good.clone()
                },
                "namespace \"..\"",
            ),
            (
                ClaimAssignment {
                    name: "a/b".into(),
                    ..good.clone()
                },
                "name \"a/b\"",
            ),
            (
                ClaimAssignment {
                    pod_claim_name: Some("x/../../etc".into()),
                    ..good.clone()
                },
                "pod claim name",
            ),
            (
                claim(&[("", "cpudevnuma000", Some(1))], "0"),
                "request \"\"",
            ),
            (
                claim(&[("../x/y", "cpudevnuma000", Some(1))], "0"),
                "request \"..\"",
            ),
        ];
        for (c, want) in cases {
            match m.render(&c) {
                Err(e) => assert!(e.to_string().contains(want), "{e} lacks {want}"),
                Ok(r) => panic!("{want}: rendered {:?}", r.claim_dir),
            }
        }
        assert!(m.render(&good).is_ok());
    }

    #[test]
    fn write_remove_and_a_same_named_claim() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let m = metadata(dir.path());
        let rendered = m
            .render(&claim(&[("cpus", "cpudevnuma000", Some(2))], "2-3"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!m.is_current(&rendered));
        m.write(&rendered).unwrap_or_else(|e| panic!("{e}"));
        assert!(m.is_current(&rendered));
        let file = &rendered.files[0].host_path;
        assert_eq!(
            std::fs::read(file).ok(),
            Some(rendered.files[0].body.clone())
        );
        let names: Vec<String> = std::fs::read_dir(file.parent().unwrap_or(dir.path()))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(names, vec![HOST_FILE_NAME.to_string()], "no temp file left");
        // The unprepare of an older claim with the same name leaves it.
        m.remove("team", "web-cpu", "11111111-2222-3333-4444-555555555555")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(m.is_current(&rendered));
        m.remove("team", "web-cpu", UID)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!rendered.claim_dir.exists());
        m.remove("team", "web-cpu", UID)
            .unwrap_or_else(|e| panic!("removing twice: {e}"));
        m.remove("..", "x", UID).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn plan_metadata_table() {
        let m = metadata(Path::new("/r"));
        let a = m
            .render(&claim(&[("cpus", "cpudevnuma000", Some(2))], "2-3"))
            .unwrap_or_else(|e| panic!("{e}"));
        let root = m.host_root().to_path_buf();
        let a_dir = a.claim_dir.clone();
        let a_request = a_dir.join("cpus");
        let stale_request = a_dir.join("old");
        let orphan = root.join("team_gone");
        let on_disk = BTreeMap::from([
            (
                a_dir.clone(),
                BTreeSet::from([a_request.clone(), stale_request.clone()]),
            ),
            (orphan.clone(), BTreeSet::from([orphan.join("cpus")])),
        ]);
        let body = a.files[0].body.clone();
        let current = |p: &Path| (p == a.files[0].host_path).then(|| body.clone());
        let plan = plan_metadata(std::slice::from_ref(&a), &on_disk, current);
        assert!(plan.write.is_empty(), "{:?}", plan.write);
        assert_eq!(plan.remove, vec![orphan.clone(), stale_request.clone()]);
        // A truncated file (power cut before writeback) is rewritten.
        let plan = plan_metadata(std::slice::from_ref(&a), &on_disk, |_| Some(Vec::new()));
        assert_eq!(plan.write, a.files);
        // Nothing expected: everything goes.
        let plan = plan_metadata(&[], &on_disk, |_| None);
        assert_eq!(plan.remove, vec![orphan, a_dir]);
    }

    #[test]
    fn reconcile_rebuilds_lost_files_and_removes_others() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let m = metadata(dir.path());
        let kept = m
            .render(&claim(&[("cpus", "cpudevnuma000", Some(2))], "2-3"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut gone = claim(&[("cpus", "cpudevnuma001", Some(1))], "8");
        gone.name = "gone".into();
        let gone = m.render(&gone).unwrap_or_else(|e| panic!("{e}"));
        m.write(&gone).unwrap_or_else(|e| panic!("{e}"));
        // The kept claim's file was lost (tmpfs, or truncated by a power cut).
        std::fs::create_dir_all(kept.files[0].host_path.parent().unwrap_or(dir.path()))
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&kept.files[0].host_path, b"").unwrap_or_else(|e| panic!("{e}"));
        let plan = m
            .reconcile(std::slice::from_ref(&kept))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.write.len(), 1);
        assert!(m.is_current(&kept));
        assert!(!gone.claim_dir.exists());
        // A second pass has nothing to do.
        let again = m
            .reconcile(std::slice::from_ref(&kept))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, MetadataPlan::default());
        // Turned off: everything goes.
        assert_eq!(remove_all(m.host_root()).ok(), Some(true));
        assert!(!m.host_root().exists());
        assert_eq!(remove_all(m.host_root()).ok(), Some(false));
    }
}
