//! Rows measured on a real `dra-plugin run` process (and an nri-plugin
//! subscribed to it) on a 1024-CPU sysfs tree, with the fake API server
//! holding the claims and the kubelet stand-in calling the real gRPC socket:
//! prepare against the durability floor (row 1), concurrent against
//! sequential prepares (row 2), footprint and restart (row 7).

pub mod bench;
pub mod rows;

use anyhow::{bail, Context};
use shared_state::topology::synthetic::MACHINE_1024;
use shared_state::topology::sysfs_tree::Machine;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

const NODE: &str = "node-a";
const NUMA_NODES: u32 = 4;
const SETTLE: Duration = Duration::from_secs(60);

/// A binary of the workspace: `$env`, else the release build, else debug.
pub fn find_binary(name: &str, env: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let target = target_dir();
    for profile in ["release", "debug"] {
        let path = target.join(profile).join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!("{name} not found under {}; set ${env}", target.display())
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// Writes a 1024-CPU sysfs tree (2 sockets × 2 NUMA × 4 L3 × 32 cores × 2
/// threads, [`MACHINE_1024`]).
fn write_sysfs(root: &Path) -> anyhow::Result<()> {
    Machine::from(MACHINE_1024)
        .write(root)
        .with_context(|| format!("writing a 1024-CPU sysfs tree under {}", root.display()))
}

/// The 1024-CPU tree, written once under the target directory (writing its
/// ten thousand files takes longer than most rows) and reused after.
pub fn sysfs_1024() -> anyhow::Result<PathBuf> {
    let root = target_dir().join("tmp/perf-sysfs-1024");
    let done = root.join(".complete");
    if done.is_file() {
        return Ok(root);
    }
    let partial = target_dir().join(format!("tmp/perf-sysfs-1024.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    write_sysfs(&partial)?;
    std::fs::write(partial.join(".complete"), b"")?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root)
        .with_context(|| format!("moving {} into place", partial.display()))?;
    Ok(root)
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(l.local_addr()?)
}

/// GET over plain HTTP/1.0; the body on 200.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")).then(|| body.into())
}

fn metric(text: &str, name: &str) -> Option<f64> {
    dra_cpu_tests::node::read_back::metric_value(text, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_sysfs_tree_has_1024_cpus() {
        let root = sysfs_1024().expect("the 1024-CPU sysfs tree");
        // Counting entries, not discovering the topology: discovery reads
        // some ten thousand files, which belongs in the table's run.
        let count = |dir: &str, prefix: &str| {
            std::fs::read_dir(root.join(dir))
                .expect("sysfs dir")
                .filter_map(Result::ok)
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix(prefix)
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        };
        assert_eq!(count("sys/devices/system/cpu", "cpu"), 1024);
        assert_eq!(
            count("sys/devices/system/node", "node"),
            NUMA_NODES as usize
        );
    }
}
