//! CDI spec files, one per prepared claim.
//!
//! The container runtime reads every `*.json` in the CDI directory; a spec
//! here names one device, `dra.k8s.io/cpu=claim-<uid>`, whose only edit is
//! the `DRA_CPUSET_<uid>=<cpulist>` environment variable nri-plugin pins the
//! container by. A spec is written to a temporary file in the same
//! directory, fsynced and renamed over the final name, so the runtime never
//! reads half a spec and a crash never leaves a renamed but empty one.
//!
//! The directory itself is not fsynced after each rename or removal: the
//! store is the durable record, and only a power loss or kernel crash can
//! lose a directory entry. The node then reboots, and dra-plugin reconciles
//! this directory with the store (rewriting lost specs, removing resurrected
//! ones, then fsyncing the directory once) before it registers with kubelet,
//! so no claim container can be created from a lost or stale entry.

use shared_state::cdi_read::{read_claim_cpus, read_claim_spec};
use shared_state::cdi_spec::ClaimSpec;
use shared_state::cdi_spec::{claim_uid_of_file, spec_file_name};
use shared_state::claim_env::is_claim_uid;
use shared_state::CpuSet;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Temporary files end in `.tmp`, which the runtime's CDI scan skips.
const TEMP_SUFFIX: &str = ".tmp";

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("claim UID {0:?} cannot name a CDI device")]
    BadClaimUid(String),
    #[error("CDI directory {path}: {operation} failed: {source}")]
    Io {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The CDI spec directory.
#[derive(Debug, Clone)]
pub struct CdiDir {
    dir: PathBuf,
}

impl CdiDir {
    pub fn new(dir: impl Into<PathBuf>) -> CdiDir {
        CdiDir { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The spec file path of a claim.
    pub fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.dir.join(spec_file_name(claim_uid))
    }

    fn io(&self, path: &Path, operation: &'static str) -> impl FnOnce(std::io::Error) -> CdiError {
        let path = path.to_path_buf();
        move |source| CdiError::Io {
            path,
            operation,
            source,
        }
    }

    /// Write (or replace) the plain spec of a claim holding `cpus`.
    pub fn write(&self, claim_uid: &str, cpus: &CpuSet) -> Result<(), CdiError> {
        self.write_spec(claim_uid, &ClaimSpec::new(claim_uid, cpus))
    }

    /// Write (or replace) a claim's spec atomically: its content is on disk
    /// before its name appears (see the module doc for the directory entry).
    pub fn write_spec(&self, claim_uid: &str, spec: &ClaimSpec) -> Result<(), CdiError> {
        if !is_claim_uid(claim_uid) {
            return Err(CdiError::BadClaimUid(claim_uid.to_string()));
        }
        std::fs::create_dir_all(&self.dir).map_err(self.io(&self.dir, "create"))?;
        let final_path = self.spec_path(claim_uid);
        let temp_path = self
            .dir
            .join(format!(".{}{TEMP_SUFFIX}", spec_file_name(claim_uid)));
        let body = spec.to_json();
        let result = (|| {
            let mut file = File::create(&temp_path).map_err(self.io(&temp_path, "create"))?;
            file.write_all(&body)
                .map_err(self.io(&temp_path, "write"))?;
            file.sync_all().map_err(self.io(&temp_path, "fsync"))?;
            std::fs::rename(&temp_path, &final_path).map_err(self.io(&final_path, "rename"))
        })();
        if result.is_err() {
            // Best effort: a leftover temp file is ignored by the runtime and
            // replaced by the next write, so failing to remove it is not
            // worth hiding the first error for.
            let _ = std::fs::remove_file(&temp_path);
        }
        result
    }

    /// Remove a claim's spec; a missing spec is not an error.
    pub fn remove(&self, claim_uid: &str) -> Result<(), CdiError> {
        if !is_claim_uid(claim_uid) {
            return Err(CdiError::BadClaimUid(claim_uid.to_string()));
        }
        let path = self.spec_path(claim_uid);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.io(&path, "remove")(e)),
        }
    }

    /// The claim UIDs that have a spec of ours here.
    pub fn list(&self) -> Result<BTreeSet<String>, CdiError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => return Err(self.io(&self.dir, "list")(e)),
        };
        let mut uids = BTreeSet::new();
        for entry in entries {
            let entry = entry.map_err(self.io(&self.dir, "list"))?;
            if let Some(uid) = entry.file_name().to_str().and_then(claim_uid_of_file) {
                uids.insert(uid.to_string());
            }
        }
        Ok(uids)
    }

    /// The CPUs a claim's spec on disk proves (nri-plugin's reader, see
    /// [`shared_state::cdi_read`]), if it is there and reads.
    pub fn read_cpus(&self, claim_uid: &str) -> Option<CpuSet> {
        read_claim_cpus(&self.dir, claim_uid).ok()
    }

    /// A claim's spec on disk as a document, if it is there and proves
    /// CPUs for the claim (the same strict reading), for comparing with the
    /// spec it should be.
    pub fn read_spec(&self, claim_uid: &str) -> Option<ClaimSpec> {
        read_claim_spec(&self.dir, claim_uid).ok()
    }

    fn sync_dir(&self) -> Result<(), CdiError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(self.io(&self.dir, "fsync"))
    }
}

/// What to change in the CDI directory so it holds exactly the stored claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CdiPlan {
    /// Claims whose spec is missing or differs (other CPUs, other mounts).
    pub write: Vec<(String, ClaimSpec)>,
    /// Specs of ours whose claim is not stored.
    pub remove: Vec<String>,
}

