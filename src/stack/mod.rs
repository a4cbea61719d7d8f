//! The emulated process: what a Hugging Face workload allocates on the GPU, operation by
//! operation, written as a program ([`crate::replay::program`]) that the replay driver runs
//! through the allocator model.
//!
//! - the machine's state: the process ([`process`]: autograd's state, autocast, the kernels'
//!   workspaces), its tensors ([`tensor`]) and the tape they are allocated on ([`tape`]);
//! - the instruction set: PyTorch 2.11's operations ([`ops`]), their backward rules
//!   ([`backward`]), autograd's graph and engine ([`autograd`]), what a long reduction stages
//!   ([`reduce`]);
//! - the programs: transformers 5.17's models ([`decoder`], with latent attention [`latent`],
//!   mixtures of experts [`experts`], masks [`masks`], the KV cache [`cache`]), FSDP2's
//!   sharding of a training over ranks ([`fsdp`]), DDP's replicas and their buckets ([`ddp`]),
//!   tensor parallelism's rank serving a model ([`tensor_parallel`]), `generate`
//!   ([`generate`]), the weights' loading and PEFT's adapters ([`loading`]), bitsandbytes' 4-bit
//!   weights ([`bitsandbytes`]), the optimizers ([`optimizer`]), `transformers.Trainer` around a
//!   training step ([`trainer`]) and TRL's `SFTTrainer` on it ([`sft`]), alike layers written again
//!   rather than run ([`repeat`]), a whole run ([`run`]) and the proof scripts' specification
//!   of one ([`spec`]).

pub mod autograd;
pub mod backward;
pub mod beams;
pub mod bitsandbytes;
pub mod cache;
pub mod ddp;
pub mod decoder;
pub mod decoding;
pub mod experts;
pub mod fsdp;
pub mod generate;
pub mod latent;
pub mod loading;
pub mod masks;
pub mod ops;
pub mod optimizer;
pub mod process;
pub mod reduce;
pub mod repeat;
pub mod run;
pub mod sampling;
pub mod sft;
pub mod spec;
pub mod tape;
pub mod tensor;
pub mod tensor_parallel;
pub mod trainer;
#[cfg(test)]
mod windows_tests;
