//! The nri-plugin binary runs on mimalloc with its arenas committed on
//! demand. mimalloc prints its options when asked (`MIMALLOC_VERBOSE=1`),
//! by name and as they are in force, so this reads the setting from the
//! real binary: it is 2 (eager where the kernel overcommits) unless the
//! tuning ran before the allocator started.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn the_binary_commits_allocator_arenas_on_demand() {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-plugin"))
        .arg("--version")
        .env("MIMALLOC_VERBOSE", "1")
        .output()
        .expect("run nri-plugin --version");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let setting = stderr
        .lines()
        .find(|line| line.contains("option 'arena_eager_commit'"))
        .unwrap_or_else(|| panic!("mimalloc printed no arena_eager_commit option: {stderr}"));
    assert_eq!(setting.trim(), "option 'arena_eager_commit': 0", "{stderr}");
}
