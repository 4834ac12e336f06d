//! HTTP/2 as a client writes it, built by hand (RFC 9113 §3.4, §4.1): the
//! `h2` client cannot send what these tests need to send.

/// The connection preface every HTTP/2 client sends first.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame: the 9-byte header, then `payload`.
pub fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        frame_type,
        flags,
    ];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}
