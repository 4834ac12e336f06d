//! `perf-table`: measures every row of dra-cpu's performance table, each
//! against its baseline in the same run, and prints the table (Markdown).
//!
//! `scripts/perf.sh` builds the release binaries and runs this. Flags:
//! `--quick` (few samples, to check that every row runs), `--out FILE`
//! (also write the table there), `--skip-containerd` (rows 4 and 5 are
//! reported as not measured), `--only GROUP[,GROUP]` (measure only some of
//! `dra` (rows 1, 2, 7a, 7b, 7d), `alloc` (6), `nri` (3, 7c), `containerd`
//! (4, 4b, 5 on containerd 1.7; 4c, 4d, 5c on containerd 2.x when
//! `DRA_CPU_CONTAINERD2_DIR` names a build)).

// Test support: a panic here fails the test or measurement that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::Context;
use dra_cpu_perf as perf;
use perf::dra::bench::{CdiPlacement, DraBench};
use perf::node_rows::Runtime;
use perf::{Goal, Row};
use std::time::Instant;

// Rows 3 and 7c run nri-plugin's handler in this process: give it the
// allocator the nri-plugin binary ships with.
nri_plugin::install_process_allocator!();

struct Counts {
    fast: usize,
    slow: usize,
    rounds: usize,
    restarts: usize,
    containers: usize,
}

fn counts(quick: bool) -> Counts {
    if quick {
        Counts {
            fast: 20,
            slow: 5,
            rounds: 2,
            restarts: 2,
            containers: 3,
        }
    } else {
        Counts {
            fast: 200,
            slow: 30,
            rounds: 7,
            restarts: 10,
            containers: 15,
        }
    }
}

async fn dra_rows(c: &Counts) -> anyhow::Result<Vec<Row>> {
    let mut bench = DraBench::new()?;
    bench.start().await.context("starting dra-plugin")?;
    let nri = bench.start_nri().await;
    let mut rows = perf::dra::rows::prepare_floor_rows(&mut bench, c.fast).await?;
    rows.push(perf::dra::rows::concurrency_row(&mut bench, c.rounds).await?);
    if let Err(e) = &nri {
        eprintln!("nri-plugin did not start: {e:#}");
    }
    rows.extend(perf::dra::rows::footprint_rows(&mut bench, c.restarts).await?);
    drop(bench);
    // The same prepare with the CDI specs on the store's disk: what a node
    // whose --cdi-dir is not on a tmpfs pays.
    let mut on_disk = DraBench::with_cdi(CdiPlacement::Disk)?;
    on_disk
        .start()
        .await
        .context("starting dra-plugin (CDI on disk)")?;
    rows.extend(perf::dra::rows::prepare_floor_rows(&mut on_disk, c.fast).await?);
    Ok(rows)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let skip_containerd = args.iter().any(|a| a == "--skip-containerd");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_string).collect());
    let wanted = |group: &str| only.as_ref().is_none_or(|g| g.iter().any(|x| x == group));
    let c = counts(quick);
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();

    if wanted("dra") {
        eprintln!("rows 1, 2, 7: dra-plugin on a 1024-CPU sysfs tree ...");
        match dra_rows(&c).await {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("dra-plugin rows failed: {e:#}");
                for (id, what, goal) in [
                    (
                        "1",
                        "NodePrepareResources vs fsync floor",
                        Goal::RatioAtMost(1.5),
                    ),
                    (
                        "2",
                        "32 concurrent vs sequential prepares",
                        Goal::RatioAtLeast(5.0),
                    ),
                    ("7", "footprint and restart", Goal::None),
                ] {
                    rows.push(Row::not_measured(id, what, goal, format!("{e:#}")));
                }
            }
        }
    }
    if wanted("alloc") {
        eprintln!("row 6: allocation ...");
        rows.extend(perf::inproc::allocation_rows(c.fast * 5));
    }
    if wanted("nri") {
        eprintln!("rows 3, 7c: nri-plugin handler ...");
        rows.extend(perf::inproc::nri_rows(c.fast * 5, c.slow).await);
    }
    let runtimes: Vec<Runtime> = std::iter::once(Runtime::debian())
        .chain(Runtime::containerd2())
        .collect();
    for runtime in &runtimes {
        if skip_containerd {
            for (id, what, goal) in runtime.rows() {
                rows.push(Row::not_measured(id, &what, goal, "--skip-containerd"));
            }
        } else if wanted("containerd") {
            eprintln!("rows {}: real {} ...", runtime.ids.join(", "), runtime.name);
            rows.extend(perf::node_rows::rows(runtime, c.containers).await);
        }
    }
    rows.sort_by(|a, b| a.id.cmp(&b.id));

    let table = perf::render(&rows);
    let header = format!(
        "Measured {} on {} CPUs ({}), {:.0} s{}.\n\n",
        now_utc(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::consts::ARCH,
        started.elapsed().as_secs_f64(),
        if quick { ", --quick" } else { "" }
    );
    print!("{header}{table}");
    if let Some(path) = out {
        std::fs::write(&path, format!("{header}{table}"))
            .with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// The wall-clock date as `date -u` prints it, without a date crate.
fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
