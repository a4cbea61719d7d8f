//! The replay of a program ([`ProgramReplay`]): its events read in order through the driver, and
//! layers written again replayed without going through the small pool's blocks. A layer
//! written again from a record comes as a window of events (a `WrittenLayer`), marked with the
//! record's shape: its small-pool events, and where its large-pool events fall. The
//! first time a window of a shape meets the small pool in a given state (its fingerprint: its
//! segments, allocated and unmapped blocks), the window is replayed event by event and what it
//! did to the small pool is kept: for each run of its small-pool events, how the counters and
//! the bytes by role moved, and the blocks the window left allocated. When a window of the same
//! shape later meets the small pool in the same state, the same events make the same choices
//! there: the counters move as they moved, run by run, the blocks it leaves are placed where they
//! were left, and only its large-pool events (the cache's keys and values) go through the blocks.
//! The figures are those of the whole replay (`windows_give_what_the_whole_replay_gives` compares
//! them on every recorded inference run, under both settings, on an unlimited device and on
//! limited ones, from just above its peak of `allocated` to just above its peak of `reserved`).
//! A window is kept only if it freed nothing of the small pool made before it (which block it
//! frees is not in the fingerprint) and the device's cache was not released during it. Windows
//! of a shape that keep meeting the small pool in states none was kept in (the cache's keys and
//! values growing in the small pool) are recorded only as the count of those in a row reaches a
//! power of two; the others go through the blocks without being recorded. On a
//! limited device, a large allocation of a window followed may release the cache; where no free
//! block holds the allocation nor does the device have room for what it would take, the small
//! blocks the window holds at that point (recorded at each of its large allocations) are placed
//! where they were before the cache is released, and the rest of the window goes through the
//! blocks.

use super::driver::{Device, Driver, Replayed};
use super::outside::OutsideBytes;
use super::program::{Chunk, Event, Program, Role, WrittenLayer};
use crate::allocator::size::{round_size, Pool, SMALL_SIZE};
use crate::allocator::AllocatorConfig;
use crate::allocator::BlockId;
use std::rc::Rc;

/// Windows kept at most (the shapes of the kinds of layer, in each state of the small pool they
/// meet).
const KEPT: usize = 64;

/// A small block a window holds: its allocation number from the window's first, address, size
/// and bytes asked for.
type Held = (u32, u64, u64, u64);

/// Consecutive small-pool events of a window, as they moved the counters.
#[derive(Default)]
struct SmallRun {
    events: u32,
    /// The small pool's counters (and the aggregate's) after the run less before it, and the
    /// most they rose above their value before it.
    net: [i64; 9],
    rise: [i64; 9],
    /// Bytes by role after the run less before it.
    roles: [i64; Role::ALL.len()],
    /// Its allocations in order while the window is recorded: role and block size.
    allocations: Vec<(Role, u64)>,
    /// Once kept, those numbered live (the window leaves them live, or holds them at a large
    /// allocation where the small pool's blocks may be needed): how many numbered freed come
    /// before each, its role and block size; and how many numbered freed come after the last.
    numbered_live: Vec<(u32, Role, u64)>,
    freed_after: u32,
}

enum Item {
    Small(Box<SmallRun>),
    /// One event of the large pool, replayed through the blocks; for an allocation at which
    /// releasing the cache would change the small pool, where the window's blocks are then.
    Large(Option<Box<Placement>>),
}

/// The small blocks a window holds at one of its large allocations, and its allocations
/// numbered live before it that it freed already.
struct Placement {
    held: Vec<Held>,
    freed: Vec<u32>,
}

/// What one window did to the small pool.
struct Trajectory {
    items: Vec<Item>,
    /// The small blocks it left allocated.
    kept: Vec<Held>,
    /// The allocations numbered live that it frees (numbers from the window's first).
    freed_pending: Vec<u32>,
    /// The small pool's fingerprint when it ended.
    end: u128,
}

/// A window being replayed event by event, to keep what it does.
struct Recording {
    key: (u32, u128),
    first: u32,
    retries: u64,
    ooms: u64,
    start: [u64; 9],
    /// The small pool's counters when the current run of small events began.
    run_start: [u64; 9],
    items: Vec<Item>,
    /// Its allocations in the small pool: (number, block).
    small: Vec<(u32, BlockId)>,
    /// It freed a small block allocated before it: which one it frees decides its choices, and
    /// the fingerprint does not say, so the window is not kept.
    frees_older: bool,
}

