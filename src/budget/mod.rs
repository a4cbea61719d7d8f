//! The VRAM budget of a real workload: the workload as people run it ([`workload`]) and what the
//! budget is made with ([`settings`]), the run replayed through the allocator model into a budget
//! ([`compute`]) whose lines say what each part
//! holds when the card is fullest ([`terms`]), a budget file read back ([`file`]), the presets
//! ([`presets`]), the fit planner ([`fit`]), the text of a budget ([`report`]) and the recorded
//! GPU proofs it is checked against ([`proof`]).

pub mod compute;
pub mod file;
pub mod fit;
pub mod presets;
pub mod proof;
pub mod report;
pub mod settings;
pub mod terms;
pub mod workload;

pub use compute::{budget, Budget};
pub use file::BudgetFile;
pub use fit::{plan, FitError, FitPlan};
pub use presets::{Preset, PresetError, Presets};
pub use settings::BudgetSettings;
pub use terms::{Place, Split, Term, TermStatus};
pub use workload::{AllocatorSetting, Mode, Optimizer, WeightFormat, Workload, WorkloadError};

#[cfg(test)]
mod tests;
