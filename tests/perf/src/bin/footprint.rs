//! Where the daemons' resident memory goes: starts the bench of row 7
//! (dra-plugin on the 1024-CPU node, nri-plugin subscribed), prints each
//! process's `smaps_rollup` by kind right after start and again with
//! `--claims N` claims prepared and once more after they are all unprepared
//! (what the burst left behind), and with `--hold` keeps both running until
//! stdin closes, for a profiler (`heaptrack -p`, `perf`, `/proc/<pid>/smaps`).
//!
//! Unlike row 7, which reads the process after rows 1 and 2 ran in it, the
//! first reading here is of a fresh start.

use anyhow::Context;
use dra_cpu_perf::dra::bench::DraBench;
use std::io::Read;
use std::time::Duration;

/// The `smaps_rollup` lines worth printing, in KiB.
const KINDS: [&str; 4] = ["Rss:", "Anonymous:", "Shared_Clean:", "Private_Clean:"];

/// How long after the last unprepare the third reading is taken: past the
/// status writes the unprepares queued and past the 10 s after which the
/// burst's idle blocking threads exit.
const UNPREPARED_SETTLE_MS: u64 = 12_000;

/// With `--hold`, a pause with the claims prepared: one line on stdin goes on.
async fn hold_until_stdin_line() {
    println!("holding with the claims prepared; a line on stdin goes on");
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
}

fn rollup(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:").map(|t| t.trim().to_string()))
        .unwrap_or_default();
    let mut parts: Vec<String> = KINDS
        .iter()
        .filter_map(|kind| {
            let line = text.lines().find(|l| l.starts_with(kind))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!(
                "{} {:.1} MiB",
                kind.trim_end_matches(':'),
                kib as f64 / 1024.0
            ))
        })
        .collect();
    parts.push(format!("threads {threads}"));
    parts.join(", ")
}

fn report(bench: &DraBench, when: &str) {
    if let Some(pid) = bench.dra_pid() {
        println!("{when}: dra-plugin (pid {pid}): {}", rollup(pid));
    }
    if let Some(pid) = bench.nri_pid() {
        println!("{when}: nri-plugin (pid {pid}): {}", rollup(pid));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: footprint [--claims N] [--hold]   (binaries from DRA_PLUGIN_BIN, NRI_PLUGIN_BIN; readings: idle, with the claims, after they are unprepared)");
        return Ok(());
    }
    let claims: usize = match args.iter().position(|a| a == "--claims") {
        Some(i) => args
            .get(i + 1)
            .context("--claims needs a number")?
            .parse()
            .context("--claims needs a number")?,
        None => 1000,
    };
    let hold = args.iter().any(|a| a == "--hold");

    let mut bench = DraBench::new()?;
    bench.start().await.context("starting dra-plugin")?;
    if let Err(e) = bench.start_nri().await {
        eprintln!("nri-plugin did not start: {e:#}");
    }
    // As row 7: the first slices and watches are set up by then.
    tokio::time::sleep(Duration::from_millis(500)).await;
    report(&bench, "idle");
    if claims > 0 {
        let prepared = bench.prepare_new_claims(claims).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        report(&bench, &format!("{claims} claims"));
        if hold {
            hold_until_stdin_line().await;
        }
        for chunk in prepared.chunks(32) {
            bench.unprepare(chunk).await?;
        }
        tokio::time::sleep(Duration::from_millis(UNPREPARED_SETTLE_MS)).await;
        report(&bench, "unprepared");
    }
    if hold {
        println!("holding; close stdin to stop");
        let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await;
    }
    Ok(())
}
