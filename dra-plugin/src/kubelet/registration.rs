//! Kubelet plugin registration: the `pluginregistration.Registration`
//! service kubelet's plugin watcher calls on the socket we create in
//! `<kubelet-root>/plugins_registry/`.

use dra_cpu_proto::kubelet::{
    registration, DRA_PLUGIN_TYPE, DRA_V1BETA1_VERSION, DRA_V1_VERSION, HEALTH_V1ALPHA1_VERSION,
    HEALTH_V1_VERSION,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// The services we serve, each API newest first. Kubelet picks the DRA
/// version it prefers among the `*.DRAPlugin` entries and ignores entries it
/// does not know; the health entries come after them, as the Go plugin
/// helper lists them.
pub fn supported_versions() -> Vec<String> {
    [
        DRA_V1_VERSION,
        DRA_V1BETA1_VERSION,
        HEALTH_V1_VERSION,
        HEALTH_V1ALPHA1_VERSION,
    ]
    .map(String::from)
    .to_vec()
}

/// What kubelet last told us about our registration.
#[derive(Debug, Default)]
pub struct RegistrationState {
    registered: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl RegistrationState {
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    pub fn last_error(&self) -> Option<String> {
        shared_state::sync::lock(&self.last_error).clone()
    }
}

pub struct Registrar {
    driver_name: String,
    endpoint: PathBuf,
    state: Arc<RegistrationState>,
}

impl Registrar {
    pub fn new(driver_name: String, endpoint: PathBuf, state: Arc<RegistrationState>) -> Registrar {
        Registrar {
            driver_name,
            endpoint,
            state,
        }
    }

    pub fn info(&self) -> registration::PluginInfo {
        registration::PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_string(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: supported_versions(),
        }
    }
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _request: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(self.info()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.state
            .registered
            .store(status.plugin_registered, Ordering::Relaxed);
        let error = (!status.error.is_empty()).then(|| status.error.clone());
        if status.plugin_registered {
            tracing::info!(driver = %self.driver_name, "kubelet registered the plugin");
        } else {
            tracing::error!(driver = %self.driver_name, error = %status.error, "kubelet refused the plugin registration");
        }
        *shared_state::sync::lock(&self.state.last_error) = error;
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use registration::registration_server::Registration;

    #[tokio::test]
    async fn info_and_status() {
        let state = Arc::new(RegistrationState::default());
        let r = Registrar::new(
            "dra.cpu".into(),
            "/var/lib/kubelet/plugins/dra.cpu/dra.sock".into(),
            state.clone(),
        );
        let info = r.info();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(
            info.supported_versions,
            vec![
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ]
        );
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/dra.cpu/dra.sock");
        assert!(!state.registered());
        let refused = registration::RegistrationStatus {
            plugin_registered: false,
            error: "bad version".into(),
        };
        assert!(r
            .notify_registration_status(Request::new(refused))
            .await
            .is_ok());
        assert_eq!(state.last_error().as_deref(), Some("bad version"));
        let ok = registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        };
        assert!(r.notify_registration_status(Request::new(ok)).await.is_ok());
        assert!(state.registered());
        assert_eq!(state.last_error(), None);
    }
}
