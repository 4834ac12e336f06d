//! The rewriter: follows the client's byte stream frame by frame and
//! re-encodes every header block with an accepted `:authority`.

use super::frames::{headers_fragment, write_frame_header};
use super::hpack::{self, HeaderField};
use super::*;

/// Where the rewriter is in the client's byte stream.
#[derive(Debug)]
enum State {
    /// Inside the connection preface, `matched` bytes of it seen.
    Preface { matched: usize },
    /// Not HTTP/2 with prior knowledge: everything passes (h2 refuses it).
    Transparent,
    /// Reading a frame header.
    FrameHeader {
        header: [u8; FRAME_HEADER_LEN],
        filled: usize,
    },
    /// Inside the payload of a frame that passes untouched.
    Passthrough { remaining: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    HeaderPayload {
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
        remaining: usize,
    },
}

/// A header block waiting for its CONTINUATION frames.
#[derive(Debug)]
struct OpenBlock {
    stream: u32,
    /// END_STREAM of its HEADERS frame.
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragments: Vec<u8>,
}

/// The pure rewrite of a client-to-server HTTP/2 byte stream; fed in pieces
/// split anywhere, it writes the same output.
#[derive(Debug)]
pub struct AuthorityRewriter {
    state: State,
    open: Option<OpenBlock>,
    decoder: hpack::Decoder,
    /// Authorities replaced so far on this connection.
    rewritten: u64,
    /// The first value replaced, for the log.
    pub(super) first_rewritten: Option<Vec<u8>>,
}

impl Default for AuthorityRewriter {
    fn default() -> Self {
        AuthorityRewriter::new()
    }
}

impl AuthorityRewriter {
    pub fn new() -> AuthorityRewriter {
        AuthorityRewriter {
            state: State::Preface { matched: 0 },
            open: None,
            decoder: hpack::Decoder::new(CLIENT_TABLE_SIZE),
            rewritten: 0,
            first_rewritten: None,
        }
    }

    /// How many `:authority` values were replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// If the next `len` bytes pass through untouched whatever they are (the
    /// middle of a DATA frame, say), accounts for them and returns true; the
    /// caller then need not copy them.
    pub fn pass_untouched(&mut self, len: usize) -> bool {
        match &mut self.state {
            State::Transparent => true,
            State::Passthrough { remaining } if *remaining >= len => {
                *remaining -= len;
                if *remaining == 0 {
                    self.state = State::frame_header();
                }
                true
            }
            _ => false,
        }
    }

