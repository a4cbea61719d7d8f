//! One replay of the allocator model: named tensors allocated and freed in a program's order,
//! and out of it the figures PyTorch reports (per span between two readings: the baseline, the
//! end and the peaks of `allocated` and `reserved`), the allocator's map, and the name of every
//! live block. The measurement's prediction, the lesson, the budget's check of a bench run and
//! the budget's replay of a whole workload all run through it.

use super::caching::{AllocatorConfig, BlockId, CachingAllocator, Label};
use super::size::{pool_of, round_size, Pool};
use super::stats::Stats;
use super::view::SegmentView;
use crate::reading::{DeviceStats, Figures};
use serde::{Deserialize, Serialize};

/// A tensor the replay holds, until freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

/// A live tensor (or workspace) and the block that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveBlock {
    /// The tensor's name (`linear1.weight`, `cublas_workspace`, `layers.3.kv_cache.k`…).
    pub name: String,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// Bytes of the block handed out (rounded to 512, or a whole cached block).
    pub block_bytes: u64,
    /// `small` or `large`.
    pub pool: String,
}

/// Why an allocation was refused: the device had no memory left for it, even after the
/// allocator released its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of memory allocating {bytes} bytes")]
pub struct OutOfMemory {
    pub bytes: u64,
}

#[derive(Debug, Clone)]
struct Held {
    label: Label,
    requested: u64,
    block: BlockId,
}

/// The allocator model driven by a program of named allocations and frees.
#[derive(Debug, Clone)]
pub struct Replay {
    allocator: CachingAllocator,
    /// Live tensors in allocation order.
    live: std::collections::BTreeMap<TensorId, Held>,
    next: u64,
    /// Whether to keep the live tensors at each new peak of `allocated` (costs a copy of the live
    /// list at every new peak).
    track_peak_tensors: bool,
    peak_allocated: u64,
    live_at_peak: Vec<LiveBlock>,
    /// `allocated` and `reserved` when the current span began.
    baseline: (u64, u64),
}

impl Replay {
    /// A fresh process's allocator under `config`.
    pub fn new(config: AllocatorConfig) -> Replay {
        Replay {
            allocator: CachingAllocator::with_config(config),
            live: Default::default(),
            next: 0,
            track_peak_tensors: false,
            peak_allocated: 0,
            live_at_peak: Vec::new(),
            baseline: (0, 0),
        }
    }

    /// Keeps the live tensors at every new peak of `allocated` ([`live_at_peak`]).
    ///
    /// [`live_at_peak`]: Self::live_at_peak
    pub fn tracking_peak_tensors(mut self) -> Replay {
        self.track_peak_tensors = true;
        self
    }

    /// Limits the device memory the allocator can get (see [`CachingAllocator::set_capacity`]).
    pub fn set_capacity(&mut self, bytes: Option<u64>) {
        self.allocator.set_capacity(bytes);
    }

    /// Places the next new segment at `address` (see
    /// [`CachingAllocator::set_next_segment_address`]).
    pub fn set_next_segment_address(&mut self, address: u64) {
        self.allocator.set_next_segment_address(address);
    }

    /// The label of `name`, interned once.
    pub fn label(&mut self, name: &str) -> Label {
        self.allocator.label(name)
    }

    /// Allocates `bytes` for the tensor `name`. A tensor of zero bytes allocates nothing
    /// (`Ok(None)`: PyTorch returns a null pointer).
    pub fn alloc(&mut self, name: &str, bytes: u64) -> Result<Option<TensorId>, OutOfMemory> {
        let label = self.label(name);
        self.alloc_labelled(label, bytes)
    }

    /// [`alloc`](Self::alloc) with an interned label.
    pub fn alloc_labelled(
        &mut self,
        label: Label,
        bytes: u64,
    ) -> Result<Option<TensorId>, OutOfMemory> {
        if bytes == 0 {
            return Ok(None);
        }
        // Refused for want of memory, or above the largest request the model takes (no device
        // has that much).
        let block = self
            .allocator
            .malloc(bytes, 0, label)
            .ok_or(OutOfMemory { bytes })?;
        let id = TensorId(self.next);
        self.next += 1;
        self.live.insert(
            id,
            Held {
                label,
                requested: bytes,
                block,
            },
        );
        if self.track_peak_tensors {
            let now = self.allocator.stats().allocated.current;
            if now > self.peak_allocated {
                self.peak_allocated = now;
                self.live_at_peak = self.live();
            }
        }
        Ok(Some(id))
    }

    /// Frees the tensor `id`; a tensor already freed (or never allocated) is ignored.
    pub fn free(&mut self, id: TensorId) {
        if let Some(held) = self.live.remove(&id) {
            self.allocator.free(held.block);
        }
    }

    /// Frees the most recently allocated live tensor named `name`, if any.
    pub fn free_named(&mut self, name: &str) -> bool {
        let label = self.label(name);
        let found = self
            .live
            .iter()
            .rev()
            .find(|(_, h)| h.label == label)
            .map(|(id, _)| *id);
        if let Some(id) = found {
            self.free(id);
        }
        found.is_some()
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.allocator.empty_cache();
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peaks(&mut self) {
        self.allocator.reset_peaks();
        self.peak_allocated = self.allocator.stats().allocated.current;
        if self.track_peak_tensors {
            self.live_at_peak = self.live();
        }
    }

    /// Starts a span the way a measurement starts a phase: the baseline read, the peaks reset.
    pub fn begin_span(&mut self) {
        let s = self.allocator.stats();
        self.baseline = (s.allocated.current, s.reserved.current);
        self.reset_peaks();
    }

    /// The six figures of the span since [`begin_span`](Self::begin_span).
    pub fn span_figures(&self) -> Figures {
        let s = self.allocator.stats();
        Figures {
            allocated_baseline_bytes: self.baseline.0,
            allocated_end_bytes: s.allocated.current,
            peak_allocated_bytes: s.allocated.peak,
            reserved_baseline_bytes: self.baseline.1,
            reserved_end_bytes: s.reserved.current,
            peak_reserved_bytes: s.reserved.peak,
        }
    }

    /// The allocator's statistics now.
    pub fn stats(&self) -> Stats {
        self.allocator.stats()
    }

    /// The statistics `torch.cuda.memory_stats` would report now.
    pub fn device_stats(&self) -> DeviceStats {
        self.allocator.device_stats()
    }

    /// The live tensors, in allocation order, with their blocks.
    pub fn live(&self) -> Vec<LiveBlock> {
        self.live
            .values()
            .map(|h| LiveBlock {
                name: self.allocator.label_name(h.label).to_string(),
                requested_bytes: h.requested,
                block_bytes: self.allocator.block_size(h.block).unwrap_or(0),
                pool: match pool_of(round_size(h.requested)) {
                    Pool::Small => "small".into(),
                    Pool::Large => "large".into(),
                },
            })
            .collect()
    }

    /// The live tensors when `allocated` first reached its peak since the last reset (kept only
    /// [when asked for](Self::tracking_peak_tensors)).
    pub fn live_at_peak(&self) -> &[LiveBlock] {
        &self.live_at_peak
    }

    /// The allocator's map now, every allocated block named.
    pub fn snapshot(&self) -> Vec<SegmentView> {
        self.allocator.snapshot()
    }

    /// The allocator itself, for the rules a replay does not wrap.
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }
}
