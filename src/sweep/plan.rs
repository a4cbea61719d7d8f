//! Which values a sweep measures: the varied dimension, the range and the spacing, validated once.

use crate::measure::MeasureConfig;
use serde::{Deserialize, Serialize};

/// The dimension a sweep varies.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "lowercase",
    parse_err_fn = unknown_dimension,
    parse_err_ty = String
)]
pub enum Dimension {
    Batch,
    Context,
    Width,
    Hidden,
}

fn unknown_dimension(s: &str) -> String {
    format!("unknown dimension `{s}`; expected batch, context, width or hidden")
}

impl Dimension {
    pub const ALL: &'static [Dimension] = <Dimension as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// This dimension's value in `config`.
    pub fn value_of(self, config: &MeasureConfig) -> u64 {
        match self {
            Dimension::Batch => config.batch,
            Dimension::Context => config.context,
            Dimension::Width => config.width,
            Dimension::Hidden => config.hidden(),
        }
    }

    /// `base` with this dimension set to `value`.
    pub fn apply(self, base: &MeasureConfig, value: u64) -> MeasureConfig {
        let mut c = base.clone();
        match self {
            Dimension::Batch => c.batch = value,
            Dimension::Context => c.context = value,
            Dimension::Width => {
                // The hidden layer follows the width unless it was fixed.
                if base.hidden.is_none() {
                    c.hidden = None;
                }
                c.width = value
            }
            Dimension::Hidden => c.hidden = Some(value),
        }
        c
    }
}

/// How the values between `from` and `to` are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Spacing {
    /// This many values, evenly spaced, both ends included (rounded to whole numbers, repeats removed).
    Steps(u32),
    /// `from`, `from + step`, ... up to `to`.
    Step(u64),
    /// `from`, `2 × from`, `4 × from`, ... up to `to`, and `to` itself.
    Geometric,
}

/// The most points one sweep plans.
pub const MAX_POINTS: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the range is empty: from {from} is above to {to}")]
    Empty { from: u64, to: u64 },
    #[error("the values start at 1: from is 0")]
    Zero,
    #[error("a sweep needs at least 1 step")]
    NoSteps,
    #[error("the step must be at least 1")]
    ZeroStep,
    #[error("the sweep would have {0} points; at most {MAX_POINTS}")]
    TooMany(u128),
}

impl crate::status::Classify for PlanError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// The values of a sweep, in increasing order.
pub fn values(from: u64, to: u64, spacing: Spacing) -> Result<Vec<u64>, PlanError> {
    if from == 0 {
        return Err(PlanError::Zero);
    }
    if from > to {
        return Err(PlanError::Empty { from, to });
    }
    let span = u128::from(to - from);
    let mut v: Vec<u64> = match spacing {
        Spacing::Steps(0) => return Err(PlanError::NoSteps),
        Spacing::Steps(1) => vec![from],
        Spacing::Steps(k) => {
            if k as usize > MAX_POINTS {
                return Err(PlanError::TooMany(k.into()));
            }
            let k = u128::from(k);
            // Rounded half up, in integers: from + round(i × span / (k − 1)).
            (0..k)
                .map(|i| from + ((2 * i * span + (k - 1)) / (2 * (k - 1))) as u64)
                .collect()
        }
        Spacing::Step(0) => return Err(PlanError::ZeroStep),
        Spacing::Step(s) => {
            let n = span / u128::from(s) + 1;
            if n > MAX_POINTS as u128 {
                return Err(PlanError::TooMany(n));
            }
            (0..n as u64).map(|i| from + i * s).collect()
        }
        Spacing::Geometric => {
            let mut v = Vec::new();
            let mut x = from;
            while x <= to {
                v.push(x);
                match x.checked_mul(2) {
                    Some(next) => x = next,
                    None => break,
                }
            }
            v.push(to);
            v
        }
    };
    v.dedup();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spacings() {
        assert_eq!(values(1, 10, Spacing::Steps(4)).unwrap(), [1, 4, 7, 10]);
        assert_eq!(values(1, 3, Spacing::Steps(10)).unwrap(), [1, 2, 3]);
        assert_eq!(values(5, 5, Spacing::Steps(3)).unwrap(), [5]);
        assert_eq!(values(2, 9, Spacing::Step(3)).unwrap(), [2, 5, 8]);
        assert_eq!(
            values(3, 40, Spacing::Geometric).unwrap(),
            [3, 6, 12, 24, 40]
        );
        assert_eq!(values(1, 8, Spacing::Geometric).unwrap(), [1, 2, 4, 8]);
    }

    #[test]
    fn bad_ranges_are_refused() {
        assert_eq!(
            values(5, 4, Spacing::Steps(3)),
            Err(PlanError::Empty { from: 5, to: 4 })
        );
        assert_eq!(values(0, 4, Spacing::Steps(3)), Err(PlanError::Zero));
        assert_eq!(values(1, 4, Spacing::Steps(0)), Err(PlanError::NoSteps));
        assert_eq!(values(1, 4, Spacing::Step(0)), Err(PlanError::ZeroStep));
        assert!(matches!(
            values(1, u64::MAX, Spacing::Step(1)),
            Err(PlanError::TooMany(_))
        ));
        assert!("depth".parse::<Dimension>().unwrap_err().contains("depth"));
    }
}
