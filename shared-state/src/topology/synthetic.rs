//! Synthetic topologies built from a shape, for tests and benchmarks.