/// A window written from what an earlier one did.
struct Following {
    trajectory: Rc<Trajectory>,
    at: usize,
    /// Events of the current run of small events still to pass.
    left: u32,
    first: u32,
}

enum Window {
    Recording(Box<Recording>),
    Following(Following),
    /// A window replayed through the blocks without being recorded.
    Passing,
}

pub(crate) struct Windows {
    /// Whether windows are followed (the tests compare with a replay where none is).
    pub(crate) follow: bool,
    /// The windows kept, by shape and the small pool's fingerprint at their start, and the order
    /// they were kept in (the oldest is let go first).
    kept: rustc_hash::FxHashMap<(u32, u128), Rc<Trajectory>>,
    kept_order: std::collections::VecDeque<(u32, u128)>,
    /// Per shape: how many windows of that shape in a row found none kept to follow.
    misses: Vec<u32>,
    open: Option<Window>,
    /// Windows followed so far.
    pub(crate) followed: u64,
    /// Windows followed whose small blocks were placed at a large allocation.
    pub(crate) placed_early: u64,
}

impl Windows {
    /// How many windows of `shape` in a row found none kept to follow.
    fn misses_of(&mut self, shape: u32) -> &mut u32 {
        let shape = shape as usize;
        if self.misses.len() <= shape {
            self.misses.resize(shape + 1, 0);
        }
        &mut self.misses[shape]
    }
}

impl Default for Windows {
    fn default() -> Windows {
        Windows {
            follow: true,
            kept: Default::default(),
            kept_order: Default::default(),
            misses: Vec::new(),
            open: None,
            followed: 0,
            placed_early: 0,
        }
    }
}

/// A counter or a block's size as a signed amount (all are far below 2^63).
fn signed(v: u64) -> i64 {
    i64::try_from(v).expect("a counter below 2^63")
}

/// The replay of a program: its chunks read in order through the driver, each layer written
/// again followed through its window where one was kept.
pub struct ProgramReplay {
    pub(crate) driver: Driver<Role>,
    /// The layers written again: their windows recorded, and the one being read.
    pub(crate) windows: Windows,
}

impl ProgramReplay {
    /// A fresh process's replay under `config` on `device`, holding `outside` beside the
    /// allocator as it loads its work.
    pub fn new(config: AllocatorConfig, device: Device, outside: OutsideBytes) -> ProgramReplay {
        ProgramReplay {
            driver: Driver::new(config, device, outside),
            windows: Windows::default(),
        }
    }

    /// What the replay gave so far.
    pub fn so_far(&self) -> &Replayed {
        &self.driver.out
    }

    /// The figures: the stage still open closed, unless the device ran out of memory.
    pub fn finish(self) -> Replayed {
        self.driver.finish()
    }

    /// Replays what a tape wrote next; `false` once the device had no room (the replay then
    /// stops).
    pub fn read(&mut self, chunk: &Chunk) -> bool {
        match chunk {
            Chunk::Events(events) => events.iter().all(|&e| match e {
                Event::Written { at } => self.written_layer(events.written(at)),
                e => self.event(e),
            }),
            Chunk::Begin(mark) => self.driver.begin(&mark.name, mark.loaded),
            Chunk::End => {
                self.driver.end();
                true
            }
        }
    }

    /// Replays one allocation or free outside a layer written again (no window is open);
    /// `false` once the device had no room (the replay then stops).
    fn event(&mut self, e: Event) -> bool {
        self.driver.out.out_of_memory.is_none() && self.plain_event(e)
    }

    /// Replays one allocation or free through the block structure.
    fn plain_event(&mut self, e: Event) -> bool {
        let d = &mut self.driver;
        match e {
            Event::Alloc {
                bytes,
                role,
                stream,
            } => d.alloc(bytes, role, stream, d.label).is_some(),
            Event::Free { alloc } => {
                d.free(alloc);
                true
            }
            Event::Written { .. } => unreachable!("a layer written again is read as its events"),
        }
    }
}

