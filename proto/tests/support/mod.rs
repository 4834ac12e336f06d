//! Helpers shared by the protocol crate's integration tests.

// Every test binary compiles all of the support; each uses a part of it.
#![allow(dead_code)]

pub mod kubelet;
pub mod reference;
