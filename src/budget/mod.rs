//! The VRAM budget of a real workload: the Hugging Face run replayed through the allocator model
//! ([`terms`]), what a process holds outside the allocator ([`outside`]), the presets
//! ([`presets`]), the fit planner ([`fit`]) and the text of a budget ([`report`]); the synthetic
//! transformer's own accounting and its bench ([`synthetic`], [`bench`], [`verify`]).

pub mod bench;
pub mod fit;
pub mod outside;
pub mod presets;
pub mod proof;
pub mod report;
pub mod shape;
pub mod synthetic;
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
pub use terms::{budget, Budget, BudgetFile, BudgetSettings, Place, Split, Term, TermStatus};
pub use workload::{AllocatorSetting, Mode, Optimizer, WeightFormat, Workload, WorkloadError};

#[cfg(test)]
mod tests;
