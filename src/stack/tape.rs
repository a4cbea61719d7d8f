//! The tape an emulated process writes its program on: each tensor's storage allocated with the
//! role the code running gives it (and the stream it runs on), freed when its last view goes, as
//! Python frees a tensor when its last reference goes. A tape keeps its events, or streams them
//! to a replay in chunks as they are written ([`crate::replay::program`] says what they are).

use crate::replay::program::{Chunk, Event, Events, Role, WrittenLayer, CHUNK_EVENTS};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[derive(Default, Debug)]
pub(crate) struct Log {
    /// The events not yet sent, or (when the tape does not stream) not yet kept in `kept`, the
    /// layers written again among them, and how many events they are with each such layer
    /// counted as its own.
    pub events: Vec<Event>,
    pub written: Vec<WrittenLayer>,
    pub plain_len: usize,
    /// What a tape that does not stream has written: its chunks of events and its marks.
    pub kept: Vec<Chunk>,
    /// How many events were sent to `sink` or kept in `kept` (each layer written again counted
    /// as its own).
    pub sent: usize,
    /// Where a streaming tape sends its events, in chunks.
    pub sink: Option<std::sync::mpsc::SyncSender<Chunk>>,
    pub allocations: u32,
    /// The role given to the next allocations.
    pub role: Option<Role>,
    /// The stream the next allocations are made on (0: the default stream).
    pub stream: u8,
    /// A recomputation stopped early: what the rest of it makes is never allocated.
    pub stopped: bool,
    /// While a layer is recorded to be repeated: a copy of every event written.
    pub captured: Option<Vec<Event>>,
    /// Decoder layers written again from another's record.
    pub written_again: u64,
}

impl Log {
    fn push(&mut self, e: Event) {
        if let Some(captured) = &mut self.captured {
            captured.push(e);
        }
        if let Event::Alloc { .. } = e {
            self.allocations += 1;
        }
        self.writable();
        self.events.push(e);
        self.plain_len += 1;
        if self.plain_len >= CHUNK_EVENTS {
            self.flush();
        }
    }

    /// Gives the events not yet sent a buffer of a chunk's size, if they have none yet.
    fn writable(&mut self) {
        if self.events.capacity() == 0 {
            self.events = Events::buffer();
        }
    }

    /// Sends the events written so far if the tape streams, else keeps them as a chunk.
    fn flush(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let events = Events {
            events: std::mem::take(&mut self.events),
            written: std::mem::take(&mut self.written),
            plain_len: std::mem::take(&mut self.plain_len),
        };
        self.sent += events.plain_len;
        self.emit(Chunk::Events(std::sync::Arc::new(events)));
    }

    /// Sends `chunk` if the tape streams, else keeps it.
    fn emit(&mut self, chunk: Chunk) {
        match &self.sink {
            Some(sink) => {
                // A reader that is gone wants no more.
                if sink.send(chunk).is_err() {
                    self.sink = None;
                }
            }
            None => self.kept.push(chunk),
        }
    }
}

/// The program being written: every allocation and free in order.
#[derive(Clone, Default, Debug)]
pub struct Tape(pub(crate) Rc<RefCell<Log>>);

impl Tape {
    pub fn new() -> Tape {
        Tape::default()
    }

    /// Allocates `bytes` with the current role (a zero-byte tensor allocates nothing).
    fn alloc(&self, bytes: u64) -> Option<u32> {
        let mut log = self.0.borrow_mut();
        if bytes == 0 || log.stopped {
            return None;
        }
        let role = log.role.unwrap_or(Role::Activations);
        let n = log.allocations;
        let stream = log.stream;
        log.push(Event::Alloc {
            bytes,
            role,
            stream,
        });
        Some(n)
    }

    /// The number the next allocation gets.
    pub(super) fn next_allocation(&self) -> u32 {
        self.0.borrow().allocations
    }

    /// Whether allocations go on the tape with the default role (and are not stopped).
    pub(super) fn allocates_plainly(&self) -> bool {
        let log = self.0.borrow();
        log.role.is_none() && !log.stopped
    }

    /// Starts keeping a copy of every event written.
    pub(super) fn start_capture(&self) {
        self.0.borrow_mut().captured = Some(Vec::new());
    }

    /// The events written since `start_capture`.
    pub(super) fn end_capture(&self) -> Vec<Event> {
        self.0.borrow_mut().captured.take().unwrap_or_default()
    }

    /// Counts a decoder layer written again from another's record.
    pub(super) fn count_written_again(&self) {
        self.0.borrow_mut().written_again += 1;
    }

