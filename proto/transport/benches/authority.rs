//! Cost of the `:authority` rewrite per request, on the pure rewriter: the
//! header block of a grpc-go unary call (its first request on a connection
//! adds its fields to the dynamic table; later ones refer to them by index)
//! and a small DATA frame, as kubelet's calls look.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/h2.rs"]
mod h2;

use criterion::{criterion_group, criterion_main, Criterion};
use dra_cpu_transport::authority::rewriter::AuthorityRewriter;
use h2::{frame, PREFACE};

/// Literal with incremental indexing and a new name (strings under 127 bytes).
fn indexed_literal(name: &str, value: &str) -> Vec<u8> {
    let mut out = vec![0x40, name.len() as u8];
    out.extend_from_slice(name.as_bytes());
    out.push(value.len() as u8);
    out.extend_from_slice(value.as_bytes());
    out
}

/// The fields grpc-go sends for a unary call to kubelet's registration socket.
const FIELDS: [(&str, &str); 6] = [
    (
        ":authority",
        "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdra.cpu-reg.sock",
    ),
    (":path", "/pluginregistration.Registration/GetInfo"),
    ("content-type", "application/grpc"),
    ("user-agent", "grpc-go/1.64.0"),
    ("te", "trailers"),
    ("grpc-timeout", "999952u"),
];

fn first_request(stream: u32) -> Vec<u8> {
    // :method POST, :scheme http from the static table.
    let mut block = vec![0x83, 0x86];
    for (name, value) in FIELDS {
        block.extend(indexed_literal(name, value));
    }
    let mut out = frame(0x1, 0x4, stream, &block);
    out.extend(frame(0x0, 0x1, stream, &[0u8; 100]));
    out
}

fn repeat_request(stream: u32) -> Vec<u8> {
    // The six fields are dynamic entries 62..=67, newest first.
    let mut block = vec![0x83, 0x86];
    block.extend((62..62 + FIELDS.len() as u8).rev().map(|i| 0x80 | i));
    let mut out = frame(0x1, 0x4, stream, &block);
    out.extend(frame(0x0, 0x1, stream, &[0u8; 100]));
    out
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("authority rewrite");
    let mut first = PREFACE.to_vec();
    first.extend(first_request(1));
    group.bench_function("first request of a connection (preface, literals)", |b| {
        let mut out = Vec::with_capacity(4096);
        b.iter(|| {
            out.clear();
            let mut rewriter = AuthorityRewriter::new();
            rewriter.feed(&first, &mut out).unwrap();
            assert_eq!(rewriter.rewritten(), 1);
        })
    });
    let mut setup = PREFACE.to_vec();
    setup.extend(first_request(1));
    let repeat = repeat_request(3);
    group.bench_function("later request (indexed fields)", |b| {
        let mut rewriter = AuthorityRewriter::new();
        let mut out = Vec::with_capacity(4096);
        rewriter.feed(&setup, &mut out).unwrap();
        b.iter(|| {
            out.clear();
            rewriter.feed(&repeat, &mut out).unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
