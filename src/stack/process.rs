//! The emulated process's state: its tape, autograd's state, autocast and its cache, the
//! checkpointed layers' recomputation, what the GPU's kernels keep between calls (the cuBLAS and
//! cuBLASLt workspaces of each thread's handle) and the order its string hashing gives a vision
//! model's masks; and the helpers every operation uses to allocate its outputs as PyTorch lays
//! them out and to record itself under autograd.

use super::autograd::{self, Autograd};
use super::tape::Tape;
use super::tensor::{Dims, Tensor};
use super::tensor::{Grad, Leaf, Meta, Rule};
use crate::dtype::Dtype;
use crate::replay::program::Role;

/// What a GPU gives the emulation that no shape does: workspace sizes (PyTorch 2.11's defaults
/// for the GPU's architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kernels {
    /// The cuBLAS workspace of a thread's handle, allocated at its first matrix product.
    pub cublas_workspace: u64,
    /// cuBLASLt's own workspace, allocated at a thread's first product with a bias.
    pub cublaslt_workspace: u64,
    /// The resident threads that size a long reduction's grid (and so what it stages).
    #[serde(default = "h200_grid")]
    pub reduction_grid: super::reduce::ReductionGrid,
    /// The GPU's architecture, which bitsandbytes' choice of 4-bit kernel reads.
    #[serde(default = "h200_architecture")]
    pub compute_capability: crate::allocator::ComputeCapability,
}

fn h200_grid() -> super::reduce::ReductionGrid {
    super::reduce::ReductionGrid::H200
}

fn h200_architecture() -> crate::allocator::ComputeCapability {
    crate::allocator::ComputeCapability::new(9, 0)
}

impl Kernels {
    /// PyTorch 2.11's defaults on a GPU of compute capability `cc` with the H200's 132
    /// multiprocessors (the GPU the proofs ran on; [`Kernels::with_multiprocessors`] names
    /// another count).
    pub fn for_gpu(cc: crate::allocator::ComputeCapability) -> Kernels {
        let w = crate::allocator::Workspaces::for_gpu(cc, &Default::default())
            .expect("the default settings are valid");
        Kernels {
            cublas_workspace: w.cublas_bytes,
            cublaslt_workspace: w.cublaslt_bytes.unwrap_or(0),
            reduction_grid: super::reduce::ReductionGrid::H200,
            compute_capability: cc,
        }
    }

    /// The same GPU with `multiprocessors` streaming multiprocessors (as many resident threads
    /// each as the H200's), which size long reductions' grids and bitsandbytes' choice of kernel.
    pub fn with_multiprocessors(self, multiprocessors: u64) -> Kernels {
        Kernels {
            reduction_grid: super::reduce::ReductionGrid {
                multiprocessors,
                ..self.reduction_grid
            },
            ..self
        }
    }
}

/// What a model sharded over ranks runs around its groups' forwards, on the way back and at the
/// optimizer's step (FSDP2: [`super::fsdp::Fsdp`]). Group `0` is the root's own parameters,
/// `1 + layer` a decoder layer's.
pub trait ShardedModel {
    /// Before group `group`'s forward: its parameters gathered; `input` (none for the root)
    /// given the node that runs the group's post-backward, returned when it needs a gradient.
    fn pre_forward(
        &mut self,
        p: &mut Process,
        group: usize,
        input: Option<&Tensor>,
    ) -> Option<Tensor>;
    /// After its forward: resharded; `output` given the pre-backward hook (returned when it
    /// needs a gradient).
    fn post_forward(&mut self, p: &mut Process, group: usize, output: &Tensor) -> Option<Tensor>;
    /// A hook met on the way back.
    fn run_hook(&mut self, p: &mut Process, hook: super::tensor::Hook);
    /// The engine's final callback when the backward is over.
    fn final_callback(&mut self, p: &mut Process);
    /// The rank's parameters the optimizer steps (those with a gradient), in the model's order.
    fn stepped(&self) -> Vec<Tensor>;
    /// `zero_grad(set_to_none=True)`.
    fn zero_grad(&mut self);
}

/// What the reducer of a model replicated over ranks runs before each forward and as each
/// trained parameter's gradient is set (DDP: [`super::ddp::Reducer`]).
pub trait Replicated {
    /// Before the model's forward under grad mode.
    fn pre_forward(&mut self, p: &mut Process);
    /// After `AccumulateGrad` set `leaf`'s gradient.
    fn gradient_ready(&mut self, leaf: &Leaf);
}

