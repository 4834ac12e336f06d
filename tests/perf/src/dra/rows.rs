//! The rows measured on the bench: the durability floor and prepare (1),
//! concurrent against sequential prepares (2), footprint and restart (7).

use super::super::{human, mib, ratio, rss_kib, summarize, Goal, Row, Verdict};
use super::bench::{CdiPlacement, DraBench};
use anyhow::{bail, Context};
use dra_cpu_tests::kubelet_dra::Claim;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// The durability floor: write a small file, fsync it, rename it into place.
fn floor_once(dir: &Path, bytes: &[u8]) -> anyhow::Result<Duration> {
    let tmp = dir.join(".floor.tmp");
    let dst = dir.join("floor.json");
    let started = Instant::now();
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &dst)?;
    Ok(started.elapsed())
}

/// Row 1: one-claim NodePrepareResources against the floor, interleaved.
/// Row 1b is the same on a bench whose CDI directory is on the store's disk.
/// On the tmpfs bench each round also times row 1's parts that are not the
/// commit: 1c, NodePrepareResources of the claim just prepared (the same
/// gRPC call and store lookup, with no API read and no commit), and 1d, the
/// GET of the ResourceClaim a first prepare makes (this process's kube
/// client, the same fake API server); 1e is prepare's own work, round by
/// round row 1 minus 1c minus 1d, against the floor.
pub async fn prepare_floor_rows(bench: &mut DraBench, samples: usize) -> anyhow::Result<Vec<Row>> {
    let floor_dir = bench.state_dir();
    let spec = vec![b'x'; 400];
    let parts = bench.cdi == CdiPlacement::Tmpfs;
    let client = bench.api.client().await?;
    let (mut prepares, mut floors) = (Vec::new(), Vec::new());
    let (mut repeats, mut reads, mut own) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        floors.push(floor_once(&floor_dir, &spec)?);
        let claim = bench.new_claim(2)?;
        let started = Instant::now();
        bench.prepare(&claim).await?;
        let prepare = started.elapsed();
        prepares.push(prepare);
        if parts {
            let started = Instant::now();
            bench.prepare(&claim).await?;
            let repeat = started.elapsed();
            let api: kube::Api<k8s_openapi::api::resource::v1::ResourceClaim> =
                kube::Api::namespaced(client.clone(), &claim.namespace);
            let started = Instant::now();
            api.get(&claim.name).await?;
            let read = started.elapsed();
            repeats.push(repeat);
            reads.push(read);
            own.push(prepare.saturating_sub(repeat + read));
        }
        bench.unprepare(std::slice::from_ref(&claim)).await?;
    }
    let (Some(p), Some(f)) = (summarize(&prepares), summarize(&floors)) else {
        bail!("no samples");
    };
    let floor = ("write+fsync+rename 400 B, store's dir", &f);
    let (id, goal) = match bench.cdi {
        CdiPlacement::Tmpfs => ("1", Goal::RatioAtMost(1.5)),
        CdiPlacement::Disk => ("1b", Goal::None),
    };
    let mut rows = vec![Row::timed(
        id,
        &format!(
            "NodePrepareResources, 1 claim, real gRPC socket (store commit + CDI write; {})",
            bench.cdi.label()
        ),
        goal,
        &p,
        Some(floor),
        p.median,
        true,
    )];
    if let (Some(r), Some(g), Some(o)) = (summarize(&repeats), summarize(&reads), summarize(&own)) {
        rows.push(Row::timed(
            "1c",
            "part of row 1: NodePrepareResources of a prepared claim (gRPC + store lookup; no API read, no commit)",
            Goal::None,
            &r,
            None,
            r.median,
            true,
        ));
        rows.push(Row::timed(
            "1d",
            "part of row 1: GET of the ResourceClaim (kube client, fake API server on loopback)",
            Goal::None,
            &g,
            None,
            g.median,
            true,
        ));
        rows.push(Row::timed(
            "1e",
            "prepare's own work: row 1 minus 1c minus 1d, round by round (the decision, store commit, CDI spec, claim files)",
            Goal::RatioAtMost(1.2),
            &o,
            Some(floor),
            o.median,
            true,
        ));
    }
    Ok(rows)
}

