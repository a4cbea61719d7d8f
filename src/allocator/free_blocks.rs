//! A pool's cached free blocks (`BlockPool::blocks`) in `BlockComparatorSize` order: stream,
//! size, address, as the best-fit search reads them. Per stream, blocks of at most 2 MiB that are
//! whole 512-byte units (every small-pool block, and the large pool's small ones) are kept by
//! size class, each class in address order, with a bitmap of the classes that hold any; other
//! blocks are kept in a sorted vector. The search then finds a small block by scanning a bitmap
//! of 4 096 bits instead of walking a tree.

/// The size-class unit: `kMinBlockSize`.
const UNIT: u64 = super::size::MIN_BLOCK_SIZE;
/// The largest size kept by class: a small-pool segment (`kSmallBuffer`).
const LARGEST_CLASSED: u64 = super::size::SMALL_BUFFER;
/// Classes 0 to `LARGEST_CLASSED / UNIT` (class `n` holds blocks of `n` units; 0 stays empty).
const CLASSES: usize = (LARGEST_CLASSED / UNIT) as usize + 1;
const WORDS: usize = CLASSES.div_ceil(64);

/// The class of a block of `size` bytes, when it is kept by class.
fn class_of(size: u64) -> Option<usize> {
    (size > 0 && size <= LARGEST_CLASSED && size.is_multiple_of(UNIT))
        .then_some((size / UNIT) as usize)
}

/// One stream's free blocks.
#[derive(Clone, Debug)]
struct StreamBlocks {
    stream: u32,
    /// Per class: (address, slot), by address.
    classes: Vec<Vec<(u64, usize)>>,
    /// Bit `n` set: class `n` holds a block.
    held: [u64; WORDS],
    /// The blocks not kept by class, keyed by size and address packed in one integer, in key
    /// order (an ordered map: a long generation on an unlimited device caches a segment per
    /// layer every few tokens, hundreds of thousands of blocks).
    others: std::collections::BTreeMap<u128, usize>,
}

fn key(size: u64, address: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(address)
}

impl StreamBlocks {
    fn new(stream: u32) -> StreamBlocks {
        StreamBlocks {
            stream,
            classes: vec![Vec::new(); CLASSES],
            held: [0; WORDS],
            others: Default::default(),
        }
    }

    /// The first class at or above `class` that holds a block.
    fn next_held(&self, class: usize) -> Option<usize> {
        let mut word = class / 64;
        if word >= WORDS {
            return None;
        }
        let mut bits = self.held[word] & (u64::MAX << (class % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word == WORDS {
                return None;
            }
            bits = self.held[word];
        }
    }

    fn insert(&mut self, size: u64, address: u64, slot: usize) {
        match class_of(size) {
            Some(c) => {
                let blocks = &mut self.classes[c];
                let at = blocks.partition_point(|&(a, _)| a < address);
                blocks.insert(at, (address, slot));
                self.held[c / 64] |= 1 << (c % 64);
            }
            None => {
                self.others.insert(key(size, address), slot);
            }
        }
    }

    fn remove(&mut self, size: u64, address: u64) {
        match class_of(size) {
            Some(c) => {
                let blocks = &mut self.classes[c];
                if let Ok(at) = blocks.binary_search_by_key(&address, |&(a, _)| a) {
                    blocks.remove(at);
                }
                if blocks.is_empty() {
                    self.held[c / 64] &= !(1 << (c % 64));
                }
            }
            None => {
                self.others.remove(&key(size, address));
            }
        }
    }

    /// The classes at or above the one `size` bytes need that hold a block, smallest first.
    fn held_classes(&self, size: u64) -> impl Iterator<Item = usize> + '_ {
        let first = usize::try_from(size.div_ceil(UNIT))
            .unwrap_or(usize::MAX)
            .max(1);
        let mut class = (first < CLASSES).then_some(first);
        std::iter::from_fn(move || {
            let c = self.next_held(class?)?;
            class = Some(c + 1);
            Some(c)
        })
    }

