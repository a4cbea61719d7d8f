//! What a Hugging Face workload allocates on the GPU, operation by operation: transformers 5.17's
//! models ([`decoder`]), `generate` with its default cache ([`generate`], [`cache`]), PyTorch
//! 2.11's operations and autograd ([`ops`], [`autograd`]; what a long reduction stages, [`reduce`]), AdamW and bitsandbytes' 8-bit AdamW
//! ([`optimizer`]), PEFT's adapters, bitsandbytes' 4-bit weights ([`bitsandbytes`]), emulated over [`tensor`]s whose storages are allocated and freed on a tape in the
//! order the real stack allocates and frees them; alike layers of a decode step are written again
//! rather than run again ([`repeat`]). A whole run ([`run`]) is a program that the
//! allocator model replays into the peaks of `allocated` and `reserved`.

pub mod autograd;
pub mod bitsandbytes;
pub mod cache;
pub mod decoder;
pub mod experts;
pub mod generate;
pub mod latent;
pub mod masks;
pub mod ops;
pub mod optimizer;
pub mod reduce;
pub mod repeat;
pub mod run;
pub mod tensor;
