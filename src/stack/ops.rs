//! The operations the emulated models run, each with the allocations PyTorch 2.11's CUDA kernels
//! make (outputs, and the workspaces and temporaries of those that have them) and, under
//! autograd, what it saves and the gradients its backward makes, in the order the generated
//! backward functions make them (the last input's gradient first, then the engine's reduction
//! of a broadcast gradient to its input's shape).

use super::autograd::{self, Autograd, Backward};
use super::tensor::{view_strides, Dims, Elem, Grad, Leaf, Meta, Node, Role, Rule, Tape, Tensor};
use smallvec::smallvec;

impl Rule {
    /// Outputs of the node (gradients it receives).
    pub fn outputs(&self) -> usize {
        match self {
            Rule::Split => 2,
            _ => 1,
        }
    }
}

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
}

fn h200_grid() -> super::reduce::ReductionGrid {
    super::reduce::ReductionGrid::H200
}

impl Kernels {
    /// PyTorch 2.11's defaults on a GPU of compute capability `cc`, reductions on the H200's grid
    /// (the GPU the proofs ran on; a card's own count of multiprocessors changes only what a
    /// long reduction stages for an instant).
    pub fn for_gpu(cc: crate::allocator::ComputeCapability) -> Kernels {
        let w = crate::allocator::Workspaces::for_gpu(cc, &Default::default())
            .expect("the default settings are valid");
        Kernels {
            cublas_workspace: w.cublas_bytes,
            cublaslt_workspace: w.cublaslt_bytes.unwrap_or(0),
            reduction_grid: super::reduce::ReductionGrid::H200,
        }
    }
}

/// cuDNN's attention backward workspace for `b × h` heads (`kv` of keys and values) of `s`
/// queries of width `d`: a float32 accumulator of the queries' gradient, another as large when
/// the keys and values are grouped, the row sums of dO·O, and 256 bytes
/// (`scripts/gpu/kernel-allocations.py attention` on the H200: `tests/fixtures/attention-workspace-h200.json`).
pub fn cudnn_backward_workspace(b: u64, h: u64, kv: u64, s: u64, d: u64) -> u64 {
    let accumulators = 1 + u64::from(kv < h);
    4 * b * h * s * d * accumulators + 4 * b * h * s + 256
}

/// Reruns a checkpointed layer's forward: (the process, the layer, its inputs).
pub type RecomputeLayer = Box<dyn FnMut(&mut Process, usize, &[Tensor])>;

/// The emulated process: its tape, autograd's state and what kernels keep between calls.
pub struct Process {
    pub tape: Tape,
    pub autograd: Autograd,
    /// `torch.autocast(dtype)` is on: products and attention run in this type.
    pub autocast: Option<Elem>,
    /// Autocast's cache of the low-precision copies of trained float32 weights (cleared when
    /// the autocast region ends).
    autocast_cache: Vec<(usize, Tensor)>,
    /// Reruns a checkpointed layer's forward (`layer`, its inputs) during backward.
    pub recompute_layer: Option<RecomputeLayer>,
    pub kernels: Kernels,
    /// The order this process's string hashing gives a vision model's masks.
    pub mask_order: super::masks::MaskOrder,
    /// Whether the code runs on autograd's backward thread (its own cuBLAS handle).
    backward_thread: bool,
    /// Per thread (forward, backward): the cuBLAS and cuBLASLt workspaces once made.
    workspaces: [Vec<Tensor>; 2],
    has_cublas: [bool; 2],
    has_cublaslt: [bool; 2],
}

