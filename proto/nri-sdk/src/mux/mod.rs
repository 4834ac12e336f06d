//! The NRI connection multiplexer.
//!
//! NRI runs two ttrpc connections over one Unix socket. Every chunk on the
//! socket is a frame: `u32` big-endian connection id, `u32` big-endian payload
//! length, payload. Connection 1 carries the `Plugin` service (the plugin is
//! the server), connection 2 the `Runtime` service (the plugin is the client).
//!
//! Framing rules, and why:
//! - Incoming payloads are concatenated per connection into a byte stream;
//!   frame boundaries carry no meaning for ttrpc.
//! - A frame longer than [`MAX_FRAME_PAYLOAD`] is refused and the trunk is
//!   closed: the runtime never sends one, so it means a corrupt or hostile peer.
//! - Outgoing bytes are cut at ttrpc message boundaries: the first frame of a
//!   message holds at most [`GO_READ_BUFFER`] bytes, the rest of the message
//!   goes in a second frame. This is exactly how the Go runtime frames its own
//!   writes, and the only shape its reader (a 4 KiB `bufio.Reader` over a
//!   frame-at-a-time connection that fails on frames larger than the read
//!   buffer) accepts for every message size.
//! - Frames for connection ids nobody opened are dropped, as the runtime does.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

pub mod frame;

use frame::{frames_for_message, FrameDecoder, MessageSplitter};

/// Connection id of the `Plugin` service (plugin serves, runtime calls).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Connection id of the `Runtime` service (runtime serves, plugin calls).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Length of a frame header: connection id and payload length.
pub const FRAME_HEADER_LEN: usize = 8;
/// Length of a ttrpc message header: length, stream id, type, flags.
pub const TTRPC_HEADER_LEN: usize = 10;
/// Largest ttrpc message body either side accepts (4 MiB).
pub const TTRPC_MAX_MESSAGE: usize = 4 << 20;
/// Largest frame payload accepted, as in the runtime: one whole ttrpc message.
pub const MAX_FRAME_PAYLOAD: usize = TTRPC_HEADER_LEN + TTRPC_MAX_MESSAGE;
/// Read buffer of the Go runtime's ttrpc channel; see the module docs.
pub const GO_READ_BUFFER: usize = 4096;
/// Bytes buffered per virtual connection in each direction.
const VIRTUAL_CONN_BUFFER: usize = 256 * 1024;
/// Read size on the trunk.
const TRUNK_READ_CHUNK: usize = 64 * 1024;

/// Why the multiplexer stopped or refused data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// The peer announced a frame larger than the protocol allows.
    #[error(
        "frame for connection {conn_id} announces {len} bytes, more than the {max} bytes allowed"
    )]
    OversizedFrame {
        conn_id: u32,
        len: usize,
        max: usize,
    },
    /// The peer closed the trunk in the middle of a frame.
    #[error("peer closed the connection mid-frame: {have} of {want} bytes of the frame received")]
    TruncatedFrame { have: usize, want: usize },
    /// A local ttrpc message is larger than the protocol allows.
    #[error("ttrpc message on connection {conn_id} of {len} bytes exceeds the {max} byte limit")]
    OversizedMessage {
        conn_id: u32,
        len: usize,
        max: usize,
    },
    /// Reading from or writing to the trunk failed.
    #[error("{op} on the NRI socket failed: {message}")]
    Io { op: &'static str, message: String },
    /// The local end of a virtual connection went away (its ttrpc client or
    /// server stopped), so the plugin can no longer serve the runtime.
    #[error("local end of connection {0} closed")]
    LocalClosed(u32),
    /// The multiplexer was asked to open the same connection twice, or id 0.
    #[error("connection id {0} is reserved or already open")]
    InvalidConnId(u32),
}

/// A running multiplexer over one trunk connection.
///
/// Dropping it stops the pump tasks and thereby closes every virtual
/// connection.
pub struct Multiplexer {
    tasks: JoinSet<()>,
    closed: watch::Receiver<Option<Result<(), MuxError>>>,
}

impl Multiplexer {
    /// Starts pumping `trunk` and returns one virtual connection per id in
    /// `conn_ids`, in the same order.
    pub fn start<T>(trunk: T, conn_ids: &[u32]) -> Result<(Self, Vec<DuplexStream>), MuxError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let mut seen = std::collections::HashSet::new();
        for &id in conn_ids {
            if id == 0 || !seen.insert(id) {
                return Err(MuxError::InvalidConnId(id));
            }
        }

        let (trunk_read, trunk_write) = tokio::io::split(trunk);
        let (closed_tx, closed_rx) = watch::channel(None);
        let closed_tx = Arc::new(closed_tx);
        let (frame_tx, frame_rx) = mpsc::channel::<Vec<u8>>(64);
        let mut tasks = JoinSet::new();
        let mut user_ends = Vec::with_capacity(conn_ids.len());
        let mut inbound: HashMap<u32, WriteHalf<DuplexStream>> = HashMap::new();

