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

use super::hpack::{self, HpackError};
mod frames;
pub mod rewriter;
#[cfg(test)]
mod test_frames;

use rewriter::AuthorityRewriter;

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
    use super::test_frames::*;
    use super::*;

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
}
