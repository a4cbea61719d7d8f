//! What a Hugging Face process holds on the GPU outside PyTorch's caching allocator: the CUDA
//! context, the kernels libtorch and the libraries load, cuBLAS/cuBLASLt and cuDNN handles.
//! Measured (`torch.cuda.mem_get_info` − `memory_reserved`, one process alone on the GPU) in
//! the kind of process the budget describes, on a named GPU and software: not a formula.

use serde::{Deserialize, Serialize};

/// The memory outside the allocator of one kind of process, as measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideAllocator {
    /// After `generate` (prefill and decode).
    pub inference_bytes: u64,
    /// After a training step (forward, backward on autograd's thread, optimizer).
    pub training_bytes: u64,
    pub measured_on: String,
    pub software: String,
    pub source: String,
}

impl OutsideAllocator {
    /// Recorded on the H200 by `scripts/gpu/hf-proof.py` (`docs/benchmarks.md`, "Fit verdicts on
    /// the real card"): the largest figure over the proof's inference runs, and over its
    /// training runs.
    pub fn h200() -> OutsideAllocator {
        OutsideAllocator {
            inference_bytes: 780_806_389,
            training_bytes: 804_881_694,
            measured_on: "NVIDIA H200".into(),
            software: "PyTorch 2.11.0+cu130, transformers 5.17.0, driver 580.159.04".into(),
            source: "docs/benchmarks.md, Fit verdicts on the real card".into(),
        }
    }

    pub fn for_mode(&self, trains: bool) -> u64 {
        if trains {
            self.training_bytes
        } else {
            self.inference_bytes
        }
    }
}
