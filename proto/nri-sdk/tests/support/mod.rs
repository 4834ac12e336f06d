//! Helpers shared by the NRI client's integration tests.

pub mod nri_runtime;
