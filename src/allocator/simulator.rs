//! Byte-exact simulator of PyTorch 2.11.0's CUDA caching allocator.
//!
//! This module models the native `DeviceCachingAllocator` of PyTorch 2.11.0
//! (`c10/cuda/CUDACachingAllocator.cpp`, constants and defaults from
//! `c10/core/AllocatorConfig.h`) in its **default configuration**
//! (`PYTORCH_ALLOC_CONF` unset), for one device. Given a sequence of
//! `malloc` / `free` / `empty_cache` / `reset_peaks` events it predicts, to the
//! byte, what `torch.cuda.memory_stats()` reports under the `*.all.*` keys
//! (and the `small_pool` / `large_pool` splits): allocated, reserved,
//! requested, active and inactive-split bytes, segment / allocation / block
//! counts, each with its current value and peak.
//!
//! What it mirrors (each rule carries a comment naming the C++ function):
//! sizes rounded to 512 bytes (`round_size`); requests of at most 1 MiB (after
//! rounding) served from the small pool, larger ones from the large pool
//! (`get_pool`); new segments of 2 MiB, 20 MiB or the request rounded up to
//! 2 MiB (`get_allocation_size`); best fit among the cached free blocks of the
//! same pool and stream, smallest size first, then lowest address
//! (`get_free_block` on a set ordered like `BlockComparatorSize`); splitting
//! (`should_split`, `alloc_found_block`); freeing with coalescing of free
//! neighbours inside a segment (`free_block`, `try_merge_blocks`); releasing
//! every segment that is one whole free block (`emptyCache` ->
//! `release_cached_blocks` -> `release_blocks`); and `resetPeakStats`.
//!
//! Source and validation: the rules were read from `CUDACachingAllocator.cpp`
//! as on PyTorch's main branch shortly before 2.11 (the text whose API matches
//! the 2.11.0 headers; the v2.11.0 tag commit,
//! 70d99e998b4955e0049d13a98d77ae1b14db1f45, was not itself readable) and
//! from `AllocatorConfig.h` of the 2.11.0+cu130 wheel; `get_pool`,
//! `should_split`, `get_allocation_size`, `get_free_block`, `free_block` and
//! `try_merge_blocks` read the same in a later main-branch text. Every aggregate
//! statistic (current and peak) and every returned address then matched a
//! real H200 run of torch 2.11.0 over 300 random traces, 32,072 events, when
//! given the driver's segment addresses. The per-pool splits follow the same
//! code path but were not compared against hardware.
//!
//! Addresses: PyTorch orders equal-sized free blocks by their device address,
//! which the CUDA driver chooses. The simulator gives each new segment a
//! synthetic address: by default increasing (starting at
//! [`SYNTHETIC_ADDRESS_BASE`]), or decreasing with
//! [`AddressOrder::Descending`]. Addresses only break ties between cached free
//! blocks of equal size, so when two equal-sized free blocks compete the
//! simulator may pick a different (equal-sized) block than the real driver,
//! and later merges can then differ. On an H200 with torch 2.11.0 the driver
//! mostly handed out *lower* addresses to newer segments: over 300 random
//! traces (32,072 events) the ascending order diverged in 6 traces, the
//! descending order in 2, and replaying the driver's real segment addresses
//! (see [`CachingAllocator::set_next_segment_address`]) in none.
//!
//! Not modelled: expandable segments (`expandable_segments:True`),
//! `max_split_size_mb` (taken as unlimited, so no block is "oversize"),
//! `max_non_split_rounding_mb`, `roundup_power2_divisions`,
//! `garbage_collection_threshold` and memory fractions, `large_segment_size_mb`
//! (fixed at its 20 MiB default), cross-stream use (`recordStream`, CUDA events;
//! streams are only an id that partitions the free lists), CUDA graph / MemPool
//! private pools, free-memory callbacks, and device capacity: `cudaMalloc`
//! never fails by itself here: the out-of-memory path runs only when the caller
//! says that `cudaMalloc` failed ([`CachingAllocator::malloc_after_failed_cuda_malloc`]:
//! release every unsplit cached segment, count a retry, allocate). Accumulated
//! counters (`allocated`/`freed` totals, ...) are not kept, except
//! `num_alloc_retries`.
//!
//! Arithmetic: sizes are `u64`. Requests up to [`MAX_REQUEST`] (about 2^64)
//! are accepted; rounding never overflows below that. Counters use saturating
//! addition, so a sum above `u64::MAX` (only possible with several segments of
//! 2^62 bytes or more) saturates instead of panicking.

use std::collections::{BTreeMap, HashMap};

/// `kMinBlockSize`: every request is rounded up to a multiple of 512 bytes.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: largest (rounded) request served by the small pool, 1 MiB.
pub const SMALL_SIZE: u64 = 1_048_576;
/// `kSmallBuffer`: size of every small-pool segment, 2 MiB.
pub const SMALL_BUFFER: u64 = 2_097_152;
/// `kLargeBuffer` / default `large_segment_size()`: segment size for large
/// requests below [`MIN_LARGE_ALLOC`], 20 MiB.
pub const LARGE_BUFFER: u64 = 20_971_520;
/// `kMinLargeAlloc`: from 10 MiB on, a request gets a segment of its own size
/// (rounded up to [`ROUND_LARGE`]).
pub const MIN_LARGE_ALLOC: u64 = 10_485_760;
/// `kRoundLarge`: large segments are multiples of 2 MiB.
pub const ROUND_LARGE: u64 = 2_097_152;
/// Largest request [`CachingAllocator::malloc`] accepts: the largest multiple
/// of [`ROUND_LARGE`] that fits in a `u64`, so that rounding cannot overflow.
pub const MAX_REQUEST: u64 = u64::MAX - (ROUND_LARGE - 1);
/// First synthetic segment address in [`AddressOrder::Ascending`] order
/// (segments are then laid out one after the other, upwards). Real addresses
/// come from the CUDA driver; see the module docs.
pub const SYNTHETIC_ADDRESS_BASE: u64 = 0x7f00_0000_0000;
/// End of the first synthetic segment in [`AddressOrder::Descending`] order
/// (segments are then laid out one below the other).
pub const SYNTHETIC_ADDRESS_TOP: u64 = 0x8000_0000_0000;

/// Order in which synthetic addresses are given to new segments; it only
/// matters when equal-sized free blocks tie in the best-fit search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AddressOrder {
    /// Each new segment above the previous one (newer segments lose ties).
    #[default]
    Ascending,
    /// Each new segment below the previous one (newer segments win ties),
    /// closer to what the CUDA driver did in the H200 measurements.
    Descending,
}

/// Which of the two default block pools a block belongs to.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// `small_blocks`: rounded requests of at most 1 MiB, 2 MiB segments.
    Small,
    /// `large_blocks`: rounded requests above 1 MiB.
    Large,
}

/// Mirrors `round_size` (default config: `roundup_power2_divisions` is 0 for
/// every interval, so only the 512-byte rounding applies): sizes below
/// [`MIN_BLOCK_SIZE`] become 512, others round up to a multiple of 512.
/// Sizes above `u64::MAX - 511` saturate at `u64::MAX`.
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
    }
}

/// Mirrors `get_pool` (no capture / private pool underway): a rounded size of
/// at most [`SMALL_SIZE`] goes to the small pool, anything larger to the large
/// pool.
pub fn pool_of(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// Mirrors `get_allocation_size`: the size of the segment `cudaMalloc`ed when
/// no cached block fits a request of `rounded` bytes (already rounded by
/// [`round_size`]). Small: 2 MiB; large below 10 MiB: 20 MiB
/// (`large_segment_size()`, default `kLargeBuffer`); otherwise rounded up to a
/// multiple of 2 MiB (saturating at `u64::MAX` for absurd sizes).
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// Mirrors `should_split` with `max_split_size` unlimited and expandable
/// segments off: a block of `block_size` bytes handed out for `rounded` bytes
/// is split when the remainder is at least 512 bytes (small pool) or strictly
/// more than 1 MiB (large pool); otherwise the whole block is handed out.
pub fn should_split(pool: Pool, block_size: u64, rounded: u64) -> bool {
    let remaining = block_size.saturating_sub(rounded);
    match pool {
        Pool::Small => remaining >= MIN_BLOCK_SIZE,
        // `(size < max_split_size()) && (remaining > kSmallSize)`; the first
        // term is always true with the default max_split_size = SIZE_MAX.
        Pool::Large => remaining > SMALL_SIZE,
    }
}

/// A statistic as the allocator keeps it (`c10::CachingAllocator::Stat`):
/// its current value and the highest value since the start or the last
/// [`CachingAllocator::reset_peaks`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Value now (`*.current` in `memory_stats()`).
    pub current: u64,
    /// Highest value reached (`*.peak`).
    pub peak: u64,
}

