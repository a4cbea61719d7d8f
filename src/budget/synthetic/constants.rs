//! Per-GPU constants that no formula gives: memory a process uses outside the caching allocator
//! (CUDA context, driver, cuBLAS's own handle memory). Measured, on a named GPU, and said so.

use serde::{Deserialize, Serialize};

/// What one process holds on a GPU before its first tensor, measured on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuConstants {
    /// The GPU the figures were recorded on.
    pub recorded_on: String,
    /// The software they were recorded with.
    pub software: String,
    /// The CUDA context and libtorch's kernels: in use (total − free) after CUDA starts, outside
    /// the allocator.
    pub cuda_context_bytes: u64,
    /// What cuBLAS then takes outside the allocator when its handle is created.
    pub libraries_bytes: u64,
    /// Where the measurement is recorded.
    pub source: String,
}

/// Recorded on the H200 by the notebook proof (`docs/benchmarks.md`, "The notebooks on the GPU"):
/// 552 402 944 bytes in use outside the allocator after CUDA starts, 718 077 952 after cuBLAS.
pub fn h200() -> GpuConstants {
    GpuConstants {
        recorded_on: "NVIDIA H200".into(),
        software: "PyTorch/libtorch 2.11.0+cu130, driver 580.159.04".into(),
        cuda_context_bytes: 552_402_944,
        libraries_bytes: 718_077_952 - 552_402_944,
        source: "docs/benchmarks.md, The notebooks on the GPU".into(),
    }
}
