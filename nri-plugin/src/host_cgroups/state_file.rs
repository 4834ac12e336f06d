//! The remembered state of `--host-cgroups`: every cgroup nri-plugin
//! manages with the `cpuset.cpus` it had before, kept in a small JSON file
//! so a later run (or one without the cgroup listed) can give it back.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::HostCgroupError;

/// The state file's name in nri-plugin's state directory.
pub const STATE_FILE: &str = "host-cgroups.json";

/// What nri-plugin remembers between runs: every cgroup it manages, with
/// the `cpuset.cpus` it had before nri-plugin first wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCgroupState {
    /// Relative cgroup path → its original `cpuset.cpus` (often empty).
    pub originals: BTreeMap<String, String>,
}

/// The cgroups a previous run managed that are no longer listed: they get
/// their original `cpuset.cpus` back.
pub fn stale_entries(state: &HostCgroupState, configured: &[PathBuf]) -> Vec<(String, String)> {
    state
        .originals
        .iter()
        .filter(|(path, _)| !configured.iter().any(|c| c == Path::new(path)))
        .map(|(p, o)| (p.clone(), o.clone()))
        .collect()
}

/// The state file's content; none yet is an empty state. A file that does
/// not parse is reported (its originals would be lost otherwise).
pub(super) fn load_state(file: &Path) -> Result<HostCgroupState, HostCgroupError> {
    match std::fs::read_to_string(file) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| HostCgroupError::State {
            file: file.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(HostCgroupState::default()),
        Err(source) => Err(HostCgroupError::State {
            file: file.to_path_buf(),
            source,
        }),
    }
}

/// Writes the state file, replacing it whole; no cgroup left to remember
/// removes it.
pub(super) fn save_state(file: &Path, state: &HostCgroupState) -> Result<(), HostCgroupError> {
    let err = |source| HostCgroupError::State {
        file: file.to_path_buf(),
        source,
    };
    if state.originals.is_empty() {
        return match std::fs::remove_file(file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(err(e)),
            _ => Ok(()),
        };
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let text = serde_json::to_string_pretty(state)
        .map_err(|e| err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    // Replaced whole, so a crash never leaves half a file.
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, file).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_entries_are_those_no_longer_listed() {
        let state = HostCgroupState {
            originals: BTreeMap::from([
                ("system.slice".to_string(), String::new()),
                ("user.slice".to_string(), "0-3".to_string()),
            ]),
        };
        assert_eq!(
            stale_entries(&state, &[PathBuf::from("system.slice")]),
            vec![("user.slice".to_string(), "0-3".to_string())]
        );
        assert_eq!(stale_entries(&state, &[]).len(), 2);
        assert!(stale_entries(
            &state,
            &[PathBuf::from("user.slice"), PathBuf::from("system.slice")]
        )
        .is_empty());
    }
}
