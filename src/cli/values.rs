//! Value parsers for command-line flags: strict, with messages that say what is expected. clap
//! prefixes each message with the flag's name.

use rust_decimal::Decimal;

/// A positive whole number (no sign, no decimals, no exponent).
pub fn positive_u64(s: &str) -> Result<u64, String> {
    match count_u64(s)? {
        0 => Err("must be a positive integer, got 0".into()),
        n => Ok(n),
    }
}

/// A whole number, zero allowed.
pub fn count_u64(s: &str) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err(format!("must not be negative, got `{s}`"));
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "must be a whole number written with digits only, got `{s}`"
        ));
    }
    s.parse::<u64>()
        .map_err(|_| format!("`{s}` is too large (at most {})", u64::MAX))
}

pub fn positive_u32(s: &str) -> Result<u32, String> {
    let n = positive_u64(s)?;
    u32::try_from(n).map_err(|_| format!("`{s}` is too large (at most {})", u32::MAX))
}

pub fn count_u32(s: &str) -> Result<u32, String> {
    let n = count_u64(s)?;
    u32::try_from(n).map_err(|_| format!("`{s}` is too large (at most {})", u32::MAX))
}

/// A storage width in bits, 1 to 64.
pub fn bits(s: &str) -> Result<u32, String> {
    let n = positive_u64(s)?;
    if n > u64::from(crate::estimate::MAX_BITS) {
        return Err(format!(
            "must be between 1 and {} bits, got {n}",
            crate::estimate::MAX_BITS
        ));
    }
    Ok(n as u32)
}

/// A non-negative decimal number of GiB, such as `4` or `1.5`.
pub fn gib(s: &str) -> Result<Decimal, String> {
    let valid = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-')
        && s.bytes().any(|b| b.is_ascii_digit());
    let d: Decimal = match s.parse() {
        Ok(d) if valid => d,
        _ => {
            return Err(format!(
                "must be a number of GiB such as 4 or 1.5, got `{s}`"
            ))
        }
    };
    if d.is_sign_negative() && !d.is_zero() {
        return Err(format!("must be zero or positive, got `{s}`"));
    }
    Ok(d)
}

/// An element type: float32, float16 or bfloat16.
pub fn dtype(s: &str) -> Result<crate::measure::Dtype, String> {
    s.parse()
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

/// A rental duration: 3, 7 or 30 days.
pub fn days(s: &str) -> Result<u32, String> {
    let n = positive_u32(s)?;
    if !crate::catalog::DURATIONS_DAYS.contains(&n) {
        return Err(format!(
            "durations are 3, 7 or 30 days only (no conversion, no proration), got {n}"
        ));
    }
    Ok(n)
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
        assert_eq!(count_u32("0"), Ok(0));
        assert!(count_u32("4294967296").unwrap_err().contains("too large"));
    }

    #[test]
    fn bits_gib_and_days() {
        assert_eq!(bits("16"), Ok(16));
        assert!(bits("65").is_err());
        assert!(bits("0").is_err());
        assert_eq!(gib("4").unwrap().to_string(), "4");
        assert_eq!(gib("1.5").unwrap().to_string(), "1.5");
        assert!(gib("-1").unwrap_err().contains("zero or positive"));
        assert!(gib("abc").is_err());
        assert!(gib("1e3").is_err());
        assert!(gib("4GiB").is_err());
        assert_eq!(days("7"), Ok(7));
        assert!(days("5").unwrap_err().contains("3, 7 or 30"));
    }
}
