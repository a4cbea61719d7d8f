//! The libtorch backend of IteraGPU Lab: the synthetic network on a CUDA GPU through `tch`, the
//! caching allocator's own figures through a small C++ shim (`csrc/allocator_shim.{h,cpp}`), and
//! the environment probe. It implements the library's [`Gpu`] trait; the companion program
//! `mesure_memoire_torch` hands it to the command line. All `unsafe` code is in `ffi.rs`.

mod allocator;
mod backend;
mod blocks;
mod environment;
mod ffi;
mod probe;

pub use allocator::{open_device, Allocator};
pub use backend::TorchBackend;
pub use environment::environment;
pub use ffi::MemoryStats;
pub use probe::Probe;

use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::environment::EnvironmentReport;
use iteragpu_lab::measure::{
    run_protocol, Gpu, MeasureConfig, MeasureError, Measurement, PhaseRecord,
};

/// Re-exported so that notebooks can make tensors with the same libtorch.
pub use tch;

fn torch_err(e: tch::TchError) -> MeasureError {
    MeasureError::from_torch_message(&e.to_string())
}

fn shim_err(message: String) -> MeasureError {
    MeasureError::from_torch_message(&message)
}

/// The GPU through libtorch in this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct TorchGpu;

impl Gpu for TorchGpu {
    fn environment(&self, device: Option<CudaDevice>) -> EnvironmentReport {
        environment(device)
    }

    fn measure(
        &self,
        config: &MeasureConfig,
        blocks: bool,
        on_phase: &mut dyn FnMut(&PhaseRecord),
    ) -> Result<Measurement, MeasureError> {
        let mut backend = TorchBackend::open(config, blocks)?;
        let phases = run_protocol(&mut backend, config.warmup, config.repeats, on_phase)?;
        drop(backend);
        let environment = environment(Some(config.device));
        Ok(Measurement::new(environment, config.clone(), phases)?)
    }
}

/// Measures a validated `config` on its GPU in this process (see [`TorchGpu`]).
pub fn measure(config: &MeasureConfig) -> Result<Measurement, MeasureError> {
    TorchGpu.measure(config, false, &mut |_| {})
}
