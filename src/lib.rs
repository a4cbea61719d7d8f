//! IteraGPU Lab: how much GPU memory a workload really takes, and what a rented GPU package costs
//! for the useful work it delivers.
//!
//! - [`estimate`]: weight-memory estimate, exact bytes, GiB (2^30) and GB (10^9) kept apart;
//! - [`environment`]: what libtorch, CUDA, the GPU and the driver are;
//! - [`measure`]: the bounded phase-by-phase measurement of a synthetic `Linear -> GELU -> Linear`
//!   network through libtorch, reading the CUDA caching allocator's `allocated` and `reserved`;
//! - [`allocator`]: an exact model of PyTorch's CUDA caching allocator that predicts every figure
//!   of a measurement and names every block;
//! - [`catalog`] and [`quote`]: package prices from a CSV catalog, money in exact cents;
//! - [`files`]: results written atomically, never over an existing file; input files read
//!   only when regular and within their size limit;
//! - [`text`]: untrusted text made safe to show in a terminal;
//! - [`status`]: the exit status every library error names for itself.
//!
//! This crate never links libtorch: the GPU backend is the crate `iteragpu-torch` (folder
//! `torch/`), which implements [`measure::Gpu`]. The command lines live in [`cli`], behind the
//! default feature `cli`; notebooks use the library without it (`default-features = false`).
#![deny(unsafe_code)]

pub mod allocator;
#[deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
pub mod budget;
pub mod bundle;
pub mod catalog;
#[cfg(feature = "cli")]
pub mod cli;
pub mod companion;
pub mod decimal;
pub mod device;
pub mod display;
pub mod dtype;
pub mod environment;
pub mod estimate;
pub mod files;
pub mod gpu;
pub mod grid;
pub mod lesson;
pub mod markup;
pub mod measure;
#[deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
pub mod model;
pub mod money;
pub mod notebook;
pub mod plot;
pub mod quote;
pub mod reading;
pub mod replay;
pub mod shown;
#[deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
pub mod stack;
pub mod status;
pub mod sweep;
pub mod text;
pub mod units;

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(bytes))
}

/// Whether `s` is a SHA-256 as [`sha256_hex`] writes it: 64 lowercase hexadecimal digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
