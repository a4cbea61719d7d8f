//! Replays limited to cards, started while the unlimited replay runs. A replay on a card makes
//! the same choices as the unlimited one until `reserved` and what lives outside the allocator
//! would pass the card's room; so it is only needed once the unlimited replay's peak of the
//! device's use passes the room while its peak of `allocated` (with what lives outside) is still
//! within it (beyond, the run cannot hold there). The unlimited replay watches the rooms of the
//! cards asked about and asks for the limited replays the moment one is passed; each reads the
//! events written so far, then the rest as the emulation writes them, on a thread of its own.
//! One whose room the peak of `allocated` passes later is stopped: the peaks decide that card.

use super::driver::{Device, Replayed};
use super::outside::OutsideBytes;
use super::program::Chunk;
use super::windows::ProgramReplay;
use crate::allocator::AllocatorConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};

/// The cards a streaming replay watches: the room of each (its memory less the reserve), the
/// settings a replay limited to them runs under once it is needed, and what the process holds
/// outside the allocator there.
#[derive(Debug, Clone, Copy)]
pub struct Watched<'a> {
    /// Ascending, each once.
    pub rooms: &'a [u64],
    pub configs: &'a [AllocatorConfig],
    pub outside: OutsideBytes,
    /// The most limited replays that may run at once (the others are left to be made after),
    /// so that a catalog of many cards does not start a thread for each; one card's under every
    /// setting at least.
    pub at_most: usize,
}

impl Watched<'_> {
    /// Two limited replays a core.
    pub fn two_a_core() -> usize {
        2 * std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// A replay limited to a card, started while the unlimited replay ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub room: u64,
    /// The index of its setting in [`Watched::configs`].
    pub config: usize,
    /// Whether the run completed on the card.
    pub completed: bool,
}

/// What the unlimited replay does with the rooms it watches.
pub(super) struct Watcher<'a> {
    rooms: &'a [u64],
    /// The first room the peak of the device's use has not passed.
    next: usize,
    /// The first room the peak of `allocated` (with what lives outside) has not passed.
    beyond: usize,
    /// Set for a room the peak of `allocated` passed: its limited replays stop.
    stopped: Arc<Vec<AtomicBool>>,
    asks: Sender<usize>,
}

/// A watch on `watched`'s cards: the watcher the unlimited replay keeps, and the limited
/// replays it asks for.
pub(super) fn watch<'scope>(
    watched: &Watched<'scope>,
) -> (Watcher<'scope>, LimitedReplays<'scope>) {
    debug_assert!(
        watched.rooms.windows(2).all(|w| w[0] < w[1]),
        "rooms ascending, each once"
    );
    let (asks, asked) = std::sync::mpsc::channel();
    let stopped: Arc<Vec<AtomicBool>> = Arc::new(
        (watched.rooms.iter())
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let watcher = Watcher {
        rooms: watched.rooms,
        next: 0,
        beyond: 0,
        stopped: stopped.clone(),
        asks,
    };
    let limited = LimitedReplays {
        watched: *watched,
        asked,
        stopped,
        started: Vec::new(),
    };
    (watcher, limited)
}

impl Watcher<'_> {
    /// After the unlimited replay's latest chunk: asks for the replays limited to each room its
    /// peak of the device's use passed with its peak of `allocated` within it, and stops those
    /// whose room the peak of `allocated` passed.
    pub(super) fn saw(&mut self, replayed: &Replayed) {
        let (allocated, used) = (replayed.peak_device_allocated, replayed.peak_device);
        while self.beyond < self.rooms.len() && allocated > self.rooms[self.beyond] {
            self.stopped[self.beyond].store(true, Ordering::Relaxed);
            self.beyond += 1;
        }
        while self.next < self.rooms.len() && used > self.rooms[self.next] {
            if self.next >= self.beyond {
                // The limited replays outlive the watcher: they read the asks to the end.
                let _ = self.asks.send(self.next);
            }
            self.next += 1;
        }
    }
}

