//! End-to-end harness of dra-cpu.