    /// Rewrites `input`, the next bytes from the client, appending what h2
    /// should read to `out`. Bytes of an unfinished header block are held
    /// until the block is complete.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityRewriteError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Transparent => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Preface { matched } => {
                    let want = &PREFACE[*matched..];
                    let n = want.len().min(input.len());
                    if input[..n] != want[..n] {
                        self.state = State::Transparent;
                        continue;
                    }
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *matched += n;
                    if *matched == PREFACE.len() {
                        self.state = State::frame_header();
                    }
                }
                State::FrameHeader { header, filled } => {
                    let n = (FRAME_HEADER_LEN - *filled).min(input.len());
                    header[*filled..*filled + n].copy_from_slice(&input[..n]);
                    *filled += n;
                    input = &input[n..];
                    if *filled == FRAME_HEADER_LEN {
                        let header = *header;
                        self.start_frame(header, out)?;
                    }
                }
                State::Passthrough { remaining } => {
                    let n = (*remaining).min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *remaining -= n;
                    if *remaining == 0 {
                        self.state = State::frame_header();
                    }
                }
                State::HeaderPayload {
                    payload, remaining, ..
                } => {
                    let n = (*remaining).min(input.len());
                    payload.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *remaining -= n;
                    if *remaining == 0 {
                        self.finish_header_frame(out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Acts on a complete frame header.
    fn start_frame(
        &mut self,
        header: [u8; FRAME_HEADER_LEN],
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityRewriteError> {
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (frame_type, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let header_frame = match &self.open {
            Some(open) if frame_type != TYPE_CONTINUATION || stream != open.stream => {
                return Err(AuthorityRewriteError::InterruptedHeaderBlock {
                    stream: open.stream,
                    frame_type,
                    other: stream,
                })
            }
            Some(_) => true,
            // A CONTINUATION with no open block passes: h2 refuses it.
            None => frame_type == TYPE_HEADERS,
        };
        if !header_frame {
            out.extend_from_slice(&header);
            self.state = if len == 0 {
                State::frame_header()
            } else {
                State::Passthrough { remaining: len }
            };
            return Ok(());
        }
        let held = self.open.as_ref().map_or(0, |o| o.fragments.len());
        if held + len > MAX_HEADER_BLOCK {
            return Err(AuthorityRewriteError::HeaderBlockTooLarge {
                stream,
                len: held + len,
            });
        }
        self.state = State::HeaderPayload {
            frame_type,
            flags,
            stream,
            payload: Vec::with_capacity(len),
            remaining: len,
        };
        if len == 0 {
            self.finish_header_frame(out)?;
        }
        Ok(())
    }

    /// Acts on a complete HEADERS or CONTINUATION payload: opens or extends
    /// the block, and on END_HEADERS rewrites it.
    fn finish_header_frame(&mut self, out: &mut Vec<u8>) -> Result<(), AuthorityRewriteError> {
        let State::HeaderPayload {
            frame_type,
            flags,
            stream,
            payload,
            ..
        } = std::mem::replace(&mut self.state, State::frame_header())
        else {
            return Ok(());
        };
        if frame_type == TYPE_HEADERS {
            let (priority, fragment) = headers_fragment(stream, flags, &payload)?;
            self.open = Some(OpenBlock {
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragments: fragment.to_vec(),
            });
        } else if let Some(open) = self.open.as_mut() {
            open.fragments.extend_from_slice(&payload);
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.open.take() else {
            return Ok(());
        };
        self.rewrite_block(block, out)
    }

    fn rewrite_block(
        &mut self,
        block: OpenBlock,
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityRewriteError> {
        let mut encoded = Vec::with_capacity(block.fragments.len() * 2);
        let (rewritten, first_rewritten) = (&mut self.rewritten, &mut self.first_rewritten);
        self.decoder
            .decode(&block.fragments, |mut field: HeaderField| {
                if field.name == b":authority" && !authority_is_accepted(&field.value) {
                    *rewritten += 1;
                    let refused =
                        std::mem::replace(&mut field.value, REPLACEMENT_AUTHORITY.to_vec());
                    first_rewritten.get_or_insert(refused);
                }
                hpack::encode_literal(&mut encoded, &field);
            })
            .map_err(|source| AuthorityRewriteError::Hpack {
                stream: block.stream,
                source,
            })?;
        if encoded.len() > MAX_HEADER_BLOCK {
            return Err(AuthorityRewriteError::HeaderBlockTooLarge {
                stream: block.stream,
                len: encoded.len(),
            });
        }
        write_header_frames(&block, &encoded, out);
        Ok(())
    }
}

impl State {
    fn frame_header() -> State {
        State::FrameHeader {
            header: [0; FRAME_HEADER_LEN],
            filled: 0,
        }
    }
}

/// Writes `encoded` as a HEADERS frame (with the block's END_STREAM and
/// priority) and as many CONTINUATION frames as [`MAX_OUTPUT_FRAME`] needs.
fn write_header_frames(block: &OpenBlock, encoded: &[u8], out: &mut Vec<u8>) {
    let priority: &[u8] = block.priority.as_ref().map_or(&[], |p| p.as_slice());
    let first_room = MAX_OUTPUT_FRAME - priority.len();
    let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    write_frame_header(
        out,
        priority.len() + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_OUTPUT_FRAME));
        rest = after;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_frames::*;
    use super::*;
    use crate::hpack::tests::huffman_string;
    use proptest::prelude::*;

    #[test]
    fn authority_table() {
        let cases: &[(&str, Vec<u8>, &str)] = &[
            (
                "valid host kept",
                plain_literal(":authority", b"example.com:8080"),
                "example.com:8080",
            ),
            (
                "localhost kept",
                plain_literal(":authority", b"localhost"),
                "localhost",
            ),
            (
                "percent-encoded socket path",
                plain_literal(":authority", SOCKET_AUTHORITY.as_bytes()),
                "localhost",
            ),
            (
                "raw path",
                plain_literal(":authority", b"/var/lib/kubelet/plugins/dra.cpu/dra.sock"),
                "localhost",
            ),
            ("empty", plain_literal(":authority", b""), "localhost"),
            (
                "not UTF-8",
                plain_literal(":authority", b"\xff\xfe"),
                "localhost",
            ),
            (
                "indexed name (static 1), bad value",
                {
                    let mut b = vec![0x01];
                    b.extend(raw_string(SOCKET_AUTHORITY.as_bytes()));
                    b
                },
                "localhost",
            ),
            (
                "Huffman-coded bad value",
                {
                    let mut b = vec![0x01];
                    b.extend(huffman_string(SOCKET_AUTHORITY.as_bytes()));
                    b
                },
                "localhost",
            ),
            (
                "Huffman-coded valid value",
                {
                    let mut b = vec![0x01];
                    b.extend(huffman_string(b"dra.cpu.example:443"));
                    b
                },
                "dra.cpu.example:443",
            ),
            (
                "never indexed bad value",
                {
                    let mut b = vec![0x11];
                    b.extend(raw_string(b"/x"));
                    b
                },
                "localhost",
            ),
        ];
        for (what, authority, want) in cases {
            let input = connection(&[
                settings(),
                headers_frame(1, &block_with_authority(authority.clone())),
                data(1, b"\0\0\0\0\0"),
            ]);
            let seen = parse_output(&rewrite(&input).unwrap());
            assert_eq!(seen.len(), 3, "{what}: {seen:?}");
            assert_eq!(authority_of(&seen[1]), Some(*want), "{what}");
            let names: Vec<&str> = seen[1].headers.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [":method", ":scheme", ":path", ":authority", "content-type"],
                "{what}"
            );
        }
    }

    #[test]
    fn frames_other_than_header_blocks_pass_byte_for_byte() {
        let frames = [
            settings(),
            frame(0x8, 0, 0, &[0, 0, 0x10, 0]), // WINDOW_UPDATE
            frame(0x6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]), // PING
            data(1, b"payload"),
            frame(0x3, 0, 1, &[0, 0, 0, 8]),      // RST_STREAM
            frame(0x0, 0x8, 3, &[2, b'x', 0, 0]), // padded DATA
        ];
        let input = connection(&frames);
        assert_eq!(rewrite(&input).unwrap(), input);
    }

    #[test]
    fn dynamic_table_references_across_requests_are_followed() {
        // Request 1 indexes its authority and content type; request 2 refers
        // to both by index (62 = newest, content-type; 63 = authority).
        let mut first = request_start();
        first.extend(indexed_literal(":authority", SOCKET_AUTHORITY.as_bytes()));
        first.extend(indexed_literal("content-type", b"application/grpc"));
        let mut second = request_start();
        second.extend([0x80 | 63, 0x80 | 62]);
        // Request 3: a size update to 0 empties the table; index 62 is gone.
        let third = vec![0x20, 0x83, 0x80 | 62];
        let input = connection(&[headers_frame(1, &first), headers_frame(3, &second)]);
        let seen = parse_output(&rewrite(&input).unwrap());
        for s in &seen {
            assert_eq!(authority_of(s), Some("localhost"), "{s:?}");
            assert!(
                s.headers
                    .contains(&("content-type".into(), "application/grpc".into())),
                "{s:?}"
            );
        }
        let input = connection(&[
            headers_frame(1, &first),
            headers_frame(3, &second),
            headers_frame(5, &third),
        ]);
        assert!(matches!(
            rewrite(&input),
            Err(AuthorityRewriteError::Hpack {
                stream: 5,
                source: HpackError::BadIndex {
                    index: 62,
                    entries: 0
                }
            })
        ));
    }

    #[test]
    fn continuation_frames_are_joined_into_one_header_block() {
        let block = block_with_authority(plain_literal(":authority", SOCKET_AUTHORITY.as_bytes()));
        let (a, rest) = block.split_at(3);
        let (b, c) = rest.split_at(rest.len() / 2);
        let input = connection(&[
            frame(TYPE_HEADERS, 0, 1, a),
            frame(TYPE_CONTINUATION, 0, 1, b),
            frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, c),
            data(1, b"x"),
        ]);
        let seen = parse_output(&rewrite(&input).unwrap());
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(
            (seen[0].frame_type, seen[0].flags),
            (TYPE_HEADERS, FLAG_END_HEADERS)
        );
        assert_eq!(authority_of(&seen[0]), Some("localhost"));
    }

    #[test]
    fn padding_is_dropped_and_priority_and_end_stream_kept() {
        let block = block_with_authority(plain_literal(":authority", b"/sock"));
        let priority = [0x80, 0, 0, 3, 200];
        let mut payload = vec![4];
        payload.extend(priority);
        payload.extend(&block);
        payload.extend([0; 4]);
        let flags = FLAG_PADDED | FLAG_PRIORITY | FLAG_END_HEADERS | FLAG_END_STREAM;
        let input = connection(&[frame(TYPE_HEADERS, flags, 7, &payload)]);
        let out = rewrite(&input).unwrap();
        let seen = parse_output(&out);
        assert_eq!(
            seen[0].flags,
            FLAG_PRIORITY | FLAG_END_HEADERS | FLAG_END_STREAM
        );
        assert_eq!(seen[0].stream, 7);
        let body = &out[PREFACE.len() + FRAME_HEADER_LEN..];
        assert_eq!(&body[..PRIORITY_LEN], &priority, "priority fields kept");
        assert_eq!(authority_of(&seen[0]), Some("localhost"));
    }

    #[test]
    fn a_block_larger_than_a_frame_is_split_into_continuations() {
        let mut block = block_with_authority(plain_literal(":authority", b"/sock"));
        // Huffman-coded input grows when written raw: 3 × 12000 bytes of
        // values, from 22.5 KB of input, need three frames.
        for name in ["x-a", "x-b", "x-c"] {
            block.push(0x00);
            block.extend(raw_string(name.as_bytes()));
            block.extend(huffman_string(&[b'a'; 12000]));
        }
        let input = connection(&[frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &block,
        )]);
        let seen = parse_output(&rewrite(&input).unwrap());
        let kinds: Vec<(u8, u8)> = seen.iter().map(|s| (s.frame_type, s.flags)).collect();
        assert_eq!(
            kinds,
            [
                (TYPE_HEADERS, FLAG_END_STREAM),
                (TYPE_CONTINUATION, 0),
                (TYPE_CONTINUATION, FLAG_END_HEADERS),
            ]
        );
        assert_eq!(seen[0].payload_len, MAX_OUTPUT_FRAME);
        let last = seen.last().unwrap();
        assert_eq!(authority_of(last), Some("localhost"));
        assert_eq!(last.headers.len(), 8);
    }

    #[test]
    fn refusals_table() {
        let bad_hpack = headers_frame(1, &[0x80 | 70]);
        let cases: Vec<(&str, Vec<u8>, AuthorityRewriteError)> = vec![
            (
                "bad HPACK index",
                connection(&[bad_hpack]),
                AuthorityRewriteError::Hpack {
                    stream: 1,
                    source: HpackError::BadIndex {
                        index: 70,
                        entries: 0,
                    },
                },
            ),
            (
                "block interrupted by DATA",
                connection(&[frame(TYPE_HEADERS, 0, 1, &request_start()), data(1, b"x")]),
                AuthorityRewriteError::InterruptedHeaderBlock {
                    stream: 1,
                    frame_type: 0,
                    other: 1,
                },
            ),
            (
                "CONTINUATION of another stream",
                connection(&[
                    frame(TYPE_HEADERS, 0, 1, &request_start()),
                    frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[]),
                ]),
                AuthorityRewriteError::InterruptedHeaderBlock {
                    stream: 1,
                    frame_type: TYPE_CONTINUATION,
                    other: 3,
                },
            ),
            (
                "padding longer than the payload",
                connection(&[frame(
                    TYPE_HEADERS,
                    FLAG_PADDED | FLAG_END_HEADERS,
                    1,
                    &[9, 0x82],
                )]),
                AuthorityRewriteError::BadPaddingOrPriority { stream: 1, len: 2 },
            ),
            (
                "priority cut short",
                connection(&[frame(
                    TYPE_HEADERS,
                    FLAG_PRIORITY | FLAG_END_HEADERS,
                    1,
                    &[0, 0],
                )]),
                AuthorityRewriteError::BadPaddingOrPriority { stream: 1, len: 2 },
            ),
            (
                "oversized block",
                {
                    let mut header = Vec::new();
                    write_frame_header(
                        &mut header,
                        MAX_HEADER_BLOCK + 1,
                        TYPE_HEADERS,
                        FLAG_END_HEADERS,
                        1,
                    );
                    connection(&[header])
                },
                AuthorityRewriteError::HeaderBlockTooLarge {
                    stream: 1,
                    len: MAX_HEADER_BLOCK + 1,
                },
            ),
        ];
        for (what, input, want) in cases {
            assert_eq!(rewrite(&input), Err(want), "{what}");
        }
    }

    #[test]
    fn a_stream_without_the_preface_passes_untouched() {
        let input = b"GET / HTTP/1.1\r\nHost: /sock\r\n\r\n".to_vec();
        assert_eq!(rewrite(&input).unwrap(), input);
    }

    #[test]
    fn the_busy_connection_rewrites_both_requests() {
        let seen = parse_output(&rewrite(&busy_connection()).unwrap());
        let authorities: Vec<Option<&str>> = seen
            .iter()
            .filter(|s| !s.headers.is_empty())
            .map(authority_of)
            .collect();
        assert_eq!(authorities, [Some("localhost"), Some("localhost")]);
    }

    proptest! {
        #[test]
        fn any_split_of_the_stream_gives_the_same_output(cuts in proptest::collection::vec(any::<usize>(), 0..40)) {
            let input = busy_connection();
            prop_assert_eq!(rewrite_in_pieces(&input, &cuts), rewrite(&input));
        }

        #[test]
        fn arbitrary_bytes_after_the_preface_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..400),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let mut input = PREFACE.to_vec();
            input.extend(body);
            let whole = rewrite(&input);
            let pieces = rewrite_in_pieces(&input, &cuts);
            prop_assert_eq!(whole.is_ok(), pieces.is_ok());
        }

        #[test]
        fn arbitrary_header_blocks_never_panic(
            blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 1..5),
            flags in proptest::collection::vec(any::<u8>(), 5),
        ) {
            let frames: Vec<Vec<u8>> = blocks
                .iter()
                .zip(flags.iter().cycle())
                .enumerate()
                .map(|(i, (b, f))| frame(if i % 2 == 0 { TYPE_HEADERS } else { TYPE_CONTINUATION }, *f, 1, b))
                .collect();
            let _ = rewrite(&connection(&frames));
        }
    }
}