impl Counter {
    /// `Stat::increase`: current grows, peak follows it up.
    fn increase(&mut self, amount: u64) {
        self.current = self.current.saturating_add(amount);
        self.peak = self.peak.max(self.current);
    }

    /// `Stat::decrease`: current shrinks, peak is kept.
    fn decrease(&mut self, amount: u64) {
        self.current = self.current.saturating_sub(amount);
    }

    /// `Stat::reset_peak`: peak becomes current.
    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// One `StatType` slice of the device statistics (`DeviceStats`), with the
/// `torch.cuda.memory_stats()` key each field corresponds to (`all` for the
/// aggregate, `small_pool` / `large_pool` for [`CachingAllocator::pool_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `allocated_bytes`: sizes of the allocated blocks (after rounding and
    /// splitting; a block handed out whole counts whole).
    pub allocated: Counter,
    /// `reserved_bytes`: sizes of the segments obtained from `cudaMalloc`.
    pub reserved: Counter,
    /// `requested_bytes`: the unrounded sizes asked for by the caller.
    pub requested: Counter,
    /// `active_bytes`: sizes of active blocks (equal to `allocated` here,
    /// since cross-stream uses are not modelled).
    pub active: Counter,
    /// `active`: number of active blocks (equal to `allocations` here).
    pub active_blocks: Counter,
    /// `inactive_split_bytes`: bytes in free blocks that belong to a segment
    /// that is split (so cannot be released by `empty_cache`).
    pub inactive_split: Counter,
    /// `inactive_split`: number of such free blocks.
    pub inactive_split_blocks: Counter,
    /// `segment`: number of segments (`cudaMalloc` calls not yet freed).
    pub segments: Counter,
    /// `allocation`: number of allocated blocks.
    pub allocations: Counter,
}

impl Stats {
    fn counters_mut(&mut self) -> [&mut Counter; 9] {
        [
            &mut self.allocated,
            &mut self.reserved,
            &mut self.requested,
            &mut self.active,
            &mut self.active_blocks,
            &mut self.inactive_split,
            &mut self.inactive_split_blocks,
            &mut self.segments,
            &mut self.allocations,
        ]
    }
}

/// Handle to a block handed out by [`CachingAllocator::malloc`]. It becomes
/// stale once the block is freed; stale handles are rejected, not reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    slot: usize,
    generation: u64,
}

/// A block in a [`SegmentView`], in address order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockView {
    /// Start address (synthetic unless given by `set_next_segment_address`).
    pub address: u64,
    /// Block size in bytes.
    pub size: u64,
    /// `requested_size` as PyTorch's snapshot reports it: the unrounded
    /// request for an allocated block; for a free block the stale value left
    /// by the block's last allocation (0 if it never was allocated), exactly
    /// as `Block::requested_size` is never cleared in the C++ code.
    pub requested_size: u64,
    /// Whether the block is allocated (in use) or a cached free block.
    pub allocated: bool,
    /// The label given to `malloc` for an allocated block; `None` when free.
    pub label: Option<String>,
    /// For a free block: whether it counts as an inactive split block (its
    /// segment is split into several blocks). Always false when allocated.
    pub inactive_split: bool,
}

/// A segment (one `cudaMalloc`) as in `torch.cuda.memory_snapshot()`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentView {
    /// Start address of the segment.
    pub address: u64,
    /// Pool of the segment (`segment_type` "small" / "large").
    pub pool: Pool,
    /// Stream id the segment was allocated for.
    pub stream: u32,
    /// Total segment size in bytes.
    pub size: u64,
    /// Blocks of the segment in address order; their sizes add up to `size`.
    pub blocks: Vec<BlockView>,
}

/// One block (the C++ `Block`): a slice of a segment, allocated or free.
#[derive(Clone, Debug)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    stream: u32,
    pool: Pool,
    allocated: bool,
    prev: Option<usize>,
    next: Option<usize>,
    label: String,
    /// Bumped whenever a handle to this slot must become stale.
    generation: u64,
    /// False when the slot is on the free-slot list.
    in_use: bool,
}

impl Block {
    /// `Block::is_split`.
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    size: u64,
    pool: Pool,
    stream: u32,
}

/// Key of a free block in a pool's free set, ordered like
/// `BlockComparatorSize`: stream, then size, then address.
type FreeKey = (u32, u64, u64);

/// Simulated `DeviceCachingAllocator` for one device in the default
/// configuration. See the module documentation for what is and is not
/// modelled.
#[derive(Clone, Debug)]
pub struct CachingAllocator {
    slots: Vec<Block>,
    free_slots: Vec<usize>,
    /// `small_blocks.blocks`: cached free blocks of the small pool.
    small_free: BTreeMap<FreeKey, usize>,
    /// `large_blocks.blocks`: cached free blocks of the large pool.
    large_free: BTreeMap<FreeKey, usize>,
    /// Every block (allocated or free) by start address.
    by_address: HashMap<u64, usize>,
    /// Every segment by start address.
    segments: BTreeMap<u64, Segment>,
    /// Indexed like `StatType`: 0 AGGREGATE, 1 SMALL_POOL, 2 LARGE_POOL.
    stats: [Stats; 3],
    address_order: AddressOrder,
    /// Ascending: next free address; descending: end of the next segment.
    next_address: u64,
    segment_address_hint: Option<u64>,
    /// `num_alloc_retries`: allocations that released the cache and tried again.
    alloc_retries: u64,
}

impl Default for CachingAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl CachingAllocator {
    /// An allocator holding no memory, all statistics zero, with ascending
    /// synthetic segment addresses.
    pub fn new() -> Self {
        Self::with_address_order(AddressOrder::Ascending)
    }

    /// Like [`new`](Self::new), choosing the order of synthetic addresses.
    pub fn with_address_order(address_order: AddressOrder) -> Self {
        CachingAllocator {
            slots: Vec::new(),
            free_slots: Vec::new(),
            small_free: BTreeMap::new(),
            large_free: BTreeMap::new(),
            by_address: HashMap::new(),
            segments: BTreeMap::new(),
            stats: [Stats::default(); 3],
            address_order,
            next_address: match address_order {
                AddressOrder::Ascending => SYNTHETIC_ADDRESS_BASE,
                AddressOrder::Descending => SYNTHETIC_ADDRESS_TOP,
            },
            segment_address_hint: None,
            alloc_retries: 0,
        }
    }

    /// Allocates `size` requested bytes on stream `stream`, like
    /// `DeviceCachingAllocator::malloc` (reached by `raw_alloc_with_stream`
    /// or a tensor's storage allocation). `label` is kept for
    /// [`snapshot`](Self::snapshot).
    ///
    /// Returns `None`, changing nothing, when `size` is 0 (PyTorch makes no
    /// allocation for an empty storage: `allocate(0)` / `raw_alloc(0)` return
    /// a null pointer) or above [`MAX_REQUEST`], or in the practically
    /// impossible case that no free synthetic address range is left.
    pub fn malloc(&mut self, size: u64, stream: u32, label: &str) -> Option<BlockId> {
        self.malloc_on(size, stream, label, false)
    }

    /// Allocates like [`malloc`](Self::malloc) on a device whose `cudaMalloc`
    /// fails for the new segment the first time (a request larger than the
    /// driver's free memory). Mirrors `malloc`'s out-of-memory path in the
    /// default configuration: a cached block that fits is used as usual;
    /// otherwise `alloc_block` fails, `release_available_cached_blocks` does
    /// nothing (it returns at once while `max_split_size` is unlimited), then
    /// `release_cached_blocks` releases every unsplit cached segment of both
    /// pools (what [`empty_cache`](Self::empty_cache) does) and
    /// `alloc_block(isRetry = true)` counts a retry (`num_alloc_retries`) and
    /// makes the segment. The caller guarantees that this second `cudaMalloc`
    /// succeeds (the request fits once the cache is released); the model has
    /// no device capacity.
    pub fn malloc_after_failed_cuda_malloc(
        &mut self,
        size: u64,
        stream: u32,
        label: &str,
    ) -> Option<BlockId> {
        self.malloc_on(size, stream, label, true)
    }

