//! A program: every allocation and free an emulated process makes, in order, in chunks that
//! every reader shares, and where its stages begin and end with what the process has loaded by
//! then. It is the vocabulary between the emulation, which writes it, and the replay driver,
//! which runs it through the allocator model. An allocation carries what its block holds (its
//! [`Role`]) and the stream it is made on.

/// What a block holds, for the budget's terms and the notebook's map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The model's weights and buffers (and, while loading, their staging).
    Weights,
    /// Trained adapters (LoRA).
    Adapters,
    /// Gradients of trained parameters.
    Gradients,
    /// Optimizer states (and master weights).
    OptimizerStates,
    /// The KV cache `generate` grows.
    KvCache,
    /// Token ids, masks, positions and what `generate` keeps between steps.
    Inputs,
    /// Everything a forward or backward pass makes and frees: activations, their gradients and
    /// temporaries.
    Activations,
    /// The optimizer step's temporaries.
    OptimizerStep,
    /// cuBLAS/cuBLASLt workspaces and kernels' workspaces.
    Workspaces,
}

impl Role {
    pub const ALL: [Role; 9] = [
        Role::Weights,
        Role::Adapters,
        Role::Gradients,
        Role::OptimizerStates,
        Role::KvCache,
        Role::Inputs,
        Role::Activations,
        Role::OptimizerStep,
        Role::Workspaces,
    ];

    /// Its place in [`Role::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Weights => "weights",
            Role::Adapters => "adapters",
            Role::Gradients => "gradients",
            Role::OptimizerStates => "optimizer states",
            Role::KvCache => "KV cache",
            Role::Inputs => "inputs",
            Role::Activations => "activations",
            Role::OptimizerStep => "optimizer step",
            Role::Workspaces => "workspaces",
        }
    }
}

// `Role::ALL` lists the roles in their declared order, so that `index` is their place in it.
const _: () = {
    let mut i = 0;
    while i < Role::ALL.len() {
        assert!(Role::ALL[i] as usize == i);
        i += 1;
    }
};

/// One event of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A tensor's storage of `bytes` (as asked of the allocator) on `stream` (0: the default
    /// stream; collectives' own streams have their own numbers); allocations are numbered in
    /// order from 0.
    Alloc { bytes: u64, role: Role, stream: u8 },
    /// The storage of allocation `alloc` returned to the allocator.
    Free { alloc: u32 },
    /// A decoder layer written again from a record: its events are those of the chunk's
    /// [`WrittenLayer`] number `at` (see [`Events::written`]).
    Written { at: u32 },
}

/// One event of a layer's record, numbered for whichever layer is written from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Alloc {
        bytes: u64,
        role: Role,
    },
    /// The free of the layer's allocation of this number (counted from its first).
    FreeLocal(u32),
    /// The free of the storage of a tensor the cache held for the layer (`Cache::slots` order).
    FreeSlot(usize),
}

/// A decoder layer written again from a record: the record's steps (shared by every layer
/// written from it) and the numbers that place them, its first allocation's and those of the
/// cache's tensors it was given. Every layer written from records of one `shape` makes the same
/// small-pool events, its large-pool events at the same places.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenLayer {
    pub steps: std::sync::Arc<[Step]>,
    pub shape: u32,
    pub first: u32,
    pub slots: [Option<u32>; 3],
}

impl WrittenLayer {
    /// Its event `i`.
    pub fn event(&self, i: usize) -> Event {
        match self.steps[i] {
            Step::Alloc { bytes, role } => Event::Alloc {
                bytes,
                role,
                stream: 0,
            },
            Step::FreeLocal(n) => Event::Free {
                alloc: self.first + n,
            },
            Step::FreeSlot(slot) => Event::Free {
                alloc: self.slots[slot].expect("a slot freed by the record holds an allocation"),
            },
        }
    }
}

/// What a tape writes, in order: events (each chunk shared by every reader and the program),
/// and where stages begin and end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    Events(std::sync::Arc<Events>),
    Begin(StageMark),
    End,
}

/// Events a streaming tape sends at a time.
pub(crate) const CHUNK_EVENTS: usize = 1 << 16;

/// Buffers of chunks let go, kept to write the next chunks in, at most.
const SPARE_BUFFERS: usize = 64;

/// Buffers of chunks no longer read, for the next chunks written: memory already the process's
/// is written again, where memory asked of the system anew has every page cleared first.
static SPARE: std::sync::Mutex<Vec<Vec<Event>>> = std::sync::Mutex::new(Vec::new());

