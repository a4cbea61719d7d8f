//! The synthetic network and the passes of a measurement, as flags: what `measure`, `predict` and
//! `sweep` share, turned into a validated configuration.

use super::{values, Context};
use crate::device::CudaDevice;
use crate::measure::{Dtype, MeasureConfig};
use crate::sweep::Dimension;

/// The synthetic network and the passes of a measurement (shared by `measure`, `predict` and
/// `sweep`). Batch, context and width are required, except the one a sweep varies.
#[derive(Debug, clap::Args)]
pub struct ShapeArgs {
    /// Input batch size.
    #[arg(long, value_parser = values::positive_u64)]
    pub batch: Option<u64>,
    /// Positions per sample in the input [batch, context, width] (no attention, no KV cache).
    #[arg(long, value_parser = values::positive_u64)]
    pub context: Option<u64>,
    /// Input and output features.
    #[arg(long, value_parser = values::positive_u64)]
    pub width: Option<u64>,
    /// Hidden features [default: 4 × width].
    #[arg(long, value_parser = values::positive_u64)]
    pub hidden: Option<u64>,
    /// Element type of weights and inputs: float32, float16 or bfloat16.
    #[arg(long, value_parser = values::dtype)]
    pub dtype: Dtype,
    /// Warm-up passes, measured together in one row (0 to 10000).
    #[arg(long, value_parser = values::warmup)]
    pub warmup: u32,
    /// Warm passes measured one row each (1 to 10000).
    #[arg(long, value_parser = values::repeats)]
    pub repeats: u32,
}

impl ShapeArgs {
    /// The validated configuration on `device`; an invalid value is reported with its flag.
    pub fn config(&self, device: CudaDevice) -> Result<MeasureConfig, super::Failure> {
        self.build(None, device)
    }

    /// The configuration of a sweep over `dimension` starting at `from`: the varied dimension's
    /// own flag is refused (except `--hidden`, which the width follows when absent).
    pub fn config_varying(
        &self,
        dimension: Dimension,
        from: u64,
        device: CudaDevice,
    ) -> Result<MeasureConfig, super::Failure> {
        self.build(Some((dimension, from)), device)
    }

    fn build(
        &self,
        varying: Option<(Dimension, u64)>,
        device: CudaDevice,
    ) -> Result<MeasureConfig, super::Failure> {
        let pick = |dimension: Dimension, given: Option<u64>| -> Result<u64, super::Failure> {
            match (varying, given) {
                (Some((d, _)), Some(_)) if d == dimension => Err(FlagError(format!(
                    "--{dimension} is the dimension --vary sweeps: remove --{dimension}"
                ))
                .into()),
                (Some((d, from)), None) if d == dimension => Ok(from),
                (_, Some(v)) => Ok(v),
                (_, None) => Err(FlagError(format!("--{dimension} is required")).into()),
            }
        };
        let mut config = MeasureConfig {
            device,
            batch: pick(Dimension::Batch, self.batch)?,
            context: pick(Dimension::Context, self.context)?,
            width: pick(Dimension::Width, self.width)?,
            hidden: self.hidden,
            dtype: self.dtype,
            warmup: self.warmup,
            repeats: self.repeats,
        };
        if let Some((Dimension::Hidden, from)) = varying {
            if self.hidden.is_some() {
                return Err(FlagError(
                    "--hidden is the dimension --vary sweeps: remove --hidden".into(),
                )
                .into());
            }
            config.hidden = Some(from);
        }
        config
            .validated()
            .context("invalid --batch, --context, --width, --hidden, --warmup or --repeats")
    }
}

/// A flag missing or given where it must not be.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

impl crate::status::Classify for FlagError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}
