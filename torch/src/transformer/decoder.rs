//! The forward pass, Llama style, written as Hugging Face's `LlamaForCausalLM` computes it: per
//! layer `h = x + o_proj(attention(rmsnorm(x)))`, `out = h + down(silu(gate(n)) * up(n))` with
//! `n = rmsnorm(h)`; RMSNorm in float32; then the final norm and the LM head. Temporaries are
//! dropped where Python would free them. Autograd records whatever needs a gradient (nothing
//! under `no_grad`).
//!
//! Rotary position embedding is left out: it rewrites q and k through temporaries of their own
//! size and changes no other memory term.

use super::in_place;
use super::model::{Layer, Linear, Model};
use tch::{Kind, Reduction, TchError, Tensor};

/// RMSNorm's epsilon.
const EPS: f64 = 1e-5;

/// Where a layer's attention finds its keys and values.
pub enum Keys<'a> {
    /// Training: this pass's own keys and values, attended causally.
    Fresh,
    /// Inference: written into the layer's preallocated cache `[batch, kv_heads, positions,
    /// head_dim]` at position `start`, then attended over the cache's first `start + len`
    /// positions. A prompt starts at 0 (causal); a decode step is one token (no mask).
    Cache {
        k: &'a Tensor,
        v: &'a Tensor,
        start: i64,
    },
}

/// The model's forward computations.
pub struct Decoder<'a> {
    pub model: &'a Model,
    /// `scaled_dot_product_attention` instead of the explicit scores.
    pub flash: bool,
}

/// `weight * (x32 * rsqrt(mean(x32², -1) + eps)).to(dtype)` with `x32 = x.to(float32)`.
fn rms_norm(x: &Tensor, weight: &Tensor, kind: Kind) -> Result<Tensor, TchError> {
    let x32 = x.f_to_kind(Kind::Float)?;
    let variance = x32.f_square()?.f_mean_dim(-1i64, true, None::<Kind>)?;
    let normed = x32.f_mul(&variance.f_add_scalar(EPS)?.f_rsqrt()?)?;
    drop((x32, variance));
    weight.f_mul(&normed.f_to_kind(kind)?)
}

impl Linear {
    /// `x Wᵀ (+ b)`, plus the adapter's `(x.to(float32) Aᵀ Bᵀ · scale).to(dtype)` when there is one.
    fn forward(&self, x: &Tensor, kind: Kind) -> Result<Tensor, TchError> {
        let base = x.f_linear(&self.weight, self.bias.as_ref())?;
        let Some(adapter) = &self.adapter else {
            return Ok(base);
        };
        let low = x
            .f_to_kind(Kind::Float)?
            .f_linear::<Tensor>(&adapter.a, None)?;
        let delta = low
            .f_linear::<Tensor>(&adapter.b, None)?
            .f_mul_scalar(adapter.scale)?
            .f_to_kind(kind)?;
        drop(low);
        base.f_add(&delta)
    }
}

/// K or V repeated from `kv_heads` to `heads` along dim 1 (Hugging Face's `repeat_kv`).
fn repeat_kv(t: Tensor, groups: i64) -> Result<Tensor, TchError> {
    if groups == 1 {
        Ok(t)
    } else {
        t.f_repeat_interleave_self_int(groups, 1, None::<i64>)
    }
}

