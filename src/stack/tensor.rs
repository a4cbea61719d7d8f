//! Tensors as the emulation sees them: a shape, strides and an element type over a storage the
//! tape allocated (the tape keeps its events, or streams them to a replay in chunks). A storage
//! is freed on the tape when the last tensor viewing it is dropped, as Python frees a tensor when
//! its last reference goes; views share their base's storage. Each
//! tensor made under autograd points into the graph recorded on it (its `grad_fn`): the nodes,
//! their backward rules and saved tensors, and the parameters' gradient slots.

use std::cell::RefCell;
use std::rc::Rc;

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F16,
    Bf16,
    I64,
    I32,
    Bool,
    U8,
}

impl Elem {
    pub fn size(self) -> u64 {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
            Elem::I64 => 8,
            Elem::Bool | Elem::U8 => 1,
        }
    }

    pub fn of(dtype: crate::dtype::Dtype) -> Elem {
        match dtype {
            crate::dtype::Dtype::Float32 => Elem::F32,
            crate::dtype::Dtype::Float16 => Elem::F16,
            crate::dtype::Dtype::Bfloat16 => Elem::Bf16,
        }
    }

    /// The elements of a model's buffer: int64 positions, float32 otherwise.
    pub fn of_buffer(b: &crate::model::Parameter) -> Elem {
        match b.role {
            crate::model::TensorRole::Positions => Elem::I64,
            _ => Elem::F32,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16 | Elem::Bf16)
    }

    /// The type of a binary operation's result (PyTorch's promotion between floating types;
    /// a float beats an integer).
    pub fn promote(self, other: Elem) -> Elem {
        match (self, other) {
            (a, b) if a == b => a,
            (Elem::F32, _) | (_, Elem::F32) => Elem::F32,
            (Elem::F16, Elem::Bf16) | (Elem::Bf16, Elem::F16) => Elem::F32,
            (a, b) if a.is_float() => {
                let _ = b;
                a
            }
            (_, b) if b.is_float() => b,
            (Elem::I64, _) | (_, Elem::I64) => Elem::I64,
            (a, _) => a,
        }
    }
}

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
    /// A tensor's storage of `bytes` (as asked of the allocator); allocations are numbered in
    /// order from 0.
    Alloc { bytes: u64, role: Role },
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
            Step::Alloc { bytes, role } => Event::Alloc { bytes, role },
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
    Begin(String),
    End,
}

/// Events a streaming tape sends at a time.
const CHUNK_EVENTS: usize = 1 << 16;

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
    events: Vec<Event>,
    written: Vec<WrittenLayer>,
    /// Its events with each layer written again counted as its own.
    plain_len: usize,
}

impl Events {
    /// An empty buffer for a chunk: a spare one if any.
    fn buffer() -> Vec<Event> {
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
        log.push(Event::Alloc { bytes, role });
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
            alloc,
            bytes,
        })
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

    /// A new contiguous tensor of `shape` and `elem`.
    pub fn empty(&self, shape: &[u64], elem: Elem) -> Tensor {
        let numel: u64 = shape.iter().product();
        Tensor::over(self.storage(numel * elem.size()), shape, elem)
    }

    /// A storage of `bytes`, freed when its last view goes.
    pub fn storage(&self, bytes: u64) -> Rc<Storage> {
        Rc::new(Storage {
            tape: self.clone(),
            alloc: self.alloc(bytes),
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
    tape: Tape,
    alloc: Option<u32>,
    pub bytes: u64,
}

impl Storage {
    /// The allocation this storage holds (none for zero bytes).
    pub fn alloc(&self) -> Option<u32> {
        self.alloc
    }

    /// Forgets its allocation, whose free is on the tape already.
    pub(super) fn forget(&mut self) {
        self.alloc = None;
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(alloc) = self.alloc {
            self.tape.0.borrow_mut().push(Event::Free { alloc });
        }
    }
}

/// A tensor's sizes or strides, held inline (a tensor of more than six dimensions spills to the
/// heap).
pub type Dims = smallvec::SmallVec<[u64; 6]>;

/// A tensor: a view of a storage, and where its gradient flows.
#[derive(Clone)]
pub struct Tensor {
    pub storage: Rc<Storage>,
    pub shape: Dims,
    pub strides: Dims,
    pub elem: Elem,
    /// The node that made it and which of its outputs it is, when autograd recorded it.
    pub grad_fn: Option<Grad>,
    /// A view of another tensor's storage (autograd never adds into a view in place).
    pub is_view: bool,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?} {:?})", self.shape, self.elem)
    }
}

