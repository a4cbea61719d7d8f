//! The transformer bench on a CUDA GPU: [`TransformerBench`] for [`TorchGpu`]. A Llama-style
//! decoder-only model of the run's shape is built directly on the GPU and run stage by stage
//! (inference, full training or LoRA), each stage read from the caching allocator.

mod adamw;
mod decoder;
mod inference;
mod model;
mod stages;
mod training;

use crate::{environment, Allocator, TorchGpu};
use iteragpu_lab::budget::{BenchFailure, BenchMode, BenchReport, BenchRun, TransformerBench};
use stages::Stages;
use tch::{TchError, Tensor};

/// Ends an in-place operation: tch returns a second handle to the tensor it changed, dropped here.
fn in_place(result: Result<Tensor, TchError>) -> Result<(), TchError> {
    result.map(drop)
}

impl TransformerBench for TorchGpu {
    fn run(&self, run: &BenchRun) -> Result<BenchReport, BenchFailure> {
        let run = run.clone().validated()?;
        let allocator = Allocator::open(run.device)?;
        tch::manual_seed(0);
        let mut stages = Stages::new(&allocator, run.blocks);
        match run.mode {
            BenchMode::Inference => inference::run(&run, &mut stages, allocator.device())?,
            BenchMode::Full | BenchMode::Lora => {
                training::run(&run, &mut stages, allocator.device())?
            }
        }
        // Every tensor of the run is dropped by now: give the cached blocks back.
        let readings = stages.finish(run.mode)?;
        allocator.empty_cache()?;
        let environment = environment(Some(run.device));
        Ok(BenchReport::new(run, environment, readings))
    }
}