/// Reruns a checkpointed layer's forward: (the process, the layer, its inputs).
pub type RecomputeLayer = Box<dyn FnMut(&mut Process, usize, &[Tensor])>;

/// The order in which a Gemma 3 with its vision tower makes its masks: `create_masks_for_generate`
/// iterates `set(config.layer_types)`, whose order follows the process's string hashing
/// (`PYTHONHASHSEED`, random in every process), so each run makes them one way or the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaskOrder {
    #[default]
    FullFirst,
    SlidingFirst,
}

impl MaskOrder {
    pub const BOTH: [MaskOrder; 2] = [MaskOrder::FullFirst, MaskOrder::SlidingFirst];
}

/// The emulated process: its tape, autograd's state and what kernels keep between calls.
pub struct Process {
    pub tape: Tape,
    pub autograd: Autograd,
    /// `torch.autocast(dtype)` is on: products and attention run in this type.
    pub autocast: Option<Dtype>,
    /// Autocast's cache of the low-precision copies of trained float32 weights (cleared when
    /// the autocast region ends).
    pub(super) autocast_cache: Vec<(usize, Tensor)>,
    /// Reruns a checkpointed layer's forward (`layer`, its inputs) during backward.
    pub recompute_layer: Option<RecomputeLayer>,
    pub kernels: Kernels,
    /// The order this process's string hashing gives a vision model's masks.
    pub mask_order: super::process::MaskOrder,
    /// The batch's attention mask holds zeros (padded rows).
    pub padded: bool,
    /// The batch is one row of several sequences, its positions restarting at each (TRL's
    /// padding-free collator): the attention runs under a block-diagonal causal mask.
    pub packed: bool,
    /// Whether the code runs on autograd's backward thread (its own cuBLAS handle).
    pub(super) backward_thread: bool,
    /// Per thread (forward, backward): the cuBLAS and cuBLASLt workspaces once made.
    pub(super) workspaces: [Vec<Tensor>; 2],
    pub(super) has_cublas: [bool; 2],
    pub(super) has_cublaslt: [bool; 2],
    /// The hooks of a sharded model (FSDP2's rank: [`super::fsdp`]).
    pub fsdp: Option<Box<dyn ShardedModel>>,
    /// This process as a rank of a tensor-parallel run ([`super::tensor_parallel`]).
    pub tensor_parallel: Option<super::tensor_parallel::TensorParallel>,
    /// The reducer of a model replicated over ranks (DDP's: [`super::ddp`]).
    pub ddp: Option<Box<dyn Replicated>>,
}

/// Broadcast shape of two shapes.
pub(super) fn broadcast(a: &[u64], b: &[u64]) -> Dims {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let y = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            x.max(y)
        })
        .collect()
}

impl Process {
    pub fn new(kernels: Kernels) -> Process {
        Process {
            tape: Tape::new(),
            autograd: Autograd::new(),
            recompute_layer: None,
            mask_order: Default::default(),
            padded: false,
            packed: false,
            autocast: None,
            autocast_cache: Vec::new(),
            kernels,
            backward_thread: false,
            workspaces: [Vec::new(), Vec::new()],
            has_cublas: [false; 2],
            has_cublaslt: [false; 2],
            fsdp: None,
            tensor_parallel: None,
            ddp: None,
        }
    }

    /// Runs `f` with the allocations it makes given `role`.
    pub fn in_role<R>(&mut self, role: Role, f: impl FnOnce(&mut Self) -> R) -> R {
        let tape = self.tape.clone();
        let before = tape.0.borrow_mut().role.replace(role);
        let out = f(self);
        tape.0.borrow_mut().role = before;
        out
    }

    /// Autocast's cast of `t` to its type for a product: none outside autocast or for a tensor
    /// already of that type; a trained float32 weight's copy is cached for the region.
    pub(super) fn autocast_cast(&mut self, t: &Tensor, weight: bool) -> Tensor {
        let Some(target) = self.autocast else {
            return t.clone();
        };
        if t.elem == target || !t.elem.is_float() {
            return t.clone();
        }
        let key = std::rc::Rc::as_ptr(&t.storage) as usize;
        let cacheable = weight && matches!(t.grad_fn, Some(Grad::Leaf(_)));
        if cacheable {
            if let Some((_, c)) = self.autocast_cache.iter().find(|(k, _)| *k == key) {
                return c.clone();
            }
        }
        let cast = self.to(t, target);
        if cacheable {
            self.autocast_cache.push((key, cast.clone()));
        }
        cast
    }

