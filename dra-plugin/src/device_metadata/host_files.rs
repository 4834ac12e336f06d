//! The metadata files on the host: written to a temporary name and
//! renamed, removed at unprepare (leaving a same-named newer claim's), and
//! reconciled with the store at start-up.

use super::{
    io_error, is_path_segment, ClaimMetadata, DeviceMetadata, MetadataError, MetadataFile,
    HOST_FILE_NAME, TEMP_SUFFIX,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

impl DeviceMetadata {
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
            // Mounted by no spec (no stored claim explains it): one that
            // cannot be removed is logged, not a reason to refuse the start.
            if let Err(error) = remove_path(path) {
                tracing::warn!(path = %path.display(), %error, "a device metadata file no prepared claim explains could not be removed");
            }
        }
        Ok(plan)
    }
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
    use super::super::test_support::*;
    use super::*;

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

    /// The longest names the API server allows, a 63-byte namespace and a
    /// 253-byte claim name, make a directory on a real file system; two
    /// claims that differ only past what the name keeps get two.
    #[test]
    fn the_longest_names_write_apart_and_remove() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let m = metadata(dir.path());
        let namespace = "n".repeat(63);
        let long = |last: char| {
            let mut c = claim(&[("cpus", "cpudevnuma000", Some(2))], "2-3");
            c.namespace = namespace.clone();
            c.name = format!("{}{last}", "a".repeat(252));
            c
        };
        let (first, second) = (long('x'), long('y'));
        let mut written = Vec::new();
        for c in [&first, &second] {
            let rendered = m.render(c).unwrap_or_else(|e| panic!("{e}"));
            m.write(&rendered)
                .unwrap_or_else(|e| panic!("{}: {e}", rendered.claim_dir.display()));
            assert!(m.is_current(&rendered));
            // The container sees the claim's whole name.
            assert!(
                rendered.files[0].container_path.contains(&c.name),
                "{}",
                rendered.files[0].container_path
            );
            written.push(rendered);
        }
        assert_ne!(written[0].claim_dir, written[1].claim_dir);
        assert_eq!(written[0].claim_dir, m.claim_dir(&namespace, &first.name));
        m.remove(&namespace, &first.name, UID)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!written[0].claim_dir.exists());
        assert!(m.is_current(&written[1]));
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
