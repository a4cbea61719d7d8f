//! A measurement's configuration, validated once: sizes, dtype, passes, and the synthetic
//! `Linear -> GELU -> Linear` network it implies (its parameter count and bytes, exact).

use crate::device::CudaDevice;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// Element types a measurement runs in; weights and inputs share it (no autocast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Float32,
    Float16,
    Bfloat16,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Float32 => 4,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Float16 => "float16",
            Dtype::Bfloat16 => "bfloat16",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--{0} must be a positive integer, got 0")]
    Zero(&'static str),
    #[error("--repeats must be at least 1")]
    NoRepeats,
    #[error(
        "the requested sizes overflow: {what} would need more than 2^62 elements or bytes; \
             reduce --batch, --context, --width or --hidden"
    )]
    TooLarge { what: &'static str },
}

/// Everything that defines one measurement run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasureConfig {
    /// The measured GPU, `cuda:N`.
    pub device: CudaDevice,
    /// Leading dimension of the input `[batch, context, width]`.
    pub batch: u64,
    /// Positions per sample (no attention, no KV cache).
    pub context: u64,
    /// Input and output features of the network.
    pub width: u64,
    /// Hidden features between the two linear layers (default 4 × width).
    pub hidden: u64,
    /// Element type of weights, inputs and outputs.
    pub dtype: Dtype,
    /// Warm-up passes, measured together in one `warmup` row (0 allowed: the row then runs none).
    pub warmup: u32,
    /// Timed warm passes, one `warm_forward` row each.
    pub repeats: u32,
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
    /// Validates sizes; `hidden` defaults to 4 × `width`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: CudaDevice,
        batch: u64,
        context: u64,
        width: u64,
        hidden: Option<u64>,
        dtype: Dtype,
        warmup: u32,
        repeats: u32,
    ) -> Result<MeasureConfig, ConfigError> {
        for (flag, v) in [("batch", batch), ("context", context), ("width", width)] {
            if v == 0 {
                return Err(ConfigError::Zero(flag));
            }
        }
        if hidden == Some(0) {
            return Err(ConfigError::Zero("hidden"));
        }
        if repeats == 0 {
            return Err(ConfigError::NoRepeats);
        }
        let hidden = match hidden {
            Some(h) => h,
            None => mul(width, 4, "the default hidden size (4 × width)")?,
        };
        let config = MeasureConfig {
            device,
            batch,
            context,
            width,
            hidden,
            dtype,
            warmup,
            repeats,
        };
        config.model()?;
        Ok(config)
    }

    /// The network this configuration builds, with exact sizes (checked for overflow).
    pub fn model(&self) -> Result<SyntheticModel, ConfigError> {
        let e = self.dtype.bytes();
        let weights = mul(self.width, self.hidden, "a weight matrix (width × hidden)")?;
        let parameters = weights
            .checked_mul(2)
            .and_then(|w| w.checked_add(self.hidden + self.width))
            .filter(|v| *v <= LIMIT)
            .ok_or(ConfigError::TooLarge {
                what: "the parameter count",
            })?;
        let rows = mul(self.batch, self.context, "batch × context")?;
        Ok(SyntheticModel {
            architecture: "Linear(width -> hidden) -> GELU -> Linear(hidden -> width)".into(),
            in_features: self.width,
            hidden_features: self.hidden,
            out_features: self.width,
            parameters,
            parameter_bytes: mul(parameters, e, "the parameter bytes")?,
            dtype: self.dtype,
            input_bytes: mul(mul(rows, self.width, "the input")?, e, "the input bytes")?,
            hidden_activation_bytes: mul(
                mul(rows, self.hidden, "the hidden activation")?,
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
        MeasureConfig::new(CudaDevice { index: 0 }, b, c, w, h, Dtype::Float32, 1, 2)
    }

    #[test]
    fn seed_small_configuration_sizes() {
        let m = cfg(1, 16, 64, None).unwrap().model().unwrap();
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
        let r = MeasureConfig::new(CudaDevice { index: 0 }, 1, 1, 1, None, Dtype::Float16, 0, 0);
        assert_eq!(r.unwrap_err(), ConfigError::NoRepeats);
    }
}