impl Decoder<'_> {
    fn kind(&self) -> Kind {
        self.model.kind
    }

    /// The embeddings `[batch, len, hidden]` of token ids `[batch, len]`.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor, TchError> {
        Tensor::f_embedding(&self.model.embed, ids, -1, false, false)
    }

    /// One decoder layer.
    pub fn layer(&self, layer: &Layer, x: &Tensor, keys: Keys) -> Result<Tensor, TchError> {
        let normed = rms_norm(x, &layer.input_norm, self.kind())?;
        let attended = self.attention(layer, &normed, keys)?;
        drop(normed);
        let h = x.f_add(&attended)?;
        drop(attended);
        let normed = rms_norm(&h, &layer.post_norm, self.kind())?;
        let mlp = self.mlp(layer, &normed)?;
        drop(normed);
        h.f_add(&mlp)
    }

    /// `down(silu(gate(x)) * up(x))`.
    fn mlp(&self, layer: &Layer, x: &Tensor) -> Result<Tensor, TchError> {
        let gated = layer.gate.forward(x, self.kind())?.f_silu()?;
        let up = layer.up.forward(x, self.kind())?;
        let product = gated.f_mul(&up)?;
        drop((gated, up));
        layer.down.forward(&product, self.kind())
    }

    /// Self-attention of `x` `[batch, len, hidden]`, through `o_proj`.
    fn attention(&self, layer: &Layer, x: &Tensor, keys: Keys) -> Result<Tensor, TchError> {
        let shape = &self.model.shape;
        let (heads, kv_heads, head_dim) = (
            shape.heads as i64,
            shape.kv_heads as i64,
            shape.head_dim as i64,
        );
        let (batch, len, _) = x.size3()?;
        let project = |linear: &Linear, n: i64| -> Result<Tensor, TchError> {
            linear
                .forward(x, self.kind())?
                .f_view([batch, len, n, head_dim])?
                .f_transpose(1, 2)
        };
        let q = project(&layer.q, heads)?;
        let k = project(&layer.k, kv_heads)?;
        let v = project(&layer.v, kv_heads)?;
        let (k, v) = match keys {
            Keys::Fresh => (k, v),
            Keys::Cache {
                k: cache_k,
                v: cache_v,
                start,
            } => {
                if start > 0 && len > 1 {
                    return Err(TchError::Torch(
                        "internal error: several new tokens after a cached prefix need a \
                         bottom-right causal mask, which this bench does not build"
                            .into(),
                    ));
                }
                cache_k.f_narrow(2, start, len)?.f_copy_(&k)?;
                cache_v.f_narrow(2, start, len)?.f_copy_(&v)?;
                drop((k, v));
                (
                    cache_k.f_narrow(2, 0, start + len)?,
                    cache_v.f_narrow(2, 0, start + len)?,
                )
            }
        };
        // A single query attends to every position before it: no mask.
        let causal = len > 1;
        let groups = heads / kv_heads;
        let attended = if self.flash {
            // `enable_gqa` is honoured by the flash kernel alone (16-bit, head_dim ≤ 256); anywhere
            // else it would send SDPA to its math fallback, which materialises the scores. There k
            // and v are repeated to every head first, as Hugging Face does, so that the
            // memory-efficient kernel can run.
            let native_gqa = self.kind() != Kind::Float && head_dim <= 256;
            let (k, v) = if native_gqa {
                (k, v)
            } else {
                (repeat_kv(k, groups)?, repeat_kv(v, groups)?)
            };
            Tensor::f_scaled_dot_product_attention(
                &q,
                &k,
                &v,
                None::<Tensor>,
                0.0,
                causal,
                None::<f64>,
                native_gqa && groups > 1,
            )?
        } else {
            explicit_attention(&q, repeat_kv(k, groups)?, repeat_kv(v, groups)?, causal)?
        };
        drop(q);
        let merged = attended
            .f_transpose(1, 2)?
            .f_reshape([batch, len, heads * head_dim])?;
        drop(attended);
        layer.o.forward(&merged, self.kind())
    }

    /// The final norm of every position `[batch, len, hidden]`.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor, TchError> {
        rms_norm(x, &self.model.norm, self.kind())
    }

    /// Logits `[batch, len, vocab]` in the run's dtype.
    pub fn logits(&self, normed: &Tensor) -> Result<Tensor, TchError> {
        normed.f_linear::<Tensor>(self.model.lm_head(), None)
    }

    /// The training loss from the last layer's output: final norm, logits, then cross entropy
    /// over all positions in float32 (`logits.float()` then `cross_entropy`, as Hugging Face
    /// does), against `targets` `[batch, len]`.
    pub fn loss(&self, last: &Tensor, targets: &Tensor) -> Result<Tensor, TchError> {
        let normed = self.final_norm(last)?;
        let logits = self.logits(&normed)?;
        drop(normed);
        let logits32 = logits.f_to_kind(Kind::Float)?;
        drop(logits);
        logits32
            .f_view([-1, self.model.shape.vocab as i64])?
            .f_cross_entropy_loss::<Tensor>(
                &targets.f_view([-1])?,
                None,
                Reduction::Mean,
                -100,
                0.0,
            )
    }
}

/// `softmax(q kᵀ / √d, masked causally, in float32).to(dtype) v` with the `[batch, heads, len,
/// positions]` scores materialised, as Hugging Face's eager attention does (k and v already
/// repeated to every query head).
fn explicit_attention(q: &Tensor, k: Tensor, v: Tensor, causal: bool) -> Result<Tensor, TchError> {
    let (.., len, head_dim) = q.size4()?;
    let mut scores = q
        .f_matmul(&k.f_transpose(-2, -1)?)?
        .f_mul_scalar(1.0 / (head_dim as f64).sqrt())?;
    drop(k);
    if causal {
        let positions = scores.size()[3];
        let mut mask = Tensor::f_ones([len, positions], (Kind::Bool, q.device()))?;
        // Query i (of the last `len` positions) sees positions up to positions − len + i.
        in_place(mask.f_triu_(positions - len + 1))?;
        in_place(scores.f_masked_fill_(&mask, f64::NEG_INFINITY))?;
    }
    let probabilities = scores.f_softmax(-1, Kind::Float)?.f_to_kind(q.kind())?;
    drop(scores);
    probabilities.f_matmul(&v)
}