/// Contiguous strides of `shape`.
pub fn contiguous_strides(shape: &[u64]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

impl Tensor {
    /// A contiguous view of all of `storage`.
    pub fn over(storage: Rc<Storage>, shape: &[u64], elem: Elem) -> Tensor {
        Tensor {
            storage,
            shape: Dims::from_slice(shape),
            strides: contiguous_strides(shape),
            elem,
            grad_fn: None,
            is_view: false,
        }
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.numel() * self.elem.size()
    }

    pub fn dim(&self) -> usize {
        self.shape.len()
    }

    /// The size of dimension `d` (negative from the end).
    pub fn size(&self, d: isize) -> u64 {
        self.shape[self.axis(d)]
    }

    pub fn axis(&self, d: isize) -> usize {
        let axis = if d < 0 {
            self.dim().checked_sub(d.unsigned_abs())
        } else {
            Some(d.unsigned_abs())
        };
        axis.filter(|&a| a < self.dim())
            .unwrap_or_else(|| panic!("dimension {d} of a {}-d tensor", self.dim()))
    }

    pub fn tape(&self) -> &Tape {
        &self.storage.tape
    }

    /// Whether the elements are laid out densely in row-major order (sizes of 1 ignored).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size == 1 {
                continue;
            }
            if stride != expected {
                return false;
            }
            expected *= size;
        }
        true
    }

    /// Whether this tensor and `other` view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Rc::ptr_eq(&self.storage, &other.storage)
    }

    /// The same view with other sizes and strides (no allocation).
    pub fn restrided(&self, shape: Dims, strides: Dims) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            shape,
            strides,
            elem: self.elem,
            grad_fn: None,
            is_view: true,
        }
    }

    /// How many tensors view this storage (Python's `storage.use_count`).
    pub fn storage_uses(&self) -> usize {
        Rc::strong_count(&self.storage)
    }
}

