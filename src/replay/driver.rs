//! The one replay driver: allocations (each tagged with what its block holds, on its stream) and
//! frees, in order, and the stages that frame them, run through the allocator model into the
//! figures PyTorch reports per stage, the peaks of the run and what the blocks held when the card
//! was fullest. On a card, the allocator may use the card's room less what the process holds
//! outside it by then ([`super::outside::Outside`]: it grows as the process loads its kernels),
//! and runs out of memory there as PyTorch does, after releasing its cache and trying again.

use super::live::LiveBlocks;
use super::outside::OutsideBytes;
use super::program::{Loaded, Role};
use crate::allocator::{AllocatorConfig, CachingAllocator, Label, OutOfMemory};
use crate::reading::Figures;

/// What a block is tagged with: a small index (the budget's roles, a tensor's name).
pub trait Tag: Copy + Eq + std::fmt::Debug {
    /// How many tags there are, where that is known (the bytes by tag start at that length).
    const COUNT: usize;
    fn index(self) -> usize;
}

impl Tag for Role {
    const COUNT: usize = Role::ALL.len();
    fn index(self) -> usize {
        Role::index(self)
    }
}

impl Tag for Label {
    const COUNT: usize = 0;
    fn index(self) -> usize {
        Label::index(self)
    }
}

/// The device a replay runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// No limit: the run's own peaks.
    #[default]
    Unlimited,
    /// A card whose memory, less the reserve, is `room` bytes: the allocator may use them less
    /// what the process holds outside it by then.
    Card { room: u64 },
}

impl Device {
    /// The room of a card (`None`: unlimited).
    pub fn room(self) -> Option<u64> {
        match self {
            Device::Unlimited => None,
            Device::Card { room } => Some(room),
        }
    }
}

/// What a replay gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// Each stage: its name, its figures as the GPU script reads them (peaks reset at the
    /// stage's start) and what the process held outside the allocator by its end.
    pub stages: Vec<(String, Figures, u64)>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The most the device held for the process at once: `reserved` and what lived outside the
    /// allocator then; and `allocated` and what lived outside it, at its most.
    pub peak_device: u64,
    pub peak_device_allocated: u64,
    /// When the device's use first reached its peak: the stage, `allocated`, `reserved` and what
    /// lived outside the allocator then, and each tag's blocks (indexed by [`Tag::index`]).
    pub peak_stage: String,
    pub allocated_at_peak: u64,
    pub reserved_at_peak: u64,
    pub outside_at_peak: u64,
    pub tags_at_peak: Vec<u64>,
    /// The allocation the device had no room for, and its stage.
    pub out_of_memory: Option<(String, OutOfMemory)>,
}

/// A replay in progress: allocations, frees and stage marks in, figures out.
pub struct Driver<T: Tag> {
    pub(crate) allocator: CachingAllocator,
    /// The label of the allocator's blocks that are tagged, not named.
    pub(crate) label: Label,
    /// The live allocations' blocks, by number.
    pub(crate) blocks: LiveBlocks<T>,
    /// The bytes of the blocks each tag holds.
    pub(crate) tags: Vec<u64>,
    pub(crate) out: Replayed,
    /// The stage open, and `allocated` and `reserved` at its start.
    pub(crate) open: Option<(String, (u64, u64))>,
    /// What the process has loaded, and what it then holds outside the allocator.
    loaded: Loaded,
    outside: OutsideBytes,
    device: Device,
}

impl<T: Tag> Driver<T> {
    /// A fresh process's allocator under `config`, on `device`, holding `outside` beside the
    /// allocator as it loads its work (zero: the allocator's figures alone).
    pub fn new(config: AllocatorConfig, device: Device, outside: OutsideBytes) -> Driver<T> {
        let mut allocator = CachingAllocator::with_config(config);
        let label = allocator.label("tensor");
        let mut driver = Driver {
            allocator,
            label,
            blocks: LiveBlocks::default(),
            tags: vec![0; T::COUNT],
            out: Replayed {
                stages: Vec::new(),
                peak_allocated: 0,
                peak_reserved: 0,
                peak_device: 0,
                peak_device_allocated: 0,
                peak_stage: String::new(),
                allocated_at_peak: 0,
                reserved_at_peak: 0,
                outside_at_peak: 0,
                tags_at_peak: Vec::new(),
                out_of_memory: None,
            },
            open: None,
            loaded: Loaded::Context,
            outside,
            device,
        };
        driver.limit();
        driver
    }

    /// What the process holds outside the allocator now.
    fn outside_now(&self) -> u64 {
        self.outside.at(self.loaded)
    }

    /// Limits the allocator to the card's room less what lives outside it now.
    fn limit(&mut self) {
        let capacity = self
            .device
            .room()
            .map(|room| room.saturating_sub(self.outside_now()));
        self.allocator.set_capacity(capacity);
    }

