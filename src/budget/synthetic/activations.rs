//! Activation memory of a Llama-style decoder, derived from what each operation keeps: for
//! training, the tensors autograd saves for backward; for inference, the tensors alive at once
//! inside one layer. The operations are those of Hugging Face's Llama (RMSNorm in float32, SwiGLU
//! MLP, attention through PyTorch's fused kernel or written out, float32 loss; PEFT's float32
//! adapters), as this project's synthetic transformer (`torch/src/transformer/`) runs them, and
//! the derivation was checked against that transformer on an H200 (`docs/benchmarks.md`,
//! "Budgets on the GPU"). Another implementation keeps other tensors: the terms are `estimated`.

use super::workload::{Mode, Workload};
use crate::budget::shape::{LinearTarget, WeightTensor};
use crate::measure::Dtype;

/// The activation terms of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activations {
    /// Kept from the forward pass for backward (training), or the largest working set of one
    /// layer during the prefill (inference).
    pub bytes: u64,
    pub formula: String,
    /// Logits and loss: what the loss keeps after forward plus, at the start of backward, the
    /// gradients of the log-probabilities and of the logits (training); token ids (inference).
    pub logits_bytes: u64,
    /// Training: what the loss keeps after forward (final norm, log-probabilities, scalars).
    pub loss_kept: u64,
    pub logits_formula: String,
    /// Working memory when every gradient exists: the optimizer step's float32 copy of the
    /// largest trained tensor's gradient (training).
    pub step_bytes: u64,
    /// With recomputation, the moments inside the backward pass of a recomputed layer, at the
    /// top of the stack and at its bottom: (name, activation bytes, gradient bytes then).
    pub recompute: Vec<(&'static str, u64, u64)>,
    pub peak_rule: String,
}

/// Where the formulas come from, said beside every term that uses them.
pub const SOURCE: &str = "derived from the tensors each operation keeps (Hugging Face's Llama \
operations; cf. Korthikanti et al. 2022 for a GPT layer), see docs/allocator-model.md";
/// How far the formulas were found from the H200's figures (docs/benchmarks.md).
pub const BOUND: &str = "checked against a synthetic transformer on an H200: the peak of \
`allocated` within 1 % in 55 runs (16-bit and float32, fused and written-out attention, full, LoRA, \
recomputation), 34 of them to the byte; other implementations keep other tensors";

/// Bytes the fused attention kernel allocates for its random-number state (seed and offset),
/// two blocks of 512 bytes, per layer, even without dropout.
const FUSED_RNG_STATE: u64 = 2 * 512;
/// The loss's total weight and the loss itself, one block of 512 bytes each.
const LOSS_SCALARS: u64 = 2 * 512;

/// The sizes the formulas are written in, of one workload.
struct Dims {
    /// Batch, context, bytes per element, and batch × context.
    b: u64,
    t: u64,
    e: u64,
    bs: u64,
    /// Hidden size, Q width, K/V width, vocabulary.
    h: u64,
    q: u64,
    kv: u64,
    v: u64,
    /// The MLP width a token goes through: `experts_per_token` experts of `intermediate` each.
    i: u64,
    /// Whether the fused kernel takes grouped K and V as they are (16-bit, head_dim ≤ 256);
    /// anywhere else K and V are first repeated to every query head, whose width `kv_used` is.
    native_groups: bool,
    kv_used: u64,
}

impl Dims {
    fn of(w: &Workload) -> Dims {
        let s = &w.shape;
        let (q, kv) = (s.q_dim(), s.kv_dim());
        let native_groups = flash_kernel(w);
        Dims {
            b: w.batch,
            t: w.context,
            e: w.dtype.bytes(),
            bs: w.batch * w.context,
            h: s.hidden,
            q,
            kv,
            v: s.vocab,
            i: s.intermediate * s.experts_per_token,
            native_groups,
            kv_used: if native_groups { kv } else { q },
        }
    }
}

