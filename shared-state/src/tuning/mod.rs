//! Low-latency tuning a claim asks for (device interrupts kept off its CPUs,
//! CFS quota off for its containers, a bound on how deep its CPUs may idle,
//! a cpufreq governor, scheduler load balancing off), what a node can honour, and the kernel values the
//! node should hold for a set of tuned claims. Pure: the I/O that reads and
//! writes `/proc` and `/sys` is dra-plugin's (`dra-plugin/src/tuning`), the
//! container part nri-plugin's.

pub mod plan;
pub mod request;
pub mod support;
