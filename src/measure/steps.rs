//! A log of allocator readings taken after named steps (allocate, free, a matrix product,
//! `empty_cache`...): what the live lesson records after each step (`allocator::lesson`) and the
//! allocator model predicts; `display` and `plot` draw it.

use serde::{Deserialize, Serialize};

/// Readings after one step, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReading {
    pub step: String,
    pub allocated: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Bytes the code asked for, before the allocator's rounding.
    pub requested: u64,
    /// Device memory segments the allocator holds.
    pub segments: u64,
    /// Device memory in use on the whole GPU, from `cudaMemGetInfo` (total − free): what
    /// `nvidia-smi` shows, all processes included; `None` in a prediction (the model sees only
    /// the allocator).
    pub runtime_used: Option<u64>,
}

/// The readings of a sequence of steps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLog {
    pub steps: Vec<StepReading>,
    /// Where the figures come from (measured here, recorded elsewhere, predicted), said above
    /// them.
    #[serde(default)]
    pub source: Option<String>,
}
