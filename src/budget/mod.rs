//! The VRAM budget of a real workload: the Hugging Face run replayed through the allocator model
//! ([`terms`]), what a process holds outside the allocator ([`outside`]), the presets
//! ([`presets`]), the fit planner ([`fit`]) and the text of a budget ([`report`]).

pub mod fit;
pub mod outside;
pub mod presets;
pub mod proof;
pub mod report;
pub mod terms;
pub mod workload;

pub use fit::{plan, FitError, FitPlan};
pub use presets::{Preset, PresetError, Presets};
pub use terms::{budget, Budget, BudgetFile, BudgetSettings, Place, Split, Term, TermStatus};
pub use workload::{AllocatorSetting, Mode, Optimizer, WeightFormat, Workload, WorkloadError};

#[cfg(test)]
mod tests;
