//! Byte units: GiB (2^30 bytes) and GB (10^9 bytes), never confused, converted with exact integer
//! arithmetic and rounded only for display, half away from zero.

use crate::decimal::PlainDecimal;
use rust_decimal::Decimal;
use serde::Serialize;
use std::fmt;

/// One gibibyte: 2^30 bytes.
pub const GIB: u64 = 1 << 30;
/// One decimal gigabyte: 10^9 bytes.
pub const GB: u64 = 1_000_000_000;
/// Decimals kept in machine-readable output (JSON); text shows two.
pub const JSON_DECIMALS: u32 = 6;
/// The rounding rule, stated wherever a rounded figure is shown.
pub const ROUNDING_RULE: &str = "bytes are exact; GiB and GB are rounded half away from zero \
(2 decimals in text, 6 in JSON)";

/// `numerator / denominator` rounded half away from zero to `decimals` places, computed exactly
/// on integers (no binary floating point, no intermediate rounding).
pub fn ratio_rounded(numerator: u128, denominator: u128, decimals: u32) -> Decimal {
    assert!(denominator > 0, "ratio with a zero denominator");
    assert!(decimals <= 12, "at most 12 decimals");
    let scale = 10u128.pow(decimals);
    let scaled = numerator
        .checked_mul(scale)
        .expect("numerator below 2^88 keeps the scaled ratio in range");
    let mut quotient = scaled / denominator;
    if (scaled % denominator) * 2 >= denominator {
        quotient += 1;
    }
    Decimal::from_i128_with_scale(i128::try_from(quotient).expect("quotient fits"), decimals)
}

/// Whether `numerator / denominator` is exactly representable with `decimals` places.
pub fn ratio_is_exact(numerator: u128, denominator: u128, decimals: u32) -> bool {
    (numerator * 10u128.pow(decimals)).is_multiple_of(denominator)
}

/// A count with its digits grouped by three (`6 738 415 616`).
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// A byte count shown in bytes, GiB and GB side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl Bytes {
    pub fn gib(self, decimals: u32) -> Decimal {
        ratio_rounded(self.0.into(), GIB.into(), decimals)
    }
    pub fn gb(self, decimals: u32) -> Decimal {
        ratio_rounded(self.0.into(), GB.into(), decimals)
    }
    /// MiB (2^20 bytes) with two decimals, for block and segment sizes.
    pub fn mib_text(self) -> String {
        format!("{} MiB", ratio_rounded(self.0.into(), 1 << 20, 2))
    }
    /// The exact count with its digits grouped by three (`34 743 808 B`).
    pub fn grouped(self) -> String {
        grouped(self.0) + " B"
    }
    /// GiB with two decimals, for tables and labels.
    pub fn gib_text(self) -> String {
        format!("{} GiB", self.gib(2))
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes = {} GiB = {} GB",
            self.0,
            self.gib(2),
            self.gb(2)
        )
    }
}

/// JSON form: the exact byte count plus rounded GiB and GB as decimal strings.
impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Bytes", 3)?;
        st.serialize_field("bytes", &self.0)?;
        st.serialize_field("gib", &self.gib(JSON_DECIMALS))?;
        st.serialize_field("gb", &self.gb(JSON_DECIMALS))?;
        st.end()
    }
}

/// Reads back the JSON form; only the exact `bytes` field matters.
impl<'de> serde::Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Raw {
            bytes: u64,
        }
        Raw::deserialize(d).map(|r| Bytes(r.bytes))
    }
}

/// Exact bytes for a GiB amount, rounded up to a whole byte (a reserve is never shrunk: a positive
/// amount, however small, is at least one byte); `None` beyond 64 bits. Computed on integers.
pub fn gib_to_bytes(gib: PlainDecimal) -> Option<u64> {
    // mantissa < 10^28 < 2^94, so mantissa × 2^30 < 2^124 fits.
    let scaled = gib.mantissa() * u128::from(GIB);
    let bytes = match 10u128.checked_pow(gib.scale()) {
        Some(divisor) => scaled.div_ceil(divisor),
        // 10^scale is beyond 2^127 > scaled: the amount is below one byte.
        None => u128::from(scaled > 0),
    };
    u64::try_from(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gib_and_gb_are_distinct_units() {
        let b = Bytes(14_000_000_000);
        assert_eq!(b.gb(2).to_string(), "14.00");
        assert_eq!(b.gib(2).to_string(), "13.04");
        assert_eq!(b.gib(6).to_string(), "13.038516");
        assert_eq!(Bytes(GIB).gib(2).to_string(), "1.00");
        assert_eq!(Bytes(GIB).gb(3).to_string(), "1.074");
    }

    #[test]
    fn rounding_is_half_away_from_zero_and_exact() {
        assert_eq!(ratio_rounded(5, 1000, 2).to_string(), "0.01");
        assert_eq!(ratio_rounded(4, 1000, 2).to_string(), "0.00");
        assert_eq!(ratio_rounded(1, 3, 6).to_string(), "0.333333");
        assert_eq!(ratio_rounded(2, 3, 6).to_string(), "0.666667");
        assert!(ratio_is_exact(1, 4, 2));
        assert!(!ratio_is_exact(1, 3, 6));
        let max = Bytes(u64::MAX);
        assert_eq!(max.gib(2).to_string(), "17179869184.00");
    }

    fn bytes_of(gib: &str) -> Option<u64> {
        gib_to_bytes(gib.parse().unwrap())
    }

    #[test]
    fn gib_to_bytes_rounds_up_and_refuses_overflow() {
        assert_eq!(bytes_of("4"), Some(4 * GIB));
        assert_eq!(bytes_of("0"), Some(0));
        assert_eq!(bytes_of("0.1"), Some(107_374_183));
        assert_eq!(bytes_of("18446744073709551615"), None);
        assert_eq!(bytes_of("17179869183.99999999906867742"), Some(u64::MAX));
        assert_eq!(bytes_of("17179869184"), None);
    }

    #[test]
    fn a_positive_amount_is_at_least_one_byte() {
        assert_eq!(bytes_of("0.00000000000000000000000000001"), Some(1));
        assert_eq!(bytes_of("0.0000000001"), Some(1));
        let tiny = format!("0.{}1", "0".repeat(100));
        assert_eq!(bytes_of(&tiny), Some(1));
    }

    #[test]
    fn gib_to_bytes_is_exact_at_28_digits() {
        // 999999999 GiB and 10^-19 GiB: the fraction is a tenth of a nanobyte, still one byte.
        assert_eq!(
            bytes_of("999999999.0000000000000000001"),
            Some(999_999_999 * GIB + 1)
        );
        assert_eq!(bytes_of("1.5"), Some(GIB + GIB / 2));
    }
}
