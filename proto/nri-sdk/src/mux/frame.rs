//! Frames on the trunk and ttrpc messages inside a connection's stream:
//! encoding, incremental decoding, and framing a message as the Go runtime
//! does.

use super::{
    MuxError, FRAME_HEADER_LEN, GO_READ_BUFFER, MAX_FRAME_PAYLOAD, TTRPC_HEADER_LEN,
    TTRPC_MAX_MESSAGE,
};

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub conn_id: u32,
    pub payload: Vec<u8>,
}

/// Encodes one frame. Refuses payloads the peer would refuse.
pub fn encode_frame(conn_id: u32, payload: &[u8]) -> Result<Vec<u8>, MuxError> {
    if payload.len() > MAX_FRAME_PAYLOAD {
        return Err(MuxError::OversizedFrame {
            conn_id,
            len: payload.len(),
            max: MAX_FRAME_PAYLOAD,
        });
    }
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    out.extend_from_slice(&conn_id.to_be_bytes());
    // The length fits: it is at most MAX_FRAME_PAYLOAD.
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Incremental frame decoder: feed it bytes as they arrive, take frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`; consumed bytes are dropped
    /// on the next push, so decoding stays linear in the input.
    start: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the trunk.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The next complete frame, `None` if more bytes are needed. An
    /// oversized frame is an error as soon as its header is seen, before its
    /// payload is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, MuxError> {
        let buf = self.pending();
        if buf.len() < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let conn_id = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return Err(MuxError::OversizedFrame {
                conn_id,
                len,
                max: MAX_FRAME_PAYLOAD,
            });
        }
        if buf.len() < FRAME_HEADER_LEN + len {
            return Ok(None);
        }
        let payload = buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len].to_vec();
        self.start += FRAME_HEADER_LEN + len;
        Ok(Some(Frame { conn_id, payload }))
    }

    /// Checks the state at end of stream: leftover bytes mean the peer
    /// closed mid-frame.
    pub fn finish(&self) -> Result<(), MuxError> {
        let buf = self.pending();
        if buf.is_empty() {
            return Ok(());
        }
        let want = if buf.len() < FRAME_HEADER_LEN {
            FRAME_HEADER_LEN
        } else {
            FRAME_HEADER_LEN + u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize
        };
        Err(MuxError::TruncatedFrame {
            have: buf.len(),
            want,
        })
    }
}

/// Cuts a ttrpc byte stream into whole messages (header plus body).
#[derive(Debug, Default)]
pub struct MessageSplitter {
    buf: Vec<u8>,
}

impl MessageSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole ttrpc message, `None` if more bytes are needed.
    pub fn next_message(&mut self, conn_id: u32) -> Result<Option<Vec<u8>>, MuxError> {
        if self.buf.len() < TTRPC_HEADER_LEN {
            return Ok(None);
        }
        let body =
            u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if body > TTRPC_MAX_MESSAGE {
            return Err(MuxError::OversizedMessage {
                conn_id,
                len: body,
                max: TTRPC_MAX_MESSAGE,
            });
        }
        let total = TTRPC_HEADER_LEN + body;
        if self.buf.len() < total {
            return Ok(None);
        }
        let rest = self.buf.split_off(total);
        Ok(Some(std::mem::replace(&mut self.buf, rest)))
    }

    /// Bytes of an unfinished message still held.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Frames one whole ttrpc message the way the Go runtime does (see the
/// module docs): at most [`GO_READ_BUFFER`] bytes first, the remainder in one
/// more frame.
pub fn frames_for_message(conn_id: u32, message: &[u8]) -> Result<Vec<Vec<u8>>, MuxError> {
    let split = message.len().min(GO_READ_BUFFER);
    let (first, rest) = message.split_at(split);
    let mut frames = vec![encode_frame(conn_id, first)?];
    if !rest.is_empty() {
        frames.push(encode_frame(conn_id, rest)?);
    }
    Ok(frames)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(in crate::mux) fn ttrpc_message(stream_id: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&stream_id.to_be_bytes());
        out.push(1);
        out.push(0);
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn encode_frame_writes_big_endian_header() {
        let frame = encode_frame(2, b"abc").unwrap();
        assert_eq!(frame, vec![0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn decoder_table() {
        struct Case {
            name: &'static str,
            input: Vec<u8>,
            frames: Vec<(u32, Vec<u8>)>,
            leftover_error: bool,
        }
        let two = [
            encode_frame(1, b"hello").unwrap(),
            encode_frame(2, b"").unwrap(),
        ]
        .concat();
        let cases = vec![
            Case {
                name: "empty input",
                input: vec![],
                frames: vec![],
                leftover_error: false,
            },
            Case {
                name: "header only",
                input: vec![0, 0, 0, 1],
                frames: vec![],
                leftover_error: true,
            },
            Case {
                name: "two frames, one empty",
                input: two.clone(),
                frames: vec![(1, b"hello".to_vec()), (2, vec![])],
                leftover_error: false,
            },
            Case {
                name: "second frame cut short",
                input: two[..two.len() - 1].to_vec(),
                frames: vec![(1, b"hello".to_vec())],
                leftover_error: true,
            },
        ];
        for case in cases {
            let mut decoder = FrameDecoder::new();
            decoder.push(&case.input);
            let mut got = Vec::new();
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push((frame.conn_id, frame.payload));
            }
            assert_eq!(got, case.frames, "{}", case.name);
            assert_eq!(
                decoder.finish().is_err(),
                case.leftover_error,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn decoder_handles_partial_frames_byte_by_byte() {
        let frame = encode_frame(7, b"partial frame payload").unwrap();
        let mut decoder = FrameDecoder::new();
        for (i, byte) in frame.iter().enumerate() {
            assert_eq!(
                decoder.next_frame().unwrap(),
                None,
                "frame complete too early at byte {i}"
            );
            decoder.push(&[*byte]);
        }
        let got = decoder.next_frame().unwrap().unwrap();
        assert_eq!(got.conn_id, 7);
        assert_eq!(got.payload, b"partial frame payload");
        assert!(decoder.finish().is_ok());
    }

    #[test]
    fn decoder_refuses_oversized_frame_from_header_alone() {
        let mut decoder = FrameDecoder::new();
        let len = (MAX_FRAME_PAYLOAD + 1) as u32;
        decoder.push(&1u32.to_be_bytes());
        decoder.push(&len.to_be_bytes());
        let err = decoder.next_frame().unwrap_err();
        assert_eq!(
            err,
            MuxError::OversizedFrame {
                conn_id: 1,
                len: MAX_FRAME_PAYLOAD + 1,
                max: MAX_FRAME_PAYLOAD
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("4194315") && text.contains("connection 1"),
            "{text}"
        );
    }

    #[test]
    fn decoder_accepts_frame_of_exactly_the_limit() {
        let payload = vec![0xabu8; MAX_FRAME_PAYLOAD];
        let mut decoder = FrameDecoder::new();
        decoder.push(&encode_frame(1, &payload).unwrap());
        assert_eq!(
            decoder.next_frame().unwrap().unwrap().payload.len(),
            MAX_FRAME_PAYLOAD
        );
    }

    #[test]
    fn truncated_frame_reports_progress() {
        let frame = encode_frame(1, &[1, 2, 3, 4]).unwrap();
        let mut decoder = FrameDecoder::new();
        decoder.push(&frame[..10]);
        assert_eq!(decoder.next_frame().unwrap(), None);
        assert_eq!(
            decoder.finish(),
            Err(MuxError::TruncatedFrame { have: 10, want: 12 })
        );
    }

    #[test]
    fn message_framing_follows_go_writer_shape() {
        for (body_len, expected) in [
            (0usize, vec![TTRPC_HEADER_LEN]),
            (100, vec![TTRPC_HEADER_LEN + 100]),
            (GO_READ_BUFFER - TTRPC_HEADER_LEN, vec![GO_READ_BUFFER]),
            (GO_READ_BUFFER, vec![GO_READ_BUFFER, TTRPC_HEADER_LEN]),
            (
                10_000,
                vec![GO_READ_BUFFER, 10_000 + TTRPC_HEADER_LEN - GO_READ_BUFFER],
            ),
        ] {
            let message = ttrpc_message(1, &vec![9u8; body_len]);
            let frames = frames_for_message(1, &message).unwrap();
            let lens: Vec<usize> = frames.iter().map(|f| f.len() - FRAME_HEADER_LEN).collect();
            assert_eq!(lens, expected, "body of {body_len} bytes");
            let rejoined: Vec<u8> = frames
                .iter()
                .flat_map(|f| f[FRAME_HEADER_LEN..].to_vec())
                .collect();
            assert_eq!(rejoined, message);
        }
    }

    #[test]
    fn splitter_refuses_oversized_message() {
        let mut splitter = MessageSplitter::new();
        let mut header = ((TTRPC_MAX_MESSAGE + 1) as u32).to_be_bytes().to_vec();
        header.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        splitter.push(&header);
        assert!(matches!(
            splitter.next_message(2),
            Err(MuxError::OversizedMessage { conn_id: 2, .. })
        ));
    }

    proptest! {
        #[test]
        fn frames_survive_any_chunking(
            frames in proptest::collection::vec((1u32..4, proptest::collection::vec(any::<u8>(), 0..300)), 0..20),
            cuts in proptest::collection::vec(1usize..50, 1..50),
        ) {
            let wire: Vec<u8> = frames.iter().flat_map(|(id, p)| encode_frame(*id, p).unwrap()).collect();
            let mut decoder = FrameDecoder::new();
            let mut got = Vec::new();
            let mut pos = 0;
            let mut cut = cuts.iter().cycle();
            while pos < wire.len() {
                let end = (pos + cut.next().copied().unwrap_or(1)).min(wire.len());
                decoder.push(&wire[pos..end]);
                pos = end;
                while let Some(f) = decoder.next_frame().unwrap() {
                    got.push((f.conn_id, f.payload));
                }
            }
            prop_assert!(decoder.finish().is_ok());
            prop_assert_eq!(got, frames);
        }

        #[test]
        fn messages_survive_any_chunking(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6000), 0..6),
            cut in 1usize..5000,
        ) {
            let messages: Vec<Vec<u8>> = bodies.iter().enumerate().map(|(i, b)| ttrpc_message(i as u32 * 2 + 1, b)).collect();
            let stream: Vec<u8> = messages.concat();
            let mut splitter = MessageSplitter::new();
            let mut got = Vec::new();
            for piece in stream.chunks(cut) {
                splitter.push(piece);
                while let Some(m) = splitter.next_message(1).unwrap() {
                    for frame in frames_for_message(1, &m).unwrap() {
                        prop_assert!(frame.len() - FRAME_HEADER_LEN <= MAX_FRAME_PAYLOAD);
                    }
                    got.push(m);
                }
            }
            prop_assert_eq!(splitter.pending(), 0);
            prop_assert_eq!(got, messages);
        }
    }
}