/// The activation terms of a validated workload.
pub fn estimate(w: &Workload, tensors: &[WeightTensor]) -> Activations {
    let s = &w.shape;
    let Dims {
        e,
        bs,
        h,
        q,
        kv,
        v,
        i,
        kv_used,
        ..
    } = Dims::of(w);
    let ids = 8 * bs;
    match &w.mode {
        Mode::Inference { .. } => {
            // No autograd: inside the MLP the residual stream, the attention block's sum and the
            // normalised input (3 × h), and gate, up and silu(gate)·up (3 × i) are alive at once.
            let mlp = e * bs * (3 * h + 3 * i);
            // Inside attention the residual, the normalised input and Q (K and V go into the
            // cache); the fused kernel adds its output, K and V repeated where it cannot group.
            let attention = if w.flash_attention {
                e * bs * (2 * h + 2 * q + 2 * kv_used)
            } else {
                let repeated = if kv_used == kv { 0 } else { 2 * e * bs * q };
                e * bs * (2 * h + q) + repeated + explicit_scores_working_set(w)
            };
            Activations {
                bytes: mlp.max(attention),
                formula: format!(
                    "the prefill's largest working set in one layer, max(MLP {e}·b·t·(3·{h} + 3·{i}), \
                     attention {}) with b·t = {bs}",
                    if w.flash_attention {
                        format!("{e}·b·t·(2·{h} + 2·{q} + 2·{kv_used})")
                    } else {
                        format!("{e}·b·t·(2·{h} + {q}) + the written-out scores' working set")
                    }
                ),
                logits_bytes: ids,
                loss_kept: 0,
                logits_formula: format!(
                    "prompt token ids 8 B × b·t {bs} (the last position's logits come after the layers' working set is freed)"
                ),
                step_bytes: 0,
                recompute: Vec::new(),
                peak_rule: "weights + KV cache + cuBLAS workspace + the prefill's largest working set".into(),
            }
        }
        Mode::Full { .. } | Mode::Lora { .. } => {
            let kept = Kept::new(w);
            let layers = if w.checkpointing {
                // Each layer's input and the head's, then one layer recomputed at a time.
                (s.layers + 1) * e * bs * h
            } else {
                kept.all_layers(s.layers)
            };
            let formula = if w.checkpointing {
                format!(
                    "full recomputation: the input of each of {} layers and of the head, ({} + 1)·{e}·b·t·{h}, with b·t = {bs}",
                    s.layers, s.layers
                )
            } else {
                format!("{} with b·t = {bs}", kept.formula)
            };
            // The loss in float32 keeps the log-probabilities; at the start of backward their
            // gradient and the logits' gradient add two more [b·t, vocab] float32 tensors.
            let log_probs = 4 * bs * v;
            let loss_kept = kept.final_norm + log_probs + LOSS_SCALARS;
            let logits = loss_kept + 2 * log_probs + 2 * ids;
            // The optimizer step reads each 16-bit gradient as a float32 copy (a float32 gradient is
            // read as it is) and allocates a float32 square root of its second moment, one after
            // the other: 4 B × the largest trained tensor.
            let step_bytes = match w.mode {
                Mode::Full { .. } => 4 * tensors.iter().map(|t| t.elements).max().unwrap_or(0),
                _ => 0,
            };
            let recompute = if w.checkpointing {
                recompute_moments(w, &kept, tensors)
            } else {
                Vec::new()
            };
            Activations {
                bytes: layers,
                formula,
                logits_bytes: logits,
                loss_kept,
                logits_formula: format!(
                    "final norm ({} B) + float32 log-probabilities kept, and at the start of backward their gradient and the logits' gradient: 3 × 4 B × b·t {bs} × vocab {v}; token ids and targets 2 × 8 B × b·t",
                    kept.final_norm
                ),
                step_bytes,
                recompute,
                peak_rule: "persistent states + the largest of the moments: the loss's backward \
                            (every kept activation, the log-probabilities and two gradients of \
                            their size), the optimizer step or the end of backward (every \
                            gradient), and with recomputation the inside of a recomputed layer's \
                            backward"
                    .into(),
            }
        }
    }
}

