//! HPACK (RFC 7541) for the authority rewrite: a decoder that follows a
//! client's dynamic table across the header blocks of one connection, and an
//! encoder that writes only literals without indexing, so the server's own
//! decoder never adds an entry to its table.
//!
//! Every input is the peer's: decoding returns an error for anything
//! malformed and never panics.

use std::collections::VecDeque;
use std::sync::OnceLock;

/// Per-entry overhead of the dynamic table (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Integers larger than this are refused: every length, index and table size
/// a header block can legitimately carry is far smaller.
const MAX_INTEGER: u64 = u32::MAX as u64;

/// The static table (RFC 7541 Appendix A), 1-based in the protocol.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The Huffman code (RFC 7541 Appendix B): `(code, bit length)` of each
/// symbol 0..=255, then EOS (256).
const HUFFMAN_CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// The EOS symbol, which must never appear decoded (RFC 7541 §5.2).
const EOS: u16 = 256;
const LONGEST_CODE: usize = 30;

/// Why a header block could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("the header block ends inside an integer")]
    TruncatedInteger,
    #[error("an integer in the header block exceeds {MAX_INTEGER}")]
    IntegerTooLarge,
    #[error("a string of {len} bytes runs past the end of the header block ({left} bytes left)")]
    TruncatedString { len: usize, left: usize },
    #[error("invalid Huffman-coded string: {0}")]
    Huffman(&'static str),
    #[error(
        "index {index} is in neither the static table nor the dynamic table of {entries} entries"
    )]
    BadIndex { index: usize, entries: usize },
    #[error("dynamic table size update to {size} bytes exceeds the {limit} bytes allowed")]
    TableSizeTooLarge { size: usize, limit: usize },
    #[error("dynamic table size update after the first header field of a block")]
    LateSizeUpdate,
}

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// Sent as "never indexed" (RFC 7541 §6.2.3): kept so on re-encoding.
    pub never_indexed: bool,
}

/// Decodes the header blocks of one direction of one connection, keeping the
/// dynamic table the peer's encoder keeps.
#[derive(Debug)]
pub struct Decoder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// Sum of the entries' sizes (name + value + 32 each).
    size: usize,
    /// The table's current maximum, set by size updates.
    max_size: usize,
    /// The most a size update may set: the SETTINGS_HEADER_TABLE_SIZE the
    /// decoding side advertised (4096 when it advertised none).
    limit: usize,
}

impl Decoder {
    /// A decoder whose table starts, as the protocol's, at `limit` bytes.
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// Decodes one complete header block (HEADERS and its CONTINUATIONs,
    /// concatenated), calling `field` for each header field in order and
    /// updating the dynamic table as the encoder did.
    pub fn decode(
        &mut self,
        mut block: &[u8],
        mut field: impl FnMut(HeaderField),
    ) -> Result<(), HpackError> {
        let mut fields_seen = false;
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                // Indexed field (§6.1).
                let (index, rest) = decode_integer(block, 7)?;
                block = rest;
                let (name, value) = self.entry(index)?;
                field(HeaderField {
                    name: name.to_vec(),
                    value: value.to_vec(),
                    never_indexed: false,
                });
                fields_seen = true;
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only before any field.
                if fields_seen {
                    return Err(HpackError::LateSizeUpdate);
                }
                let (size, rest) = decode_integer(block, 5)?;
                block = rest;
                if size > self.limit {
                    return Err(HpackError::TableSizeTooLarge {
                        size,
                        limit: self.limit,
                    });
                }
                self.max_size = size;
                self.evict_to(size);
            } else {
                // Literal (§6.2): with incremental indexing (01), never
                // indexed (0001) or without indexing (0000).
                let (prefix, indexing, never_indexed) = match first {
                    b if b & 0xc0 == 0x40 => (6, true, false),
                    b if b & 0xf0 == 0x10 => (4, false, true),
                    _ => (4, false, false),
                };
                let (index, rest) = decode_integer(block, prefix)?;
                block = rest;
                let name = if index == 0 {
                    let (name, rest) = decode_string(block)?;
                    block = rest;
                    name
                } else {
                    self.entry(index)?.0.to_vec()
                };
                let (value, rest) = decode_string(block)?;
                block = rest;
                if indexing {
                    self.insert(name.clone(), value.clone());
                }
                field(HeaderField {
                    name,
                    value,
                    never_indexed,
                });
                fields_seen = true;
            }
        }
        Ok(())
    }

    /// Entry `index` of the combined address space (§2.3.3).
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        let bad = || HpackError::BadIndex {
            index,
            entries: self.table.len(),
        };
        match index {
            0 => Err(bad()),
            i if i <= STATIC_TABLE.len() => Ok(STATIC_TABLE[i - 1]),
            i => self
                .table
                .get(i - STATIC_TABLE.len() - 1)
                .map(|(n, v)| (n.as_slice(), v.as_slice()))
                .ok_or_else(bad),
        }
    }

    /// Adds an entry, evicting the oldest ones to make room (§4.4); an entry
    /// larger than the whole table empties it and is not added.
    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max_size {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.table.push_front((name, value));
    }

    fn evict_to(&mut self, room: usize) {
        while self.size > room {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + ENTRY_OVERHEAD,
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }

    /// Entries in the dynamic table (for tests).
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.table.len()
    }
}

