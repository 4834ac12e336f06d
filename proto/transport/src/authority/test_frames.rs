//! HTTP/2 frames and header blocks built by hand, and the rewritten stream
//! parsed back, for the unit tests of the rewriter and its adapter.

use super::frames::write_frame_header;
use super::hpack;
use super::*;
use crate::hpack::tests::huffman_string;

pub(super) const SOCKET_AUTHORITY: &str =
    "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdra.cpu-reg.sock";

pub(super) fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(&mut out, payload.len(), frame_type, flags, stream);
    out.extend_from_slice(payload);
    out
}

pub(super) fn raw_string(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    hpack::tests::encode_integer_for_tests(&mut out, 0, 7, text.len());
    out.extend_from_slice(text);
    out
}

/// Literal with incremental indexing, new name.
pub(super) fn indexed_literal(name: &str, value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x40];
    out.extend(raw_string(name.as_bytes()));
    out.extend(raw_string(value));
    out
}

/// Literal without indexing, new name.
pub(super) fn plain_literal(name: &str, value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x00];
    out.extend(raw_string(name.as_bytes()));
    out.extend(raw_string(value));
    out
}

/// `:method POST`, `:scheme http`, `:path /x` from the static table.
pub(super) fn request_start() -> Vec<u8> {
    let mut out = vec![0x83, 0x86];
    out.extend(plain_literal(
        ":path",
        b"/pluginregistration.Registration/GetInfo",
    ));
    out
}

pub(super) fn settings() -> Vec<u8> {
    frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])
}

pub(super) fn data(stream: u32, payload: &[u8]) -> Vec<u8> {
    frame(0x0, FLAG_END_STREAM, stream, payload)
}

pub(super) fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    for f in frames {
        out.extend_from_slice(f);
    }
    out
}

pub(super) fn rewrite(input: &[u8]) -> Result<Vec<u8>, AuthorityRewriteError> {
    let mut out = Vec::new();
    AuthorityRewriter::new().feed(input, &mut out)?;
    Ok(out)
}

/// One frame of the rewritten stream: header fields, type, flags and
/// stream, with the decoded header list of a completed block.
#[derive(Debug, PartialEq)]
pub(super) struct Seen {
    pub(super) frame_type: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
    pub(super) payload_len: usize,
    pub(super) headers: Vec<(String, String)>,
}

/// Parses the rewritten stream as h2 would, decoding header blocks with a
/// fresh decoder whose table must stay empty.
pub(super) fn parse_output(out: &[u8]) -> Vec<Seen> {
    assert!(out.starts_with(PREFACE), "preface kept");
    let mut rest = &out[PREFACE.len()..];
    let mut decoder = hpack::Decoder::new(4096);
    let mut seen = Vec::new();
    let mut block = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let (frame_type, flags) = (rest[3], rest[4]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        assert!(len <= MAX_OUTPUT_FRAME, "frame of {len} bytes");
        let payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
        rest = &rest[FRAME_HEADER_LEN + len..];
        let mut headers = Vec::new();
        if frame_type == TYPE_HEADERS || frame_type == TYPE_CONTINUATION {
            assert_eq!(flags & FLAG_PADDED, 0, "padding dropped");
            let skip = if flags & FLAG_PRIORITY != 0 {
                PRIORITY_LEN
            } else {
                0
            };
            block.extend_from_slice(&payload[skip..]);
            if flags & FLAG_END_HEADERS != 0 {
                decoder
                    .decode(&block, |f| {
                        headers.push((
                            String::from_utf8_lossy(&f.name).into_owned(),
                            String::from_utf8_lossy(&f.value).into_owned(),
                        ))
                    })
                    .expect("the rewritten block decodes");
                assert_eq!(decoder.entries(), 0, "the rewritten block indexes nothing");
                block.clear();
            }
        }
        seen.push(Seen {
            frame_type,
            flags,
            stream,
            payload_len: len,
            headers,
        });
    }
    seen
}

pub(super) fn authority_of(seen: &Seen) -> Option<&str> {
    seen.headers
        .iter()
        .find(|(n, _)| n == ":authority")
        .map(|(_, v)| v.as_str())
}

pub(super) fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
    frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block)
}

pub(super) fn block_with_authority(authority: Vec<u8>) -> Vec<u8> {
    let mut block = request_start();
    block.extend(authority);
    block.extend(plain_literal("content-type", b"application/grpc"));
    block
}

/// A connection exercising every path: preface, settings, a Huffman
/// block with indexing, CONTINUATION, padding and priority, DATA.
pub(super) fn busy_connection() -> Vec<u8> {
    let mut first = request_start();
    first.push(0x41);
    first.extend(huffman_string(SOCKET_AUTHORITY.as_bytes()));
    first.extend(indexed_literal("content-type", b"application/grpc"));
    let mut second = request_start();
    second.extend([0x80 | 63, 0x80 | 62]);
    let (a, b) = second.split_at(4);
    let mut padded = vec![2];
    padded.extend(&first);
    padded.extend([0, 0]);
    connection(&[
        settings(),
        frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &padded),
        data(1, &[0, 0, 0, 0, 3, 1, 2, 3]),
        frame(
            TYPE_HEADERS,
            FLAG_PRIORITY,
            3,
            &[[0, 0, 0, 1, 16].as_slice(), a].concat(),
        ),
        frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, b),
        data(3, &[0; 200]),
    ])
}

/// Feeds `input` cut at `cuts`, the fast path taken where it applies, as
/// the IO adapter does.
pub(super) fn rewrite_in_pieces(
    input: &[u8],
    cuts: &[usize],
) -> Result<Vec<u8>, AuthorityRewriteError> {
    let mut rewriter = AuthorityRewriter::new();
    let mut out = Vec::new();
    let mut at = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.push(input.len());
    points.sort_unstable();
    for end in points {
        let piece = &input[at..end];
        at = end;
        if piece.is_empty() {
            continue;
        }
        if rewriter.pass_untouched(piece.len()) {
            out.extend_from_slice(piece);
        } else {
            rewriter.feed(piece, &mut out)?;
        }
    }
    Ok(out)
}
