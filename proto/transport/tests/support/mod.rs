//! Helpers shared by the transport's integration tests.

// Every test binary compiles all of the support; each uses a part of it.
#![allow(dead_code)]

pub mod h2;
/// The registration answer the protocol crate's tests use too.
#[path = "../../../tests/support/kubelet.rs"]
pub mod kubelet;