    /// [`malloc`](Self::malloc), with `first_cuda_malloc_fails` the out-of-memory path of
    /// [`malloc_after_failed_cuda_malloc`](Self::malloc_after_failed_cuda_malloc).
    fn malloc_on(
        &mut self,
        size: u64,
        stream: u32,
        label: &str,
        first_cuda_malloc_fails: bool,
    ) -> Option<BlockId> {
        if size == 0 || size > MAX_REQUEST {
            return None;
        }
        // malloc: `size_t size = round_size(orig_size);`
        let rounded = round_size(size);
        // `auto& pool = get_pool(size, stream);`
        let pool = pool_of(rounded);
        // `get_free_block(params)`, else `alloc_block(params, ...)` with
        // `const size_t alloc_size = get_allocation_size(size);`
        let slot = match self.get_free_block(pool, stream, rounded) {
            Some(slot) => slot,
            None => {
                if first_cuda_malloc_fails {
                    self.empty_cache();
                    self.alloc_retries += 1;
                }
                self.alloc_block(pool, stream, allocation_size(rounded))?
            }
        };
        // `bool split_remainder = should_split(params.block, params.size(), ...)`
        let split = should_split(pool, self.slots[slot].size, rounded);
        Some(self.alloc_found_block(slot, rounded, size, split, label))
    }

    /// `num_alloc_retries`: how many allocations released the cache and tried
    /// `cudaMalloc` again.
    pub fn alloc_retries(&self) -> u64 {
        self.alloc_retries
    }

    /// Frees a block from [`malloc`](Self::malloc), like
    /// `DeviceCachingAllocator::free` followed by `free_block` (no stream
    /// uses recorded): the block returns to its pool's cache, merged with
    /// free neighbours of the same segment. Returns `false`, changing
    /// nothing, if `id` is not a live allocation (already freed, or stale).
    pub fn free(&mut self, id: BlockId) -> bool {
        let slot = id.slot;
        match self.slots.get(slot) {
            Some(b) if b.in_use && b.allocated && b.generation == id.generation => {}
            _ => return false,
        }
        let (pool, size, requested) = {
            let b = &mut self.slots[slot];
            b.allocated = false;
            b.generation = b.generation.wrapping_add(1);
            b.label = String::new();
            (b.pool, b.size, b.requested_size)
        };
        // free: `stats.allocation[..].decrease(1)`,
        // `stats.allocated_bytes[..].decrease(block->size)`.
        self.for_pool(pool, |s| {
            s.allocations.decrease(1);
            s.allocated.decrease(size);
        });
        self.free_block(slot, size, requested);
        true
    }

    /// Mirrors `emptyCache` -> `release_cached_blocks` -> `release_blocks`
    /// (large pool, then small pool): every cached free block that is a whole
    /// segment (not split) is `cudaFree`d (`release_block`); segments holding
    /// any allocated block are kept, and so are their free parts.
    pub fn empty_cache(&mut self) {
        for pool in [Pool::Large, Pool::Small] {
            let whole: Vec<usize> = self
                .free_set(pool)
                .values()
                .copied()
                .filter(|&s| !self.slots[s].is_split())
                .collect();
            for slot in whole {
                self.release_block(slot);
            }
        }
    }

    /// Mirrors `resetPeakStats`: every peak (all stat types) becomes the
    /// current value.
    pub fn reset_peaks(&mut self) {
        for stats in self.stats.iter_mut() {
            for counter in stats.counters_mut() {
                counter.reset_peak();
            }
        }
    }

    /// Aggregate statistics (`StatType::AGGREGATE`, the `*.all.*` keys).
    pub fn stats(&self) -> Stats {
        self.stats[0]
    }

    /// The statistics as `torch.cuda.memory_stats` would report them now (the model raises no
    /// out-of-memory error).
    pub fn device_stats(&self) -> crate::measure::DeviceStats {
        let s = self.stats();
        crate::measure::DeviceStats {
            requested_bytes: s.requested.current,
            inactive_split_bytes: s.inactive_split.current,
            inactive_split_blocks: s.inactive_split_blocks.current,
            segments: s.segments.current,
            alloc_retries: self.alloc_retries,
            ooms: 0,
        }
    }

    /// Statistics of one pool (`small_pool` / `large_pool` keys).
    pub fn pool_stats(&self, pool: Pool) -> Stats {
        self.stats[stat_index(pool)]
    }

    /// Makes the next segment that has to be created start at `address`
    /// instead of the next synthetic address (one shot; ignored if a cached
    /// block serves the next request, and ignored if the range would overlap
    /// a live segment). Used to replay a recorded trace with the driver's
    /// real addresses so that ties between equal-sized blocks resolve alike.
    pub fn set_next_segment_address(&mut self, address: u64) {
        self.segment_address_hint = Some(address);
    }

    /// Start address of a live allocated block, `None` for a stale handle.
    pub fn address(&self, id: BlockId) -> Option<u64> {
        self.live(id).map(|b| b.address)
    }

    /// Size of a live allocated block (rounded, whole block if not split).
    pub fn block_size(&self, id: BlockId) -> Option<u64> {
        self.live(id).map(|b| b.size)
    }

    /// All segments in address order with their blocks in address order,
    /// like `snapshot()` / `torch.cuda.memory_snapshot()`.
    pub fn snapshot(&self) -> Vec<SegmentView> {
        let mut out = Vec::with_capacity(self.segments.len());
        for (&address, seg) in &self.segments {
            let mut blocks = Vec::new();
            let mut cur = self.by_address.get(&address).copied();
            while let Some(slot) = cur {
                let b = &self.slots[slot];
                blocks.push(BlockView {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    allocated: b.allocated,
                    label: if b.allocated {
                        Some(b.label.clone())
                    } else {
                        None
                    },
                    inactive_split: !b.allocated && b.is_split(),
                });
                cur = b.next;
            }
            out.push(SegmentView {
                address,
                pool: seg.pool,
                stream: seg.stream,
                size: seg.size,
                blocks,
            });
        }
        out
    }

    // ----- internals -----

    fn live(&self, id: BlockId) -> Option<&Block> {
        self.slots
            .get(id.slot)
            .filter(|b| b.in_use && b.allocated && b.generation == id.generation)
    }

    /// `get_stat_types_for_pool`: AGGREGATE plus the pool's own type.
    fn for_pool(&mut self, pool: Pool, mut f: impl FnMut(&mut Stats)) {
        f(&mut self.stats[0]);
        f(&mut self.stats[stat_index(pool)]);
    }

    fn free_set(&self, pool: Pool) -> &BTreeMap<FreeKey, usize> {
        match pool {
            Pool::Small => &self.small_free,
            Pool::Large => &self.large_free,
        }
    }

    fn free_set_mut(&mut self, pool: Pool) -> &mut BTreeMap<FreeKey, usize> {
        match pool {
            Pool::Small => &mut self.small_free,
            Pool::Large => &mut self.large_free,
        }
    }

    fn free_key(&self, slot: usize) -> FreeKey {
        let b = &self.slots[slot];
        (b.stream, b.size, b.address)
    }

    /// `BlockPool::insert_into_blocks`.
    fn insert_free(&mut self, slot: usize) {
        let key = self.free_key(slot);
        let pool = self.slots[slot].pool;
        self.free_set_mut(pool).insert(key, slot);
    }

    fn remove_free(&mut self, slot: usize) {
        let key = self.free_key(slot);
        let pool = self.slots[slot].pool;
        self.free_set_mut(pool).remove(&key);
    }

    fn new_slot(&mut self, block: Block) -> usize {
        if let Some(slot) = self.free_slots.pop() {
            let generation = self.slots[slot].generation;
            self.slots[slot] = Block {
                generation,
                ..block
            };
            slot
        } else {
            self.slots.push(block);
            self.slots.len() - 1
        }
    }

    fn drop_slot(&mut self, slot: usize) {
        let b = &mut self.slots[slot];
        b.in_use = false;
        b.allocated = false;
        b.prev = None;
        b.next = None;
        b.label = String::new();
        b.generation = b.generation.wrapping_add(1);
        self.free_slots.push(slot);
    }

    /// Mirrors `get_free_block` (default config): `lower_bound` of
    /// (stream, size, null) in the pool's size-ordered set, i.e. the smallest
    /// cached block of the same stream that is at least `rounded` bytes, the
    /// lowest address among equal sizes. The `max_split_size` and
    /// `max_non_split_rounding_size` checks never reject with the default
    /// unlimited `max_split_size`.
    fn get_free_block(&mut self, pool: Pool, stream: u32, rounded: u64) -> Option<usize> {
        let set = self.free_set_mut(pool);
        let (&key, &slot) = set.range((stream, rounded, 0)..).next()?;
        if key.0 != stream {
            return None;
        }
        set.remove(&key);
        Some(slot)
    }

