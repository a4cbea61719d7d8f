//! The accounting of this project's synthetic transformer (`torch/src/transformer/`, the
//! `mesure_memoire transformer` bench): a workload of a [`ModelShape`](super::shape::ModelShape)
//! and its terms as formulas of what each of its operations keeps, checked against its recorded
//! runs (`budget --against`). Budgets of real models replay the Hugging Face stack instead
//! ([`crate::stack`], [`super::terms`]).

pub mod activations;
pub mod constants;
pub mod terms;
pub mod workload;
