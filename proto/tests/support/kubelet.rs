//! What kubelet's plugin watcher hears from dra-plugin.

use dra_cpu_proto::kubelet::{self, registration};

/// dra-plugin's GetInfo answer: a DRA plugin named `dra.cpu` serving both
/// DRA API versions on its socket under `/var/lib/kubelet/plugins`.
pub fn dra_plugin_info() -> registration::PluginInfo {
    registration::PluginInfo {
        r#type: kubelet::DRA_PLUGIN_TYPE.into(),
        name: "dra.cpu".into(),
        endpoint: "/var/lib/kubelet/plugins/dra.cpu/dra.sock".into(),
        supported_versions: vec![
            kubelet::DRA_V1_VERSION.into(),
            kubelet::DRA_V1BETA1_VERSION.into(),
        ],
    }
}