/// Compare the stored claims' specs with the specs on disk (`on_disk`:
/// claim UID → its spec, `None` if it does not read).
pub fn plan_reconcile(
    stored: &[(String, ClaimSpec)],
    on_disk: &std::collections::BTreeMap<String, Option<ClaimSpec>>,
) -> CdiPlan {
    let mut plan = CdiPlan::default();
    for (uid, spec) in stored {
        if on_disk.get(uid).and_then(Option::as_ref) != Some(spec) {
            plan.write.push((uid.clone(), spec.clone()));
        }
    }
    let stored_uids: BTreeSet<&str> = stored.iter().map(|(u, _)| u.as_str()).collect();
    plan.remove = on_disk
        .keys()
        .filter(|uid| !stored_uids.contains(uid.as_str()))
        .cloned()
        .collect();
    plan
}

impl CdiDir {
    /// Make the directory hold exactly the stored claims' specs.
    pub fn reconcile(&self, stored: &[(String, ClaimSpec)]) -> Result<CdiPlan, CdiError> {
        let on_disk = self
            .list()?
            .into_iter()
            .map(|uid| {
                let spec = self.read_spec(&uid);
                (uid, spec)
            })
            .collect();
        let plan = plan_reconcile(stored, &on_disk);
        for (uid, spec) in &plan.write {
            self.write_spec(uid, spec)?;
        }
        for uid in &plan.remove {
            self.remove(uid)?;
        }
        if !plan.write.is_empty() || !plan.remove.is_empty() {
            // Make the reconciled directory entries durable once.
            self.sync_dir()?;
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const UID: &str = "5f1c0e3a-1111-2222-3333-444455556666";

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    #[test]
    fn write_read_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cdi = CdiDir::new(dir.path().join("cdi"));
        cdi.write(UID, &set("1")).expect("write");
        assert_eq!(cdi.read_cpus(UID), Some(set("1")));
        cdi.write(UID, &set("4-5")).expect("rewrite");
        assert_eq!(cdi.read_cpus(UID), Some(set("4-5")));
        let names: Vec<String> = std::fs::read_dir(cdi.path())
            .expect("readdir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        assert_eq!(names, vec![spec_file_name(UID)], "no temp file left");
        assert_eq!(cdi.list().expect("list"), [UID.to_string()].into());
        cdi.remove(UID).expect("remove");
        cdi.remove(UID).expect("remove twice");
        assert!(cdi.list().expect("list").is_empty());
        assert!(matches!(
            cdi.write("../etc/passwd", &set("1")),
            Err(CdiError::BadClaimUid(_))
        ));
    }

    #[test]
    fn write_error_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").expect("write");
        let err = CdiDir::new(&file).write(UID, &set("1")).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("not-a-dir"), "{msg}");
    }

    #[test]
    fn plan_reconcile_table() {
        let a = "aaaaaaaa-0000-0000-0000-000000000001".to_string();
        let b = "bbbbbbbb-0000-0000-0000-000000000002".to_string();
        let c = "cccccccc-0000-0000-0000-000000000003".to_string();
        let d = "dddddddd-0000-0000-0000-000000000004".to_string();
        let e = "eeeeeeee-0000-0000-0000-000000000005".to_string();
        let spec = |uid: &str, cpus: &str| ClaimSpec::new(uid, &set(cpus));
        let mounted = |uid: &str, cpus: &str| {
            spec(uid, cpus).with_mounts(vec![shared_state::cdi_spec::Mount::read_only_file(
                "/h", "/c",
            )])
        };
        let stored = vec![
            (a.clone(), spec(&a, "1")),
            (b.clone(), spec(&b, "2")),
            (d.clone(), mounted(&d, "4")),
            (e.clone(), spec(&e, "5")),
        ];
        let on_disk: BTreeMap<String, Option<ClaimSpec>> = [
            (a.clone(), Some(spec(&a, "1"))),
            (b.clone(), Some(spec(&b, "3"))),
            (c.clone(), None),
            // Metadata turned on since: the mounts are added.
            (d.clone(), Some(spec(&d, "4"))),
            // And off: they go.
            (e.clone(), Some(mounted(&e, "5"))),
        ]
        .into();
        let plan = plan_reconcile(&stored, &on_disk);
        assert_eq!(
            plan.write,
            vec![
                (b.clone(), spec(&b, "2")),
                (d.clone(), mounted(&d, "4")),
                (e.clone(), spec(&e, "5"))
            ]
        );
        assert_eq!(plan.remove, vec![c]);
        let missing = plan_reconcile(&stored, &BTreeMap::new());
        assert_eq!(missing.write.len(), 4);
        assert!(missing.remove.is_empty());
    }

    #[test]
    fn reconcile_rewrites_missing_and_removes_orphans() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cdi = CdiDir::new(dir.path());
        let orphan = "dddddddd-0000-0000-0000-000000000004";
        cdi.write(orphan, &set("7")).expect("write orphan");
        std::fs::write(dir.path().join("someone-else.json"), b"{}").expect("foreign");
        let plan = cdi
            .reconcile(&[(UID.to_string(), ClaimSpec::new(UID, &set("0-1")))])
            .expect("reconcile");
        assert_eq!(plan.remove, vec![orphan.to_string()]);
        assert_eq!(cdi.read_cpus(UID), Some(set("0-1")));
        assert!(!cdi.spec_path(orphan).exists());
        assert!(dir.path().join("someone-else.json").exists());
    }
}