/// An integer with an `prefix`-bit prefix (§5.1) and the bytes after it.
fn decode_integer(block: &[u8], prefix: u8) -> Result<(usize, &[u8]), HpackError> {
    let (&first, mut rest) = block.split_first().ok_or(HpackError::TruncatedInteger)?;
    let max_prefix = (1u16 << prefix) - 1;
    let mut value = u64::from(u16::from(first) & max_prefix);
    if value < u64::from(max_prefix) {
        return Ok((value as usize, rest));
    }
    let mut shift = 0u32;
    loop {
        let (&byte, after) = rest.split_first().ok_or(HpackError::TruncatedInteger)?;
        rest = after;
        value += u64::from(byte & 0x7f) << shift;
        if value > MAX_INTEGER {
            return Err(HpackError::IntegerTooLarge);
        }
        if byte & 0x80 == 0 {
            return Ok((value as usize, rest));
        }
        shift += 7;
        if shift > 28 {
            return Err(HpackError::IntegerTooLarge);
        }
    }
}

/// A string literal (§5.2), Huffman-decoded if so flagged, and the bytes
/// after it.
fn decode_string(block: &[u8]) -> Result<(Vec<u8>, &[u8]), HpackError> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let (len, rest) = decode_integer(block, 7)?;
    if len > rest.len() {
        return Err(HpackError::TruncatedString {
            len,
            left: rest.len(),
        });
    }
    let (raw, rest) = rest.split_at(len);
    let text = if huffman {
        huffman_decode(raw)?
    } else {
        raw.to_vec()
    };
    Ok((text, rest))
}

/// The Huffman code arranged for decoding: for each bit length, the codes of
/// that length in ascending order with their symbols.
struct HuffmanDecodeTable {
    by_length: [Vec<(u32, u16)>; LONGEST_CODE + 1],
}

fn huffman_table() -> &'static HuffmanDecodeTable {
    static TABLE: OnceLock<HuffmanDecodeTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut by_length: [Vec<(u32, u16)>; LONGEST_CODE + 1] = Default::default();
        for (symbol, &(code, len)) in (0u16..).zip(HUFFMAN_CODES.iter()) {
            if let Some(codes) = by_length.get_mut(usize::from(len)) {
                codes.push((code, symbol));
            }
        }
        for codes in &mut by_length {
            codes.sort_unstable();
        }
        HuffmanDecodeTable { by_length }
    })
}

/// Decodes a Huffman-coded string. The code is canonical: codes of one
/// length are consecutive, so the symbol of a code is found by its offset
/// from the first code of its length (and checked, so a table that were not
/// canonical could only fail to decode, never decode wrongly).
fn huffman_decode(raw: &[u8]) -> Result<Vec<u8>, HpackError> {
    let table = huffman_table();
    let mut out = Vec::with_capacity(raw.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for byte in raw {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            let codes = table.by_length.get(len).map(Vec::as_slice).unwrap_or(&[]);
            if let Some(&(first, _)) = codes.first() {
                if let Some(&(found, symbol)) = code
                    .checked_sub(first)
                    .and_then(|offset| codes.get(offset as usize))
                {
                    if found == code {
                        if symbol == EOS {
                            return Err(HpackError::Huffman("EOS symbol inside the string"));
                        }
                        out.push(symbol as u8);
                        code = 0;
                        len = 0;
                        continue;
                    }
                }
            }
            if len >= LONGEST_CODE {
                return Err(HpackError::Huffman("no symbol has this code"));
            }
        }
    }
    // Padding: at most 7 bits, all ones (the most significant bits of EOS).
    if len > 7 {
        return Err(HpackError::Huffman("padding longer than 7 bits"));
    }
    if code != (1u32 << len) - 1 {
        return Err(HpackError::Huffman("padding is not the prefix of EOS"));
    }
    Ok(out)
}

