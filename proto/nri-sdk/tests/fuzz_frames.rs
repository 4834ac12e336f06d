//! Hostile bytes on the wire, proptest-driven and bounded for CI: the NRI
//! frame decoder and ttrpc message splitter, the running multiplexer with a
//! peer that writes garbage (the messages inside are `dra-cpu-proto`'s
//! `decode_any_bytes`). Nothing panics, nothing buffers more than the protocol limit,
//! and every refusal says what it refused.
//!
//! `DRA_CPU_FUZZ_CASES` sets the cases per target (256 by default).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_nri::mux::frame::{encode_frame, FrameDecoder, MessageSplitter};
use dra_cpu_nri::mux::{
    Multiplexer, MuxError, FRAME_HEADER_LEN, MAX_FRAME_PAYLOAD, PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN, TTRPC_HEADER_LEN, TTRPC_MAX_MESSAGE,
};
use proptest::prelude::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("DRA_CPU_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        max_shrink_iters: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A trunk byte stream: valid frames, frames with hostile headers, and raw
/// garbage, in any order.
fn trunk_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        (0u32..4, proptest::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(id, p)| encode_frame(id, &p).expect("small frame")),
        (any::<u32>(), any::<u32>()).prop_map(|(id, len)| {
            let mut h = id.to_be_bytes().to_vec();
            h.extend_from_slice(&len.to_be_bytes());
            h
        }),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
}

/// Reference decoding of a trunk: the frames before the first bad header.
fn frames_of(bytes: &[u8]) -> (Vec<(u32, Vec<u8>)>, bool) {
    let mut frames = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= FRAME_HEADER_LEN {
        let id = u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return (frames, true);
        }
        if bytes.len() - at - FRAME_HEADER_LEN < len {
            break;
        }
        frames.push((id, bytes[at + 8..at + 8 + len].to_vec()));
        at += FRAME_HEADER_LEN + len;
    }
    (frames, false)
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes in any chunking: the frames of the valid prefix, then an
    /// oversized-frame refusal naming the announced length, or a wait for
    /// more bytes.
    #[test]
    fn frame_decoder_takes_any_bytes(bytes in trunk_bytes(), cuts in proptest::collection::vec(0usize..64, 0..8)) {
        let (expected, oversized) = frames_of(&bytes);
        let mut decoder = FrameDecoder::new();
        let mut got = Vec::new();
        let mut refused = None;
        let mut rest: &[u8] = &bytes;
        let mut cuts = cuts.into_iter();
        'feed: while !rest.is_empty() {
            let n = cuts.next().unwrap_or(rest.len()).clamp(1, rest.len());
            decoder.push(&rest[..n]);
            rest = &rest[n..];
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => got.push((frame.conn_id, frame.payload)),
                    Ok(None) => break,
                    Err(e) => {
                        refused = Some(e);
                        break 'feed;
                    }
                }
            }
        }
        prop_assert_eq!(&got, &expected);
        match refused {
            Some(MuxError::OversizedFrame { len, max, .. }) => {
                prop_assert!(oversized);
                prop_assert!(len > max);
            }
            Some(other) => prop_assert!(false, "unexpected refusal {}", other),
            None => {
                prop_assert!(!oversized);
                // Whatever is left is an unfinished frame, reported as such.
                if let Err(e) = decoder.finish() {
                    prop_assert!(matches!(e, MuxError::TruncatedFrame { .. }), "{}", e);
                }
            }
        }
    }

    /// ttrpc messages cut out of arbitrary bytes: whole messages only, and a
    /// header announcing more than ttrpc allows is refused before buffering.
    #[test]
    fn message_splitter_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut splitter = MessageSplitter::new();
        splitter.push(&bytes);
        let mut consumed = 0;
        loop {
            match splitter.next_message(RUNTIME_SERVICE_CONN) {
                Ok(Some(message)) => {
                    prop_assert!(message.len() >= TTRPC_HEADER_LEN);
                    prop_assert_eq!(&message[..], &bytes[consumed..consumed + message.len()]);
                    consumed += message.len();
                }
                Ok(None) => break,
                Err(MuxError::OversizedMessage { len, max, conn_id }) => {
                    prop_assert!(len > max && max == TTRPC_MAX_MESSAGE);
                    prop_assert_eq!(conn_id, RUNTIME_SERVICE_CONN);
                    break;
                }
                Err(e) => prop_assert!(false, "unexpected refusal {}", e),
            }
        }
        prop_assert!(splitter.pending() <= bytes.len() - consumed);
    }
}

/// Everything a virtual connection delivers until it closes (bounded, so a
/// connection that never closes fails the test instead of hanging it).
async fn read_to_end(mut conn: tokio::io::DuplexStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut out)).await;
    out
}

/// The running multiplexer with a runtime end that writes garbage: each
/// virtual connection receives exactly the payloads of its valid frames, and
/// the multiplexer ends (with the oversized-frame error where there was one)
/// instead of hanging or panicking.
#[test]
fn multiplexer_survives_a_peer_writing_garbage() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: config().cases.min(128),
        ..config()
    });
    runner
        .run(&trunk_bytes(), |bytes| {
            let (expected, oversized) = frames_of(&bytes);
            let want = |id: u32| -> Vec<u8> {
                expected
                    .iter()
                    .filter(|(c, _)| *c == id)
                    .flat_map(|(_, p)| p.clone())
                    .collect()
            };
            let (got1, got2, closed) = runtime.block_on(async {
                let (plugin_end, mut runtime_end) = tokio::io::duplex(1 << 16);
                let (mut mux, mut conns) =
                    Multiplexer::start(plugin_end, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN])
                        .expect("multiplexer");
                let conn2 = conns.pop().expect("conn 2");
                let conn1 = conns.pop().expect("conn 1");
                let reader1 = tokio::spawn(read_to_end(conn1));
                let reader2 = tokio::spawn(read_to_end(conn2));
                runtime_end.write_all(&bytes).await.expect("peer write");
                runtime_end.shutdown().await.expect("peer shutdown");
                // Bounded so that a hang fails instead of stalling CI.
                let closed = tokio::time::timeout(Duration::from_secs(20), mux.closed())
                    .await
                    .expect("the multiplexer ends after the peer closes");
                drop(runtime_end);
                drop(mux);
                let got1 = reader1.await.expect("reader 1");
                let got2 = reader2.await.expect("reader 2");
                (got1, got2, closed)
            });
            prop_assert_eq!(got1, want(PLUGIN_SERVICE_CONN));
            prop_assert_eq!(got2, want(RUNTIME_SERVICE_CONN));
            if oversized {
                prop_assert!(
                    matches!(closed, Err(MuxError::OversizedFrame { .. })),
                    "{:?}",
                    closed
                );
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
