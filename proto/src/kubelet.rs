//! Kubelet DRA, plugin registration and DRA health bindings (tonic).