/// With recomputation, backward runs each layer again from its saved input, from the last layer
/// to the first, and sends the incoming gradient through it. Inside a layer's backward the peak
/// comes in the MLP: down's backward has made the gradient of the product and its own weight
/// gradient, then the multiplication's backward makes the gradients of silu(gate) and of up
/// (2·e·b·t·i) while gate, silu(gate) and up are still kept. Alive besides: the layer's kept
/// activations, its output and the incoming gradient, the inputs of the layers not yet done, and
/// the gradients made so far (the head's, the layers above, down's). At the top every input is
/// still there; at the bottom every layer above has its gradients.
fn recompute_moments(
    w: &Workload,
    kept: &Kept,
    tensors: &[WeightTensor],
) -> Vec<(&'static str, u64, u64)> {
    let s = &w.shape;
    let Dims {
        b,
        t,
        e,
        bs,
        h,
        q,
        i,
        ..
    } = Dims::of(w);
    let row = e * bs * h;
    let full = matches!(w.mode, Mode::Full { .. });
    let grads = |what: &dyn Fn(&str) -> bool| -> u64 {
        if full {
            tensors
                .iter()
                .filter(|t| what(&t.name))
                .map(|t| t.elements * e)
                .sum()
        } else {
            0
        }
    };
    let head = if s.tied_embeddings {
        "embed_tokens"
    } else {
        "lm_head"
    };
    let head_grads = grads(&|n| n == head || n == "norm");
    let in_layer = |n: &str| n.starts_with("layers.0.");
    let layer = grads(&in_layer);
    let down = grads(&|n| in_layer(n) && n.ends_with("down_proj"));
    // The layer's output and the incoming gradient stay alive through its backward.
    let mut moments = Vec::new();
    let mut both =
        |name_top: &'static str, name_bottom: &'static str, working: u64, grads_in_layer: u64| {
            moments.push((
                name_top,
                s.layers * row + 2 * row + working,
                head_grads + grads_in_layer,
            ));
            moments.push((
                name_bottom,
                row + 2 * row + working,
                head_grads + (s.layers - 1) * layer + grads_in_layer,
            ));
        };
    both(
        "recomputed top layer's MLP backward",
        "recomputed bottom layer's MLP backward",
        kept.other + 2 * e * bs * i,
        down,
    );
    if !w.flash_attention {
        // Written out, the attention's backward peaks in the softmax's: the float32
        // probabilities, their gradient and the softmax's float32 gradient beside gradients in
        // the dtype, with Q, the repeated K, the repeated V's gradient, the mask, the residual's
        // gradient and the first norm's kept tensors; the MLP, the second norm and o_proj are
        // done (their gradients made).
        let scores = b * s.heads * t * t;
        let kv_used = q;
        let norm1 = match &w.mode {
            Mode::Full { .. } => bs * h * (4 + 2 * e) + 4 * bs,
            _ => 4 * bs * h + 4 * bs,
        };
        let adapter_copies = match &w.mode {
            Mode::Lora { rank, targets } => {
                [LinearTarget::Q, LinearTarget::K, LinearTarget::V]
                    .iter()
                    .filter(|l| targets.contains(l))
                    .count() as u64
                    * (4 * bs * h + 4 * bs * rank)
            }
            _ => 0,
        };
        // Measured on the H200: 14 score-sized units of bytes in float16 (two runs) and 16 in
        // bfloat16 (two runs), whose softmax takes a float32 copy of its input and so has one
        // more conversion to undo; float32 is taken as bfloat16 (not measured).
        let softmax_backward = match w.dtype {
            Dtype::Float16 => 14,
            _ => 16,
        };
        let working = row
            + norm1
            + adapter_copies
            + e * bs * (q + 2 * kv_used)
            + t * t
            + softmax_backward * scores;
        let done = grads(&|n| {
            in_layer(n)
                && [
                    "gate_proj",
                    "up_proj",
                    "down_proj",
                    "post_attention_layernorm",
                    "o_proj",
                ]
                .iter()
                .any(|m| n.ends_with(m))
        });
        both(
            "recomputed top layer's attention backward",
            "recomputed bottom layer's attention backward",
            working,
            done,
        );
    }
    moments
}

/// Bytes of the written-out scores alive at once during a prefill: the scaled scores in the dtype,
/// then `softmax(dtype = float32)`, which first converts a bfloat16 input to float32 (a float16
/// input goes through the kernel's own half-to-float path, a float32 one as it is), then its copy
/// in the dtype while the scores still exist (the causal mask is gone by then).
fn explicit_scores_working_set(w: &Workload) -> u64 {
    let s = &w.shape;
    let e = w.dtype.bytes();
    let scores = w.batch * s.heads * w.context * w.context;
    let during_softmax = match w.dtype {
        Dtype::Bfloat16 => e + 4 + 4,
        Dtype::Float16 | Dtype::Float32 => e + 4,
    };
    let after = match w.dtype {
        Dtype::Float32 => 4 + 4,
        _ => 4 + 2 * e,
    };
    scores * during_softmax.max(after)
}

/// The attention kernel PyTorch picks for `scaled_dot_product_attention`: FlashAttention for
/// 16-bit inputs with heads up to 256 wide (it groups K and V itself and keeps its random-number
/// state on the GPU), else the memory-efficient kernel (its log-sum-exp padded to 32 positions).
fn flash_kernel(w: &Workload) -> bool {
    w.flash_attention && w.dtype != Dtype::Float32 && w.shape.head_dim <= 256
}

/// What one training layer keeps for backward.
struct Kept {
    /// Layer 0 (its input needs no gradient when the embedding is frozen).
    first: u64,
    /// Every other layer.
    other: u64,
    /// The final norm.
    final_norm: u64,
    formula: String,
}

