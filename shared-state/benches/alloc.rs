//! Allocation cost on a 1024-CPU machine (2 sockets × 2 NUMA × 4 L3 × 32
//! cores × 2 threads, split sibling numbering). dra-plugin runs one
//! allocation per claim at prepare time, inside kubelet's prepare timeout.
//!
//! Occupancy is built deterministically the way a node fills up: claims of
//! 1, 2, 3, 4, 8 and 16 CPUs, packed, one of each size per NUMA node in turn, until
//! the target share of CPUs is taken. That leaves partly used cores and L3
//! groups in every NUMA node, which is the hard case for the allocator.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use shared_state::alloc::{Allocator, Policy};
use shared_state::topology::synthetic::{build, MACHINE_1024};
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::hint::black_box;

fn machine() -> Topology {
    build(&MACHINE_1024)
}

fn numa_nodes(topology: &Topology) -> Vec<CpuSet> {
    let mut nodes: Vec<CpuSet> = Vec::new();
    for cpu in &topology.cpus {
        let n = cpu.numa as usize;
        if nodes.len() <= n {
            nodes.resize(n + 1, CpuSet::new());
        }
        nodes[n].insert(cpu.id);
    }
    nodes
}

/// Free CPUs after taking `percent` % of the machine with mixed-size claims.
fn occupied(allocator: &Allocator, topology: &Topology, percent: usize) -> CpuSet {
    let all: CpuSet = topology.cpus.iter().map(|c| c.id).collect();
    let target = all.len() * percent / 100;
    let nodes = numa_nodes(topology);
    let sizes = [1usize, 2, 3, 4, 8, 16];
    let mut free = all.clone();
    let mut taken = 0;
    let mut i = 0;
    while taken < target {
        let size = sizes[i % sizes.len()].min(target - taken);
        // Each NUMA node gets one claim of every size in turn, so they fill evenly.
        let node = &nodes[(i / sizes.len()) % nodes.len()];
        let got = allocator
            .allocate_in(&free, node, size, Policy::Packed)
            .or_else(|_| allocator.allocate(&free, size, Policy::Packed))
            .expect("the machine has room for the occupancy target");
        free = free.difference(&got);
        taken += got.len();
        i += 1;
    }
    free
}

fn bench_alloc(c: &mut Criterion) {
    let topology = machine();
    let allocator = Allocator::new(&topology);
    let numa0 = numa_nodes(&topology).swap_remove(0);
    let mut group = c.benchmark_group("allocate");
    for percent in [0usize, 50, 90] {
        let free = occupied(&allocator, &topology, percent);
        for count in [1usize, 8, 64, 512] {
            if count <= free.len() {
                let id = BenchmarkId::new(format!("machine/{percent}%"), count);
                group.bench_with_input(id, &count, |b, &count| {
                    b.iter(|| allocator.allocate(black_box(&free), count, Policy::Packed))
                });
            }
            // Grouped mode: the pick inside one NUMA node.
            if count <= free.intersection(&numa0).len() {
                let id = BenchmarkId::new(format!("numa0/{percent}%"), count);
                group.bench_with_input(id, &count, |b, &count| {
                    b.iter(|| {
                        allocator.allocate_in(black_box(&free), &numa0, count, Policy::Packed)
                    })
                });
            }
        }
        let count = 8;
        for policy in [
            Policy::FullPcpusOnly,
            Policy::DistributeAcrossNuma,
            Policy::DistributeAcrossCores,
        ] {
            if allocator.allocate(&free, count, policy).is_ok() {
                let id = BenchmarkId::new(format!("{policy}/{percent}%"), count);
                group.bench_with_input(id, &count, |b, &count| {
                    b.iter(|| allocator.allocate(black_box(&free), count, policy))
                });
            }
        }
    }
    group.finish();
    c.bench_function("allocator_new_1024", |b| {
        b.iter(|| Allocator::new(black_box(&topology)))
    });
}

criterion_group!(benches, bench_alloc);
criterion_main!(benches);
