//! The VRAM budget of a real workload: every term a named formula with its status, and the fit
//! planner that turns a budget into packages of the catalog.

pub mod activations;
pub mod bench;
pub mod constants;
pub mod fit;
pub mod presets;
pub mod report;
pub mod shape;
pub mod terms;
pub mod verify;
pub mod workload;

pub use bench::{
    adapter_names, kv_cache_names, optimizer_state_names, BenchError, BenchFailure, BenchMode,
    BenchReport, BenchRun, StageReading, TransformerBench,
};
pub use fit::{plan, FitError, FitPlan};
pub use presets::{Preset, PresetError, Presets};
pub use shape::{AttentionKind, LinearTarget, ModelShape, ShapeError, WeightTensor};
pub use terms::{budget, Budget, BudgetSettings, Place, Split, Term, TermStatus};
pub use workload::{KvFormat, Mode, Optimizer, WeightFormat, Workload, WorkloadError};

#[cfg(test)]
mod tests;
