//! Quantities in the form the API server writes them back
//! (apimachinery `Quantity.CanonicalizeBytes`), so the publisher compares
//! what it sent with what the server holds without false differences:
//! decimal values take the largest SI suffix that keeps them whole
//! (`1000` → `1k`, `0.5` → `500m`), binary ones the largest power of 1024
//! (`1024Ki` → `1Mi`, below 1024 written as decimals). Exponent notation
//! and anything unparsable is left as it is.
//!
//! [`whole_value`] reads any quantity a user or the server may write (SI or
//! binary suffix, or exponent) as the exact whole number it stands for.

const DECIMAL_SUFFIXES: [(&str, i32); 10] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];
const BINARY_SUFFIXES: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

/// The number of a quantity and its suffix (`1.5Ki` → `1.5`, `Ki`).
fn split_suffix(quantity: &str) -> (&str, &str) {
    let number_end = quantity
        .find(|c: char| !matches!(c, '0'..='9' | '.' | '+' | '-'))
        .unwrap_or(quantity.len());
    quantity.split_at(number_end)
}

/// `value = significand × 10^exponent`, or `None` when not a plain decimal.
fn split_decimal(text: &str) -> Option<(i128, i32)> {
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, fraction) = body.split_once('.').unwrap_or((body, ""));
    let digits = format!("{whole}{fraction}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significand: i128 = digits.parse().ok()?;
    let exponent = -i32::try_from(fraction.len()).ok()?;
    Some((if negative { -significand } else { significand }, exponent))
}

fn format_decimal(significand: i128, exponent: i32) -> Option<String> {
    if significand == 0 {
        return Some("0".to_string());
    }
    let (mut significand, mut exponent) = (significand, exponent);
    while significand % 10 == 0 {
        significand /= 10;
        exponent += 1;
    }
    let (suffix, suffix_exponent) = DECIMAL_SUFFIXES
        .iter()
        .rev()
        .find(|(_, e)| *e <= exponent)?;
    let scale = 10i128.checked_pow(u32::try_from(exponent - suffix_exponent).ok()?)?;
    Some(format!("{}{suffix}", significand.checked_mul(scale)?))
}

/// The canonical text of `quantity`, or `None` if this module does not
/// know how the server would write it.
pub fn canonical(quantity: &str) -> Option<String> {
    let (number, suffix) = split_suffix(quantity);
    let (significand, exponent) = split_decimal(number)?;
    if let Some((_, bits)) = BINARY_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        let scaled = significand.checked_mul(1i128 << bits)?;
        let divisor = 10i128.checked_pow(exponent.unsigned_abs())?;
        if scaled % divisor != 0 {
            return format_decimal(significand, exponent);
        }
        let bytes = scaled / divisor;
        if bytes.abs() < 1024 {
            return format_decimal(bytes, 0);
        }
        let best = BINARY_SUFFIXES
            .iter()
            .rev()
            .find(|(_, bits)| bytes % (1i128 << bits) == 0);
        return Some(match best {
            Some((suffix, bits)) => format!("{}{suffix}", bytes >> bits),
            None => bytes.to_string(),
        });
    }
    let (_, shift) = DECIMAL_SUFFIXES.iter().find(|(s, _)| *s == suffix)?;
    format_decimal(significand, exponent + shift)
}

/// The whole, non-negative number `quantity` stands for, in any of the
/// forms the API accepts: `1k` (as the server writes 1000), `4000m`,
/// `4.0`, `+4`, `2Ki`, `1e3`. `None` for a fraction (`1.5`, `500m`), a
/// negative value, a value above `u64::MAX` or text that is no quantity.
pub fn whole_value(quantity: &str) -> Option<u64> {
    let (number, suffix) = split_suffix(quantity.trim());
    let (mut significand, mut exponent) = split_decimal(number)?;
    if let Some((_, bits)) = BINARY_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        significand = significand.checked_mul(1i128 << bits)?;
    } else if let Some((_, shift)) = DECIMAL_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        exponent = exponent.checked_add(*shift)?;
    } else {
        let power = suffix.strip_prefix(['e', 'E'])?;
        let unsigned = power.strip_prefix(['+', '-']).unwrap_or(power);
        if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        exponent = exponent.checked_add(power.parse::<i32>().ok()?)?;
    }
    if significand < 0 {
        return None;
    }
    let value = if exponent >= 0 {
        significand.checked_mul(10i128.checked_pow(exponent.unsigned_abs())?)?
    } else {
        let divisor = 10i128.checked_pow(exponent.unsigned_abs());
        match divisor {
            Some(d) if significand % d == 0 => significand / d,
            // A divisor past i128 leaves a whole number only for zero.
            None if significand == 0 => 0,
            _ => return None,
        }
    };
    u64::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::{canonical, whole_value};

    #[test]
    fn whole_value_table() {
        for (input, want) in [
            ("4", Some(4)),
            ("+4", Some(4)),
            (" 4 ", Some(4)),
            ("4.0", Some(4)),
            ("4.", Some(4)),
            ("4000m", Some(4)),
            ("1k", Some(1000)),
            ("2k", Some(2000)),
            ("1.5k", Some(1500)),
            ("1M", Some(1_000_000)),
            ("2Ki", Some(2048)),
            ("0.5Ki", Some(512)),
            ("1e3", Some(1000)),
            ("1E3", Some(1000)),
            ("1000e-3", Some(1)),
            ("1500e-3", None),
            ("0", Some(0)),
            ("0m", Some(0)),
            ("0e-99999", Some(0)),
            ("1.5", None),
            ("500m", None),
            ("1500e-4", None),
            ("-2", None),
            ("-2k", None),
            ("", None),
            (".0", Some(0)),
            (".5k", Some(500)),
            ("+.5", None),
            (".", None),
            ("1x", None),
            ("1e", None),
            ("1e+", None),
            ("1e3.5", None),
            ("k", None),
            ("99999999999999999999", None),
            ("100E", None),
            ("1e99999", None),
        ] {
            assert_eq!(whole_value(input), want, "{input:?}");
        }
    }

    /// What the server writes back reads as the value the user wrote.
    #[test]
    fn canonical_text_keeps_its_whole_value() {
        for input in [
            "1000", "2000", "1500", "3000000", "2048Ki", "1536Ki", "4000m", "64",
        ] {
            let written = canonical(input).expect("canonical");
            assert_eq!(
                whole_value(&written),
                whole_value(input),
                "{input} -> {written}"
            );
        }
    }

    #[test]
    fn canonical_table() {
        for (input, want) in [
            ("1000", Some("1k")),
            ("64", Some("64")),
            ("1500", Some("1500")),
            ("1.5k", Some("1500")),
            ("0.5", Some("500m")),
            ("1000m", Some("1")),
            ("3000000", Some("3M")),
            ("2048Ki", Some("2Mi")),
            ("1536Ki", Some("1536Ki")),
            ("0.5Ki", Some("512")),
            ("0", Some("0")),
            ("1e3", None),
            ("x", None),
        ] {
            assert_eq!(canonical(input).as_deref(), want, "{input}");
        }
    }
}
