//! Prints the medians of a prepare and an unprepare on this machine, each
//! with its real store commit (sled flush + fdatasync) and, for prepare, its
//! CDI spec write (fsync of the file, then rename), next to the cost of one
//! bare write+fsync of a small file in the same run and directory. Then,
//! over ROUNDS/10 rounds (at least 3), the median time of 32 prepares of
//! different claims one after another and of 32 at once from 32 threads,
//! whose changes share group commits, and their throughput ratio.
//!
//! `cargo run --release -p dra-plugin --example prepare_latency [ROUNDS] [DIR]`
//! DIR defaults to a temporary directory; pass one on the disk of interest.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::claims::AllocatedClaim;
use dra_plugin::cdi::CdiDir;
use dra_plugin::devices::DeviceCatalog;
use dra_plugin::devices::{DeviceMode, GroupBy};
use dra_plugin::driver::{Driver, DriverOptions};
use dra_plugin::metrics::Metrics;
use dra_plugin::prepare::ClaimRef;
use k8s_openapi::api::resource::v1::ResourceClaim;
use shared_state::alloc::Policy;
use shared_state::store::sled_store::SledStore;
use shared_state::store::AssignmentStore;
use shared_state::topology::synthetic;
use shared_state::CpuSet;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn claim(uid: &str) -> ResourceClaim {
    claim_on(uid, "cpudevnuma000", 4)
}

fn claim_on(uid: &str, device: &str, cpus: u32) -> ResourceClaim {
    AllocatedClaim::new("default", "bench", "node-a", device, cpus)
        .uid(uid)
        .build()
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(200);
    let base = match args.next() {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    // A 2-socket, 128-CPU machine shape, so allocation works on a real size.
    let topology = synthetic::build(&synthetic::Shape {
        sockets: 2,
        numa_per_socket: 2,
        l3_per_numa: 1,
        cores_per_l3: 16,
        threads_per_core: 2,
        sibling_numbering: synthetic::SiblingNumbering::Split,
    });
    let catalog = DeviceCatalog::new(
        &topology,
        &CpuSet::new(),
        DeviceMode::Grouped,
        GroupBy::Numanode,
    )?;
    let store: Arc<dyn AssignmentStore> = Arc::new(SledStore::open(&base.path().join("store"))?);
    let driver = Driver::open(
        DriverOptions {
            driver_name: "dra.cpu".into(),
            node_name: "node-a".into(),
            reserved: CpuSet::new(),
            policy: Policy::Packed,
            mixed_allocation_mode: false,
            min_shared_cpus: dra_plugin::config::DEFAULT_MIN_SHARED_CPUS,
        },
        catalog,
        &topology,
        store,
        CdiDir::new(base.path().join("cdi")),
        Arc::new(Metrics::new()),
    )?;
    let bare_file = base.path().join("bare.json");
    let payload = vec![b'x'; 400];
    let (mut prepares, mut unprepares, mut fsyncs) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        let uid = format!("{round:08x}-0000-4000-8000-000000000000");
        let reference = ClaimRef {
            namespace: "default".into(),
            name: "bench".into(),
            uid: uid.clone(),
        };
        let object = claim(&uid);
        let started = Instant::now();
        driver.prepare(&reference, &object)?;
        prepares.push(started.elapsed());
        let started = Instant::now();
        driver.unprepare(&reference)?;
        unprepares.push(started.elapsed());
        let started = Instant::now();
        let mut file = std::fs::File::create(&bare_file)?;
        file.write_all(&payload)?;
        file.sync_all()?;
        fsyncs.push(started.elapsed());
    }
    println!("rounds: {rounds}, directory: {}", base.path().display());
    println!("prepare   median: {:?}", median(&mut prepares));
    println!("unprepare median: {:?}", median(&mut unprepares));
    println!("bare write+fsync median: {:?}", median(&mut fsyncs));

    let burst_rounds = (rounds / 10).max(3);
    let (mut sequential, mut concurrent) = (vec![], vec![]);
    for round in 0..burst_rounds {
        let burst: Vec<(ClaimRef, ResourceClaim)> = (0..BURST)
            .map(|k| {
                let uid = format!("{:08x}-{k:04x}-4000-8000-000000000000", rounds + round);
                let reference = ClaimRef {
                    namespace: "default".into(),
                    name: format!("burst-{k}"),
                    uid: uid.clone(),
                };
                // Spread over the four NUMA groups, one CPU each.
                (
                    reference,
                    claim_on(&uid, &format!("cpudevnuma{:03}", k % 4), 1),
                )
            })
            .collect();
        let started = Instant::now();
        for (reference, object) in &burst {
            driver.prepare(reference, object)?;
        }
        sequential.push(started.elapsed());
        for (reference, _) in &burst {
            driver.unprepare(reference)?;
        }
        let gate = std::sync::Barrier::new(BURST + 1);
        let started = std::thread::scope(|scope| -> anyhow::Result<Instant> {
            let workers: Vec<_> = burst
                .iter()
                .map(|(reference, object)| {
                    let (driver, gate) = (&driver, &gate);
                    scope.spawn(move || {
                        gate.wait();
                        driver.prepare(reference, object)
                    })
                })
                .collect();
            gate.wait();
            let started = Instant::now();
            for worker in workers {
                worker
                    .join()
                    .map_err(|_| anyhow::anyhow!("a prepare thread panicked"))??;
            }
            Ok(started)
        })?;
        concurrent.push(started.elapsed());
        let held: Vec<CpuSet> = burst
            .iter()
            .filter_map(|(reference, _)| driver.prepared(&reference.uid).map(|a| a.cpus))
            .collect();
        let union = held.iter().fold(CpuSet::new(), |acc, c| acc.union(c));
        anyhow::ensure!(
            held.len() == BURST && union.len() == BURST,
            "concurrent prepares must hold {BURST} distinct CPUs, got {} claims on {union}",
            held.len()
        );
        for (reference, _) in &burst {
            driver.unprepare(reference)?;
        }
    }
    let sequential = median(&mut sequential);
    let concurrent = median(&mut concurrent);
    println!("{BURST} sequential prepares median: {sequential:?} ({burst_rounds} rounds)");
    println!("{BURST} concurrent prepares median: {concurrent:?} ({burst_rounds} rounds)");
    println!(
        "concurrent/sequential throughput: {:.1}x",
        sequential.as_secs_f64() / concurrent.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    Ok(())
}

/// Prepares in one burst, as kubelet sends them for a node full of pods.
const BURST: usize = 32;