    pub(super) fn written_again(&self) -> u64 {
        self.0.borrow().written_again
    }

    /// Writes a decoder layer again from a record (its allocations take the next numbers).
    pub(super) fn write_layer(&self, layer: WrittenLayer, allocations: u32) {
        let mut log = self.0.borrow_mut();
        debug_assert!(
            log.captured.is_none(),
            "a layer written again is not captured"
        );
        log.writable();
        let at = u32::try_from(log.written.len()).expect("fewer than 2^32 layers in a chunk");
        log.plain_len += layer.steps.len();
        log.events.push(Event::Written { at });
        log.written.push(layer);
        log.allocations += allocations;
        if log.plain_len >= CHUNK_EVENTS {
            log.flush();
        }
    }

    /// The storage of allocation `alloc` of `bytes`, written already.
    pub(super) fn written_storage(&self, alloc: Option<u32>, bytes: u64) -> Rc<Storage> {
        Rc::new(Storage {
            tape: self.clone(),
            alloc: Cell::new(alloc),
            bytes,
        })
    }

    /// Runs `f` with the allocations it makes on `stream`.
    pub fn on_stream<R>(&self, stream: u8, f: impl FnOnce() -> R) -> R {
        let before = std::mem::replace(&mut self.0.borrow_mut().stream, stream);
        let out = f();
        self.0.borrow_mut().stream = before;
        out
    }

    /// Runs `f` with the allocations it makes given `role`.
    pub fn with_role<R>(&self, role: Role, f: impl FnOnce() -> R) -> R {
        let before = self.0.borrow_mut().role.replace(role);
        let out = f();
        self.0.borrow_mut().role = before;
        out
    }

    /// Events written so far, sent or not.
    pub fn len(&self) -> usize {
        let log = self.0.borrow();
        log.sent + log.plain_len
    }

    /// Makes the tape send its events to `sink`, in chunks, as they are written.
    pub fn stream_to(&self, sink: std::sync::mpsc::SyncSender<Chunk>) {
        self.0.borrow_mut().sink = Some(sink);
    }

    /// Writes the events so far, then `mark` (a stage's beginning or end).
    pub fn mark(&self, mark: Chunk) {
        let mut log = self.0.borrow_mut();
        log.flush();
        log.emit(mark);
    }

    /// Sends what is left and stops streaming.
    pub fn close(&self) {
        let mut log = self.0.borrow_mut();
        log.flush();
        log.sink = None;
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A storage of `bytes`, freed when its last view goes.
    pub fn storage(&self, bytes: u64) -> Rc<Storage> {
        Rc::new(Storage {
            tape: self.clone(),
            alloc: Cell::new(self.alloc(bytes)),
            bytes,
        })
    }

    /// A storage of `bytes` not yet allocated (`untyped_storage().resize_(0)` from the start);
    /// [`Storage::allocate`] gives it its bytes.
    pub fn unallocated(&self, bytes: u64) -> Rc<Storage> {
        Rc::new(Storage {
            tape: self.clone(),
            alloc: Cell::new(None),
            bytes,
        })
    }

    /// Takes what was written and not sent: chunks of events and marks.
    pub fn take(&self) -> Vec<Chunk> {
        let mut log = self.0.borrow_mut();
        log.flush();
        std::mem::take(&mut log.kept)
    }
}

/// Bytes on the device, freed on the tape when dropped.
#[derive(Debug)]
pub struct Storage {
    pub(super) tape: Tape,
    alloc: Cell<Option<u32>>,
    pub bytes: u64,
}

impl Storage {
    /// The allocation this storage holds (none for zero bytes).
    pub fn alloc(&self) -> Option<u32> {
        self.alloc.get()
    }

    /// Forgets its allocation, whose free is on the tape already.
    pub(super) fn forget(&self) {
        self.alloc.set(None);
    }

    /// `untyped_storage().resize_(0)`: its bytes freed now, whoever views it.
    pub fn release(&self) {
        if let Some(alloc) = self.alloc.take() {
            self.tape.0.borrow_mut().push(Event::Free { alloc });
        }
    }

    /// `untyped_storage().resize_(bytes)` of a released storage: its bytes allocated again, with
    /// the tape's current role and stream (nothing if it holds them).
    pub fn allocate(&self) {
        if self.alloc.get().is_none() {
            self.alloc.set(self.tape.alloc(self.bytes));
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(alloc) = self.alloc.get() {
            self.tape.0.borrow_mut().push(Event::Free { alloc });
        }
    }
}
