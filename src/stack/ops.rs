//! The instruction set: the operations the emulated models run, each with the allocations PyTorch
//! 2.11's CUDA kernels make (outputs, and the workspaces and temporaries of those that have them)
//! and, under autograd, the node it records and what that node saves ([`super::backward`] gives
//! the gradients each node makes).

use super::process::{broadcast, Process};
use super::tensor::{view_strides, Dims, Tensor};
use super::tensor::{Meta, Rule};
use crate::dtype::Dtype;
use crate::replay::program::Role;

/// The temporary storage cub's device-wide reduction asks for when `nonzero` counts a mask.
const CUB_REDUCE_TEMPORARY: u64 = 1;
/// The temporary storage of cub's selection in `nonzero`, and of its scan in `masked_scatter`,
/// as the H200 allocated them for masks of 117 to 2 046 elements (one tile state each, aligned;
/// `docs/gpu-runs/2026-12-04-h200-records/sft-*`). A mask of many more elements takes a few bytes
/// more per tile of cub's (in the small pool).
const CUB_SELECT_TEMPORARY: u64 = 1023;
const CUB_SCAN_TEMPORARY: u64 = 1279;

impl Process {
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

    /// `x[..., start::step]` along `dim` (a strided view).
    pub fn slice_step(&mut self, x: &Tensor, dim: isize, start: u64, step: u64) -> Tensor {
        let d = x.axis(dim);
        let mut shape = x.shape.clone();
        let mut strides = x.strides.clone();
        shape[d] = (x.shape[d] - start).div_ceil(step);
        strides[d] *= step;
        let mut v = x.restrided(shape, strides);
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
    pub fn to(&mut self, x: &Tensor, elem: Dtype) -> Tensor {
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
    pub fn to_copy(&mut self, x: &Tensor, elem: Dtype) -> Tensor {
        let mut out = self.empty(&x.shape, elem);
        self.record(Rule::ToCopy { from: x.elem }, &[x], vec![], &mut out);
        out
    }

    // --- Elementwise ---------------------------------------------------------------------------

    pub(super) fn binary_out(&self, a: &Tensor, b: &Tensor) -> Tensor {
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

    /// `F.layer_norm(x, [n], weight, bias)` (`native_layer_norm`): the output, then the rows'
    /// float32 mean and reciprocal standard deviation, which the node keeps for the backward
    /// (else they go as the call returns, the mean first).
    pub fn layer_norm(&mut self, x: &Tensor, weight: &Tensor, bias: &Tensor) -> Tensor {
        let n = x.size(-1);
        let rows = x.numel() / n.max(1);
        let mut out = self.empty(&x.shape, x.elem);
        let mean = self.empty(&[rows], Dtype::Float32);
        let rstd = self.empty(&[rows], Dtype::Float32);
        let saved = self.saved_if(&[x, weight, bias], &[x, weight, bias, &mean, &rstd]);
        self.record(
            Rule::LayerNorm { rows, n },
            &[x, weight, bias],
            saved,
            &mut out,
        );
        drop(mean);
        drop(rstd);
        out
    }

    /// `a - b`.
    pub fn sub(&mut self, a: &Tensor, b: &Tensor) -> Tensor {
        let mut out = self.binary_out(a, b);
        self.record(Rule::Sub, &[a, b], vec![], &mut out);
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

    /// `a * scalar` whose node holds `a` until the backward reaches it: what autograd's
    /// accumulation node does for a leaf `a` that requires grad.
    pub fn scale_holding(&mut self, a: &Tensor) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        let held = self.saved_if(&[a], &[a]);
        self.record(Rule::Scale, &[a], held, &mut out);
        out
    }

    /// `nn.Dropout` in training (`native_dropout`): its boolean mask, then the output; the node
    /// keeps the mask for the backward, which an input needing no gradient lets go at once.
    pub fn dropout(&mut self, a: &Tensor) -> Tensor {
        let mask = self.empty(&a.shape, Dtype::Bool);
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        let saved = self.saved_if(&[a], &[&mask]);
        drop(mask);
        self.record(Rule::Dropout, &[a], saved, &mut out);
        out
    }

    /// `a *= scalar` (in place): the same storage, a node whose backward scales the gradient.
    pub fn scale_(&mut self, a: &Tensor) -> Tensor {
        let mut out = a.clone();
        self.record(Rule::Scale, &[a], vec![], &mut out);
        out
    }

    pub fn neg(&mut self, a: &Tensor) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        self.record(Rule::Neg, &[a], vec![], &mut out);
        out
    }

    /// `a.pow(2)`: the square.
    pub fn square(&mut self, a: &Tensor) -> Tensor {
        let a = self.autocast_f32(a);
        self.unary_saving_input(&a, Rule::Square)
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

    pub(super) fn unary_saving_result(&mut self, a: &Tensor, rule: Rule) -> Tensor {
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
    pub(super) fn unary_saving_input(&mut self, a: &Tensor, rule: Rule) -> Tensor {
        let saved = self.saved_if(&[a], &[a]);
        let grad_fn = self.node_first(rule, &[a], saved);
        let mut out = self.elementwise(&a.shape, a.elem, &[a]);
        out.grad_fn = grad_fn;
        out
    }

    /// `softmax(a, dim=-1, dtype=elem)`.
    pub fn softmax(&mut self, a: &Tensor, elem: Dtype) -> Tensor {
        let mut out = self.empty(&a.shape, elem);
        if self.needs_grad(&[a]) {
            let result = out.clone();
            self.record(Rule::Softmax, &[a], vec![result], &mut out);
        }
        out
    }

    /// Clones of `ts` to save when any of `inputs` needs a gradient.
    pub(super) fn saved_if(&self, inputs: &[&Tensor], ts: &[&Tensor]) -> Vec<Tensor> {
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

    /// `stack(parts, dim=-1)`: the parts unsqueezed (views) and concatenated.
    pub fn stack_last(&mut self, parts: &[&Tensor]) -> Tensor {
        let d = parts[0].dim();
        let unsqueezed: Vec<Tensor> = parts.iter().map(|p| self.unsqueeze(p, d)).collect();
        let refs: Vec<&Tensor> = unsqueezed.iter().collect();
        self.cat(&refs, -1)
    }

    /// `x.repeat_interleave(n, dim=-1)`: unsqueezed, expanded, cloned contiguous, flattened.
    pub fn repeat_interleave_last(&mut self, x: &Tensor, n: u64) -> Tensor {
        let d = x.dim();
        let unsqueezed = self.unsqueeze(x, d);
        let mut shape = unsqueezed.shape.to_vec();
        shape[d] = n;
        let expanded = self.expand(&unsqueezed, &shape);
        let copy = self.clone_contiguous(&expanded);
        let mut flat = x.shape.to_vec();
        flat[d - 1] *= n;
        self.reshape(&copy, &flat)
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
    pub fn product(&mut self, shape: &[u64], elem: Dtype) -> Tensor {
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
        let seed = self.empty(&[1], Dtype::Int64);
        let offset = self.empty(&[1], Dtype::Int64);
        let mut out_shape = q.shape.clone();
        *out_shape.last_mut().expect("head dim") = *v.shape.last().expect("head dim");
        let mut out = self.empty_like(&Meta {
            shape: out_shape,
            strides: q.strides.clone(),
            elem: q.elem,
        });
        let (b, h, s) = (q.shape[0], q.shape[1], q.shape[2]);
        let stats = grad.then(|| self.empty(&[b, h, s, 1], Dtype::Float32));
        // cuDNN's plan workspace (a prefill or training: more than one query).
        if s > 1 {
            drop(
                self.tape
                    .with_role(Role::Workspaces, || self.empty(&[256], Dtype::Uint8)),
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
        let indices = self.empty(&shape, Dtype::Int64);
        let saved = self.saved_if(&[x], &[&indices]);
        self.record(Rule::Topk, &[x], saved, &mut values);
        (values, indices)
    }

    /// `x.sum(-1, keepdim=True)`.
    pub fn sum_last(&mut self, x: &Tensor) -> Tensor {
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("a dimension") = 1;
        let mut out = self.empty(&shape, x.elem);
        self.record(Rule::SumLast, &[x], vec![], &mut out);
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

    /// `x.sum()` of every element.
    pub fn sum_all(&mut self, x: &Tensor) -> Tensor {
        let mut out = self.empty(&[], x.elem);
        self.record(Rule::SumAll, &[x], vec![], &mut out);
        out
    }

    /// The sum of every element of a boolean or integer `x`: its int64 result, then `x` cast to
    /// int64 for the reduction (let go as it returns).
    pub fn count(&mut self, x: &Tensor) -> Tensor {
        let out = self.empty(&[], Dtype::Int64);
        if x.elem != Dtype::Int64 {
            drop(self.empty(&x.shape, Dtype::Int64));
        }
        out
    }

    /// `a / b` for a `b` that needs no gradient (a count): the node keeps `b` and divides the
    /// gradient by it.
    pub fn div(&mut self, a: &Tensor, b: &Tensor) -> Tensor {
        let mut out = self.elementwise(&a.shape, a.elem.promote(b.elem), &[a]);
        let saved = self.saved_if(&[a], &[b]);
        self.record(Rule::Scale, &[a], saved, &mut out);
        out
    }

    /// `mask.nonzero()` of a boolean `mask` holding `count` true elements, as PyTorch 2.11's
    /// CUDA kernel makes it: the count on the device (cub's reduction: a one-byte temporary),
    /// the `[count, dims]` int64 output, then cub's selection with its temporary storage.
    pub fn nonzero(&mut self, mask: &Tensor, count: u64) -> Tensor {
        let counted = self.empty(&[], Dtype::Int32);
        drop(self.empty(&[CUB_REDUCE_TEMPORARY], Dtype::Uint8));
        let out = self.empty(&[count, mask.shape.len() as u64], Dtype::Int64);
        drop(self.empty(&[CUB_SELECT_TEMPORARY], Dtype::Uint8));
        drop(counted);
        out
    }

    /// `x[mask]` with a boolean `mask` of `x`'s leading dimensions holding `count` true
    /// elements: the mask's nonzero positions, the selected rows, the positions let go.
    pub fn index_mask(&mut self, x: &Tensor, mask: &Tensor, count: u64) -> Tensor {
        let positions = self.nonzero(mask, count);
        let mut shape: Dims = smallvec::smallvec![count];
        shape.extend_from_slice(&x.shape[mask.shape.len()..]);
        let mut out = self.empty(&shape, x.elem);
        drop(positions);
        let saved = self.saved_if(&[x], &[mask]);
        self.record(Rule::IndexMask, &[x], saved, &mut out);
        out
    }

    /// `x.new_zeros(mask.shape).masked_scatter(mask, x)` out of place: the zeros, the result,
    /// the mask's int64 prefix sum with cub's scan temporary, then the zeros let go.
    pub fn masked_scatter(&mut self, mask: &Tensor, x: &Tensor) -> Tensor {
        let zeros = self.empty(&mask.shape, x.elem);
        let mut out = self.empty(&mask.shape, x.elem);
        let prefix = self.empty(&[mask.numel()], Dtype::Int64);
        drop(self.empty(&[CUB_SCAN_TEMPORARY], Dtype::Uint8));
        drop(prefix);
        drop(zeros);
        let saved = self.saved_if(&[x], &[mask]);
        self.record(Rule::MaskedScatter, &[x], saved, &mut out);
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
        let scratch = self.empty(&[x.shape[0]], Dtype::Uint8);
        drop(
            self.tape
                .with_role(Role::Workspaces, || self.empty(&[67_584], Dtype::Uint8)),
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
    pub fn bmm_out(&mut self, shape: &[u64], elem: Dtype) -> Tensor {
        self.product(shape, elem)
    }
}