        for &id in conn_ids {
            let (user_end, pump_end) = tokio::io::duplex(VIRTUAL_CONN_BUFFER);
            let (pump_read, pump_write) = tokio::io::split(pump_end);
            inbound.insert(id, pump_write);
            user_ends.push(user_end);
            tasks.spawn(outbound_pump(
                id,
                pump_read,
                frame_tx.clone(),
                closed_tx.clone(),
            ));
        }
        drop(frame_tx);

        tasks.spawn(trunk_writer(trunk_write, frame_rx, closed_tx.clone()));
        tasks.spawn(trunk_reader(trunk_read, inbound, closed_tx));

        Ok((
            Self {
                tasks,
                closed: closed_rx,
            },
            user_ends,
        ))
    }

    /// Waits until the trunk is gone and returns why: `Ok` for an orderly
    /// close by the peer, the error otherwise.
    pub async fn closed(&mut self) -> Result<(), MuxError> {
        loop {
            if let Some(result) = self.closed.borrow_and_update().clone() {
                return result;
            }
            if self.closed.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// A handle that resolves when the trunk is gone, for use elsewhere.
    pub fn closed_watch(&self) -> watch::Receiver<Option<Result<(), MuxError>>> {
        self.closed.clone()
    }

    /// Stops all pumps now.
    pub fn shutdown(&mut self) {
        self.tasks.abort_all();
    }
}

impl Drop for Multiplexer {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

fn report(closed: &watch::Sender<Option<Result<(), MuxError>>>, result: Result<(), MuxError>) {
    closed.send_if_modified(|state| {
        if state.is_none() {
            *state = Some(result);
            true
        } else {
            false
        }
    });
}

async fn trunk_reader<R>(
    mut trunk: R,
    mut inbound: HashMap<u32, WriteHalf<DuplexStream>>,
    closed: Arc<watch::Sender<Option<Result<(), MuxError>>>>,
) where
    R: AsyncRead + Unpin,
{
    let mut decoder = FrameDecoder::new();
    let mut chunk = vec![0u8; TRUNK_READ_CHUNK];
    let result = loop {
        let n = match trunk.read(&mut chunk).await {
            Ok(0) => break decoder.finish(),
            Ok(n) => n,
            Err(err) => {
                break Err(MuxError::Io {
                    op: "read",
                    message: err.to_string(),
                })
            }
        };
        decoder.push(&chunk[..n]);
        let delivered = loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let Some(conn) = inbound.get_mut(&frame.conn_id) else {
                        tracing::debug!(
                            conn_id = frame.conn_id,
                            "dropping frame for unopened NRI connection"
                        );
                        continue;
                    };
                    if conn.write_all(&frame.payload).await.is_err() {
                        // The local side of this connection is gone; its
                        // traffic is dropped like that of an unopened one.
                        inbound.remove(&frame.conn_id);
                    }
                }
                Ok(None) => break Ok(()),
                Err(err) => break Err(err),
            }
        };
        if let Err(err) = delivered {
            break Err(err);
        }
    };
    if let Err(err) = &result {
        tracing::warn!(error = %err, "NRI connection multiplexer stopped");
    }
    // Report first: closing the inputs below makes the local ttrpc ends
    // close too, and their pumps must not be taken as the cause.
    report(&closed, result);
    // Dropping the write halves ends every virtual connection's input.
    for (_, mut conn) in inbound.drain() {
        let _ = conn.shutdown().await;
    }
}

async fn trunk_writer<W>(
    mut trunk: W,
    mut frames: mpsc::Receiver<Vec<u8>>,
    closed: Arc<watch::Sender<Option<Result<(), MuxError>>>>,
) where
    W: AsyncWrite + Unpin,
{
    while let Some(frame) = frames.recv().await {
        if let Err(err) = write_frame(&mut trunk, &frame).await {
            report(
                &closed,
                Err(MuxError::Io {
                    op: "write",
                    message: err.to_string(),
                }),
            );
            return;
        }
    }
}

async fn write_frame<W: AsyncWrite + Unpin>(trunk: &mut W, frame: &[u8]) -> io::Result<()> {
    trunk.write_all(frame).await?;
    trunk.flush().await
}

