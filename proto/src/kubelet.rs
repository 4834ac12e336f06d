//! Kubelet DRA, plugin registration and DRA health bindings (tonic).
//!
//! gRPC service names are the kubelet's own, e.g.
//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, `pluginregistration.Registration`,
//! `v1alpha1.DRAResourceHealth` and `v1.DRAResourceHealth`.

/// Version strings a DRA plugin advertises in `PluginInfo.supported_versions`
/// (kubelet matches these, not the gRPC service names).
pub const DRA_V1_VERSION: &str = "v1.DRAPlugin";
/// See [`DRA_V1_VERSION`].
pub const DRA_V1BETA1_VERSION: &str = "v1beta1.DRAPlugin";
/// Advertised so that 1.37+ kubelets (and 1.36.x with the backport of
/// kubernetes #139477) open the health stream: they open it only for
/// plugins listing `v1.DRAResourceHealth` (preferred) or
/// `v1alpha1.DRAResourceHealth` (`pickHealthService` in
/// `pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`).
pub const HEALTH_V1_VERSION: &str = "v1.DRAResourceHealth";
/// See [`HEALTH_V1_VERSION`].
pub const HEALTH_V1ALPHA1_VERSION: &str = "v1alpha1.DRAResourceHealth";
/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";

/// `k8s.io.kubelet.pkg.apis.dra.v1`: DRAPlugin (NodePrepareResources, NodeUnprepareResources).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the same service for older kubelets.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `pluginregistration`: Registration (GetInfo, NotifyRegistrationStatus).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `v1alpha1`: DRAResourceHealth (NodeWatchResources).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// `v1`: DRAResourceHealth (NodeWatchResources) with per-device timeout and message.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod health_v1 {
    tonic::include_proto!("v1");
}

/// Encoded `google.protobuf.FileDescriptorSet` of every kubelet protocol file
/// above, for reflection and for checking the schema in tests.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kubelet_descriptor.bin"));
