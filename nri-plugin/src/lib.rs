//! nri-plugin: the containerd NRI plugin of dra-cpu. It pins claim
//! containers to their exclusive CPUs and keeps every other container on the
//! shared pool, following the claims dra-plugin prepares.

pub mod cdi_fallback;
pub mod config;
pub mod handler;
pub mod metrics;
pub mod plugin;
pub mod subscription;

/// The allocator the nri-plugin binary runs on. A CreateContainer reply on a
/// busy node builds hundreds of small update messages, and with glibc's
/// malloc about half of the handler's time went to allocating and freeing
/// them; mimalloc's thread-local free lists make that cheap. Benchmarks of
/// the handler install the same allocator so they measure what ships.
pub type ProcessAllocator = mimalloc::MiMalloc;
