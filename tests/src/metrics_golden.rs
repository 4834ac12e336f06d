//! The shape of each process's `/metrics` exposition, kept as a golden
//! file per process under `tests/golden/`: every `# HELP` and `# TYPE`
//! line as served, and every sample name with its label names (values and
//! label values dropped). Dashboards, alerts and the README table rely on
//! these names; a rename, a new `_total`, a lost label or a changed help
//! text shows up as a difference.
//!
//! `DRA_CPU_UPDATE_METRICS_GOLDEN=1` rewrites a golden file from a run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Set to rewrite the golden files from what the test saw.
pub const UPDATE_ENV: &str = "DRA_CPU_UPDATE_METRICS_GOLDEN";

/// The golden file of `process` (`dra-plugin` or `nri-plugin`).
pub fn golden_path(process: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(format!("{process}.metrics"))
}

/// The label names of a sample's `{...}` part, in order; `None` when the
/// braces are not closed.
fn label_names(labels: &str) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut rest = labels;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.is_empty() {
            return Some(names);
        }
        let (name, after) = rest.split_once('=')?;
        names.push(name.trim().to_string());
        // The value: a quoted string with `\"` escapes.
        let after = after.trim_start().strip_prefix('"')?;
        let mut escaped = false;
        let end = after.char_indices().find_map(|(i, c)| match (escaped, c) {
            (false, '"') => Some(i),
            (false, '\\') => {
                escaped = true;
                None
            }
            _ => {
                escaped = false;
                None
            }
        })?;
        rest = &after[end + 1..];
    }
}

/// The shape of an exposition text: `# HELP` and `# TYPE` lines verbatim,
/// and each sample line as `name{label,names}` (or `name`), once each.
/// Other comments (`# EOF`, `# UNIT`) are kept verbatim too, so that a
/// format change shows.
pub fn shape(text: &str) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            lines.insert(line.to_string());
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let shaped = match line[name_end..].strip_prefix('{') {
            Some(rest) => {
                let close = rest.rfind('}').unwrap_or(rest.len());
                match label_names(&rest[..close]) {
                    Some(names) => format!("{name}{{{}}}", names.join(",")),
                    None => format!("{name}{{unreadable labels: {}}}", &rest[..close]),
                }
            }
            None => name.to_string(),
        };
        lines.insert(shaped);
    }
    lines
}

/// The golden file's lines.
pub fn parse_golden(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The golden file's text for a shape.
pub fn render_golden(shape: &BTreeSet<String>) -> String {
    let mut out = String::new();
    for line in shape {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// What differs between the golden shape and the served one: lines the
/// golden file has and the process no longer serves, and lines served that
/// the golden file lacks.
pub fn differences(golden: &BTreeSet<String>, served: &BTreeSet<String>) -> Vec<String> {
    let missing = golden
        .difference(served)
        .map(|l| format!("no longer served: {l}"));
    let extra = served
        .difference(golden)
        .map(|l| format!("served but not in the golden file: {l}"));
    missing.chain(extra).collect()
}

/// Compare `text` (a `/metrics` body of `process`) with its golden file,
/// or rewrite the file when [`UPDATE_ENV`] is set. The error lists every
/// difference.
pub fn check(process: &str, text: &str) -> Result<(), String> {
    let path = golden_path(process);
    let served = shape(text);
    if std::env::var_os(UPDATE_ENV).is_some() {
        std::fs::write(&path, render_golden(&served))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("rewrote {}", path.display());
    }
    let golden =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let problems = differences(&parse_golden(&golden), &served);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{process}'s /metrics differs from {} (rewrite with {UPDATE_ENV}=1 only for an intended change):\n{}",
            path.display(),
            problems.join("\n")
        ))
    }
}

/// Compare a freshly started process's `/metrics` with its golden file:
/// the same `# HELP` and `# TYPE` lines, and no sample shape the golden
/// file lacks (a labelled family has no sample until its first event, so
/// the golden file, written from every family populated, may have more).
pub fn check_served(process: &str, text: &str) -> Result<(), String> {
    let path = golden_path(process);
    let golden =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let golden = parse_golden(&golden);
    let served = shape(text);
    let comments = |s: &BTreeSet<String>| -> BTreeSet<String> {
        s.iter().filter(|l| l.starts_with('#')).cloned().collect()
    };
    let mut problems = differences(&comments(&golden), &comments(&served));
    problems.extend(
        served
            .difference(&golden)
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("served but not in the golden file: {l}")),
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{process}'s /metrics differs from {}:\n{}",
            path.display(),
            problems.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_keeps_comments_and_drops_values() {
        let text = "# HELP a_total Things, by kind.\n# TYPE a_total counter\n\
                    a_total{kind=\"x\",why=\"a \\\"quoted\\\", b=c\"} 1\n\
                    a_total{kind=\"y\",why=\"z\"} 2\n\
                    h_bucket{le=\"0.1\"} 0\nh_sum 0.5\nh_count 3\n# EOF\n";
        let got: Vec<String> = shape(text).into_iter().collect();
        assert_eq!(
            got,
            [
                "# EOF",
                "# HELP a_total Things, by kind.",
                "# TYPE a_total counter",
                "a_total{kind,why}",
                "h_bucket{le}",
                "h_count",
                "h_sum",
            ]
        );
    }

    #[test]
    fn a_renamed_series_or_label_is_a_difference() {
        let golden = shape("# TYPE a_total counter\na_total{kind=\"x\"} 1\nb 2\n");
        let renamed = shape("# TYPE a_total counter\na_total{sort=\"x\"} 1\nb_total 2\n");
        assert_eq!(
            differences(&golden, &renamed),
            [
                "no longer served: a_total{kind}",
                "no longer served: b",
                "served but not in the golden file: a_total{sort}",
                "served but not in the golden file: b_total",
            ]
        );
        assert!(differences(&golden, &golden).is_empty());
        assert_eq!(parse_golden(&render_golden(&golden)), golden);
    }

    #[test]
    fn unclosed_labels_are_named_not_dropped() {
        let got = shape("x{a=\"1} 2\n");
        assert_eq!(got.len(), 1);
        assert!(got.iter().all(|l| l.contains("unreadable")), "{got:?}");
    }
}
