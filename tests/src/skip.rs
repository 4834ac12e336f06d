//! Tests that need something a developer machine may lack (containerd,
//! busybox-static, a tool) skip there, but fail in CI, which installs all
//! of it: a missing dependency in CI is a broken setup, never a pass.

use std::fmt::Display;

/// Whether this run is CI: the `CI` environment variable is set, as CI
/// services set it (`CI=true`), to anything but empty, `0` or `false`.
pub fn running_in_ci() -> bool {
    ci_value_means_ci(std::env::var_os("CI").as_deref().and_then(|v| v.to_str()))
}

fn ci_value_means_ci(value: Option<&str>) -> bool {
    match value {
        None => false,
        Some(v) => !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"),
    }
}

/// Called by a test that cannot run because `reason`: in CI it panics,
/// failing the test; elsewhere it prints that the test is skipped and the
/// caller returns.
#[track_caller]
pub fn skip_or_fail_in_ci(reason: impl Display) {
    if running_in_ci() {
        panic!("CI is set, so this is a failure, not a skip: {reason}");
    }
    eprintln!("skipping: {reason} (set CI=true to make this a failure)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_any_value_but_empty_zero_or_false() {
        for (value, ci) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("FALSE"), false),
            (Some("true"), true),
            (Some("1"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(ci_value_means_ci(value), ci, "CI={value:?}");
        }
    }
}
