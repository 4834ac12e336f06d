//! Helpers shared by the protocol crate's integration tests.

pub mod reference;
