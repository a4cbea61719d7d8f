//! A measurement's configuration, validated once: sizes, dtype, passes, and the synthetic
//! `Linear -> GELU -> Linear` network it implies (its parameter count and bytes, exact).

use crate::device::CudaDevice;
use crate::dtype::Dtype;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// The most warm-up passes or repetitions one bounded measurement accepts.
pub const MAX_PASSES: u32 = 10_000;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{0} must be a positive integer, got 0")]
    Zero(&'static str),
    #[error("repeats must be at least 1")]
    NoRepeats,
    #[error("{field} must be at most {MAX_PASSES} (a measurement is bounded), got {value}")]
    TooManyPasses { field: &'static str, value: u32 },
    #[error(
        "the requested sizes overflow: {what} would need more than 2^62 elements or bytes; \
         reduce batch, context, width or hidden"
    )]
    TooLarge { what: &'static str },
    #[error("dtype must be float32, float16 or bfloat16, got {0}")]
    NotFloat(Dtype),
}

impl crate::status::Classify for ConfigError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// Everything that defines one measurement run. The default is the seed's first, small run
/// (`--batch 1 --context 16 --width 64 --dtype float32 --warmup 1 --repeats 2` on `cuda:0`);
/// change fields by name and call [`MeasureConfig::validated`]:
/// `MeasureConfig { width: 1024, ..Default::default() }.validated()?`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasureConfig {
    /// The measured GPU, `cuda:N`.
    pub device: CudaDevice,
    /// Leading dimension of the input `[batch, context, width]`.
    pub batch: u64,
    /// Positions per sample (no attention, no KV cache).
    pub context: u64,
    /// Input and output features of the network.
    pub width: u64,
    /// Hidden features between the two linear layers; `None` means 4 × width, and a validated
    /// configuration always holds the number.
    pub hidden: Option<u64>,
    /// Element type of weights, inputs and outputs.
    pub dtype: Dtype,
    /// Warm-up passes, measured together in one `warmup` row (0 allowed: the row then runs none).
    pub warmup: u32,
    /// Timed warm passes, one `warm_forward` row each.
    pub repeats: u32,
}

impl Default for MeasureConfig {
    fn default() -> MeasureConfig {
        MeasureConfig {
            device: CudaDevice { index: 0 },
            batch: 1,
            context: 16,
            width: 64,
            hidden: None,
            dtype: Dtype::Float32,
            warmup: 1,
            repeats: 2,
        }
    }
}

/// The synthetic network's shape and size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SyntheticModel {
    pub architecture: String,
    pub in_features: u64,
    pub hidden_features: u64,
    pub out_features: u64,
    /// Weights and biases of both layers.
    pub parameters: u64,
    /// parameters × bytes per element of `dtype`.
    pub parameter_bytes: u64,
    pub dtype: Dtype,
    /// Bytes of the input tensor `[batch, context, width]`.
    pub input_bytes: u64,
    /// Bytes of one hidden activation `[batch, context, hidden]`.
    pub hidden_activation_bytes: u64,
}

const LIMIT: u64 = 1 << 62;

fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, ConfigError> {
    a.checked_mul(b)
        .filter(|v| *v <= LIMIT)
        .ok_or(ConfigError::TooLarge { what })
}