    /// Mirrors `alloc_block` (success path of `cudaMalloc`): a new segment
    /// of `alloc_size` bytes, one unsplit block; `segment` and
    /// `reserved_bytes` increase.
    fn alloc_block(&mut self, pool: Pool, stream: u32, alloc_size: u64) -> Option<usize> {
        let address = self.segment_address(alloc_size)?;
        let slot = self.new_slot(Block {
            address,
            size: alloc_size,
            requested_size: 0,
            stream,
            pool,
            allocated: false,
            prev: None,
            next: None,
            label: String::new(),
            generation: 0,
            in_use: true,
        });
        self.by_address.insert(address, slot);
        self.segments.insert(
            address,
            Segment {
                size: alloc_size,
                pool,
                stream,
            },
        );
        self.for_pool(pool, |s| {
            s.segments.increase(1);
            s.reserved.increase(alloc_size);
        });
        Some(slot)
    }

    /// Mirrors `alloc_found_block`: optionally splits `slot` (the allocated
    /// block keeps the front, the remainder goes back to the pool), updates
    /// the inactive-split statistics, then marks the block allocated and
    /// counts it.
    fn alloc_found_block(
        &mut self,
        slot: usize,
        rounded: u64,
        orig_size: u64,
        split_remainder: bool,
        label: &str,
    ) -> BlockId {
        let already_split = self.slots[slot].is_split();
        let pool = self.slots[slot].pool;
        let block = if split_remainder {
            // `remaining = block; block = new Block(device, stream, size, pool, block->ptr);`
            let (address, stream, prev) = {
                let r = &self.slots[slot];
                (r.address, r.stream, r.prev)
            };
            let block = self.new_slot(Block {
                address,
                size: rounded,
                requested_size: 0,
                stream,
                pool,
                allocated: false,
                prev,
                next: Some(slot),
                label: String::new(),
                generation: 0,
                in_use: true,
            });
            if let Some(p) = prev {
                self.slots[p].next = Some(block);
            }
            let remaining_size = {
                let r = &mut self.slots[slot];
                r.prev = Some(block);
                r.address += rounded;
                r.size -= rounded;
                r.size
            };
            let remaining_address = self.slots[slot].address;
            self.by_address.insert(address, block);
            self.by_address.insert(remaining_address, slot);
            self.insert_free(slot);
            if already_split {
                // "An already-split inactive block is being shrunk by size bytes."
                self.for_pool(pool, |s| s.inactive_split.decrease(rounded));
            } else {
                // "A new split inactive block is being created from a
                // previously unsplit block, size remaining->size bytes."
                self.for_pool(pool, |s| {
                    s.inactive_split.increase(remaining_size);
                    s.inactive_split_blocks.increase(1);
                });
            }
            block
        } else {
            if already_split {
                // "An already-split block is becoming active."
                let size = self.slots[slot].size;
                self.for_pool(pool, |s| {
                    s.inactive_split.decrease(size);
                    s.inactive_split_blocks.decrease(1);
                });
            }
            slot
        };
        let size = {
            let b = &mut self.slots[block];
            b.allocated = true;
            b.requested_size = orig_size;
            b.label = label.to_string();
            b.size
        };
        self.for_pool(pool, |s| {
            s.allocations.increase(1);
            s.allocated.increase(size);
            s.active_blocks.increase(1);
            s.active.increase(size);
            s.requested.increase(orig_size);
        });
        BlockId {
            slot: block,
            generation: self.slots[block].generation,
        }
    }

    /// Mirrors `free_block`: merges with the free previous and next blocks
    /// (`try_merge_blocks`), puts the result in the pool's cache, and applies
    /// the net inactive-split change (merged-away blocks leave it; the result
    /// joins it if its segment is still split), then the active and requested
    /// decreases.
    fn free_block(&mut self, slot: usize, original_size: u64, requested_size: u64) {
        let pool = self.slots[slot].pool;
        let mut net_blocks: i128 = 0;
        let mut net_bytes: i128 = 0;
        let candidates = [self.slots[slot].prev, self.slots[slot].next];
        for candidate in candidates {
            let subsumed = self.try_merge_blocks(slot, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= i128::from(subsumed);
            }
        }
        self.insert_free(slot);
        if self.slots[slot].is_split() {
            net_blocks += 1;
            net_bytes += i128::from(self.slots[slot].size);
        }
        self.for_pool(pool, |s| {
            apply_net(&mut s.inactive_split_blocks, net_blocks);
            apply_net(&mut s.inactive_split, net_bytes);
            s.active_blocks.decrease(1);
            s.active.decrease(original_size);
            s.requested.decrease(requested_size);
        });
    }

    /// Mirrors `try_merge_blocks`: if `src` exists and is free, `dst` absorbs
    /// it (taking its address when `src` precedes it); returns the subsumed
    /// size, or 0 when nothing merged.
    fn try_merge_blocks(&mut self, dst: usize, src: Option<usize>) -> u64 {
        let Some(src) = src else { return 0 };
        if self.slots[src].allocated {
            return 0;
        }
        self.remove_free(src);
        let (src_address, src_size, src_prev, src_next) = {
            let s = &self.slots[src];
            (s.address, s.size, s.prev, s.next)
        };
        if self.slots[dst].prev == Some(src) {
            // [src dst]
            let old_address = self.slots[dst].address;
            self.by_address.remove(&old_address);
            self.by_address.insert(src_address, dst);
            let d = &mut self.slots[dst];
            d.address = src_address;
            d.prev = src_prev;
            if let Some(p) = src_prev {
                self.slots[p].next = Some(dst);
            }
        } else {
            // [dst src]
            self.by_address.remove(&src_address);
            self.slots[dst].next = src_next;
            if let Some(n) = src_next {
                self.slots[n].prev = Some(dst);
            }
        }
        self.slots[dst].size += src_size;
        self.drop_slot(src);
        src_size
    }

    /// Mirrors `release_block`: `cudaFree` of a whole-segment free block;
    /// `segment` and `reserved_bytes` decrease.
    fn release_block(&mut self, slot: usize) {
        self.remove_free(slot);
        let (address, size, pool) = {
            let b = &self.slots[slot];
            (b.address, b.size, b.pool)
        };
        self.segments.remove(&address);
        self.by_address.remove(&address);
        self.for_pool(pool, |s| {
            s.segments.decrease(1);
            s.reserved.decrease(size);
        });
        self.drop_slot(slot);
    }

    /// Address for a new segment: the one-shot hint if usable, else the next
    /// synthetic address in the chosen order, else the lowest gap among live
    /// segments (only reached for sizes near 2^63 or after collisions with
    /// hinted addresses).
    fn segment_address(&mut self, size: u64) -> Option<u64> {
        if let Some(hint) = self.segment_address_hint.take() {
            if self.range_is_free(hint, size) {
                return Some(hint);
            }
        }
        match self.address_order {
            AddressOrder::Ascending => {
                let candidate = self.next_address;
                if let Some(end) = candidate.checked_add(size) {
                    if self.range_is_free(candidate, size) {
                        self.next_address = end;
                        return Some(candidate);
                    }
                }
            }
            AddressOrder::Descending => {
                if let Some(candidate) = self.next_address.checked_sub(size) {
                    if self.range_is_free(candidate, size) {
                        self.next_address = candidate;
                        return Some(candidate);
                    }
                }
            }
        }
        let mut cursor = ROUND_LARGE;
        for (&start, seg) in &self.segments {
            let end = start.saturating_add(seg.size);
            if end <= cursor {
                continue;
            }
            if start >= cursor && start - cursor >= size {
                return Some(cursor);
            }
            cursor = cursor.max(end);
        }
        if u64::MAX - cursor >= size {
            Some(cursor)
        } else {
            None
        }
    }

    fn range_is_free(&self, address: u64, size: u64) -> bool {
        let Some(end) = address.checked_add(size) else {
            return false;
        };
        if address == 0 {
            return false;
        }
        if let Some((&start, seg)) = self.segments.range(..=address).next_back() {
            if start.saturating_add(seg.size) > address {
                return false;
            }
        }
        if let Some((&start, _)) = self.segments.range(address..).next() {
            if start < end {
                return false;
            }
        }
        true
    }
}

