//! transformers 5.17's decoder-only models as allocations: the embedding, the rotary
//! embedding computed once per forward, each layer's norms, attention (through the KV cache and
//! SDPA) and MLP, the final norm, the LM head and the loss, written in the order of the models'
//! Python code so that every temporary is freed when Python frees it.

use super::cache::Cache;
use super::process::Process;
use super::repeat::{Capture, ForwardRecords, LayerKinds};
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::model::{Attention, Mlp, Model, QkNorm};
use rustc_hash::FxHashMap;
use smallvec::smallvec;

/// Which implementation runs the experts (transformers' `grouped_mm` for prefill and
/// training, `batched_mm` for decode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertsPath {
    Grouped,
    Batched,
}

/// A LoRA adapter on one linear layer (PEFT: float32 `A [r, in]` and `B [out, r]`).
pub struct Adapter {
    pub a: Tensor,
    pub b: Tensor,
    /// PEFT's `lora_dropout` is above 0: its `nn.Dropout` runs on the adapter's input.
    pub dropout: bool,
}

/// `parts` joined into one name (a tensor's or a module's), without the cost of `format!`.
pub(super) fn joined(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        out.push_str(p);
    }
    out
}

/// `x[..., :rd]` and `x[..., rd:]`: the part of each head the rotary embedding turns, and the
/// rest (views).
fn rotated_and_rest(p: &mut Process, x: &Tensor, rd: u64) -> (Tensor, Tensor) {
    (p.slice(x, -1, 0, rd), p.slice(x, -1, rd, x.size(-1)))
}

/// The prefix of layer `layer`'s modules: `model.layers.{layer}` (in a model with a vision
/// tower, `model.language_model.layers.{layer}`).
pub(super) fn layer_prefix(model: &Model, layer: usize) -> String {
    joined(&[model.text_prefix(), "layers.", &layer.to_string()])
}

/// The model's tensors on the device.
pub struct Weights {
    pub by_name: FxHashMap<String, Tensor>,
    /// Adapters by the linear layer's prefix (`model.layers.0.self_attn.q_proj`).
    pub adapters: FxHashMap<String, Adapter>,
    /// bitsandbytes' 4-bit weights by the linear layer's prefix (QLoRA), and the dynamic map
    /// their quantization made.
    pub quantized: FxHashMap<String, super::bitsandbytes::Quantized4bit>,
    pub quantization_map: Option<Tensor>,
    /// The tensors of the layers a checkpoint stores quantized (GPTQ, AWQ, 8-bit, FP8), held
    /// with the model (their weights in `by_name` are views of them).
    pub stored: Vec<Tensor>,
}

impl Weights {
    fn get(&self, name: &str) -> &Tensor {
        self.by_name
            .get(name)
            .unwrap_or_else(|| panic!("the model has no tensor {name}"))
    }
    fn opt(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name)
    }
}

/// How the forward runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// `generate`'s prefill or one decode step (no autograd).
    Generate,
    /// Training: autograd records, the cache is built unless recomputation is on.
    Train,
}

/// The emulated model: its description, its tensors on the device and the process.
pub struct Decoder<'a> {
    pub model: &'a Model,
    pub weights: &'a Weights,
    pub process: &'a mut Process,
    /// Gradient checkpointing: each layer recomputed in backward.
    pub checkpointing: bool,
    /// How mixtures of experts run (`generate` switches to batched products for its decode).
    pub experts_path: ExpertsPath,
    /// Which layers are alike, for a forward that fills a cache to write them again rather
    /// than run them (`None`: every layer runs).
    pub layer_kinds: Option<LayerKinds>,
}

/// The rotary embedding of one forward: `cos` and `sin`, or DeepSeek-V2's complex frequencies.
pub enum Rope {
    Real(Tensor, Tensor),
    Complex(Tensor),
}

impl Rope {
    /// `cos` and `sin` (a model of real rotary embeddings).
    fn real(&self) -> (&Tensor, &Tensor) {
        match self {
            Rope::Real(cos, sin) => (cos, sin),
            Rope::Complex(_) => unreachable!("complex frequencies are DeepSeek-V2's"),
        }
    }

    /// Its tensors (held by a checkpoint).
    pub fn tensors(&self) -> Vec<Tensor> {
        match self {
            Rope::Real(c, s) => vec![c.clone(), s.clone()],
            Rope::Complex(f) => vec![f.clone()],
        }
    }
}

/// The arguments of a forward pass, as the caller gives them to `XForCausalLM.forward`.
pub struct Inputs<'a> {
    /// `input_ids [b, t]`.
    pub ids: &'a Tensor,
    /// The 2-D attention mask `generate` keeps (`None`: none given).
    pub mask: Option<&'a Tensor>,
    /// `position_ids [b, t]` (`None`: `arange(t)` made in the model).
    pub positions: Option<&'a Tensor>,
    pub cache: Option<&'a mut Cache>,
    /// Only the last position's logits kept (`logits_to_keep=1`), else all.
    pub keep_last: bool,
    /// With labels, the loss.
    pub labels: Option<&'a Tensor>,
    /// `num_items_in_batch` (the Trainer's): the loss summed, then divided by it; else averaged.
    pub items: Option<&'a Tensor>,
}

/// What a forward returns.
pub struct Output {
    pub logits: Tensor,
    pub loss: Option<Tensor>,
}