impl MeasureConfig {
    /// Checks every field and fills `hidden` (4 × width when unset).
    pub fn validated(mut self) -> Result<MeasureConfig, ConfigError> {
        for (field, v) in [
            ("batch", self.batch),
            ("context", self.context),
            ("width", self.width),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(field));
            }
        }
        if self.hidden == Some(0) {
            return Err(ConfigError::Zero("hidden"));
        }
        if self.repeats == 0 {
            return Err(ConfigError::NoRepeats);
        }
        if !self.dtype.is_float() {
            return Err(ConfigError::NotFloat(self.dtype));
        }
        for (field, value) in [("warmup", self.warmup), ("repeats", self.repeats)] {
            if value > MAX_PASSES {
                return Err(ConfigError::TooManyPasses { field, value });
            }
        }
        if self.hidden.is_none() {
            self.hidden = Some(mul(self.width, 4, "the default hidden size (4 × width)")?);
        }
        self.model()?;
        Ok(self)
    }

    /// Hidden features: the number given, else 4 × width (saturating; validation refuses overflow).
    pub fn hidden(&self) -> u64 {
        self.hidden.unwrap_or(self.width.saturating_mul(4))
    }

    /// The network this configuration builds, with exact sizes (checked for overflow).
    pub fn model(&self) -> Result<SyntheticModel, ConfigError> {
        let e = self.dtype.bytes();
        let hidden = self.hidden();
        let weights = mul(self.width, hidden, "a weight matrix (width × hidden)")?;
        let parameters = weights
            .checked_mul(2)
            .and_then(|w| w.checked_add(hidden))
            .and_then(|w| w.checked_add(self.width))
            .filter(|v| *v <= LIMIT)
            .ok_or(ConfigError::TooLarge {
                what: "the parameter count",
            })?;
        let rows = mul(self.batch, self.context, "batch × context")?;
        Ok(SyntheticModel {
            architecture: "Linear(width -> hidden) -> GELU -> Linear(hidden -> width)".into(),
            in_features: self.width,
            hidden_features: hidden,
            out_features: self.width,
            parameters,
            parameter_bytes: mul(parameters, e, "the parameter bytes")?,
            dtype: self.dtype,
            input_bytes: mul(mul(rows, self.width, "the input")?, e, "the input bytes")?,
            hidden_activation_bytes: mul(
                mul(rows, hidden, "the hidden activation")?,
                e,
                "the hidden activation bytes",
            )?,
        })
    }
}

impl SyntheticModel {
    pub fn parameter_size(&self) -> Bytes {
        Bytes(self.parameter_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(b: u64, c: u64, w: u64, h: Option<u64>) -> Result<MeasureConfig, ConfigError> {
        MeasureConfig {
            batch: b,
            context: c,
            width: w,
            hidden: h,
            ..Default::default()
        }
        .validated()
    }

    #[test]
    fn seed_small_configuration_sizes() {
        let c = MeasureConfig::default().validated().unwrap();
        assert_eq!(c.hidden, Some(256));
        let m = c.model().unwrap();
        assert_eq!(m.hidden_features, 256);
        assert_eq!(m.parameters, 64 * 256 * 2 + 256 + 64);
        assert_eq!(m.parameter_bytes, m.parameters * 4);
        assert_eq!(m.input_bytes, 16 * 64 * 4);
        assert_eq!(m.hidden_activation_bytes, 16 * 256 * 4);
    }

    #[test]
    fn zero_and_overflowing_sizes_are_refused() {
        assert_eq!(cfg(0, 1, 1, None).unwrap_err(), ConfigError::Zero("batch"));
        assert_eq!(
            cfg(1, 0, 1, None).unwrap_err(),
            ConfigError::Zero("context")
        );
        assert_eq!(cfg(1, 1, 0, None).unwrap_err(), ConfigError::Zero("width"));
        assert_eq!(
            cfg(1, 1, 1, Some(0)).unwrap_err(),
            ConfigError::Zero("hidden")
        );
        assert!(matches!(
            cfg(1, 1, u64::MAX / 2, None),
            Err(ConfigError::TooLarge { .. })
        ));
        assert!(matches!(
            cfg(1 << 40, 1 << 30, 2, None),
            Err(ConfigError::TooLarge { .. })
        ));
        let no_repeats = MeasureConfig {
            warmup: 0,
            repeats: 0,
            ..Default::default()
        };
        assert_eq!(no_repeats.validated().unwrap_err(), ConfigError::NoRepeats);
        let unbounded = MeasureConfig {
            warmup: MAX_PASSES + 1,
            ..Default::default()
        };
        assert_eq!(
            unbounded.validated().unwrap_err().to_string(),
            "warmup must be at most 10000 (a measurement is bounded), got 10001"
        );
    }

    #[test]
    fn dtypes_read_and_print_their_names() {
        for d in Dtype::FLOATS {
            assert_eq!(Dtype::float(d.name()), Ok(d));
        }
        assert!(Dtype::float("float64").unwrap_err().contains("float64"));
        let integers = MeasureConfig {
            dtype: Dtype::Int64,
            ..Default::default()
        };
        assert_eq!(
            integers.validated().unwrap_err().to_string(),
            "dtype must be float32, float16 or bfloat16, got int64"
        );
    }
}
