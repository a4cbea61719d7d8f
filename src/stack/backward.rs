//! The backward rules: what each recorded node makes in backward, in the order the generated
//! backward functions make them (the last input's gradient first, then the engine's reduction of
//! a broadcast gradient to its input's shape), and what the engine does around them (checks,
//! sums, recomputation of a checkpointed layer).

use super::autograd::{self, Backward};
use super::process::{broadcast, Process};
use super::tensor::{view_strides, Tensor};
use super::tensor::{Grad, Meta, Node, Rule};
use crate::dtype::Dtype;
use crate::replay::program::Role;
use smallvec::smallvec;

/// cuDNN's attention backward workspace for `b × h` heads (`kv` of keys and values) of `s`
/// queries of width `d`: a float32 accumulator of the queries' gradient, another as large when
/// the keys and values are grouped, the row sums of dO·O, and 256 bytes
/// (`scripts/gpu/kernel-allocations.py attention` on the H200: `tests/fixtures/attention-workspace-h200.json`).
pub fn cudnn_backward_workspace(b: u64, h: u64, kv: u64, s: u64, d: u64) -> u64 {
    let accumulators = 1 + u64::from(kv < h);
    4 * b * h * s * d * accumulators + 4 * b * h * s + 256
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
        if let Rule::Hook(hook) = node.rule {
            self.with_fsdp(|fsdp, p| fsdp.run_hook(p, hook));
            return vec![grads.first().cloned().flatten()];
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
                // saved: [a if b needs grad][b if a needs grad]. `MmBackward0` makes the
                // weight's gradient first, `AddmmBackward0` the input's (the order of their
                // formulas in PyTorch's derivatives.yaml).
                let input_first = matches!(node.rule, Rule::Addmm);
                for ix in if input_first {
                    [a_ix, b_ix]
                } else {
                    [b_ix, a_ix]
                } {
                    if !want(ix) {
                        continue;
                    }
                    let g = if ix == b_ix {
                        // The weight's gradient, in the weight's layout.
                        let role = if is_leaf_through_view(node, b_ix) {
                            Role::Gradients
                        } else {
                            Role::Activations
                        };
                        self.in_role(role, |p| p.grad_like(&inputs[b_ix], grad.elem))
                    } else {
                        self.empty(&inputs[a_ix].shape, grad.elem)
                    };
                    self.matmul_workspace(false);
                    out[ix] = Some(g);
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
                    let scales = self.empty(&[*blocks], Dtype::Float32);
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
            Rule::SumLast => {
                let mut strides = grad.strides.clone();
                *strides.last_mut().expect("a dimension") = 0;
                out[0] = Some(grad.restrided(inputs[0].shape.clone(), strides));
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
            Rule::Scale | Rule::Neg | Rule::Dropout => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Add => {
                for i in [0, 1] {
                    if want(i) {
                        out[i] = Some(grad.clone());
                    }
                }
            }
            Rule::LayerNorm { rows, n } => {
                // `layer_norm_backward_cuda`: the input's gradient, the weight's and the bias's
                // (as the input and parameters that need one).
                for i in 0..3 {
                    if want(i) {
                        out[i] = Some(self.empty(&inputs[i].shape, grad.elem));
                    }
                }
                // With many rows of few columns, the weight's and bias's gradients are summed
                // from per-block partial sums (`LaunchGammaBetaBackwardCUDAKernel`, read from
                // PyTorch's source; no recorded trace reaches it).
                let sm = self.kernels.reduction_grid.multiprocessors;
                if *rows > 64 * 1024 && n / 32 < sm / 2 && (want(1) || want(2)) {
                    let blocks_x = n.div_ceil(32);
                    let blocks_y = (32 * 1024 / blocks_x).min(rows.div_ceil(32));
                    let parts: Vec<Option<Tensor>> = [1, 2]
                        .map(|i| want(i).then(|| self.empty(&[blocks_y, *n], grad.elem)))
                        .into();
                    for (i, part) in [1, 2].into_iter().zip(&parts) {
                        if let Some(part) = part {
                            let sum = self.empty(&[*n], grad.elem);
                            self.reduction_staging(
                                super::reduce::Reduction::sum_to(&part.shape, &[*n]),
                                grad.elem,
                            );
                            out[i] = Some(sum);
                        }
                    }
                    // Declared gamma's first, so the beta's partial sums go first.
                    drop(parts.into_iter().rev().collect::<Vec<_>>());
                }
            }
            Rule::Sub => {
                if want(0) {
                    out[0] = Some(grad.clone());
                }
                if want(1) {
                    out[1] = Some(self.empty(&grad.shape, grad.elem));
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
            Rule::Square => {
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
                        .with_role(Role::Workspaces, || self.empty(&[ws], Dtype::Uint8)),
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
                let linear = self.empty(&[n], Dtype::Int64);
                let scratch = self.empty(&[n], Dtype::Int64);
                drop(scratch);
                let sorted = self.empty(&[n], Dtype::Int64);
                let positions = self.empty(&[n], Dtype::Int64);
                let keys = self.empty(&[n], Dtype::Int64);
                drop(self.empty(&[1], Dtype::Uint8));
                drop(keys);
                drop(positions);
                drop(sorted);
                drop(linear);
                out[0] = Some(zeros);
            }
            Rule::Topk => {
                out[0] = Some(self.empty(&inputs[0].shape, grad.elem));
            }
            Rule::Split | Rule::Hook(_) => unreachable!("handled above"),
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
            Rule::SumAll => {
                let meta = &inputs[0];
                let strides = meta.shape.iter().map(|_| 0).collect();
                out[0] = Some(grad.restrided(meta.shape.clone(), strides));
            }
            Rule::MaskedScatter => {
                // `grad.masked_select(mask)`: the mask's positions, the gradient's values there.
                let mask = &node.saved[0];
                let n = inputs[0].shape[0];
                let positions = self.nonzero(mask, n);
                out[0] = Some(self.empty(&[n], grad.elem));
                drop(positions);
            }
            Rule::IndexMask => {
                // zeros, then `index_put_(mask.nonzero() split by dimension, grad,
                // accumulate=True)`: each dimension's positions times its stride, summed into
                // one linear index (two int64 temporaries), two more checks of them, the positions
                // let go; then the linear index sorted with its order (three int64 temporaries
                // and a byte of cub's) before the rows are added.
                let mask = &node.saved[0];
                let n = grad.shape[0];
                let zeros = self.empty(&inputs[0].shape, grad.elem);
                let positions = self.nonzero(mask, n);
                let index = || self.empty(&[n], Dtype::Int64);
                let strided = index();
                let linear = index();
                drop(strided);
                let (low, high) = (index(), index());
                drop(low);
                drop(high);
                drop(positions);
                let (sorted, order, keys) = (index(), index(), index());
                drop(self.empty(&[1], Dtype::Uint8));
                drop(keys);
                drop(order);
                drop(sorted);
                drop(linear);
                out[0] = Some(zeros);
            }
            Rule::ChunkedLogProb { .. } => {
                out = super::sft::chunked_log_prob_backward(self, node, want(0), want(1));
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
        let (layer, inputs, needed, autocast) = {
            let frame = &self.autograd.frames[f];
            (
                frame.layer,
                frame.inputs.clone(),
                frame.needed,
                frame.autocast,
            )
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
        // Under the forward's autocast, whose cache goes as the outermost region ends.
        let outer = std::mem::replace(&mut self.autocast, autocast);
        hook(self, layer, &inputs);
        if outer.is_none() {
            self.end_autocast();
        }
        self.autocast = outer;
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

    fn gradient_ready(&mut self, leaf: &super::tensor::Leaf) {
        if let Some(reducer) = self.ddp.as_mut() {
            reducer.gradient_ready(leaf);
        }
    }

    fn clone_as(&mut self, grad: &Tensor, meta: &Meta) -> Tensor {
        let _ = grad;
        self.empty_like(meta)
    }
}

impl Process {
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
