//! The reading side of the CDI contract: a claim's spec file taken from the
//! CDI directory, bounded in size, and checked by the one strict parser
//! ([`parse_claim_spec`]). nri-plugin reads a claim's CPUs through it when
//! dra-plugin cannot be asked; dra-plugin reads its own specs back through
//! it when it reconciles the directory with its store.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::cdi_spec::{parse_claim_spec, spec_file_name, ClaimSpec, SpecError, MAX_SPEC_BYTES};
use crate::claim_env::is_claim_uid;
use crate::CpuSet;

/// Why a claim's spec on disk proves no CPUs.
#[derive(Debug, thiserror::Error)]
pub enum CdiReadError {
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

/// The CPUs the spec of `claim_uid` in `cdi_dir` proves.
pub fn read_claim_cpus(cdi_dir: &Path, claim_uid: &str) -> Result<CpuSet, CdiReadError> {
    read_checked(cdi_dir, claim_uid).map(|(cpus, _, _)| cpus)
}

/// The spec of `claim_uid` in `cdi_dir` as a document, when it proves CPUs
/// for the claim, for comparing with the spec it should be.
pub fn read_claim_spec(cdi_dir: &Path, claim_uid: &str) -> Result<ClaimSpec, CdiReadError> {
    let (_, text, path) = read_checked(cdi_dir, claim_uid)?;
    serde_json::from_slice(&text).map_err(|e| CdiReadError::Invalid {
        path,
        source: SpecError::NotJson(e.to_string()),
    })
}

/// Reads at most [`MAX_SPEC_BYTES`] (and one more, to tell a larger file)
/// and parses strictly; returns the CPUs, the text and the path.
fn read_checked(
    cdi_dir: &Path,
    claim_uid: &str,
) -> Result<(CpuSet, Vec<u8>, PathBuf), CdiReadError> {
    if !is_claim_uid(claim_uid) {
        return Err(CdiReadError::BadClaimUid(claim_uid.to_string()));
    }
    let path = spec_path(cdi_dir, claim_uid);
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CdiReadError::Missing {
                claim_uid: claim_uid.to_string(),
                path,
            })
        }
        Err(source) => return Err(CdiReadError::Read { path, source }),
    };
    let mut text = Vec::new();
    if let Err(source) = file.take(MAX_SPEC_BYTES + 1).read_to_end(&mut text) {
        return Err(CdiReadError::Read { path, source });
    }
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(CdiReadError::TooLarge { path });
    }
    match parse_claim_spec(&text, claim_uid) {
        Ok(cpus) => Ok((cpus, text, path)),
        Err(source) => Err(CdiReadError::Invalid { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi_spec::{Mount, CDI_KIND};

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
        assert!(matches!(err, CdiReadError::Invalid { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("must set exactly"),
            "{text}"
        );
        assert!(
            read_claim_spec(dir.path(), UID).is_err(),
            "the document is refused by the same rule"
        );
        std::fs::write(&path, vec![b' '; MAX_SPEC_BYTES as usize + 1]).expect("write");
        assert!(matches!(
            read_claim_cpus(dir.path(), UID),
            Err(CdiReadError::TooLarge { .. })
        ));
        assert!(matches!(
            read_claim_spec(dir.path(), UID),
            Err(CdiReadError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_spec_with_device_metadata_mounts_reads_as_before() {
        // The file dra-plugin writes with device metadata on, byte for byte.
        let dir = tempfile::tempdir().expect("dir");
        let written = ClaimSpec::new(UID, &CpuSet::parse_cpulist("2-3").expect("cpulist"))
            .with_mounts(vec![Mount::read_only_file(
                "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/ns_c/cpus/metadata.json",
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/cpus/dra.cpu-metadata.json",
            )]);
        std::fs::write(spec_path(dir.path(), UID), written.to_json()).expect("write");
        assert_eq!(
            read_claim_cpus(dir.path(), UID).expect("cpus").to_cpulist(),
            "2-3"
        );
        assert_eq!(read_claim_spec(dir.path(), UID).expect("spec"), written);
    }

    #[test]
    fn reads_a_spec_and_names_what_is_missing_or_unsafe() {
        let dir = tempfile::tempdir().expect("dir");
        let env = format!("DRA_CPUSET_{UID}=1");
        std::fs::write(
            spec_path(dir.path(), UID),
            spec(CDI_KIND, &format!("claim-{UID}"), &[&env]),
        )
        .expect("write");
        assert_eq!(
            read_claim_cpus(dir.path(), UID).expect("cpus").to_cpulist(),
            "1"
        );
        let missing = "7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b8";
        let err = read_claim_cpus(dir.path(), missing).expect_err("missing");
        assert!(matches!(err, CdiReadError::Missing { .. }), "{err}");
        assert!(err.to_string().contains(missing));
        assert!(matches!(
            read_claim_cpus(dir.path(), "../etc"),
            Err(CdiReadError::BadClaimUid(_))
        ));
    }
}
