//! The canonical form the API server writes a `resource.Quantity` in
//! (apimachinery `Quantity.CanonicalizeBytes`): decimal SI values take the
//! largest suffix (exponent a multiple of 3) that keeps the number whole
//! (`1000` → `1k`, `1500` → `1500`, `0.5` → `500m`); binary SI values the
//! largest power of 1024 (`1024Ki` → `1Mi`), below 1024 they are written
//! as decimals. Exponent notation (`1e3`) and anything unparsable are left
//! to the caller (`None`).

const DECIMAL: [(i32, &str); 10] = [
    (18, "E"),
    (15, "P"),
    (12, "T"),
    (9, "G"),
    (6, "M"),
    (3, "k"),
    (0, ""),
    (-3, "m"),
    (-6, "u"),
    (-9, "n"),
];
const BINARY: [(u32, &str); 6] = [
    (60, "Ei"),
    (50, "Pi"),
    (40, "Ti"),
    (30, "Gi"),
    (20, "Mi"),
    (10, "Ki"),
];

/// `(digits, exponent)`: the value is `digits × 10^exponent`.
fn parse_decimal(number: &str) -> Option<(i128, i32)> {
    let (sign, body) = match number.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = body.split_once('.').unwrap_or((body, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole
        .bytes()
        .chain(fraction.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits: i128 = format!("{whole}{fraction}").parse().ok()?;
    let exponent = -i32::try_from(fraction.len()).ok()?;
    Some((sign * digits, exponent))
}

pub fn canonical(quantity: &str) -> Option<String> {
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    if let Some(&(power, _)) = BINARY.iter().find(|(_, s)| *s == suffix) {
        let (digits, exponent) = parse_decimal(number)?;
        let bytes = if exponent == 0 {
            digits.checked_mul(1i128 << power)?
        } else {
            // A fractional binary value: whole bytes or bust.
            let scaled = digits.checked_mul(1i128 << power)?;
            let divisor = 10i128.checked_pow(exponent.unsigned_abs())?;
            if scaled % divisor != 0 {
                return decimal(digits, exponent);
            }
            scaled / divisor
        };
        if bytes.abs() < 1024 {
            return decimal(bytes, 0);
        }
        for (p, s) in BINARY {
            if bytes % (1i128 << p) == 0 {
                return Some(format!("{}{s}", bytes / (1i128 << p)));
            }
        }
        return Some(bytes.to_string());
    }
    let (shift, _) = DECIMAL.iter().find(|(_, s)| *s == suffix)?;
    let (digits, exponent) = parse_decimal(number)?;
    decimal(digits, exponent + shift)
}

fn decimal(mut digits: i128, mut exponent: i32) -> Option<String> {
    if digits == 0 {
        return Some("0".to_string());
    }
    while digits % 10 == 0 {
        digits /= 10;
        exponent += 1;
    }
    // Below nano the server rounds up to 1n; not a case slices meet.
    if exponent < -9 {
        return None;
    }
    let (target, suffix) = DECIMAL
        .iter()
        .find(|(e, _)| *e <= exponent)
        .copied()
        .unwrap_or((-9, "n"));
    let mantissa = digits.checked_mul(10i128.checked_pow((exponent - target).unsigned_abs())?)?;
    Some(format!("{mantissa}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn canonical_forms_table() {
        for (input, want) in [
            ("1000", Some("1k")),
            ("1500", Some("1500")),
            ("4", Some("4")),
            ("0", Some("0")),
            ("0.5", Some("500m")),
            ("1.5k", Some("1500")),
            ("1200000", Some("1200k")),
            ("1000m", Some("1")),
            ("100m", Some("100m")),
            ("2000k", Some("2M")),
            ("1024Ki", Some("1Mi")),
            ("512Ki", Some("512Ki")),
            ("1Ki", Some("1Ki")),
            ("0.5Ki", Some("512")),
            ("1e3", None),
            ("abc", None),
            ("", None),
        ] {
            assert_eq!(canonical(input).as_deref(), want, "{input:?}");
        }
    }
}
