//! dra-plugin: the kubelet DRA plugin of dra-cpu.

fn main() -> anyhow::Result<()> {
    Ok(())
}
