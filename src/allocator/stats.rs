//! The allocator's statistics as `torch.cuda.memory_stats()` reports them: each a current value
//! and a peak, for the whole device and for each pool.

use super::size::Pool;

/// A statistic as the allocator keeps it (`c10::CachingAllocator::Stat`): its current value and
/// the highest value since the start or the last peak reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Counter {
    /// Value now (`*.current` in `memory_stats()`).
    pub current: u64,
    /// Highest value reached (`*.peak`).
    pub peak: u64,
}

impl Counter {
    /// `Stat::increase`: current grows, peak follows it up.
    #[inline]
    pub(super) fn increase(&mut self, amount: u64) {
        self.current = self.current.saturating_add(amount);
        self.peak = self.peak.max(self.current);
    }

    /// `Stat::decrease`: current shrinks, peak is kept.
    #[inline]
    pub(super) fn decrease(&mut self, amount: u64) {
        self.current = self.current.saturating_sub(amount);
    }

    /// A signed net change as `free_block` applies it: `increase` when positive, `decrease`
    /// when negative.
    pub(super) fn apply_net(&mut self, net: i128) {
        if net > 0 {
            self.increase(u64::try_from(net).unwrap_or(u64::MAX));
        } else if net < 0 {
            self.decrease(u64::try_from(-net).unwrap_or(u64::MAX));
        }
    }
}

/// One `StatType` slice of the device statistics (`DeviceStats`), with the
/// `torch.cuda.memory_stats()` key each field corresponds to (`all` for the aggregate,
/// `small_pool` / `large_pool` for one pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Stats {
    /// `allocated_bytes`: sizes of the allocated blocks (after rounding and splitting; a block
    /// handed out whole counts whole).
    pub allocated: Counter,
    /// `reserved_bytes`: sizes of the segments obtained from `cudaMalloc` (with expandable
    /// segments: the pages mapped).
    pub reserved: Counter,
    /// `requested_bytes`: the unrounded sizes asked for by the caller.
    pub requested: Counter,
    /// `active_bytes`: sizes of active blocks (equal to `allocated` here, since cross-stream
    /// uses are not modelled).
    pub active: Counter,
    /// `inactive_split_bytes`: bytes in free blocks that belong to a segment that is split (so
    /// cannot be released by `empty_cache`).
    pub inactive_split: Counter,
    /// `inactive_split`: number of such free blocks.
    pub inactive_split_blocks: Counter,
    /// `segment`: number of segments (`cudaMalloc` calls not yet freed).
    pub segments: Counter,
    /// `allocation`: number of allocated blocks.
    pub allocations: Counter,
    /// `active`: number of active blocks (equal to `allocations` here).
    pub active_blocks: Counter,
}

impl Stats {
    fn counters_mut(&mut self) -> [&mut Counter; 9] {
        [
            &mut self.allocated,
            &mut self.reserved,
            &mut self.requested,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.inactive_split_blocks,
            &mut self.segments,
            &mut self.allocations,
            &mut self.active_blocks,
        ]
    }

    /// Every counter's current value, in a fixed order (allocated, reserved, requested, active,
    /// inactive split bytes and blocks, segments, allocations, active blocks).
    pub fn currents(&self) -> [u64; 9] {
        let mut copy = *self;
        copy.counters_mut().map(|c| c.current)
    }

    /// Moves each counter by `net`, its peak raised to `rise` above its value before
    /// ([`Stats::currents`] order).
    pub(super) fn move_by(&mut self, net: &[i64; 9], rise: &[i64; 9]) {
        for ((c, &n), &r) in self.counters_mut().into_iter().zip(net).zip(rise) {
            c.peak = c.peak.max(c.current.saturating_add_signed(r));
            c.current = c.current.saturating_add_signed(n);
        }
    }

    /// `Stat::reset_peak` on every counter: each peak becomes the current value.
    pub(super) fn reset_peaks(&mut self) {
        for counter in self.counters_mut() {
            counter.peak = counter.current;
        }
    }
}

/// The statistics of the device and of each pool, indexed like `StatType`: 0 `AGGREGATE`,
/// 1 `SMALL_POOL`, 2 `LARGE_POOL`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats([Stats; 3]);

impl PoolStats {
    fn index(pool: Pool) -> usize {
        match pool {
            Pool::Small => 1,
            Pool::Large => 2,
        }
    }

    /// The aggregate (`*.all.*`).
    pub fn all(&self) -> &Stats {
        &self.0[0]
    }

    /// One pool's (`small_pool` / `large_pool`).
    pub fn pool(&self, pool: Pool) -> &Stats {
        &self.0[Self::index(pool)]
    }

    /// `get_stat_types_for_pool`: applies `f` to the aggregate and to the pool's own type.
    #[inline]
    pub(super) fn update(&mut self, pool: Pool, mut f: impl FnMut(&mut Stats)) {
        f(&mut self.0[0]);
        f(&mut self.0[Self::index(pool)]);
    }

    pub(super) fn reset_peaks(&mut self) {
        for s in self.0.iter_mut() {
            s.reset_peaks();
        }
    }
}