/// Broadcast shape of two shapes.
fn broadcast(a: &[u64], b: &[u64]) -> Dims {
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
            autocast: None,
            autocast_cache: Vec::new(),
            kernels,
            backward_thread: false,
            workspaces: [Vec::new(), Vec::new()],
            has_cublas: [false; 2],
            has_cublaslt: [false; 2],
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
    fn autocast_cast(&mut self, t: &Tensor, weight: bool) -> Tensor {
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
    fn autocast_f32(&mut self, t: &Tensor) -> Tensor {
        match self.autocast {
            Some(_) if t.elem != Elem::F32 => self.to(t, Elem::F32),
            _ => t.clone(),
        }
    }

    fn thread(&self) -> usize {
        usize::from(self.backward_thread)
    }

    /// A new contiguous tensor.
    pub fn empty(&self, shape: &[u64], elem: Elem) -> Tensor {
        self.tape.empty(shape, elem)
    }

    /// A new tensor with the layout of `like` (`empty_like`, and the output of an elementwise
    /// operation on it: dense, its dimensions in the order of `like`'s strides).
    pub fn empty_like(&self, like: &Meta) -> Tensor {
        self.laid_out_like(&like.shape, &like.strides, like.elem)
    }

    /// A new tensor of `shape` and `elem` whose dimensions are laid out in the memory order of
    /// `strides` (`empty_like`'s preserve format).
    fn laid_out_like(&self, shape: &[u64], strides: &[u64], elem: Elem) -> Tensor {
        let mut t = self.tape.empty(shape, elem);
        // Contiguous strides keep their order: the new tensor's are already those.
        if t.strides[..] != *strides {
            t.strides = ordered_strides(shape, strides);
        }
        t
    }

    /// The output of an elementwise operation of `shape` and `elem` on `inputs`: laid out as
    /// the first input of the output's shape (TensorIterator keeps the inputs' memory order).
    fn elementwise(&self, shape: &[u64], elem: Elem, inputs: &[&Tensor]) -> Tensor {
        match inputs.iter().find(|t| t.shape[..] == *shape) {
            Some(first) => self.laid_out_like(shape, &first.strides, elem),
            None => self.empty(shape, elem),
        }
    }

    /// The cuBLAS workspace of this thread's handle, made at its first product (and cuBLASLt's
    /// at its first product with a bias).
    fn matmul_workspace(&mut self, bias: bool) {
        let th = self.thread();
        if !self.has_cublas[th] {
            self.has_cublas[th] = true;
            let w = self.tape.with_role(Role::Workspaces, || {
                self.tape.empty(&[self.kernels.cublas_workspace], Elem::U8)
            });
            self.workspaces[th].push(w);
        }
        if bias && !self.has_cublaslt[th] && self.kernels.cublaslt_workspace > 0 {
            self.has_cublaslt[th] = true;
            let w = self.tape.with_role(Role::Workspaces, || {
                self.tape
                    .empty(&[self.kernels.cublaslt_workspace], Elem::U8)
            });
            self.workspaces[th].push(w);
        }
    }

    fn record(&mut self, rule: Rule, inputs: &[&Tensor], saved: Vec<Tensor>, out: &mut Tensor) {
        self.autograd.record(rule, inputs, saved, &mut [out]);
        self.stop_if_recomputed();
    }

    /// Records an operation of another module that saves nothing.
    pub(super) fn record_op(&mut self, rule: Rule, inputs: &[&Tensor], out: &mut Tensor) {
        self.record(rule, inputs, vec![], out);
    }

    /// Records `rule` before its output exists (an operation that saves its inputs saves them
    /// before its kernel runs); returns the output's `grad_fn`.
    fn node_first(&mut self, rule: Rule, inputs: &[&Tensor], saved: Vec<Tensor>) -> Option<Grad> {
        if !self.autograd.records(inputs) {
            return None;
        }
        let mut holder = self.tape.empty(&[0], Elem::U8);
        self.autograd
            .record(rule, inputs, saved, &mut [&mut holder]);
        self.stop_if_recomputed();
        holder.grad_fn.take()
    }

    /// A recomputation that has collected what it needed allocates nothing more.
    fn stop_if_recomputed(&mut self) {
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
        });
        self.autograd.saving = autograd::Saving::Checkpoint { frame };
    }

    pub fn end_checkpoint(&mut self) {
        self.autograd.saving = autograd::Saving::Keep;
    }

    fn needs_grad(&self, ts: &[&Tensor]) -> bool {
        self.autograd.enabled && ts.iter().any(|t| t.grad_fn.is_some())
    }

    // --- Views (no allocation) -------------------------------------------------------------

    /// `view` / `reshape`: a view when the layout allows one, else a copy.
    pub fn reshape(&mut self, x: &Tensor, shape: &[u64]) -> Tensor {
        assert_eq!(
            x.numel(),
            shape.iter().product::<u64>(),
            "reshape of {:?} to {shape:?}",
            x.shape
        );
        match view_strides(&x.shape, &x.strides, shape) {
            Some(strides) => {
                let mut v = x.restrided(Dims::from_slice(shape), strides);
                self.record(Rule::View, &[x], vec![], &mut v);
                v
            }
            None => {
                let c = self.contiguous(x);
                self.reshape(&c, shape)
            }
        }
    }

    pub fn transpose(&mut self, x: &Tensor, a: isize, b: isize) -> Tensor {
        let (a, b) = (x.axis(a), x.axis(b));
        let mut shape = x.shape.clone();
        let mut strides = x.strides.clone();
        shape.swap(a, b);
        strides.swap(a, b);
        let mut v = x.restrided(shape, strides);
        self.record(Rule::Transpose { a, b }, &[x], vec![], &mut v);
        v
    }

    /// `x[..., start:end]` along `dim` (a view).
    pub fn slice(&mut self, x: &Tensor, dim: isize, start: u64, end: u64) -> Tensor {
        let d = x.axis(dim);
        // A slice of the whole dimension is the tensor itself (no node).
        if start == 0 && end == x.shape[d] {
            return x.clone();
        }
        let mut shape = x.shape.clone();
        shape[d] = end - start;
        let mut v = x.restrided(shape, x.strides.clone());
        self.record(Rule::Slice, &[x], vec![], &mut v);
        v
    }

    pub fn unsqueeze(&mut self, x: &Tensor, dim: usize) -> Tensor {
        let mut shape = x.shape.clone();
        let mut strides = x.strides.clone();
        let s = if dim < x.dim() {
            x.strides[dim] * x.shape[dim]
        } else {
            1
        };
        shape.insert(dim, 1);
        strides.insert(dim, s);
        let mut v = x.restrided(shape, strides);
        self.record(Rule::View, &[x], vec![], &mut v);
        v
    }

    /// `expand` to `shape` (a view with zero strides).
    pub fn expand(&mut self, x: &Tensor, shape: &[u64]) -> Tensor {
        let lead = shape.len() - x.dim();
        let strides = (0..shape.len())
            .map(|i| {
                if i < lead || x.shape[i - lead] != shape[i] {
                    0
                } else {
                    x.strides[i - lead]
                }
            })
            .collect();
        let mut v = x.restrided(Dims::from_slice(shape), strides);
        self.record(Rule::Expand, &[x], vec![], &mut v);
        v
    }

    // --- Copies and casts --------------------------------------------------------------------

    /// `contiguous()`: the same tensor if already contiguous, else a copy.
    pub fn contiguous(&mut self, x: &Tensor) -> Tensor {
        if x.is_contiguous() {
            return x.clone();
        }
        self.clone_contiguous(x)
    }

    /// `clone()` into a contiguous tensor.
    pub fn clone_contiguous(&mut self, x: &Tensor) -> Tensor {
        let mut out = self.empty(&x.shape, x.elem);
        self.record(Rule::Clone, &[x], vec![], &mut out);
        out
    }

    /// `x.to(elem)`: the same tensor if already of that type.
    pub fn to(&mut self, x: &Tensor, elem: Elem) -> Tensor {
        if x.elem == elem {
            return x.clone();
        }
        let mut out = self.empty_like(&Meta {
            elem,
            ..Meta::of(x)
        });
        self.record(Rule::ToCopy { from: x.elem }, &[x], vec![], &mut out);
        out
    }

    /// `x.to(elem, copy=True)`: always a copy.
    pub fn to_copy(&mut self, x: &Tensor, elem: Elem) -> Tensor {
        let mut out = self.empty(&x.shape, elem);
        self.record(Rule::ToCopy { from: x.elem }, &[x], vec![], &mut out);
        out
    }

    // --- Elementwise ---------------------------------------------------------------------------

    fn binary_out(&self, a: &Tensor, b: &Tensor) -> Tensor {
        self.elementwise(
            &broadcast(&a.shape, &b.shape),
            a.elem.promote(b.elem),
            &[a, b],
        )
    }

    pub fn mul(&mut self, a: &Tensor, b: &Tensor) -> Tensor {
        let mut saved = Vec::new();
        if self.needs_grad(&[a, b]) {
            // self is saved when other needs a gradient, other when self does.
            if b.grad_fn.is_some() {
                saved.push(a.clone());
            }
            if a.grad_fn.is_some() {
                saved.push(b.clone());
            }
        }
        let grad_fn = self.node_first(Rule::Mul, &[a, b], saved);
        let mut out = self.binary_out(a, b);
        out.grad_fn = grad_fn;
        out
    }

    /// `a + b` (also `a - b`).
    pub fn add(&mut self, a: &Tensor, b: &Tensor) -> Tensor {
        let mut out = self.binary_out(a, b);
        self.record(Rule::Add, &[a, b], vec![], &mut out);
        out
    }

    /// `a + scalar` (also `1.0 + a`, `a - scalar`).
    pub fn add_scalar(&mut self, a: &Tensor) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        self.record(Rule::AddScalar, &[a], vec![], &mut out);
        out
    }

    /// `a * scalar` or `a / scalar`.
    pub fn scale(&mut self, a: &Tensor) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        self.record(Rule::Scale, &[a], vec![], &mut out);
        out
    }

    pub fn neg(&mut self, a: &Tensor) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        self.record(Rule::Neg, &[a], vec![], &mut out);
        out
    }

    /// `a.pow(2)`.
    pub fn pow(&mut self, a: &Tensor) -> Tensor {
        let a = self.autocast_f32(a);
        self.unary_saving_input(&a, Rule::Pow)
    }

    /// `a.mean(-1, keepdim=True)`.
    pub fn mean_last(&mut self, a: &Tensor) -> Tensor {
        let mut shape = a.shape.clone();
        *shape.last_mut().expect("a dimension") = 1;
        let mut out = self.empty(&shape, a.elem);
        self.record(Rule::Mean, &[a], vec![], &mut out);
        out
    }

    pub fn rsqrt(&mut self, a: &Tensor) -> Tensor {
        let a = self.autocast_f32(a);
        self.unary_saving_result(&a, Rule::Rsqrt)
    }

    pub fn tanh(&mut self, a: &Tensor) -> Tensor {
        self.unary_saving_result(a, Rule::Tanh)
    }

    pub fn sigmoid(&mut self, a: &Tensor) -> Tensor {
        self.unary_saving_result(a, Rule::Sigmoid)
    }

    fn unary_saving_result(&mut self, a: &Tensor, rule: Rule) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        if self.needs_grad(&[a]) {
            let result = out.clone();
            self.record(rule, &[a], vec![result], &mut out);
        }
        out
    }

    pub fn silu(&mut self, a: &Tensor) -> Tensor {
        self.unary_saving_input(a, Rule::Silu)
    }

    pub fn gelu_tanh(&mut self, a: &Tensor) -> Tensor {
        self.unary_saving_input(a, Rule::Gelu)
    }

    /// An elementwise operation whose backward needs its input.
    fn unary_saving_input(&mut self, a: &Tensor, rule: Rule) -> Tensor {
        let saved = self.saved_if(&[a], &[a]);
        let grad_fn = self.node_first(rule, &[a], saved);
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        out.grad_fn = grad_fn;
        out
    }

    /// `softmax(a, dim=-1, dtype=elem)`.
    pub fn softmax(&mut self, a: &Tensor, elem: Elem) -> Tensor {
        let mut out = self.empty(&a.shape, elem);
        if self.needs_grad(&[a]) {
            let result = out.clone();
            self.record(Rule::Softmax, &[a], vec![result], &mut out);
        }
        out
    }

    /// Clones of `ts` to save when any of `inputs` needs a gradient.
    fn saved_if(&self, inputs: &[&Tensor], ts: &[&Tensor]) -> Vec<Tensor> {
        if self.needs_grad(inputs) {
            ts.iter().map(|t| (*t).clone()).collect()
        } else {
            Vec::new()
        }
    }

    /// `cat(parts, dim)`.
    pub fn cat(&mut self, parts: &[&Tensor], dim: isize) -> Tensor {
        // Empty 1-D tensors (a cache's first state) take part only in the type promotion.
        let elem = parts
            .iter()
            .skip(1)
            .fold(parts[0].elem, |e, p| e.promote(p.elem));
        let parts: Vec<&Tensor> = parts
            .iter()
            .copied()
            .filter(|p| !(p.dim() == 1 && p.numel() == 0))
            .collect();
        let d = parts[0].axis(dim);
        let mut shape = parts[0].shape.clone();
        shape[d] = parts.iter().map(|p| p.shape[d]).sum();
        let mut out = self.empty(&shape, elem);
        let sizes = parts.iter().map(|p| p.shape[d]).collect();
        self.autograd
            .record(Rule::Cat { dim: d, sizes }, &parts, vec![], &mut [&mut out]);
        self.stop_if_recomputed();
        out
    }

    // --- Products ------------------------------------------------------------------------------

    /// `F.linear(x, weight, bias)`: `x @ weight.T (+ bias)`, through `mm` / `addmm` on the
    /// flattened input.
    pub fn linear(&mut self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
        if self.autocast.is_some() {
            let w = self.autocast_cast(weight, true);
            let b = bias.map(|b| self.autocast_cast(b, true));
            let xc = self.autocast_cast(x, false);
            let saved = self.autocast.take();
            let out = self.linear(&xc, &w, b.as_ref());
            self.autocast = saved;
            return out;
        }
        let out_features = weight.shape[0];
        let in_features = *x.shape.last().expect("a dimension");
        let rows = x.numel() / in_features.max(1);
        let x2 = self.reshape(x, &[rows, in_features]);
        let wt = self.transpose(weight, 0, 1);
        let mut saved = Vec::new();
        if self.needs_grad(&[&x2, &wt]) {
            if wt.grad_fn.is_some() {
                saved.push(x2.clone());
            }
            if x2.grad_fn.is_some() {
                saved.push(wt.clone());
            }
        }
        // The node (and what it saves) comes before the kernel runs.
        let be = bias.map(|b| self.expand(b, &[rows, out_features]));
        let grad_fn = match &be {
            Some(be) => self.node_first(Rule::Addmm, &[be, &x2, &wt], saved),
            None => self.node_first(Rule::Mm, &[&x2, &wt], saved),
        };
        let mut out = self.empty(&[rows, out_features], x.elem.promote(weight.elem));
        out.grad_fn = grad_fn;
        self.matmul_workspace(bias.is_some());
        drop(be);
        drop(x2);
        drop(wt);
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("a dimension") = out_features;
        self.reshape(&out, &shape)
    }

    /// The output of a matrix product with no gradient (the rotary frequencies' `bmm`), then
    /// the thread's cuBLAS workspace at its first product.
    pub fn product(&mut self, shape: &[u64], elem: Elem) -> Tensor {
        let out = self.empty(shape, elem);
        self.matmul_workspace(false);
        out
    }

    // --- Layers' kernels -------------------------------------------------------------------------

    /// `F.embedding(ids, weight)`.
    pub fn embedding(&mut self, weight: &Tensor, ids: &Tensor) -> Tensor {
        let mut shape = ids.shape.clone();
        shape.push(weight.shape[1]);
        let mut out = self.empty(&shape, weight.elem);
        let saved = self.saved_if(&[weight], &[ids]);
        self.record(
            Rule::Embedding {
                vocab: weight.shape[0],
            },
            &[weight],
            saved,
            &mut out,
        );
        out
    }

    /// Scaled dot-product attention through cuDNN (`q [b, H, s, d]`, `k`/`v [b, K, s_kv, d]`
    /// with `enable_gqa`): the output in q's layout; with autograd, the softmax statistics; the
    /// kernel's random-number state (two 8-byte tensors) and a 256-byte workspace.
    pub fn cudnn_attention(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Tensor {
        if self.autocast.is_some() {
            let kc = self.autocast_cast(k, false);
            let vc = self.autocast_cast(v, false);
            let qc = self.autocast_cast(q, false);
            let saved = self.autocast.take();
            let out = self.cudnn_attention(&qc, &kc, &vc, mask);
            self.autocast = saved;
            return out;
        }
        let grad = self.needs_grad(&[q, k, v]);
        // A boolean mask becomes an additive one in the queries' type:
        // `where(mask, 0, -65504)`, its two scalars freed once it is made.
        let bias = mask.map(|m| {
            let zero = self.empty(&[], q.elem);
            let low = self.empty(&[], q.elem);
            let bias = self.empty(&m.shape, q.elem);
            drop(low);
            drop(zero);
            bias
        });
        let seed = self.empty(&[1], Elem::I64);
        let offset = self.empty(&[1], Elem::I64);
        let mut out_shape = q.shape.clone();
        *out_shape.last_mut().expect("head dim") = *v.shape.last().expect("head dim");
        let mut out = self.empty_like(&Meta {
            shape: out_shape,
            strides: q.strides.clone(),
            elem: q.elem,
        });
        let (b, h, s) = (q.shape[0], q.shape[1], q.shape[2]);
        let stats = grad.then(|| self.empty(&[b, h, s, 1], Elem::F32));
        // cuDNN's plan workspace (a prefill or training: more than one query).
        if s > 1 {
            drop(
                self.tape
                    .with_role(Role::Workspaces, || self.empty(&[256], Elem::U8)),
            );
        }
        if let Some(stats) = stats {
            let mut saved = vec![k.clone(), q.clone(), v.clone()];
            saved.extend(bias.clone());
            saved.extend([stats, out.clone(), offset, seed]);
            self.autograd
                .record(Rule::CudnnAttention, &[q, k, v], saved, &mut [&mut out]);
            self.stop_if_recomputed();
        } else {
            drop(seed);
            drop(offset);
        }
        drop(bias);
        out
    }

    /// `log_softmax(x, -1)`.
    pub fn log_softmax(&mut self, x: &Tensor) -> Tensor {
        let mut out = self.empty(&x.shape, x.elem);
        if self.needs_grad(&[x]) {
            let result = out.clone();
            self.record(Rule::LogSoftmax, &[x], vec![result], &mut out);
        }
        out
    }

    /// `nll_loss(log_probs, targets, reduction="mean")`: the loss and its total weight.
    pub fn nll_loss(&mut self, log_probs: &Tensor, targets: &Tensor) -> Tensor {
        let mut loss = self.empty(&[], log_probs.elem);
        let total_weight = self.empty(&[], log_probs.elem);
        let saved = self.saved_if(&[log_probs], &[targets, &total_weight]);
        drop(total_weight);
        self.record(Rule::NllLoss, &[log_probs], saved, &mut loss);
        loss
    }

    /// `x.chunk(2, dim=-1)`: two views, one node.
    pub fn chunk2(&mut self, x: &Tensor) -> (Tensor, Tensor) {
        self.split2(x, x.size(-1) / 2)
    }

    /// `x.split([first, rest], dim=-1)`: two views, one node.
    pub fn split2(&mut self, x: &Tensor, first: u64) -> (Tensor, Tensor) {
        let d = x.size(-1);
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("a dimension") = first;
        let mut a = x.restrided(shape.clone(), x.strides.clone());
        *shape.last_mut().expect("a dimension") = d - first;
        let mut b = x.restrided(shape, x.strides.clone());
        self.autograd
            .record(Rule::Split, &[x], vec![], &mut [&mut a, &mut b]);
        (a, b)
    }

    /// `out = x.new_empty(...)` with `parts` copied into its slices along the last dimension.
    pub fn assemble(&mut self, parts: &[&Tensor], _dim: isize) -> Tensor {
        let mut shape = parts[0].shape.clone();
        let sizes: Vec<u64> = parts.iter().map(|t| t.size(-1)).collect();
        *shape.last_mut().expect("a dimension") = sizes.iter().sum();
        let mut out = self.empty(&shape, parts[0].elem);
        self.autograd
            .record(Rule::Assemble { sizes }, parts, vec![], &mut [&mut out]);
        out
    }

    /// `topk(x, k, dim=-1)`: values and indices.
    pub fn topk(&mut self, x: &Tensor, k: u64) -> (Tensor, Tensor) {
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("a dimension") = k;
        let mut values = self.empty(&shape, x.elem);
        let indices = self.empty(&shape, Elem::I64);
        let saved = self.saved_if(&[x], &[&indices]);
        self.record(Rule::Topk, &[x], saved, &mut values);
        (values, indices)
    }

    /// `x.sum(-1, keepdim=True)`.
    pub fn sum_last(&mut self, x: &Tensor) -> Tensor {
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("a dimension") = 1;
        let mut out = self.empty(&shape, x.elem);
        self.record(Rule::Expand, &[x], vec![], &mut out);
        out
    }

    /// `a /= b` (in place): the same storage; with autograd, a copy of `a` kept for `b`'s
    /// gradient.
    pub fn div_(&mut self, a: &Tensor, b: &Tensor) -> Tensor {
        let mut out = a.clone();
        if self.needs_grad(&[a, b]) {
            let original = self.empty(&a.shape, a.elem);
            self.record(
                Rule::DivInPlace,
                &[a, b],
                vec![original, b.clone()],
                &mut out,
            );
        }
        out
    }

    /// `x[index]` along the first dimension (`index` int64, saved for backward).
    pub fn index_rows(&mut self, x: &Tensor, index: &Tensor) -> Tensor {
        let mut shape = x.shape.clone();
        shape[0] = index.numel();
        let mut out = self.empty(&shape, x.elem);
        let saved = self.saved_if(&[x], &[index]);
        self.record(Rule::IndexRows, &[x], saved, &mut out);
        out
    }

    /// `grouped_mm(x [S, in], w.transpose(-2, -1))` with `w [E, out, in]`: the output, a
    /// kernel scratch of `S` bytes and a workspace.
    pub fn grouped_mm(&mut self, x: &Tensor, w: &Tensor) -> Tensor {
        // Each operand is saved for the other's gradient.
        let mut saved = Vec::new();
        if self.needs_grad(&[x, w]) {
            if w.grad_fn.is_some() {
                saved.push(x.clone());
            }
            if x.grad_fn.is_some() {
                saved.push(w.clone());
            }
        }
        let grad_fn = self.node_first(Rule::GroupedMm, &[x, w], saved);
        let mut out = self.empty(&[x.shape[0], w.shape[1]], x.elem.promote(w.elem));
        out.grad_fn = grad_fn;
        let scratch = self.empty(&[x.shape[0]], Elem::U8);
        drop(
            self.tape
                .with_role(Role::Workspaces, || self.empty(&[67_584], Elem::U8)),
        );
        drop(scratch);
        out
    }

    /// `x.masked_fill(mask, 0)` out of place.
    pub fn masked_fill(&mut self, x: &Tensor) -> Tensor {
        let mut out = self.elementwise(&x.shape, x.elem, &[x]);
        self.record(Rule::MaskedFill, &[x], vec![], &mut out);
        out
    }

    /// `x.sum(dim=1)` of `[n, k, h]`.
    pub fn sum_dim1(&mut self, x: &Tensor) -> Tensor {
        let mut out = self.empty(&[x.shape[0], x.shape[2]], x.elem);
        self.record(Rule::SumDim1, &[x], vec![], &mut out);
        out
    }

    /// A batched product's output (no gradient), then the thread's workspace if first.
    pub fn bmm_out(&mut self, shape: &[u64], elem: Elem) -> Tensor {
        self.product(shape, elem)
    }

    /// Runs backward from `loss` (a scalar): its gradient of ones, held until the end.
    pub fn backward(&mut self, loss: &Tensor) {
        let ones = self.empty(&[], loss.elem);
        self.backward_thread = true;
        autograd::backward(self, loss, ones.clone());
        self.backward_thread = false;
        drop(ones);
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
    pub fn reduction_staging(&mut self, reduction: super::reduce::Reduction, elem: Elem) {
        let grid = self.kernels.reduction_grid;
        let bytes = super::reduce::accumulator_bytes(elem);
        if let Some(s) = reduction.staging(bytes, grid) {
            self.tape.with_role(Role::Workspaces, || {
                let buffer = self.tape.empty(&[s.buffer], Elem::U8);
                let semaphores = self.tape.empty(&[s.semaphores], Elem::U8);
                drop(semaphores);
                drop(buffer);
            });
        }
    }

    /// The engine's reduction of a gradient to its input's shape (a broadcast input).
    fn sum_to(&mut self, grad: Tensor, meta: &Meta) -> Tensor {
        if grad.shape == meta.shape {
            return grad;
        }
        let out = self.empty(&meta.shape, grad.elem);
        let reduction = super::reduce::Reduction::sum_to(&grad.shape, &meta.shape);
        self.reduction_staging(reduction, grad.elem);
        drop(grad);
        out
    }

    fn grad_like(&mut self, meta: &Meta, elem: Elem) -> Tensor {
        self.empty_like(&Meta {
            elem,
            ..meta.clone()
        })
    }
}

/// Dense strides of `shape` with its dimensions in the order of `strides` (largest stride
/// outermost; ties keep the logical order), as PyTorch lays out `empty_like` and the output of
/// an elementwise operation.
fn ordered_strides(shape: &[u64], strides: &[u64]) -> Dims {
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

impl Backward for Process {
    fn run(&mut self, node: &Node, grads: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
        if matches!(node.rule, Rule::Split) {
            // The halves' gradients (zeros for a missing one) concatenated: one tensor.
            if grads.iter().all(Option::is_none) || node.next[0].is_none() {
                return vec![None];
            }
            let meta = &node.inputs[0];
            return vec![Some(self.empty(
                &meta.shape,
                grads.iter().flatten().next().expect("a gradient").elem,
            ))];
        }
        let Some(Some(grad)) = grads.first() else {
            return vec![None; node.inputs.len()];
        };
        let want = |i: usize| node.next[i].is_some();
        let is_leaf = |i: usize| matches!(node.next[i], Some(Grad::Leaf(_)));
        let inputs = &node.inputs;
        let mut out: Vec<Option<Tensor>> = vec![None; inputs.len()];
        match &node.rule {
            Rule::Mm | Rule::Addmm => {
                let (a_ix, b_ix) = if matches!(node.rule, Rule::Addmm) {
                    (1, 2)
                } else {
                    (0, 1)
                };
                // saved: [a if b needs grad][b if a needs grad]
                if want(b_ix) {
                    // The weight's gradient, in the weight's layout.
                    let meta = &inputs[b_ix];
                    let role = if is_leaf_through_view(node, b_ix) {
                        Role::Gradients
                    } else {
                        Role::Activations
                    };
                    let g = self.in_role(role, |p| p.grad_like(meta, grad.elem));
                    self.matmul_workspace(false);
                    out[b_ix] = Some(g);
                }
                if want(a_ix) {
                    let g = self.empty(&inputs[a_ix].shape, grad.elem);
                    self.matmul_workspace(false);
                    out[a_ix] = Some(g);
                }
                if matches!(node.rule, Rule::Addmm) && want(0) {
                    out[0] = Some(grad.clone());
                }
                let _ = is_leaf;
            }
            Rule::MatMul4bit {
                out_features,
                in_features,
                blocks,
                elem,
            } => {
                if want(0) {
                    // `dequantize_4bit`: the scales (freed as it returns), the weight; then
                    // `grad_output @ weight`.
                    let scales = self.empty(&[*blocks], Elem::F32);
                    let weight = self.empty(&[*out_features, *in_features], *elem);
                    drop(scales);
                    let g = self.empty(&inputs[0].shape, grad.elem);
                    self.matmul_workspace(false);
                    drop(weight);
                    out[0] = Some(g);
                }
            }
            Rule::View => {
                let meta = &inputs[0];
                out[0] = Some(
                    match view_strides(&grad.shape, &grad.strides, &meta.shape) {
                        Some(strides) => grad.restrided(meta.shape.clone(), strides),
                        None => self.empty(&meta.shape, grad.elem),
                    },
                );
            }
            Rule::Transpose { a, b } => {
                let mut shape = grad.shape.clone();
                let mut strides = grad.strides.clone();
                shape.swap(*a, *b);
                strides.swap(*a, *b);
                out[0] = Some(grad.restrided(shape, strides));
            }
            Rule::Slice => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Expand => {
                out[0] = Some(self.sum_to(grad.clone(), &inputs[0]));
            }
            Rule::Mul => {
                // The last input's gradient first: `grad * other`, of the broadcast shape.
                let shape = broadcast(&inputs[0].shape, &inputs[1].shape);
                for i in [1, 0] {
                    if want(i) {
                        let other = inputs[1 - i].elem;
                        out[i] = Some(self.empty(&shape, grad.elem.promote(other)));
                    }
                }
            }
            Rule::Scale | Rule::Neg => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Add => {
                for i in [0, 1] {
                    if want(i) {
                        out[i] = Some(grad.clone());
                    }
                }
            }
            Rule::AddScalar => out[0] = Some(grad.clone()),
            Rule::ToCopy { from } => {
                // `grad.to(self.options())`: the gradient's own layout kept (not the input's).
                out[0] = Some(if grad.elem == *from {
                    grad.clone()
                } else {
                    self.laid_out_like(&grad.shape, &grad.strides, *from)
                });
            }
            Rule::Pow => {
                // grad * (2 * self.pow(1))
                let a = self.empty(&inputs[0].shape, inputs[0].elem);
                let b = self.empty(&inputs[0].shape, inputs[0].elem);
                let c = self.empty(&inputs[0].shape, inputs[0].elem);
                drop(b);
                drop(a);
                out[0] = Some(c);
            }
            Rule::Mean => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Rsqrt => {
                // -0.5 * grad * result.pow(3)
                let a = self.empty(&grad.shape, grad.elem);
                let b = self.empty(&grad.shape, grad.elem);
                let c = self.empty(&grad.shape, grad.elem);
                drop(b);
                drop(a);
                out[0] = Some(c);
            }
            Rule::Tanh
            | Rule::Sigmoid
            | Rule::Silu
            | Rule::Gelu
            | Rule::Softmax
            | Rule::LogSoftmax => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Cat { dim, sizes } => {
                let mut start = 0;
                for (i, size) in sizes.iter().enumerate() {
                    let mut shape = grad.shape.clone();
                    shape[*dim] = *size;
                    if want(i) {
                        out[i] = Some(grad.restrided(shape, grad.strides.clone()));
                    }
                    start += size;
                }
                let _ = start;
            }
            Rule::Embedding { .. } => {
                out[0] = Some(self.tape.with_role(Role::Gradients, || {
                    self.empty(&inputs[0].shape, inputs[0].elem)
                }));
            }
            Rule::CudnnAttention => {
                let dq = self.grad_like(&inputs[0], grad.elem);
                let dk = self.grad_like(&inputs[1], grad.elem);
                let dv = self.grad_like(&inputs[2], grad.elem);
                let q = &inputs[0];
                let (b, h, s, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
                let ws = cudnn_backward_workspace(b, h, inputs[1].shape[1], s, d);
                drop(
                    self.tape
                        .with_role(Role::Workspaces, || self.empty(&[ws], Elem::U8)),
                );
                out = vec![Some(dq), Some(dk), Some(dv)];
            }
            Rule::NllLoss => {
                out[0] = Some(self.empty(&inputs[0].shape, inputs[0].elem));
            }
            Rule::Clone => out[0] = Some(grad.clone()),
            Rule::IndexRows => {
                // zeros, then `index_put_(..., accumulate=True)`: the indices linearised and
                // sorted with their positions (int64 temporaries of the index's length).
                let zeros = self.empty(&inputs[0].shape, grad.elem);
                let n = grad.shape[0];
                let linear = self.empty(&[n], Elem::I64);
                let scratch = self.empty(&[n], Elem::I64);
                drop(scratch);
                let sorted = self.empty(&[n], Elem::I64);
                let positions = self.empty(&[n], Elem::I64);
                let keys = self.empty(&[n], Elem::I64);
                drop(self.empty(&[1], Elem::U8));
                drop(keys);
                drop(positions);
                drop(sorted);
                drop(linear);
                out[0] = Some(zeros);
            }
            Rule::Topk => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Split => unreachable!("handled above"),
            Rule::Assemble { sizes } => {
                let copy = self.empty(&grad.shape, grad.elem);
                for (i, size) in sizes.iter().enumerate() {
                    if want(i) {
                        let mut shape = grad.shape.clone();
                        *shape.last_mut().expect("a dimension") = *size;
                        out[i] = Some(copy.restrided(shape, copy.strides.clone()));
                    }
                }
            }
            Rule::GroupedMm => {
                // The last input's gradient (the weight's) first.
                if want(1) {
                    let role = if is_leaf_through_view(node, 1) {
                        Role::Gradients
                    } else {
                        Role::Activations
                    };
                    let w = &inputs[1];
                    out[1] = Some(self.in_role(role, |p| p.empty(&w.shape, w.elem)));
                }
                if want(0) {
                    out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
                }
            }
            Rule::MaskedFill => out[0] = Some(self.empty(&grad.shape, grad.elem)),
            Rule::SumDim1 => {
                let meta = &inputs[0];
                out[0] = Some(grad.restrided(meta.shape.clone(), smallvec![meta.shape[2], 0, 1]));
            }
            Rule::DivInPlace => {
                for i in [1, 0] {
                    if want(i) {
                        out[i] = Some(self.empty(&inputs[0].shape, grad.elem));
                    }
                }
            }
        }
        out
    }

    fn add(&mut self, a: &Tensor, _b: &Tensor) -> Tensor {
        self.empty(&a.shape, a.elem)
    }

    fn validate(&mut self, node: &Node, outputs: Vec<Option<Tensor>>) -> Vec<Option<Tensor>> {
        outputs
            .into_iter()
            .zip(&node.inputs)
            .map(|(g, meta)| {
                let g = g?;
                let g = self.sum_to(g, meta);
                Some(if g.elem != meta.elem {
                    let cast = self.empty_like(&Meta {
                        elem: meta.elem,
                        ..Meta::of(&g)
                    });
                    drop(g);
                    cast
                } else {
                    g
                })
            })
            .collect()
    }

    fn recompute(&mut self, f: usize) {
        let (layer, inputs, needed) = {
            let frame = &self.autograd.frames[f];
            (frame.layer, frame.inputs.clone(), frame.needed)
        };
        let saving = std::mem::replace(
            &mut self.autograd.saving,
            autograd::Saving::Capture {
                needed,
                captured: Vec::new(),
            },
        );
        // Recomputation runs with grad mode on, on the backward thread.
        let enabled = std::mem::replace(&mut self.autograd.enabled, true);
        let mut hook = self
            .recompute_layer
            .take()
            .expect("a recomputation for checkpointed layers");
        hook(self, layer, &inputs);
        self.recompute_layer = Some(hook);
        drop(inputs);
        self.autograd.enabled = enabled;
        self.autograd.stop = false;
        self.tape.0.borrow_mut().stopped = false;
        let captured = match std::mem::replace(&mut self.autograd.saving, saving) {
            autograd::Saving::Capture { captured, .. } => captured,
            _ => unreachable!("set above"),
        };
        let frame = &mut self.autograd.frames[f];
        for (node, saved) in frame.nodes.iter().zip(captured) {
            node.borrow_mut().saved = saved;
        }
    }

    fn frame_node_done(&mut self, f: usize) {
        let frame = &mut self.autograd.frames[f];
        frame.remaining = frame.remaining.saturating_sub(1);
        if frame.remaining == 0 {
            frame.inputs.clear();
            frame.nodes.clear();
        }
    }

    fn clone_as(&mut self, grad: &Tensor, meta: &Meta) -> Tensor {
        let _ = grad;
        self.empty_like(meta)
    }
}

/// Whether input `i` of `node` reaches a parameter through views only (its gradient is the
/// parameter's).
fn is_leaf_through_view(node: &Node, i: usize) -> bool {
    let mut edge = node.next[i].clone();
    while let Some(e) = edge {
        match e {
            Grad::Leaf(_) => return true,
            Grad::Node(n, _) => {
                let n = n.borrow();
                if !matches!(n.rule, Rule::View | Rule::Transpose { .. }) {
                    return false;
                }
                edge = n.next[0].clone();
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    /// Every attention `scripts/gpu/kernel-allocations.py attention` ran on the H200 (head widths 64 to
    /// 256, grouped and whole keys and values, causal and masked): its backward's allocations are
    /// the three gradients, then the workspace.
    #[test]
    fn cudnn_backward_workspace_is_what_the_h200_allocated() {
        let text = include_str!("../../tests/fixtures/attention-workspace-h200.json");
        let measured: serde_json::Value = serde_json::from_str(text).unwrap();
        let rows = measured["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 28);
        for r in rows {
            let n = |k: &str| r[k].as_u64().unwrap();
            let (b, h, kv, s, d) = (
                n("batch"),
                n("heads"),
                n("kv_heads"),
                n("length"),
                n("head_dim"),
            );
            assert_eq!(r["grad_fn"], "ScaledDotProductCudnnAttentionBackward0");
            let allocated: Vec<u64> = r["backward"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e[0] == "alloc")
                .map(|e| e[1].as_u64().unwrap())
                .collect();
            assert_eq!(
                allocated[..4],
                [
                    2 * b * h * s * d,
                    2 * b * kv * s * d,
                    2 * b * kv * s * d,
                    super::cudnn_backward_workspace(b, h, kv, s, d)
                ],
                "{r}"
            );
        }
    }
}
