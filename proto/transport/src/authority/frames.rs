//! HTTP/2 frame layout: the header block fragment inside a HEADERS payload,
//! and the 9-byte frame header (RFC 9113 §4.1, §6.2).

use super::{AuthorityRewriteError, FLAG_PADDED, FLAG_PRIORITY, PRIORITY_LEN};

/// The priority fields and the header block fragment of a HEADERS payload,
/// without its padding (RFC 9113 §6.2).
pub(super) fn headers_fragment(
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

pub(super) fn write_frame_header(
    out: &mut Vec<u8>,
    len: usize,
    frame_type: u8,
    flags: u8,
    stream: u32,
) {
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
