//! The CDI spec of a prepared claim: the one contract file dra-plugin writes
//! and nri-plugin (and dra-plugin's own reconciliation) read back.
//!
//! One spec per claim, `dra.k8s.io-cpu_claim-<uid>.json` in the CDI
//! directory, kind `dra.k8s.io/cpu`, one device `claim-<uid>` whose only edit
//! is `DRA_CPUSET_<uid>=<cpulist>`. The directory is root-owned, so nri-plugin
//! takes a spec there as proof that the claim is prepared with those CPUs:
//! this module is that security boundary, with one writer ([`ClaimSpec::new`])
//! and one strict reader ([`parse_claim_spec`]) for both processes. What a
//! spec cannot say is which pod the claim is for; nri-plugin checks that
//! elsewhere.
//!
//! With KEP-5304 device metadata on, the same device also bind-mounts each
//! request's metadata file read-only into the container
//! ([`ClaimSpec::with_mounts`]); the reader ignores mounts, since they
//! prove nothing about CPUs.

use crate::claim_env::{cdi_env_var, is_claim_uid, parse_claim_env};
use crate::CpuSet;
use serde::{Deserialize, Serialize};

/// The CDI kind (vendor/class) of every device this driver writes.
pub const CDI_KIND: &str = "dra.k8s.io/cpu";
/// A spec version containerd 1.7's CDI library (v0.5/0.6) accepts.
pub const CDI_VERSION: &str = "0.6.0";
/// Every spec file of ours starts with this (the kind with `/` made safe).
pub const SPEC_FILE_PREFIX: &str = "dra.k8s.io-cpu_claim-";
/// And ends with this.
pub const SPEC_FILE_SUFFIX: &str = ".json";
/// A spec of ours is a few hundred bytes; anything larger is not ours and is
/// not read past this.
pub const MAX_SPEC_BYTES: u64 = 64 * 1024;

/// The CDI device name of a claim.
pub fn device_name(claim_uid: &str) -> String {
    format!("claim-{claim_uid}")
}

/// The fully qualified CDI device id kubelet hands to the runtime.
pub fn device_id(claim_uid: &str) -> String {
    format!("{CDI_KIND}={}", device_name(claim_uid))
}

/// The spec file name of a claim.
pub fn spec_file_name(claim_uid: &str) -> String {
    format!("{SPEC_FILE_PREFIX}{claim_uid}{SPEC_FILE_SUFFIX}")
}

/// The claim UID a spec file name of ours belongs to.
pub fn claim_uid_of_file(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix(SPEC_FILE_PREFIX)?
        .strip_suffix(SPEC_FILE_SUFFIX)
        .filter(|uid| is_claim_uid(uid))
}

/// The document of a claim's spec, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub devices: Vec<SpecDevice>,
}

/// One device of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    pub name: String,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// The edits a device makes to a container: the claim's env, and the
/// device metadata mounts when those are on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEdits {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A CDI mount (the spec's `containerEdits.mounts[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Mount {
    /// A read-only bind mount of one file, as the kubelet plugin helper
    /// writes for a device metadata file.
    pub fn read_only_file(host_path: &str, container_path: &str) -> Mount {
        Mount {
            host_path: host_path.to_string(),
            container_path: container_path.to_string(),
            options: vec!["ro".to_string(), "bind".to_string()],
        }
    }
}

impl ClaimSpec {
    /// The spec of a claim holding `cpus`.
    pub fn new(claim_uid: &str, cpus: &CpuSet) -> ClaimSpec {
        ClaimSpec {
            cdi_version: CDI_VERSION.to_string(),
            kind: CDI_KIND.to_string(),
            devices: vec![SpecDevice {
                name: device_name(claim_uid),
                container_edits: ContainerEdits {
                    env: vec![cdi_env_var(claim_uid, cpus)],
                    mounts: Vec::new(),
                },
            }],
        }
    }

    /// The same spec whose device also makes `mounts`.
    pub fn with_mounts(mut self, mounts: Vec<Mount>) -> ClaimSpec {
        if let Some(device) = self.devices.first_mut() {
            device.container_edits.mounts = mounts;
        }
        self
    }