impl Kept {
    fn new(w: &Workload) -> Kept {
        let s = &w.shape;
        let Dims {
            b,
            t,
            e,
            bs,
            h,
            q,
            i,
            native_groups,
            kv_used,
            ..
        } = Dims::of(w);
        // Attention keeps Q, K, V and its output; the fused kernel its float32 log-sum-exp per
        // head and token and its random-number state; written out, the causal mask, the float32
        // softmax and its copy in the dtype.
        let attention_extra = if native_groups {
            4 * b * s.heads * t + FUSED_RNG_STATE
        } else if w.flash_attention {
            4 * b * s.heads * t.div_ceil(32) * 32
        } else {
            t * t + (4 + e) * b * s.heads * t * t
        };
        let attention = e * bs * (2 * q + 2 * kv_used) + attention_extra;
        // RMSNorm keeps its float32 input and a float32 factor per token; with a trained weight
        // also the normalised input in the dtype; its output is kept by the next linear layers
        // when they train their weights.
        let norm_input = 4 * bs * h + 4 * bs;
        match &w.mode {
            Mode::Lora { rank, targets } => {
                let adapted = |l: LinearTarget| targets.contains(&l);
                // A frozen linear layer keeps nothing of its input; each adapted one keeps a
                // float32 copy of it and the float32 [b·t, rank] product with A. In float32 the
                // "copy" is the input itself: q, k and v share one, gate and up one, o_proj's is
                // the attention's output (already kept), down_proj's the MLP's product.
                let products = LinearTarget::ALL.iter().filter(|l| adapted(**l)).count() as u64
                    * 4
                    * bs
                    * rank;
                let any = |ls: &[LinearTarget]| u64::from(ls.iter().any(|l| adapted(*l)));
                let copies = if e < 4 {
                    let copy = |l: LinearTarget, width: u64| any(&[l]) * 4 * bs * width;
                    copy(LinearTarget::Q, h)
                        + copy(LinearTarget::K, h)
                        + copy(LinearTarget::V, h)
                        + copy(LinearTarget::O, q)
                        + copy(LinearTarget::Gate, h)
                        + copy(LinearTarget::Up, h)
                        + copy(LinearTarget::Down, i)
                } else {
                    4 * bs * h * any(&[LinearTarget::Q, LinearTarget::K, LinearTarget::V])
                        + 4 * bs * h * any(&[LinearTarget::Gate, LinearTarget::Up])
                        + 4 * bs * i * any(&[LinearTarget::Down])
                };
                let adapters = copies + products;
                // SwiGLU keeps gate, silu(gate) and up; their product only for down's adapter
                // (counted above).
                let mlp = 3 * e * bs * i;
                let other = 2 * norm_input + attention + adapters + mlp;
                // The first layer's input comes from the frozen embedding: an operation keeps
                // its inputs only when one of them depends on an adapter.
                let attention_trains = [LinearTarget::Q, LinearTarget::K, LinearTarget::V]
                    .into_iter()
                    .any(adapted);
                let h_trains = attention_trains || adapted(LinearTarget::O);
                let gate_trains = h_trains || adapted(LinearTarget::Gate);
                let up_trains = h_trains || adapted(LinearTarget::Up);
                let first_mlp = e * bs * i * (u64::from(gate_trains) * 2 + u64::from(up_trains));
                let first = adapters
                    + if attention_trains { attention } else { 0 }
                    + if h_trains { norm_input } else { 0 }
                    + first_mlp;
                Kept {
                    first,
                    other,
                    final_norm: norm_input,
                    formula: format!(
                        "{} layers × (norms 2·(4·b·t·{h} + 4·b·t) + attention {e}·b·t·(2·{q} + 2·{kv_used}) + {attention_extra} + float32 copies of the adapted layers' inputs and their products with A ({adapters} B) + MLP 3·{e}·b·t·{i}), the first layer keeping only what depends on an adapter (frozen embedding)",
                        s.layers
                    ),
                }
            }
            _ => {
                let norm = norm_input + 2 * e * bs * h;
                let mlp = 4 * e * bs * i;
                let layer = 2 * norm + attention + mlp;
                Kept {
                    first: layer,
                    other: layer,
                    final_norm: norm,
                    formula: format!(
                        "{} layers × (norms 2·(b·t·{h}·(4 + 2·{e}) + 4·b·t) + attention {e}·b·t·(2·{q} + 2·{kv_used}) + {attention_extra} + MLP 4·{e}·b·t·{i})",
                        s.layers
                    ),
                }
            }
        }
    }

    fn all_layers(&self, layers: u64) -> u64 {
        self.first + (layers - 1) * self.other
    }
}
