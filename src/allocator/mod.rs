//! An exact model of PyTorch 2.11.0's CUDA caching allocator for the synthetic network: the
//! allocator's rules ([`simulator`]), the cuBLAS/cuBLASLt workspaces ([`workspace`]), and the
//! protocol's sequence of allocations and frees, phase by phase ([`predict`]). It needs no GPU and
//! no libtorch: `mesure_memoire predict` runs in the program that does not link libtorch, and
//! `measure` records the prediction beside each measured row with the residual.
//! `docs/allocator-model.md` lists each rule, its place in PyTorch's source and the run that proved it.

pub mod lesson;
pub mod predict;
pub mod simulator;
pub mod snapshot;
pub mod workspace;

pub use predict::{predict, Figures, PhasePrediction, PredictError, Prediction, Tensor};
pub use workspace::{ComputeCapability, WorkspaceSettings, Workspaces};
