//! Writes the OCI image archives the real node imports (no registry is
//! reachable and no Docker engine runs): the busybox test image, tagged as the
//! workload and the sandbox image, and the driver's image with both binaries.
//!
//!   oci-image busybox OUT.tar
//!   oci-image driver TAG OUT.tar BINARY...

use anyhow::{bail, Context};
use dra_cpu_tests::image::{build_busybox_image, build_driver_image};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (archive, out) = match args.as_slice() {
        [kind, out] if kind == "busybox" => (build_busybox_image()?, out),
        [kind, tag, out, binaries @ ..] if kind == "driver" && !binaries.is_empty() => {
            let binaries: Vec<PathBuf> = binaries.iter().map(PathBuf::from).collect();
            (build_driver_image(&binaries, tag)?, out)
        }
        _ => bail!("usage: oci-image busybox OUT.tar | oci-image driver TAG OUT.tar BINARY..."),
    };
    std::fs::write(out, &archive.bytes).with_context(|| format!("writing {out}"))?;
    println!("{out} {}", archive.manifest_digest);
    Ok(())
}