async fn outbound_pump<R>(
    conn_id: u32,
    mut conn: R,
    frames: mpsc::Sender<Vec<u8>>,
    closed: Arc<watch::Sender<Option<Result<(), MuxError>>>>,
) where
    R: AsyncRead + Unpin,
{
    let mut splitter = MessageSplitter::new();
    let mut chunk = vec![0u8; TRUNK_READ_CHUNK];
    loop {
        let n = match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                // Half a plugin is no plugin: report it so the owner tears
                // the trunk down and reconnects.
                report(&closed, Err(MuxError::LocalClosed(conn_id)));
                return;
            }
            Ok(n) => n,
        };
        splitter.push(&chunk[..n]);
        loop {
            match splitter.next_message(conn_id) {
                Ok(Some(message)) => {
                    let encoded = match frames_for_message(conn_id, &message) {
                        Ok(encoded) => encoded,
                        Err(err) => {
                            report(&closed, Err(err));
                            return;
                        }
                    };
                    for frame in encoded {
                        if frames.send(frame).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    // A message we cannot frame would desynchronise the
                    // stream; stop rather than send garbage.
                    tracing::error!(error = %err, "refusing to send oversized NRI message");
                    report(&closed, Err(err));
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::frame::encode_frame;
    use super::frame::tests::ttrpc_message;
    use super::*;

    #[tokio::test]
    async fn interleaved_connections_are_demultiplexed_in_order() {
        let (local, mut peer) = tokio::io::duplex(1 << 20);
        let (_mux, mut conns) = Multiplexer::start(local, &[1, 2]).unwrap();
        let mut wire = Vec::new();
        for i in 0..10u8 {
            wire.extend(encode_frame(1 + u32::from(i % 2), &[i; 3]).unwrap());
        }
        // A frame for a connection nobody opened is dropped.
        wire.extend(encode_frame(9, b"nobody").unwrap());
        peer.write_all(&wire).await.unwrap();
        let mut one = vec![0u8; 15];
        let mut two = vec![0u8; 15];
        conns[0].read_exact(&mut one).await.unwrap();
        conns[1].read_exact(&mut two).await.unwrap();
        assert_eq!(one, [[0u8; 3], [2; 3], [4; 3], [6; 3], [8; 3]].concat());
        assert_eq!(two, [[1u8; 3], [3; 3], [5; 3], [7; 3], [9; 3]].concat());
    }

    #[tokio::test]
    async fn outgoing_messages_are_framed_per_connection() {
        let (local, mut peer) = tokio::io::duplex(1 << 20);
        let (_mux, mut conns) = Multiplexer::start(local, &[1, 2]).unwrap();
        let big = ttrpc_message(3, &vec![5u8; 5000]);
        let small = ttrpc_message(1, b"hi");
        conns[1].write_all(&big).await.unwrap();
        conns[0].write_all(&small).await.unwrap();
        let mut decoder = FrameDecoder::new();
        let mut per_conn: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
        let mut buf = vec![0u8; 8192];
        while per_conn.values().map(Vec::len).sum::<usize>() < 3 {
            let n = peer.read(&mut buf).await.unwrap();
            assert!(n > 0, "multiplexer closed early");
            decoder.push(&buf[..n]);
            while let Some(f) = decoder.next_frame().unwrap() {
                per_conn.entry(f.conn_id).or_default().push(f.payload);
            }
        }
        assert_eq!(per_conn[&1], vec![small]);
        assert_eq!(per_conn[&2].len(), 2);
        assert_eq!(per_conn[&2][0].len(), GO_READ_BUFFER);
        assert_eq!(per_conn[&2].concat(), big);
    }

    #[tokio::test]
    async fn peer_closing_mid_frame_closes_everything_with_an_error() {
        let (local, mut peer) = tokio::io::duplex(1 << 20);
        let (mut mux, mut conns) = Multiplexer::start(local, &[1, 2]).unwrap();
        let frame = encode_frame(1, b"0123456789").unwrap();
        peer.write_all(&frame[..12]).await.unwrap();
        drop(peer);
        assert_eq!(
            mux.closed().await,
            Err(MuxError::TruncatedFrame { have: 12, want: 18 })
        );
        let mut rest = Vec::new();
        assert_eq!(
            conns[0].read_to_end(&mut rest).await.unwrap(),
            0,
            "no partial payload delivered"
        );
    }

    #[tokio::test]
    async fn oversized_frame_closes_the_trunk() {
        let (local, mut peer) = tokio::io::duplex(1 << 20);
        let (mut mux, mut conns) = Multiplexer::start(local, &[1, 2]).unwrap();
        let mut header = 2u32.to_be_bytes().to_vec();
        header.extend_from_slice(&(64u32 << 20).to_be_bytes());
        peer.write_all(&header).await.unwrap();
        let err = mux.closed().await.unwrap_err();
        assert!(matches!(err, MuxError::OversizedFrame { conn_id: 2, len, .. } if len == 64 << 20));
        let mut rest = Vec::new();
        assert_eq!(conns[1].read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn local_end_closing_is_reported() {
        let (local, _peer) = tokio::io::duplex(1024);
        let (mut mux, mut conns) = Multiplexer::start(local, &[1, 2]).unwrap();
        drop(conns.pop());
        assert_eq!(mux.closed().await, Err(MuxError::LocalClosed(2)));
    }

    #[tokio::test]
    async fn orderly_close_is_not_an_error() {
        let (local, peer) = tokio::io::duplex(1024);
        let (mut mux, _conns) = Multiplexer::start(local, &[1]).unwrap();
        drop(peer);
        assert_eq!(mux.closed().await, Ok(()));
    }

    #[test]
    fn reserved_and_duplicate_ids_are_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, _b) = tokio::io::duplex(16);
            assert!(matches!(
                Multiplexer::start(a, &[0]),
                Err(MuxError::InvalidConnId(0))
            ));
            let (a, _b) = tokio::io::duplex(16);
            assert!(matches!(
                Multiplexer::start(a, &[1, 1]),
                Err(MuxError::InvalidConnId(1))
            ));
        });
    }
}
