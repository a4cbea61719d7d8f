//! Tensors as the emulation sees them: a shape, strides and an element type over a storage the
//! tape allocated ([`super::tape`]); views share their base's storage. Each tensor made under
//! autograd points into the graph recorded on it: its `grad_fn`, the node that made it, with the
//! rule its backward runs and the tensors it saved (the engine that runs them:
//! [`super::autograd`]).

use super::tape::{Storage, Tape};
use crate::dtype::Dtype;
use std::cell::RefCell;
use std::rc::Rc;

/// A tensor's sizes or strides, held inline (a tensor of more than six dimensions spills to the
/// heap).
pub type Dims = smallvec::SmallVec<[u64; 4]>;

/// A tensor: a view of a storage, and where its gradient flows.
#[derive(Clone)]
pub struct Tensor {
    pub storage: Rc<Storage>,
    pub shape: Dims,
    pub strides: Dims,
    pub elem: Dtype,
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
    pub fn over(storage: Rc<Storage>, shape: &[u64], elem: Dtype) -> Tensor {
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
        self.numel() * self.elem.bytes()
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

    /// `detach()`: the same tensor outside the graph (it keeps no node alive).
    pub fn detach(&self) -> Tensor {
        Tensor {
            grad_fn: None,
            ..self.clone()
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

/// A hook a sharded model runs on the way back, of its group `0` (the root's own parameters)
/// or `1 + layer` ([`super::fsdp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// The group's outputs' gradient is made.
    PreBackward(usize),
    /// Its inputs' gradient is made.
    PostBackward(usize),
}

/// What a recorded node does in backward.
#[derive(Clone, Debug)]
pub enum Rule {
    /// `mm(a, b)` (a linear layer's matrix product): saved a if b needs a gradient, b if a does.
    Mm,
    /// A hook of a sharded model's on the way back (the gradient passes through unchanged).
    Hook(Hook),
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
    /// `sum(-1, keepdim=True)`: the gradient expanded back to the input's shape (a view).
    SumLast,
    /// Elementwise `a * b`.
    Mul,
    /// `a * scalar` or `a / scalar`.
    Scale,
    /// `dropout(a)` in training (saves its boolean mask): the gradient times the mask, scaled.
    Dropout,
    /// `a + b`: gradients pass through (reduced where broadcast).
    Add,
    /// `native_layer_norm(x, [n], weight, bias)` over `rows` rows of `n` (saves the input, the
    /// weight and bias, and the rows' float32 mean and reciprocal standard deviation).
    LayerNorm { rows: u64, n: u64 },
    /// `a - b`: `a`'s gradient passes through, `b`'s is the gradient negated (then reduced where
    /// broadcast).
    Sub,
    /// `a + scalar`: passes through.
    AddScalar,
    /// `-a`.
    Neg,
    /// `a.to(dtype)` from `from`.
    ToCopy { from: Dtype },
    /// `a.pow(2)`: `a * a` (saves a).
    Square,
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
    /// `x.sum()` of every element: the gradient expanded back (a view).
    SumAll,
    /// `x[mask]` with a boolean mask over its leading dimensions (saves the mask): the gradient
    /// put back, accumulating, into zeros of the input's shape at the mask's nonzero positions.
    IndexMask,
    /// `zeros.masked_scatter(mask, x)` (saves the mask): `x`'s gradient is the gradient at the
    /// mask's positions (`masked_select`, through the mask's nonzero positions).
    MaskedScatter,
    /// TRL's `_ChunkedLogProbFunction` over `[hidden, weight]` (saves the hidden rows, the
    /// targets, the log-normalizers and the entropy): the gradients recomputed tile by tile.
    ChunkedLogProb { compute: Dtype },
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
        elem: Dtype,
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
    pub elem: Dtype,
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

impl Rule {
    /// Outputs of the node (gradients it receives).
    pub fn outputs(&self) -> usize {
        match self {
            Rule::Split | Rule::ChunkedLogProb { .. } => 2,
            _ => 1,
        }
    }
}

impl Tape {
    /// A new contiguous tensor of `shape` and `elem`.
    pub fn empty(&self, shape: &[u64], elem: Dtype) -> Tensor {
        let numel: u64 = shape.iter().product();
        Tensor::over(self.storage(numel * elem.bytes()), shape, elem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::program::{Chunk, Event, Events, Role};
    use smallvec::smallvec;

    #[test]
    fn a_storage_is_freed_when_its_last_view_goes() {
        let tape = Tape::new();
        let a = tape.empty(&[2, 3], Dtype::Float32);
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
                    role: Role::Activations,
                    stream: 0
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
