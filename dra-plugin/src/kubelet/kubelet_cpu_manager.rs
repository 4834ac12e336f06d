//! Coexistence with kubelet's CPU manager.
//!
//! Kubelet's `static` CPU manager policy gives Guaranteed pods with whole
//! CPUs exclusive CPUs of its own choosing, from the same CPUs this driver
//! hands to claims: two owners would give one CPU to two workloads. Kubelet
//! records its policy in `<kubelet-root-dir>/cpu_manager_state` (JSON,
//! `policyName`; `pkg/kubelet/cm/cpumanager/state/checkpoint.go`), which is
//! read at start:
//! - `static`: refuse to start, saying why and what to change, unless the
//!   operator allowed it (`--allow-kubelet-static-cpu-manager`);
//! - `none`: go on;
//! - missing, unreadable or corrupt, or a policy this driver does not know:
//!   a warning that says so, and go on (the file says nothing reliable).

use std::path::{Path, PathBuf};

/// The checkpoint file kubelet writes in its root directory.
pub const STATE_FILE: &str = "cpu_manager_state";

/// What the start-up check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to say: kubelet's policy is `none`.
    Proceed,
    /// Go on, but tell the operator this.
    Warn(String),
    /// Do not start: the reason, with what to change.
    Refuse(String),
}

/// Why a `cpu_manager_state` file's text names no policy.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("not a CPU manager checkpoint: {0}")]
    NotACheckpoint(#[source] serde_json::Error),
    #[error("no policyName in the checkpoint")]
    NoPolicyName,
}

/// The `policyName` of a `cpu_manager_state` file's text.
pub fn policy_name(text: &str) -> Result<String, CheckpointError> {
    #[derive(serde::Deserialize)]
    struct Checkpoint {
        #[serde(rename = "policyName")]
        policy_name: Option<String>,
    }
    let checkpoint: Checkpoint =
        serde_json::from_str(text).map_err(CheckpointError::NotACheckpoint)?;
    checkpoint
        .policy_name
        .filter(|name| !name.is_empty())
        .ok_or(CheckpointError::NoPolicyName)
}

/// The verdict for the state file at `path`, read as `read` gives it.
pub fn verdict(path: &Path, read: std::io::Result<String>, allow_static: bool) -> Verdict {
    let text = match read {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Verdict::Warn(format!(
                "kubelet's CPU manager state {} does not exist; if kubelet runs the static CPU manager policy, it and this driver both hand out exclusive CPUs (check --kubelet-root-dir)",
                path.display()
            ))
        }
        Err(e) => {
            return Verdict::Warn(format!(
                "cannot read kubelet's CPU manager state {}: {e}; its CPU manager policy is unknown",
                path.display()
            ))
        }
    };
    match policy_name(&text) {
        Err(reason) => Verdict::Warn(format!(
            "kubelet's CPU manager state {} is unreadable ({reason}); its CPU manager policy is unknown",
            path.display()
        )),
        Ok(policy) if policy == "none" => Verdict::Proceed,
        Ok(policy) if policy == "static" && allow_static => Verdict::Warn(format!(
            "kubelet runs the static CPU manager policy ({}); allowed by --allow-kubelet-static-cpu-manager: Guaranteed pods with whole CPUs may get CPUs of this driver's claims",
            path.display()
        )),
        Ok(policy) if policy == "static" => Verdict::Refuse(format!(
            "kubelet runs the static CPU manager policy ({} says policyName \"static\"): kubelet and this driver would both hand out exclusive CPUs, and one CPU could go to two workloads. Set kubelet's cpuManagerPolicy to none (and remove {} before kubelet restarts), or start with --allow-kubelet-static-cpu-manager to accept the overlap",
            path.display(),
            path.display()
        )),
        Ok(policy) => Verdict::Warn(format!(
            "kubelet's CPU manager policy is {policy:?} ({}), which this driver does not know; it may hand out the same CPUs",
            path.display()
        )),
    }
}

/// Reads `<kubelet_root>/cpu_manager_state` and decides.
pub fn check(kubelet_root: &Path, allow_static: bool) -> (PathBuf, Verdict) {
    let path = kubelet_root.join(STATE_FILE);
    let read = std::fs::read_to_string(&path);
    let verdict = verdict(&path, read, allow_static);
    (path, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    const STATIC: &str = r#"{"policyName":"static","defaultCpuSet":"0,3-63","entries":{"pod-uid":{"app":"1-2"}},"checksum":1234}"#;
    const NONE: &str = r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#;

    #[test]
    fn the_verdict_follows_kubelets_policy() {
        let path = Path::new("/var/lib/kubelet/cpu_manager_state");
        let ok = |text: &str| Ok(text.to_string());
        let cases: Vec<(&str, std::io::Result<String>, bool, &str)> = vec![
            ("none", ok(NONE), false, "proceed"),
            ("static", ok(STATIC), false, "refuse"),
            ("static, allowed", ok(STATIC), true, "warn"),
            (
                "unknown policy",
                ok(r#"{"policyName":"magic"}"#),
                false,
                "warn",
            ),
            ("corrupt", ok("{\"policyName\":"), false, "warn"),
            ("empty policy", ok(r#"{"policyName":""}"#), false, "warn"),
            (
                "missing",
                Err(Error::from(ErrorKind::NotFound)),
                false,
                "warn",
            ),
            (
                "unreadable",
                Err(Error::from(ErrorKind::PermissionDenied)),
                false,
                "warn",
            ),
        ];
        for (name, read, allow, want) in cases {
            let got = verdict(path, read, allow);
            let kind = match &got {
                Verdict::Proceed => "proceed",
                Verdict::Warn(_) => "warn",
                Verdict::Refuse(_) => "refuse",
            };
            assert_eq!(kind, want, "{name}: {got:?}");
            if let Verdict::Warn(text) | Verdict::Refuse(text) = &got {
                assert!(
                    text.contains("/var/lib/kubelet/cpu_manager_state"),
                    "{name}: {text}"
                );
            }
        }
    }

    #[test]
    fn a_refusal_names_the_file_the_policy_and_the_way_out() {
        let path = Path::new("/k/cpu_manager_state");
        let Verdict::Refuse(text) = verdict(path, Ok(STATIC.into()), false) else {
            panic!("static must refuse");
        };
        for needle in [
            "/k/cpu_manager_state",
            "\"static\"",
            "cpuManagerPolicy to none",
            "--allow-kubelet-static-cpu-manager",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
    }
}
