//! An exact model of PyTorch 2.11.0's CUDA caching allocator, with its default settings or with
//! `expandable_segments:True`: the size rules ([`size`]), the statistics it reports ([`stats`]),
//! the block structure that caches, splits and merges ([`caching`], with the small pool's
//! fingerprint that lets a replay write a recorded window again) and its free blocks in
//! best-fit order (`free_blocks`), where new segments are placed ([`address`]), the map it shows
//! ([`view`]), the real map read back from libtorch into the same views ([`snapshot`]) and the
//! cuBLAS/cuBLASLt workspaces ([`workspace`]). The one driver that runs programs through it is
//! [`crate::replay`]. It needs no GPU and no libtorch. `docs/allocator-model.md` lists each rule,
//! its place in PyTorch's source and the run that proved it.

pub mod address;
pub mod caching;
mod free_blocks;
pub mod size;
pub mod snapshot;
pub mod stats;
pub mod view;
pub mod workspace;

pub use address::AddressOrder;
pub use caching::{AllocatorConfig, BlockId, CachingAllocator, Label, OutOfMemory};
pub use size::Pool;
pub use stats::{Counter, Stats};
pub use view::{BlockView, SegmentView};
pub use workspace::{ComputeCapability, WorkspaceSettings, Workspaces};

/// A fixed pseudo-random sequence (xorshift) for the tests' random workloads.
#[cfg(test)]
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
