//! nri-plugin: the containerd NRI plugin of dra-cpu.

fn main() -> anyhow::Result<()> {
    Ok(())
}
