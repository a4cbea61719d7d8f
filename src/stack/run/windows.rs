//! Layers written again, replayed without going through the small pool's blocks. A layer
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

use super::{Event, Replaying};
use crate::allocator::size::{round_size, Pool, SMALL_SIZE};
use crate::allocator::BlockId;
use crate::stack::tensor::Role;
use crate::stack::tensor::WrittenLayer;
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
    allocations: Vec<(usize, u64)>,
    /// Once kept, those numbered live (the window leaves them live, or holds them at a large
    /// allocation where the small pool's blocks may be needed): how many numbered freed come
    /// before each, its role and block size; and how many numbered freed come after the last.
    numbered_live: Vec<(u32, usize, u64)>,
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

pub(super) struct Windows {
    /// Whether windows are followed (the tests compare with a replay where none is).
    pub(super) follow: bool,
    /// The windows kept, by shape and the small pool's fingerprint at their start, and the order
    /// they were kept in (the oldest is let go first).
    kept: rustc_hash::FxHashMap<(u32, u128), Rc<Trajectory>>,
    kept_order: std::collections::VecDeque<(u32, u128)>,
    /// Per shape: how many windows of that shape in a row found none kept to follow.
    misses: Vec<u32>,
    open: Option<Window>,
    /// Windows followed so far.
    pub(super) followed: u64,
    /// Windows followed whose small blocks were placed at a large allocation.
    pub(super) placed_early: u64,
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

impl Replaying {
    /// Replays a layer written again: its events as a window; `false` once the device had no
    /// room (the replay then stops).
    pub(super) fn written_layer(&mut self, layer: &WrittenLayer) -> bool {
        if self.out.out_of_memory.is_some() {
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
        let a = &self.allocator;
        self.windows.open = None;
        if !self.windows.follow {
            return;
        }
        let key = (shape, a.small_pool_fingerprint());
        let first = self.blocks.next_number();
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
    /// passed by [`Replaying::written_layer`], which gives this the first of the run).
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
                            if self.allocator.might_release_cache(bytes) {
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
            let block = self
                .allocator
                .place_block(Pool::Small, 0, address, size, requested, self.label)
                .expect("a block held by a window fits where it was");
            self.blocks.set_block(first + n, block);
        }
        for &n in &placement.freed {
            self.blocks.take(first + n);
        }
        self.windows.open = None;
        self.windows.placed_early += 1;
    }

    /// An event of a window recorded: replayed through the blocks, and noted.
    fn recorded_event(&mut self, e: Event) -> bool {
        // The pool, role and block size of what the event allocates or frees.
        let small_block = match e {
            Event::Alloc { bytes, role } => Some((role.index(), round_size(bytes), 1)),
            Event::Free { alloc } => self.blocks.get(alloc).map(|&(_, r, size)| (r, size, -1)),
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
        let before = starts_run.then(|| self.allocator.pool_currents(Pool::Small));
        // At a large allocation on a limited device, the small blocks the window holds: a window
        // followed later holds none of them in the blocks until it ends, so that releasing the
        // cache there could give back a segment this one kept in use (whether it would change
        // the small pool now says nothing of what it would then).
        let held = (small_block.is_none()
            && matches!(e, Event::Alloc { .. })
            && self.allocator.capacity().is_some())
        .then(|| self.held_by_window());
        let number = self.blocks.next_number();
        let done = self.plain_event(e);
        let after = small_block.map(|_| self.allocator.pool_currents(Pool::Small));
        let block = self.blocks.get(number).map(|b| b.0);
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
                run.roles[role] += sign * signed(size);
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
            .map(|(n, _)| self.blocks.get(*n).is_some())
            .collect()
    }

    /// The small blocks allocated by window `r` that `live` says are live.
    fn live_blocks(&self, r: &Recording, live: &[bool]) -> Vec<Held> {
        let a = &self.allocator;
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
        let allocated = self.allocator.allocated_now();
        self.allocator
            .move_counters(Pool::Small, &run.net, &run.rise);
        self.out.peak_allocated = self
            .out
            .peak_allocated
            .max(allocated.saturating_add_signed(run.rise[0]));
        for (bytes, delta) in self.roles.iter_mut().zip(run.roles) {
            *bytes = bytes.saturating_add_signed(delta);
        }
        for &(freed, role, size) in &run.numbered_live {
            self.blocks.push_freed(freed as usize);
            self.blocks.push((BlockId::PENDING, role, size));
        }
        self.blocks.push_freed(run.freed_after as usize);
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
            let block = self
                .allocator
                .place_block(Pool::Small, 0, address, size, requested, self.label)
                .expect("a block left by a window fits where it was left");
            self.blocks.set_block(f.first + n, block);
        }
        for &n in &t.freed_pending {
            self.blocks.take(f.first + n);
        }
        debug_assert_eq!(
            self.allocator.small_pool_fingerprint(),
            t.end,
            "the small pool ends as the window left it"
        );
    }

    /// Keeps what a window replayed event by event did, if it left the small pool's segments
    /// and the device's cache as they were.
    fn keep(&mut self, mut r: Box<Recording>) {
        let a = &self.allocator;
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

#[cfg(test)]
mod tests {
    use super::super::{program, Program, Replayed, Replaying, Run};
    use crate::allocator::AllocatorConfig;
    use crate::budget::proof::Report;

    /// Allocation numbers run on through allocations numbered freed already and through pages
    /// given back, and a live one gets its block.
    #[test]
    fn allocations_are_numbered_through_freed_ones_and_pages_given_back() {
        use super::super::LiveBlocks;
        use crate::allocator::BlockId;
        let mut blocks = LiveBlocks::default();
        assert_eq!(blocks.next_number(), 0);
        let page = u32::try_from(LiveBlocks::PAGE).expect("a page of 2 048");
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
        blocks.push_freed(2 * LiveBlocks::PAGE + 5);
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

    /// The replay of `p`, windows followed or not, with how many windows were followed and how
    /// many of those had their blocks placed at a large allocation.
    fn replayed(
        p: &Program,
        config: AllocatorConfig,
        capacity: Option<u64>,
        follow: bool,
    ) -> (Replayed, [u64; 2]) {
        let mut r = Replaying::new(config, capacity);
        r.windows.follow = follow;
        for chunk in &p.chunks {
            if !r.read(chunk) {
                break;
            }
        }
        let windows = [r.windows.followed, r.windows.placed_early];
        (r.finish(), windows)
    }

    /// Windows followed on a card that makes the allocator release its cache mid-window, in
    /// runs of multi-head models whose keys and values grow in the small pool (where the size
    /// searches of `--fit` used to stop at a kept block that no longer fitted): the figures of
    /// the whole replay, with no window left unplaced.
    #[test]
    fn windows_followed_where_the_cache_is_released_give_the_whole_replay() {
        use crate::budget::workload::{Mode, Workload};
        let cases = [
            ("phi-3-mini", 46, 64, 16, true, 9_167_824_486),
            ("phi-3-mini", 36, 256, 16, false, 12_964_608_128),
            ("llama-2-7b", 43, 64, 16, false, 15_690_310_067),
        ];
        for (preset, batch, context, generated, expandable, capacity) in cases {
            let w = Workload {
                mode: Mode::Inference { generated },
                batch,
                context,
                ..Workload::preset(preset).expect("a preset")
            }
            .validated()
            .expect("a valid workload");
            let kernels =
                crate::stack::ops::Kernels::for_gpu(crate::allocator::ComputeCapability::new(9, 0));
            let p = program(&w.runs(kernels)[0]);
            let config = crate::budget::terms::allocator_config(match expandable {
                true => crate::budget::AllocatorSetting::ExpandableSegments,
                false => crate::budget::AllocatorSetting::Default,
            });
            let (written, [followed, _]) = replayed(&p, config, Some(capacity), true);
            let (whole, _) = replayed(&p, config, Some(capacity), false);
            assert_eq!(written, whole, "{preset} batch {batch} on {capacity} B");
            assert!(followed > 0, "{preset}: windows followed");
        }
    }

    /// Every inference run of the six recorded proofs, replayed with the windows of its layers
    /// written again followed and with every event through the blocks, under both settings, on
    /// an unlimited device, on devices just below and just above its peak of `reserved`, and on
    /// devices between its peaks of `allocated` and `reserved` (where the cache is released
    /// during the run): the same figures, stage for stage, the same roles at the peak, the same
    /// stage out of memory.
    #[test]
    fn windows_give_what_the_whole_replay_gives() {
        let reports = Report::all_recorded();
        // Windows followed, per setting and device, and those whose blocks were placed early.
        let (mut followed, mut placed) = ([[0; 5]; 2], 0);
        for rec in reports.iter().flat_map(|r| &r.records) {
            let run = Run::from_spec(&rec.spec).expect("a recorded spec");
            if run.work.trains() {
                continue;
            }
            let p = program(&run);
            for expandable in [false, true] {
                let config = AllocatorConfig {
                    expandable_segments: expandable,
                    ..AllocatorConfig::default()
                };
                let (whole, _) = replayed(&p, config, None, false);
                let (allocated, reserved) = (whole.peak_allocated, whole.peak_reserved);
                let devices = [
                    None,
                    Some(reserved / 100 * 99),
                    Some(reserved / 100 * 101),
                    Some(allocated / 1000 * 1003),
                    Some(allocated + (reserved - allocated) / 2),
                ];
                for (d, capacity) in devices.into_iter().enumerate() {
                    let (written, [windows, early]) = replayed(&p, config, capacity, true);
                    let (whole, _) = replayed(&p, config, capacity, false);
                    assert_eq!(written, whole, "{} {config:?} {capacity:?}", rec.name);
                    followed[usize::from(expandable)][d] += windows;
                    placed += early;
                }
            }
        }
        println!(
            "windows followed (default, expandable; unlimited, 99 %, 101 % of the peak reserved, \
             0.3 % above the peak allocated, between the peaks): {followed:?}, {placed} with \
             their blocks placed at a large allocation"
        );
        // Just below the peak most runs stop before their decode (at the default settings, all).
        let [[plain, _, plain_above, ..], [grown, grown_below, grown_above, ..]] = followed;
        assert!(
            [plain, plain_above, grown, grown_above]
                .iter()
                .all(|&n| n > 100_000)
                && grown_below > 10_000,
            "{followed:?}"
        );
        // Where the cache is released, windows are still followed, some placed early.
        let between = followed[0][4] + followed[1][4];
        assert!(between > 10_000 && placed > 0, "{followed:?}, {placed}");
    }
}
