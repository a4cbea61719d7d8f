//! transformers' attention masks (`masking_utils`) for SDPA, as allocations: the 2-D mask as
//! booleans, the check that lets SDPA run causal without a mask (`fast_all`), the check for
//! packed sequences in training, and the boolean mask built when a sliding window must be
//! applied (the window reached) or rows are padded, held for the forward's layers of that kind.

use super::cache::Cache;
use super::decoder::Decoder;
use super::process::{MaskOrder, Process};
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::model::ModelType;
use smallvec::smallvec;

/// One forward's masks, by attention kind (`None`: SDPA runs causal without a mask).
#[derive(Default)]
pub struct Masks {
    pub full: Option<Tensor>,
    pub sliding: Option<Tensor>,
}

impl Masks {
    pub fn for_window(&self, window: Option<u64>) -> Option<&Tensor> {
        match window {
            None => self.full.as_ref(),
            Some(_) => self.sliding.as_ref(),
        }
    }
}

impl Decoder<'_> {
    /// The masks a model's forward creates for `q` new positions (`mask`: the 2-D attention
    /// mask `generate` passes; none in training).
    pub(super) fn masks(
        &mut self,
        mask: Option<&Tensor>,
        cache: Option<&Cache>,
        b: u64,
        q: u64,
    ) -> Masks {
        let m = self.model;
        let sliding_window = m.layers.iter().find_map(|l| l.window);
        // Which mask functions the model's forward calls. Beside a vision tower,
        // `create_masks_for_generate` makes one mask per kind of layer present, in the order the
        // process iterates `set(layer_types)`.
        let sliding_first = self.process.mask_order == MaskOrder::SlidingFirst;
        let (causal, sliding, sliding_first) = match m.model_type {
            _ if m.vision.is_some() => (
                m.has_global_layers(),
                sliding_window.is_some(),
                sliding_first,
            ),
            ModelType::Gemma2 | ModelType::Gemma3Text => (true, true, false),
            ModelType::Qwen2 | ModelType::Qwen3 => (true, sliding_window.is_some(), false),
            ModelType::Mistral
            | ModelType::Mixtral
            | ModelType::Phi3
            | ModelType::Qwen3Moe
            | ModelType::Starcoder2 => (sliding_window.is_none(), sliding_window.is_some(), false),
            _ => (true, false, false),
        };
        let mut masks = Masks::default();
        for make_sliding in [sliding_first, !sliding_first] {
            if make_sliding && sliding {
                let w = sliding_window.unwrap_or(0);
                let seen = cache.map_or(0, |c| c.seen(Some(w)));
                // DynamicSlidingWindowLayer.get_mask_sizes: at most the window's keys.
                let kv = if seen >= w { w - 1 + q } else { seen + q };
                masks.sliding = self.create_mask(mask, cache.is_none(), b, q, kv, Some(w));
            } else if !make_sliding && causal {
                let past = cache.map_or(0, |c| c.seen(None));
                masks.full = self.create_mask(mask, cache.is_none(), b, q, past + q, None);
            }
        }
        masks
    }

    /// `create_causal_mask` / `create_sliding_window_causal_mask`.
    fn create_mask(
        &mut self,
        mask: Option<&Tensor>,
        no_cache: bool,
        b: u64,
        q: u64,
        kv: u64,
        window: Option<u64>,
    ) -> Option<Tensor> {
        let p = &mut *self.process;
        let mut packed = None;
        let padding = match mask {
            Some(m) => Some(p.empty(&m.shape, Dtype::Bool)),
            None => {
                if no_cache {
                    packed = self.packed_sequences(b, q);
                }
                None
            }
        };
        if packed.is_some() {
            // Sequences packed in a row: the causal function and theirs (each query sees its
            // own sequence's keys), the sequence indices let go once the mask is made.
            let built = self.packed_causal_mask(b, q, kv);
            drop(packed);
            return Some(built);
        }
        let p = &mut *self.process;
        // A longer mask than the keys (a sliding layer past its window) is indexed down.
        let padding = padding.map(|pm| {
            if pm.size(-1) > kv {
                let indices = p.empty(&[kv], Dtype::Int64);
                let sliced = p.empty(&[b, kv], Dtype::Bool);
                drop(indices);
                drop(pm);
                sliced
            } else {
                pm
            }
        });
        let must_build = window.is_some_and(|w| kv >= w);
        let built = match &padding {
            _ if must_build => {
                Some(self.sliding_mask(padding.as_ref(), b, q, kv, window.unwrap_or(0)))
            }
            // `_ignore_causal_mask_sdpa`: the mask all ones lets SDPA run causal.
            Some(pm) if !self.process.padded => {
                self.fast_all(pm);
                None
            }
            // A padded one is checked again for more than one query, then built.
            Some(pm) => {
                self.fast_all(pm);
                if q > 1 {
                    self.fast_all(pm);
                }
                Some(match window {
                    None => self.padded_causal_mask(b, q, kv),
                    // A window not reached yet: the same mask function as past it.
                    Some(w) => self.sliding_mask(Some(pm), b, q, kv, w),
                })
            }
            None => None,
        };
        drop(padding);
        built
    }

    /// `fast_all(padding_mask)`: a sum through int64 compared with the count.
    fn fast_all(&mut self, padding: &Tensor) {
        let p = &mut *self.process;
        let sum = p.empty(&[], Dtype::Int64);
        let widened = p.empty(&padding.shape, Dtype::Int64);
        drop(widened);
        let equal = p.empty(&[], Dtype::Bool);
        drop(sum);
        drop(equal);
    }

    /// `sdpa_mask` of the causal function and the padding: the index ranges (queries', then
    /// keys'), the causal `[q, kv]` and the padding's `[b, 1, q, kv]` combined in turn.
    fn padded_causal_mask(&mut self, b: u64, q: u64, kv: u64) -> Tensor {
        self.causal_mask_and(b, q, kv, and_padding)
    }

    /// `sdpa_mask` of the causal function and the packed sequences': the index ranges, the
    /// causal `[q, kv]`, then `packed[batch_idx, q_idx] == packed[batch_idx, kv_idx]` (each
    /// side gathered through its broadcast index) and-ed as the `[b, 1, q, kv]` mask.
    fn packed_causal_mask(&mut self, b: u64, q: u64, kv: u64) -> Tensor {
        self.causal_mask_and(b, q, kv, |p, causal, b, q, kv| {
            let index = p.empty(&[b, 1, q, 1], Dtype::Int64);
            let queries = p.empty(&[b, 1, q, 1], Dtype::Int64);
            drop(index);
            let index = p.empty(&[b, 1, 1, kv], Dtype::Int64);
            let keys = p.empty(&[b, 1, 1, kv], Dtype::Int64);
            drop(index);
            let same = p.empty(&[b, 1, q, kv], Dtype::Bool);
            drop(queries);
            drop(keys);
            let full = p.empty(&[b, 1, q, kv], Dtype::Bool);
            drop(same);
            drop(causal);
            full
        })
    }

    /// `sdpa_mask` of the causal function and one more, `and` combining the causal `[q, kv]`
    /// with it into the `[b, 1, q, kv]` mask: the index ranges (queries', then keys') made first
    /// and let go last.
    fn causal_mask_and(
        &mut self,
        b: u64,
        q: u64,
        kv: u64,
        and: impl FnOnce(&mut Process, Tensor, u64, u64, u64) -> Tensor,
    ) -> Tensor {
        let p = &mut *self.process;
        let batch = p.empty(&[b], Dtype::Int64);
        let head = p.empty(&[1], Dtype::Int64);
        let q_range = p.empty(&[q], Dtype::Int64);
        let q_arange = p.empty(&[q], Dtype::Int64);
        drop(q_range);
        let kv_range = p.empty(&[kv], Dtype::Int64);
        let kv_arange = p.empty(&[kv], Dtype::Int64);
        drop(kv_range);
        // and_masks: a true scalar, and with kv_idx <= q_idx.
        let start = p.empty(&[], Dtype::Bool);
        let causal_fn = p.empty(&[q, kv], Dtype::Bool);
        let causal = p.empty(&[q, kv], Dtype::Bool);
        drop(causal_fn);
        drop(start);
        let full = and(p, causal, b, q, kv);
        drop(batch);
        drop(head);
        drop(q_arange);
        drop(kv_arange);
        full
    }

    /// `sdpa_mask` with the sliding-window overlay, the causal function and the padding: the
    /// index ranges, then each function's boolean `[q, kv]` combined in turn, the padding's
    /// `[b, 1, q, kv]` last.
    fn sliding_mask(
        &mut self,
        padding: Option<&Tensor>,
        b: u64,
        q: u64,
        kv: u64,
        _window: u64,
    ) -> Tensor {
        let p = &mut *self.process;
        let batch = p.empty(&[b], Dtype::Int64);
        let head = p.empty(&[1], Dtype::Int64);
        let kv_range = p.empty(&[kv], Dtype::Int64);
        let kv_arange = p.empty(&[kv], Dtype::Int64);
        drop(kv_range);
        let q_range = p.empty(&[q], Dtype::Int64);
        let q_arange = p.empty(&[q], Dtype::Int64);
        drop(q_range);
        let outer = p.empty(&[], Dtype::Bool);
        let inner = p.empty(&[], Dtype::Bool);
        // The window: kv_idx > q_idx - window.
        let shifted = p.empty(&[q, 1], Dtype::Int64);
        let window = p.empty(&[q, kv], Dtype::Bool);
        drop(shifted);
        let r1 = p.empty(&[q, kv], Dtype::Bool);
        drop(window);
        drop(inner);
        // Causal: kv_idx <= q_idx.
        let causal = p.empty(&[q, kv], Dtype::Bool);
        let r2 = p.empty(&[q, kv], Dtype::Bool);
        drop(causal);
        drop(r1);
        let combined = p.empty(&[q, kv], Dtype::Bool);
        drop(r2);
        drop(outer);
        let out = match padding {
            Some(_) => and_padding(p, combined, b, q, kv),
            None => combined.restrided(smallvec![b, 1, q, kv], smallvec![0, q * kv, kv, 1]),
        };
        drop(batch);
        drop(head);
        drop(kv_arange);
        drop(q_arange);
        out
    }
}

/// The padding's mask function and-ed last: `padding_mask[batch_idx, kv_idx]` gathered as
/// `[b, kv]` booleans, then `combined` (`[q, kv]`) and it as the `[b, 1, q, kv]` mask.
fn and_padding(p: &mut Process, combined: Tensor, b: u64, q: u64, kv: u64) -> Tensor {
    let index = p.empty(&[b, kv], Dtype::Int64);
    let index2 = (b > 1).then(|| p.empty(&[b, kv], Dtype::Int64));
    let padded = p.empty(&[b, kv], Dtype::Bool);
    drop(index2);
    drop(index);
    let full = p.empty(&[b, 1, q, kv], Dtype::Bool);
    drop(padded);
    drop(combined);
    full
}
