//! Weight-memory estimate (seed section 1): parameters × whole bytes per parameter, plus a reserve
//! that is a stated hypothesis, never a measurement.

use crate::decimal::PlainDecimal;
use crate::markup::{rows_text, Rows};
use crate::units::{gib_to_bytes, Bytes, ROUNDING_RULE};
use serde::Serialize;
use std::fmt;

/// Widest storage accepted, in bits (float64).
pub const MAX_BITS: u32 = 64;

/// What the estimate leaves out, printed with every result.
pub const NOT_INCLUDED: [&str; 6] = [
    "activations",
    "KV cache",
    "quantization metadata (scales, zero points)",
    "gradients",
    "optimizer states",
    "libraries, CUDA context and allocator overhead",
];

/// What the estimate does not claim.
pub const CAVEAT: &str =
    "This counts weight storage only; it does not predict whether a real model \
fits on a given card.";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EstimateError {
    #[error("the parameter count must be a positive integer, got 0")]
    ZeroParameters,
    #[error("the storage width must be between 1 and {MAX_BITS} bits, got {0}")]
    Bits(u32),
    #[error("{0} is too large: the byte count would overflow 64 bits")]
    Overflow(&'static str),
}

/// The result of an estimate; every byte figure is exact.
#[derive(Debug, Clone, Serialize)]
pub struct WeightEstimate {
    /// Number of parameters.
    pub parameters: u64,
    /// Storage width asked for, in bits.
    pub bits_per_parameter: u32,
    /// Bits rounded up to whole bytes.
    pub bytes_per_parameter: u64,
    /// parameters × bytes_per_parameter.
    pub weights: Bytes,
    /// The reserve as given, in GiB, exactly: a hypothesis chosen by the user, not a measured
    /// value.
    pub reserve_gib_hypothesis: PlainDecimal,
    /// The reserve in bytes (GiB × 2^30, rounded up to a whole byte).
    pub reserve: Bytes,
    /// weights + reserve.
    pub total: Bytes,
    pub rounding: &'static str,
    pub not_included: [&'static str; 6],
    pub caveat: &'static str,
}

/// What an estimate is asked for: a parameter count stored on `bits` bits each, and a reserve in
/// GiB chosen as a hypothesis (exact as written, `"1.5".parse()` or `PlainDecimal::from(4)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightQuestion {
    pub parameters: u64,
    pub bits: u32,
    pub reserve_gib: PlainDecimal,
}

impl WeightQuestion {
    /// The estimate (see [`estimate`]).
    pub fn estimate(&self) -> Result<WeightEstimate, EstimateError> {
        estimate(self.parameters, self.bits, self.reserve_gib)
    }
}

/// Computes the estimate, refusing zero parameters, absurd widths and overflow. The reserve is
/// rounded up to a whole byte: a positive reserve, however small, is at least one byte.
fn estimate(
    parameters: u64,
    bits: u32,
    reserve_gib: PlainDecimal,
) -> Result<WeightEstimate, EstimateError> {
    if parameters == 0 {
        return Err(EstimateError::ZeroParameters);
    }
    if bits == 0 || bits > MAX_BITS {
        return Err(EstimateError::Bits(bits));
    }
    let bytes_per_parameter = u64::from(bits.div_ceil(8));
    let weights = parameters
        .checked_mul(bytes_per_parameter)
        .ok_or(EstimateError::Overflow("the parameter count"))?;
    let reserve = gib_to_bytes(reserve_gib).ok_or(EstimateError::Overflow("the reserve"))?;
    let total = weights
        .checked_add(reserve)
        .ok_or(EstimateError::Overflow("the reserve"))?;
    Ok(WeightEstimate {
        parameters,
        bits_per_parameter: bits,
        bytes_per_parameter,
        weights: Bytes(weights),
        reserve_gib_hypothesis: reserve_gib,
        reserve: Bytes(reserve),
        total: Bytes(total),
        rounding: ROUNDING_RULE,
        not_included: NOT_INCLUDED,
        caveat: CAVEAT,
    })
}

impl crate::status::Classify for EstimateError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

impl WeightEstimate {
    /// The estimate as label/value rows: its text and HTML forms are both drawn from them.
    pub fn rows(&self) -> Rows {
        vec![
            ("parameters", self.parameters.to_string()),
            (
                "storage",
                format!(
                    "{} bits -> {} byte(s) per parameter (bits rounded up to whole bytes)",
                    self.bits_per_parameter, self.bytes_per_parameter
                ),
            ),
            ("weights", self.weights.to_string()),
            (
                "reserve (hypothesis)",
                format!(
                    "{} = {} GiB chosen by you, not measured",
                    self.reserve, self.reserve_gib_hypothesis
                ),
            ),
            ("total", self.total.to_string()),
        ]
    }
}

impl fmt::Display for WeightEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        rows_text(f, "Weight-memory estimate", &self.rows(), 21)?;
        writeln!(
            f,
            "Units: 1 GiB = 2^30 bytes; 1 GB = 10^9 bytes; {}.",
            self.rounding
        )?;
        writeln!(f, "Not included: {}.", self.not_included.join(", "))?;
        write!(f, "{}", self.caveat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(p: u64, bits: u32, reserve: &str) -> Result<WeightEstimate, EstimateError> {
        estimate(p, bits, reserve.parse().unwrap())
    }

    #[test]
    fn seed_example_7b_at_16_bits_with_4_gib() {
        let e = est(7_000_000_000, 16, "4").unwrap();
        assert_eq!(e.bytes_per_parameter, 2);
        assert_eq!(e.weights.0, 14_000_000_000);
        assert_eq!(e.weights.gib(2).to_string(), "13.04");
        assert_eq!(e.weights.gb(2).to_string(), "14.00");
        assert_eq!(e.reserve.0, 4 * 1024 * 1024 * 1024);
        assert_eq!(e.total.0, 18_294_967_296);
        assert_eq!(e.total.gib(2).to_string(), "17.04");
    }

    #[test]
    fn bits_round_up_to_whole_bytes() {
        for (bits, bytes) in [
            (1, 1),
            (4, 1),
            (8, 1),
            (12, 2),
            (16, 2),
            (17, 3),
            (32, 4),
            (64, 8),
        ] {
            assert_eq!(
                est(10, bits, "0").unwrap().bytes_per_parameter,
                bytes,
                "{bits} bits"
            );
        }
    }

    #[test]
    fn huge_counts_are_exact_or_refused() {
        let e = est(u64::MAX, 8, "0").unwrap();
        assert_eq!(e.weights.0, u64::MAX);
        assert_eq!(
            est(u64::MAX, 16, "0").unwrap_err(),
            EstimateError::Overflow("the parameter count")
        );
        assert_eq!(
            est(u64::MAX, 8, "1").unwrap_err(),
            EstimateError::Overflow("the reserve")
        );
        assert_eq!(
            est(1, 8, "100000000000000000000").unwrap_err(),
            EstimateError::Overflow("the reserve")
        );
    }

    #[test]
    fn bad_values_are_refused() {
        assert_eq!(est(0, 16, "0").unwrap_err(), EstimateError::ZeroParameters);
        assert_eq!(est(1, 0, "0").unwrap_err(), EstimateError::Bits(0));
        assert_eq!(est(1, 65, "0").unwrap_err(), EstimateError::Bits(65));
    }

    #[test]
    fn a_tiny_positive_reserve_is_one_byte_and_shown_as_given() {
        let e = est(1, 8, "0.00000000000000000000000000001").unwrap();
        assert_eq!(e.reserve.0, 1);
        assert_eq!(e.total.0, 2);
        assert_eq!(
            e.reserve_gib_hypothesis.to_string(),
            "0.00000000000000000000000000001"
        );
        assert!(e
            .to_string()
            .contains("0.00000000000000000000000000001 GiB chosen by you"));
    }
}
