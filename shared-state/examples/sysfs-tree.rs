//! Writes one of the synthetic sysfs trees of the tests to a directory, to
//! look at, or to read with `lscpu --sysroot DIR` or `dra-plugin inspect
//! --sysfs-root DIR`:
//!
//! ```text
//! cargo run -p shared-state --example sysfs-tree -- NAME DIR
//! ```
//!
//! Without arguments it lists the names.

use shared_state::topology::sysfs_tree::{write_named, NAMED};
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, dir] = args.as_slice() else {
        eprintln!("usage: sysfs-tree NAME DIR\nnames: {}", NAMED.join(", "));
        return ExitCode::from(2);
    };
    match write_named(name, Path::new(dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sysfs-tree: {e}");
            ExitCode::FAILURE
        }
    }
}
