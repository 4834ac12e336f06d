//! A set of logical CPU ids with the two text forms the kernel uses:
//! cpulists (`0-3,8,10-11`) and hex masks (`ffffffff,0000000f`).
//!
//! Parsing is strict because these strings come from sysfs, flags, claims and
//! container environments; a lenient parser would silently pin a workload to
//! the wrong CPUs.

use std::fmt;
use std::str::FromStr;

/// Highest number of CPUs a set can hold (ids `0..MAX_CPUS`).
pub const MAX_CPUS: u32 = 8192;
const WORDS: usize = (MAX_CPUS as usize) / 64;

/// Why a cpulist or hex mask was refused. Every variant names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    #[error("cpulist {input:?}: empty element at position {index}")]
    EmptyPart { input: String, index: usize },
    #[error("cpulist {input:?}: {part:?} is not a CPU number or range")]
    Junk { input: String, part: String },
    #[error("cpulist {input:?}: range {part:?} is reversed")]
    Reversed { input: String, part: String },
    #[error("cpulist {input:?}: CPU {cpu} in {part:?} is past the limit of {max} CPUs", max = MAX_CPUS)]
    TooLarge {
        input: String,
        part: String,
        cpu: u64,
    },
    #[error("hex mask {input:?}: {part:?} is not a 1-8 digit hex word")]
    BadMaskWord { input: String, part: String },
    #[error("hex mask {input:?}: more than {max} CPUs", max = MAX_CPUS)]
    MaskTooLong { input: String },
}

