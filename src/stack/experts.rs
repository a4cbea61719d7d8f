//! Mixtures of experts as transformers 5.17 runs them: the router (Mixtral's float32 softmax and
//! renormalised top-k, Qwen's softmax top-k cast back, DeepSeek's float32 routers), then the
//! fused 3-D experts through `grouped_mm` (tokens sorted by expert; the default, and the prefill
//! and training path) or `batched_mm` (each token's experts' weights gathered; `generate`'s decode
//! on a GPU), the weighted outputs summed per token; shared experts beside them.

use super::decoder::{joined, Decoder, ExpertsPath};
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::model::{Moe, Router};

impl Decoder<'_> {
    /// The MoE block of layer `prefix` on `x [b, t, h]`.
    pub(super) fn moe_block(&mut self, prefix: &str, x: &Tensor) -> Tensor {
        let moe = self.model.moe.expect("an MoE layer");
        let (b, t, h) = (x.shape[0], x.shape[1], x.shape[2]);
        let flat = self.process.reshape(x, &[b * t, h]);
        let (logits, weights, index) = self.router(prefix, &flat, &moe);
        let routed = self.experts(prefix, &flat, &weights, &moe);
        let out = match moe.shared {
            Some(shared) if shared.intermediate > 0 => {
                let shared_out = self.shared_experts(prefix, &flat, shared.gated);
                let sum = self.process.add(&routed, &shared_out);
                drop(shared_out);
                drop(routed);
                sum
            }
            _ => routed,
        };
        drop(logits);
        drop(weights);
        drop(index);
        drop(flat);
        self.process.reshape(&out, &[b, t, h])
    }

    /// The router: its logits, the top-k weights and the experts' indices.
    fn router(&mut self, prefix: &str, x: &Tensor, moe: &Moe) -> (Tensor, Tensor, Tensor) {
        let tokens = x.shape[0];
        let (e, k) = (moe.experts, moe.top_k);
        let w = self.weights_tensor(&joined(&[prefix, ".gate.weight"]));
        let p = &mut *self.process;
        match moe.router {
            Router::SoftmaxRenormalised => {
                let logits = p.linear(x, &w, None);
                let upcast = p.to(&logits, Dtype::Float32);
                let probs = p.softmax(&upcast, Dtype::Float32);
                drop(upcast);
                let (values, index) = p.topk(&probs, k);
                // values /= values.sum(-1, keepdim=True)
                let sum = p.sum_last(&values);
                let divided = p.div_(&values, &sum);
                drop(sum);
                drop(probs);
                (logits, divided, index)
            }
            Router::SoftmaxTopK { renormalise } => {
                let logits = p.linear(x, &w, None);
                let probs = p.softmax(&logits, Dtype::Float32);
                let (values, index) = p.topk(&probs, k);
                let values = if renormalise {
                    let sum = p.sum_last(&values);
                    let divided = p.div_(&values, &sum);
                    drop(sum);
                    divided
                } else {
                    values
                };
                let cast = p.to(&values, logits.elem);
                drop(values);
                drop(probs);
                (logits, cast, index)
            }
            Router::DeepseekV2 | Router::DeepseekV3 { .. } => {
                // F.linear(x.float(), weight.float())
                let xf = p.to(x, Dtype::Float32);
                let wf = p.to(&w, Dtype::Float32);
                let logits = p.linear(&xf, &wf, None);
                drop(wf);
                drop(xf);
                let scores = match moe.router {
                    Router::DeepseekV2 => p.softmax(&logits, Dtype::Float32),
                    _ => p.sigmoid(&logits),
                };
                let (values, index) = match moe.router {
                    Router::DeepseekV3 { groups, top_groups } => {
                        // scores + correction, grouped top-2 sums, the top groups' mask.
                        let corrected = p.empty(&[tokens, e], Dtype::Float32);
                        let group_scores = p.empty(&[tokens, groups], Dtype::Float32);
                        let (gv, gi) = (
                            p.empty(&[tokens, groups, 2], Dtype::Float32),
                            p.empty(&[tokens, groups, 2], Dtype::Int64),
                        );
                        drop(gv);
                        drop(gi);
                        let (tv, ti) = (
                            p.empty(&[tokens, top_groups], Dtype::Float32),
                            p.empty(&[tokens, top_groups], Dtype::Int64),
                        );
                        drop(tv);
                        let mask = p.empty(&[tokens, groups], Dtype::Float32);
                        drop(ti);
                        drop(group_scores);
                        let score_mask = p.empty(&[tokens, e], Dtype::Bool);
                        drop(mask);
                        let masked = p.empty(&[tokens, e], Dtype::Float32);
                        drop(score_mask);
                        let (_, index) = p.topk(&masked, k);
                        drop(masked);
                        drop(corrected);
                        let gathered = p.empty(&[tokens, k], Dtype::Float32);
                        let sum = p.empty(&[tokens, 1], Dtype::Float32);
                        let normed = p.empty(&[tokens, k], Dtype::Float32);
                        drop(sum);
                        drop(gathered);
                        let scaled = p.empty(&[tokens, k], Dtype::Float32);
                        drop(normed);
                        (scaled, index)
                    }
                    _ => {
                        let (values, index) = p.topk(&scores, k);
                        let scaled = p.scale(&values);
                        drop(values);
                        (scaled, index)
                    }
                };
                drop(scores);
                (logits, values, index)
            }
        }
    }

    /// The routed experts (`gate_up_proj [E, 2I, h]`, `down_proj [E, h, I]`).
    /// (The routing's expert ids set no size: only their count, `weights`' shape, matters.)
    fn experts(&mut self, prefix: &str, x: &Tensor, weights: &Tensor, moe: &Moe) -> Tensor {
        let gate_up = self.weights_tensor(&joined(&[prefix, ".experts.gate_up_proj"]));
        let down = self.weights_tensor(&joined(&[prefix, ".experts.down_proj"]));
        match self.experts_path {
            ExpertsPath::Grouped => self.grouped_experts(x, weights, &gate_up, &down, moe),
            ExpertsPath::Batched => self.batched_experts(x, weights, &gate_up, &down, moe),
        }
    }

    /// `grouped_mm_experts_forward`.
    fn grouped_experts(
        &mut self,
        x: &Tensor,
        weights: &Tensor,
        gate_up: &Tensor,
        down: &Tensor,
        moe: &Moe,
    ) -> Tensor {
        let (tokens, h) = (x.shape[0], x.shape[1]);
        let (e, k) = (moe.experts, moe.top_k);
        let s = tokens * k;
        let p = &mut *self.process;
        // expert_ids_g, perm = sort(expert_ids)
        let ids_g = p.empty(&[s], Dtype::Int64);
        let perm = p.empty(&[s], Dtype::Int64);
        let scratch = p.empty(&[s], Dtype::Int64);
        drop(scratch);
        // hidden_states[perm // k]
        let rows = p.empty(&[s], Dtype::Int64);
        let selected = p.index_rows(x, &rows);
        drop(rows);
        let flat_weights = p.reshape(weights, &[s]);
        let sample = p.index_rows(&flat_weights, &perm);
        drop(flat_weights);
        let histc_input = p.empty(&[s], Dtype::Int32);
        let per_expert = p.empty(&[e], Dtype::Int32);
        let offsets = p.empty(&[e], Dtype::Int32);
        let scan = p.empty(&[1023], Dtype::Uint8);
        drop(scan);
        let sentinel = p.empty(&[s], Dtype::Bool);
        let up_out = p.grouped_mm(&selected, gate_up);
        let filled = p.masked_fill(&up_out);
        drop(up_out);
        let (gate, up) = p.chunk2(&filled);
        let act = p.silu(&gate);
        let prod = p.mul(&act, &up);
        drop(act);
        drop(gate);
        drop(up);
        drop(filled);
        let down_out = p.grouped_mm(&prod, down);
        drop(prod);
        let proj = p.masked_fill(&down_out);
        drop(down_out);
        let sample2 = p.unsqueeze(&sample, 1);
        let weighted = p.mul(&proj, &sample2);
        drop(sample2);
        let inv = p.empty(&[s], Dtype::Int64);
        let range = p.empty(&[s], Dtype::Int64);
        drop(range);
        let restored = p.index_rows(&weighted, &inv);
        drop(weighted);
        let viewed = p.reshape(&restored, &[tokens, k, h]);
        let summed = p.sum_dim1(&viewed);
        drop(viewed);
        let out = p.to(&summed, x.elem);
        // The function's locals at its return.
        for t in [
            ids_g,
            perm,
            selected,
            sample,
            histc_input,
            per_expert,
            offsets,
            sentinel,
            proj,
            restored,
            inv,
            summed,
        ] {
            drop(t);
        }
        out
    }

    /// `batched_mm_experts_forward`: each pair's experts' weights gathered (`[S, 2I, h]` and
    /// `[S, h, I]`), multiplied by `bmm`.
    fn batched_experts(
        &mut self,
        x: &Tensor,
        weights: &Tensor,
        gate_up: &Tensor,
        down: &Tensor,
        moe: &Moe,
    ) -> Tensor {
        let (tokens, h) = (x.shape[0], x.shape[1]);
        let k = moe.top_k;
        let s = tokens * k;
        let p = &mut *self.process;
        let repeat = p.empty(&[s], Dtype::Int64);
        let selected = p.index_rows(x, &repeat);
        drop(repeat);
        let ids = p.empty(&[s], Dtype::Int64);
        let w_up = p.index_rows(gate_up, &ids);
        let up_out = p.bmm_out(&[s, gate_up.shape[1]], x.elem);
        let (gate, up) = p.chunk2(&up_out);
        let act = p.silu(&gate);
        let prod = p.mul(&act, &up);
        drop(act);
        drop(gate);
        drop(up);
        drop(up_out);
        let w_down = p.index_rows(down, &ids);
        drop(w_up);
        let down_out = p.bmm_out(&[s, h], x.elem);
        drop(prod);
        let sample = p.reshape(weights, &[s, 1]);
        let weighted = p.mul(&down_out, &sample);
        drop(sample);
        drop(down_out);
        let viewed = p.reshape(&weighted, &[tokens, k, h]);
        let summed = p.sum_dim1(&viewed);
        drop(viewed);
        let out = p.to(&summed, x.elem);
        for t in [selected, ids, w_down, weighted, summed] {
            drop(t);
        }
        out
    }

    /// Shared experts: an MLP of their width (Qwen2-MoE's gated by `sigmoid(gate(x))`).
    fn shared_experts(&mut self, prefix: &str, x: &Tensor, gated: bool) -> Tensor {
        let name = if gated {
            "shared_expert"
        } else {
            "shared_experts"
        };
        let out = self.mlp(&joined(&[prefix, ".", name]), x);
        if !gated {
            return out;
        }
        let w = self.weights_tensor(&joined(&[prefix, ".shared_expert_gate.weight"]));
        let p = &mut *self.process;
        let g = p.linear(x, &w, None);
        let s = p.sigmoid(&g);
        drop(g);
        let gated_out = p.mul(&s, &out);
        drop(s);
        drop(out);
        gated_out
    }
}
