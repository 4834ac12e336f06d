//! Crash points: named places between two durable steps of a prepare or
//! an unprepare where the process aborts on request, so that crash-recovery
//! tests can stop the daemon exactly there, which random kills rarely hit.
//!
//! The hooks exist in debug builds (the ones the tests run) and in builds
//! with the `crash-points` feature; a release build without the feature
//! compiles them away and ignores the env var.

/// Env var naming a point where the process aborts, for crash-recovery
/// tests. On the prepare path: `after-store-commit` (committed, no CDI spec
/// yet) or `after-cdi-write` (spec written, caller not yet answered). On the
/// unprepare path: `unprepare-after-cdi-remove` (spec removed, record still
/// stored) or `unprepare-after-store-commit` (record removed, caller not yet
/// answered). Read once.
pub const CRASH_AT_ENV: &str = "DRA_CPU_CRASH_AT";

/// Whether this build has the crash points (a test arming one in a build
/// without them would wait for an abort that never comes).
pub fn enabled() -> bool {
    cfg!(any(debug_assertions, feature = "crash-points"))
}

/// Abort here if [`CRASH_AT_ENV`] names `point`.
#[cfg(any(debug_assertions, feature = "crash-points"))]
pub(crate) fn crash_point(point: &str) {
    static CRASH_AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if CRASH_AT
        .get_or_init(|| std::env::var(CRASH_AT_ENV).ok())
        .as_deref()
        == Some(point)
    {
        std::process::abort();
    }
}

/// Without crash points: nothing.
#[cfg(not(any(debug_assertions, feature = "crash-points")))]
#[inline(always)]
pub(crate) fn crash_point(_point: &str) {}
