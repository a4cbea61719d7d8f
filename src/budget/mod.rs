//! The VRAM budget of a real workload: every term a named formula with its status, and the fit
//! planner that turns a budget into packages of the catalog.

pub mod bench;
pub mod shape;

pub use bench::{
    linear_features, BenchError, BenchMode, BenchReport, BenchRun, StageReading, TransformerBench,
};
pub use shape::{AttentionKind, LinearTarget, ModelShape, ShapeError, WeightTensor};
