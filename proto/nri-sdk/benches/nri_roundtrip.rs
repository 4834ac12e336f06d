//! Cost of the NRI path a container creation takes: frame decoding, and a
//! full CreateContainer round trip (ttrpc over the multiplexer, plugin
//! service with deadline and panic guard) against an in-process runtime.
//! NRI allows 2 s per request; this shows how little of it the client uses.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The benchmark drives the client through the runtime's Plugin client alone.
#[allow(dead_code)]
#[path = "../tests/support/nri_runtime.rs"]
mod nri_runtime;

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dra_cpu_nri::client::NriClientOptions;
use dra_cpu_nri::mux::frame::{encode_frame, FrameDecoder};
use dra_cpu_nri::plugin::ContainerCreation;
use dra_cpu_proto::nri::api::{self, Container, ContainerUpdate, PodSandbox};
use nri_runtime::CreateOnly;

/// Pins the container and updates ten others, as a busy node would.
fn pin_and_update_ten() -> ContainerCreation {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = "0-3".into();
    let mut resources = api::LinuxResources::new();
    resources.cpu = Some(cpu).into();
    let mut linux = api::LinuxContainerAdjustment::new();
    linux.resources = Some(resources.clone()).into();
    let mut adjust = api::ContainerAdjustment::new();
    adjust.linux = Some(linux).into();
    let update = (0..10)
        .map(|i| {
            let mut linux = api::LinuxContainerUpdate::new();
            linux.resources = Some(resources.clone()).into();
            let mut u = ContainerUpdate::new();
            u.container_id = format!("{i:064}");
            u.linux = Some(linux).into();
            u
        })
        .collect();
    ContainerCreation {
        adjust: Some(adjust),
        update,
        evict: Vec::new(),
    }
}

fn create_request() -> api::CreateContainerRequest {
    let mut container = Container::new();
    container.id = "f".repeat(64);
    container.name = "workload".into();
    container.env = (0..20).map(|i| format!("VAR_{i}=value")).collect();
    container
        .annotations
        .insert("io.kubernetes.cri.container-name".into(), "workload".into());
    let mut pod = PodSandbox::new();
    pod.id = "e".repeat(64);
    pod.uid = "0e0e0e0e-0000-4000-8000-000000000001".into();
    let mut req = api::CreateContainerRequest::new();
    req.pod = Some(pod).into();
    req.container = Some(container).into();
    req
}

fn bench(c: &mut Criterion) {
    let frames: Vec<u8> = (0..256u32)
        .flat_map(|i| encode_frame(1 + i % 2, &[0u8; 512]).expect("frame"))
        .collect();
    let mut group = c.benchmark_group("nri_mux");
    group.throughput(Throughput::Bytes(frames.len() as u64));
    group.bench_function("decode_256_frames_of_512_bytes", |b| {
        b.iter(|| {
            let mut decoder = FrameDecoder::new();
            decoder.push(&frames);
            let mut n = 0;
            while let Ok(Some(_)) = decoder.next_frame() {
                n += 1;
            }
            n
        })
    });
    group.finish();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (runtime, _client) = rt.block_on(nri_runtime::connect(
        Arc::new(CreateOnly(pin_and_update_ten)),
        &NriClientOptions::new("bench", "10"),
    ));
    let req = create_request();
    c.bench_function("nri_create_container_round_trip", |b| {
        b.iter(|| {
            rt.block_on(async {
                let ctx = ttrpc::context::with_duration(Duration::from_secs(2));
                runtime
                    .plugin
                    .create_container(ctx, &req)
                    .await
                    .expect("CreateContainer")
            })
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
