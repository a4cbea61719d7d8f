//! Bounded, phase-by-phase GPU memory measurement of the synthetic network: configuration,
//! protocol, result file. No fake measurement: without libtorch or a GPU it fails with exit code 2.

mod config;
mod protocol;
pub mod report;
mod steps;

pub use config::{ConfigError, Dtype, MeasureConfig, SyntheticModel, MAX_PASSES};
pub use protocol::{
    run_protocol, AllocatorReading, Backend, DeviceStats, Phase, PhaseBlocks, PhaseRecord,
    RowPrediction,
};
pub use report::{phase_cells, Measurement, Shown, PHASE_COLUMNS, SCHEMA};
pub use steps::{StepLog, StepReading};

use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
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
    /// A transformer bench run refused before any GPU work (`budget::bench`).
    #[error(transparent)]
    Bench(#[from] crate::budget::BenchError),
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
            | MeasureError::DeviceMissing { .. } => Status::Unavailable,
            MeasureError::OutOfMemory { .. } => Status::OutOfMemory,
            MeasureError::Torch { .. } => Status::Failure,
            MeasureError::Config(_) | MeasureError::Bench(_) => Status::Usage,
            MeasureError::InStage { error, .. } => error.status(),
        }
    }
}

/// A way to reach a GPU: the libtorch backend (crate `iteragpu-torch`) implements it, and the
/// program that links it hands it to the command line. This crate never links libtorch.
pub trait Gpu {
    /// The environment report, with the GPU `device` when it is usable.
    fn environment(&self, device: Option<CudaDevice>) -> EnvironmentReport;
    /// Runs the protocol for a validated `config` and returns the full result (not yet written);
    /// with `blocks`, each row also holds the allocator's block map at its end and its peak.
    /// `on_phase` is told after each phase row.
    fn measure(
        &self,
        config: &MeasureConfig,
        blocks: bool,
        on_phase: &mut dyn FnMut(&PhaseRecord),
    ) -> Result<Measurement, MeasureError>;
    /// The transformer bench on this GPU, where this backend runs it.
    fn transformer(&self) -> Option<&dyn crate::budget::TransformerBench> {
        None
    }
    /// Runs the allocator lesson `script` on `device` and records the figures, the allocator's
    /// statistics and its map after every step; `configuration` is `PYTORCH_CUDA_ALLOC_CONF` as
    /// this process saw it (recorded as it is). A backend that does not run it says so (exit 2).
    fn lesson(
        &self,
        device: CudaDevice,
        script: &crate::allocator::lesson::LessonScript,
        configuration: Option<String>,
    ) -> Result<crate::allocator::lesson::LessonRecord, MeasureError> {
        let _ = (device, script, configuration);
        Err(MeasureError::NoGpu(
            "this GPU backend does not run the allocator lesson".into(),
        ))
    }
}
