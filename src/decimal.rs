//! Plain decimal numbers, read exactly as written: digits with at most one decimal point, no sign,
//! exponent, space or leading zero. At most [`MAX_DIGITS`] digits are accepted, so no number is
//! ever rounded on the way in (a longer one is refused, never silently shortened), and any number
//! of decimal places is kept, so a tiny positive amount stays positive. Not `rust_decimal`'s own
//! parser: it takes signs and exponents and caps the places at 28, so 1e-29 GiB would not stay the
//! positive byte it is; a value converts to a `Decimal` where it fits ([`PlainDecimal::to_decimal`]).

use rust_decimal::Decimal;
use std::fmt;

/// The most digits a plain decimal may have (leading zeros and trailing zeros after the point not
/// counted): what a `rust_decimal::Decimal` holds exactly.
pub const MAX_DIGITS: usize = 28;

/// A non-negative decimal number kept exactly: `mantissa / 10^scale`, without trailing zeros
/// after the point (so two equal numbers are equal values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlainDecimal {
    mantissa: u128,
    scale: u32,
}

/// Why a text is not a plain decimal number; the caller names the value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecimalError {
    #[error(
        "a number is written with digits and at most one decimal point, such as 4 or 1.5 \
         (no sign, space or exponent)"
    )]
    Syntax,
    #[error("a number does not start with a leading zero (write 4 or 0.5, not 04 or 00.5)")]
    LeadingZero,
    #[error(
        "{0} digits is too many: at most {MAX_DIGITS} are kept exactly (leading zeros and \
         trailing zeros after the point are not counted), and a number is never rounded"
    )]
    TooManyDigits(usize),
}

impl PlainDecimal {
    /// Zero.
    pub const ZERO: PlainDecimal = PlainDecimal {
        mantissa: 0,
        scale: 0,
    };

    /// The digits, as a whole number: the value is `mantissa / 10^scale`.
    pub fn mantissa(self) -> u128 {
        self.mantissa
    }

    /// Decimal places.
    pub fn scale(self) -> u32 {
        self.scale
    }

    /// Whether the number is zero.
    pub fn is_zero(self) -> bool {
        self.mantissa == 0
    }

    /// The same number as a `Decimal`, when it has at most 28 decimal places (`Decimal`'s limit).
    pub fn to_decimal(self) -> Option<Decimal> {
        let mantissa = i128::try_from(self.mantissa).ok()?;
        Decimal::try_from_i128_with_scale(mantissa, self.scale).ok()
    }
}

impl From<u32> for PlainDecimal {
    /// A whole number.
    fn from(n: u32) -> PlainDecimal {
        if n == 0 {
            PlainDecimal::ZERO
        } else {
            PlainDecimal {
                mantissa: n.into(),
                scale: 0,
            }
        }
    }
}

impl std::str::FromStr for PlainDecimal {
    type Err = DecimalError;

    fn from_str(s: &str) -> Result<PlainDecimal, DecimalError> {
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let (whole, fraction) = match s.split_once('.') {
            Some((w, f)) if digits(w) && digits(f) => (w, f),
            None if digits(s) => (s, ""),
            _ => return Err(DecimalError::Syntax),
        };
        if whole.len() > 1 && whole.starts_with('0') {
            return Err(DecimalError::LeadingZero);
        }
        let fraction = fraction.trim_end_matches('0');
        let all = format!("{whole}{fraction}");
        let significant = all.trim_start_matches('0');
        if significant.len() > MAX_DIGITS {
            return Err(DecimalError::TooManyDigits(significant.len()));
        }
        let mantissa = if significant.is_empty() {
            0
        } else {
            significant.parse::<u128>().expect("at most 28 digits")
        };
        if mantissa == 0 {
            return Ok(PlainDecimal::ZERO);
        }
        let scale = u32::try_from(fraction.len()).map_err(|_| DecimalError::Syntax)?;
        Ok(PlainDecimal { mantissa, scale })
    }
}

impl fmt::Display for PlainDecimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.mantissa.to_string();
        let scale = self.scale as usize;
        if scale == 0 {
            f.write_str(&digits)
        } else if digits.len() <= scale {
            write!(f, "0.{}{digits}", "0".repeat(scale - digits.len()))
        } else {
            let (whole, fraction) = digits.split_at(digits.len() - scale);
            write!(f, "{whole}.{fraction}")
        }
    }
}

/// JSON form: the number as a string, exactly as [`fmt::Display`] writes it (`"1.5"`).
impl serde::Serialize for PlainDecimal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<PlainDecimal, DecimalError> {
        s.parse()
    }

    #[test]
    fn plain_numbers_are_read_exactly() {
        for (text, shown, mantissa, scale) in [
            ("0", "0", 0, 0),
            ("0.000", "0", 0, 0),
            ("4", "4", 4, 0),
            ("100", "100", 100, 0),
            ("1.50", "1.5", 15, 1),
            ("23.99", "23.99", 2399, 2),
            (
                "0.00000000000000000000000000001",
                "0.00000000000000000000000000001",
                1,
                29,
            ),
            (
                "1.000000000000000000000000001",
                "1.000000000000000000000000001",
                1_000_000_000_000_000_000_000_000_001,
                27,
            ),
        ] {
            let d = parse(text).unwrap();
            assert_eq!(d.to_string(), shown, "{text}");
            assert_eq!((d.mantissa(), d.scale()), (mantissa, scale), "{text}");
        }
        assert_eq!(parse("1.5"), parse("1.500"));
    }

    #[test]
    fn anything_but_plain_digits_is_refused() {
        for bad in [
            "", " 4", "4 ", "+4", "-4", "4.", ".5", "1e3", "2.399e1", "1_000", "0x10", "1,5",
            "1.2.3", "４", "inf", "NaN",
        ] {
            assert_eq!(parse(bad), Err(DecimalError::Syntax), "{bad:?}");
        }
        for bad in ["04", "00.5", "007"] {
            assert_eq!(parse(bad), Err(DecimalError::LeadingZero), "{bad:?}");
        }
    }

    #[test]
    fn more_than_28_digits_is_refused_never_rounded() {
        assert_eq!(
            parse("1.0000000000000000000000000001"),
            Err(DecimalError::TooManyDigits(29))
        );
        assert_eq!(
            parse("12345678901234567890123456789"),
            Err(DecimalError::TooManyDigits(29))
        );
        assert!(parse("1234567890123456789012345678").is_ok());
        assert!(parse("0.0000000000000000000000000000000000000000001").is_ok());
        assert!(parse("1.000000000000000000000000000000").is_ok());
        assert!(DecimalError::TooManyDigits(29).to_string().contains("28"));
    }

    #[test]
    fn converts_to_decimal_within_28_places() {
        assert_eq!(
            parse("23.99").unwrap().to_decimal(),
            Some(Decimal::new(2399, 2))
        );
        assert_eq!(
            parse("0.00000000000000000000000000001")
                .unwrap()
                .to_decimal(),
            None
        );
        assert_eq!(
            serde_json::to_string(&parse("1.50").unwrap()).unwrap(),
            "\"1.5\""
        );
    }
}
