//! Prints the medians of a prepare and an unprepare on this machine, each
//! with its real store commit (sled flush + fdatasync) and, for prepare, its
//! CDI spec write (fsync of file and directory), next to the cost of one
//! bare write+fsync of a small file in the same run and directory.
//!
//! `cargo run --release -p dra-plugin --example prepare_latency [ROUNDS] [DIR]`
//! DIR defaults to a temporary directory; pass one on the disk of interest.

use dra_plugin::cdi::CdiDir;
use dra_plugin::config::{DeviceMode, GroupBy};
use dra_plugin::driver::{Driver, DriverOptions};
use dra_plugin::metrics::Metrics;
use dra_plugin::prepare::{ClaimRef, DeviceCatalog};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use shared_state::alloc::Policy;
use shared_state::store::{AssignmentStore, SledStore};
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
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("bench".into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: None,
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "cpus".into(),
                        driver: "dra.cpu".into(),
                        pool: "node-a".into(),
                        device: "cpudevnuma000".into(),
                        consumed_capacity: Some(
                            [("dra.cpu/cpu".to_string(), Quantity("4".into()))].into(),
                        ),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: "pod".into(),
                uid: "feedbeef-0000-4000-8000-000000000000".into(),
            }]),
            ..Default::default()
        }),
    }
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
    Ok(())
}
