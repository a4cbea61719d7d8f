//! Capacity sweeps: one dimension of the synthetic network varied over a range, each point
//! measured in its own fresh process (the cache and the allocator's retry-after-free of one point
//! never reach the next), every row written atomically to `FOLDER/sweep.csv` beside the model's
//! prediction, and the largest value that fits found by prediction first, then verified on both
//! sides by measurement (bisection when the prediction is wrong).
//!
//! The points run through a [`PointRunner`]: the command line's runs the GPU companion program;
//! tests use a simulated one.

mod limit;
mod plan;
mod record;

pub use limit::{find_limit, Capacity, LimitSearch};
pub use plan::{values, Dimension, PlanError, Spacing, MAX_POINTS};
pub use record::{
    csv_header, libraries_outside_allocator, Sweep, SweepError, SweepRow, SweepSummary, CSV_FILE,
    SUMMARY_FILE,
};

use crate::measure::{MeasureConfig, Measurement};
use std::path::Path;

/// How one point ended.
#[derive(Debug, Clone)]
pub enum PointOutcome {
    /// Measured; the measurement file was written.
    Measured(Box<Measurement>),
    /// CUDA ran out of memory, in the phase named when known.
    OutOfMemory {
        phase: Option<String>,
        message: String,
    },
    /// Any other failure, with its message.
    Failed(String),
    /// The sweep was interrupted while this point ran: no row is written for it.
    Interrupted,
}

/// Runs one point in a fresh process and writes its measurement to `output`.
pub trait PointRunner {
    fn run(&mut self, config: &MeasureConfig, output: &Path) -> PointOutcome;
}