/// The replays limited to cards that a watcher asked for, each on a thread of its own.
pub(super) struct LimitedReplays<'scope> {
    watched: Watched<'scope>,
    asked: Receiver<usize>,
    stopped: Arc<Vec<AtomicBool>>,
    started: Vec<Started<'scope>>,
}

/// A limited replay started: its card and setting, what feeds it the chunks that follow (until
/// it stops reading) and its thread.
struct Started<'scope> {
    room: u64,
    config: usize,
    feed: Option<Sender<Chunk>>,
    thread: ScopedJoinHandle<'scope, Option<bool>>,
}

impl<'scope> LimitedReplays<'scope> {
    /// Starts the replays asked for so far, on `written` (the chunks written so far) and what
    /// follows.
    pub(super) fn start_asked(&mut self, s: &'scope Scope<'scope, '_>, written: &[Chunk]) {
        let asked: Vec<usize> = self.asked.try_iter().collect();
        for index in asked {
            self.start(s, index, written);
        }
    }

    /// Starts the replays limited to room `index`, unless that would make more than
    /// [`Watched::at_most`] run (the planner replays those left after the budget).
    fn start(&mut self, s: &'scope Scope<'scope, '_>, index: usize, written: &[Chunk]) {
        let w = self.watched;
        let running = self.started.iter().filter(|r| !r.thread.is_finished());
        if running.count() + w.configs.len() > w.at_most.max(w.configs.len()) {
            return;
        }
        let room = w.rooms[index];
        for (config, &c) in w.configs.iter().enumerate() {
            let (feed, after) = std::sync::mpsc::channel();
            let (before, stopped) = (written.to_vec(), self.stopped.clone());
            let outside = w.outside;
            let thread =
                s.spawn(move || limited(c, room, outside, &before, after, &stopped[index]));
            self.started.push(Started {
                room,
                config,
                feed: Some(feed),
                thread,
            });
        }
    }

    /// Sends `chunk` to every replay started that still reads.
    pub(super) fn feed(&mut self, chunk: &Chunk) {
        for r in &mut self.started {
            // A limited replay stops where the device has no room.
            if r.feed
                .as_ref()
                .is_some_and(|f| f.send(chunk.clone()).is_err())
            {
                r.feed = None;
            }
        }
    }

    /// Lets every replay started read to the end of what it was sent.
    fn close(&mut self) {
        for r in &mut self.started {
            r.feed = None;
        }
    }

    /// Once every chunk is `written`: starts the replays asked for until the watcher is done,
    /// and gives what each that was not stopped found.
    pub(super) fn finish(
        mut self,
        s: &'scope Scope<'scope, '_>,
        written: &[Chunk],
    ) -> Vec<Limited> {
        self.close();
        while let Ok(index) = self.asked.recv() {
            self.start(s, index, written);
        }
        self.close();
        (self.started.into_iter())
            .filter_map(|r| {
                let completed = joined(r.thread)?;
                Some(Limited {
                    room: r.room,
                    config: r.config,
                    completed,
                })
            })
            .collect()
    }
}

/// A replay under `config` on a card of `room` bytes: the chunks written before it started,
/// then those that follow; `None` if stopped.
fn limited(
    config: AllocatorConfig,
    room: u64,
    outside: OutsideBytes,
    before: &[Chunk],
    after: Receiver<Chunk>,
    stopped: &AtomicBool,
) -> Option<bool> {
    let mut replay = ProgramReplay::new(config, Device::Card { room }, outside);
    let mut go = |chunk: &Chunk| !stopped.load(Ordering::Relaxed) && replay.read(chunk);
    let _ = before.iter().all(&mut go) && after.iter().all(|c| go(&c));
    match stopped.load(Ordering::Relaxed) {
        true => None,
        false => Some(replay.finish().out_of_memory.is_none()),
    }
}

/// What a scoped thread returned, its panic carried on.
pub(super) fn joined<T>(thread: ScopedJoinHandle<'_, T>) -> T {
    thread
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}
