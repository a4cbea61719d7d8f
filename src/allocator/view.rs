//! The allocator's map as `torch.cuda.memory_snapshot()` shows it: segments in address order,
//! each with its blocks. The model produces it; the libtorch backend reads the real one into the
//! same types (`snapshot`), so the two compare field by field.

use super::size::Pool;

/// A block in a [`SegmentView`], in address order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockView {
    /// Start address (synthetic in the model unless given by the real trace).
    pub address: u64,
    /// Block size in bytes.
    pub size: u64,
    /// `requested_size` as PyTorch's snapshot reports it: the unrounded request for an allocated
    /// block; for a free block the stale value left by the block's last allocation (0 if it never
    /// was allocated), exactly as `Block::requested_size` is never cleared in the C++ code.
    pub requested_size: u64,
    /// Whether the block is allocated (in use) or a cached free block.
    pub allocated: bool,
    /// The name of the tensor an allocated block holds; `None` when free.
    pub label: Option<String>,
    /// For a free block: whether it counts as an inactive split block (its segment is split into
    /// several blocks). Always false when allocated.
    pub inactive_split: bool,
}

/// A segment (one `cudaMalloc`, or the mapped part of an expandable segment) as in
/// `torch.cuda.memory_snapshot()`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentView {
    /// Start address of the segment.
    pub address: u64,
    /// Pool of the segment (`segment_type` "small" / "large").
    pub pool: Pool,
    /// Stream id the segment was allocated for.
    pub stream: u32,
    /// Total segment size in bytes (mapped bytes for an expandable segment).
    pub size: u64,
    /// Blocks of the segment in address order; their sizes add up to `size`.
    pub blocks: Vec<BlockView>,
}