/// A set of CPU ids below [`MAX_CPUS`]. Stored as a bitmap with trailing zero
/// words trimmed, so equal sets compare and hash equal.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet {
    words: Vec<u64>,
}

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse a Linux cpulist such as `0-3,8,10-11`. Surrounding whitespace
    /// (a trailing newline from sysfs) is ignored; an empty string is the empty set.
    pub fn parse_cpulist(input: &str) -> Result<Self, CpuSetError> {
        let text = input.trim();
        let mut set = CpuSet::new();
        if text.is_empty() {
            return Ok(set);
        }
        for (index, raw) in text.split(',').enumerate() {
            let part = raw.trim();
            if part.is_empty() {
                return Err(CpuSetError::EmptyPart {
                    input: input.to_string(),
                    index,
                });
            }
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (parse_cpu(input, part, a)?, parse_cpu(input, part, b)?),
                None => {
                    let c = parse_cpu(input, part, part)?;
                    (c, c)
                }
            };
            if lo > hi {
                return Err(CpuSetError::Reversed {
                    input: input.to_string(),
                    part: part.to_string(),
                });
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }

    /// Parse a sysfs hex mask such as `ffffffff,0000000f` (most significant
    /// 32-bit word first, as in `/sys/devices/system/cpu/*/topology/*_siblings`).
    pub fn parse_hex_mask(input: &str) -> Result<Self, CpuSetError> {
        let text = input.trim();
        let mut set = CpuSet::new();
        if text.is_empty() {
            return Err(CpuSetError::BadMaskWord {
                input: input.to_string(),
                part: String::new(),
            });
        }
        let words: Vec<&str> = text.split(',').collect();
        for (pos, word) in words.iter().rev().enumerate() {
            let ok =
                !word.is_empty() && word.len() <= 8 && word.bytes().all(|b| b.is_ascii_hexdigit());
            if !ok {
                return Err(CpuSetError::BadMaskWord {
                    input: input.to_string(),
                    part: (*word).to_string(),
                });
            }
            let value = u32::from_str_radix(word, 16).map_err(|_| CpuSetError::BadMaskWord {
                input: input.to_string(),
                part: (*word).to_string(),
            })?;
            if value == 0 {
                continue;
            }
            let base = (pos as u64) * 32;
            for bit in 0..32u64 {
                if value & (1u32 << bit) != 0 {
                    let cpu = base + bit;
                    if cpu >= u64::from(MAX_CPUS) {
                        return Err(CpuSetError::MaskTooLong {
                            input: input.to_string(),
                        });
                    }
                    set.insert(cpu as u32);
                }
            }
        }
        Ok(set)
    }

    /// Add one CPU. Returns whether it was newly added.
    ///
    /// # Panics
    /// If `cpu >= MAX_CPUS`; ids from outside are range-checked by the parsers.
    pub fn insert(&mut self, cpu: u32) -> bool {
        assert!(cpu < MAX_CPUS, "CPU id {cpu} past the limit of {MAX_CPUS}");
        let (w, b) = ((cpu / 64) as usize, cpu % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let had = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        !had
    }

    /// Remove one CPU. Returns whether it was present.
    pub fn remove(&mut self, cpu: u32) -> bool {
        let had = self.contains(cpu);
        if had {
            self.words[(cpu / 64) as usize] &= !(1u64 << (cpu % 64));
            self.trim();
        }
        had
    }

    /// Add `lo..=hi` a word at a time: a cpulist from a container's
    /// environment may repeat a wide range many times over, and CPU by CPU
    /// that would cost thousands of steps a part.
    fn insert_range(&mut self, lo: u32, hi: u32) {
        assert!(
            lo <= hi && hi < MAX_CPUS,
            "range {lo}-{hi} past the limit of {MAX_CPUS}"
        );
        let (first, last) = ((lo / 64) as usize, (hi / 64) as usize);
        if self.words.len() <= last {
            self.words.resize(last + 1, 0);
        }
        for (w, word) in self.words[first..=last].iter_mut().enumerate() {
            let w = (first + w) as u32;
            let from = if w == lo / 64 { lo % 64 } else { 0 };
            let to = if w == hi / 64 { hi % 64 } else { 63 };
            // Bits from..=to set; `to - from + 1` is 1 to 64.
            let width = to - from + 1;
            let mask = if width == 64 {
                u64::MAX
            } else {
                ((1u64 << width) - 1) << from
            };
            *word |= mask;
        }
    }

    pub fn contains(&self, cpu: u32) -> bool {
        let w = (cpu / 64) as usize;
        w < self.words.len() && self.words[w] & (1 << (cpu % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| self.word(i) | other.word(i))
            .collect::<Vec<_>>();
        CpuSet::from_words(words)
    }

    /// Adds `other`'s CPUs to `self` in place: the union without a new
    /// set, for folding many sets into one.
    pub fn union_with(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (mine, theirs) in self.words.iter_mut().zip(&other.words) {
            *mine |= theirs;
        }
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().min(other.words.len());
        CpuSet::from_words((0..n).map(|i| self.word(i) & other.word(i)).collect())
    }

    /// CPUs in `self` that are not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet::from_words(
            (0..self.words.len())
                .map(|i| self.word(i) & !other.word(i))
                .collect(),
        )
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        (0..self.words.len()).all(|i| self.word(i) & !other.word(i) == 0)
    }

    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        let n = self.words.len().min(other.words.len());
        (0..n).all(|i| self.word(i) & other.word(i) == 0)
    }

    /// Lowest CPU id in the set.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// CPU ids in ascending order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            words: &self.words,
            index: 0,
            current: self.words.first().copied().unwrap_or(0),
        }
    }

    /// The cpulist form, e.g. `0-3,8`; the empty set prints as an empty string.
    pub fn to_cpulist(&self) -> String {
        self.to_string()
    }

    /// The sysfs hex-mask form, most significant 32-bit word first.
    pub fn to_hex_mask(&self) -> String {
        let mut words32: Vec<u32> = Vec::with_capacity(self.words.len() * 2);
        for w in &self.words {
            words32.push(*w as u32);
            words32.push((*w >> 32) as u32);
        }
        while words32.len() > 1 && words32.last() == Some(&0) {
            words32.pop();
        }
        if words32.is_empty() {
            words32.push(0);
        }
        words32
            .iter()
            .rev()
            .map(|w| format!("{w:08x}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn word(&self, i: usize) -> u64 {
        self.words.get(i).copied().unwrap_or(0)
    }

    fn from_words(words: Vec<u64>) -> CpuSet {
        let mut set = CpuSet { words };
        set.trim();
        set
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
        debug_assert!(self.words.len() <= WORDS);
    }
}

fn parse_cpu(input: &str, part: &str, digits: &str) -> Result<u32, CpuSetError> {
    let d = digits.trim();
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuSetError::Junk {
            input: input.to_string(),
            part: part.to_string(),
        });
    }
    // Digits only, so the only failure is overflow: report it as too large.
    let value: u64 = d.parse().unwrap_or(u64::MAX);
    if value >= u64::from(MAX_CPUS) {
        return Err(CpuSetError::TooLarge {
            input: input.to_string(),
            part: part.to_string(),
            cpu: value,
        });
    }
    Ok(value as u32)
}