    /// The spec as the JSON bytes written to its file.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings always serializes.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }
}

/// Why a spec does not prove a claim's CPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("claim UID {0:?} cannot name a CDI spec")]
    BadClaimUid(String),
    #[error("larger than {MAX_SPEC_BYTES} bytes")]
    TooLarge,
    #[error("not a CDI spec: {0}")]
    NotJson(String),
    #[error("kind {found:?} is not {CDI_KIND:?}")]
    WrongKind { found: String },
    #[error("no device {0:?}")]
    NoDevice(String),
    #[error("device {device:?} must set exactly DRA_CPUSET_{claim_uid}: {reason}")]
    Env {
        device: String,
        claim_uid: String,
        reason: String,
    },
}

/// The CPUs a spec proves for `claim_uid`: the kind is ours, exactly one
/// device is named for the claim, and its env sets this claim's
/// `DRA_CPUSET_` variable and no other claim's.
pub fn parse_claim_spec(text: &[u8], claim_uid: &str) -> Result<CpuSet, SpecError> {
    if !is_claim_uid(claim_uid) {
        return Err(SpecError::BadClaimUid(claim_uid.to_string()));
    }
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge);
    }
    let spec: ClaimSpec =
        serde_json::from_slice(text).map_err(|e| SpecError::NotJson(e.to_string()))?;
    if spec.kind != CDI_KIND {
        return Err(SpecError::WrongKind { found: spec.kind });
    }
    let name = device_name(claim_uid);
    let mut named = spec.devices.iter().filter(|d| d.name == name);
    let device = match (named.next(), named.next()) {
        (Some(device), None) => device,
        (None, _) => return Err(SpecError::NoDevice(name)),
        (Some(_), Some(_)) => {
            return Err(SpecError::Env {
                device: name,
                claim_uid: claim_uid.to_string(),
                reason: "the device is named twice".to_string(),
            })
        }
    };
    let env_error = |reason: String| SpecError::Env {
        device: name.clone(),
        claim_uid: claim_uid.to_string(),
        reason,
    };
    let refs =
        parse_claim_env(&device.container_edits.env).map_err(|e| env_error(e.to_string()))?;
    match refs.as_slice() {
        [only] if only.claim_uid == claim_uid => Ok(only.cpus.clone()),
        [] => Err(env_error("it sets none".to_string())),
        _ => Err(env_error(format!(
            "it sets {}",
            refs.iter()
                .map(|r| format!("DRA_CPUSET_{}", r.claim_uid))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
    const OTHER: &str = "5f1c0e3a-1111-2222-3333-444455556666";

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    fn spec(kind: &str, devices: &[(&str, &[&str])]) -> Vec<u8> {
        let devices: Vec<serde_json::Value> = devices
            .iter()
            .map(|(name, env)| serde_json::json!({"name": name, "containerEdits": {"env": env}}))
            .collect();
        serde_json::json!({"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn what_is_written_reads_back() {
        for cpus in ["0", "2-5", "0-3,64-67", "1,3,5,7"] {
            let written = ClaimSpec::new(UID, &set(cpus)).to_json();
            assert_eq!(parse_claim_spec(&written, UID), Ok(set(cpus)), "{cpus}");
            // The same bytes prove nothing for another claim.
            assert_eq!(
                parse_claim_spec(&written, OTHER),
                Err(SpecError::NoDevice(device_name(OTHER)))
            );
        }
        let doc: serde_json::Value =
            serde_json::from_slice(&ClaimSpec::new(UID, &set("2-3")).to_json()).unwrap_or_default();
        assert_eq!(
            doc,
            serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": "dra.k8s.io/cpu",
                "devices": [{"name": format!("claim-{UID}"),
                             "containerEdits": {"env": [format!("DRA_CPUSET_{UID}=2-3")]}}],
            })
        );
    }

    #[test]
    fn a_spec_proves_only_its_own_claim() {
        let own = format!("DRA_CPUSET_{UID}=2-3");
        let other = format!("DRA_CPUSET_{OTHER}=4");
        let name = device_name(UID);
        let cases: Vec<(Vec<u8>, Result<CpuSet, &str>)> = vec![
            (spec(CDI_KIND, &[(&name, &[&own])]), Ok(set("2-3"))),
            // Unrelated env beside ours is harmless.
            (
                spec(CDI_KIND, &[(&name, &["PATH=/bin", &own])]),
                Ok(set("2-3")),
            ),
            // Another device of the same file does not matter.
            (
                spec(
                    CDI_KIND,
                    &[(&device_name(OTHER), &[&other]), (&name, &[&own])],
                ),
                Ok(set("2-3")),
            ),
            (spec("vendor.example/cpu", &[(&name, &[&own])]), Err("kind")),
            (spec(CDI_KIND, &[("claim-x", &[&own])]), Err("no device")),
            (
                spec(CDI_KIND, &[(&name, &[&other])]),
                Err("must set exactly"),
            ),
            (
                spec(CDI_KIND, &[(&name, &[&own, &other])]),
                Err("must set exactly"),
            ),
            (spec(CDI_KIND, &[(&name, &[])]), Err("sets none")),
            (
                spec(CDI_KIND, &[(&name, &[&format!("DRA_CPUSET_{UID}=")])]),
                Err("must set exactly"),
            ),
            (
                spec(CDI_KIND, &[(&name, &[&format!("DRA_CPUSET_{UID}=a-b")])]),
                Err("must set exactly"),
            ),
            (
                spec(CDI_KIND, &[(&name, &[&own]), (&name, &[&own])]),
                Err("named twice"),
            ),
            (b"{".to_vec(), Err("not a CDI spec")),
            (b"[]".to_vec(), Err("not a CDI spec")),
            (vec![b' '; MAX_SPEC_BYTES as usize + 1], Err("larger than")),
        ];
        for (text, want) in cases {
            let got = parse_claim_spec(&text, UID);
            match (&want, &got) {
                (Ok(cpus), Ok(found)) => assert_eq!(cpus, found),
                (Err(part), Err(e)) => assert!(
                    e.to_string().contains(part),
                    "{}: {e} lacks {part:?}",
                    String::from_utf8_lossy(&text)
                ),
                _ => panic!(
                    "{}: want {want:?}, got {got:?}",
                    String::from_utf8_lossy(&text)
                ),
            }
        }
        assert_eq!(
            parse_claim_spec(b"{}", "../etc"),
            Err(SpecError::BadClaimUid("../etc".into()))
        );
    }

    #[test]
    fn a_spec_with_metadata_mounts_still_proves_its_cpus() {
        let host = "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/ns_c/cpus/metadata.json";
        let inside =
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/cpus/dra.cpu-metadata.json";
        let spec =
            ClaimSpec::new(UID, &set("2-3")).with_mounts(vec![Mount::read_only_file(host, inside)]);
        let written = spec.to_json();
        assert_eq!(parse_claim_spec(&written, UID), Ok(set("2-3")));
        let doc: serde_json::Value = serde_json::from_slice(&written).unwrap_or_default();
        assert_eq!(
            doc["devices"][0]["containerEdits"],
            serde_json::json!({
                "env": [format!("DRA_CPUSET_{UID}=2-3")],
                "mounts": [{"hostPath": host, "containerPath": inside, "options": ["ro", "bind"]}],
            })
        );
        // It reads back as the same document, so reconciliation can compare.
        let back: ClaimSpec = serde_json::from_slice(&written).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, spec);
        // Without mounts the field is left out, as before.
        assert!(
            !String::from_utf8_lossy(&ClaimSpec::new(UID, &set("1")).to_json()).contains("mounts")
        );
    }

    #[test]
    fn file_names_round_trip() {
        assert_eq!(claim_uid_of_file(&spec_file_name(UID)), Some(UID));
        for name in [
            "dra.k8s.io-cpu_claim-.json",
            "dra.k8s.io-cpu_claim-../x.json",
            "other.json",
            &format!("{SPEC_FILE_PREFIX}{UID}.json.tmp"),
        ] {
            assert_eq!(claim_uid_of_file(name), None, "{name}");
        }
        assert_eq!(device_id(UID), format!("dra.k8s.io/cpu=claim-{UID}"));
    }
}
