//! The caching allocator's size rules (PyTorch 2.11.0, `c10/core/AllocatorConfig.h` and
//! `c10/cuda/CUDACachingAllocator.cpp`): the 512-byte rounding, which pool a request goes to,
//! how large a new segment is, and when a cached block is split.

/// `kMinBlockSize`: every request is rounded up to a multiple of 512 bytes.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: largest (rounded) request served by the small pool, 1 MiB.
pub const SMALL_SIZE: u64 = 1_048_576;
/// `kSmallBuffer`: size of every small-pool segment (and of a small-pool page with expandable
/// segments), 2 MiB.
pub const SMALL_BUFFER: u64 = 2_097_152;
/// `kLargeBuffer` / default `large_segment_size()`: segment size for large requests below
/// [`MIN_LARGE_ALLOC`] (and the large-pool page with expandable segments), 20 MiB.
pub const LARGE_BUFFER: u64 = 20_971_520;
/// `kMinLargeAlloc`: from 10 MiB on, a request gets a segment of its own size (rounded up to
/// [`ROUND_LARGE`]).
pub const MIN_LARGE_ALLOC: u64 = 10_485_760;
/// `kRoundLarge`: large segments are multiples of 2 MiB.
pub const ROUND_LARGE: u64 = 2_097_152;
/// Largest request the model accepts: the largest multiple of [`LARGE_BUFFER`] that fits in a
/// `u64`, so that no rounding (to 512 bytes, 2 MiB segments or 20 MiB pages) can overflow.
pub const MAX_REQUEST: u64 = u64::MAX - (u64::MAX % LARGE_BUFFER) - LARGE_BUFFER;

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

impl Pool {
    /// `small` or `large`, as the allocator's snapshot names a segment's type.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }

    /// The page a segment of this pool grows by with expandable segments
    /// (`ExpandableSegment::segment_size_`).
    pub fn page(self) -> u64 {
        match self {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => LARGE_BUFFER,
        }
    }
}

/// Mirrors `round_size` (default config: `roundup_power2_divisions` is 0 for every interval, so
/// only the 512-byte rounding applies): sizes below [`MIN_BLOCK_SIZE`] become 512, others round
/// up to a multiple of 512. Sizes above `u64::MAX - 511` saturate at `u64::MAX`.
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
    }
}

/// Mirrors `get_pool` (no capture / private pool underway): a rounded size of at most
/// [`SMALL_SIZE`] goes to the small pool, anything larger to the large pool.
pub fn pool_of(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// Mirrors `get_allocation_size`: the size of the segment `cudaMalloc`ed when no cached block
/// fits a request of `rounded` bytes (already rounded by [`round_size`]). Small: 2 MiB; large
/// below 10 MiB: 20 MiB (`large_segment_size()`, default `kLargeBuffer`); otherwise rounded up
/// to a multiple of 2 MiB (saturating at `u64::MAX` for absurd sizes).
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// Mirrors `should_split` with `max_split_size` unlimited: a block of `block_size` bytes handed
/// out for `rounded` bytes is split when the remainder is at least 512 bytes (small pool, or any
/// pool with expandable segments) or strictly more than 1 MiB (large pool); otherwise the whole
/// block is handed out.
pub fn should_split(pool: Pool, expandable: bool, block_size: u64, rounded: u64) -> bool {
    let remaining = block_size.saturating_sub(rounded);
    if pool == Pool::Small || expandable {
        remaining >= MIN_BLOCK_SIZE
    } else {
        // `(size < max_split_size()) && (remaining > kSmallSize)`; the first term is always
        // true with the default max_split_size = SIZE_MAX.
        remaining > SMALL_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
        assert!(should_split(Pool::Small, false, 2 * MIB, 2 * MIB - 512));
        assert!(!should_split(Pool::Small, false, 1024, 1024));
        assert!(should_split(Pool::Small, false, 1024, 512));
        assert!(!should_split(Pool::Large, false, 20 * MIB, 19 * MIB));
        assert!(should_split(Pool::Large, false, 20 * MIB, 19 * MIB - 512));
        // With expandable segments a large block keeps no remainder of 512 bytes or more.
        assert!(should_split(Pool::Large, true, 20 * MIB, 19 * MIB));
        assert!(!should_split(Pool::Large, true, 20 * MIB, 20 * MIB - 511));
        assert_eq!(MAX_REQUEST % LARGE_BUFFER, 0);
        assert!(round_size(MAX_REQUEST).checked_add(LARGE_BUFFER).is_some());
    }
}