impl Program {
    /// Replays the program through the allocator under `config` on `device`, the process holding
    /// `outside` beside the allocator.
    pub fn replay(
        &self,
        config: AllocatorConfig,
        device: Device,
        outside: OutsideBytes,
    ) -> Replayed {
        let mut replay = ProgramReplay::new(config, device, outside);
        for chunk in self.chunks() {
            if !replay.read(chunk) {
                break;
            }
        }
        replay.finish()
    }
}

impl ProgramReplay {
    /// Replays a layer written again: its events as a window; `false` once the device had no
    /// room (the replay then stops).
    pub(super) fn written_layer(&mut self, layer: &WrittenLayer) -> bool {
        if self.driver.out.out_of_memory.is_some() {
            return false;
        }
        self.begin_window(layer.shape);
        let mut i = 0;
        while i < layer.steps.len() {
            // The rest of a run of small events followed is passed at once.
            if let Some(Window::Following(f)) = &mut self.windows.open {
                if f.left > 0 {
                    let passed = f
                        .left
                        .min(u32::try_from(layer.steps.len() - i).unwrap_or(u32::MAX));
                    f.left -= passed;
                    i += passed as usize;
                    continue;
                }
            }
            if !self.window_event(layer.event(i)) {
                return false;
            }
            i += 1;
        }
        self.end_window();
        true
    }

    fn begin_window(&mut self, shape: u32) {
        let a = &self.driver.allocator;
        self.windows.open = None;
        if !self.windows.follow {
            return;
        }
        let key = (shape, a.small_pool_fingerprint());
        let first = self.driver.blocks.next_number();
        let trajectory = self.windows.kept.get(&key).cloned();
        let misses = self.windows.misses_of(shape);
        let window = match trajectory {
            Some(trajectory) => {
                *misses = 0;
                self.windows.followed += 1;
                Window::Following(Following {
                    trajectory,
                    at: 0,
                    left: 0,
                    first,
                })
            }
            None => {
                *misses += 1;
                if misses.is_power_of_two() {
                    let start = a.pool_currents(Pool::Small);
                    Window::Recording(Box::new(Recording {
                        key,
                        first,
                        retries: a.alloc_retries(),
                        ooms: a.ooms(),
                        start,
                        run_start: start,
                        items: Vec::new(),
                        small: Vec::new(),
                        frees_older: false,
                    }))
                } else {
                    Window::Passing
                }
            }
        };
        self.windows.open = Some(window);
    }

    fn end_window(&mut self) {
        match self.windows.open.take() {
            Some(Window::Recording(r)) => self.keep(r),
            Some(Window::Following(f)) => self.follow_to_end(f),
            Some(Window::Passing) | None => {}
        }
    }

    /// Replays an allocation or free of the window open (a run of small events followed is
    /// passed by [`Driver::written_layer`], which gives this the first of the run).
    fn window_event(&mut self, e: Event) -> bool {
        match &mut self.windows.open {
            None | Some(Window::Passing) => self.plain_event(e),
            Some(Window::Recording(_)) => self.recorded_event(e),
            Some(Window::Following(f)) => {
                debug_assert_eq!(f.left, 0, "the rest of a run followed is passed at once");
                let t = f.trajectory.clone();
                let item = &t.items[f.at];
                f.at += 1;
                match item {
                    Item::Large(placement) => {
                        if let (Some(placement), Event::Alloc { bytes, .. }) = (placement, e) {
                            if self.driver.allocator.might_release_cache(bytes) {
                                let first = f.first;
                                self.place_held(first, placement);
                            }
                        }
                        let done = self.plain_event(e);
                        if !done {
                            self.windows.open = None;
                        }
                        done
                    }
                    Item::Small(run) => {
                        f.left = run.events - 1;
                        self.follow_run(run);
                        true
                    }
                }
            }
        }
    }

    /// A window followed stops before a large allocation that may release the cache: the small
    /// blocks it holds are placed where they were (its other allocations numbered live were
    /// freed), and its other events go through the blocks.
    #[cold]
    fn place_held(&mut self, first: u32, placement: &Placement) {
        for &(n, address, size, requested) in &placement.held {
            let block = (self.driver.allocator)
                .place_block(Pool::Small, 0, address, size, requested, self.driver.label)
                .expect("a block held by a window fits where it was");
            self.driver.blocks.set_block(first + n, block);
        }
        for &n in &placement.freed {
            self.driver.blocks.take(first + n);
        }
        self.windows.open = None;
        self.windows.placed_early += 1;
    }

