//! Where the model places a new segment. PyTorch orders equal-sized free blocks by their device
//! address, which the CUDA driver chooses; the model gives each new segment a synthetic address
//! (upwards one after the other, downwards one below the other, or as the driver placed them in
//! a transformers process), or one taken from a recorded trace. Addresses only break ties
//! between cached free blocks of equal size.

use std::collections::BTreeMap;

/// First synthetic segment address in [`AddressOrder::Ascending`] order (segments are then laid
/// out one after the other, upwards).
pub const SYNTHETIC_ADDRESS_BASE: u64 = 0x7f00_0000_0000;
/// Top of the address space [`AddressOrder::Descending`] and [`AddressOrder::Driver`] reserve
/// downwards from.
pub const SYNTHETIC_ADDRESS_TOP: u64 = 0x8000_0000_0000;

/// The granule in which the CUDA driver reserved address space for `cudaMalloc` on the H200
/// (driver 580, CUDA 13): of the 1 447 segments of the recorded traces placed below every other,
/// 1 436 began on a 32 MiB boundary, 1 297 right below the granules before them
/// (`scripts/segment-addresses.py`, docs/allocator-model.md).
pub const DRIVER_GRANULE: u64 = 32 << 20;

/// The address space the driver left unused right above a process's first segment (the 2 MiB
/// one `torch.zeros(1)` made), which its later segments fill upwards once the granules below
/// have no room: 416 MiB, the size that orders the most segments of the recorded traces as the
/// driver did (`scripts/segment-addresses.py --scan`; the driver's own allocations, unseen by the
/// allocator, take from that space, by more or less from one process to another).
pub const DRIVER_FIRST_UNUSED: u64 = 416 << 20;

/// Order in which synthetic addresses are given to new segments; it only matters when
/// equal-sized free blocks tie in the best-fit search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AddressOrder {
    /// Each new segment above the previous one (newer segments lose ties).
    #[default]
    Ascending,
    /// Each new segment right below the previous one (newer segments win ties), as the driver
    /// placed them in the measurement's libtorch process on the H200 (the block maps recorded
    /// from it).
    Descending,
    /// As the CUDA driver placed `cudaMalloc`'s segments in a transformers process on the H200
    /// (the recorded traces of `scripts/gpu/hf-record.py`): a segment takes the low end
    /// of the lowest unused range that holds it (the tails of the granules reserved so far, and
    /// [`DRIVER_FIRST_UNUSED`] above the first segment), else the low end of new granules of
    /// [`DRIVER_GRANULE`] reserved below all the others, their tail left unused.
    Driver,
}

/// The addresses handed out so far and the next one.
#[derive(Clone, Debug)]
pub(super) struct AddressSpace {
    order: AddressOrder,
    /// Ascending: the next free address; else the lowest address reserved.
    next: u64,
    /// A one-shot address for the next segment (a recorded trace's).
    hint: Option<u64>,
    /// [`AddressOrder::Driver`]: the unused ranges of the address space reserved (start → end).
    unused: BTreeMap<u64, u64>,
}

impl AddressSpace {
    pub(super) fn new(order: AddressOrder) -> AddressSpace {
        AddressSpace {
            order,
            next: match order {
                AddressOrder::Ascending => SYNTHETIC_ADDRESS_BASE,
                AddressOrder::Descending | AddressOrder::Driver => SYNTHETIC_ADDRESS_TOP,
            },
            hint: None,
            unused: BTreeMap::new(),
        }
    }

    pub(super) fn hint(&mut self, address: u64) {
        self.hint = Some(address);
    }

    /// An address for a new segment of `size` bytes, given the live segments (start → size): the
    /// one-shot hint if usable, else the next synthetic address in the chosen order, else the
    /// lowest gap among live segments (only reached for sizes near 2^63 or after collisions with
    /// hinted addresses).
    pub(super) fn place(&mut self, size: u64, live: &BTreeMap<u64, u64>) -> Option<u64> {
        if let Some(hint) = self.hint.take() {
            if range_is_free(live, hint, size) {
                return Some(hint);
            }
        }
        match self.order {
            AddressOrder::Ascending => {
                let candidate = self.next;
                if let Some(end) = candidate.checked_add(size) {
                    if range_is_free(live, candidate, size) {
                        self.next = end;
                        return Some(candidate);
                    }
                }
            }
            AddressOrder::Descending => {
                if let Some(candidate) = self.next.checked_sub(size) {
                    if range_is_free(live, candidate, size) {
                        self.next = candidate;
                        return Some(candidate);
                    }
                }
            }
            AddressOrder::Driver => {
                if let Some(candidate) = self.driver_place(size) {
                    if range_is_free(live, candidate, size) {
                        return Some(candidate);
                    }
                }
            }
        }
        let mut cursor = super::size::ROUND_LARGE;
        for (&start, &seg) in live {
            let end = start.saturating_add(seg);
            if end <= cursor {
                continue;
            }
            if start >= cursor && start - cursor >= size {
                return Some(cursor);
            }
            cursor = cursor.max(end);
        }
        (u64::MAX - cursor >= size).then_some(cursor)
    }

    /// [`AddressOrder::Driver`]'s address for `size` bytes: the low end of the lowest unused
    /// range that holds them, else of new granules reserved below the lowest (what they hold
    /// beyond `size` left unused; for the first segment, [`DRIVER_FIRST_UNUSED`] above it).
    fn driver_place(&mut self, size: u64) -> Option<u64> {
        let lowest_holding = self
            .unused
            .iter()
            .find(|(&start, &end)| end - start >= size)
            .map(|(&start, &end)| (start, end));
        if let Some((start, end)) = lowest_holding {
            self.unused.remove(&start);
            if start + size < end {
                self.unused.insert(start + size, end);
            }
            return Some(start);
        }
        let reserved = match self.next == SYNTHETIC_ADDRESS_TOP {
            true => size.checked_add(DRIVER_FIRST_UNUSED)?,
            false => size.checked_next_multiple_of(DRIVER_GRANULE)?,
        };
        let start = self.next.checked_sub(reserved)?;
        self.next = start;
        if size < reserved {
            self.unused.insert(start + size, start + reserved);
        }
        Some(start)
    }

    /// A segment of `size` bytes at `address` given back (`cudaFree`): under
    /// [`AddressOrder::Driver`] its range is unused again, joined to the unused ranges beside it.
    pub(super) fn release(&mut self, address: u64, size: u64) {
        if self.order != AddressOrder::Driver {
            return;
        }
        let (mut start, mut end) = (address, address.saturating_add(size));
        if let Some((&before, &before_end)) = self.unused.range(..start).next_back() {
            if before_end == start {
                self.unused.remove(&before);
                start = before;
            }
        }
        if let Some(after_end) = self.unused.remove(&end) {
            end = after_end;
        }
        self.unused.insert(start, end);
    }
}

fn range_is_free(live: &BTreeMap<u64, u64>, address: u64, size: u64) -> bool {
    let Some(end) = address.checked_add(size) else {
        return false;
    };
    if address == 0 {
        return false;
    }
    if let Some((&start, &seg)) = live.range(..=address).next_back() {
        if start.saturating_add(seg) > address {
            return false;
        }
    }
    if let Some((&start, _)) = live.range(address..).next() {
        if start < end {
            return false;
        }
    }
    true
}