/// The strides of a view of `old` (sizes, strides) as `new` sizes, if one exists without a copy
/// (PyTorch's `computeStride`).
pub fn view_strides(old_shape: &[u64], old_strides: &[u64], new_shape: &[u64]) -> Option<Dims> {
    let numel: u64 = old_shape.iter().product();
    if numel == 0 || old_shape.is_empty() {
        return Some(contiguous_strides(new_shape));
    }
    let mut new_strides: Dims = smallvec::smallvec![0; new_shape.len()];
    // The next view dimension to fill, counted from 1 (0: all filled).
    let mut view_left = new_shape.len();
    let mut chunk_base_stride = *old_strides.last().expect("non-empty");
    let mut tensor_numel = 1u64;
    let mut view_numel = 1u64;
    for tensor_d in (0..old_shape.len()).rev() {
        tensor_numel *= old_shape[tensor_d];
        if tensor_d == 0
            || (old_shape[tensor_d - 1] != 1
                && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)
        {
            while view_left > 0 && (view_numel < tensor_numel || new_shape[view_left - 1] == 1) {
                new_strides[view_left - 1] = view_numel * chunk_base_stride;
                view_numel *= new_shape[view_left - 1];
                view_left -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_left != 0 {
        return None;
    }
    Some(new_strides)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    #[test]
    fn a_storage_is_freed_when_its_last_view_goes() {
        let tape = Tape::new();
        let a = tape.empty(&[2, 3], Elem::F32);
        let view = a.restrided(smallvec![3, 2], smallvec![1, 3]);
        drop(a);
        assert_eq!(tape.len(), 1);
        assert!(!view.is_contiguous());
        drop(view);
        assert_eq!(
            tape.take(),
            vec![Chunk::Events(std::sync::Arc::new(Events::from(vec![
                Event::Alloc {
                    bytes: 24,
                    role: Role::Activations
                },
                Event::Free { alloc: 0 }
            ])))]
        );
    }

    #[test]
    fn views_follow_pytorch_compute_stride() {
        // A transposed [4, 6] cannot be flattened without a copy; splitting a dimension can.
        assert_eq!(view_strides(&[6, 4], &[1, 6], &[24]), None);
        assert_eq!(
            view_strides(&[6, 4], &[4, 1], &[2, 3, 4]),
            Some(smallvec![12, 4, 1])
        );
        assert_eq!(
            view_strides(&[2, 5, 3], &[15, 1, 5], &[2, 5, 3, 1]),
            Some(smallvec![15, 1, 5, 5])
        );
        // Merging the first two dimensions of that layout needs a copy.
        assert_eq!(view_strides(&[2, 5, 3], &[15, 1, 5], &[10, 3]), None);
    }
}

/// What a recorded node does in backward.
#[derive(Clone, Debug)]
pub enum Rule {
    /// `mm(a, b)` (a linear layer's matrix product): saved a if b needs a gradient, b if a does.
    Mm,
    /// `addmm(bias, a, b)`.
    Addmm,
    /// A reshape (or an unsqueeze, a slice of a whole dimension): the gradient is reshaped back
    /// (a copy where its layout allows no view).
    View,
    /// `transpose(a, b)`: the gradient transposed back (a view).
    Transpose { a: usize, b: usize },
    /// `slice` along a dimension: the gradient is written into zeros of the input's shape.
    Slice,
    /// `expand`: the gradient is summed back to the input's shape.
    Expand,
    /// Elementwise `a * b`.
    Mul,
    /// `a * scalar` or `a / scalar`.
    Scale,
    /// `a + b` (or `a - b`): gradients pass through (reduced where broadcast).
    Add,
    /// `a + scalar`: passes through.
    AddScalar,
    /// `-a`.
    Neg,
    /// `a.to(dtype)` from `from`.
    ToCopy { from: Elem },
    /// `a.pow(2)` (saves a).
    Pow,
    /// `a.mean(-1, keepdim)`.
    Mean,
    /// `rsqrt(a)` (saves the result).
    Rsqrt,
    /// `cat(tensors, dim)`: the gradient's slices.
    Cat { dim: usize, sizes: Vec<u64> },
    /// `silu(a)` (saves a).
    Silu,
    /// `gelu(a, approximate="tanh")` (saves a).
    Gelu,
    /// `tanh(a)` (saves the result).
    Tanh,
    /// `sigmoid(a)` (saves the result).
    Sigmoid,
    /// `softmax(a)` (saves the result).
    Softmax,
    /// `embedding(weight, ids)` (saves the ids).
    Embedding { vocab: u64 },
    /// cuDNN attention (saves q, k, v, the output and its statistics).
    CudnnAttention,
    /// `log_softmax` (saves the result).
    LogSoftmax,
    /// `nll_loss` (saves the targets and the total weight).
    NllLoss,
    /// `clone` / `contiguous`.
    Clone,
    /// `x[index]` along the first dimension (saves the index): the gradient scattered into
    /// zeros of the input's shape.
    IndexRows,
    /// `grouped_mm(x, w)` per expert (saves both): gradients of x and of the 3-D weight.
    GroupedMm,
    /// `masked_fill` out of place: the gradient masked (a copy).
    MaskedFill,
    /// `sum(dim=1)`: the gradient expanded back (a view).
    SumDim1,
    /// `topk(values)`: the gradient scattered into zeros of the input's shape.
    Topk,
    /// `a /= b` in place (saves a copy of `a` and `b`).
    DivInPlace,
    /// `chunk(2, dim=-1)` or `split([first, rest], dim=-1)`: one node for both parts; their
    /// gradients concatenated back.
    Split,
    /// A new tensor filled by copying parts into its slices (`new_empty` then `copy_`): the
    /// gradient copied once, the parts' gradients views of it.
    Assemble { sizes: Vec<u64> },
    /// bitsandbytes' `MatMul4Bit` of a 4-bit `[out_features, in_features]` weight: the input's
    /// gradient through the weight dequantized again (its `blocks` scales first, in float32)
    /// into `elem`.
    MatMul4bit {
        out_features: u64,
        in_features: u64,
        blocks: u64,
        elem: Elem,
    },
}

/// A recorded operation.
pub struct Node {
    /// Creation order: later nodes run first.
    pub seq: u64,
    pub rule: Rule,
    /// What the operation saved for backward (released once the node has run).
    pub saved: Vec<Tensor>,
    /// Where the gradient of each differentiable input goes (none for inputs that need none).
    pub next: Vec<Option<Grad>>,
    /// Shape, strides and element type of each input, for the gradients the node makes.
    pub inputs: Vec<Meta>,
    /// The checkpointed layer whose recomputation gives this node its saved tensors (they were
    /// not kept in the forward pass).
    pub frame: Option<usize>,
}

/// Shape, strides and element type of a tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub shape: Dims,
    pub strides: Dims,
    pub elem: Elem,
}

impl Meta {
    pub fn of(t: &Tensor) -> Meta {
        Meta {
            shape: t.shape.clone(),
            strides: t.strides.clone(),
            elem: t.elem,
        }
    }
}

pub type NodeRef = Rc<RefCell<Node>>;

/// A trained parameter: its gradient accumulates here.
pub struct Leaf {
    pub meta: Meta,
    pub grad: RefCell<Option<Tensor>>,
}

/// Where a tensor's gradient goes: the node that made it (and which output it is), or the
/// parameter it is.
#[derive(Clone)]
pub enum Grad {
    Node(NodeRef, usize),
    Leaf(Rc<Leaf>),
}

impl Grad {
    pub(super) fn key(&self) -> usize {
        match self {
            Grad::Node(n, _) => Rc::as_ptr(n) as *const () as usize,
            Grad::Leaf(l) => Rc::as_ptr(l) as *const () as usize,
        }
    }
    pub(super) fn slot(&self) -> usize {
        match self {
            Grad::Node(_, i) => *i,
            Grad::Leaf(_) => 0,
        }
    }
    pub(super) fn seq(&self) -> u64 {
        match self {
            Grad::Node(n, _) => n.borrow().seq,
            Grad::Leaf(_) => u64::MAX,
        }
    }
}
