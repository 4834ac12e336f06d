//! Wire protocols of dra-cpu.
