//! Money in whole USD cents: integer arithmetic only, checked for overflow, shown with two decimals.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An amount of whole US cents. Serialized in JSON as an integer number of cents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cents(pub u64);

impl Cents {
    pub fn checked_mul(self, factor: u64) -> Option<Cents> {
        self.0.checked_mul(factor).map(Cents)
    }
    /// "1234.56": dollars and two-digit cents, no separator, no float.
    pub fn usd(self) -> String {
        format!("{}.{:02}", self.0 / 100, self.0 % 100)
    }
}

impl fmt::Display for Cents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "USD {}", self.usd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_whole_cents_exactly() {
        assert_eq!(Cents(0).to_string(), "USD 0.00");
        assert_eq!(Cents(5).to_string(), "USD 0.05");
        assert_eq!(Cents(123_456).to_string(), "USD 1234.56");
        assert_eq!(Cents(u64::MAX).usd(), "184467440737095516.15");
        assert_eq!(Cents(u64::MAX).checked_mul(2), None);
    }
}
