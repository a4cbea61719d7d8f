//! DeepSeek's multi-head latent attention as transformers 5.17 runs it: the queries (through
//! their compression or one projection), the compressed keys and values with their rotary part,
//! the latent and the rotary key cached (`[b, 1, S, rank]` and `[b, 1, S, rope]`, the cache's
//! "keys" and "values"), then every forward expands the whole cached sequence back to per-head
//! keys and values (`kv_b_proj`) for SDPA. DeepSeek-V2 rotates through complex numbers, V3 with
//! interleaved pairs.

use super::cache::Cache;
use super::decoder::{joined, layer_prefix, Decoder, Rope};
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::model::Latent;

impl Decoder<'_> {
    /// The latent attention of layer `layer` on `x [b, t, h]`.
    pub(super) fn latent_attention(
        &mut self,
        layer: usize,
        x: &Tensor,
        rope: &Rope,
        mask: Option<&Tensor>,
        cache: Option<&mut Cache>,
        m: Latent,
    ) -> Tensor {
        let heads = self.model.heads;
        let a = joined(&[&layer_prefix(self.model, layer), ".self_attn"]);
        let (b, t) = (x.shape[0], x.shape[1]);
        let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let q_proj = match m.q_lora_rank {
            None => self.linear(&joined(&[&a, ".q_proj"]), x),
            Some(_) => {
                let compressed = self.linear(&joined(&[&a, ".q_a_proj"]), x);
                let w = self.weights_tensor(&joined(&[&a, ".q_a_layernorm.weight"]));
                let normed = self.norm(&compressed, &w);
                drop(compressed);
                let q = self.linear(&joined(&[&a, ".q_b_proj"]), &normed);
                drop(normed);
                q
            }
        };
        let p = &mut *self.process;
        let viewed = p.reshape(&q_proj, &[b, t, heads, qk]);
        let q = p.transpose(&viewed, 1, 2);
        drop(viewed);
        let (q_nope, q_pe) = p.split2(&q, m.qk_nope_head_dim);
        drop(q);
        let compressed_kv = self.linear(&joined(&[&a, ".kv_a_proj_with_mqa"]), x);
        let (kv_nope, k_pe) = self.process.split2(&compressed_kv, m.kv_lora_rank);
        let w = self.weights_tensor(&joined(&[&a, ".kv_a_layernorm.weight"]));
        let normed = self.norm(&kv_nope, &w);
        drop(kv_nope);
        let latent = self.process.reshape(&normed, &[b, 1, t, m.kv_lora_rank]);
        drop(normed);
        let k_pe4 = self.process.reshape(&k_pe, &[b, 1, t, m.qk_rope_head_dim]);
        drop(k_pe);
        let (q_rot, k_rot) = match rope {
            Rope::Complex(freqs) => self.complex_rotary(&q_pe, &k_pe4, freqs),
            Rope::Real(cos, sin) => {
                let q_rot = self.interleaved_rotary(&q_pe, cos, sin);
                let k_rot = self.interleaved_rotary(&k_pe4, cos, sin);
                (q_rot, k_rot)
            }
        };
        drop(q_pe);
        drop(k_pe4);
        let (latent, k_rot) = match cache {
            Some(c) => {
                let kv = c.update(self.process, layer, &latent, &k_rot);
                drop(latent);
                drop(k_rot);
                kv
            }
            None => (latent, k_rot),
        };
        let query = self.process.cat(&[&q_nope, &q_rot], -1);
        let (keys, values, expanded) = self.expand_kv(&a, &latent, &k_rot, m);
        let heads_out = self.process.cudnn_attention(&query, &keys, &values, mask);
        let attn = self.merge_heads(heads_out, b, t);
        let out = self.linear(&joined(&[&a, ".o_proj"]), &attn);
        drop(attn);
        // The attention's locals at its return.
        for t in [
            q_proj,
            q_nope,
            q_rot,
            compressed_kv,
            latent,
            k_rot,
            query,
            keys,
            values,
            expanded,
        ] {
            drop(t);
        }
        out
    }

    /// `expand_kv`: the cached latent through `kv_b_proj` (`[b, H, S, nope + v]`), the keys
    /// assembled in a new tensor (the rotary key expanded to every head), the values a view.
    fn expand_kv(
        &mut self,
        a: &str,
        latent: &Tensor,
        k_rot: &Tensor,
        m: Latent,
    ) -> (Tensor, Tensor, Tensor) {
        let heads = self.model.heads;
        let (b, s) = (latent.shape[0], latent.shape[2]);
        let kv = self.linear(&joined(&[a, ".kv_b_proj"]), latent);
        let p = &mut *self.process;
        let viewed = p.reshape(&kv, &[b, s, heads, m.qk_nope_head_dim + m.v_head_dim]);
        let swapped = p.transpose(&viewed, 1, 2);
        drop(viewed);
        let (k_nope, values) = p.split2(&swapped, m.qk_nope_head_dim);
        drop(swapped);
        let expanded = p.expand(k_rot, &[b, heads, s, m.qk_rope_head_dim]);
        let keys = p.assemble(&[&k_nope, &expanded], -1);
        drop(expanded);
        drop(k_nope);
        (keys, values, kv)
    }

    /// DeepSeek-V2's `apply_rotary_emb`: queries and key in float32 as complex pairs, times the
    /// frequencies, cast back.
    fn complex_rotary(&mut self, q: &Tensor, k: &Tensor, freqs: &Tensor) -> (Tensor, Tensor) {
        let p = &mut *self.process;
        let qf = p.to(q, Dtype::Float32);
        let kf = p.to(k, Dtype::Float32);
        let f = p.unsqueeze(freqs, 1);
        let qm = p.mul(&qf, &f);
        let q_out = p.to(&qm, q.elem);
        drop(qm);
        let km = p.mul(&kf, &f);
        let k_out = p.to(&km, k.elem);
        drop(km);
        drop(f);
        drop(qf);
        drop(kf);
        (q_out, k_out)
    }

    /// DeepSeek-V3's `apply_rotary_pos_emb_interleave` on `x`: even and odd lanes (strided
    /// views), `cat([x1·cos − x2·sin, x2·cos + x1·sin])`.
    fn interleaved_rotary(&mut self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let p = &mut *self.process;
        let half = x.size(-1) / 2;
        let c = p.slice(cos, -1, 0, half);
        let c = p.unsqueeze(&c, 1);
        let s = p.slice(sin, -1, 0, half);
        let s = p.unsqueeze(&s, 1);
        let x1 = p.slice(x, -1, 0, half);
        let x2 = p.slice(x, -1, half, 2 * half);
        let a = p.mul(&x1, &c);
        let bb = p.mul(&x2, &s);
        let first = p.add(&a, &bb);
        drop(bb);
        drop(a);
        let a = p.mul(&x2, &c);
        let bb = p.mul(&x1, &s);
        let second = p.add(&a, &bb);
        drop(bb);
        drop(a);
        let out = p.cat(&[&first, &second], -1);
        drop(first);
        drop(second);
        out
    }

    /// DeepSeek-V2's rotary embedding: `polar(ones, freqs) * scaling`, complex64 `[b, t, rope/2]`
    /// (held as float32 pairs: `[b, t, rope]`).
    pub(super) fn complex_frequencies(&mut self, positions: &Tensor) -> Tensor {
        let (b, t) = (positions.shape[0], positions.shape[1]);
        let half = self.model.rotary_dim.div_ceil(2);
        let p = &mut *self.process;
        let pos = p.empty(&[b, 1, t], Dtype::Float32);
        let freqs = p.product(&[b, half, t], Dtype::Float32);
        let ones = p.empty(&[b, t, half], Dtype::Float32);
        let polar = p.empty(&[b, t, 2 * half], Dtype::Float32);
        drop(ones);
        let scaled = p.empty(&[b, t, 2 * half], Dtype::Float32);
        drop(polar);
        drop(pos);
        drop(freqs);
        scaled
    }
}
