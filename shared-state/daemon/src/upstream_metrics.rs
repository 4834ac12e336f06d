//! What the upstream Go driver's series (kubernetes-sigs/dra-driver-cpu,
//! `pkg/metrics/metrics.go`) of both daemons have in common: the `result`
//! label and the shape of a series' description. dra-plugin's series are in
//! its `metrics/upstream.rs`, nri-plugin's in its own.

/// Upstream's `result` label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpResult {
    Success,
    Error,
    Unknown,
}

impl OpResult {
    pub const ALL: [OpResult; 3] = [OpResult::Success, OpResult::Error, OpResult::Unknown];

    pub fn label(self) -> &'static str {
        match self {
            OpResult::Success => "success",
            OpResult::Error => "error",
            OpResult::Unknown => "unknown",
        }
    }

    pub fn of<T, E>(result: &Result<T, E>) -> OpResult {
        match result {
            Ok(_) => OpResult::Success,
            Err(_) => OpResult::Error,
        }
    }

    /// Its place in arrays kept by result (as [`OpResult::ALL`]).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One upstream series: name, type, help, label names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

/// Label set `result="..."`.
pub type ResultLabel = [(&'static str, &'static str); 1];

/// The label set of `result`.
pub fn result_label(result: OpResult) -> ResultLabel {
    [("result", result.label())]
}
