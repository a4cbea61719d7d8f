//! Value parsers for command-line flags: strict, with messages that say what is expected and
//! state the flag's own range (not the range of the type that holds it). clap prefixes each
//! message with the flag's name.

use crate::decimal::{DecimalError, PlainDecimal};
use crate::measure::MAX_PASSES;

/// A whole number from `min` to `max`, written with digits only (no sign, decimals or exponent).
fn whole_in(s: &str, min: u64, max: u64) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err(format!("must not be negative, got `{s}`"));
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "must be a whole number written with digits only, got `{s}`"
        ));
    }
    match s.parse::<u64>() {
        Ok(0) if min == 1 => Err("must be a positive integer, got 0".into()),
        Ok(n) if n < min => Err(format!("must be at least {min}, got {n}")),
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("`{s}` is too large (at most {max})")),
    }
}

/// [`whole_in`] for bounds that fit in a `u32`.
fn whole_u32_in(s: &str, min: u32, max: u32) -> Result<u32, String> {
    whole_in(s, min.into(), max.into()).map(|n| u32::try_from(n).expect("at most max"))
}

/// A positive whole number (no sign, no decimals, no exponent).
pub fn positive_u64(s: &str) -> Result<u64, String> {
    whole_in(s, 1, u64::MAX)
}

/// A whole number, zero allowed.
pub fn count_u64(s: &str) -> Result<u64, String> {
    whole_in(s, 0, u64::MAX)
}

/// Warm-up passes of a measurement: 0 to [`MAX_PASSES`].
pub fn warmup(s: &str) -> Result<u32, String> {
    passes(s, 0)
}

/// Measured repetitions of a measurement: 1 to [`MAX_PASSES`].
pub fn repeats(s: &str) -> Result<u32, String> {
    passes(s, 1)
}

fn passes(s: &str, min: u32) -> Result<u32, String> {
    whole_u32_in(s, min, MAX_PASSES)
        .map_err(|e| format!("{e}; a measurement is bounded to {min} to {MAX_PASSES} passes"))
}

/// The number of points of a sweep: 1 to [`crate::sweep::MAX_POINTS`].
pub fn steps(s: &str) -> Result<u32, String> {
    whole_u32_in(s, 1, crate::sweep::MAX_POINTS as u32)
}

/// A storage width in bits, 1 to 64.
pub fn bits(s: &str) -> Result<u32, String> {
    let max = crate::estimate::MAX_BITS;
    whole_u32_in(s, 1, max)
        .map_err(|_| format!("must be a whole number of bits between 1 and {max}, got `{s}`"))
}

/// A non-negative decimal number of GiB, such as `4` or `1.5`, kept exactly (at most 28 digits;
/// any number of decimal places).
pub fn gib(s: &str) -> Result<PlainDecimal, String> {
    if s.starts_with('-') {
        return Err(format!("must be zero or positive, got `{s}`"));
    }
    s.parse().map_err(|e: DecimalError| {
        let what = match e {
            DecimalError::TooManyDigits(_) => e.to_string(),
            _ => format!("must be a number of GiB such as 4 or 1.5: {e}"),
        };
        format!("{what}; got `{s}`")
    })
}

/// A number above 0 written as a plain decimal (1.2).
pub fn positive_decimal(s: &str) -> Result<rust_decimal::Decimal, String> {
    plain_decimal(s)
        .filter(|p| !p.is_zero())
        .ok_or_else(|| format!("must be a number above 0 such as 1.2; got `{s}`"))
}

/// A probability from 0 to below 1, written as a plain decimal (0.05).
pub fn probability(s: &str) -> Result<rust_decimal::Decimal, String> {
    plain_decimal(s)
        .filter(|p| *p < rust_decimal::Decimal::ONE)
        .ok_or_else(|| format!("must be a probability from 0 to below 1 such as 0.05; got `{s}`"))
}

/// A share above 0 and up to 1, written as a plain decimal (0.9).
pub fn top_p(s: &str) -> Result<rust_decimal::Decimal, String> {
    plain_decimal(s)
        .filter(|p| !p.is_zero() && *p <= rust_decimal::Decimal::ONE)
        .ok_or_else(|| format!("must be a number above 0 and up to 1 such as 0.9; got `{s}`"))
}

