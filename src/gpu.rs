//! The trait a GPU backend implements: the environment report, the measurement protocol and the
//! allocator lesson, each on a real GPU. The libtorch backend (crate
//! `iteragpu-torch`) implements it and the program that links it hands it to the command line;
//! this crate never links libtorch.

use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
use crate::lesson::{LessonRecord, LessonScript};
use crate::measure::{MeasureConfig, MeasureError, Measurement, PhaseRecord};

/// A way to reach a GPU.
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
    /// Runs the allocator lesson `script` on `device` and records the figures, the allocator's
    /// statistics and its map after every step; `configuration` is `PYTORCH_CUDA_ALLOC_CONF` as
    /// this process saw it (recorded as it is). A backend that does not run it says so (exit 2).
    fn lesson(
        &self,
        device: CudaDevice,
        script: &LessonScript,
        configuration: Option<String>,
    ) -> Result<LessonRecord, MeasureError> {
        let _ = (device, script, configuration);
        Err(MeasureError::NoGpu(
            "this GPU backend does not run the allocator lesson".into(),
        ))
    }
}