    /// Leaves the autocast region: its cache goes.
    pub fn end_autocast(&mut self) {
        self.autocast = None;
        self.autocast_cache.clear();
    }

    /// Autocast's float32 operations (`pow`, `rsqrt`) take float32 inputs.
    pub(super) fn autocast_f32(&mut self, t: &Tensor) -> Tensor {
        match self.autocast {
            Some(_) if t.elem != Dtype::Float32 => self.to(t, Dtype::Float32),
            _ => t.clone(),
        }
    }

    pub(super) fn thread(&self) -> usize {
        usize::from(self.backward_thread)
    }

    /// A new contiguous tensor.
    pub fn empty(&self, shape: &[u64], elem: Dtype) -> Tensor {
        self.tape.empty(shape, elem)
    }

    /// A new tensor with the layout of `like` (`empty_like`, and the output of an elementwise
    /// operation on it: dense, its dimensions in the order of `like`'s strides).
    pub fn empty_like(&self, like: &Meta) -> Tensor {
        self.laid_out_like(&like.shape, &like.strides, like.elem)
    }

    /// A new tensor of `shape` and `elem` whose dimensions are laid out in the memory order of
    /// `strides` (`empty_like`'s preserve format).
    pub(super) fn laid_out_like(&self, shape: &[u64], strides: &[u64], elem: Dtype) -> Tensor {
        let mut t = self.tape.empty(shape, elem);
        // Contiguous strides keep their order: the new tensor's are already those.
        if t.strides[..] != *strides {
            t.strides = ordered_strides(shape, strides);
        }
        t
    }

    /// The output of an elementwise operation of `shape` and `elem` on `inputs`: laid out as
    /// the first input of the output's shape (TensorIterator keeps the inputs' memory order).
    pub(super) fn elementwise(&self, shape: &[u64], elem: Dtype, inputs: &[&Tensor]) -> Tensor {
        match inputs.iter().find(|t| t.shape[..] == *shape) {
            Some(first) => self.laid_out_like(shape, &first.strides, elem),
            None => self.empty(shape, elem),
        }
    }

    /// The cuBLAS workspace of this thread's handle, made at its first product (and cuBLASLt's
    /// at its first product with a bias).
    pub(super) fn matmul_workspace(&mut self, bias: bool) {
        let th = self.thread();
        if !self.has_cublas[th] {
            self.has_cublas[th] = true;
            let w = self.tape.with_role(Role::Workspaces, || {
                self.tape
                    .empty(&[self.kernels.cublas_workspace], Dtype::Uint8)
            });
            self.workspaces[th].push(w);
        }
        if bias && !self.has_cublaslt[th] && self.kernels.cublaslt_workspace > 0 {
            self.has_cublaslt[th] = true;
            let w = self.tape.with_role(Role::Workspaces, || {
                self.tape
                    .empty(&[self.kernels.cublaslt_workspace], Dtype::Uint8)
            });
            self.workspaces[th].push(w);
        }
    }

    pub(super) fn record(
        &mut self,
        rule: Rule,
        inputs: &[&Tensor],
        saved: Vec<Tensor>,
        out: &mut Tensor,
    ) {
        self.autograd.record(rule, inputs, saved, &mut [out]);
        self.stop_if_recomputed();
    }

    /// Records an operation of another module that saves nothing.
    pub(super) fn record_op(&mut self, rule: Rule, inputs: &[&Tensor], out: &mut Tensor) {
        self.record(rule, inputs, vec![], out);
    }

    /// Records `rule` before its output exists (an operation that saves its inputs saves them
    /// before its kernel runs); returns the output's `grad_fn`.
    pub(super) fn node_first(
        &mut self,
        rule: Rule,
        inputs: &[&Tensor],
        saved: Vec<Tensor>,
    ) -> Option<Grad> {
        if !self.autograd.records(inputs) {
            return None;
        }
        let mut holder = self.tape.empty(&[0], Dtype::Uint8);
        self.autograd
            .record(rule, inputs, saved, &mut [&mut holder]);
        self.stop_if_recomputed();
        holder.grad_fn.take()
    }

    /// A recomputation that has collected what it needed allocates nothing more.
    pub(super) fn stop_if_recomputed(&mut self) {
        if self.autograd.stop {
            self.tape.0.borrow_mut().stopped = true;
        }
    }