/// Row 2: 32 prepares of different claims at once against 32 one after
/// another; the ratio is sequential time / concurrent time (throughput).
pub async fn concurrency_row(bench: &mut DraBench, rounds: usize) -> anyhow::Result<Row> {
    const N: usize = 32;
    let (mut seq, mut conc) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let claims: Vec<Claim> = (0..N)
            .map(|_| bench.new_claim(2))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        bench.prepare_all(&claims, 1).await?;
        seq.push(started.elapsed());
        bench.unprepare(&claims).await?;

        let claims: Vec<Claim> = (0..N)
            .map(|_| bench.new_claim(2))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        bench.prepare_all(&claims, N).await?;
        conc.push(started.elapsed());
        bench.unprepare(&claims).await?;
    }
    let (Some(s), Some(c)) = (summarize(&seq), summarize(&conc)) else {
        bail!("no samples");
    };
    let throughput = ratio(s.median, c.median);
    Ok(Row {
        id: "2".into(),
        what: format!(
            "32 concurrent prepares (different claims) vs 32 sequential: throughput ratio ({})",
            bench.cdi.label()
        ),
        goal: Goal::RatioAtLeast(5.0),
        measured: format!(
            "32 concurrent: median {} (n={})",
            human(c.median),
            c.samples
        ),
        baseline: format!(
            "32 sequential: median {} (n={})",
            human(s.median),
            s.samples
        ),
        ratio: throughput,
        verdict: super::super::judge(Goal::RatioAtLeast(5.0), c.median, throughput),
    })
}

/// Row 7: RSS of both processes idle and with 1000 claims; dra-plugin
/// start-to-ready with an empty store (baseline) and with 1000 claims.
pub async fn footprint_rows(bench: &mut DraBench, restarts: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    // Settle before reading RSS: the first slices and watches are set up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dra_idle = bench
        .dra_pid()
        .and_then(rss_kib)
        .context("dra-plugin RSS")?;
    let nri_idle = bench.nri_pid().and_then(rss_kib);

    let mut empty = Vec::new();
    for _ in 0..restarts {
        bench.stop()?;
        empty.push(bench.start().await?);
    }
    // The idle figure above is of the process that ran rows 1 and 2; a
    // node's dra-plugin is mostly one that just started.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dra_fresh = bench.dra_pid().filter(|_| restarts > 0).and_then(rss_kib);

    let claims = bench.prepare_new_claims(1000).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dra_full = bench
        .dra_pid()
        .and_then(rss_kib)
        .context("dra-plugin RSS")?;
    let nri_full = bench.nri_pid().and_then(rss_kib);

    let mut full = Vec::new();
    for _ in 0..restarts {
        bench.stop()?;
        full.push(bench.start().await?);
    }
    // Everything was restored from the store: the 1000 claims are prepared.
    let answers = bench.kubelet()?.prepare(&claims[..1]).await?;
    let restored = answers
        .get(&claims[0].uid)
        .is_some_and(|o| o.error.is_empty());

    let record = |id: &str, what: &str, measured: String, baseline: String, r: Option<f64>| Row {
        id: id.into(),
        what: what.into(),
        goal: Goal::None,
        measured,
        baseline,
        ratio: r,
        verdict: Verdict::Info,
    };
    rows.push(record(
        "7a",
        "dra-plugin RSS (VmRSS), 1000 claims prepared",
        mib(dra_full),
        format!(
            "idle, no claims: {} after rows 1 and 2, {} just started",
            mib(dra_idle),
            dra_fresh.map_or_else(|| "-".to_string(), mib)
        ),
        Some(dra_full as f64 / dra_idle.max(1) as f64),
    ));
    match (nri_idle, nri_full) {
        (Some(idle), Some(f)) => rows.push(record(
            "7b",
            "nri-plugin RSS (VmRSS), view with 1000 claims",
            mib(f),
            format!("idle, no claims: {}", mib(idle)),
            Some(f as f64 / idle.max(1) as f64),
        )),
        _ => rows.push(Row::not_measured(
            "7b",
            "nri-plugin RSS",
            Goal::None,
            "nri-plugin was not running",
        )),
    }
    match (summarize(&full), summarize(&empty)) {
        (Some(f), Some(e)) if restored => {
            let mut row = Row::timed(
                "7d",
                "dra-plugin start to ready (registered + slices published + /readyz), 1000 claims in the store",
                Goal::None,
                &f,
                Some(("empty store", &e)),
                f.median,
                false,
            );
            row.verdict = Verdict::Info;
            rows.push(row);
        }
        _ => rows.push(Row::not_measured(
            "7d",
            "dra-plugin start to ready",
            Goal::None,
            format!("restored from the store: {restored}"),
        )),
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_writes_the_file_in_place() {
        let dir = tempfile::tempdir().expect("dir");
        let took = floor_once(dir.path(), b"{}").expect("floor");
        assert!(took > Duration::ZERO);
        assert_eq!(
            std::fs::read(dir.path().join("floor.json")).expect("file"),
            b"{}"
        );
        assert!(!dir.path().join(".floor.tmp").exists());
    }
}
