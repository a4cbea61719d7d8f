//! Where the model places a new segment. PyTorch orders equal-sized free blocks by their device
//! address, which the CUDA driver chooses; the model gives each new segment a synthetic address,
//! increasing or decreasing, or one taken from a recorded trace. Addresses only break ties
//! between cached free blocks of equal size.

use std::collections::BTreeMap;

/// First synthetic segment address in [`AddressOrder::Ascending`] order (segments are then laid
/// out one after the other, upwards).
pub const SYNTHETIC_ADDRESS_BASE: u64 = 0x7f00_0000_0000;
/// End of the first synthetic segment in [`AddressOrder::Descending`] order (segments are then
/// laid out one below the other).
pub const SYNTHETIC_ADDRESS_TOP: u64 = 0x8000_0000_0000;

/// Order in which synthetic addresses are given to new segments; it only matters when
/// equal-sized free blocks tie in the best-fit search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AddressOrder {
    /// Each new segment above the previous one (newer segments lose ties).
    #[default]
    Ascending,
    /// Each new segment below the previous one (newer segments win ties), as the CUDA driver
    /// mostly did on the H200 (docs/allocator-model.md).
    Descending,
}

/// The addresses handed out so far and the next one.
#[derive(Clone, Debug)]
pub(super) struct AddressSpace {
    order: AddressOrder,
    /// Ascending: next free address; descending: end of the next segment.
    next: u64,
    /// A one-shot address for the next segment (a recorded trace's).
    hint: Option<u64>,
}

impl AddressSpace {
    pub(super) fn new(order: AddressOrder) -> AddressSpace {
        AddressSpace {
            order,
            next: match order {
                AddressOrder::Ascending => SYNTHETIC_ADDRESS_BASE,
                AddressOrder::Descending => SYNTHETIC_ADDRESS_TOP,
            },
            hint: None,
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
