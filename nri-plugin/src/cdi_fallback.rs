//! Reading a claim's CPUs from its CDI spec, for when dra-plugin cannot be
//! asked.
//!
//! dra-plugin writes one spec per prepared claim into the CDI directory,
//! `dra.k8s.io-cpu_claim-<uid>.json`, kind `dra.k8s.io/cpu`, one device
//! `claim-<uid>` whose only edit is `DRA_CPUSET_<uid>=<cpulist>`, and deletes
//! it at unprepare. The directory is root-owned; a spec there is therefore
//! taken as proof that the claim is prepared with those CPUs. What a spec
//! cannot say is which pod the claim is reserved for: see
//! [`crate::handler::ClaimOrigin::CdiSpec`] for what is trusted instead.

use std::path::{Path, PathBuf};

use shared_state::claim_env::{is_claim_uid, parse_claim_env};
use shared_state::CpuSet;

/// The CDI kind dra-plugin's specs carry.
pub const CDI_KIND: &str = "dra.k8s.io/cpu";
const SPEC_FILE_PREFIX: &str = "dra.k8s.io-cpu_claim-";
/// Specs larger than this are not ours; reading stops there.
const MAX_SPEC_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("claim UID {0:?} cannot name a CDI spec")]
    BadClaimUid(String),
    #[error("no CDI spec for claim {claim_uid} at {path}")]
    Missing { claim_uid: String, path: PathBuf },
    #[error("reading CDI spec {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CDI spec {path} is larger than {MAX_SPEC_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("CDI spec {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Where dra-plugin writes the spec of a claim.
pub fn spec_path(cdi_dir: &Path, claim_uid: &str) -> PathBuf {
    cdi_dir.join(format!("{SPEC_FILE_PREFIX}{claim_uid}.json"))
}

/// The CPUs of `claim_uid` from the spec text, checking kind, device name and
/// that the device's env names exactly this claim.
pub fn parse_spec(path: &Path, text: &str, claim_uid: &str) -> Result<CpuSet, CdiError> {
    let invalid = |reason: String| CdiError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    if kind != CDI_KIND {
        return Err(invalid(format!("kind {kind:?} is not {CDI_KIND:?}")));
    }
    let device_name = format!("claim-{claim_uid}");
    let device = doc
        .get("devices")
        .and_then(|d| d.as_array())
        .and_then(|devices| {
            devices
                .iter()
                .find(|d| d.get("name").and_then(|n| n.as_str()) == Some(device_name.as_str()))
        })
        .ok_or_else(|| invalid(format!("no device {device_name:?}")))?;
    let env: Vec<&str> = device
        .get("containerEdits")
        .and_then(|e| e.get("env"))
        .and_then(|e| e.as_array())
        .map(|list| list.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let refs = parse_claim_env(&env).map_err(|e| invalid(e.to_string()))?;
    match refs.as_slice() {
        [only] if only.claim_uid == claim_uid => Ok(only.cpus.clone()),
        _ => Err(invalid(format!(
            "device {device_name:?} must set exactly DRA_CPUSET_{claim_uid}"
        ))),
    }
}

/// Read the CPUs of `claim_uid` from its spec in `cdi_dir`.
pub fn read_claim_cpus(cdi_dir: &Path, claim_uid: &str) -> Result<CpuSet, CdiError> {
    if !is_claim_uid(claim_uid) {
        return Err(CdiError::BadClaimUid(claim_uid.to_string()));
    }
    let path = spec_path(cdi_dir, claim_uid);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CdiError::Missing {
                claim_uid: claim_uid.to_string(),
                path,
            })
        }
        Err(source) => return Err(CdiError::Read { path, source }),
    };
    if meta.len() > MAX_SPEC_BYTES {
        return Err(CdiError::TooLarge { path });
    }
    let text = std::fs::read_to_string(&path).map_err(|source| CdiError::Read {
        path: path.clone(),
        source,
    })?;
    parse_spec(&path, &text, claim_uid)
}

/// Every claim with a readable spec in `cdi_dir`, for the view nri-plugin
/// starts with before dra-plugin answers. Unreadable specs are skipped.
pub fn scan_claims(cdi_dir: &Path) -> Vec<(String, CpuSet)> {
    let Ok(entries) = std::fs::read_dir(cdi_dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, CpuSet)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let uid = name.strip_prefix(SPEC_FILE_PREFIX)?.strip_suffix(".json")?;
            match read_claim_cpus(cdi_dir, uid) {
                Ok(cpus) => Some((uid.to_string(), cpus)),
                Err(err) => {
                    tracing::warn!(error = %err, "skipping CDI spec");
                    None
                }
            }
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";

    fn spec(kind: &str, device: &str, env: &[&str]) -> String {
        serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": kind,
            "devices": [{"name": device, "containerEdits": {"env": env}}],
        })
        .to_string()
    }

    #[test]
    fn parse_table() {
        let good_env = format!("DRA_CPUSET_{UID}=2-3");
        let other = "DRA_CPUSET_7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b8=4";
        let dev = format!("claim-{UID}");
        let cases: Vec<(String, Result<&str, &str>)> = vec![
            (spec(CDI_KIND, &dev, &[&good_env]), Ok("2-3")),
            (
                spec("nvidia.com/gpu", &dev, &[&good_env]),
                Err("is not \"dra.k8s.io/cpu\""),
            ),
            (
                spec(CDI_KIND, "claim-other", &[&good_env]),
                Err("no device"),
            ),
            (spec(CDI_KIND, &dev, &[other]), Err("must set exactly")),
            (
                spec(CDI_KIND, &dev, &[&good_env, other]),
                Err("must set exactly"),
            ),
            (
                spec(CDI_KIND, &dev, &[&format!("DRA_CPUSET_{UID}=x")]),
                Err("bad cpulist"),
            ),
            ("{".to_string(), Err("not JSON")),
        ];
        for (text, want) in cases {
            let got = parse_spec(Path::new("/cdi/x.json"), &text, UID);
            match (got, want) {
                (Ok(cpus), Ok(w)) => assert_eq!(cpus.to_cpulist(), w),
                (Err(e), Err(w)) => {
                    assert!(e.to_string().contains(w), "{e}");
                    assert!(e.to_string().contains("/cdi/x.json"), "{e}");
                }
                (got, want) => panic!("{text}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn reads_and_scans_spec_files() {
        let dir = tempfile::tempdir().expect("dir");
        let env = format!("DRA_CPUSET_{UID}=1");
        std::fs::write(
            spec_path(dir.path(), UID),
            spec(CDI_KIND, &format!("claim-{UID}"), &[&env]),
        )
        .expect("write");
        std::fs::write(dir.path().join(format!("{SPEC_FILE_PREFIX}zz.json")), "{}").expect("junk");
        std::fs::write(dir.path().join("other-vendor.json"), "{}").expect("other");
        assert_eq!(
            read_claim_cpus(dir.path(), UID).expect("cpus").to_cpulist(),
            "1"
        );
        let missing = "7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b8";
        let err = read_claim_cpus(dir.path(), missing).expect_err("missing");
        assert!(matches!(err, CdiError::Missing { .. }), "{err}");
        assert!(err.to_string().contains(missing));
        assert!(matches!(
            read_claim_cpus(dir.path(), "../etc"),
            Err(CdiError::BadClaimUid(_))
        ));
        let scanned = scan_claims(dir.path());
        assert_eq!(scanned.len(), 1);
        assert_eq!(scanned[0].0, UID);
        assert!(scan_claims(&dir.path().join("nope")).is_empty());
    }
}
