//! Any HTTP/2 `:authority` is served.
//!
//! Kubelet dials the registration socket with grpc-go and no authority
//! option (kubernetes `pkg/kubelet/pluginmanager/operationexecutor/
//! operation_generator.go`, func `dial`), so grpc-go sends the socket path,
//! percent-encoded, as `:authority`; Python grpcio (C-core) sends a value of
//! its own for `unix:` targets. h2, under hyper and tonic, refuses any
//! authority that `http::uri::Authority` cannot parse with RST_STREAM
//! PROTOCOL_ERROR and has no option to relax that. Over a Unix socket the
//! authority names nothing, so [`AnyAuthority`] sits between the socket and
//! h2 and replaces a refused `:authority` with `localhost`.
//!
//! It follows the client-to-server byte stream: the connection preface, then
//! frames (a 9-byte header, then the payload). Every frame passes untouched
//! except header blocks (HEADERS and its CONTINUATIONs up to END_HEADERS),
//! which are HPACK-decoded with the client's dynamic table and re-encoded
//! whole as literals without indexing, so h2's decoder table stays empty and
//! can never disagree with the client's. Padding is dropped; the priority
//! fields are kept. Server-to-client bytes pass through untouched.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack::{self, HeaderField, HpackError};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;

/// The largest frame the rewrite writes: SETTINGS_MAX_FRAME_SIZE's initial
/// value, which every HTTP/2 server accepts (hyper advertises 16 KiB too,
/// and tonic leaves it unless `Server::max_frame_size` is set).
pub const MAX_OUTPUT_FRAME: usize = 16_384;

/// The client's HPACK table limit: SETTINGS_HEADER_TABLE_SIZE's initial
/// value, which h2 keeps (hyper and tonic never set `header_table_size`).
pub const CLIENT_TABLE_SIZE: usize = 4096;

/// The most header-block bytes held for one block, as received and as
/// re-encoded; hyper refuses header lists over 16 KiB anyway.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

/// What replaces an authority h2 would refuse.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why a connection's byte stream could not be rewritten; the connection is
/// ended with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityRewriteError {
    #[error("header block of stream {stream}: {source}")]
    Hpack { stream: u32, source: HpackError },
    #[error(
        "header block of stream {stream} is {len} bytes; at most {MAX_HEADER_BLOCK} are accepted"
    )]
    HeaderBlockTooLarge { stream: u32, len: usize },
    #[error("HEADERS of stream {stream}: {len}-byte payload cannot hold its padding and priority fields")]
    BadPaddingOrPriority { stream: u32, len: usize },
    #[error("header block of stream {stream} interrupted by a frame of type {frame_type:#x} on stream {other}")]
    InterruptedHeaderBlock {
        stream: u32,
        frame_type: u8,
        other: u32,
    },
}

