//! Every flag the README and the pages under `docs/` name for nri-plugin is
//! in its `--help` (`dra_cpu_tests::docs_check` says how a flag's owner is
//! read; dra-plugin's docs test checks the rest and the links).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::docs_check::Known;
use std::path::Path;

#[test]
fn readme_and_docs_name_only_flags_nri_plugin_has() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut known = Known::with_scripts(&repo).expect("scripts/");
    known.add_program("nri-plugin", Path::new(env!("CARGO_BIN_EXE_nri-plugin")));
    let problems = known.problems(&repo, false);
    assert!(
        problems.is_empty(),
        "the README and docs/ name nri-plugin flags it does not have:\n{}",
        problems.join("\n")
    );
}