/// The events of one chunk, and the layers written again its [`Event::Written`] events stand
/// for. Once the last reader lets it go, its buffer of events is kept for the next chunk written
/// (up to [`SPARE_BUFFERS`] of them).
#[derive(Debug, PartialEq, Eq)]
pub struct Events {
    pub(crate) events: Vec<Event>,
    pub(crate) written: Vec<WrittenLayer>,
    /// Its events with each layer written again counted as its own.
    pub(crate) plain_len: usize,
}

impl Events {
    /// An empty buffer for a chunk: a spare one if any.
    pub(crate) fn buffer() -> Vec<Event> {
        let spare = SPARE.lock().ok().and_then(|mut s| s.pop());
        spare.unwrap_or_else(|| Vec::with_capacity(CHUNK_EVENTS))
    }

    /// The layer written again that event `Written { at }` stands for.
    pub fn written(&self, at: u32) -> &WrittenLayer {
        &self.written[at as usize]
    }

    /// How many events it holds, each layer written again counted as its own events.
    pub fn plain_len(&self) -> usize {
        self.plain_len
    }

    /// Its events, each layer written again as its own events.
    pub fn plain(&self) -> impl Iterator<Item = Event> + '_ {
        self.events.iter().flat_map(move |&e| {
            let (layer, n) = match e {
                Event::Written { at } => {
                    let layer = self.written(at);
                    (Some(layer), layer.steps.len())
                }
                _ => (None, 1),
            };
            (0..n).map(move |i| layer.map_or(e, |l| l.event(i)))
        })
    }
}

impl From<Vec<Event>> for Events {
    fn from(events: Vec<Event>) -> Events {
        Events {
            plain_len: events.len(),
            events,
            written: Vec::new(),
        }
    }
}

impl std::ops::Deref for Events {
    type Target = [Event];
    fn deref(&self) -> &[Event] {
        &self.events
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let mut buffer = std::mem::take(&mut self.events);
        if buffer.capacity() != CHUNK_EVENTS {
            return;
        }
        buffer.clear();
        if let Ok(mut spare) = SPARE.lock() {
            if spare.len() < SPARE_BUFFERS {
                spare.push(buffer);
            }
        }
    }
}

/// What the process has loaded when a stage begins, which decides what it holds outside the
/// allocator (the CUDA context, then the kernels and library handles each kind of work loads the
/// first time it runs): see [`super::outside::Outside`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Loaded {
    /// CUDA started, weights and inputs copied: no kernel of the model's work has run.
    Context,
    /// A forward pass (a training step's or `generate`'s prefill) has run.
    Forward,
    /// A backward pass has run (autograd's thread, its handles and kernels).
    Backward,
    /// `generate` has decoded a token.
    Decode,
}

/// Where a stage begins: its name and what the process has loaded by then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageMark {
    pub name: String,
    pub loaded: Loaded,
}

/// A stage of the program: its name, the events it spans and what the process has loaded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stage {
    pub name: String,
    pub begin: usize,
    pub end: usize,
    pub loaded: Loaded,
}

/// Every allocation and free of a run, and its stages.
#[derive(Debug, Clone, Default)]
pub struct Program {
    /// What the tape wrote, in order: the events in its chunks (never copied into one), and
    /// where each stage begins and ends.
    pub(crate) chunks: Vec<Chunk>,
    /// Decoder layers written again from another's record rather than run.
    pub(crate) written_again: u64,
}

impl Program {
    /// The program of what a tape wrote: its chunks, and how many decoder layers it wrote again.
    pub fn new(chunks: Vec<Chunk>, written_again: u64) -> Program {
        Program {
            chunks,
            written_again,
        }
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The chunks of events, in order.
    fn event_chunks(&self) -> impl Iterator<Item = &Events> + '_ {
        self.chunks.iter().filter_map(|c| match c {
            Chunk::Events(events) => Some(&**events),
            _ => None,
        })
    }

    /// The stages, with the events each spans.
    pub fn stages(&self) -> Vec<Stage> {
        let (mut stages, mut at) = (Vec::new(), 0);
        for chunk in &self.chunks {
            match chunk {
                Chunk::Events(events) => at += events.plain_len(),
                Chunk::Begin(mark) => stages.push(Stage {
                    name: mark.name.clone(),
                    begin: at,
                    end: at,
                    loaded: mark.loaded,
                }),
                Chunk::End => stages.last_mut().expect("a stage ends once begun").end = at,
            }
        }
        stages
    }

    /// Every allocation and free, in order (a layer written again as its events).
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.event_chunks().flat_map(|c| c.plain())
    }

    /// How many decoder layers were written again from another layer's record.
    pub fn layers_written_again(&self) -> u64 {
        self.written_again
    }

    /// How many allocations and frees there are.
    pub fn len(&self) -> usize {
        self.event_chunks().map(|c| c.plain_len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