/// Iterator over the CPU ids of a [`CpuSet`], ascending.
pub struct Iter<'a> {
    words: &'a [u64],
    index: usize,
    current: u64,
}

impl Iterator for Iter<'_> {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        loop {
            if self.current != 0 {
                let bit = self.current.trailing_zeros();
                self.current &= self.current - 1;
                return Some(self.index as u32 * 64 + bit);
            }
            self.index += 1;
            if self.index >= self.words.len() {
                return None;
            }
            self.current = self.words[self.index];
        }
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = u32;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<u32> for CpuSet {
    /// # Panics
    /// If an id is `>= MAX_CPUS`.
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for cpu in iter {
            set.insert(cpu);
        }
        set
    }
}

impl Extend<u32> for CpuSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for cpu in iter {
            self.insert(cpu);
        }
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse_cpulist(s)
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.iter().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_cpulist())
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CpuSet::parse_cpulist(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("valid cpulist")
    }

    #[test]
    fn parses_and_prints_cpulists() {
        let cases = [
            ("", ""),
            ("\n", ""),
            ("0", "0"),
            ("0-3,8,10-11\n", "0-3,8,10-11"),
            ("3,2,1,0", "0-3"),
            ("0-1,1-2", "0-2"),
            ("5-5", "5"),
            (" 1 , 4-6 ", "1,4-6"),
            ("8191", "8191"),
            ("63-65", "63-65"),
        ];
        for (input, want) in cases {
            assert_eq!(set(input).to_cpulist(), want, "input {input:?}");
        }
    }

    #[test]
    fn rejects_bad_cpulists_naming_the_part() {
        let cases: [(&str, &str); 9] = [
            ("0,,1", "empty element at position 1"),
            ("0,", "empty element at position 1"),
            ("3-1", "\"3-1\" is reversed"),
            ("8192", "\"8192\" is past the limit"),
            ("0-99999999999999999999999", "past the limit"),
            ("a", "\"a\" is not a CPU number"),
            ("1-", "\"1-\" is not a CPU number"),
            ("-1", "\"-1\" is not a CPU number"),
            ("1-2-3", "\"1-2-3\" is not a CPU number"),
        ];
        for (input, want) in cases {
            let err = CpuSet::parse_cpulist(input).expect_err(input).to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn parses_hex_masks() {
        let cases = [
            ("0", ""),
            ("00000001", "0"),
            ("f", "0-3"),
            ("ffffffff,0000000f", "0-3,32-63"),
            ("00000001,00000000,00000000\n", "64"),
            ("80000000", "31"),
        ];
        for (input, want) in cases {
            let got = CpuSet::parse_hex_mask(input).expect(input);
            assert_eq!(got.to_cpulist(), want, "input {input:?}");
        }
        for bad in ["", "xyz", "123456789", "f,,f", "0x1"] {
            assert!(CpuSet::parse_hex_mask(bad).is_err(), "{bad:?}");
        }
        let too_long = vec!["1"; 257].join(",");
        assert!(matches!(
            CpuSet::parse_hex_mask(&too_long),
            Err(CpuSetError::MaskTooLong { .. })
        ));
    }

    #[test]
    fn set_operations() {
        let a = set("0-7");
        let b = set("4-11");
        assert_eq!(a.union(&b), set("0-11"));
        assert_eq!(a.intersection(&b), set("4-7"));
        assert_eq!(a.difference(&b), set("0-3"));
        assert_eq!(b.difference(&a), set("8-11"));
        assert!(set("1-2").is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(set("0-3").is_disjoint(&set("100")));
        assert_eq!(set("100").difference(&set("100")), CpuSet::new());
        assert!(set("100").difference(&set("100")).is_empty());
        assert_eq!(a.len(), 8);
        assert_eq!(set("5,9").first(), Some(5));
        let mut c = set("1,200");
        assert!(c.remove(200));
        assert_eq!(c, set("1"));
    }

    #[test]
    fn serde_uses_the_cpulist_form() {
        let s = serde_json::to_string(&set("0-2,9")).expect("serialize");
        assert_eq!(s, "\"0-2,9\"");
        let back: CpuSet = serde_json::from_str(&s).expect("deserialize");
        assert_eq!(back, set("0-2,9"));
        assert!(serde_json::from_str::<CpuSet>("\"2-1\"").is_err());
    }

    fn arb_set() -> impl Strategy<Value = CpuSet> {
        proptest::collection::btree_set(0u32..MAX_CPUS, 0..200)
            .prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        /// A range inserted a word at a time holds exactly its CPUs.
        #[test]
        fn insert_range_is_the_cpus_one_by_one(
            start in 0u32..MAX_CPUS,
            width in 0u32..300,
            earlier in proptest::collection::btree_set(0u32..MAX_CPUS, 0..20),
        ) {
            let end = (start + width).min(MAX_CPUS - 1);
            let mut by_range: CpuSet = earlier.iter().copied().collect();
            let mut one_by_one = by_range.clone();
            by_range.insert_range(start, end);
            for cpu in start..=end {
                one_by_one.insert(cpu);
            }
            prop_assert_eq!(by_range, one_by_one);
        }

        #[test]
        fn cpulist_round_trips(s in arb_set()) {
            prop_assert_eq!(CpuSet::parse_cpulist(&s.to_cpulist()).unwrap(), s);
        }

        #[test]
        fn hex_mask_round_trips(s in arb_set()) {
            prop_assert_eq!(CpuSet::parse_hex_mask(&s.to_hex_mask()).unwrap(), s);
        }

        #[test]
        fn iteration_is_sorted_and_counts(s in arb_set()) {
            let v: Vec<u32> = s.iter().collect();
            prop_assert!(v.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(v.len(), s.len());
        }

        #[test]
        fn algebra_laws(a in arb_set(), b in arb_set()) {
            let u = a.union(&b);
            let i = a.intersection(&b);
            prop_assert_eq!(u.len() + i.len(), a.len() + b.len());
            prop_assert!(a.difference(&b).is_disjoint(&b));
            prop_assert_eq!(a.difference(&b).union(&i), a.clone());
            prop_assert!(i.is_subset(&a) && i.is_subset(&b));
        }

        #[test]
        fn union_with_is_the_union(a in arb_set(), b in arb_set()) {
            let mut folded = a.clone();
            folded.union_with(&b);
            // Equal as sets and as words (no trailing empty word kept).
            prop_assert_eq!(folded, a.union(&b));
        }

        #[test]
        fn parser_never_panics(s in "[0-9,\\- a-f]{0,40}") {
            let _ = CpuSet::parse_cpulist(&s);
            let _ = CpuSet::parse_hex_mask(&s);
        }
    }
}
