//! Liveness and readiness of dra-plugin: what its parts report and what
//! `/healthz` and `/readyz` answer from.

use crate::driver::StoreFault;
use crate::kubelet::registration::RegistrationState;
use crate::publisher::status::PublishStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Liveness and readiness, as `/healthz` and `/readyz` report them.
#[derive(Debug, Default)]
pub struct Health {
    /// Every socket is served.
    pub serving: AtomicBool,
    pub registration: Arc<RegistrationState>,
    /// The driver's last failed store write; set, the process is unhealthy.
    pub store: Arc<StoreFault>,
    /// Why the node's devices are not (correctly) published, if they are not.
    pub publishing: Arc<PublishStatus>,
}

impl Health {
    pub fn ready(&self) -> bool {
        self.unready_reason().is_none()
    }

    /// Why `/readyz` says not ready, if it does.
    pub fn unready_reason(&self) -> Option<String> {
        if let Some(error) = self.store.error() {
            return Some(format!("store write failed: {error}"));
        }
        if !self.serving.load(Ordering::Relaxed) {
            return Some("not serving yet".to_string());
        }
        self.publishing.unready_reason()
    }
}