impl Decoder<'_> {
    fn p(&mut self) -> &mut Process {
        self.process
    }

    /// A tensor of the model, by name.
    pub(super) fn weights_tensor(&self, name: &str) -> Tensor {
        self.weights.get(name).clone()
    }

    /// The model's RMSNorm.
    pub(super) fn norm(&mut self, x: &Tensor, weight: &Tensor) -> Tensor {
        if self.model.model_type.is_cohere() {
            self.cohere_norm(x, weight)
        } else if self.model.model_type.is_gemma() {
            self.gemma_norm(x, weight)
        } else if self.model.model_type.norms_after_blocks() {
            self.olmo2_norm(x, weight)
        } else {
            self.rms_norm(x, weight)
        }
    }

    /// `Olmo2RMSNorm.forward`: `(weight * normalized).to(input_dtype)`, the weight's product
    /// in float32.
    fn olmo2_norm(&mut self, x: &Tensor, weight: &Tensor) -> Tensor {
        let (normed, variance) = self.normalized(x);
        let p = &mut *self.process;
        let product = p.mul(weight, &normed);
        let out = p.to(&product, x.elem);
        drop(product);
        drop(normed);
        drop(variance);
        out
    }

    /// The float32 `x * rsqrt(variance + eps)` of the RMS norms that keep `variance` in a local
    /// (Llama's, OLMo 2's), and that variance: each is freed as the norm returns.
    fn normalized(&mut self, x: &Tensor) -> (Tensor, Tensor) {
        let p = &mut *self.process;
        let xf = p.to(x, Dtype::Float32);
        let sq = p.square(&xf);
        let variance = p.mean_last(&sq);
        drop(sq);
        let shifted = p.add_scalar(&variance);
        let r = p.rsqrt(&shifted);
        drop(shifted);
        let normed = p.mul(&xf, &r);
        drop(r);
        drop(xf);
        (normed, variance)
    }

    /// `CohereLayerNorm.forward` (no bias): in float32, `x - mean` taken twice (for the variance,
    /// then for the normalized values), times `weight` cast to float32, cast back; `mean` and
    /// `variance` go at the return.
    fn cohere_norm(&mut self, x: &Tensor, weight: &Tensor) -> Tensor {
        let p = &mut *self.process;
        let xf = p.to(x, Dtype::Float32);
        let mean = p.mean_last(&xf);
        let centered = p.sub(&xf, &mean);
        let sq = p.square(&centered);
        drop(centered);
        let variance = p.mean_last(&sq);
        drop(sq);
        let centered = p.sub(&xf, &mean);
        let shifted = p.add_scalar(&variance);
        let r = p.rsqrt(&shifted);
        drop(shifted);
        let normed = p.mul(&centered, &r);
        drop(centered);
        drop(r);
        drop(xf);
        let wf = p.to(weight, Dtype::Float32);
        let scaled = p.mul(&wf, &normed);
        drop(wf);
        drop(normed);
        let out = p.to(&scaled, x.elem);
        drop(scaled);
        drop(mean);
        drop(variance);
        out
    }

    /// `Gemma2RMSNorm.forward`: in float32, `x * rsqrt(mean(x²) + eps) * (1 + weight)`, cast
    /// back.
    fn gemma_norm(&mut self, x: &Tensor, weight: &Tensor) -> Tensor {
        let p = &mut *self.process;
        let xf = p.to(x, Dtype::Float32);
        let sq = p.square(&xf);
        let variance = p.mean_last(&sq);
        drop(sq);
        let shifted = p.add_scalar(&variance);
        drop(variance);
        let r = p.rsqrt(&shifted);
        drop(shifted);
        let normed = p.mul(&xf, &r);
        drop(r);
        drop(xf);
        let wf = p.to(weight, Dtype::Float32);
        let one_plus = p.add_scalar(&wf);
        drop(wf);
        let scaled = p.mul(&normed, &one_plus);
        drop(one_plus);
        drop(normed);
        let out = p.to(&scaled, x.elem);
        drop(scaled);
        out
    }

    /// `LlamaRMSNorm.forward` (and its copies in the other models): `weight * normalized` cast
    /// back first.
    fn rms_norm(&mut self, x: &Tensor, weight: &Tensor) -> Tensor {
        let (normed, variance) = self.normalized(x);
        let p = &mut *self.process;
        let back = p.to(&normed, x.elem);
        let out = p.mul(weight, &back);
        drop(back);
        drop(normed);
        drop(variance);
        out
    }

    /// `nn.Linear` (with its LoRA adapter if it has one), or bitsandbytes' `Linear4bit` where the
    /// weight is quantized.
    pub(super) fn linear(&mut self, prefix: &str, x: &Tensor) -> Tensor {
        let b = self.weights.opt(&joined(&[prefix, ".bias"])).cloned();
        let weights = self.weights;
        if let Some(q) = weights.quantized.get(prefix) {
            let out = self.process.linear_4bit(x, q, b.as_ref());
            return match weights.adapters.get(prefix) {
                None => out,
                Some(adapter) => self.lora_4bit(out, x, adapter),
            };
        }
        let w = self.weights.get(&joined(&[prefix, ".weight"])).clone();
        let out = self.p().linear(x, &w, b.as_ref());
        match weights.adapters.get(prefix) {
            None => out,
            Some(adapter) => self.lora(out, x, adapter),
        }
    }

    /// PEFT's `Linear4bit.forward` after the base layer: the result cloned, the adapter's
    /// output cast back to the base's dtype, then added.
    fn lora_4bit(&mut self, base: Tensor, x: &Tensor, adapter: &Adapter) -> Tensor {
        let result = self.process.clone_contiguous(&base);
        drop(base);
        let (xa, scaled) = self.adapter(x, adapter);
        let p = &mut *self.process;
        let back = p.to(&scaled, result.elem);
        drop(scaled);
        let out = p.add(&result, &back);
        drop(result);
        drop(back);
        drop(xa);
        out
    }

    /// An adapter's output: `x` cast to the adapters' float32 (returned too: it goes when the
    /// layer's forward returns), then `B(A(dropout(x))) * scaling`.
    fn adapter(&mut self, x: &Tensor, adapter: &Adapter) -> (Tensor, Tensor) {
        let p = &mut *self.process;
        let xa = p.to(x, adapter.a.elem);
        let dropped = adapter.dropout.then(|| p.dropout(&xa));
        let down = p.linear(dropped.as_ref().unwrap_or(&xa), &adapter.a, None);
        drop(dropped);
        let up = p.linear(&down, &adapter.b, None);
        drop(down);
        let scaled = p.scale(&up);
        drop(up);
        (xa, scaled)
    }

    /// Whether PEFT made the embeddings' output require grad: LoRA of a model not quantized,
    /// with gradient checkpointing (`_prepare_model_for_gradient_checkpointing`).
    fn inputs_require_grads(&self) -> bool {
        self.checkpointing && !self.weights.adapters.is_empty() && self.weights.quantized.is_empty()
    }

    /// The token embedding (Gemma's scaled by `sqrt(hidden)` cast to the weights' type, Granite's
    /// by its multiplier).
    fn embed(&mut self, weight: &Tensor, ids: &Tensor) -> Tensor {
        let leaf_output = self.inputs_require_grads();
        let p = &mut *self.process;
        let e = p.embedding(weight, ids);
        // PEFT's `enable_input_require_grads`: the embedding module's output made a leaf that
        // requires grad (the first layer's input gradients are then computed; the leaf's own
        // goes with the graph).
        let leaf = |t: Tensor| match leaf_output {
            true => super::process::Process::parameter(&t).0,
            false => t,
        };
        if !self.model.model_type.is_gemma() && !self.model.model_type.has_multipliers() {
            return leaf(e);
        }
        // Gemma's `* embed_scale` in its embedding module (a buffer already in the weights' type,
        // its `.to(dtype)` a no-op), Granite's `* embedding_multiplier` after it: only the product.
        let out = if self.model.model_type.has_multipliers() && leaf_output {
            // Granite multiplies the leaf outside the module: its accumulation node holds it
            // until the backward reaches it.
            p.scale_holding(&leaf(e.clone()))
        } else {
            // A float32 `embed_scale` (a model built in float32, its weights gathered in
            // another type: FSDP2) is cast for the product.
            let scale = (self.weights)
                .opt(&joined(&[
                    self.model.text_prefix(),
                    "embed_tokens.embed_scale",
                ]))
                .filter(|s| s.elem != e.elem)
                .map(|_| p.empty(&[], e.elem));
            // Gemma's scale is the embedding module's own: its output is the product.
            let out = leaf(p.scale(&e));
            drop(scale);
            out
        };
        drop(e);
        out
    }

    /// PEFT's `Linear.forward` after the base layer: `x` cast to the adapters' float32,
    /// `B(A(x)) * scaling` added, the sum cast back to the base's dtype.
    fn lora(&mut self, result: Tensor, x: &Tensor, adapter: &Adapter) -> Tensor {
        let base = result.elem;
        let (xa, scaled) = self.adapter(x, adapter);
        let p = &mut *self.process;
        let sum = p.add(&result, &scaled);
        drop(scaled);
        drop(result);
        let out = p.to(&sum, base);
        drop(sum);
        // `x`, now its float32 copy, goes at the return.
        drop(xa);
        out
    }

    /// `find_packed_sequence_indices(position_ids)` on positions expanded to the batch: the
    /// first value less one, the difference with it prepended, where it is not 1, its cumulative
    /// sum, and the check that every row is one sequence.
    pub(super) fn packed_sequences(&mut self, b: u64, t: u64) -> Option<Tensor> {
        let p = &mut *self.process;
        let first = p.empty(&[b, 1], Dtype::Int64);
        let prepended = p.empty(&[b, t + 1], Dtype::Int64);
        let diff = p.empty(&[b, t], Dtype::Int64);
        drop(prepended);
        let ne = p.empty(&[b, t], Dtype::Bool);
        let sums = p.empty(&[b, t], Dtype::Int64);
        let widened = p.empty(&[b, t], Dtype::Int64);
        if b == 1 {
            // One row's cumulative sum is cub's scan.
            super::sampling::scan_scratch(p, t, Dtype::Int64);
        }
        drop(widened);
        drop(ne);
        let last = p.empty(&[b], Dtype::Bool);
        let all = p.empty(&[], Dtype::Bool);
        drop(last);
        drop(all);
        drop(first);
        drop(diff);
        // The sequence indices, kept to build the mask when the positions restart.
        p.packed.then_some(sums)
    }

    /// The rotary embedding's `cos` and `sin` for `positions` (`[b, t]` int64), in `dtype`
    /// (computed in float32 with autocast off).
    fn rotary(&mut self, positions: &Tensor, dtype: Dtype) -> (Tensor, Tensor) {
        let (b, t) = (positions.shape[0], positions.shape[1]);
        let half = self.model.rotary_dim.div_ceil(2);
        let p = &mut *self.process;
        let pos = p.empty(&[b, 1, t], Dtype::Float32);
        let freqs = p.product(&[b, half, t], Dtype::Float32);
        let emb = p.empty(&[b, t, 2 * half], Dtype::Float32);
        let raw = p.empty(&[b, t, 2 * half], Dtype::Float32);
        let cos = p.empty(&[b, t, 2 * half], Dtype::Float32);
        drop(raw);
        let raw = p.empty(&[b, t, 2 * half], Dtype::Float32);
        let sin = p.empty(&[b, t, 2 * half], Dtype::Float32);
        drop(raw);
        let cos_out = p.to(&cos, dtype);
        let sin_out = p.to(&sin, dtype);
        drop(pos);
        drop(freqs);
        drop(emb);
        drop(cos);
        drop(sin);
        (cos_out, sin_out)
    }

    /// `rotate_half(x)`: `cat(-x2, x1)`.
    fn rotate_half(&mut self, x: &Tensor) -> Tensor {
        let d = x.size(-1);
        let p = &mut *self.process;
        let x1 = p.slice(x, -1, 0, d / 2);
        let x2 = p.slice(x, -1, d / 2, d);
        let neg = p.neg(&x2);
        let out = p.cat(&[&neg, &x1], -1);
        drop(neg);
        out
    }

    /// The rotary embedding on the queries and the keys; Phi-3 rotates the first `rotary_dim` of
    /// each head and concatenates the rest back (a concatenation even when the rest is empty),
    /// both sliced before either is rotated.
    fn rotary_pair(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Tensor) {
        if self.model.model_type != crate::model::ModelType::Phi3 {
            let q_embed = self.apply_rotary(q, cos, sin);
            return (q_embed, self.apply_rotary(k, cos, sin));
        }
        let rd = cos.size(-1);
        let [(q_rot, q_pass), (k_rot, k_pass)] =
            [q, k].map(|x| rotated_and_rest(self.process, x, rd));
        let [q_embed, k_embed] = [(q_rot, q_pass), (k_rot, k_pass)].map(|(rot, pass)| {
            let embedded = self.apply_rotary(&rot, cos, sin);
            let out = self.process.cat(&[&embedded, &pass], -1);
            drop(embedded);
            out
        });
        (q_embed, k_embed)
    }

    /// GLM-4's `apply_rotary_pos_emb`: `cos` and `sin` halved, each entry repeated twice; the
    /// first `rotary_dim` of each head of `q`, then of `k`, rotated pairwise; the rest of each
    /// concatenated back once both are rotated.
    fn pairwise_rotary(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Tensor) {
        let rd = cos.size(-1);
        let p = &mut *self.process;
        let [cos, sin] = [cos, sin].map(|t| {
            let half = p.slice(t, -1, 0, rd / 2);
            p.repeat_interleave_last(&half, 2)
        });
        let rd = cos.size(-1);
        let [(q_rot, q_pass), (k_rot, k_pass)] = [q, k].map(|x| rotated_and_rest(p, x, rd));
        let q_part = self.pairwise_embed(&q_rot, &cos, &sin);
        let k_part = self.pairwise_embed(&k_rot, &cos, &sin);
        let q_embed = self.process.cat(&[&q_part, &q_pass], -1);
        drop(q_part);
        let k_embed = self.process.cat(&[&k_part, &k_pass], -1);
        drop(k_part);
        // The locals go at the return in the frame's order: `cos`, then `sin`.
        drop(cos);
        drop(sin);
        (q_embed, k_embed)
    }

    /// Cohere's `apply_rotary_pos_emb`: `q` and `k` in float32, each rotated over the whole head
    /// with the pairwise `rotate_half`, cast back; the float32 tensors go at the return.
    fn cohere_rotary(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Tensor) {
        let qf = self.process.to(q, Dtype::Float32);
        let kf = self.process.to(k, Dtype::Float32);
        let q_embed = self.pairwise_embed(&qf, cos, sin);
        let k_embed = self.pairwise_embed(&kf, cos, sin);
        let p = &mut *self.process;
        let out = (p.to(&q_embed, q.elem), p.to(&k_embed, k.elem));
        drop(qf);
        drop(kf);
        drop(q_embed);
        drop(k_embed);
        out
    }

    /// `(x * cos) + (rotate_half(x) * sin)` with GLM's and Cohere's `rotate_half`: `stack((-x[..., 1::2],
    /// x[..., 0::2]), -1).flatten(-2)`.
    fn pairwise_embed(&mut self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let p = &mut *self.process;
        let a = p.mul(x, cos);
        let x1 = p.slice_step(x, -1, 0, 2);
        let x2 = p.slice_step(x, -1, 1, 2);
        let neg = p.neg(&x2);
        let stacked = p.stack_last(&[&neg, &x1]);
        drop(neg);
        let rotated = p.reshape(&stacked, &x.shape);
        drop(stacked);
        let b = p.mul(&rotated, sin);
        drop(rotated);
        let out = p.add(&a, &b);
        drop(a);
        drop(b);
        out
    }

    /// Phi-3's `qkv_proj`, sliced into queries, keys and values (views), as heads.
    fn fused_qkv(&mut self, prefix: &str, x: &Tensor) -> (Tensor, Tensor, Tensor, Tensor) {
        let m = self.model;
        let (b, t, d) = (x.shape[0], x.shape[1], m.head_dim);
        let (q_width, kv_width) = (m.heads * d, m.kv_heads * d);
        let qkv = self.linear(prefix, x);
        // The three sliced first, then each viewed as heads (so the views come first in the
        // backward's order, the slices' after).
        let parts = [
            (0, q_width, m.heads),
            (q_width, kv_width, m.kv_heads),
            (q_width + kv_width, kv_width, m.kv_heads),
        ]
        .map(|(start, width, heads)| (self.process.slice(&qkv, -1, start, start + width), heads));
        let [q, k, v] = parts.map(|(part, heads)| {
            let viewed = self.process.reshape(&part, &[b, t, heads, d]);
            drop(part);
            self.process.transpose(&viewed, 1, 2)
        });
        (qkv, q, k, v)
    }

    /// `(x * cos) + (rotate_half(x) * sin)`.
    fn apply_rotary(&mut self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let a = self.process.mul(x, cos);
        let r = self.rotate_half(x);
        let b = self.process.mul(&r, sin);
        drop(r);
        let out = self.process.add(&a, &b);
        drop(a);
        drop(b);
        out
    }

    /// `prefix`'s projection of `x` viewed as `heads` heads of width `d` and transposed to
    /// `[b, heads, t, d]`; normed first by the attention `attn`'s `norm` where given (Qwen3's
    /// per-head norms, before the transpose).
    fn projected_heads(
        &mut self,
        (attn, proj): (&str, &str),
        x: &Tensor,
        heads: u64,
        d: u64,
        norm: Option<&str>,
    ) -> Tensor {
        let projected = self.linear(&joined(&[attn, ".", proj]), x);
        self.heads(projected, heads, d, norm.map(|n| (attn, n)))
    }

    /// OLMo 2's projection of `x` normed whole (`q_norm(q_proj(x))`), its heads not yet viewed.
    fn normed_projection(&mut self, (attn, proj): (&str, &str), x: &Tensor, norm: &str) -> Tensor {
        let projected = self.linear(&joined(&[attn, ".", proj]), x);
        self.head_norm(attn, norm, projected)
    }

    /// `projected [b, t, heads · d]` viewed as heads and transposed to `[b, heads, t, d]`, each
    /// head normed before the transpose by the attention's `norm` where given.
    fn heads(
        &mut self,
        projected: Tensor,
        heads: u64,
        d: u64,
        norm: Option<(&str, &str)>,
    ) -> Tensor {
        let (b, t) = (projected.shape[0], projected.shape[1]);
        let viewed = self.p().reshape(&projected, &[b, t, heads, d]);
        drop(projected);
        let viewed = match norm {
            Some((attn, norm)) => self.head_norm(attn, norm, viewed),
            None => viewed,
        };
        self.p().transpose(&viewed, 1, 2)
    }

    /// `self.{norm}(x)` of the attention `attn` (a per-head norm): `x` goes as its name is
    /// rebound.
    fn head_norm(&mut self, attn: &str, norm: &str, x: Tensor) -> Tensor {
        let w = self
            .weights
            .get(&joined(&[attn, ".", norm, ".weight"]))
            .clone();
        let normed = self.norm(&x, &w);
        drop(x);
        normed
    }

    /// `repeat_kv`: grouped keys or values expanded to every query head (a copy).
    fn repeat_kv(&mut self, x: &Tensor) -> Tensor {
        let groups = self.model.heads / self.model.kv_heads.max(1);
        if groups <= 1 {
            return x.clone();
        }
        let (b, k, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let p = &mut *self.process;
        let e = p.unsqueeze(x, 2);
        let wide = p.expand(&e, &[b, k, groups, s, d]);
        p.reshape(&wide, &[b, k * groups, s, d])
    }

    /// `attn.transpose(1, 2).reshape(b, t, -1).contiguous()`.
    pub(super) fn merge_heads(&mut self, heads: Tensor, b: u64, t: u64) -> Tensor {
        let width = heads.size(1) * heads.size(3);
        let swapped = self.p().transpose(&heads, 1, 2);
        drop(heads);
        let flat = self.p().reshape(&swapped, &[b, t, width]);
        drop(swapped);
        self.p().contiguous(&flat)
    }

    /// A standard attention layer: projections, rotary, cache, SDPA, output projection.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        layer: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: Option<&mut Cache>,
        qk_norm: QkNorm,
    ) -> Tensor {
        let m = self.model;
        let a = joined(&[&layer_prefix(self.model, layer), ".self_attn"]);
        let (d, (b, t)) = (m.head_dim, (x.shape[0], x.shape[1]));
        let fused = matches!(
            m.attention,
            Attention::Standard {
                fused_qkv: true,
                ..
            }
        );
        // Phi-3's fused projection stays referenced by its local to the return.
        let mut fused_output = None;
        let (q, k, v) = if fused {
            let (qkv, q, k, v) = self.fused_qkv(&joined(&[&a, ".qkv_proj"]), x);
            fused_output = Some(qkv);
            (q, k, v)
        } else {
            // Qwen3 norms each projection's heads before the transpose, Gemma 3 once all three
            // are projected and transposed; OLMo 2 each whole projection, the three projected
            // before any is viewed as heads (so their views come after in the backward's order).
            let before = |norm| (qk_norm == QkNorm::BeforeTranspose).then_some(norm);
            match qk_norm {
                QkNorm::Projection => {
                    let q = self.normed_projection((&a, "q_proj"), x, "q_norm");
                    let k = self.normed_projection((&a, "k_proj"), x, "k_norm");
                    let v = self.linear(&joined(&[&a, ".v_proj"]), x);
                    let q = self.heads(q, m.heads, d, None);
                    let k = self.heads(k, m.kv_heads, d, None);
                    (q, k, self.heads(v, m.kv_heads, d, None))
                }
                _ => {
                    let q = self.projected_heads((&a, "q_proj"), x, m.heads, d, before("q_norm"));
                    let k =
                        self.projected_heads((&a, "k_proj"), x, m.kv_heads, d, before("k_norm"));
                    let v = self.projected_heads((&a, "v_proj"), x, m.kv_heads, d, None);
                    match qk_norm {
                        QkNorm::AfterTranspose => {
                            let q = self.head_norm(&a, "q_norm", q);
                            (q, self.head_norm(&a, "k_norm", k), v)
                        }
                        _ => (q, k, v),
                    }
                }
            }
        };
        let cos4 = self.p().unsqueeze(cos, 1);
        let sin4 = self.p().unsqueeze(sin, 1);
        let (mut q_embed, mut k_embed) = if m.model_type.has_interleaved_rotary() {
            self.pairwise_rotary(&q, &k, &cos4, &sin4)
        } else if m.model_type.is_cohere() {
            self.cohere_rotary(&q, &k, &cos4, &sin4)
        } else {
            self.rotary_pair(&q, &k, &cos4, &sin4)
        };
        if m.model_type.norms_after_blocks() {
            // OLMo 2 casts back what it rotated in float32: `q_embed.to(q_type), k_embed.to(k_type)`.
            let (qc, kc) = (self.p().to(&q_embed, q.elem), self.p().to(&k_embed, k.elem));
            (q_embed, k_embed) = (qc, kc);
        }
        drop(cos4);
        drop(sin4);
        drop(q);
        drop(k);
        let (keys, values) = match cache {
            Some(c) => {
                let kv = c.update(self.process, layer, &k_embed, &v);
                drop(k_embed);
                drop(v);
                kv
            }
            None => (k_embed, v),
        };
        let heads = match mask {
            None => self.process.cudnn_attention(&q_embed, &keys, &values, None),
            // With a mask, SDPA gets no grouped K and V: `repeat_kv` makes them whole.
            Some(mask) => {
                let k_all = self.repeat_kv(&keys);
                let v_all = self.repeat_kv(&values);
                let out = self
                    .process
                    .cudnn_attention(&q_embed, &k_all, &v_all, Some(mask));
                drop(k_all);
                drop(v_all);
                out
            }
        };
        let attn = self.merge_heads(heads, b, t);
        let out = self.linear(&joined(&[&a, ".o_proj"]), &attn);
        // The attention's locals go at its return: the queries, keys and values.
        drop(fused_output);
        drop(attn);
        drop(q_embed);
        drop(keys);
        drop(values);
        out
    }

    /// `act_fn(gate_proj(x)) * up_proj(x)` through `down_proj` (StarCoder2's plain MLP).
    pub(super) fn mlp(&mut self, prefix: &str, x: &Tensor) -> Tensor {
        if self.model.model_type.is_starcoder2() {
            // StarCoder2: `c_proj(act(c_fc(x)))`, each output let go as the name is rebound
            // (its dropout, of probability 0, makes nothing).
            let up = self.linear(&joined(&[prefix, ".c_fc"]), x);
            let act = self.process.gelu_tanh(&up);
            drop(up);
            let out = self.linear(&joined(&[prefix, ".c_proj"]), &act);
            drop(act);
            return out;
        }
        if self.model.fused_gate_up && !prefix.contains("shared") {
            // Phi-3: gate_up_proj, chunked; up * act(gate).
            let gate_up = self.linear(&joined(&[prefix, ".gate_up_proj"]), x);
            let (gate, up) = self.process.chunk2(&gate_up);
            drop(gate_up);
            let act = self.process.silu(&gate);
            let prod = self.process.mul(&up, &act);
            drop(act);
            drop(up);
            let out = self.linear(&joined(&[prefix, ".down_proj"]), &prod);
            drop(prod);
            drop(gate);
            return out;
        }
        let gate = self.linear(&joined(&[prefix, ".gate_proj"]), x);
        let act = if self.model.model_type.is_gemma() {
            self.process.gelu_tanh(&gate)
        } else {
            self.process.silu(&gate)
        };
        drop(gate);
        let up = self.linear(&joined(&[prefix, ".up_proj"]), x);
        let prod = self.process.mul(&act, &up);
        drop(act);
        drop(up);
        let out = self.linear(&joined(&[prefix, ".down_proj"]), &prod);
        drop(prod);
        out
    }

    /// Recomputes checkpointed layer `layer` from its arguments (`hidden`, `cos`, `sin`).
    pub fn recompute(&mut self, layer: usize, inputs: &[Tensor]) {
        let mask = (inputs[1].numel() > 0).then(|| inputs[1].clone());
        let rope = match &inputs[2..] {
            [freqs] => Rope::Complex(freqs.clone()),
            [cos, sin, ..] => Rope::Real(cos.clone(), sin.clone()),
            [] => unreachable!("a checkpoint holds its rotary"),
        };
        let out = self.decoder_layer(layer, &inputs[0], &rope, mask.as_ref(), None);
        drop(out);
    }

    /// Decoder layer `layer` of a forward that fills `cache`, run, or written again from the
    /// record of the layers of its kind before it ([`super::repeat`]).
    fn layer_or_repeat(
        &mut self,
        records: &mut ForwardRecords,
        layer: usize,
        hidden: &Tensor,
        rope: &Rope,
        mask: Option<&Tensor>,
        cache: &mut Cache,
    ) -> Tensor {
        let repeatable = !self.process.autograd.enabled && self.process.tape.allocates_plainly();
        let kind = self.layer_kinds.as_ref().and_then(|k| k.of_layer(layer));
        let Some(kind) = kind.filter(|_| repeatable) else {
            return self.decoder_layer(layer, hidden, rope, mask, Some(cache));
        };
        if let Some(out) = records.write_again(kind, hidden, cache, layer) {
            return out;
        }
        if !records.records(kind) {
            return self.decoder_layer(layer, hidden, rope, mask, Some(cache));
        }
        let capture = Capture::begin(&self.process.tape, hidden, cache, layer);
        let out = self.decoder_layer(layer, hidden, rope, mask, Some(cache));
        let record = capture.end(&out, cache, layer);
        if let Some(kinds) = self.layer_kinds.as_mut() {
            records.note(kind, record, kinds);
        }
        out
    }

    /// A decoder layer on `hidden` (which the model's loop holds until the layer returns).
    fn decoder_layer(
        &mut self,
        layer: usize,
        hidden: &Tensor,
        rope: &Rope,
        mask: Option<&Tensor>,
        cache: Option<&mut Cache>,
    ) -> Tensor {
        let m = self.model;
        if m.model_type.is_cohere() {
            return self.parallel_layer(layer, hidden, rope, mask, cache);
        }
        let l = layer_prefix(self.model, layer);
        let qk_norm = match m.attention {
            Attention::Standard { qk_norm, .. } => qk_norm,
            Attention::Latent(_) => QkNorm::None,
        };
        let gemma = m.model_type.has_sandwich_norms();
        let glm = m.model_type.has_output_norms();
        let weight = |name: &str| {
            self.weights
                .get(&joined(&[&l, ".", name, ".weight"]))
                .clone()
        };
        let after = m.model_type.norms_after_blocks();
        let input_norm = (!after).then(|| weight("input_layernorm"));
        let post_attention = weight("post_attention_layernorm");
        let post_feedforward = after.then(|| weight("post_feedforward_layernorm"));
        let sandwich = gemma.then(|| {
            (
                weight("pre_feedforward_layernorm"),
                weight("post_feedforward_layernorm"),
            )
        });
        // GLM-4 norms each block's output with its own weights, Llama's two norms before.
        let output_norms = glm.then(|| {
            (
                weight("post_self_attn_layernorm"),
                weight("post_mlp_layernorm"),
            )
        });
        let residual = hidden.clone();
        let normed = match &input_norm {
            Some(w) => self.block_norm(&residual, &l, "input_layernorm", w),
            None => residual.clone(),
        };
        let mut attn = match (&m.attention, rope) {
            (Attention::Latent(l), _) => {
                self.latent_attention(layer, &normed, rope, mask, cache, *l)
            }
            (_, rope) => {
                let (cos, sin) = rope.real();
                self.attention(layer, &normed, cos, sin, mask, cache, qk_norm)
            }
        };
        drop(normed);
        if gemma || after {
            // Gemma 2 and 3 and OLMo 2 normalise the attention's output before the residual.
            let n = self.norm(&attn, &post_attention);
            attn = n;
        }
        if let Some((after_attention, _)) = &output_norms {
            let n = self.norm(&attn, after_attention);
            attn = n;
        }
        // Granite's `residual + hidden_states * residual_multiplier`: the product, the sum, then
        // the product and the block's output freed.
        let scaled = m
            .model_type
            .has_multipliers()
            .then(|| self.process.scale(&attn));
        let hidden = self
            .process
            .add(&residual, scaled.as_ref().unwrap_or(&attn));
        drop(scaled);
        drop(attn);
        drop(residual);
        let residual = hidden;
        let normed = match (&sandwich, after) {
            (Some((pre, _)), _) => self.norm(&residual, &pre.clone()),
            (None, true) => residual.clone(),
            (None, false) => self.block_norm(
                &residual,
                &l,
                "post_attention_layernorm",
                &post_attention.clone(),
            ),
        };
        let mut out = match m.layers[layer].mlp {
            Mlp::Dense { .. } => self.mlp(&joined(&[&l, ".mlp"]), &normed),
            Mlp::Experts => self.moe_block(&joined(&[&l, ".mlp"]), &normed),
        };
        drop(normed);
        if let Some(post) = (sandwich.as_ref().map(|(_, post)| post))
            .or(post_feedforward.as_ref())
            .or(output_norms.as_ref().map(|(_, after_mlp)| after_mlp))
        {
            let n = self.norm(&out, post);
            out = n;
        }
        let scaled = m
            .model_type
            .has_multipliers()
            .then(|| self.process.scale(&out));
        let hidden = self.process.add(&residual, scaled.as_ref().unwrap_or(&out));
        drop(scaled);
        drop(out);
        drop(residual);
        hidden
    }

    /// `nn.LayerNorm` `prefix` (its weight and bias) on `x`.
    fn layer_norm(&mut self, x: &Tensor, prefix: &str) -> Tensor {
        let w = self.weights_tensor(&joined(&[prefix, ".weight"]));
        let b = self.weights_tensor(&joined(&[prefix, ".bias"]));
        self.process.layer_norm(x, &w, &b)
    }

    /// The norm of a layer's block input named `name` (its `weight`): StarCoder2's a layer norm
    /// with its bias, the others' as [`Decoder::norm`] makes them.
    fn block_norm(
        &mut self,
        x: &Tensor,
        layer_prefix: &str,
        name: &str,
        weight: &Tensor,
    ) -> Tensor {
        match self.model.model_type.is_starcoder2() {
            true => self.layer_norm(x, &joined(&[layer_prefix, ".", name])),
            false => self.norm(x, weight),
        }
    }

    /// Cohere's layer: `residual + attention(norm(x)) + mlp(norm(x))`, the norm's output held
    /// until the sum is made, the blocks' outputs until the return.
    fn parallel_layer(
        &mut self,
        layer: usize,
        hidden: &Tensor,
        rope: &Rope,
        mask: Option<&Tensor>,
        cache: Option<&mut Cache>,
    ) -> Tensor {
        let l = layer_prefix(self.model, layer);
        let weight = self.weights_tensor(&joined(&[&l, ".input_layernorm.weight"]));
        let normed = self.norm(hidden, &weight);
        let (cos, sin) = rope.real();
        let attn = self.attention(layer, &normed, cos, sin, mask, cache, QkNorm::None);
        let mlp = self.mlp(&joined(&[&l, ".mlp"]), &normed);
        let partial = self.process.add(hidden, &attn);
        let out = self.process.add(&partial, &mlp);
        drop(partial);
        drop(normed);
        drop(attn);
        drop(mlp);
        out
    }

    /// The model without its head (`model.model`): the embeddings, the layers, the final norm;
    /// its locals let go as it returns, the last hidden state returned.
    pub fn backbone(
        &mut self,
        ids: &Tensor,
        mask: Option<&Tensor>,
        positions: Option<&Tensor>,
        mut cache: Option<&mut Cache>,
    ) -> Tensor {
        let m = self.model;
        let embed = self
            .weights
            .get(&joined(&[m.text_prefix(), "embed_tokens.weight"]))
            .clone();
        let dtype = embed.elem;
        let inputs_embeds = self.embed(&embed, ids);
        // Without positions, `arange(t) + past_seen_tokens`, unsqueezed.
        let made_positions = positions.is_none().then(|| {
            let t = ids.shape[1];
            let p = &mut *self.process;
            let range = p.empty(&[t], Dtype::Int64);
            let shifted = p.empty(&[t], Dtype::Int64);
            drop(range);
            shifted.restrided(smallvec![1, t], smallvec![t, 1])
        });
        let positions = positions.or(made_positions.as_ref()).expect("positions");
        let masks = self.masks(mask, cache.as_deref(), ids.shape[0], ids.shape[1]);
        // DeepSeek-V2 rotates through complex frequencies; Gemma 3 computes one rotary pair per
        // attention kind it has (global, local).
        let complex = matches!(m.attention, Attention::Latent(l) if !l.interleaved_rope);
        let global = if complex {
            Rope::Complex(self.complex_frequencies(positions))
        } else {
            // OLMo 2 keeps its cos and sin in float32 (the queries and keys rotated in float32,
            // then cast back).
            let rope_dtype = match m.model_type.norms_after_blocks() {
                true => Dtype::Float32,
                false => dtype,
            };
            let (cos, sin) = self.rotary(positions, rope_dtype);
            Rope::Real(cos, sin)
        };
        let local = (m.model_type == crate::model::ModelType::Gemma3Text
            && m.mixes_sliding_and_global())
        .then(|| {
            let (cos, sin) = self.rotary(positions, dtype);
            Rope::Real(cos, sin)
        });
        let mut hidden = inputs_embeds.clone();
        let mut records = ForwardRecords::default();
        for layer in 0..m.layers.len() {
            let mask = masks.for_window(m.layers[layer].window).cloned();
            let rope = match (&local, m.layers[layer].window) {
                (Some(r), Some(_)) => r,
                _ => &global,
            };
            // FSDP2's pre-forward: the layer unsharded, its input through the post-backward node.
            let sharded_input = self
                .process
                .with_fsdp(|fsdp, p| fsdp.pre_forward(p, layer + 1, Some(&hidden)))
                .flatten();
            let input = sharded_input.as_ref().unwrap_or(&hidden);
            let out = if self.checkpointing {
                // The checkpoint holds the layer's arguments: its input, mask and rotary.
                let mut inputs = vec![
                    input.clone(),
                    mask.clone()
                        .unwrap_or_else(|| self.process.empty(&[0], Dtype::Uint8)),
                ];
                inputs.extend(rope.tensors());
                self.process.begin_checkpoint(layer, inputs);
                let out = self.decoder_layer(layer, input, rope, mask.as_ref(), None);
                self.process.end_checkpoint();
                out
            } else if let Some(cache) = cache.as_deref_mut() {
                self.layer_or_repeat(&mut records, layer, input, rope, mask.as_ref(), cache)
            } else {
                self.decoder_layer(layer, input, rope, mask.as_ref(), None)
            };
            // FSDP2's post-forward, while the call still holds its input: resharded, the
            // pre-backward hook on the output.
            let hooked = (self.process)
                .with_fsdp(|fsdp, p| fsdp.post_forward(p, layer + 1, &out))
                .flatten();
            drop(sharded_input);
            hidden = hooked.unwrap_or(out);
        }
        let normed = match m.model_type.is_starcoder2() {
            true => self.layer_norm(&hidden, &joined(&[m.text_prefix(), "norm"])),
            false => {
                let w = self.weights_tensor(&joined(&[m.text_prefix(), "norm.weight"]));
                self.norm(&hidden, &w)
            }
        };
        drop(hidden);
        // The model's locals go at its return: positions it made, the embeddings, then the
        // rotary pair (a tuple: its last item first).
        drop(made_positions);
        drop(inputs_embeds);
        drop(masks);
        drop(local);
        drop(global);
        normed
    }

    /// The output head's weight (TRL's fused head projects with it).
    pub(super) fn head_weight(&self) -> Tensor {
        self.weights
            .get(&joined(&[&self.head_module(), ".weight"]))
            .clone()
    }

    /// The output head's module: the embeddings' when they are tied.
    fn head_module(&self) -> String {
        let m = self.model;
        if m.tied_embeddings {
            joined(&[m.text_prefix(), "embed_tokens"])
        } else {
            "lm_head".to_string()
        }
    }

    /// `XForCausalLM.forward` of `inputs`.
    pub fn forward(&mut self, inputs: Inputs) -> Output {
        let Inputs {
            ids,
            mask,
            positions,
            cache,
            keep_last,
            labels,
            items,
        } = inputs;
        let normed = self.backbone(ids, mask, positions, cache);
        let m = self.model;
        let head = self.head_module();
        let last = if keep_last {
            let t = normed.shape[1];
            self.process.slice(&normed, 1, t - 1, t)
        } else {
            normed.clone()
        };
        let mut logits = self.linear(&head, &last);
        drop(last);
        if let Some(tp) = self.process.tensor_parallel {
            // The ranks' logits stacked, then moved onto the last dimension (a view of the
            // stack, or a copy and the stack freed); the local logits freed last.
            let p = &mut *self.process;
            let g = tp.gathered_logits(&logits.shape);
            let stacked = p.empty(&g.stacked, logits.elem);
            let gathered = match g.copied {
                true => p.empty(&g.logits, logits.elem),
                false => p.reshape(&stacked, &g.logits),
            };
            drop(stacked);
            drop(std::mem::replace(&mut logits, gathered));
        }
        if m.model_type.scales_logits() {
            // Granite's `logits / logits_scaling`, Cohere's `logits * logit_scale`.
            logits = self.process.scale(&logits);
        }
        if m.final_softcap {
            // logits / cap, tanh, * cap
            let p = &mut *self.process;
            let divided = p.scale(&logits);
            logits = divided;
            let capped = p.tanh(&logits);
            logits = capped;
            let scaled = p.scale(&logits);
            logits = scaled;
        }
        let loss = labels.map(|labels| self.loss(&logits, labels, items));
        drop(normed);
        Output { logits, loss }
    }

    /// transformers' `ForCausalLMLoss`: the logits upcast to float32, the labels padded and
    /// shifted, `cross_entropy` (log-softmax, then the negative log-likelihood, averaged; or with
    /// the count of `items`, summed then divided by it).
    fn loss(&mut self, logits: &Tensor, labels: &Tensor, items: Option<&Tensor>) -> Tensor {
        let p = &mut *self.process;
        let (b, t, v) = (logits.shape[0], logits.shape[1], logits.shape[2]);
        let upcast = p.to(logits, Dtype::Float32);
        // `labels = pad(labels, (0, 1))`, `shift_labels = labels[..., 1:].contiguous()`: a copy
        // unless the slice already is contiguous (a batch of one).
        let padded = p.empty(&[b, t + 1], Dtype::Int64);
        let sliced = p.slice(&padded, -1, 1, t + 1);
        let shifted = p.contiguous(&sliced);
        drop(sliced);
        let flat = p.reshape(&upcast, &[b * t, v]);
        let log_probs = p.log_softmax(&flat);
        drop(flat);
        let mut loss = p.nll_loss(&log_probs, &shifted);
        if items.is_some() {
            let summed = loss;
            loss = p.scale(&summed);
        }
        drop(log_probs);
        drop(shifted);
        drop(upcast);
        drop(padded);
        let _ = labels;
        loss
    }
}