/// Appends `value` as an integer with a `prefix`-bit prefix, the prefix's
/// high bits set to `flags` (§5.1).
fn encode_integer(out: &mut Vec<u8>, flags: u8, prefix: u8, value: usize) {
    let max_prefix = (1usize << prefix) - 1;
    if value < max_prefix {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max_prefix as u8);
    let mut rest = value - max_prefix;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

fn encode_raw_string(out: &mut Vec<u8>, text: &[u8]) {
    encode_integer(out, 0, 7, text.len());
    out.extend_from_slice(text);
}

/// Appends `field` as a literal with a literal name, without indexing (or
/// never indexed, as it came), strings not Huffman-coded (§6.2.2, §6.2.3):
/// a representation that leaves the receiver's dynamic table untouched.
pub fn encode_literal(out: &mut Vec<u8>, field: &HeaderField) {
    out.push(if field.never_indexed { 0x10 } else { 0x00 });
    encode_raw_string(out, &field.name);
    encode_raw_string(out, &field.value);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Huffman-codes `text` (for building test input).
    pub(crate) fn huffman_encode(text: &[u8]) -> Vec<u8> {
        let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0u32);
        for &b in text {
            let (code, len) = HUFFMAN_CODES[usize::from(b)];
            acc = (acc << len) | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            let pad = 8 - bits;
            out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
        }
        out
    }

    pub(crate) fn encode_integer_for_tests(out: &mut Vec<u8>, flags: u8, prefix: u8, value: usize) {
        encode_integer(out, flags, prefix, value)
    }

    /// A Huffman-coded string literal.
    pub(crate) fn huffman_string(text: &[u8]) -> Vec<u8> {
        let coded = huffman_encode(text);
        let mut out = Vec::new();
        encode_integer(&mut out, 0x80, 7, coded.len());
        out.extend_from_slice(&coded);
        out
    }

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn decode_all(
        decoder: &mut Decoder,
        block: &[u8],
    ) -> Result<Vec<(String, String)>, HpackError> {
        let mut fields = Vec::new();
        decoder.decode(block, |f| {
            fields.push((
                String::from_utf8_lossy(&f.name).into_owned(),
                String::from_utf8_lossy(&f.value).into_owned(),
            ))
        })?;
        Ok(fields)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn huffman_code_is_canonical_and_every_symbol_round_trips() {
        let table = huffman_table();
        for codes in &table.by_length {
            for pair in codes.windows(2) {
                assert_eq!(
                    pair[0].0 + 1,
                    pair[1].0,
                    "codes of one length not consecutive"
                );
            }
        }
        let every_byte: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&every_byte)), Ok(every_byte));
    }

    /// RFC 7541 Appendix C.3 and C.4: three requests on one connection,
    /// without and with Huffman coding; the later ones refer to entries the
    /// earlier ones added to the dynamic table.
    #[test]
    fn rfc7541_request_examples_decode_with_the_dynamic_table() {
        let want = [
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ]),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ]),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ]),
        ];
        let plain = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let huffman = [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ];
        for blocks in [plain, huffman] {
            let mut decoder = Decoder::new(4096);
            for (block, want) in blocks.iter().zip(&want) {
                assert_eq!(decode_all(&mut decoder, &hex(block)).as_ref(), Ok(want));
            }
            assert_eq!(decoder.entries(), 3);
        }
    }

    #[test]
    fn refusals_table() {
        let cases: &[(&str, &[u8], HpackError)] = &[
            (
                "index 0",
                &[0x80],
                HpackError::BadIndex {
                    index: 0,
                    entries: 0,
                },
            ),
            (
                "index past the tables",
                &[0xbe],
                HpackError::BadIndex {
                    index: 62,
                    entries: 0,
                },
            ),
            ("integer cut short", &[0xff], HpackError::TruncatedInteger),
            (
                "integer too large",
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0x0f],
                HpackError::IntegerTooLarge,
            ),
            (
                "string past the end",
                &[0x00, 0x05, b'a'],
                HpackError::TruncatedString { len: 5, left: 1 },
            ),
            (
                "size update above the limit",
                &[0x3f, 0xe2, 0x1f],
                HpackError::TableSizeTooLarge {
                    size: 4097,
                    limit: 4096,
                },
            ),
            (
                "size update after a field",
                &[0x82, 0x20],
                HpackError::LateSizeUpdate,
            ),
            (
                "Huffman padding of zeros",
                &[0x00, 0x01, b'a', 0x81, 0x00],
                HpackError::Huffman("padding is not the prefix of EOS"),
            ),
            (
                "Huffman EOS",
                &[0x00, 0x01, b'a', 0x84, 0xff, 0xff, 0xff, 0xff],
                HpackError::Huffman("EOS symbol inside the string"),
            ),
        ];
        for (what, block, want) in cases {
            let got = decode_all(&mut Decoder::new(4096), block);
            assert_eq!(got.as_ref(), Err(want), "{what}");
        }
    }

    #[test]
    fn size_updates_evict_and_a_zero_table_forgets_everything() {
        let mut decoder = Decoder::new(4096);
        // Literal with indexing, new name "a" value "b": 34 bytes.
        decode_all(&mut decoder, &[0x40, 0x01, b'a', 0x01, b'b']).unwrap();
        assert_eq!(decoder.entries(), 1);
        decode_all(&mut decoder, &[0x20]).unwrap();
        assert_eq!(decoder.entries(), 0);
        assert!(decode_all(&mut decoder, &[0xbe]).is_err());
        // Back to 34 bytes: one entry fits, the next evicts it.
        decode_all(&mut decoder, &[0x3f, 0x03, 0x40, 0x01, b'a', 0x01, b'b']).unwrap();
        decode_all(&mut decoder, &[0x40, 0x01, b'c', 0x01, b'd']).unwrap();
        assert_eq!(decoder.entries(), 1);
        assert_eq!(
            decode_all(&mut decoder, &[0xbe]).unwrap(),
            pairs(&[("c", "d")])
        );
    }

    #[test]
    fn literals_round_trip_through_the_encoder_and_leave_the_table_empty() {
        let fields = [
            HeaderField {
                name: b":authority".to_vec(),
                value: b"localhost".to_vec(),
                never_indexed: false,
            },
            HeaderField {
                name: b"x-long".to_vec(),
                value: vec![b'v'; 300],
                never_indexed: false,
            },
            HeaderField {
                name: b"authorization".to_vec(),
                value: b"secret".to_vec(),
                never_indexed: true,
            },
        ];
        let mut block = Vec::new();
        for f in &fields {
            encode_literal(&mut block, f);
        }
        let mut decoder = Decoder::new(4096);
        let mut got = Vec::new();
        decoder.decode(&block, |f| got.push(f)).unwrap();
        assert_eq!(got, fields);
        assert_eq!(decoder.entries(), 0);
    }

    proptest! {
        #[test]
        fn arbitrary_blocks_never_panic(blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6)) {
            let mut decoder = Decoder::new(4096);
            for block in blocks {
                let _ = decoder.decode(&block, |_| {});
                prop_assert!(decoder.size <= decoder.max_size);
            }
        }

        #[test]
        fn huffman_round_trips(text in proptest::collection::vec(any::<u8>(), 0..200)) {
            prop_assert_eq!(huffman_decode(&huffman_encode(&text)), Ok(text));
        }

        #[test]
        fn integers_round_trip(value in 0usize..=(u32::MAX as usize), prefix in 1u8..=8) {
            let mut out = Vec::new();
            encode_integer(&mut out, 0, prefix, value);
            let (got, rest) = decode_integer(&out, prefix).unwrap();
            prop_assert_eq!(got, value);
            prop_assert!(rest.is_empty());
        }
    }
}
