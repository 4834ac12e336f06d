//! dra-plugin as a library: the parts of the kubelet DRA plugin that the
//! binary wires together and that tests drive directly.

pub mod api_client;
pub mod cdi;
pub mod claim_status;
pub mod cli;
pub mod config;
pub mod coordination_server;
pub mod device_metadata;
pub mod devices;
pub mod driver;
pub mod health;
pub mod http;
pub mod k8s_names;
pub mod kubelet;
pub mod metrics;
pub mod opaque_config;
pub mod prepare;
pub mod publisher;
pub mod quantity;
pub mod run;
pub mod settings;
pub mod slice_error;
pub mod slices;
pub mod tuning;
pub mod upstream_config;
