//! The README and every page under `docs/` name only flags that dra-plugin
//! and nri-plugin have (their `--help`, subcommands included) and that the
//! scripts they run take, and link only to files and headings that exist
//! (`dra_cpu_tests::docs_check` says how a flag's owner is read).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::docs_check::Known;
use dra_cpu_tests::skip::skip_or_fail_in_ci;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// nri-plugin as `cargo test --workspace` builds it, next to dra-plugin
/// (or `$NRI_PLUGIN_BIN`).
fn nri_plugin() -> Option<PathBuf> {
    let path = match std::env::var_os("NRI_PLUGIN_BIN").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_BIN_EXE_dra-plugin")).with_file_name("nri-plugin"),
    };
    path.is_file().then_some(path)
}

#[test]
fn readme_and_docs_name_real_flags_and_link_to_real_files() {
    let repo = repo();
    let mut known = Known::with_scripts(&repo).expect("scripts/");
    known.add_program("dra-plugin", Path::new(env!("CARGO_BIN_EXE_dra-plugin")));
    match nri_plugin() {
        Some(binary) => known.add_program("nri-plugin", &binary),
        None => skip_or_fail_in_ci(
            "no nri-plugin next to dra-plugin (cargo build -p nri-plugin): \
             its flags are checked by nri-plugin's own docs test only",
        ),
    }
    let problems = known.problems(&repo, true);
    assert!(
        problems.is_empty(),
        "the README and docs/ name what does not exist:\n{}",
        problems.join("\n")
    );
}
