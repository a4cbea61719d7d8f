//! Bounded, phase-by-phase GPU memory measurement of the synthetic network: its configuration,
//! the protocol (behind the [`Backend`] a GPU implements), the result file, and the allocator
//! model's prediction of every row ([`predict`]). No fake measurement: without libtorch or a GPU
//! it fails with exit code 2.

mod config;
pub mod predict;
mod protocol;
pub mod report;
mod table;

pub use crate::dtype::Dtype;
pub use config::{ConfigError, MeasureConfig, SyntheticModel, MAX_PASSES};
pub use predict::{predict, PhasePrediction, PredictError, Prediction};
pub use protocol::{run_protocol, Backend, PhaseBlocks, PhaseRecord, RowPrediction};
pub use report::{Measurement, SCHEMA};
pub use table::{phase_cells, PHASE_COLUMNS};

use crate::reading::Phase;
use crate::status::{Classify, Status};

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(
        "this program does not link libtorch and its GPU companion `{companion}` was not found \
         beside it; build both with scripts/build — nothing was measured, no file written"
    )]
    NoCompanion { companion: String },
    #[error("libtorch could not be loaded: {0} — nothing was measured, no file written")]
    LibtorchNotLoadable(String),
    #[error("no usable GPU: {0} — nothing was measured, no file written, no CPU fallback")]
    NoGpu(String),
    /// The GPU process found no usable GPU or libtorch (its exit 2), said in its own words.
    #[error("{0}")]
    Unavailable(String),
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
    /// A failure inside a stage of the transformer bench (out of memory, a libtorch error), with
    /// the stage's name; the failure keeps its own exit status.
    #[error("during stage `{stage}` of the transformer bench")]
    InStage {
        stage: String,
        #[source]
        error: Box<MeasureError>,
    },
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

    /// Attaches the transformer bench stage in which the error happened.
    pub fn in_stage(self, stage: &str) -> MeasureError {
        match self {
            already @ MeasureError::InStage { .. } => already,
            error => MeasureError::InStage {
                stage: stage.into(),
                error: Box::new(error),
            },
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
            MeasureError::NoCompanion { .. }
            | MeasureError::LibtorchNotLoadable(_)
            | MeasureError::NoGpu(_)
            | MeasureError::Unavailable(_)
            | MeasureError::DeviceMissing { .. } => Status::Unavailable,
            MeasureError::OutOfMemory { .. } => Status::OutOfMemory,
            MeasureError::Torch { .. } => Status::Failure,
            MeasureError::Config(_) => Status::Usage,
            MeasureError::InStage { error, .. } => error.status(),
        }
    }
}
