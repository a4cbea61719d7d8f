//! The live allocations of a replay, by number (in the order they were made), each with its
//! block, its tag and the block's size, in pages: a page whose allocations are all freed is given
//! back, so that a replay holds memory for what is live rather than for every allocation it saw.

/// An allocation's block, its tag and the block's size.
pub(crate) type LiveBlock<T> = (crate::allocator::BlockId, T, u64);

/// One page: its allocations (`None` once freed) and how many still live.
type Page<T> = (Vec<Option<LiveBlock<T>>>, usize);

/// Allocations by number (in the order they were made) while they live, in pages of
/// [`LiveBlocks::PAGE`] numbers: a page whose allocations are all freed is given back, so that a
/// replay holds memory for what is live rather than for every allocation of the run.
pub(crate) struct LiveBlocks<T> {
    /// The pages (`None` once given back).
    pages: Vec<Option<Page<T>>>,
}

impl<T> Default for LiveBlocks<T> {
    fn default() -> LiveBlocks<T> {
        LiveBlocks { pages: Vec::new() }
    }
}

impl<T: Copy> LiveBlocks<T> {
    pub(crate) const PAGE: usize = 2048;

    /// The next allocation's block.
    pub(crate) fn push(&mut self, block: LiveBlock<T>) {
        let (entries, live) = self
            .page_being_filled()
            .as_mut()
            .expect("a page being filled");
        *live += 1;
        entries.push(Some(block));
    }

    /// Numbers the next `count` allocations, freed already (a page filled with allocations all
    /// freed is given back at once).
    pub(crate) fn push_freed(&mut self, mut count: usize) {
        while count > 0 {
            let page = self.page_being_filled();
            let (entries, live) = page.as_mut().expect("a page being filled");
            let numbered = count.min(Self::PAGE - entries.len());
            entries.resize(entries.len() + numbered, None);
            count -= numbered;
            if *live == 0 && entries.len() == Self::PAGE {
                *page = None;
            }
        }
    }

    /// The page the next number falls in (a new one where the last is full).
    fn page_being_filled(&mut self) -> &mut Option<(Vec<Option<LiveBlock<T>>>, usize)> {
        if !matches!(self.pages.last(), Some(Some((entries, _))) if entries.len() < Self::PAGE) {
            self.pages.push(Some((Vec::with_capacity(Self::PAGE), 0)));
        }
        self.pages.last_mut().expect("a page being filled")
    }

    /// The number the next allocation gets.
    pub(crate) fn next_number(&self) -> u32 {
        let filled = match self.pages.last() {
            None => return 0,
            Some(Some((entries, _))) => entries.len(),
            // A page given back was full.
            Some(None) => Self::PAGE,
        };
        u32::try_from(self.pages.len().saturating_sub(1) * Self::PAGE + filled)
            .expect("allocations are numbered in 32 bits")
    }

    /// The live allocations, by number, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &LiveBlock<T>)> + '_ {
        self.pages.iter().enumerate().flat_map(|(p, page)| {
            page.iter().flat_map(move |(entries, _)| {
                entries.iter().enumerate().filter_map(move |(i, e)| {
                    let n = u32::try_from(p * Self::PAGE + i).expect("numbers in 32 bits");
                    e.as_ref().map(|e| (n, e))
                })
            })
        })
    }

    /// Allocation `alloc`'s block, if it lives.
    pub(crate) fn get(&self, alloc: u32) -> Option<&LiveBlock<T>> {
        let (page, at) = (alloc as usize / Self::PAGE, alloc as usize % Self::PAGE);
        self.pages.get(page)?.as_ref()?.0.get(at)?.as_ref()
    }

    /// Gives live allocation `alloc` its block.
    pub(crate) fn set_block(&mut self, alloc: u32, block: crate::allocator::BlockId) {
        let (page, at) = (alloc as usize / Self::PAGE, alloc as usize % Self::PAGE);
        if let Some(Some((entries, _))) = self.pages.get_mut(page) {
            if let Some(Some(entry)) = entries.get_mut(at) {
                entry.0 = block;
            }
        }
    }

    /// Allocation `alloc`'s block, taken out (`None`: freed already, or never made).
    pub(crate) fn take(&mut self, alloc: u32) -> Option<LiveBlock<T>> {
        let (page, at) = (alloc as usize / Self::PAGE, alloc as usize % Self::PAGE);
        let slot = self.pages.get_mut(page)?;
        let (entries, live) = slot.as_mut()?;
        let block = entries.get_mut(at)?.take()?;
        *live -= 1;
        if *live == 0 && entries.len() == Self::PAGE {
            *slot = None;
        }
        Some(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocation numbers run on through allocations numbered freed already and through pages
    /// given back, and a live one gets its block.
    #[test]
    fn allocations_are_numbered_through_freed_ones_and_pages_given_back() {
        use crate::allocator::BlockId;
        let mut blocks = LiveBlocks::<u8>::default();
        assert_eq!(blocks.next_number(), 0);
        let page = u32::try_from(LiveBlocks::<u8>::PAGE).expect("a page of 2 048");
        // A first page wholly freed (given back as it fills), then one live allocation.
        for n in 0..page {
            blocks.push_freed(1);
            assert_eq!(blocks.next_number(), n + 1);
        }
        assert!(blocks.get(0).is_none());
        blocks.push((BlockId::PENDING, 2, 512));
        assert_eq!(blocks.next_number(), page + 1);
        assert_eq!(blocks.get(page).map(|b| (b.1, b.2)), Some((2, 512)));
        // Many numbered freed at once, across pages: the full page with the live one is kept,
        // the next one (none live) given back as it fills.
        blocks.push_freed(2 * LiveBlocks::<u8>::PAGE + 5);
        assert_eq!(blocks.next_number(), 3 * page + 6);
        assert!(blocks.get(page).is_some() && blocks.get(2 * page + 1).is_none());
        let kept: Vec<bool> = blocks.pages.iter().map(Option::is_some).collect();
        assert_eq!(kept, [false, true, false, true]);
        let mut allocator = crate::allocator::CachingAllocator::new();
        let label = allocator.label("t");
        let block = allocator.malloc(512, 0, label).expect("a block");
        blocks.set_block(page, block);
        assert_eq!(blocks.take(page).map(|b| b.0), Some(block));
        assert!(blocks.get(page).is_none());
    }
}