    /// Starts a checkpointed layer's forward (`torch.utils.checkpoint`, non-reentrant): its
    /// nodes keep no tensors; `inputs` (the layer's arguments) are held for the recomputation
    /// until its backward is over. [`end_checkpoint`](Self::end_checkpoint) ends it.
    pub fn begin_checkpoint(&mut self, layer: usize, inputs: Vec<Tensor>) {
        let frame = self.autograd.frames.len();
        self.autograd.frames.push(autograd::Frame {
            layer,
            inputs,
            nodes: Vec::new(),
            needed: 0,
            remaining: 0,
            autocast: self.autocast,
        });
        self.autograd.saving = autograd::Saving::Checkpoint { frame };
    }

    pub fn end_checkpoint(&mut self) {
        self.autograd.saving = autograd::Saving::Keep;
    }

    pub(super) fn needs_grad(&self, ts: &[&Tensor]) -> bool {
        self.autograd.enabled && ts.iter().any(|t| t.grad_fn.is_some())
    }

    /// Runs backward from `loss` (a scalar): its gradient of ones, held until the end.
    pub fn backward(&mut self, loss: &Tensor) {
        let ones = self.empty(&[], loss.elem);
        self.backward_thread = true;
        autograd::backward(self, loss, ones.clone());
        self.with_fsdp(|fsdp, p| fsdp.final_callback(p));
        self.backward_thread = false;
        drop(ones);
    }

    /// Runs `f` on the sharded model's hooks, when there are.
    pub fn with_fsdp<R>(
        &mut self,
        f: impl FnOnce(&mut dyn ShardedModel, &mut Process) -> R,
    ) -> Option<R> {
        let mut fsdp = self.fsdp.take()?;
        let out = f(fsdp.as_mut(), self);
        self.fsdp = Some(fsdp);
        Some(out)
    }

    /// A tensor that is a trained parameter (its gradient accumulates in `leaf`).
    pub fn parameter(t: &Tensor) -> (Tensor, std::rc::Rc<Leaf>) {
        let leaf = std::rc::Rc::new(Leaf {
            meta: Meta::of(t),
            grad: Default::default(),
        });
        let mut p = t.clone();
        p.grad_fn = Some(Grad::Leaf(leaf.clone()));
        (p, leaf)
    }

    /// The staging of `reduction` of `elem` values, allocated and given back (after the
    /// reduction's output, as the kernel's launch does).
    pub fn reduction_staging(&mut self, reduction: super::reduce::Reduction, elem: Dtype) {
        let bytes = super::reduce::accumulator_bytes(elem);
        self.reduction_staging_bytes(reduction, bytes);
    }

    /// The staging of `reduction` with accumulators of `acc_bytes` (an argmax's value and index).
    pub fn reduction_staging_bytes(&mut self, reduction: super::reduce::Reduction, acc_bytes: u64) {
        let grid = self.kernels.reduction_grid;
        if let Some(s) = reduction.staging(acc_bytes, grid) {
            self.tape.with_role(Role::Workspaces, || {
                let buffer = self.tape.empty(&[s.buffer], Dtype::Uint8);
                let semaphores = self.tape.empty(&[s.semaphores], Dtype::Uint8);
                drop(semaphores);
                drop(buffer);
            });
        }
    }

    pub(super) fn grad_like(&mut self, meta: &Meta, elem: Dtype) -> Tensor {
        self.empty_like(&Meta {
            elem,
            ..meta.clone()
        })
    }
}

/// Dense strides of `shape` with its dimensions in the order of `strides` (largest stride
/// outermost; ties keep the logical order), as PyTorch lays out `empty_like` and the output of
/// an elementwise operation.
pub(super) fn ordered_strides(shape: &[u64], strides: &[u64]) -> Dims {
    let mut order: smallvec::SmallVec<[usize; 6]> = (0..shape.len()).collect();
    // Dimensions of size 1 carry no order: they keep their place.
    order.sort_by(|&i, &j| {
        if shape[i] == 1 || shape[j] == 1 {
            i.cmp(&j)
        } else {
            strides[j].cmp(&strides[i]).then(i.cmp(&j))
        }
    });
    let mut out: Dims = smallvec::smallvec![0; shape.len()];
    let mut expected = 1;
    for &i in order.iter().rev() {
        out[i] = expected;
        expected *= shape[i].max(1);
    }
    out
}
