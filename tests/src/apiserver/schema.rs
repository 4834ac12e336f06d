//! Validates objects against the real Kubernetes OpenAPI schemas with the
//! `kubernetes-validate` tool (PyPI), which ships them for 1.25 to 1.37.

use serde_json::Value;
use std::process::Command;

/// Name of the validator executable; `KUBERNETES_VALIDATE` overrides it.
fn validator_program() -> String {
    std::env::var("KUBERNETES_VALIDATE").unwrap_or_else(|_| "kubernetes-validate".to_string())
}

/// Where a machine without the validator (the VM node's guest has no
/// Python) leaves its checks for the host: each call's objects go to a
/// directory of their own under this one, with the versions and the mode,
/// and `scripts/vm-node-tests.sh` validates them on the host after the run
/// and fails when any fails. The test itself goes on as if they passed.
pub const DEFER_ENV: &str = "DRA_CPU_DEFER_SCHEMA_CHECKS";

/// Moves one call's object files under `root` for the host to validate:
/// `<root>/<pid>-<n>/` holds the files, `versions` (one a line) and `strict`
/// (`true` or `false`).
fn defer_checks(
    root: &std::path::Path,
    files: tempfile::TempDir,
    versions: &[&str],
    strict: bool,
) -> Result<(), String> {
    static BATCH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BATCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let batch = root.join(format!("{}-{n:04}", std::process::id()));
    std::fs::create_dir_all(&batch).map_err(|e| {
        format!(
            "creating {} for a deferred schema check: {e}",
            batch.display()
        )
    })?;
    let entries = std::fs::read_dir(files.path())
        .map_err(|e| format!("reading {}: {e}", files.path().display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading {}: {e}", files.path().display()))?;
        let to = batch.join(entry.file_name());
        std::fs::copy(entry.path(), &to).map_err(|e| {
            format!(
                "copying {} to {}: {e}",
                entry.path().display(),
                to.display()
            )
        })?;
    }
    let write = |name: &str, text: String| {
        std::fs::write(batch.join(name), text)
            .map_err(|e| format!("writing {}: {e}", batch.join(name).display()))
    };
    write("versions", versions.join("\n") + "\n")?;
    write("strict", format!("{strict}\n"))
}

/// Validates every object against each Kubernetes version (e.g. "1.34.0",
/// "1.37.0") with `--strict`, which also refuses fields the version does not
/// know. Returns the tool's report of every failure. An object whose kind
/// the schema set does not have is a failure too (the tool only warns).
pub fn validate_k8s_objects(objects: &[Value], versions: &[&str]) -> Result<(), String> {
    validate_k8s_objects_with(objects, versions, true)
}

/// As [`validate_k8s_objects`], choosing strict (unknown fields refused) or
/// lenient validation.
pub fn validate_k8s_objects_with(
    objects: &[Value],
    versions: &[&str],
    strict: bool,
) -> Result<(), String> {
    if objects.is_empty() {
        return Ok(());
    }
    let dir = tempfile::tempdir()
        .map_err(|e| format!("creating a temporary directory for schema validation: {e}"))?;
    let mut files = Vec::with_capacity(objects.len());
    for (i, object) in objects.iter().enumerate() {
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_lowercase();
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("unnamed");
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            // File names end at 255 bytes; object names reach 253. The
            // index keeps the files apart, the name only helps a reader.
            .take(160)
            .collect();
        let path = dir.path().join(format!("{i:04}-{kind}-{safe}.json"));
        let text = serde_json::to_string_pretty(object)
            .map_err(|e| format!("serialising object {i} ({kind}/{name}): {e}"))?;
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        files.push(path);
    }
    if let Some(root) = std::env::var_os(DEFER_ENV) {
        return defer_checks(std::path::Path::new(&root), dir, versions, strict);
    }
    let program = validator_program();
    let mut failures = Vec::new();
    for version in versions {
        let mut command = Command::new(&program);
        command.arg("-k").arg(version).arg("--quiet");
        if strict {
            command.arg("--strict");
        }
        command.args(&files);
        let output = command.output().map_err(|e| {
            format!("running {program} (install it with `pip install kubernetes-validate`): {e}")
        })?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The tool prints WARN and exits 0 for a kind it has no schema for:
        // that is not a pass.
        let warned = stdout.lines().any(|l| l.starts_with("WARN"));
        if !output.status.success() || warned {
            failures.push(format!(
                "kubernetes {version}{}: exit {}\n{}{}",
                if strict { " (strict)" } else { "" },
                output
                    .status
                    .code()
                    .map_or("by signal".to_string(), |c| c.to_string()),
                stdout.trim_end(),
                if stderr.trim().is_empty() {
                    String::new()
                } else {
                    format!("\n{}", stderr.trim_end())
                },
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// A copy of the objects without `spec.devices[].nodeAllocatableResources`
/// (KEP-5517), which only the 1.37 schema has: what a server before 1.37, or
/// one without the `DRANodeAllocatableResources` gate, keeps of a slice.
/// Validate this against 1.34 in strict mode.
pub fn without_node_allocatable_resources(objects: &[Value]) -> Vec<Value> {
    objects
        .iter()
        .map(|object| {
            let mut object = object.clone();
            for device in super::slice_devices_mut(&mut object) {
                device.remove("nodeAllocatableResources");
            }
            object
        })
        .collect()
}
