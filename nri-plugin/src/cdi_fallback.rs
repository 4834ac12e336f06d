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

pub use shared_state::cdi_spec::CDI_KIND;
use shared_state::cdi_spec::{
    claim_uid_of_file, parse_claim_spec, spec_file_name, SpecError, MAX_SPEC_BYTES,
};
use shared_state::claim_env::is_claim_uid;
use shared_state::CpuSet;

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
    #[error("CDI spec {path}: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: SpecError,
    },
}

/// Where dra-plugin writes the spec of a claim.
pub fn spec_path(cdi_dir: &Path, claim_uid: &str) -> PathBuf {
    cdi_dir.join(spec_file_name(claim_uid))
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
    let text = std::fs::read(&path).map_err(|source| CdiError::Read {
        path: path.clone(),
        source,
    })?;
    parse_claim_spec(&text, claim_uid).map_err(|source| CdiError::Invalid { path, source })
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
            let uid = claim_uid_of_file(&name)?;
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
    fn an_invalid_spec_names_its_file() {
        let dir = tempfile::tempdir().expect("dir");
        let other = "DRA_CPUSET_7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b8=4";
        let path = spec_path(dir.path(), UID);
        std::fs::write(&path, spec(CDI_KIND, &format!("claim-{UID}"), &[other])).expect("write");
        let err = read_claim_cpus(dir.path(), UID).expect_err("another claim's env");
        assert!(matches!(err, CdiError::Invalid { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("must set exactly"),
            "{text}"
        );
        std::fs::write(&path, vec![b' '; MAX_SPEC_BYTES as usize + 1]).expect("write");
        assert!(matches!(
            read_claim_cpus(dir.path(), UID),
            Err(CdiError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_spec_with_device_metadata_mounts_reads_as_before() {
        // The file dra-plugin writes with device metadata on, byte for byte.
        let dir = tempfile::tempdir().expect("dir");
        let spec = shared_state::cdi_spec::ClaimSpec::new(
            UID,
            &CpuSet::parse_cpulist("2-3").expect("cpulist"),
        )
        .with_mounts(vec![shared_state::cdi_spec::Mount::read_only_file(
            "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/ns_c/cpus/metadata.json",
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/cpus/dra.cpu-metadata.json",
        )]);
        std::fs::write(spec_path(dir.path(), UID), spec.to_json()).expect("write");
        assert_eq!(
            read_claim_cpus(dir.path(), UID).expect("cpus").to_cpulist(),
            "2-3"
        );
        assert_eq!(scan_claims(dir.path()).len(), 1);
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
        std::fs::write(
            dir.path()
                .join(spec_file_name("7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b9")),
            "{}",
        )
        .expect("junk");
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