    /// Allocates `bytes` tagged `tag` on `stream`; its number, or `None` once the device had no
    /// room (recorded; the replay then stops). Zero bytes allocate nothing and take no number.
    pub fn alloc(&mut self, bytes: u64, tag: T, stream: u8, label: Label) -> Option<u32> {
        match self.allocator.malloc(bytes, u32::from(stream), label) {
            Some(block) => {
                let size = self.allocator.block_size(block).unwrap_or(0);
                let number = self.blocks.next_number();
                self.held(tag.index(), size as i64);
                self.blocks.push((block, tag, size));
                self.see_peaks();
                Some(number)
            }
            None => {
                let stage = self
                    .open
                    .as_ref()
                    .map_or_else(|| "setup".to_string(), |(n, _)| n.clone());
                self.out.out_of_memory = Some((stage, OutOfMemory { bytes }));
                None
            }
        }
    }

    /// Frees allocation `number` (one freed already, or never made, is ignored).
    pub fn free(&mut self, number: u32) {
        if let Some((block, tag, size)) = self.blocks.take(number) {
            self.held(tag.index(), -(size as i64));
            self.allocator.free(block);
        }
    }

    /// Moves the bytes tag `index` holds by `delta`.
    fn held(&mut self, index: usize, delta: i64) {
        if self.tags.len() <= index {
            self.tags.resize(index + 1, 0);
        }
        self.tags[index] = self.tags[index].saturating_add_signed(delta);
    }

    /// Raises the peaks of `allocated` to `allocated` (a run of a window followed reached it).
    pub(crate) fn raise_allocated_peak(&mut self, allocated: u64) {
        let outside = self.outside_now();
        self.out.peak_allocated = self.out.peak_allocated.max(allocated);
        self.out.peak_device_allocated = self.out.peak_device_allocated.max(allocated + outside);
    }

    /// Raises the peaks to what the allocator and the device hold now.
    pub(crate) fn see_peaks(&mut self) {
        let allocated = self.allocator.allocated_now();
        let reserved = self.allocator.reserved_now();
        let outside = self.outside_now();
        let out = &mut self.out;
        out.peak_allocated = out.peak_allocated.max(allocated);
        out.peak_reserved = out.peak_reserved.max(reserved);
        out.peak_device_allocated = out.peak_device_allocated.max(allocated + outside);
        if reserved + outside > out.peak_device {
            out.peak_device = reserved + outside;
            out.allocated_at_peak = allocated;
            out.reserved_at_peak = reserved;
            out.outside_at_peak = outside;
            out.tags_at_peak.clone_from(&self.tags);
            out.peak_stage = self
                .open
                .as_ref()
                .map_or_else(String::new, |(n, _)| n.clone());
        }
    }

    /// Begins stage `name`, the process having loaded `loaded` by then: the baselines read, the
    /// peaks reset. On a card, what the process newly holds outside the allocator takes from its
    /// room; `false` if it no longer fits beside what the allocator reserved (the replay then
    /// stops: the libraries cannot load their kernels).
    pub fn begin(&mut self, name: &str, loaded: Loaded) -> bool {
        let st = self.allocator.stats();
        self.open = Some((
            name.to_string(),
            (st.allocated.current, st.reserved.current),
        ));
        self.allocator.reset_peaks();
        if loaded > self.loaded {
            self.loaded = loaded;
            self.limit();
            self.see_peaks();
            if let Some(capacity) = self.allocator.capacity() {
                if st.reserved.current > capacity {
                    let bytes = st.reserved.current - capacity;
                    self.out.out_of_memory = Some((name.to_string(), OutOfMemory { bytes }));
                    return false;
                }
            }
        }
        true
    }

    /// The figures of the stage open so far.
    pub fn stage_figures(&self) -> Figures {
        let st = self.allocator.stats();
        let baseline = self.open.as_ref().map_or((0, 0), |(_, b)| *b);
        Figures {
            allocated_baseline_bytes: baseline.0,
            allocated_end_bytes: st.allocated.current,
            peak_allocated_bytes: st.allocated.peak,
            reserved_baseline_bytes: baseline.1,
            reserved_end_bytes: st.reserved.current,
            peak_reserved_bytes: st.reserved.peak,
        }
    }

    /// Ends the stage open, keeping its figures.
    pub fn end(&mut self) {
        if self.open.is_some() {
            let figures = self.stage_figures();
            let (name, _) = self.open.take().expect("a stage open");
            let outside = self.outside_now();
            self.out.stages.push((name, figures, outside));
        }
    }

    /// The figures: the stage still open closed, unless the device ran out of memory.
    pub fn finish(mut self) -> Replayed {
        if self.out.out_of_memory.is_none() {
            self.end();
        }
        self.out
    }

    /// The allocator, for what the driver does not wrap (its statistics, its map).
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    /// The allocator, to drive it directly (release its cache, place its next segment).
    pub fn allocator_mut(&mut self) -> &mut CachingAllocator {
        &mut self.allocator
    }

    /// The live allocations in the order they were made: number, tag, block size.
    pub fn live(&self) -> impl Iterator<Item = (u32, T, crate::allocator::BlockId, u64)> + '_ {
        self.blocks
            .iter()
            .map(|(n, &(block, tag, size))| (n, tag, block, size))
    }
}
