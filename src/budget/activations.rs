//! Activation memory of a Llama-style decoder layer, derived from what each operation keeps:
//! for training, the tensors autograd saves for backward; for inference, the tensors alive at
//! once inside one layer. Derived for the computation of this project's synthetic transformer
//! (RMSNorm in float32, SwiGLU MLP, attention with or without a fused kernel, float32 loss) and
//! checked on the GPU (`docs/benchmarks.md`, "Budgets on the GPU"); other implementations keep
//! other tensors, hence the status `estimated`.

use super::workload::{Mode, Workload};

/// The activation terms of a workload and the moment of its peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activations {
    pub bytes: u64,
    pub formula: String,
    /// Logits, loss and their gradients (0 where negligible).
    pub logits_bytes: u64,
    pub logits_formula: String,
    /// The LM head's gradient, made at the start of backward (full training).
    pub head_gradient: u64,
    /// Working memory of the last part of backward, when every gradient exists.
    pub backward_end_bytes: u64,
    pub source: String,
    pub bound: String,
    pub peak_rule: String,
}

/// Where the formulas come from, said beside every term that uses them.
pub const SOURCE: &str = "derived from the tensors each operation keeps (this project's synthetic \
transformer; cf. Korthikanti et al. 2022 for a GPT layer), see docs/allocator-model.md";

/// The activation terms of a validated workload.
pub fn estimate(w: &Workload) -> Activations {
    let s = &w.shape;
    let (b, t, e) = (w.batch, w.context, w.dtype.bytes());
    let bs = b * t;
    let (h, q, kv, i, v) = (
        s.hidden,
        s.q_dim(),
        s.kv_dim(),
        s.intermediate * s.experts_per_token,
        s.vocab,
    );
    // Without a fused kernel the softmax output [batch, heads, t, t] is kept, in the dtype, and
    // grouped K and V are expanded to every query head.
    let scores = if w.flash_attention {
        0
    } else {
        e * b * s.heads * t * t
    };
    let kv_kept = if w.flash_attention { kv } else { q };
    match &w.mode {
        Mode::Inference { .. } => {
            // Prefill of the whole prompt, no autograd: inside the MLP the residual stream, the
            // attention block's output, the normalised input, gate, up, silu(gate) and their
            // product are alive at once; inside the norm three float32 copies.
            let mlp = e * bs * (3 * h + 4 * i);
            let norm = e * bs * 2 * h + 4 * bs * h * 3;
            let attention = e * bs * (3 * h + 2 * q + 2 * kv) + scores;
            let bytes = mlp.max(norm).max(attention);
            let logits = b * v * (e + 4);
            Activations {
                bytes,
                formula: format!(
                    "prefill of {t} tokens, the largest working set of one layer: max(MLP {e}·b·t·(3·{h} + 4·{i}), \
                     attention {e}·b·t·(3·{h} + 2·{q} + 2·{kv}){}, norm) with b·t = {bs}",
                    if scores > 0 { " + scores e·b·heads·t²" } else { "" }
                ),
                logits_bytes: logits,
                logits_formula: format!("last position only: batch {b} × vocab {v} × ({e} + 4 float32) B"),
                head_gradient: 0,
                backward_end_bytes: 0,
                source: SOURCE.into(),
                bound: "not yet checked on a GPU".into(),
                peak_rule: "weights + KV cache + the prefill's largest working set + last logits + workspace".into(),
            }
        }
        Mode::Full { .. } | Mode::Lora { .. } => {
            let lora = matches!(w.mode, Mode::Lora { .. });
            // Per layer, for backward: each RMSNorm keeps its float32 input and its normalised
            // output in the dtype (and a float32 factor per token); attention keeps Q, K, V, its
            // output and the float32 log-sum-exp per head and token; the MLP keeps gate,
            // silu(gate), up and their product.
            let norms = 2 * (bs * h * (4 + e) + 4 * bs);
            let attention = e * bs * (2 * q + 2 * kv_kept) + 4 * b * s.heads * t + scores;
            let mlp = 4 * e * bs * i;
            let layer = norms + attention + mlp;
            let (bytes, formula) = if w.checkpointing {
                (
                    s.layers * e * bs * h + layer,
                    format!(
                        "full recomputation: each of {} layers keeps its input ({e}·b·t·{h}) + one layer recomputed ({layer} B) with b·t = {bs}",
                        s.layers
                    ),
                )
            } else {
                (
                    s.layers * layer,
                    format!(
                        "{} layers × (norms 2·b·t·{h}·(4+{e}) + attention {e}·b·t·(2·{q} + 2·{kv_kept}) + 4·b·heads·t{} + MLP 4·{e}·b·t·{i}) with b·t = {bs}",
                        s.layers,
                        if scores > 0 { " + e·b·heads·t²" } else { "" }
                    ),
                )
            };
            // The loss in float32: log-probabilities kept, then at the start of backward their
            // gradient and the logits' gradient, all [b·t, vocab] float32; plus the final norm.
            let logits = 12 * bs * v + bs * h * (4 + e) + 4 * bs;
            let head_gradient = if lora { 0 } else { v * h * e };
            Activations {
                bytes,
                formula,
                logits_bytes: logits,
                logits_formula: format!(
                    "final norm + log-probabilities, their gradient and the logits' gradient: 3 × b·t {bs} × vocab {v} × 4 B"
                ),
                head_gradient,
                backward_end_bytes: e * bs * h,
                source: SOURCE.into(),
                bound: "not yet checked on a GPU".into(),
                peak_rule: "persistent states + the larger of two moments: the start of backward (every saved activation, the loss's gradients, the LM head's gradient) and the end of backward or the optimizer step (every gradient, the last working memory)".into(),
            }
        }
    }
}
