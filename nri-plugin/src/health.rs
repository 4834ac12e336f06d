//! Liveness and readiness of nri-plugin: what its parts report and what
//! `/healthz`, `/readyz` and the two connection gauges answer from.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether nri-plugin is connected to the runtime and to dra-plugin. The
/// flags are shared with the gauges that show them (see
/// [`crate::metrics::Metrics::watching`]).
#[derive(Debug, Default)]
pub struct Health {
    /// Registered with the NRI runtime and synchronized with it.
    pub(crate) nri_registered: Arc<AtomicBool>,
    /// Subscribed to dra-plugin's coordination stream.
    pub(crate) coordination_connected: Arc<AtomicBool>,
}

impl Health {
    pub fn nri_registered(&self) -> bool {
        self.nri_registered.load(Ordering::Relaxed)
    }

    pub fn set_nri_registered(&self, registered: bool) {
        self.nri_registered.store(registered, Ordering::Relaxed);
    }

    pub fn coordination_connected(&self) -> bool {
        self.coordination_connected.load(Ordering::Relaxed)
    }

    pub fn set_coordination_connected(&self, connected: bool) {
        self.coordination_connected
            .store(connected, Ordering::Relaxed);
    }

    /// Why `/readyz` says not ready, if it does: nri-plugin pins nothing
    /// until the runtime has registered and synchronized it.
    pub fn unready_reason(&self) -> Option<&'static str> {
        (!self.nri_registered()).then_some("not registered with the NRI runtime")
    }
}

/// Clear the registration whenever the runtime connection is lost (the
/// connection can drop without a Shutdown when containerd is killed);
/// returns when `connection`'s sender is gone. Only a lost connection
/// clears it and only Synchronize sets it: Synchronize may arrive before
/// the client records its new connection.
pub async fn follow_registration(
    mut connection: tokio::sync::watch::Receiver<bool>,
    health: Arc<Health>,
) {
    while connection.changed().await.is_ok() {
        if !*connection.borrow_and_update() {
            health.set_nri_registered(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lost_connection_clears_the_registration() {
        let health = Arc::new(Health::default());
        let (connected, connection) = tokio::sync::watch::channel(false);
        let follower = tokio::spawn(follow_registration(connection, health.clone()));
        connected.send_replace(true);
        // Synchronize: registered.
        health.set_nri_registered(true);
        tokio::task::yield_now().await;
        assert!(health.nri_registered());
        assert_eq!(health.unready_reason(), None);
        connected.send_replace(false);
        drop(connected);
        follower.await.expect("the follower ends with its sender");
        assert!(!health.nri_registered());
        assert!(health.unready_reason().is_some());
    }
}