impl From<AuthorityRewriteError> for io::Error {
    fn from(e: AuthorityRewriteError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Whether h2 accepts `value` as `:authority`: UTF-8 (h2 holds pseudo
/// headers as strings) that `http::uri::Authority` parses.
pub fn authority_is_accepted(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok() && http::uri::Authority::try_from(value).is_ok()
}

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
    first_rewritten: Option<Vec<u8>>,
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

/// The priority fields and the header block fragment of a HEADERS payload,
/// without its padding (RFC 9113 §6.2).
fn headers_fragment(
    stream: u32,
    flags: u8,
    payload: &[u8],
) -> Result<(Option<[u8; PRIORITY_LEN]>, &[u8]), AuthorityRewriteError> {
    let bad = || AuthorityRewriteError::BadPaddingOrPriority {
        stream,
        len: payload.len(),
    };
    let mut rest = payload;
    let mut padding = 0;
    if flags & FLAG_PADDED != 0 {
        let (&pad, after) = rest.split_first().ok_or_else(bad)?;
        padding = usize::from(pad);
        rest = after;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let (fields, after) = rest.split_first_chunk::<PRIORITY_LEN>().ok_or_else(bad)?;
        priority = Some(*fields);
        rest = after;
    }
    let fragment_len = rest.len().checked_sub(padding).ok_or_else(bad)?;
    Ok((priority, &rest[..fragment_len]))
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

fn write_frame_header(out: &mut Vec<u8>, len: usize, frame_type: u8, flags: u8, stream: u32) {
    // `len` is at most MAX_OUTPUT_FRAME, so it fits the 24-bit length.
    out.extend_from_slice(&[
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        frame_type,
        flags,
    ]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// A server-side connection whose client may send any `:authority`: reads go
/// through an [`AuthorityRewriter`], writes pass untouched.
#[derive(Debug)]
pub struct AnyAuthority<IO> {
    inner: IO,
    rewriter: AuthorityRewriter,
    /// Rewritten bytes not yet handed to the reader, from `pending_at`.
    pending: Vec<u8>,
    pending_at: usize,
    /// Bytes read from `inner` that need the rewrite, reused between reads.
    scratch: Vec<u8>,
    /// The rewrite failed: every later read returns this error.
    failed: Option<AuthorityRewriteError>,
    logged: u64,
}

impl<IO> AnyAuthority<IO> {
    pub fn new(inner: IO) -> AnyAuthority<IO> {
        AnyAuthority {
            inner,
            rewriter: AuthorityRewriter::new(),
            pending: Vec::new(),
            pending_at: 0,
            scratch: Vec::new(),
            failed: None,
            logged: 0,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.inner
    }

    /// How many `:authority` values were replaced on this connection.
    pub fn rewritten(&self) -> u64 {
        self.rewriter.rewritten()
    }

    fn log_rewrites(&mut self) {
        if self.logged == 0 && self.rewriter.rewritten() > 0 {
            if let Some(first) = &self.rewriter.first_rewritten {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(first),
                    "client sent an :authority h2 refuses; serving it as localhost"
                );
            }
        }
        self.logged = self.rewriter.rewritten();
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AnyAuthority<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.pending_at < this.pending.len() {
                let n = buf.remaining().min(this.pending.len() - this.pending_at);
                buf.put_slice(&this.pending[this.pending_at..this.pending_at + n]);
                this.pending_at += n;
                if this.pending_at == this.pending.len() {
                    this.pending.clear();
                    this.pending_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &this.failed {
                return Poll::Ready(Err(e.clone().into()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let read = buf.filled().len() - before;
            // End of stream, or bytes that reach h2 as they came.
            if read == 0 || this.rewriter.pass_untouched(read) {
                return Poll::Ready(Ok(()));
            }
            this.scratch.clear();
            this.scratch.extend_from_slice(&buf.filled()[before..]);
            buf.set_filled(before);
            if let Err(e) = this.rewriter.feed(&this.scratch, &mut this.pending) {
                tracing::warn!(error = %e, "ending a connection whose header block cannot be read");
                this.failed = Some(e);
            }
            this.log_rewrites();
            // Loops to hand out what the rewrite produced, or to read more
            // when it held everything back (an unfinished header block): a
            // read that fills nothing would mean end of stream.
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AnyAuthority<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AnyAuthority<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::hpack::tests::huffman_string;
    use proptest::prelude::*;

    const SOCKET_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdra.cpu-reg.sock";

    fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame_header(&mut out, payload.len(), frame_type, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    fn raw_string(text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        hpack::tests::encode_integer_for_tests(&mut out, 0, 7, text.len());
        out.extend_from_slice(text);
        out
    }

    /// Literal with incremental indexing, new name.
    fn indexed_literal(name: &str, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40];
        out.extend(raw_string(name.as_bytes()));
        out.extend(raw_string(value));
        out
    }

    /// Literal without indexing, new name.
    fn plain_literal(name: &str, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x00];
        out.extend(raw_string(name.as_bytes()));
        out.extend(raw_string(value));
        out
    }

    /// `:method POST`, `:scheme http`, `:path /x` from the static table.
    fn request_start() -> Vec<u8> {
        let mut out = vec![0x83, 0x86];
        out.extend(plain_literal(
            ":path",
            b"/pluginregistration.Registration/GetInfo",
        ));
        out
    }

    fn settings() -> Vec<u8> {
        frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])
    }

    fn data(stream: u32, payload: &[u8]) -> Vec<u8> {
        frame(0x0, FLAG_END_STREAM, stream, payload)
    }

    fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        for f in frames {
            out.extend_from_slice(f);
        }
        out
    }

    fn rewrite(input: &[u8]) -> Result<Vec<u8>, AuthorityRewriteError> {
        let mut out = Vec::new();
        AuthorityRewriter::new().feed(input, &mut out)?;
        Ok(out)
    }

    /// One frame of the rewritten stream: header fields, type, flags and
    /// stream, with the decoded header list of a completed block.
    #[derive(Debug, PartialEq)]
    struct Seen {
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload_len: usize,
        headers: Vec<(String, String)>,
    }

    /// Parses the rewritten stream as h2 would, decoding header blocks with a
    /// fresh decoder whose table must stay empty.
    fn parse_output(out: &[u8]) -> Vec<Seen> {
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

    fn authority_of(seen: &Seen) -> Option<&str> {
        seen.headers
            .iter()
            .find(|(n, _)| n == ":authority")
            .map(|(_, v)| v.as_str())
    }

    fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
        frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block)
    }

    fn block_with_authority(authority: Vec<u8>) -> Vec<u8> {
        let mut block = request_start();
        block.extend(authority);
        block.extend(plain_literal("content-type", b"application/grpc"));
        block
    }

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
    fn accepted_authorities_table() {
        for (value, accepted) in [
            (&b"localhost"[..], true),
            (b"dra.cpu:50051", true),
            (b"[::1]:80", true),
            (b"", false),
            (SOCKET_AUTHORITY.as_bytes(), false),
            (b"/var/run/x.sock", false),
            (b"a b", false),
        ] {
            assert_eq!(
                authority_is_accepted(value),
                accepted,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    /// A connection exercising every path: preface, settings, a Huffman
    /// block with indexing, CONTINUATION, padding and priority, DATA.
    fn busy_connection() -> Vec<u8> {
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
    fn rewrite_in_pieces(input: &[u8], cuts: &[usize]) -> Result<Vec<u8>, AuthorityRewriteError> {
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

    /// Reads `input` through [`AnyAuthority`] with a pipe of `pipe` bytes
    /// and reads of `chunk` bytes: partial reads, held-back header blocks
    /// and rewritten output larger than the reader's buffer.
    async fn read_through_adapter(
        input: Vec<u8>,
        pipe: usize,
        chunk: usize,
    ) -> io::Result<Vec<u8>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(pipe);
        let writer = tokio::spawn(async move {
            for piece in input.chunks(13) {
                client.write_all(piece).await?;
            }
            client.shutdown().await
        });
        let mut reader = AnyAuthority::new(server);
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        writer.await.map_err(io::Error::other)??;
        Ok(out)
    }

    #[tokio::test]
    async fn the_adapter_reads_what_the_rewriter_writes_for_any_buffer_sizes() {
        let input = busy_connection();
        let want = rewrite(&input).unwrap();
        for (pipe, chunk) in [(1, 1), (8, 7), (64, 3), (4096, 4096), (5, 1000)] {
            let got = read_through_adapter(input.clone(), pipe, chunk)
                .await
                .unwrap();
            assert_eq!(got, want, "pipe {pipe}, reads of {chunk}");
        }
    }

    #[tokio::test]
    async fn the_adapter_ends_a_malformed_connection_with_invalid_data() {
        let input = connection(&[settings(), headers_frame(1, &[0x80 | 70])]);
        let err = read_through_adapter(input, 64, 64).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("index 70"), "{err}");
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
