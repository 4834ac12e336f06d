//! Reading sysfs files: each read or parse error names the file and quotes
//! (a bounded part of) its content.

use super::TopologyError;
use crate::cpuset::CpuSet;
use std::io;
use std::path::{Path, PathBuf};

/// Longest file content quoted in an error; sysfs files are short, anything
/// longer is garbage and quoting all of it would bury the message.
const QUOTE_LIMIT: usize = 120;

/// `(name, path)` of every entry of `dir`, sorted; an absent directory has
/// none.
pub(in crate::topology) fn dir_entries(
    dir: &Path,
) -> Result<Vec<(String, PathBuf)>, TopologyError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(TopologyError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| TopologyError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        if let Some(name) = entry.file_name().to_str() {
            out.push((name.to_string(), entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Entries of `dir` named `<prefix><number>`, sorted by number. An absent
/// directory has no entries.
pub(super) fn numbered_entries(
    dir: &Path,
    prefix: &str,
) -> Result<Vec<(u32, PathBuf)>, TopologyError> {
    let mut out: Vec<(u32, PathBuf)> = dir_entries(dir)?
        .into_iter()
        .filter_map(|(name, path)| {
            let digits = name.strip_prefix(prefix)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse::<u32>().ok().map(|n| (n, path))
        })
        .collect();
    out.sort();
    Ok(out)
}

pub(in crate::topology) fn read_optional(
    path: &Path,
) -> Result<Option<(PathBuf, String)>, TopologyError> {
    match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Ok(Some((path.to_path_buf(), text))),
            Err(e) => Err(TopologyError::Malformed {
                path: path.to_path_buf(),
                content: quote(&String::from_utf8_lossy(e.as_bytes())),
                reason: "not UTF-8 text".into(),
            }),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read_required(path: &Path) -> Result<String, TopologyError> {
    read_optional(path)?
        .map(|(_, text)| text)
        .ok_or_else(|| TopologyError::Missing {
            path: path.to_path_buf(),
        })
}

pub(super) fn read_cpulist(path: &Path) -> Result<CpuSet, TopologyError> {
    parse_cpulist_at(path, &read_required(path)?)
}

pub(in crate::topology) fn parse_cpulist_at(
    path: &Path,
    text: &str,
) -> Result<CpuSet, TopologyError> {
    CpuSet::parse_cpulist(text).map_err(|e| TopologyError::Malformed {
        path: path.to_path_buf(),
        content: quote(text),
        reason: e.to_string(),
    })
}

pub(super) fn read_u32(path: &Path) -> Result<u32, TopologyError> {
    parse_u32_at(path, &read_required(path)?)
}

pub(super) fn parse_u32_at(path: &Path, text: &str) -> Result<u32, TopologyError> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TopologyError::Malformed {
            path: path.to_path_buf(),
            content: quote(text),
            reason: "expected a non-negative integer".into(),
        });
    }
    t.parse().map_err(|_| TopologyError::Malformed {
        path: path.to_path_buf(),
        content: quote(text),
        reason: "integer out of range".into(),
    })
}

/// A package/die/cluster id: the kernel writes -1 where the firmware does
/// not describe the level, which means "one of it", i.e. id 0.
fn parse_id_at(path: &Path, text: &str) -> Result<u32, TopologyError> {
    if text.trim() == "-1" {
        return Ok(0);
    }
    parse_u32_at(path, text)
}

pub(super) fn read_id(path: &Path) -> Result<u32, TopologyError> {
    parse_id_at(path, &read_required(path)?)
}

pub(super) fn read_optional_id(path: &Path) -> Result<u32, TopologyError> {
    match read_optional(path)? {
        Some((path, text)) => parse_id_at(&path, &text),
        None => Ok(0),
    }
}

pub(in crate::topology) fn quote(text: &str) -> String {
    if text.chars().count() <= QUOTE_LIMIT {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(QUOTE_LIMIT).collect();
        s.push('…');
        s
    }
}
