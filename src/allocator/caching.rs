//! The block structure of PyTorch 2.11.0's `DeviceCachingAllocator` for one device: segments
//! cut into blocks, cached free blocks found by best fit, split and merged; with expandable
//! segments, one segment per stream and pool that maps pages as it grows and unmaps them on
//! `empty_cache`. Each rule carries the name of the C++ function it mirrors
//! (`c10/cuda/CUDACachingAllocator.cpp`); `docs/allocator-model.md` says how each was proven.

use super::address::{AddressOrder, AddressSpace};
use super::free_blocks::FreeBlocks;
use super::size::{allocation_size, pool_of, round_size, should_split, Pool, MAX_REQUEST};
use super::stats::{PoolStats, Stats};
use super::view::{BlockView, SegmentView};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap};

/// The allocator's settings the model covers (`PYTORCH_CUDA_ALLOC_CONF`): PyTorch's defaults, or
/// `expandable_segments:True`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocatorConfig {
    pub expandable_segments: bool,
    pub address_order: AddressOrder,
}

/// Handle to a block handed out by [`CachingAllocator::malloc`]. It becomes stale once the
/// block is freed; stale handles are rejected, not reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    slot: usize,
    generation: u64,
}

/// The name of an allocated block, interned by [`CachingAllocator::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Label(u32);

impl Label {
    /// Its number, in the order the names were interned.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Why an allocation was refused: the device had no memory left for it, even after the
/// allocator released its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of memory allocating {bytes} bytes")]
pub struct OutOfMemory {
    pub bytes: u64,
}

/// Address space an expandable segment reserves: more than any single GPU's memory (PyTorch
/// reserves 1.125 × the device's memory, rounded to pages).
const EXPANDABLE_RESERVATION: u64 = 1 << 40;
/// Where the model places the first expandable segment's address range.
const EXPANDABLE_BASE: u64 = 1 << 44;

/// One block (the C++ `Block`): a slice of a segment, allocated or free, mapped or (in an
/// expandable segment) not.
#[derive(Clone, Debug)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    stream: u32,
    pool: Pool,
    allocated: bool,
    /// Backed by device memory; false only for the unmapped parts of an expandable segment.
    mapped: bool,
    prev: Option<usize>,
    next: Option<usize>,
    label: Label,
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

/// A segment: one `cudaMalloc`, or the address range an expandable segment reserves.
#[derive(Clone, Copy, Debug)]
struct Segment {
    pool: Pool,
    stream: u32,
    expandable: bool,
}

/// Key of an unmapped block, ordered like `BlockComparatorAddress`: stream, address.
type UnmappedKey = (u32, u64);

/// Simulated `DeviceCachingAllocator` for one device. See the module documentation and
/// `docs/allocator-model.md` for what is and is not modelled.
#[derive(Clone, Debug)]
pub struct CachingAllocator {
    config: AllocatorConfig,
    slots: Vec<Block>,
    free_slots: Vec<usize>,
    /// `blocks` of the small and large pools: cached free (mapped) blocks.
    free: [FreeBlocks; 2],
    /// `unmapped` of the small and large pools (expandable segments only).
    unmapped: [BTreeMap<UnmappedKey, usize>; 2],
    /// Every segment by start address.
    segments: BTreeMap<u64, Segment>,
    /// Every segment's size by start address (what new segments must not overlap).
    extents: BTreeMap<u64, u64>,
    stats: PoolStats,
    addresses: AddressSpace,
    /// `num_alloc_retries`: allocations that released the cache and tried again.
    alloc_retries: u64,
    /// `num_ooms`: allocations refused for want of device memory.
    ooms: u64,
    /// The most `reserved` may reach: the device memory this allocator can get (`None`: no
    /// limit).
    capacity: Option<u64>,
    labels: Vec<String>,
    label_ids: HashMap<String, Label>,
    /// A fingerprint of the small pool's segments, allocated blocks and unmapped blocks, which
    /// together decide everything else about the pool (see [`window`]; the windows a replay
    /// follows are keyed on the small pool alone, so the large pool keeps none).
    small_fingerprint: u128,
}

impl Default for CachingAllocator {
    fn default() -> Self {
        Self::new()
    }
}

mod window;

fn pool_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

impl CachingAllocator {
    /// An allocator holding no memory, all statistics zero, with PyTorch's default settings and
    /// ascending synthetic segment addresses.
    pub fn new() -> Self {
        Self::with_config(AllocatorConfig::default())
    }

    /// Like [`new`](Self::new), choosing the order of synthetic addresses.
    pub fn with_address_order(address_order: AddressOrder) -> Self {
        Self::with_config(AllocatorConfig {
            address_order,
            ..Default::default()
        })
    }

    pub fn with_config(config: AllocatorConfig) -> Self {
        CachingAllocator {
            config,
            slots: Vec::new(),
            free_slots: Vec::new(),
            free: Default::default(),
            unmapped: [BTreeMap::new(), BTreeMap::new()],
            segments: BTreeMap::new(),
            extents: BTreeMap::new(),
            stats: PoolStats::default(),
            addresses: AddressSpace::new(config.address_order),
            alloc_retries: 0,
            ooms: 0,
            capacity: None,
            labels: vec![String::new()],
            label_ids: HashMap::new(),
            small_fingerprint: 0,
        }
    }

    pub fn config(&self) -> AllocatorConfig {
        self.config
    }

    /// The label `name`, interned once (an allocation then costs no string).
    pub fn label(&mut self, name: &str) -> Label {
        if let Some(l) = self.label_ids.get(name) {
            return *l;
        }
        let l = Label(u32::try_from(self.labels.len()).expect("fewer than 2^32 names"));
        self.labels.push(name.to_string());
        self.label_ids.insert(name.to_string(), l);
        l
    }

    /// The name of `label`.
    pub fn label_name(&self, label: Label) -> &str {
        &self.labels[label.0 as usize]
    }