    /// The blocks kept by class of at least `size` bytes, in order: (size, address, slot).
    fn classed_at_least(&self, size: u64) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        self.held_classes(size).flat_map(move |c| {
            self.classes[c]
                .iter()
                .map(move |&(address, slot)| (c as u64 * UNIT, address, slot))
        })
    }

    /// The blocks not kept by class of at least `size` bytes, in order: (size, address, slot).
    fn others_at_least(&self, size: u64) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        self.others
            .range(key(size, 0)..)
            .map(|(&k, &slot)| ((k >> 64) as u64, k as u64, slot))
    }

    /// Every block of at least `size` bytes, smallest first, then lowest address.
    fn at_least(&self, size: u64) -> impl Iterator<Item = usize> + '_ {
        let mut classed = self.classed_at_least(size).peekable();
        let mut others = self.others_at_least(size).peekable();
        std::iter::from_fn(move || {
            let next = match (classed.peek(), others.peek()) {
                (Some(a), Some(b)) if (a.0, a.1) <= (b.0, b.1) => classed.next(),
                (Some(_), Some(_)) => others.next(),
                (Some(_), None) => classed.next(),
                (None, _) => others.next(),
            };
            next.map(|(_, _, slot)| slot)
        })
    }

    fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.at_least(0)
    }

    /// The first block of [`StreamBlocks::at_least`], found without walking the classes.
    fn first_at_least(&self, size: u64) -> Option<usize> {
        let classed = self.held_classes(size).next().map(|c| {
            let (address, slot) = self.classes[c][0];
            (c as u64 * UNIT, address, slot)
        });
        match (classed, self.others_at_least(size).next()) {
            (Some(a), Some(b)) if (b.0, b.1) < (a.0, a.1) => Some(b.2),
            (Some(a), _) => Some(a.2),
            (None, b) => b.map(|b| b.2),
        }
    }

    /// The block that holds `size` bytes at `address`, looked up by address in each class
    /// at least that large that holds any (the blocks are free, so no two overlap).
    fn holder(&self, address: u64, size: u64) -> Option<usize> {
        let end = address.checked_add(size)?;
        let holds = |block_size: u64, block_address: u64| {
            block_address <= address && end <= block_address + block_size
        };
        for c in self.held_classes(size) {
            let blocks = &self.classes[c];
            let after = blocks.partition_point(|&(a, _)| a <= address);
            if let Some(&(a, slot)) = after.checked_sub(1).map(|i| &blocks[i]) {
                if holds(c as u64 * UNIT, a) {
                    return Some(slot);
                }
            }
        }
        self.others_at_least(size)
            .find(|&(block_size, block_address, _)| holds(block_size, block_address))
            .map(|(_, _, slot)| slot)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.classes.iter().map(Vec::len).sum::<usize>() + self.others.len()
    }
}

/// A pool's free blocks, per stream in stream order.
#[derive(Clone, Debug, Default)]
pub(super) struct FreeBlocks(Vec<StreamBlocks>);

impl FreeBlocks {
    fn find(&self, stream: u32) -> Result<usize, usize> {
        self.0.binary_search_by_key(&stream, |s| s.stream)
    }

    pub(super) fn insert(&mut self, stream: u32, size: u64, address: u64, slot: usize) {
        let i = self.find(stream).unwrap_or_else(|i| {
            self.0.insert(i, StreamBlocks::new(stream));
            i
        });
        self.0[i].insert(size, address, slot);
    }

    pub(super) fn remove(&mut self, stream: u32, size: u64, address: u64) {
        if let Ok(i) = self.find(stream) {
            self.0[i].remove(size, address);
        }
    }

