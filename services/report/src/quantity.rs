//! Parsing of Kubernetes-style quantities (`4Gi`, `4000M`, `1200m`) and of
//! short durations (`10ms`, `60s`).
//!
//! Parsing is exact (integer arithmetic on the decimal digits) so that
//! `9123456789` stays `9123456789`, and fractions round *up* the way
//! Kubernetes rounds a quantity to its smallest unit.

use std::time::Duration;

use crate::Error;

/// A decimal number split into its digits and the count of digits after the
/// point: `1.25` → `(125, 2)`.
fn parse_decimal(digits: &str) -> Option<(u128, u32)> {
    let (int, frac) = match digits.split_once('.') {
        Some((int, frac)) => (int, frac),
        None => (digits, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    // 30 significant digits keep the mantissa well inside u128; nothing a CI
    // job reports comes close.
    if int.len() + frac.len() > 30 {
        return None;
    }
    let mut mantissa: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        mantissa = mantissa * 10 + u128::from(b - b'0');
    }
    let scale = u32::try_from(frac.len()).ok()?;
    Some((mantissa, scale))
}

/// `mantissa / 10^scale * num / den`, rounded up, if it fits in a `u64`.
fn scale_ceil(mantissa: u128, scale: u32, num: u128, den: u128) -> Option<u64> {
    let numerator = mantissa.checked_mul(num)?;
    let denominator = 10u128.checked_pow(scale)?.checked_mul(den)?;
    let value = numerator.div_ceil(denominator);
    u64::try_from(value).ok()
}

/// Splits `input` into its numeric part and its alphabetic suffix.
fn split_suffix(input: &str) -> (&str, &str) {
    let at = input
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(input.len());
    input.split_at(at)
}

/// Parses a memory quantity into bytes.
///
/// Accepts the Kubernetes forms — plain bytes (`123`), decimal suffixes
/// `k M G T P E` (`4000M`, `1.5G`), binary suffixes `Ki Mi Gi Ti Pi Ei`
/// (`512Mi`, `4Gi`) and milli (`m`, rounded up to whole bytes) — plus a
/// trailing `B` (`4GiB`, `4GB`, `123B`) as written in runyard's own config.
/// Suffixes are case-sensitive, as in Kubernetes (`m` is milli, `M` mega).
/// Fractions of a byte round up.
pub fn parse_quantity(input: &str) -> Result<u64, Error> {
    let bad = |reason: &str| Error::Quantity {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = input.trim();
    let (number, suffix) = split_suffix(trimmed);
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("expected a number"))?;
    let suffix = suffix.strip_suffix('B').unwrap_or(suffix);
    let (num, den): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" if !trimmed.ends_with('B') => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        _ => {
            return Err(bad(
                "unknown suffix (use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or none)",
            ));
        }
    };
    scale_ceil(mantissa, scale, num, den).ok_or_else(|| bad("out of range"))
}

/// Parses a CPU quantity into millicores: `1200m` → 1200, `2` → 2000,
/// `0.5` → 500. Fractions of a millicore round up.
pub fn parse_cpu(input: &str) -> Result<u64, Error> {
    let bad = |reason: &str| Error::Cpu {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let (number, suffix) = split_suffix(input.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("expected a number"))?;
    let per_unit = match suffix {
        "" => 1000,
        "m" => 1,
        _ => {
            return Err(bad(
                "unknown suffix (use `m` for millicores or none for cores)",
            ));
        }
    };
    scale_ceil(mantissa, scale, per_unit, 1).ok_or_else(|| bad("out of range"))
}

/// Parses a short duration: `250ms`, `10s`, `2m`, `1h`; a bare number is
/// seconds. Used for the retry and timeout flags.
pub fn parse_duration(input: &str) -> Result<Duration, Error> {
    let bad = |reason: &str| Error::Duration {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let (number, suffix) = split_suffix(input.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("expected a number"))?;
    let nanos_per_unit: u128 = match suffix {
        "ms" => 1_000_000,
        "" | "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3600 * 1_000_000_000,
        _ => return Err(bad("unknown unit (use ms, s, m or h)")),
    };
    let nanos =
        scale_ceil(mantissa, scale, nanos_per_unit, 1).ok_or_else(|| bad("out of range"))?;
    Ok(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_kubernetes_forms() {
        let cases = [
            ("4Gi", 4 * 1024 * 1024 * 1024),
            ("4000M", 4_000_000_000),
            ("512Mi", 512 * 1024 * 1024),
            ("1.5G", 1_500_000_000),
            ("123", 123),
            ("9123456789", 9_123_456_789),
            ("1k", 1000),
            ("1Ki", 1024),
            ("4GiB", 4 * 1024 * 1024 * 1024),
            ("2GB", 2_000_000_000),
            ("100B", 100),
            (" 8Gi\n", 8 * 1024 * 1024 * 1024),
            ("1500m", 2),
            ("0.5Ki", 512),
            ("1.0000001", 2),
            ("8Ei", 8 * (1u64 << 60)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_quantity(input).ok(), Some(want), "{input}");
        }
    }

    #[test]
    fn bad_quantities_are_errors_naming_the_input() {
        for input in [
            "", "Gi", "four", "4 Gi", "-1", "4gi", "4K", "1.2.3", "16Ei", "4mB",
        ] {
            let err = parse_quantity(input).expect_err(input);
            assert!(
                err.to_string().contains(&format!("{input:?}")),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn cpu_in_cores_and_millicores() {
        let cases = [
            ("1200m", 1200),
            ("2", 2000),
            ("0.5", 500),
            ("1.5", 1500),
            (".25", 250),
            ("0.0001", 1),
            ("8", 8000),
        ];
        for (input, want) in cases {
            assert_eq!(parse_cpu(input).ok(), Some(want), "{input}");
        }
        for input in ["", "m", "2 cores", "-1", "1Gi", "1.5k"] {
            assert!(parse_cpu(input).is_err(), "{input}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms").ok(), Some(Duration::from_millis(10)));
        assert_eq!(parse_duration("60s").ok(), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("60").ok(), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h").ok(), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_duration("1.5s").ok(),
            Some(Duration::from_millis(1500))
        );
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }
}