    /// Allocates `size` requested bytes on stream `stream`, like `DeviceCachingAllocator::malloc`
    /// (reached by `raw_alloc_with_stream` or a tensor's storage allocation), the block named
    /// `label` in [`snapshot`](Self::snapshot).
    ///
    /// When new device memory is needed beyond the [capacity](Self::set_capacity), the first
    /// attempt fails as `cudaMalloc` does; then, as PyTorch does, `release_available_cached_blocks`
    /// does nothing (it returns at once while `max_split_size` is unlimited),
    /// `release_cached_blocks` releases what [`empty_cache`](Self::empty_cache) releases and
    /// `alloc_block(isRetry = true)` counts a retry (`num_alloc_retries`) and tries again; if
    /// that fails too, the allocation is refused and counted (`num_ooms`).
    ///
    /// Returns `None`, changing nothing else, when `size` is 0 (PyTorch makes no allocation for
    /// an empty storage: `allocate(0)` returns a null pointer), above [`MAX_REQUEST`], or out of
    /// memory ([`ooms`](Self::ooms) then grows).
    pub fn malloc(&mut self, size: u64, stream: u32, label: Label) -> Option<BlockId> {
        if size == 0 || size > MAX_REQUEST {
            return None;
        }
        // malloc: `size_t size = round_size(orig_size);`, `auto& pool = get_pool(size, stream);`
        let rounded = round_size(size);
        let pool = pool_of(rounded);
        // `get_free_block(params)`, else `alloc_block(params, ...)`, else release and retry.
        let slot = match self.get_free_block(pool, stream, rounded) {
            Some(slot) => slot,
            None => match self.alloc_block(pool, stream, rounded) {
                Some(slot) => slot,
                None => {
                    self.empty_cache();
                    self.alloc_retries += 1;
                    match self.alloc_block(pool, stream, rounded) {
                        Some(slot) => slot,
                        None => {
                            self.ooms += 1;
                            return None;
                        }
                    }
                }
            },
        };
        // `bool split_remainder = should_split(params.block, params.size(), ...)`
        let split = should_split(
            pool,
            self.config.expandable_segments,
            self.slots[slot].size,
            rounded,
        );
        Some(self.alloc_found_block(slot, rounded, size, split, label))
    }

    /// Limits `reserved` to `bytes` (the device memory this allocator can get), or lifts the
    /// limit with `None`.
    pub fn set_capacity(&mut self, bytes: Option<u64>) {
        self.capacity = bytes;
    }

    /// `num_ooms`: allocations refused for want of device memory.
    pub fn ooms(&self) -> u64 {
        self.ooms
    }

    /// Whether `bytes` more device memory can be had under the capacity.
    fn device_has(&self, bytes: u64) -> bool {
        self.capacity
            .is_none_or(|c| self.reserved_now().saturating_add(bytes) <= c)
    }

    /// `num_alloc_retries`: how many allocations released the cache and tried again.
    pub fn alloc_retries(&self) -> u64 {
        self.alloc_retries
    }

    /// Frees a block from [`malloc`](Self::malloc), like `DeviceCachingAllocator::free`
    /// followed by `free_block` (no stream uses recorded): the block returns to its pool's
    /// cache, merged with free neighbours of the same segment. Returns `false`, changing nothing,
    /// if `id` is not a live allocation (already freed, or stale).
    pub fn free(&mut self, id: BlockId) -> bool {
        let slot = id.slot;
        match self.slots.get(slot) {
            Some(b) if b.in_use && b.allocated && b.generation == id.generation => {}
            _ => return false,
        }
        self.fingerprint_block(slot);
        let (pool, size, requested) = {
            let b = &mut self.slots[slot];
            b.allocated = false;
            b.generation = b.generation.wrapping_add(1);
            b.label = Label::default();
            (b.pool, b.size, b.requested_size)
        };
        // free: `stats.allocation[..].decrease(1)`, `stats.allocated_bytes[..].decrease(size)`.
        self.stats.update(pool, |s| {
            s.allocations.decrease(1);
            s.allocated.decrease(size);
        });
        self.free_block(slot, size, requested);
        true
    }

    /// Mirrors `emptyCache` -> `release_cached_blocks` -> `release_blocks` (large pool, then
    /// small pool): every cached free block that is a whole segment is `cudaFree`d
    /// (`release_block`); segments holding any allocated block are kept, and so are their free
    /// parts. With expandable segments every free block gives back the whole pages inside it
    /// (`unmap_block`), and a segment left with one unmapped block is released.
    pub fn empty_cache(&mut self) {
        for pool in [Pool::Large, Pool::Small] {
            let free: Vec<usize> = self.free[pool_index(pool)].slots().collect();
            for slot in free {
                let segment = self.segment_of(slot);
                if self.segments[&segment].expandable {
                    self.unmap_block(slot);
                    if !self.slots[slot].is_split() {
                        self.release_expandable_segment(slot);
                    }
                } else if !self.slots[slot].is_split() {
                    self.release_block(slot);
                }
            }
        }
    }

    /// Mirrors `resetPeakStats`: every peak (all stat types) becomes the current value.
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    /// Aggregate statistics (`StatType::AGGREGATE`, the `*.all.*` keys).
    pub fn stats(&self) -> Stats {
        *self.stats.all()
    }

    /// `allocated_bytes.all.current`.
    pub fn allocated_now(&self) -> u64 {
        self.stats.all().allocated.current
    }

    /// `reserved_bytes.all.current`.
    pub fn reserved_now(&self) -> u64 {
        self.stats.all().reserved.current
    }

    /// Statistics of one pool (`small_pool` / `large_pool` keys).
    pub fn pool_stats(&self, pool: Pool) -> Stats {
        *self.stats.pool(pool)
    }

    /// The statistics as `torch.cuda.memory_stats` would report them now.
    pub fn device_stats(&self) -> crate::reading::DeviceStats {
        let s = self.stats();
        crate::reading::DeviceStats {
            requested_bytes: s.requested.current,
            inactive_split_bytes: s.inactive_split.current,
            inactive_split_blocks: s.inactive_split_blocks.current,
            segments: s.segments.current,
            alloc_retries: self.alloc_retries,
            ooms: self.ooms,
        }
    }

    /// Makes the next segment that has to be created start at `address` instead of the next
    /// synthetic address (one shot; ignored if the range would overlap a live segment). Used to
    /// replay a recorded trace with the driver's real addresses so that ties between equal-sized
    /// blocks resolve alike.
    pub fn set_next_segment_address(&mut self, address: u64) {
        self.addresses.hint(address);
    }