    /// The stream's free blocks of at least `size` bytes, smallest first, then lowest address.
    pub(super) fn at_least(&self, stream: u32, size: u64) -> impl Iterator<Item = usize> + '_ {
        self.find(stream)
            .ok()
            .into_iter()
            .flat_map(move |i| self.0[i].at_least(size))
    }

    /// The stream's smallest free block of at least `size` bytes (the lowest address among
    /// equals): the first of [`FreeBlocks::at_least`].
    pub(super) fn first_at_least(&self, stream: u32, size: u64) -> Option<usize> {
        self.find(stream)
            .ok()
            .and_then(|i| self.0[i].first_at_least(size))
    }

    /// The stream's free block that holds `size` bytes at `address`.
    pub(super) fn holder(&self, stream: u32, address: u64, size: u64) -> Option<usize> {
        self.find(stream)
            .ok()
            .and_then(|i| self.0[i].holder(address, size))
    }

    /// Every free block, in the pool's order.
    pub(super) fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().flat_map(StreamBlocks::slots)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.iter().map(StreamBlocks::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random inserts and removes of sizes on both sides of the classed range, checked after each
    /// against an ordered set of (stream, size, address).
    #[test]
    fn orders_like_block_comparator_size() {
        let mut blocks = FreeBlocks::default();
        let mut reference: std::collections::BTreeSet<(u32, u64, u64, usize)> =
            std::collections::BTreeSet::new();
        let mut next = super::super::xorshift(0x9e37_79b9_7f4a_7c15);
        let sizes = [
            512,
            1024,
            4096,
            1 << 20,
            (1 << 21) - 512,
            1 << 21,
            (1 << 21) + 512,
            20 << 20,
            700,
        ];
        for slot in 0..4000usize {
            let stream = (next() % 2) as u32;
            if next().is_multiple_of(3) && !reference.is_empty() {
                let k = (next() as usize) % reference.len();
                let &(s, size, address, _) = reference.iter().nth(k).expect("in range");
                reference.retain(|&(s2, z, a, _)| (s2, z, a) != (s, size, address));
                blocks.remove(s, size, address);
            } else {
                let size = sizes[(next() as usize) % sizes.len()];
                let address = (next() % 1000) * 4096;
                if reference
                    .iter()
                    .any(|&(s, z, a, _)| (s, z, a) == (stream, size, address))
                {
                    continue;
                }
                reference.insert((stream, size, address, slot));
                blocks.insert(stream, size, address, slot);
            }
            assert_eq!(blocks.len(), reference.len());
            let query = sizes[(next() as usize) % sizes.len()] - 1;
            for stream in 0..2 {
                let expected: Vec<usize> = reference
                    .iter()
                    .filter(|&&(s, z, _, _)| s == stream && z >= query)
                    .map(|&(_, _, _, slot)| slot)
                    .collect();
                assert_eq!(blocks.at_least(stream, query).collect::<Vec<_>>(), expected);
            }
        }
        let all: Vec<usize> = reference.iter().map(|&(_, _, _, slot)| slot).collect();
        assert_eq!(blocks.slots().collect::<Vec<_>>(), all);
    }

    /// Free blocks laid out without overlap, classed and not: the holder of a range found by
    /// address is the one a walk over every block finds, and none where no block holds it.
    #[test]
    fn the_holder_of_a_range_is_the_block_a_walk_finds() {
        let mut next = super::super::xorshift(0x2545_f491_4f6c_dd1d);
        let mut blocks = FreeBlocks::default();
        let mut laid = Vec::new();
        let mut address = 1 << 30;
        for slot in 0..600usize {
            let size = match next() % 4 {
                0 => (1 + next() % 8) * UNIT,
                1 => (1 + next() % 4096) * UNIT,
                2 => LARGEST_CLASSED + (1 + next() % 64) * UNIT,
                _ => 700 + next() % 5000,
            };
            blocks.insert(0, size, address, slot);
            laid.push((address, size, slot));
            address += size + (next() % 3) * UNIT;
        }
        let holds =
            |slot: usize, a: u64, z: u64| laid[slot].0 <= a && a + z <= laid[slot].0 + laid[slot].1;
        for _ in 0..4000 {
            let a = (1 << 30) + next() % (address - (1 << 30));
            let z = 1 + next() % (3 * LARGEST_CLASSED);
            let walked = blocks.slots().find(|&slot| holds(slot, a, z));
            assert_eq!(blocks.holder(0, a, z), walked, "{z} B at {a}");
        }
        for &(a, z, slot) in laid.iter().step_by(7) {
            assert_eq!(blocks.holder(0, a, z), Some(slot));
            assert_eq!(blocks.holder(1, a, z), None);
        }
    }
}
