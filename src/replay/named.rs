//! Named tensors through the replay driver: each allocation tagged with its tensor's name, so
//! that the allocator's map names every block. What the measurement's prediction, the lesson and
//! the replay of a recorded trace drive: the figures of a span between two readings (the
//! baseline, the end and the peaks of `allocated` and `reserved`), the statistics, the live
//! tensors (and those live when `allocated` peaked) and the map.

use super::driver::{Device, Driver};
use super::outside::OutsideBytes;
use super::program::Loaded;
use crate::allocator::size::{pool_of, round_size, Pool};
use crate::allocator::{AllocatorConfig, CachingAllocator, Label, OutOfMemory, SegmentView, Stats};
use crate::reading::{DeviceStats, Figures};
use serde::{Deserialize, Serialize};

/// A tensor the replay holds, until freed: its allocation's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u32);

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

/// The driver over named tensors.
pub struct NamedReplay {
    driver: Driver<Label>,
    /// Whether to keep the live tensors at each new peak of `allocated` (a copy of the live list
    /// at every new peak).
    track_peak_tensors: bool,
    peak_allocated: u64,
    live_at_peak: Vec<LiveBlock>,
}

impl NamedReplay {
    /// A fresh process's allocator under `config`.
    pub fn new(config: AllocatorConfig) -> NamedReplay {
        NamedReplay {
            driver: Driver::new(config, Device::Unlimited, OutsideBytes::NONE),
            track_peak_tensors: false,
            peak_allocated: 0,
            live_at_peak: Vec::new(),
        }
    }

    /// Keeps the live tensors at every new peak of `allocated` ([`live_at_peak`]).
    ///
    /// [`live_at_peak`]: Self::live_at_peak
    pub fn tracking_peak_tensors(mut self) -> NamedReplay {
        self.track_peak_tensors = true;
        self
    }

    /// Limits the device memory the allocator can get (see [`CachingAllocator::set_capacity`]).
    pub fn set_capacity(&mut self, bytes: Option<u64>) {
        self.driver.allocator_mut().set_capacity(bytes);
    }

    /// Places the next new segment at `address` (see
    /// [`CachingAllocator::set_next_segment_address`]).
    pub fn set_next_segment_address(&mut self, address: u64) {
        self.driver
            .allocator_mut()
            .set_next_segment_address(address);
    }

    /// The label of `name`, interned once.
    pub fn label(&mut self, name: &str) -> Label {
        self.driver.allocator_mut().label(name)
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
        let number = self
            .driver
            .alloc(bytes, label, 0, label)
            .ok_or(OutOfMemory { bytes })?;
        if self.track_peak_tensors {
            let now = self.driver.allocator().allocated_now();
            if now > self.peak_allocated {
                self.peak_allocated = now;
                self.live_at_peak = self.live();
            }
        }
        Ok(Some(TensorId(number)))
    }

    /// Frees the tensor `id`; a tensor already freed (or never allocated) is ignored.
    pub fn free(&mut self, id: TensorId) {
        self.driver.free(id.0);
    }

    /// Frees the most recently allocated live tensor named `name`, if any.
    pub fn free_named(&mut self, name: &str) -> bool {
        let label = self.label(name);
        let found = self
            .driver
            .live()
            .filter(|(_, tag, _, _)| *tag == label)
            .last()
            .map(|(n, ..)| n);
        if let Some(n) = found {
            self.driver.free(n);
        }
        found.is_some()
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.driver.allocator_mut().empty_cache();
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peaks(&mut self) {
        self.driver.allocator_mut().reset_peaks();
        self.peak_allocated = self.driver.allocator().allocated_now();
        if self.track_peak_tensors {
            self.live_at_peak = self.live();
        }
    }

    /// Starts a span the way a measurement starts a phase: the baseline read, the peaks reset.
    pub fn begin_span(&mut self) {
        self.driver.begin("span", Loaded::Context);
        self.reset_peaks();
    }

    /// The six figures of the span since [`begin_span`](Self::begin_span).
    pub fn span_figures(&self) -> Figures {
        self.driver.stage_figures()
    }

    /// The allocator's statistics now.
    pub fn stats(&self) -> Stats {
        self.driver.allocator().stats()
    }

    /// The statistics `torch.cuda.memory_stats` would report now.
    pub fn device_stats(&self) -> DeviceStats {
        self.driver.allocator().device_stats()
    }

    /// The live tensors, in allocation order, with their blocks.
    pub fn live(&self) -> Vec<LiveBlock> {
        let a = self.driver.allocator();
        self.driver
            .live()
            .map(|(_, label, block, size)| {
                let requested = a.requested_size(block).unwrap_or(0);
                LiveBlock {
                    name: a.label_name(label).to_string(),
                    requested_bytes: requested,
                    block_bytes: size,
                    pool: match pool_of(round_size(requested)) {
                        Pool::Small => "small".into(),
                        Pool::Large => "large".into(),
                    },
                }
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
        self.driver.allocator().snapshot()
    }

    /// The allocator itself, for the rules a replay does not wrap.
    pub fn allocator(&self) -> &CachingAllocator {
        self.driver.allocator()
    }
}

impl std::fmt::Debug for NamedReplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedReplay")
            .field("stats", &self.stats())
            .field("live", &self.live())
            .finish()
    }
}