fn stat_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 1,
        Pool::Large => 2,
    }
}

/// Applies a signed net change the way `free_block` does: `increase` when
/// positive, `decrease` when negative.
fn apply_net(counter: &mut Counter, net: i128) {
    if net > 0 {
        counter.increase(u64::try_from(net).unwrap_or(u64::MAX));
    } else if net < 0 {
        counter.decrease(u64::try_from(-net).unwrap_or(u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Recomputes every current statistic from the block structure and
    /// compares it with the incrementally kept one.
    fn check_invariants(a: &CachingAllocator) {
        let mut expect = [Stats::default(); 3];
        for seg in a.snapshot() {
            let idx = stat_index(seg.pool);
            let total: u64 = seg.blocks.iter().map(|b| b.size).sum();
            assert_eq!(total, seg.size, "blocks tile the segment");
            let mut at = seg.address;
            for b in &seg.blocks {
                assert_eq!(b.address, at, "blocks are contiguous");
                at += b.size;
            }
            for pair in seg.blocks.windows(2) {
                assert!(
                    pair[0].allocated || pair[1].allocated,
                    "free neighbours were merged"
                );
            }
            for i in [0, idx] {
                let s = &mut expect[i];
                s.segments.current += 1;
                s.reserved.current += seg.size;
                for b in &seg.blocks {
                    if b.allocated {
                        s.allocations.current += 1;
                        s.allocated.current += b.size;
                        s.active_blocks.current += 1;
                        s.active.current += b.size;
                        s.requested.current += b.requested_size;
                    } else if b.inactive_split {
                        s.inactive_split_blocks.current += 1;
                        s.inactive_split.current += b.size;
                    }
                }
            }
        }
        for (got, e) in a.stats.iter().zip(expect.iter()) {
            assert_eq!(got.allocated.current, e.allocated.current);
            assert_eq!(got.reserved.current, e.reserved.current);
            assert_eq!(got.requested.current, e.requested.current);
            assert_eq!(got.active.current, e.active.current);
            assert_eq!(got.active_blocks.current, e.active_blocks.current);
            assert_eq!(got.inactive_split.current, e.inactive_split.current);
            assert_eq!(
                got.inactive_split_blocks.current,
                e.inactive_split_blocks.current
            );
            assert_eq!(got.segments.current, e.segments.current);
            assert_eq!(got.allocations.current, e.allocations.current);
        }
        let free_count = a.small_free.len() + a.large_free.len();
        let free_in_snapshot: usize = a
            .snapshot()
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| !b.allocated)
            .count();
        assert_eq!(free_count, free_in_snapshot);
    }

    #[test]
    fn rounding_pool_and_allocation_size() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(511), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(u64::MAX), u64::MAX);
        assert_eq!(pool_of(round_size(1_048_576)), Pool::Small);
        assert_eq!(pool_of(round_size(1_048_577)), Pool::Large);
        assert_eq!(allocation_size(512), 2 * MIB);
        assert_eq!(allocation_size(round_size(1_048_577)), 20 * MIB);
        assert_eq!(allocation_size(round_size(10 * MIB - 512)), 20 * MIB);
        // Rounding comes first: 10 MiB - 1 rounds to exactly 10 MiB.
        assert_eq!(allocation_size(round_size(10 * MIB - 1)), 10 * MIB);
        assert_eq!(allocation_size(round_size(10 * MIB)), 10 * MIB);
        assert_eq!(allocation_size(round_size(10 * MIB + 1)), 12 * MIB);
        assert_eq!(allocation_size(1 << 62), 1 << 62);
        assert!(should_split(Pool::Small, 2 * MIB, 2 * MIB - 512));
        assert!(!should_split(Pool::Small, 1024, 1024));
        assert!(should_split(Pool::Small, 1024, 512));
        assert!(!should_split(Pool::Large, 20 * MIB, 19 * MIB));
        assert!(should_split(Pool::Large, 20 * MIB, 19 * MIB - 512));
    }

    #[test]
    fn a_failed_cuda_malloc_releases_the_cache_and_counts_a_retry() {
        let mut a = CachingAllocator::new();
        let live = a.malloc(30 * MIB, 0, "live").unwrap();
        let huge = a.malloc(600 * MIB, 0, "huge").unwrap();
        let small = a.malloc(4096, 0, "small").unwrap();
        a.free(huge);
        a.free(small);
        assert_eq!(a.stats().reserved.current, 630 * MIB + 2 * MIB);
        // A cached block fits: used as usual, nothing released, no retry.
        let fits = a
            .malloc_after_failed_cuda_malloc(100 * MIB, 0, "fits")
            .unwrap();
        assert_eq!(a.alloc_retries(), 0);
        assert_eq!(a.stats().reserved.current, 632 * MIB);
        a.free(fits);
        // None fits: every unsplit cached segment (both pools) goes, then the new one.
        let more = a
            .malloc_after_failed_cuda_malloc(700 * MIB, 0, "more")
            .unwrap();
        assert_eq!(a.alloc_retries(), 1);
        let s = a.stats();
        assert_eq!(s.reserved.current, 30 * MIB + 700 * MIB);
        assert_eq!(s.segments.current, 2);
        assert_eq!(s.reserved.peak, 30 * MIB + 700 * MIB);
        assert_eq!(a.block_size(more), Some(700 * MIB));
        assert!(a.block_size(live).is_some());
        check_invariants(&a);
    }

    #[test]
    fn one_byte_takes_512_in_a_new_small_segment() {
        let mut a = CachingAllocator::new();
        let id = a.malloc(1, 0, "x").unwrap();
        let s = a.stats();
        assert_eq!(s.allocated.current, 512);
        assert_eq!(s.requested.current, 1);
        assert_eq!(s.reserved.current, 2 * MIB);
        assert_eq!(s.segments.current, 1);
        assert_eq!(s.inactive_split.current, 2 * MIB - 512);
        assert_eq!(s.inactive_split_blocks.current, 1);
        assert_eq!(a.pool_stats(Pool::Small), s);
        assert_eq!(a.pool_stats(Pool::Large), Stats::default());
        assert_eq!(a.block_size(id), Some(512));
        let snap = a.snapshot();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].pool, Pool::Small);
        assert_eq!(snap[0].blocks.len(), 2);
        assert_eq!(snap[0].blocks[0].label.as_deref(), Some("x"));
        assert_eq!(snap[0].blocks[0].requested_size, 1);
        assert!(snap[0].blocks[1].inactive_split);
        check_invariants(&a);
    }

    #[test]
    fn zero_and_oversized_requests_are_not_allocations() {
        let mut a = CachingAllocator::new();
        assert_eq!(a.malloc(0, 0, "empty"), None);
        assert_eq!(a.malloc(u64::MAX, 0, "huge"), None);
        assert_eq!(a.stats(), Stats::default());
        assert!(a.snapshot().is_empty());
    }

    #[test]
    fn two_8mb_requests_share_one_20mib_segment() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(8_000_000, 0, "a").unwrap();
        let y = a.malloc(8_000_000, 0, "b").unwrap();
        let s = a.stats();
        assert_eq!(s.reserved.current, 20 * MIB);
        assert_eq!(s.segments.current, 1);
        assert_eq!(s.allocated.current, 16_000_000);
        assert_eq!(s.inactive_split.current, 20 * MIB - 16_000_000);
        assert_eq!(s.inactive_split_blocks.current, 1);
        assert_eq!(a.address(y), a.address(x).map(|p| p + 8_000_000));
        check_invariants(&a);
    }

    #[test]
    fn ten_mib_plus_one_gets_a_12mib_segment_and_split_remainder() {
        let mut a = CachingAllocator::new();
        a.malloc(10 * MIB + 1, 0, "t").unwrap();
        let s = a.stats();
        assert_eq!(s.reserved.current, 12 * MIB);
        assert_eq!(s.allocated.current, 10 * MIB + 512);
        assert_eq!(s.requested.current, 10 * MIB + 1);
        assert_eq!(s.inactive_split.current, 2 * MIB - 512);
        assert_eq!(s.inactive_split_blocks.current, 1);
        let snap = a.snapshot();
        assert_eq!(
            snap[0].blocks.iter().map(|b| b.size).collect::<Vec<_>>(),
            vec![10 * MIB + 512, 2 * MIB - 512]
        );
        check_invariants(&a);
    }

    #[test]
    fn thirty_two_mib_takes_its_own_segment_unsplit() {
        let mut a = CachingAllocator::new();
        a.malloc(32 * MIB, 0, "w").unwrap();
        let s = a.stats();
        assert_eq!(s.reserved.current, 32 * MIB);
        assert_eq!(s.allocated.current, 32 * MIB);
        assert_eq!(s.inactive_split.current, 0);
        assert_eq!(s.inactive_split_blocks.current, 0);
        assert_eq!(a.snapshot()[0].blocks.len(), 1);
        check_invariants(&a);
    }

    #[test]
    fn whole_block_handed_out_when_remainder_at_most_1mib() {
        let mut a = CachingAllocator::new();
        // 19 MiB -> 20 MiB segment; remainder 1 MiB is not > kSmallSize.
        let x = a.malloc(19 * MIB, 0, "x").unwrap();
        let s = a.stats();
        assert_eq!(s.reserved.current, 20 * MIB);
        assert_eq!(s.allocated.current, 20 * MIB);
        assert_eq!(s.requested.current, 19 * MIB);
        assert_eq!(s.inactive_split_blocks.current, 0);
        assert_eq!(a.block_size(x), Some(20 * MIB));
        // Free it; 18.5 MiB reuses the cached 20 MiB block, remainder 1.5 MiB
        // > 1 MiB is split off.
        assert!(a.free(x));
        let y = a.malloc(18 * MIB + MIB / 2, 0, "y").unwrap();
        let s = a.stats();
        assert_eq!(s.segments.current, 1);
        assert_eq!(s.allocated.current, 18 * MIB + MIB / 2);
        assert_eq!(s.inactive_split.current, MIB + MIB / 2);
        assert_eq!(a.block_size(y), Some(18 * MIB + MIB / 2));
        // A cached 12 MiB remainder handed out whole for 11.5 MiB.
        let mut b = CachingAllocator::new();
        b.malloc(8 * MIB, 0, "p").unwrap();
        let q = b.malloc(11 * MIB + MIB / 2, 0, "q").unwrap();
        assert_eq!(b.block_size(q), Some(12 * MIB));
        assert_eq!(b.stats().allocated.current, 20 * MIB);
        assert_eq!(b.stats().inactive_split_blocks.current, 0);
        assert_eq!(b.stats().inactive_split.current, 0);
        check_invariants(&a);
        check_invariants(&b);
    }

    #[test]
    fn reuse_after_free_keeps_reserved() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(4096, 0, "x").unwrap();
        let addr = a.address(x);
        assert!(a.free(x));
        assert!(!a.free(x), "double free is rejected");
        let s = a.stats();
        assert_eq!(s.allocated.current, 0);
        assert_eq!(s.allocated.peak, 4096);
        assert_eq!(s.reserved.current, 2 * MIB);
        assert_eq!(
            s.inactive_split_blocks.current, 0,
            "whole segment free again"
        );
        let y = a.malloc(4000, 0, "y").unwrap();
        assert_eq!(a.address(y), addr);
        assert_eq!(a.stats().segments.current, 1);
        assert_eq!(a.stats().segments.peak, 1);
        assert_eq!(a.address(x), None, "stale handle");
        check_invariants(&a);
    }

    #[test]
    fn best_fit_picks_smallest_then_lowest_address() {
        let mut a = CachingAllocator::new();
        let b12 = a.malloc(12 * MIB, 0, "12").unwrap();
        let b16 = a.malloc(16 * MIB, 0, "16").unwrap();
        let b14 = a.malloc(14 * MIB, 0, "14").unwrap();
        let addr14 = a.address(b14);
        for id in [b12, b16, b14] {
            a.free(id);
        }
        let x = a.malloc(13 * MIB, 0, "x").unwrap();
        assert_eq!(a.address(x), addr14);
        assert_eq!(a.block_size(x), Some(14 * MIB), "1 MiB remainder not split");
        assert_eq!(a.stats().segments.current, 3);
        // Two equal free blocks: the lower address wins.
        let mut b = CachingAllocator::new();
        let p = b.malloc(12 * MIB, 0, "p").unwrap();
        let q = b.malloc(12 * MIB, 0, "q").unwrap();
        let low = b.address(p);
        b.free(q);
        b.free(p);
        let r = b.malloc(11 * MIB, 0, "r").unwrap();
        assert_eq!(b.address(r), low);
        check_invariants(&a);
        check_invariants(&b);
    }

    #[test]
    fn streams_do_not_share_cached_blocks() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(4096, 0, "x").unwrap();
        a.free(x);
        a.malloc(4096, 1, "y").unwrap();
        assert_eq!(a.stats().segments.current, 2);
        let snap = a.snapshot();
        assert_eq!(snap[1].stream, 1);
        check_invariants(&a);
    }

    #[test]
    fn merged_neighbours_serve_a_bigger_request() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(4 * MIB, 0, "a").unwrap();
        let y = a.malloc(4 * MIB, 0, "b").unwrap();
        let z = a.malloc(4 * MIB, 0, "c").unwrap();
        let base = a.address(x).unwrap();
        assert_eq!(a.stats().inactive_split.current, 8 * MIB);
        a.free(x);
        let s = a.stats();
        assert_eq!(s.inactive_split_blocks.current, 2);
        assert_eq!(s.inactive_split.current, 12 * MIB);
        a.free(y);
        // x and y merged into one 8 MiB block at the segment start.
        let s = a.stats();
        assert_eq!(s.inactive_split_blocks.current, 2);
        assert_eq!(s.inactive_split.current, 16 * MIB);
        let snap = a.snapshot();
        assert_eq!(
            snap[0].blocks.iter().map(|b| b.size).collect::<Vec<_>>(),
            vec![8 * MIB, 4 * MIB, 8 * MIB]
        );
        // 7.5 MiB fits only in a merged block; equal 8 MiB blocks tie -> lowest address.
        let w = a.malloc(7 * MIB + MIB / 2, 0, "w").unwrap();
        assert_eq!(a.address(w), Some(base));
        assert_eq!(
            a.block_size(w),
            Some(8 * MIB),
            "0.5 MiB remainder not split"
        );
        assert_eq!(a.stats().segments.current, 1);
        a.free(w);
        a.free(z);
        let s = a.stats();
        assert_eq!(s.inactive_split_blocks.current, 0);
        assert_eq!(s.inactive_split.current, 0);
        assert_eq!(a.snapshot()[0].blocks.len(), 1);
        check_invariants(&a);
    }

    #[test]
    fn empty_cache_releases_only_fully_free_segments() {
        let mut a = CachingAllocator::new();
        let keep = a.malloc(4096, 0, "keep").unwrap();
        let big = a.malloc(32 * MIB, 0, "big").unwrap();
        let mid = a.malloc(5 * MIB, 0, "mid").unwrap();
        assert_eq!(a.stats().reserved.current, 2 * MIB + 32 * MIB + 20 * MIB);
        a.free(big);
        a.free(mid);
        a.empty_cache();
        let s = a.stats();
        assert_eq!(s.reserved.current, 2 * MIB);
        assert_eq!(s.reserved.peak, 54 * MIB);
        assert_eq!(s.segments.current, 1);
        assert_eq!(s.allocated.current, 4096);
        assert_eq!(
            s.inactive_split.current,
            2 * MIB - 4096,
            "free part of a live segment stays"
        );
        a.free(keep);
        a.empty_cache();
        assert_eq!(a.stats().reserved.current, 0);
        assert!(a.snapshot().is_empty());
        check_invariants(&a);
    }

    #[test]
    fn peaks_after_reset() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(30 * MIB, 0, "x").unwrap();
        let y = a.malloc(1000, 0, "y").unwrap();
        a.free(x);
        let s = a.stats();
        assert_eq!(s.allocated.peak, 30 * MIB + 1024);
        assert_eq!(s.requested.peak, 30 * MIB + 1000);
        a.reset_peaks();
        let s = a.stats();
        assert_eq!(s.allocated.peak, 1024);
        assert_eq!(s.reserved.peak, 32 * MIB);
        assert_eq!(s.requested.peak, 1000);
        assert_eq!(s.segments.peak, 2);
        assert_eq!(a.pool_stats(Pool::Large).allocated.peak, 0);
        a.empty_cache();
        a.free(y);
        let s = a.stats();
        assert_eq!(s.reserved.current, 2 * MIB);
        assert_eq!(s.reserved.peak, 32 * MIB);
        assert_eq!(s.allocated.peak, 1024);
    }

    #[test]
    fn small_and_large_pools_never_share_segments() {
        let mut a = CachingAllocator::new();
        let big = a.malloc(2 * MIB, 0, "big").unwrap();
        a.free(big);
        // 20 MiB of free large-pool space, yet a small request needs a new segment.
        a.malloc(MIB, 0, "small").unwrap();
        let s = a.stats();
        assert_eq!(s.segments.current, 2);
        assert_eq!(a.pool_stats(Pool::Small).reserved.current, 2 * MIB);
        assert_eq!(a.pool_stats(Pool::Large).reserved.current, 20 * MIB);
        let snap = a.snapshot();
        assert_eq!(
            snap.iter().map(|s| s.pool).collect::<Vec<_>>(),
            vec![Pool::Large, Pool::Small]
        );
        // And the other way round: 1 MiB + 1 byte is large even with small space free.
        let mut b = CachingAllocator::new();
        let s1 = b.malloc(512, 0, "s").unwrap();
        b.free(s1);
        b.malloc(MIB + 1, 0, "l").unwrap();
        assert_eq!(b.stats().segments.current, 2);
        check_invariants(&a);
        check_invariants(&b);
    }

    #[test]
    fn inactive_split_follows_the_source() {
        let mut a = CachingAllocator::new();
        // New split: +remainder, +1 block.
        let x = a.malloc(1024, 0, "x").unwrap();
        let base = a.address(x);
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 1024);
        assert_eq!(a.stats().inactive_split_blocks.current, 1);
        // Shrinking an already split free block: -size, count unchanged.
        let y = a.malloc(2048, 0, "y").unwrap();
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 3072);
        assert_eq!(a.stats().inactive_split_blocks.current, 1);
        // Freeing x (neighbour y allocated): a new inactive split block.
        a.free(x);
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 2048);
        assert_eq!(a.stats().inactive_split_blocks.current, 2);
        // An already split block taken whole: -size, -1.
        let z = a.malloc(1000, 0, "z").unwrap();
        assert_eq!(a.address(z), base, "best fit: the freed 1024-byte block");
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 3072);
        assert_eq!(a.stats().inactive_split_blocks.current, 1);
        // Freeing y merges with the trailing free block: counts -1 then +1.
        a.free(y);
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 1024);
        assert_eq!(a.stats().inactive_split_blocks.current, 1);
        // Freeing z merges everything: the segment is whole, not inactive split.
        a.free(z);
        assert_eq!(a.stats().inactive_split.current, 0);
        assert_eq!(a.stats().inactive_split_blocks.current, 0);
        assert_eq!(a.stats().inactive_split_blocks.peak, 2);
        check_invariants(&a);
    }

    /// Real record from an H200 with torch 2.11.0+cu130 (float32 MLP, width
    /// 64, hidden 256, batch 1, context 16).
    #[test]
    fn h200_mlp_record() {
        let mut a = CachingAllocator::new();
        a.malloc(65536, 0, "w1").unwrap();
        a.malloc(1024, 0, "b1").unwrap();
        a.malloc(65536, 0, "w2").unwrap();
        a.malloc(256, 0, "b2").unwrap();
        assert_eq!(a.stats().allocated.current, 132_608);
        assert_eq!(a.stats().reserved.current, 2_097_152);
        a.malloc(4096, 0, "input").unwrap();
        assert_eq!(a.stats().allocated.current, 136_704);
        a.reset_peaks();
        let hidden = a.malloc(16384, 0, "hidden").unwrap();
        a.malloc(33_554_432, 0, "cublas workspace").unwrap();
        a.malloc(1_048_576, 0, "cublaslt workspace").unwrap();
        let gelu = a.malloc(16384, 0, "gelu").unwrap();
        a.free(hidden);
        a.malloc(4096, 0, "output").unwrap();
        a.free(gelu);
        let s = a.stats();
        assert_eq!(s.allocated.current, 34_743_808);
        assert_eq!(s.allocated.peak, 34_772_480);
        assert_eq!(s.reserved.current, 35_651_584);
        check_invariants(&a);
    }

    /// Real record from an H200 (torch 2.11.0+cu130, `caching_allocator_alloc`
    /// / `caching_allocator_delete` on two streams, random trace #139): after
    /// every event all nine aggregate statistics, current and peak, in the
    /// order allocated, reserved, requested, active bytes, inactive-split
    /// bytes, inactive-split blocks, segments, allocations, active blocks.
    /// Covers 511/512-byte and 1 MiB + 1 requests, a 10 MiB - 1 request taking
    /// (and splitting) a cached 82 MiB block, per-stream caches, empty_cache
    /// and reset_peaks. Reproduced with synthetic (ascending) addresses.
    #[test]
    fn h200_two_stream_record() {
        let events: &[(u8, u64, u64, u32, [u64; 18])] = &[
            (
                b'M',
                0,
                6139036,
                0,
                [
                    6139392, 6139392, 20971520, 20971520, 6139036, 6139036, 6139392, 6139392,
                    14832128, 14832128, 1, 1, 1, 1, 1, 1, 1, 1,
                ],
            ),
            (
                b'M',
                1,
                85300397,
                1,
                [
                    92122624, 92122624, 106954752, 106954752, 91439433, 91439433, 92122624,
                    92122624, 14832128, 14832128, 1, 1, 2, 2, 2, 2, 2, 2,
                ],
            ),
            (
                b'F',
                0,
                0,
                0,
                [
                    85983232, 92122624, 106954752, 106954752, 85300397, 91439433, 85983232,
                    92122624, 0, 14832128, 0, 1, 2, 2, 1, 2, 1, 2,
                ],
            ),
            (
                b'F',
                1,
                0,
                0,
                [
                    0, 92122624, 106954752, 106954752, 0, 91439433, 0, 92122624, 0, 14832128, 0, 1,
                    2, 2, 0, 2, 0, 2,
                ],
            ),
            (
                b'M',
                2,
                9292532,
                0,
                [
                    9292800, 92122624, 106954752, 106954752, 9292532, 91439433, 9292800, 92122624,
                    11678720, 14832128, 1, 1, 2, 2, 1, 2, 1, 2,
                ],
            ),
            (
                b'M',
                3,
                512,
                1,
                [
                    9293312, 92122624, 109051904, 109051904, 9293044, 91439433, 9293312, 92122624,
                    13775360, 14832128, 2, 2, 3, 3, 2, 2, 2, 2,
                ],
            ),
            (
                b'M',
                4,
                511,
                1,
                [
                    9293824, 92122624, 109051904, 109051904, 9293555, 91439433, 9293824, 92122624,
                    13774848, 14832128, 2, 2, 3, 3, 3, 3, 3, 3,
                ],
            ),
            (
                b'R',
                0,
                0,
                0,
                [
                    9293824, 9293824, 109051904, 109051904, 9293555, 9293555, 9293824, 9293824,
                    13774848, 13774848, 2, 2, 3, 3, 3, 3, 3, 3,
                ],
            ),
            (
                b'M',
                5,
                10485759,
                1,
                [
                    19779584, 19779584, 109051904, 109051904, 19779314, 19779314, 19779584,
                    19779584, 89272320, 89272320, 3, 3, 3, 3, 4, 4, 4, 4,
                ],
            ),
            (
                b'M',
                6,
                4783528,
                0,
                [
                    24563200, 24563200, 109051904, 109051904, 24562842, 24562842, 24563200,
                    24563200, 84488704, 89272320, 3, 3, 3, 3, 5, 5, 5, 5,
                ],
            ),
            (
                b'E',
                0,
                0,
                0,
                [
                    24563200, 24563200, 109051904, 109051904, 24562842, 24562842, 24563200,
                    24563200, 84488704, 89272320, 3, 3, 3, 3, 5, 5, 5, 5,
                ],
            ),
            (
                b'M',
                7,
                912044,
                1,
                [
                    25475584, 25475584, 109051904, 109051904, 25474886, 25474886, 25475584,
                    25475584, 83576320, 89272320, 3, 3, 3, 3, 6, 6, 6, 6,
                ],
            ),
            (
                b'F',
                7,
                0,
                0,
                [
                    24563200, 25475584, 109051904, 109051904, 24562842, 25474886, 24563200,
                    25475584, 84488704, 89272320, 3, 3, 3, 3, 5, 6, 5, 6,
                ],
            ),
            (
                b'F',
                4,
                0,
                0,
                [
                    24562688, 25475584, 109051904, 109051904, 24562331, 25474886, 24562688,
                    25475584, 84489216, 89272320, 3, 3, 3, 3, 4, 6, 4, 6,
                ],
            ),
            (
                b'M',
                8,
                9607371,
                1,
                [
                    34170368, 34170368, 109051904, 109051904, 34169702, 34169702, 34170368,
                    34170368, 74881536, 89272320, 3, 3, 3, 3, 5, 6, 5, 6,
                ],
            ),
            (
                b'E',
                0,
                0,
                0,
                [
                    34170368, 34170368, 109051904, 109051904, 34169702, 34169702, 34170368,
                    34170368, 74881536, 89272320, 3, 3, 3, 3, 5, 6, 5, 6,
                ],
            ),
            (
                b'M',
                9,
                1048577,
                1,
                [
                    35219456, 35219456, 109051904, 109051904, 35218279, 35218279, 35219456,
                    35219456, 73832448, 89272320, 3, 3, 3, 3, 6, 6, 6, 6,
                ],
            ),
            (
                b'F',
                2,
                0,
                0,
                [
                    25926656, 35219456, 109051904, 109051904, 25925747, 35218279, 25926656,
                    35219456, 83125248, 89272320, 4, 4, 3, 3, 5, 6, 5, 6,
                ],
            ),
            (
                b'F',
                8,
                0,
                0,
                [
                    16318976, 35219456, 109051904, 109051904, 16318376, 35218279, 16318976,
                    35219456, 92732928, 92732928, 5, 5, 3, 3, 4, 6, 4, 6,
                ],
            ),
            (
                b'M',
                10,
                1048577,
                0,
                [
                    17368064, 35219456, 109051904, 109051904, 17366953, 35218279, 17368064,
                    35219456, 91683840, 92732928, 5, 5, 3, 3, 5, 6, 5, 6,
                ],
            ),
            (
                b'F',
                3,
                0,
                0,
                [
                    17367552, 35219456, 109051904, 109051904, 17366441, 35218279, 17367552,
                    35219456, 89587200, 92732928, 4, 5, 3, 3, 4, 6, 4, 6,
                ],
            ),
            (
                b'F',
                5,
                0,
                0,
                [
                    6881792, 35219456, 109051904, 109051904, 6880682, 35218279, 6881792, 35219456,
                    100072960, 100072960, 4, 5, 3, 3, 3, 6, 3, 6,
                ],
            ),
            (
                b'F',
                6,
                0,
                0,
                [
                    2098176, 35219456, 109051904, 109051904, 2097154, 35218279, 2098176, 35219456,
                    104856576, 104856576, 4, 5, 3, 3, 2, 6, 2, 6,
                ],
            ),
            (
                b'F',
                9,
                0,
                0,
                [
                    1049088, 35219456, 109051904, 109051904, 1048577, 35218279, 1049088, 35219456,
                    19922432, 104856576, 2, 5, 3, 3, 1, 6, 1, 6,
                ],
            ),
            (
                b'F',
                10,
                0,
                0,
                [
                    0, 35219456, 109051904, 109051904, 0, 35218279, 0, 35219456, 0, 104856576, 0,
                    5, 3, 3, 0, 6, 0, 6,
                ],
            ),
        ];
        let mut a = CachingAllocator::new();
        let mut ids = std::collections::HashMap::new();
        for (i, &(op, n, size, stream, expect)) in events.iter().enumerate() {
            match op {
                b'M' => {
                    ids.insert(n, a.malloc(size, stream, "t").unwrap());
                }
                b'F' => assert!(a.free(ids.remove(&n).unwrap())),
                b'E' => a.empty_cache(),
                _ => a.reset_peaks(),
            }
            let s = a.stats();
            let c = [
                s.allocated,
                s.reserved,
                s.requested,
                s.active,
                s.inactive_split,
                s.inactive_split_blocks,
                s.segments,
                s.allocations,
                s.active_blocks,
            ];
            let got: Vec<u64> = c.iter().flat_map(|c| [c.current, c.peak]).collect();
            assert_eq!(got, expect.to_vec(), "event {i}");
        }
        check_invariants(&a);
    }

    /// Deterministic random workload: incremental statistics must always
    /// equal the ones recomputed from the block structure.
    #[test]
    fn random_workload_keeps_invariants() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut a = CachingAllocator::new();
        let mut live: Vec<BlockId> = Vec::new();
        for step in 0..3000 {
            let r = next() % 100;
            if r < 55 || live.is_empty() {
                let size = match next() % 4 {
                    0 => next() % 4096 + 1,
                    1 => next() % (2 * MIB) + 1,
                    2 => next() % (12 * MIB) + 1,
                    _ => next() % (64 * MIB) + 1,
                };
                let stream = (next() % 2) as u32;
                live.push(a.malloc(size, stream, "r").unwrap());
            } else if r < 95 {
                let i = (next() as usize) % live.len();
                assert!(a.free(live.swap_remove(i)));
            } else if r < 98 {
                a.empty_cache();
            } else {
                a.reset_peaks();
            }
            if step % 7 == 0 {
                check_invariants(&a);
            }
        }
        for id in live.drain(..) {
            assert!(a.free(id));
        }
        a.empty_cache();
        let s = a.stats();
        assert_eq!(s.reserved.current, 0);
        assert_eq!(s.allocated.current, 0);
        assert_eq!(s.requested.current, 0);
        check_invariants(&a);
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(1 << 62, 0, "a").unwrap();
        let y = a.malloc((1 << 62) + 1, 0, "b").unwrap();
        let z = a.malloc(1 << 62, 0, "c").unwrap();
        assert_eq!(a.block_size(y), Some((1 << 62) + 512));
        assert_eq!(a.stats().reserved.current, 3 * (1u64 << 62) + ROUND_LARGE);
        a.free(x);
        a.free(z);
        a.empty_cache();
        assert!(a.malloc(1 << 62, 0, "d").is_some());
        check_invariants(&a);
    }

    #[test]
    fn replay_with_real_segment_addresses() {
        let mut a = CachingAllocator::new();
        a.set_next_segment_address(0x7000_0000);
        let x = a.malloc(100, 0, "x").unwrap();
        assert_eq!(a.address(x), Some(0x7000_0000));
        // A cached block serves the next request; the hint stays unused by it
        // but is consumed only when a segment is created.
        a.set_next_segment_address(0x1000_0000);
        let y = a.malloc(100, 0, "y").unwrap();
        assert_eq!(a.address(y), Some(0x7000_0200));
        let z = a.malloc(30 * MIB, 0, "z").unwrap();
        assert_eq!(a.address(z), Some(0x1000_0000));
        // An overlapping hint is ignored.
        a.set_next_segment_address(0x7000_0000 + 4096);
        let w = a.malloc(30 * MIB, 0, "w").unwrap();
        assert_ne!(a.address(w), Some(0x7000_1000));
        check_invariants(&a);
    }

    #[test]
    fn descending_addresses_let_newer_segments_win_ties() {
        let mut a = CachingAllocator::with_address_order(AddressOrder::Descending);
        let p = a.malloc(12 * MIB, 0, "p").unwrap();
        let q = a.malloc(12 * MIB, 0, "q").unwrap();
        assert_eq!(a.address(p), Some(SYNTHETIC_ADDRESS_TOP - 12 * MIB));
        assert_eq!(a.address(q), Some(SYNTHETIC_ADDRESS_TOP - 24 * MIB));
        let newer = a.address(q);
        a.free(p);
        a.free(q);
        let r = a.malloc(11 * MIB, 0, "r").unwrap();
        assert_eq!(a.address(r), newer);
        // Huge segments that do not fit below the top go to the lowest gap.
        let h = a.malloc(1 << 62, 0, "h").unwrap();
        assert_eq!(a.address(h), Some(SYNTHETIC_ADDRESS_TOP));
        check_invariants(&a);
    }

    #[test]
    fn a_few_dozen_events_take_well_under_a_millisecond() {
        let start = std::time::Instant::now();
        let runs = 100;
        for _ in 0..runs {
            let mut a = CachingAllocator::new();
            let mut ids = Vec::new();
            for i in 0..40u64 {
                ids.push(a.malloc((i + 1) * 70_001, 0, "t").unwrap());
                if i % 3 == 0 {
                    a.free(ids.remove(0));
                }
            }
            a.empty_cache();
            std::hint::black_box(a.stats());
        }
        let per_run = start.elapsed() / runs;
        assert!(per_run.as_micros() < 1000, "{per_run:?} per protocol");
    }
}
