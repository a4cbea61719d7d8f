//! The libtorch backend of IteraGPU Lab: the synthetic network on a CUDA GPU through `tch`, the
//! caching allocator's own figures through a small C++ shim (`csrc/allocator_shim.{h,cpp}`), the
//! environment probe, and the allocator lesson ([`lesson`]). It implements the library's [`Gpu`]
//! trait; the companion program
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
pub use probe::{lesson, Probe};

use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::environment::EnvironmentReport;
use iteragpu_lab::gpu::Gpu;
use iteragpu_lab::measure::{run_protocol, MeasureConfig, MeasureError, Measurement, PhaseRecord};

/// Re-exported so that notebooks can make tensors with the same libtorch.
pub use tch;

fn torch_err(e: tch::TchError) -> MeasureError {
    MeasureError::from_torch_message(&e.to_string())
}

fn shim_err(message: String) -> MeasureError {
    MeasureError::from_torch_message(&message)
}

/// When this process was started by a program of the project (which names itself in
/// `IGL_PARENT_PID`), makes it die with that program: a killed front or sweep never leaves a GPU
/// process behind. Returns `false` when the parent is already gone (then exit at once).
pub fn follow_parent() -> bool {
    match std::env::var(iteragpu_lab::companion::PARENT_VARIABLE)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        Some(parent) => ffi::die_with_parent(parent),
        None => true,
    }
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
        // Free memory once CUDA has started here, before anything is allocated: with the free
        // memory at the end, it tells what the libraries took outside the allocator.
        let (free_at_start, _) = backend.runtime_free_total()?;
        let phases = run_protocol(&mut backend, config.warmup, config.repeats, on_phase)?;
        drop(backend);
        let environment = environment(Some(config.device));
        let mut m = Measurement::new(environment, config.clone(), phases)?;
        m.runtime_free_at_start_bytes = Some(free_at_start.0);
        Ok(m)
    }

    fn lesson(
        &self,
        device: CudaDevice,
        script: &iteragpu_lab::lesson::LessonScript,
        configuration: Option<String>,
    ) -> Result<iteragpu_lab::lesson::LessonRecord, MeasureError> {
        lesson(device, script, configuration)
    }
}

/// Measures a validated `config` on its GPU in this process (see [`TorchGpu`]).
pub fn measure(config: &MeasureConfig) -> Result<Measurement, MeasureError> {
    TorchGpu.measure(config, false, &mut |_| {})
}