/// A plain decimal (no sign or exponent) as a `Decimal`, its trailing zeros dropped.
fn plain_decimal(s: &str) -> Option<rust_decimal::Decimal> {
    let p = s.parse::<PlainDecimal>().ok()?.to_decimal()?;
    Some(p.normalize())
}

/// An element type: float32, float16 or bfloat16.
pub fn dtype(s: &str) -> Result<crate::measure::Dtype, String> {
    crate::dtype::Dtype::float(s)
}

/// A GPU architecture the allocator model knows, e.g. 9.0.
pub fn compute_capability(s: &str) -> Result<crate::allocator::ComputeCapability, String> {
    s.parse()
        .map_err(|e: crate::allocator::workspace::WorkspaceError| e.to_string())
}

/// The dimension a sweep varies.
pub fn dimension(s: &str) -> Result<crate::sweep::Dimension, String> {
    s.parse()
}

/// A rental duration: 3, 7 or 30 days, written exactly so.
pub fn days(s: &str) -> Result<u32, String> {
    crate::catalog::DURATIONS_DAYS
        .into_iter()
        .find(|d| d.to_string() == s)
        .ok_or_else(|| {
            format!("durations are 3, 7 or 30 days only (no conversion, no proration), got `{s}`")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_strict() {
        assert_eq!(positive_u64("7000000000"), Ok(7_000_000_000));
        assert!(positive_u64("0").unwrap_err().contains("positive"));
        assert!(positive_u64("-5").unwrap_err().contains("negative"));
        assert!(positive_u64("1.5").unwrap_err().contains("digits only"));
        assert!(positive_u64("7e9").unwrap_err().contains("digits only"));
        assert!(positive_u64("").is_err());
        assert!(positive_u64("18446744073709551616")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(count_u64("0"), Ok(0));
    }

    #[test]
    fn passes_state_the_documented_bound() {
        assert_eq!(warmup("0"), Ok(0));
        assert_eq!(warmup("10000"), Ok(10_000));
        assert_eq!(repeats("1"), Ok(1));
        assert_eq!(repeats("10000"), Ok(10_000));
        for (value, parse) in [
            ("10001", warmup as fn(&str) -> Result<u32, String>),
            ("4294967296", warmup),
            ("99999999999999999999999", repeats),
            ("10001", repeats),
        ] {
            let e = parse(value).unwrap_err();
            assert!(e.contains("at most 10000"), "{e}");
            assert!(!e.contains("4294967295"), "{e}");
        }
        assert!(repeats("0").unwrap_err().contains("positive"));
    }

    #[test]
    fn bits_gib_and_days_state_their_range() {
        assert_eq!(bits("16"), Ok(16));
        assert_eq!(bits("64"), Ok(64));
        for bad in ["0", "65", "4294967296", "99999999999999999999", "x", "-8"] {
            let e = bits(bad).unwrap_err();
            assert!(e.contains("between 1 and 64"), "{bad}: {e}");
            assert!(!e.contains("18446744073709551615"), "{e}");
        }
        assert_eq!(gib("4").unwrap().to_string(), "4");
        assert_eq!(gib("1.5").unwrap().to_string(), "1.5");
        assert!(gib("-1").unwrap_err().contains("zero or positive"));
        assert!(gib("abc").is_err());
        assert!(gib("1e3").is_err());
        assert!(gib("4GiB").is_err());
        assert!(gib("1.00000000000000000000000000001")
            .unwrap_err()
            .contains("at most 28"));
        assert_eq!(
            gib("0.00000000000000000000000000001").unwrap().to_string(),
            "0.00000000000000000000000000001"
        );
        assert_eq!(days("7"), Ok(7));
        for bad in ["5", "07", "+7", "99999999999", "-3", ""] {
            let e = days(bad).unwrap_err();
            assert!(e.contains("3, 7 or 30"), "{bad}: {e}");
            assert!(!e.contains("4294967295"), "{e}");
        }
    }
}
