//! The Helm chart as `helm template` renders it, for the checks of what the
//! chart deploys against what the daemons read and call.
//!
//! Needs `helm` (scripts/install-deps.sh installs it; `HELM` overrides the
//! binary).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The chart's directory in this repository.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/dra-cpu")
}

/// `helm template <release>` of the chart with `extra` arguments: the
/// rendered YAML. A missing `helm` or a failed render fails the test.
pub fn template(release: &str, extra: &[&OsStr]) -> String {
    let helm = std::env::var_os("HELM").unwrap_or_else(|| "helm".into());
    let output = std::process::Command::new(&helm)
        .args(["template", release])
        .arg(chart_dir())
        .args(extra)
        .output()
        .unwrap_or_else(|e| {
            panic!("running {helm:?}: {e} (install helm with scripts/install-deps.sh or set HELM)")
        });
    assert!(
        output.status.success(),
        "helm template {extra:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The objects the chart renders with `values` (a file under `ci/`, or
/// none for the defaults).
pub fn render(values: Option<&str>) -> Vec<serde_json::Value> {
    let values_file = values.map(|v| chart_dir().join("ci").join(v));
    let extra: Vec<&OsStr> = match &values_file {
        Some(file) => vec!["-f".as_ref(), file.as_os_str()],
        None => Vec::new(),
    };
    template("dra-cpu", &extra)
        .split("\n---")
        .filter_map(|doc| dra_cpu_daemon::config_file::from_yaml::<serde_json::Value>(doc).ok())
        .filter(|doc| doc.get("kind").is_some())
        .collect()
}

/// The first rendered object of `kind`; there must be one.
pub fn object<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d.get("kind").and_then(|k| k.as_str()) == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}
