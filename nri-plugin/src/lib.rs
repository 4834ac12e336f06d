//! nri-plugin: the containerd NRI plugin of dra-cpu. It pins claim
//! containers to their exclusive CPUs and keeps every other container on the
//! shared pool, following the claims dra-plugin prepares.

pub mod config;
pub mod coordination;
pub mod cpuset_check;
pub mod enforcer;
pub mod health;
pub mod host_cgroups;
pub mod http;
pub mod metrics;
pub mod nri;
pub mod partition;
pub mod resolve;
pub mod run;
#[cfg(test)]
mod test_support;
pub mod view;

pub use run::run;

/// The allocator the nri-plugin binary runs on. A CreateContainer reply on a
/// busy node builds hundreds of small update messages, and with glibc's
/// malloc about half of the handler's time went to allocating and freeing
/// them; mimalloc's thread-local free lists make that cheap. Benchmarks of
/// the handler install the same allocator so they measure what ships.
pub type ProcessAllocator = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` in mimalloc 2's `mi_option_t`.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Commit the allocator's arenas on demand, not up front: with eager commit
/// (mimalloc's default where the kernel overcommits) an idle nri-plugin
/// held twice the resident memory it does with glibc. The arena is reserved
/// at the first allocation, before `main`, so this runs as an early
/// constructor (see [`install_process_allocator`]).
pub extern "C" fn tune_allocator() {
    // SAFETY: sets a global option of the allocator by its documented index.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) }
}

/// Installs [`ProcessAllocator`] as the global allocator of the binary (or
/// benchmark) that invokes it, tuned by [`tune_allocator`] from a constructor
/// that runs before the C runtime's default ones (priority 101 of 65535), so
/// before the allocator reserves its first arena.
#[macro_export]
macro_rules! install_process_allocator {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::ProcessAllocator = $crate::ProcessAllocator {};
        #[cfg(target_os = "linux")]
        #[used]
        #[link_section = ".init_array.00101"]
        static TUNE_ALLOCATOR: extern "C" fn() = $crate::tune_allocator;
    };
}