    /// An event of a window recorded: replayed through the blocks, and noted.
    fn recorded_event(&mut self, e: Event) -> bool {
        // The pool, role and block size of what the event allocates or frees.
        let small_block = match e {
            Event::Alloc { bytes, role, .. } => Some((role, round_size(bytes), 1)),
            Event::Free { alloc } => self
                .driver
                .blocks
                .get(alloc)
                .map(|&(_, r, size)| (r, size, -1)),
            _ => None,
        }
        .filter(|&(_, size, _)| size <= SMALL_SIZE);
        // The counters before a run of small events begins (within a run, where the last
        // event left them).
        let starts_run = small_block.is_some()
            && !matches!(
                &self.windows.open,
                Some(Window::Recording(r)) if matches!(r.items.last(), Some(Item::Small(_)))
            );
        let before = starts_run.then(|| self.driver.allocator.pool_currents(Pool::Small));
        // At a large allocation on a limited device, the small blocks the window holds: a window
        // followed later holds none of them in the blocks until it ends, so that releasing the
        // cache there could give back a segment this one kept in use (whether it would change
        // the small pool now says nothing of what it would then).
        let held = (small_block.is_none()
            && matches!(e, Event::Alloc { .. })
            && self.driver.allocator.capacity().is_some())
        .then(|| self.held_by_window());
        let number = self.driver.blocks.next_number();
        let done = self.plain_event(e);
        let after = small_block.map(|_| self.driver.allocator.pool_currents(Pool::Small));
        let block = self.driver.blocks.get(number).map(|b| b.0);
        let Some(Window::Recording(r)) = &mut self.windows.open else {
            unreachable!("the window recorded stays open")
        };
        match small_block {
            None => r.items.push(Item::Large(held.map(|held| {
                Box::new(Placement {
                    held,
                    freed: Vec::new(),
                })
            }))),
            Some((role, size, sign)) => {
                if let Some(before) = before {
                    r.run_start = before;
                    r.items.push(Item::Small(Box::default()));
                }
                let after = after.expect("read for a small event");
                let Some(Item::Small(run)) = r.items.last_mut() else {
                    unreachable!("a run of small events")
                };
                run.events += 1;
                for (((net, rise), &a), &b) in run
                    .net
                    .iter_mut()
                    .zip(&mut run.rise)
                    .zip(&after)
                    .zip(&r.run_start)
                {
                    *net = signed(a) - signed(b);
                    *rise = (*rise).max(*net);
                }
                run.roles[role.index()] += sign * signed(size);
                match (e, block) {
                    (Event::Alloc { .. }, Some(b)) => {
                        run.allocations.push((role, size));
                        r.small.push((number, b));
                    }
                    (Event::Free { alloc }, _) if alloc < r.first => r.frees_older = true,
                    _ => {}
                }
            }
        }
        if !done {
            self.windows.open = None;
        }
        done
    }

    /// The small blocks of the window being recorded that are live now.
    fn held_by_window(&self) -> Vec<Held> {
        let Some(Window::Recording(r)) = &self.windows.open else {
            unreachable!("a window recorded")
        };
        self.live_blocks(r, &self.live_now(r))
    }

    /// Whether each small allocation of window `r` (in its order) is live now.
    fn live_now(&self, r: &Recording) -> Vec<bool> {
        r.small
            .iter()
            .map(|(n, _)| self.driver.blocks.get(*n).is_some())
            .collect()
    }

    /// The small blocks allocated by window `r` that `live` says are live.
    fn live_blocks(&self, r: &Recording, live: &[bool]) -> Vec<Held> {
        let a = &self.driver.allocator;
        r.small
            .iter()
            .zip(live)
            .filter(|(_, &l)| l)
            .map(|(&(n, b), _)| {
                let live = |v: Option<u64>| v.expect("a live block");
                (
                    n - r.first,
                    live(a.address(b)),
                    live(a.block_size(b)),
                    live(a.requested_size(b)),
                )
            })
            .collect()
    }

