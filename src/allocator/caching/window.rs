//! What lets a replay write a recorded window of events again without running it through the
//! block structure. A pool is decided by its segments, its allocated blocks and (with expandable
//! segments) its unmapped blocks: every free block is a whole mapped gap between them, since a
//! freed block always merges with its free mapped neighbours and a small block is always split
//! to its rounded size. So a fingerprint of those sets (kept as blocks and segments come and go,
//! for the small pool, the one windows are keyed on) tells when the pool is where it was; its
//! counters can then move as the recorded window moved them, and the blocks it left allocated
//! can be placed where it left them.

use super::{pool_index, BlockId, CachingAllocator, Label, Pool};
use crate::allocator::size::{allocation_size, pool_of, round_size};

/// One member of a pool's fingerprint: an allocated block (`kind` 1), a segment (`kind` 2) or
/// an unmapped block (`kind` 3).
/// The fingerprint is the exclusive or of its members'; 128 bits of two independent mixes.
pub(super) fn fingerprint_of(kind: u64, stream: u32, address: u64, size: u64) -> u128 {
    // SplitMix64's finaliser.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    // Two mixes a half: the kind in the size's low bits (every size is whole 512-byte units),
    // a stream other than the default one in the seed.
    debug_assert!(
        kind < 4 && size.is_multiple_of(512),
        "a kind of member and a whole size"
    );
    let hash = |seed: u64| {
        let seed = match stream {
            0 => seed,
            s => mix(seed ^ u64::from(s)),
        };
        mix(mix(seed ^ address) ^ size ^ kind)
    };
    (u128::from(hash(0x9e37_79b9_7f4a_7c15)) << 64) | u128::from(hash(0x2545_f491_4f6c_dd1d))
}

impl BlockId {
    /// A block not placed yet (an allocation of a window written again, until the window ends).
    pub const PENDING: BlockId = BlockId {
        slot: usize::MAX,
        generation: u64::MAX,
    };
}

impl CachingAllocator {
    /// The fingerprint of the small pool's segments, allocated blocks and unmapped blocks.
    pub fn small_pool_fingerprint(&self) -> u128 {
        self.small_fingerprint
    }

    /// Whether an allocation of `size` bytes may release the cache: no free block holds it, and
    /// the device may lack the memory it would take (a segment of its own; with expandable
    /// segments, at most a page more than its size: what it lacks, rounded up to a page once).
    pub fn might_release_cache(&self, size: u64) -> bool {
        let rounded = round_size(size);
        let pool = pool_of(rounded);
        if self.free[pool_index(pool)]
            .first_at_least(0, rounded)
            .is_some()
        {
            return false;
        }
        let need = match self.config.expandable_segments {
            true => rounded.saturating_add(pool.page()),
            false => allocation_size(rounded),
        };
        !self.device_has(need)
    }

    /// The device memory this allocator may get, if limited.
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// `pool`'s counters now ([`super::super::stats::Stats::currents`] order).
    pub fn pool_currents(&self, pool: Pool) -> [u64; 9] {
        self.stats.pool(pool).currents()
    }

    /// Moves `pool`'s counters and the aggregate's by `net`, each peak raised to where the
    /// counter was `rise` above its value now, as a recorded run of events moved them
    /// ([`super::super::stats::Stats::currents`] order).
    pub fn move_counters(&mut self, pool: Pool, net: &[i64; 9], rise: &[i64; 9]) {
        self.stats.update(pool, |s| s.move_by(net, rise));
    }

    /// Bytes asked for a live allocated block.
    pub fn requested_size(&self, id: BlockId) -> Option<u64> {
        self.live(id).map(|b| b.requested_size)
    }

    /// Allocates `size` bytes at `address` in `pool`, carved out of the free block that holds
    /// them, counting nothing (the counters moved already); `None` if no free block holds them.
    pub fn place_block(
        &mut self,
        pool: Pool,
        stream: u32,
        address: u64,
        size: u64,
        requested: u64,
        label: Label,
    ) -> Option<BlockId> {
        let holder = self.free[pool_index(pool)].holder(stream, address, size)?;
        self.remove_free(holder);
        let (start, end) = {
            let b = &self.slots[holder];
            (b.address, b.address + b.size)
        };
        if start < address {
            let front = self.block(holder, start, address - start, true);
            let front = self.new_slot(front);
            self.splice(front, self.slots[holder].prev, Some(holder));
            self.insert_free(front);
        }
        if address + size < end {
            let back = self.block(holder, address + size, end - address - size, true);
            let back = self.new_slot(back);
            self.splice(back, Some(holder), self.slots[holder].next);
            self.insert_free(back);
        }
        let b = &mut self.slots[holder];
        b.address = address;
        b.size = size;
        b.allocated = true;
        b.requested_size = requested;
        b.label = label;
        self.fingerprint_block(holder);
        Some(BlockId {
            slot: holder,
            generation: self.slots[holder].generation,
        })
    }
}
