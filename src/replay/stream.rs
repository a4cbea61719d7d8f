//! Replays made while the program is written: the emulation runs on a thread of its own and
//! sends its chunks of events as it writes them; each replay asked for reads them on a thread of
//! its own, and the cards watched are replayed beside them once the first replay shows them
//! needed ([`super::cards`]). One value ([`Plan`]) says what is wanted; the emulation is any
//! function that writes a program to the sink it is given.

use super::cards::{self, joined, Limited, Watched};
use super::driver::{Device, Replayed};
use super::outside::OutsideBytes;
use super::program::{Chunk, Program};
use super::windows::ProgramReplay;
use crate::allocator::AllocatorConfig;
use std::sync::mpsc::SyncSender;

/// Chunks of events in flight between the emulation and its replays.
const CHUNKS_IN_FLIGHT: usize = 4;

/// What is wanted of a program as it is written.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    /// Keep the program (to replay it on cards afterwards).
    pub keep: bool,
    /// A replay on an unlimited device under each of these settings.
    pub under: &'a [AllocatorConfig],
    /// What the process holds outside the allocator as it goes (its peaks of the device).
    pub outside: OutsideBytes,
    /// The cards the first replay watches, replayed beside it where it shows them needed.
    pub watch: Option<Watched<'a>>,
}

impl Plan<'_> {
    /// Only the program.
    pub const PROGRAM: Plan<'static> = Plan {
        keep: true,
        under: &[],
        outside: OutsideBytes::NONE,
        watch: None,
    };
}

/// What the replays of a program as it was written gave.
pub struct Replays {
    /// The program, if kept (else one of no events).
    pub program: Program,
    /// One replay per setting of [`Plan::under`], in its order.
    pub unlimited: Vec<Replayed>,
    /// The replays on the cards watched that were made beside them.
    pub on_cards: Vec<Limited>,
}

/// Runs `emulate` on a thread of `stack` bytes (it writes its program to the sink it is given, or
/// keeps it without one) and makes the replays `plan` asks for as it writes.
pub fn replays<E>(emulate: E, stack: usize, plan: &Plan) -> Replays
where
    E: FnOnce(Option<SyncSender<Chunk>>) -> Program + Send,
{
    let streams = !plan.under.is_empty() || plan.watch.is_some();
    let (sink, chunks) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
    let sink = streams.then_some(sink);
    std::thread::scope(|s| {
        let emulation = std::thread::Builder::new()
            .name("emulation".into())
            .stack_size(stack)
            .spawn_scoped(s, move || emulate(sink))
            .expect("a thread for the emulation");
        let (written, unlimited, on_cards) = if streams {
            read_as_written(s, chunks, plan)
        } else {
            drop(chunks);
            (Vec::new(), Vec::new(), Vec::new())
        };
        let mut program = joined(emulation);
        if streams {
            debug_assert!(
                program.chunks.is_empty(),
                "a streaming tape sends every event"
            );
            if plan.keep {
                program.chunks = written;
            }
        }
        Replays {
            program,
            unlimited,
            on_cards,
        }
    })
}

/// Reads the chunks as they come: each to the replays of `plan` and to the cards' limited
/// replays started; the chunks kept where the program is or the cards need them.
fn read_as_written<'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    chunks: std::sync::mpsc::Receiver<Chunk>,
    plan: &'scope Plan<'scope>,
) -> (Vec<Chunk>, Vec<Replayed>, Vec<Limited>) {
    let (mut watcher, mut limited) = plan.watch.as_ref().map(cards::watch).unzip();
    let outside = plan.outside;
    let (feeds, replays): (Vec<_>, Vec<_>) = plan
        .under
        .iter()
        .map(|&config| {
            let (feed, marks) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
            let mut watcher = watcher.take();
            let replay = s.spawn(move || {
                let mut replay = ProgramReplay::new(config, Device::Unlimited, outside);
                for chunk in marks {
                    replay.read(&chunk);
                    if let Some(w) = &mut watcher {
                        w.saw(replay.so_far());
                    }
                }
                replay.finish()
            });
            (feed, replay)
        })
        .unzip();
    let mut written = Vec::new();
    for chunk in chunks {
        if let Some(l) = &mut limited {
            l.start_asked(s, &written);
        }
        if plan.keep || limited.is_some() {
            written.push(chunk.clone());
        }
        for feed in &feeds {
            feed.send(chunk.clone()).expect("a replay reads to the end");
        }
        if let Some(l) = &mut limited {
            l.feed(&chunk);
        }
    }
    drop(feeds);
    let on_cards = limited.map_or_else(Vec::new, |l| l.finish(s, &written));
    let unlimited = replays.into_iter().map(joined).collect();
    (written, unlimited, on_cards)
}