    /// A run of small events of a window followed, at once: the counters and roles moved as
    /// they moved, the peaks raised as high, the allocations numbered (those numbered live get
    /// their block when the window ends, or when a large allocation needs the blocks placed).
    fn follow_run(&mut self, run: &SmallRun) {
        let allocated = self.driver.allocator.allocated_now();
        self.driver
            .allocator
            .move_counters(Pool::Small, &run.net, &run.rise);
        self.driver
            .raise_allocated_peak(allocated.saturating_add_signed(run.rise[0]));
        for (bytes, delta) in self.driver.tags.iter_mut().zip(run.roles) {
            *bytes = bytes.saturating_add_signed(delta);
        }
        for &(freed, role, size) in &run.numbered_live {
            self.driver.blocks.push_freed(freed as usize);
            self.driver.blocks.push((BlockId::PENDING, role, size));
        }
        self.driver.blocks.push_freed(run.freed_after as usize);
    }

    /// Ends a window followed: the small blocks it left allocated are placed, and the
    /// allocations numbered live that it freed are freed.
    fn follow_to_end(&mut self, f: Following) {
        let t = &f.trajectory;
        debug_assert!(
            f.at == t.items.len() && f.left == 0,
            "a window followed to its end"
        );
        for &(n, address, size, requested) in &t.kept {
            let block = (self.driver.allocator)
                .place_block(Pool::Small, 0, address, size, requested, self.driver.label)
                .expect("a block left by a window fits where it was left");
            self.driver.blocks.set_block(f.first + n, block);
        }
        for &n in &t.freed_pending {
            self.driver.blocks.take(f.first + n);
        }
        debug_assert_eq!(
            self.driver.allocator.small_pool_fingerprint(),
            t.end,
            "the small pool ends as the window left it"
        );
    }

    /// Keeps what a window replayed event by event did, if it left the small pool's segments
    /// and the device's cache as they were.
    fn keep(&mut self, mut r: Box<Recording>) {
        let a = &self.driver.allocator;
        let now = a.pool_currents(Pool::Small);
        // Reserved bytes and segments (counters 1 and 6) unchanged, no release of the cache.
        let same_segments = now[1] == r.start[1] && now[6] == r.start[6];
        if r.frees_older || !same_segments || a.alloc_retries() != r.retries || a.ooms() != r.ooms {
            return;
        }
        // Numbered live, per small allocation: what the window leaves, and what it holds at a
        // large allocation.
        let mut live = self.live_now(&r);
        let kept = self.live_blocks(&r, &live);
        let position = |n: u32| {
            r.small
                .binary_search_by_key(&(r.first + n), |s| s.0)
                .expect("a small allocation of the window")
        };
        for item in &r.items {
            if let Item::Large(Some(p)) = item {
                for h in &p.held {
                    live[position(h.0)] = true;
                }
            }
        }
        let numbered_live = |upto: usize| {
            (0..upto)
                .filter(|&k| live[k])
                .map(|k| r.small[k].0 - r.first)
        };
        let mut allocations = 0;
        for item in &mut r.items {
            match item {
                Item::Small(run) => {
                    let mut freed = 0;
                    for (role, size) in std::mem::take(&mut run.allocations) {
                        if live[allocations] {
                            run.numbered_live.push((freed, role, size));
                            freed = 0;
                        } else {
                            freed += 1;
                        }
                        allocations += 1;
                    }
                    run.freed_after = freed;
                }
                Item::Large(Some(p)) => {
                    let held = &p.held;
                    p.freed = numbered_live(allocations)
                        .filter(|n| held.binary_search_by_key(n, |h| h.0).is_err())
                        .collect();
                }
                Item::Large(None) => {}
            }
        }
        let freed_pending = numbered_live(live.len())
            .filter(|n| kept.binary_search_by_key(n, |h| h.0).is_err())
            .collect();
        let windows = &mut self.windows;
        if windows.kept_order.len() == KEPT {
            if let Some(oldest) = windows.kept_order.pop_front() {
                windows.kept.remove(&oldest);
            }
        }
        windows.kept_order.push_back(r.key);
        let replaced = windows.kept.insert(
            r.key,
            Rc::new(Trajectory {
                items: r.items,
                kept,
                freed_pending,
                end: a.small_pool_fingerprint(),
            }),
        );
        debug_assert!(
            replaced.is_none(),
            "a window is recorded only where none was kept"
        );
    }
}