    /// Start address of a live allocated block, `None` for a stale handle.
    pub fn address(&self, id: BlockId) -> Option<u64> {
        self.live(id).map(|b| b.address)
    }

    /// Size of a live allocated block (rounded, whole block if not split).
    pub fn block_size(&self, id: BlockId) -> Option<u64> {
        self.live(id).map(|b| b.size)
    }

    /// All segments in address order with their blocks in address order, like `snapshot()` /
    /// `torch.cuda.memory_snapshot()`; an expandable segment shows as one segment per run of
    /// mapped blocks.
    pub fn snapshot(&self) -> Vec<SegmentView> {
        // Each segment's first block: the one in use at its address with none before it.
        let first: FxHashMap<u64, usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].in_use && self.slots[i].prev.is_none())
            .map(|i| (self.slots[i].address, i))
            .collect();
        let mut out = Vec::with_capacity(self.segments.len());
        for (&address, seg) in &self.segments {
            let mut cur = first.get(&address).copied();
            let mut view: Option<SegmentView> = None;
            while let Some(slot) = cur {
                let b = &self.slots[slot];
                if b.mapped {
                    let v = view.get_or_insert_with(|| SegmentView {
                        address: b.address,
                        pool: seg.pool,
                        stream: seg.stream,
                        size: 0,
                        blocks: Vec::new(),
                    });
                    v.size += b.size;
                    v.blocks.push(BlockView {
                        address: b.address,
                        size: b.size,
                        requested_size: b.requested_size,
                        allocated: b.allocated,
                        label: b.allocated.then(|| self.label_name(b.label).to_string()),
                        inactive_split: !b.allocated
                            && b.is_split()
                            && !self.config.expandable_segments,
                    });
                } else if let Some(v) = view.take() {
                    out.push(v);
                }
                cur = b.next;
            }
            out.extend(view);
        }
        out
    }

    // ----- internals -----

    /// Adds or removes (the same) member of the fingerprint of `pool`, if it is the small pool.
    fn fingerprint(&mut self, pool: Pool, kind: u64, stream: u32, address: u64, size: u64) {
        if pool == Pool::Small {
            self.small_fingerprint ^= window::fingerprint_of(kind, stream, address, size);
        }
    }

    /// Adds or removes (the same) allocated block `slot` in its pool's fingerprint.
    fn fingerprint_block(&mut self, slot: usize) {
        let b = &self.slots[slot];
        let (pool, stream, address, size) = (b.pool, b.stream, b.address, b.size);
        self.fingerprint(pool, 1, stream, address, size);
    }

    /// Adds or removes (the same) segment in its pool's fingerprint.
    fn fingerprint_segment(&mut self, pool: Pool, address: u64, size: u64) {
        self.fingerprint(pool, 2, 0, address, size);
    }

    fn live(&self, id: BlockId) -> Option<&Block> {
        self.slots
            .get(id.slot)
            .filter(|b| b.in_use && b.allocated && b.generation == id.generation)
    }

    /// The start of the segment holding `slot`.
    fn segment_of(&self, slot: usize) -> u64 {
        let address = self.slots[slot].address;
        *self
            .segments
            .range(..=address)
            .next_back()
            .expect("every block lies in a segment")
            .0
    }

    /// `BlockPool::insert_into_blocks`, or `unmapped.insert` for an unmapped block.
    fn insert_free(&mut self, slot: usize) {
        let b = &self.slots[slot];
        let (pool, stream, address, size) = (b.pool, b.stream, b.address, b.size);
        if b.mapped {
            self.free[pool_index(pool)].insert(stream, size, address, slot);
        } else {
            self.unmapped[pool_index(pool)].insert((stream, address), slot);
            self.fingerprint(pool, 3, stream, address, size);
        }
    }

    fn remove_free(&mut self, slot: usize) {
        let b = &self.slots[slot];
        let (pool, stream, address, size) = (b.pool, b.stream, b.address, b.size);
        if b.mapped {
            self.free[pool_index(pool)].remove(stream, size, address);
        } else if self.unmapped[pool_index(pool)]
            .remove(&(stream, address))
            .is_some()
        {
            self.fingerprint(pool, 3, stream, address, size);
        }
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
        b.label = Label::default();
        b.generation = b.generation.wrapping_add(1);
        self.free_slots.push(slot);
    }

    fn block(&self, slot: usize, address: u64, size: u64, mapped: bool) -> Block {
        let b = &self.slots[slot];
        Block {
            address,
            size,
            requested_size: 0,
            stream: b.stream,
            pool: b.pool,
            allocated: false,
            mapped,
            prev: None,
            next: None,
            label: Label::default(),
            generation: 0,
            in_use: true,
        }
    }

    /// Links `new` into its segment's chain between `prev` and `next` (`Block::splice`).
    fn splice(&mut self, new: usize, prev: Option<usize>, next: Option<usize>) {
        self.slots[new].prev = prev;
        self.slots[new].next = next;
        if let Some(p) = prev {
            self.slots[p].next = Some(new);
        }
        if let Some(n) = next {
            self.slots[n].prev = Some(new);
        }
    }

    /// What a free block of an expandable segment can grow to: itself and an unmapped block
    /// right after it (`expandable_size` in `get_free_block`).
    fn expandable_size(&self, slot: usize) -> u64 {
        let b = &self.slots[slot];
        let after = b
            .next
            .filter(|n| !self.slots[*n].mapped)
            .map_or(0, |n| self.slots[n].size);
        b.size.saturating_add(after)
    }

    /// Mirrors `get_free_block` (default config): `lower_bound` of (stream, size, null) in the
    /// pool's size-ordered set, i.e. the smallest cached block of the same stream that is at
    /// least `rounded` bytes, the lowest address among equal sizes. With expandable segments a
    /// block is judged by what it can grow to, so the block before unmapped memory is taken only
    /// when no other fits. The `max_split_size` checks never reject with the default unlimited
    /// `max_split_size`.
    fn get_free_block(&mut self, pool: Pool, stream: u32, rounded: u64) -> Option<usize> {
        let free = &self.free[pool_index(pool)];
        let first = free.first_at_least(stream, rounded)?;
        // A candidate can grow to no less than its size, and the next are no smaller: the first
        // wins at once unless unmapped memory follows it.
        let chosen = if self.config.expandable_segments
            && self.expandable_size(first) > self.slots[first].size
        {
            let mut candidates = free.at_least(stream, rounded);
            let mut chosen = candidates.next()?;
            for next in candidates {
                if self.expandable_size(next) >= self.expandable_size(chosen) {
                    break;
                }
                chosen = next;
            }
            chosen
        } else {
            first
        };
        let b = &self.slots[chosen];
        self.free[pool_index(pool)].remove(b.stream, b.size, b.address);
        Some(chosen)
    }

    /// Mirrors `alloc_block`'s success path: a new segment (`cudaMalloc` of
    /// `get_allocation_size`, one unsplit block; `segment` and `reserved_bytes` increase), or
    /// with expandable segments `try_allocate_expandable_block`.
    fn alloc_block(&mut self, pool: Pool, stream: u32, rounded: u64) -> Option<usize> {
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(pool, stream, rounded);
        }
        let alloc_size = allocation_size(rounded);
        if !self.device_has(alloc_size) {
            return None;
        }
        let slot = self.new_segment(pool, stream, alloc_size, false)?;
        self.stats.update(pool, |s| {
            s.segments.increase(1);
            s.reserved.increase(alloc_size);
        });
        Some(slot)
    }

    /// A segment of `size` bytes at a new address, one block (mapped unless `expandable`).
    fn new_segment(
        &mut self,
        pool: Pool,
        stream: u32,
        size: u64,
        expandable: bool,
    ) -> Option<usize> {
        let address = if expandable {
            // Address ranges are reserved at increasing addresses (as the H200's driver did), far
            // below the synthetic segments.
            let next = self
                .extents
                .last_key_value()
                .map_or(EXPANDABLE_BASE, |(a, s)| a + s);
            next.max(EXPANDABLE_BASE)
        } else {
            self.addresses.place(size, &self.extents)?
        };
        let slot = self.new_slot(Block {
            address,
            size,
            requested_size: 0,
            stream,
            pool,
            allocated: false,
            mapped: !expandable,
            prev: None,
            next: None,
            label: Label::default(),
            generation: 0,
            in_use: true,
        });
        self.segments.insert(
            address,
            Segment {
                pool,
                stream,
                expandable,
            },
        );
        self.extents.insert(address, size);
        self.fingerprint_segment(pool, address, size);
        Some(slot)
    }

    /// Mirrors `try_allocate_expandable_block`: the memory for `size` bytes at the end of a
    /// free block followed by unmapped memory (`find_expandable_block`), pages mapped as needed
    /// (`map_block`), merged into one free block of at least `size` bytes.
    fn try_allocate_expandable_block(
        &mut self,
        pool: Pool,
        stream: u32,
        size: u64,
    ) -> Option<usize> {
        let mut c = self.find_expandable_block(pool, stream, size)?;
        if !self.slots[c].mapped {
            let n = self.slots[c].size.min(size);
            c = self.map_block(c, n)?;
        }
        while self.slots[c].size < size {
            let next = self.slots[c].next.expect("unmapped memory follows");
            let n = (size - self.slots[c].size).min(self.slots[next].size);
            c = self.map_block(next, n)?;
        }
        self.remove_free(c);
        Some(c)
    }

    /// Mirrors `find_expandable_block`: an unmapped block of the stream (or the free mapped block
    /// just before it) from which enough free memory follows; else a new expandable segment.
    fn find_expandable_block(&mut self, pool: Pool, stream: u32, size: u64) -> Option<usize> {
        let allocatable = |a: &Self, b: Option<usize>| b.filter(|s| !a.slots[*s].allocated);
        for (&(s, _), &slot) in self.unmapped[pool_index(pool)].range((stream, 0)..) {
            if s != stream {
                break;
            }
            let c = allocatable(self, self.slots[slot].prev)
                .filter(|p| self.slots[*p].mapped)
                .unwrap_or(slot);
            let mut total = 0u64;
            let mut b = Some(c);
            while let Some(x) = allocatable(self, b) {
                total = total.saturating_add(self.slots[x].size);
                if total >= size {
                    return Some(c);
                }
                b = self.slots[x].next;
            }
        }
        let page = pool.page();
        let reservation = EXPANDABLE_RESERVATION.max(size.div_ceil(page).saturating_mul(page));
        let slot = self.new_segment(pool, stream, reservation, true)?;
        self.insert_free(slot);
        Some(slot)
    }

    /// Mirrors `map_block`: maps the pages covering the first `size` bytes of the unmapped block
    /// `slot` (the rest stays unmapped after it), merges the result with free mapped neighbours
    /// and caches it; `reserved_bytes` grows by the pages mapped. Returns the merged block;
    /// `None`, changing nothing, when the device has not that many pages left.
    fn map_block(&mut self, slot: usize, size: u64) -> Option<usize> {
        let page = self.slots[slot].pool.page();
        let mapped = size
            .div_ceil(page)
            .saturating_mul(page)
            .min(self.slots[slot].size);
        if !self.device_has(mapped) {
            return None;
        }
        self.remove_free(slot);
        self.slots[slot].mapped = true;
        if mapped < self.slots[slot].size {
            let (address, rest) = {
                let b = &self.slots[slot];
                (b.address + mapped, b.size - mapped)
            };
            let remaining = self.block(slot, address, rest, false);
            let remaining = self.new_slot(remaining);
            let next = self.slots[slot].next;
            self.splice(remaining, Some(slot), next);
            self.insert_free(remaining);
            self.slots[slot].size = mapped;
        }
        let prev = self.slots[slot].prev;
        self.try_merge_blocks(slot, prev);
        let next = self.slots[slot].next;
        self.try_merge_blocks(slot, next);
        self.insert_free(slot);
        let pool = self.slots[slot].pool;
        self.stats.update(pool, |s| s.reserved.increase(mapped));
        Some(slot)
    }

    /// Mirrors `unmap_block`: gives back the whole pages inside the free block `slot` (partial
    /// pages at its edges stay as free mapped blocks); the unmapped part joins unmapped
    /// neighbours.
    fn unmap_block(&mut self, slot: usize) {
        let (address, size) = (self.slots[slot].address, self.slots[slot].size);
        let (begin, end) = self.whole_pages(slot);
        if begin >= end {
            return;
        }
        self.remove_free(slot);
        if begin > address {
            let before = self.block(slot, address, begin - address, true);
            let before = self.new_slot(before);
            let prev = self.slots[slot].prev;
            self.splice(before, prev, Some(slot));
            self.insert_free(before);
        }
        if address + size > end {
            let after = self.block(slot, end, address + size - end, true);
            let after = self.new_slot(after);
            let next = self.slots[slot].next;
            self.splice(after, Some(slot), next);
            self.insert_free(after);
        }
        {
            let b = &mut self.slots[slot];
            b.address = begin;
            b.size = end - begin;
            b.mapped = false;
        }
        let prev = self.slots[slot].prev;
        self.try_merge_blocks(slot, prev);
        let next = self.slots[slot].next;
        self.try_merge_blocks(slot, next);
        self.insert_free(slot);
        let pool = self.slots[slot].pool;
        self.stats
            .update(pool, |s| s.reserved.decrease(end - begin));
    }

    /// The whole pages inside block `slot` of an expandable segment, from the first's address
    /// to the end of the last (`segmentRight(ptr)` and `segmentLeft(ptr + size)`, in pages from
    /// the segment's start); none where the first is not before the end.
    fn whole_pages(&self, slot: usize) -> (u64, u64) {
        let page = self.slots[slot].pool.page();
        let segment = self.segment_of(slot);
        let (address, size) = (self.slots[slot].address, self.slots[slot].size);
        (
            segment + (address - segment).div_ceil(page) * page,
            segment + (address + size - segment) / page * page,
        )
    }

    /// Mirrors `release_expandable_segment`: a segment left as one unmapped block gives back its
    /// address range.
    fn release_expandable_segment(&mut self, slot: usize) {
        self.remove_free(slot);
        let (address, pool) = (self.slots[slot].address, self.slots[slot].pool);
        self.segments.remove(&address);
        if let Some(size) = self.extents.remove(&address) {
            self.fingerprint_segment(pool, address, size);
        }
        self.drop_slot(slot);
    }

    /// Mirrors `alloc_found_block`: optionally splits `slot` (the allocated block keeps the
    /// front, the remainder goes back to the pool), updates the inactive-split statistics, then
    /// marks the block allocated and counts it.
    fn alloc_found_block(
        &mut self,
        slot: usize,
        rounded: u64,
        orig_size: u64,
        split_remainder: bool,
        label: Label,
    ) -> BlockId {
        let already_split = self.slots[slot].is_split();
        let pool = self.slots[slot].pool;
        let block = if split_remainder {
            // `remaining = block; block = new Block(device, stream, size, pool, block->ptr);`
            let (address, prev) = (self.slots[slot].address, self.slots[slot].prev);
            let front = self.block(slot, address, rounded, true);
            let block = self.new_slot(front);
            self.splice(block, prev, Some(slot));
            let remaining_size = {
                let r = &mut self.slots[slot];
                r.address += rounded;
                r.size -= rounded;
                r.size
            };
            self.insert_free(slot);
            if self.config.expandable_segments {
                // "The logic to track this stat for expandable blocks is not written, so we just
                // skip updating these stats for expandable blocks."
            } else if already_split {
                // "An already-split inactive block is being shrunk by size bytes."
                self.stats
                    .update(pool, |s| s.inactive_split.decrease(rounded));
            } else {
                // "A new split inactive block is being created from a previously unsplit block,
                // size remaining->size bytes."
                self.stats.update(pool, |s| {
                    s.inactive_split.increase(remaining_size);
                    s.inactive_split_blocks.increase(1);
                });
            }
            block
        } else {
            if already_split && !self.config.expandable_segments {
                // "An already-split block is becoming active."
                let size = self.slots[slot].size;
                self.stats.update(pool, |s| {
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
            b.label = label;
            b.size
        };
        self.fingerprint_block(block);
        self.stats.update(pool, |s| {
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

    /// Mirrors `free_block`: merges with the free previous and next blocks (`try_merge_blocks`),
    /// puts the result in the pool's cache, and applies the net inactive-split change (merged-away
    /// blocks leave it; the result joins it if its segment is still split), then the active and
    /// requested decreases.
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
        let expandable = self.config.expandable_segments;
        self.stats.update(pool, |s| {
            // Not tracked for expandable blocks (PyTorch skips it).
            if !expandable {
                s.inactive_split_blocks.apply_net(net_blocks);
                s.inactive_split.apply_net(net_bytes);
            }
            s.active_blocks.decrease(1);
            s.active.decrease(original_size);
            s.requested.decrease(requested_size);
        });
    }

    /// Mirrors `try_merge_blocks`: if `src` exists, is free and mapped alike, `dst` absorbs it
    /// (taking its address when `src` precedes it); returns the subsumed size, or 0 when nothing
    /// merged.
    fn try_merge_blocks(&mut self, dst: usize, src: Option<usize>) -> u64 {
        let Some(src) = src else { return 0 };
        if self.slots[src].allocated || self.slots[src].mapped != self.slots[dst].mapped {
            return 0;
        }
        self.remove_free(src);
        let (src_address, src_size, src_prev, src_next) = {
            let s = &self.slots[src];
            (s.address, s.size, s.prev, s.next)
        };
        if self.slots[dst].prev == Some(src) {
            // [src dst]
            let d = &mut self.slots[dst];
            d.address = src_address;
            d.prev = src_prev;
            if let Some(p) = src_prev {
                self.slots[p].next = Some(dst);
            }
        } else {
            // [dst src]
            self.slots[dst].next = src_next;
            if let Some(n) = src_next {
                self.slots[n].prev = Some(dst);
            }
        }
        self.slots[dst].size += src_size;
        self.drop_slot(src);
        src_size
    }

    /// Mirrors `release_block`: `cudaFree` of a whole-segment free block; `segment` and
    /// `reserved_bytes` decrease.
    fn release_block(&mut self, slot: usize) {
        self.remove_free(slot);
        let (address, size, pool) = {
            let b = &self.slots[slot];
            (b.address, b.size, b.pool)
        };
        self.segments.remove(&address);
        self.extents.remove(&address);
        self.addresses.release(address, size);
        self.fingerprint_segment(pool, address, size);
        self.stats.update(pool, |s| {
            s.segments.decrease(1);
            s.reserved.decrease(size);
        });
        self.drop_slot(slot);
    }

    /// Every free block's count, mapped or not, for the invariant checks of the tests.
    #[cfg(test)]
    fn cached_blocks(&self) -> usize {
        self.free.iter().map(FreeBlocks::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::address::SYNTHETIC_ADDRESS_TOP;
    use crate::allocator::size::ROUND_LARGE;

    fn malloc(a: &mut CachingAllocator, size: u64, stream: u32, name: &str) -> Option<BlockId> {
        let label = a.label(name);
        a.malloc(size, stream, label)
    }

    const MIB: u64 = 1 << 20;

    /// Recomputes every current statistic from the block structure and compares it with the
    /// incrementally kept one.
    pub(crate) fn check_invariants(a: &CachingAllocator) {
        let expandable = a.config().expandable_segments;
        let index = |p: Pool| match p {
            Pool::Small => 1,
            Pool::Large => 2,
        };
        let mut expect = [Stats::default(); 3];
        for seg in a.snapshot() {
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
            for i in [0, index(seg.pool)] {
                let s = &mut expect[i];
                s.segments.current += u64::from(!expandable);
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
        let got = [
            a.stats(),
            a.pool_stats(Pool::Small),
            a.pool_stats(Pool::Large),
        ];
        for (got, e) in got.iter().zip(expect.iter()) {
            assert_eq!(got.allocated.current, e.allocated.current);
            assert_eq!(got.reserved.current, e.reserved.current);
            assert_eq!(got.requested.current, e.requested.current);
            assert_eq!(got.active.current, e.active.current);
            assert_eq!(got.active_blocks.current, e.active_blocks.current);
            assert_eq!(got.segments.current, e.segments.current);
            assert_eq!(got.allocations.current, e.allocations.current);
            if !expandable {
                assert_eq!(got.inactive_split.current, e.inactive_split.current);
                assert_eq!(
                    got.inactive_split_blocks.current,
                    e.inactive_split_blocks.current
                );
            }
        }
        let free_in_snapshot: usize = a
            .snapshot()
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| !b.allocated)
            .count();
        assert_eq!(a.cached_blocks(), free_in_snapshot);
    }

    #[test]
    fn a_failed_cuda_malloc_releases_the_cache_and_counts_a_retry() {
        let mut a = CachingAllocator::new();
        let live = malloc(&mut a, 30 * MIB, 0, "live").unwrap();
        let huge = malloc(&mut a, 600 * MIB, 0, "huge").unwrap();
        let small = malloc(&mut a, 4096, 0, "small").unwrap();
        a.free(huge);
        a.free(small);
        assert_eq!(a.stats().reserved.current, 630 * MIB + 2 * MIB);
        // The device has 100 MiB more than the allocator holds.
        a.set_capacity(Some(732 * MIB));
        // A cached block fits: used as usual, nothing released, no retry.
        let fits = malloc(&mut a, 100 * MIB, 0, "fits").unwrap();
        assert_eq!(a.alloc_retries(), 0);
        assert_eq!(a.stats().reserved.current, 632 * MIB);
        a.free(fits);
        // None fits and the device lacks the memory: every unsplit cached segment (both pools)
        // goes, then the new one.
        let more = malloc(&mut a, 700 * MIB, 0, "more").unwrap();
        assert_eq!(a.alloc_retries(), 1);
        let s = a.stats();
        assert_eq!(s.reserved.current, 30 * MIB + 700 * MIB);
        assert_eq!(s.segments.current, 2);
        assert_eq!(s.reserved.peak, 30 * MIB + 700 * MIB);
        assert_eq!(a.block_size(more), Some(700 * MIB));
        assert!(a.block_size(live).is_some());
        // Nothing left to release: refused, counted, nothing changed.
        assert_eq!(malloc(&mut a, 10 * MIB, 0, "none"), None);
        assert_eq!((a.alloc_retries(), a.ooms()), (2, 1));
        assert_eq!(a.stats().reserved.current, 730 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn one_byte_takes_512_in_a_new_small_segment() {
        let mut a = CachingAllocator::new();
        let id = malloc(&mut a, 1, 0, "x").unwrap();
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
        assert_eq!(malloc(&mut a, 0, 0, "empty"), None);
        assert_eq!(malloc(&mut a, u64::MAX, 0, "huge"), None);
        assert_eq!(a.stats(), Stats::default());
        assert!(a.snapshot().is_empty());
    }

    #[test]
    fn two_8mb_requests_share_one_20mib_segment() {
        let mut a = CachingAllocator::new();
        let x = malloc(&mut a, 8_000_000, 0, "a").unwrap();
        let y = malloc(&mut a, 8_000_000, 0, "b").unwrap();
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
        malloc(&mut a, 10 * MIB + 1, 0, "t").unwrap();
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
        malloc(&mut a, 32 * MIB, 0, "w").unwrap();
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
        let x = malloc(&mut a, 19 * MIB, 0, "x").unwrap();
        let s = a.stats();
        assert_eq!(s.reserved.current, 20 * MIB);
        assert_eq!(s.allocated.current, 20 * MIB);
        assert_eq!(s.requested.current, 19 * MIB);
        assert_eq!(s.inactive_split_blocks.current, 0);
        assert_eq!(a.block_size(x), Some(20 * MIB));
        // Free it; 18.5 MiB reuses the cached 20 MiB block, remainder 1.5 MiB
        // > 1 MiB is split off.
        assert!(a.free(x));
        let y = malloc(&mut a, 18 * MIB + MIB / 2, 0, "y").unwrap();
        let s = a.stats();
        assert_eq!(s.segments.current, 1);
        assert_eq!(s.allocated.current, 18 * MIB + MIB / 2);
        assert_eq!(s.inactive_split.current, MIB + MIB / 2);
        assert_eq!(a.block_size(y), Some(18 * MIB + MIB / 2));
        // A cached 12 MiB remainder handed out whole for 11.5 MiB.
        let mut b = CachingAllocator::new();
        malloc(&mut b, 8 * MIB, 0, "p").unwrap();
        let q = malloc(&mut b, 11 * MIB + MIB / 2, 0, "q").unwrap();
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
        let x = malloc(&mut a, 4096, 0, "x").unwrap();
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
        let y = malloc(&mut a, 4000, 0, "y").unwrap();
        assert_eq!(a.address(y), addr);
        assert_eq!(a.stats().segments.current, 1);
        assert_eq!(a.stats().segments.peak, 1);
        assert_eq!(a.address(x), None, "stale handle");
        check_invariants(&a);
    }

    #[test]
    fn best_fit_picks_smallest_then_lowest_address() {
        let mut a = CachingAllocator::new();
        let b12 = malloc(&mut a, 12 * MIB, 0, "12").unwrap();
        let b16 = malloc(&mut a, 16 * MIB, 0, "16").unwrap();
        let b14 = malloc(&mut a, 14 * MIB, 0, "14").unwrap();
        let addr14 = a.address(b14);
        for id in [b12, b16, b14] {
            a.free(id);
        }
        let x = malloc(&mut a, 13 * MIB, 0, "x").unwrap();
        assert_eq!(a.address(x), addr14);
        assert_eq!(a.block_size(x), Some(14 * MIB), "1 MiB remainder not split");
        assert_eq!(a.stats().segments.current, 3);
        // Two equal free blocks: the lower address wins.
        let mut b = CachingAllocator::new();
        let p = malloc(&mut b, 12 * MIB, 0, "p").unwrap();
        let q = malloc(&mut b, 12 * MIB, 0, "q").unwrap();
        let low = b.address(p);
        b.free(q);
        b.free(p);
        let r = malloc(&mut b, 11 * MIB, 0, "r").unwrap();
        assert_eq!(b.address(r), low);
        check_invariants(&a);
        check_invariants(&b);
    }

    #[test]
    fn streams_do_not_share_cached_blocks() {
        let mut a = CachingAllocator::new();
        let x = malloc(&mut a, 4096, 0, "x").unwrap();
        a.free(x);
        malloc(&mut a, 4096, 1, "y").unwrap();
        assert_eq!(a.stats().segments.current, 2);
        let snap = a.snapshot();
        assert_eq!(snap[1].stream, 1);
        check_invariants(&a);
    }

    #[test]
    fn merged_neighbours_serve_a_bigger_request() {
        let mut a = CachingAllocator::new();
        let x = malloc(&mut a, 4 * MIB, 0, "a").unwrap();
        let y = malloc(&mut a, 4 * MIB, 0, "b").unwrap();
        let z = malloc(&mut a, 4 * MIB, 0, "c").unwrap();
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
        let w = malloc(&mut a, 7 * MIB + MIB / 2, 0, "w").unwrap();
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
        let keep = malloc(&mut a, 4096, 0, "keep").unwrap();
        let big = malloc(&mut a, 32 * MIB, 0, "big").unwrap();
        let mid = malloc(&mut a, 5 * MIB, 0, "mid").unwrap();
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
        let x = malloc(&mut a, 30 * MIB, 0, "x").unwrap();
        let y = malloc(&mut a, 1000, 0, "y").unwrap();
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
        let big = malloc(&mut a, 2 * MIB, 0, "big").unwrap();
        a.free(big);
        // 20 MiB of free large-pool space, yet a small request needs a new segment.
        malloc(&mut a, MIB, 0, "small").unwrap();
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
        let s1 = malloc(&mut b, 512, 0, "s").unwrap();
        b.free(s1);
        malloc(&mut b, MIB + 1, 0, "l").unwrap();
        assert_eq!(b.stats().segments.current, 2);
        check_invariants(&a);
        check_invariants(&b);
    }

    #[test]
    fn inactive_split_follows_the_source() {
        let mut a = CachingAllocator::new();
        // New split: +remainder, +1 block.
        let x = malloc(&mut a, 1024, 0, "x").unwrap();
        let base = a.address(x);
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 1024);
        assert_eq!(a.stats().inactive_split_blocks.current, 1);
        // Shrinking an already split free block: -size, count unchanged.
        let y = malloc(&mut a, 2048, 0, "y").unwrap();
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 3072);
        assert_eq!(a.stats().inactive_split_blocks.current, 1);
        // Freeing x (neighbour y allocated): a new inactive split block.
        a.free(x);
        assert_eq!(a.stats().inactive_split.current, 2 * MIB - 2048);
        assert_eq!(a.stats().inactive_split_blocks.current, 2);
        // An already split block taken whole: -size, -1.
        let z = malloc(&mut a, 1000, 0, "z").unwrap();
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
        malloc(&mut a, 65536, 0, "w1").unwrap();
        malloc(&mut a, 1024, 0, "b1").unwrap();
        malloc(&mut a, 65536, 0, "w2").unwrap();
        malloc(&mut a, 256, 0, "b2").unwrap();
        assert_eq!(a.stats().allocated.current, 132_608);
        assert_eq!(a.stats().reserved.current, 2_097_152);
        malloc(&mut a, 4096, 0, "input").unwrap();
        assert_eq!(a.stats().allocated.current, 136_704);
        a.reset_peaks();
        let hidden = malloc(&mut a, 16384, 0, "hidden").unwrap();
        malloc(&mut a, 33_554_432, 0, "cublas workspace").unwrap();
        malloc(&mut a, 1_048_576, 0, "cublaslt workspace").unwrap();
        let gelu = malloc(&mut a, 16384, 0, "gelu").unwrap();
        a.free(hidden);
        malloc(&mut a, 4096, 0, "output").unwrap();
        a.free(gelu);
        let s = a.stats();
        assert_eq!(s.allocated.current, 34_743_808);
        assert_eq!(s.allocated.peak, 34_772_480);
        assert_eq!(s.reserved.current, 35_651_584);
        check_invariants(&a);
    }

    /// Real record from an H200 (torch 2.11.0+cu130, `caching_allocator_alloc` /
    /// `caching_allocator_delete` on two streams, random trace #139): after every event all nine
    /// aggregate statistics, current and peak (tests/fixtures/allocator/h200-two-stream.json).
    /// Covers 511/512-byte and 1 MiB + 1 requests, a 10 MiB - 1 request taking (and splitting) a
    /// cached 82 MiB block, per-stream caches, empty_cache and reset_peaks. Reproduced with
    /// synthetic (ascending) addresses.
    #[test]
    fn h200_two_stream_record() {
        #[derive(serde::Deserialize)]
        struct Event {
            event: String,
            tensor: Option<u64>,
            size: Option<u64>,
            stream: Option<u32>,
            after: Stats,
        }
        #[derive(serde::Deserialize)]
        struct Record {
            events: Vec<Event>,
        }
        let record: Record = serde_json::from_str(include_str!(
            "../../tests/fixtures/allocator/h200-two-stream.json"
        ))
        .unwrap();
        let mut a = CachingAllocator::new();
        let mut ids = std::collections::HashMap::new();
        for (i, e) in record.events.iter().enumerate() {
            match e.event.as_str() {
                "malloc" => {
                    let id = malloc(&mut a, e.size.unwrap(), e.stream.unwrap(), "t").unwrap();
                    ids.insert(e.tensor.unwrap(), id);
                }
                "free" => assert!(a.free(ids.remove(&e.tensor.unwrap()).unwrap())),
                "empty_cache" => a.empty_cache(),
                _ => a.reset_peaks(),
            }
            assert_eq!(a.stats(), e.after, "event {i}");
        }
        check_invariants(&a);
    }

    /// Deterministic random workload: incremental statistics must always
    /// equal the ones recomputed from the block structure.
    #[test]
    fn random_workload_keeps_invariants() {
        let mut next = super::super::xorshift(0x9e37_79b9_7f4a_7c15);
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
                live.push(malloc(&mut a, size, stream, "r").unwrap());
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
        let x = malloc(&mut a, 1 << 62, 0, "a").unwrap();
        let y = malloc(&mut a, (1 << 62) + 1, 0, "b").unwrap();
        let z = malloc(&mut a, 1 << 62, 0, "c").unwrap();
        assert_eq!(a.block_size(y), Some((1 << 62) + 512));
        assert_eq!(a.stats().reserved.current, 3 * (1u64 << 62) + ROUND_LARGE);
        a.free(x);
        a.free(z);
        a.empty_cache();
        assert!(malloc(&mut a, 1 << 62, 0, "d").is_some());
        check_invariants(&a);
    }

    #[test]
    fn replay_with_real_segment_addresses() {
        let mut a = CachingAllocator::new();
        a.set_next_segment_address(0x7000_0000);
        let x = malloc(&mut a, 100, 0, "x").unwrap();
        assert_eq!(a.address(x), Some(0x7000_0000));
        // A cached block serves the next request; the hint stays unused by it
        // but is consumed only when a segment is created.
        a.set_next_segment_address(0x1000_0000);
        let y = malloc(&mut a, 100, 0, "y").unwrap();
        assert_eq!(a.address(y), Some(0x7000_0200));
        let z = malloc(&mut a, 30 * MIB, 0, "z").unwrap();
        assert_eq!(a.address(z), Some(0x1000_0000));
        // An overlapping hint is ignored.
        a.set_next_segment_address(0x7000_0000 + 4096);
        let w = malloc(&mut a, 30 * MIB, 0, "w").unwrap();
        assert_ne!(a.address(w), Some(0x7000_1000));
        check_invariants(&a);
    }

    #[test]
    fn descending_addresses_let_newer_segments_win_ties() {
        let mut a = CachingAllocator::with_address_order(AddressOrder::Descending);
        let p = malloc(&mut a, 12 * MIB, 0, "p").unwrap();
        let q = malloc(&mut a, 12 * MIB, 0, "q").unwrap();
        assert_eq!(a.address(p), Some(SYNTHETIC_ADDRESS_TOP - 12 * MIB));
        assert_eq!(a.address(q), Some(SYNTHETIC_ADDRESS_TOP - 24 * MIB));
        let newer = a.address(q);
        a.free(p);
        a.free(q);
        let r = malloc(&mut a, 11 * MIB, 0, "r").unwrap();
        assert_eq!(a.address(r), newer);
        // Huge segments that do not fit below the top go to the lowest gap.
        let h = malloc(&mut a, 1 << 62, 0, "h").unwrap();
        assert_eq!(a.address(h), Some(SYNTHETIC_ADDRESS_TOP));
        check_invariants(&a);
    }

    #[test]
    fn segments_are_placed_as_the_driver_placed_them() {
        use super::super::address::{DRIVER_FIRST_UNUSED, DRIVER_GRANULE};
        let mut a = CachingAllocator::with_address_order(AddressOrder::Driver);
        let address = |a: &CachingAllocator, id| a.address(id).expect("a live block");
        // The first segment, with the unused space the driver left above it.
        let first = malloc(&mut a, 512, 0, "first").unwrap();
        let bottom = SYNTHETIC_ADDRESS_TOP - 2 * MIB - DRIVER_FIRST_UNUSED;
        assert_eq!(address(&a, first), bottom);
        // Too large for that space: granules reserved below, its tail left unused.
        let big = malloc(&mut a, 500 * MIB, 0, "big").unwrap();
        let granules = (500 * MIB).next_multiple_of(DRIVER_GRANULE);
        assert_eq!(address(&a, big), bottom - granules);
        // The lowest unused range that holds a segment takes it, at its low end: the big one's
        // tail (12 MiB) before the space above the first.
        let p = malloc(&mut a, 12 * MIB, 0, "p").unwrap();
        assert_eq!(address(&a, p), bottom - granules + 500 * MIB);
        let q = malloc(&mut a, 12 * MIB, 0, "q").unwrap();
        assert_eq!(address(&a, q), bottom + 2 * MIB);
        let r = malloc(&mut a, 12 * MIB, 0, "r").unwrap();
        assert_eq!(address(&a, r), bottom + 14 * MIB);
        // Equal free blocks: the lower address (the older segment here) wins the tie.
        let older = address(&a, p);
        a.free(p);
        a.free(q);
        let s = malloc(&mut a, 11 * MIB, 0, "s").unwrap();
        assert_eq!(address(&a, s), older);
        // A segment given back leaves its range unused again, taken first when it holds one.
        a.free(r);
        a.empty_cache();
        let t = malloc(&mut a, 12 * MIB, 0, "t").unwrap();
        assert_eq!(address(&a, t), bottom + 2 * MIB);
        check_invariants(&a);
    }
}
