//! HPACK (RFC 7541) for the authority rewrite: a decoder that follows a
//! client's dynamic table across the header blocks of one connection, and an
//! encoder that writes only literals without indexing, so the server's own
//! decoder never adds an entry to its table.
//!
//! Every input is the peer's: decoding returns an error for anything
//! malformed and never panics.

mod huffman;
mod static_table;

use huffman::huffman_decode;
use static_table::STATIC_TABLE;
use std::collections::VecDeque;

/// Per-entry overhead of the dynamic table (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Integers larger than this are refused: every length, index and table size
/// a header block can legitimately carry is far smaller.
const MAX_INTEGER: u64 = u32::MAX as u64;

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
    use super::huffman::{huffman_table, HUFFMAN_CODES};
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
