//! The publisher's part of readiness: why publishing keeps the node from
//! being ready (the last publish failed, or the configured devices cannot
//! work on this server), shared with `/readyz`.

use std::sync::Mutex;

/// Why the node is not ready as far as publishing goes, shared with
/// `/readyz`.
#[derive(Debug, Default)]
pub struct PublishStatus {
    state: Mutex<StatusState>,
}

#[derive(Debug, Default, Clone)]
struct StatusState {
    /// The last publish failed, with this reason.
    failure: Option<String>,
    /// The configured devices cannot work on this server, for this reason.
    refusal: Option<String>,
}

impl PublishStatus {
    fn state(&self) -> std::sync::MutexGuard<'_, StatusState> {
        // Plain strings behind the lock: still fine after a panic elsewhere.
        shared_state::sync::lock(&self.state)
    }

    /// `Some(reason)` while publishing keeps the node from being ready.
    pub fn unready_reason(&self) -> Option<String> {
        let state = self.state();
        match (&state.refusal, &state.failure) {
            (None, None) => None,
            (Some(r), None) | (None, Some(r)) => Some(r.clone()),
            (Some(refusal), Some(failure)) => Some(format!("{refusal}; {failure}")),
        }
    }

    pub fn set_failure(&self, failure: Option<String>) {
        self.state().failure = failure;
    }

    pub fn set_refusal(&self, refusal: Option<String>) {
        self.state().refusal = refusal;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_reasons_combine_and_clear() {
        let status = PublishStatus::default();
        assert_eq!(status.unready_reason(), None);
        status.set_failure(Some("f".into()));
        assert_eq!(status.unready_reason().as_deref(), Some("f"));
        status.set_refusal(Some("r".into()));
        assert_eq!(status.unready_reason().as_deref(), Some("r; f"));
        status.set_failure(None);
        status.set_refusal(None);
        assert_eq!(status.unready_reason(), None);
    }
}
