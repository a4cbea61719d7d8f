//! Bounded, phase-by-phase GPU memory measurement of the synthetic network: configuration,
//! protocol, result file. No fake measurement: without libtorch or a GPU it fails with exit code 2.

mod config;
mod protocol;
pub mod report;

pub use config::{ConfigError, Dtype, MeasureConfig, SyntheticModel};
pub use protocol::{run_protocol, AllocatorReading, Backend, Phase, PhaseRecord};
pub use report::{phase_cells, Measurement, PHASE_COLUMNS, SCHEMA};

use crate::exit::{Classify, Status};

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(
        "this program was built without libtorch, so it cannot measure; build it with \
         `--features torch` (scripts/lab does) — nothing was measured, no file written"
    )]
    TorchNotBuilt,
    #[error("libtorch could not be loaded: {0} — nothing was measured, no file written")]
    LibtorchNotLoadable(String),
    #[error("no usable GPU: {0} — nothing was measured, no file written, no CPU fallback")]
    NoGpu(String),
    #[error(
        "device cuda:{index} does not exist: {count} CUDA device(s) visible — nothing was \
         measured, no file written"
    )]
    DeviceMissing { index: u32, count: u32 },
    #[error(
        "CUDA ran out of memory{}: {message} — no measurement file written; reduce one dimension",
        phase.map(|p| format!(" during phase `{}`", p.name())).unwrap_or_default()
    )]
    OutOfMemory {
        phase: Option<Phase>,
        message: String,
    },
    #[error(
        "libtorch failed{}: {message}",
        phase.map(|p| format!(" during phase `{}`", p.name())).unwrap_or_default()
    )]
    Torch {
        phase: Option<Phase>,
        message: String,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl MeasureError {
    /// Attaches the phase in which the error happened.
    pub fn in_phase(self, p: Phase) -> MeasureError {
        match self {
            MeasureError::OutOfMemory { message, .. } => MeasureError::OutOfMemory {
                phase: Some(p),
                message,
            },
            MeasureError::Torch { message, .. } => MeasureError::Torch {
                phase: Some(p),
                message,
            },
            other => other,
        }
    }

    /// Classifies a libtorch error message: out-of-memory or other failure.
    pub fn from_torch_message(message: &str) -> MeasureError {
        let first = message.lines().next().unwrap_or(message).to_string();
        if message.contains("out of memory") {
            MeasureError::OutOfMemory {
                phase: None,
                message: first,
            }
        } else {
            MeasureError::Torch {
                phase: None,
                message: first,
            }
        }
    }
}

impl Classify for MeasureError {
    fn status(&self) -> Status {
        match self {
            MeasureError::TorchNotBuilt
            | MeasureError::LibtorchNotLoadable(_)
            | MeasureError::NoGpu(_)
            | MeasureError::DeviceMissing { .. } => Status::Unavailable,
            MeasureError::OutOfMemory { .. } => Status::OutOfMemory,
            MeasureError::Torch { .. } => Status::Failure,
            MeasureError::Config(_) => Status::Usage,
        }
    }
}

/// Measures `config` on its GPU through libtorch and returns the full result (not yet written).
/// `on_phase` is told after each phase row.
#[cfg(feature = "torch")]
pub fn measure(
    config: &MeasureConfig,
    on_phase: impl FnMut(&PhaseRecord),
) -> Result<Measurement, MeasureError> {
    let mut backend = crate::torch::TorchBackend::open(config)?;
    let phases = run_protocol(&mut backend, config.warmup, config.repeats, on_phase)?;
    drop(backend);
    let environment = crate::environment::EnvironmentReport::collect(Some(config.device));
    Ok(Measurement::new(environment, config.clone(), phases)?)
}

/// Without the `torch` feature there is nothing to measure with: always exit code 2.
#[cfg(not(feature = "torch"))]
pub fn measure(
    _config: &MeasureConfig,
    _on_phase: impl FnMut(&PhaseRecord),
) -> Result<Measurement, MeasureError> {
    Err(MeasureError::TorchNotBuilt)
}
