//! `model.generate(ids, attention_mask=mask, max_new_tokens=n)` as transformers 5.17 runs it
//! with its default `DynamicCache`: the positions made from the mask, the prefill (the last
//! position's logits), then each new token's forward, the float32 copy of its logits (processed
//! by the repetition penalty where one is asked for, then by sampling's warpers), the greedy
//! choice or the draw from the softmax (`do_sample`, [`super::sampling`]), and the ids, mask and
//! positions grown by one. With `num_beams` above one the rows are repeated for each beam and
//! [`super::beams`] runs the search; with `cache_implementation="offloaded"` the cache keeps its
//! full layers on the CPU ([`super::cache`]).

use super::beams;
use super::cache::Cache;
use super::decoder::Decoder;
use super::decoding::{penalized, prefill_done, Kwargs};
pub use super::decoding::{Options, Stages};
use super::sampling;
use super::tensor::Tensor;
use crate::dtype::Dtype;

/// Runs `generate` after the prompt `ids` (`[b, t]` int64) and its attention `mask`.
pub fn generate(
    d: &mut Decoder,
    ids: &Tensor,
    mask: &Tensor,
    options: Options,
    stages: &mut dyn Stages,
) {
    let (b, t) = (ids.shape[0], ids.shape[1]);
    let windows: Vec<Option<u64>> = d.model.layers.iter().map(|l| l.window).collect();
    let mut cache = match options.offloaded_cache {
        true => Cache::offloaded(&windows),
        false => Cache::new(&windows),
    };
    let p = &mut *d.process;
    // The special tokens as tensors (`_prepare_special_tokens`: the model's beginning of
    // sequence if it names one, the padding token), kept to the end.
    let bos = d.model.bos_token.then(|| p.empty(&[1], Dtype::Int64));
    let pad = p.empty(&[1], Dtype::Int64);
    // The right-padding check: `attention_mask[:, -1] == 0`, `any`.
    let last = p.empty(&[b], Dtype::Bool);
    let any = p.empty(&[], Dtype::Bool);
    drop(last);
    drop(any);
    // position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    let cumsum = p.empty(&[b, t], Dtype::Int64);
    let shifted = p.empty(&[b, t], Dtype::Int64);
    drop(cumsum);
    let zero = p.empty(&[b, t], Dtype::Bool);
    let positions = p.empty(&[b, t], Dtype::Int64);
    drop(zero);
    drop(shifted);
    if options.beams > 1 {
        // _expand_inputs_for_generation: the ids, mask and positions repeated for each beam
        // (the prompt's positions let go), kept by generate to its end.
        let rows = b * options.beams;
        let ids = p.empty(&[rows, t], Dtype::Int64);
        let mask = p.empty(&[rows, t], Dtype::Int64);
        let expanded = p.empty(&[rows, t], Dtype::Int64);
        drop(positions);
        let positions = expanded;
        let kwargs = Kwargs::new(positions.clone(), mask.clone());
        let sequences = beams::search(d, &ids, kwargs, &mut cache, options, stages);
        d.experts_path = super::decoder::ExpertsPath::Grouped;
        drop((bos, pad, mask, positions));
        cache.drop_from_last();
        drop(ids);
        drop(sequences);
        return;
    }
    // The prompt's positions stay referenced (by generate's own arguments) to the end.
    let mut kwargs = Kwargs::new(positions.clone(), mask.clone());
    let prompt_positions = positions;
    let mut unfinished = p.empty(&[b], Dtype::Int64);
    let mut ids = ids.clone();
    let mut next_logits: Option<Tensor> = None;
    let mut next_tokens: Option<Tensor> = None;
    // The logits processors' output (`next_token_scores`) where one makes a new tensor.
    let mut scores: Option<Tensor> = None;
    // Sampling's probabilities.
    let mut probs: Option<Tensor> = None;
    for (step, length) in (0..options.new_tokens).zip(t..) {
        let out = kwargs.forward(d, step, &ids, &mut cache);
        let p = &mut *d.process;
        kwargs.grow(p, b, length);
        // next_token_logits = logits[:, -1].to(float32, copy=True)
        let vocab = out.logits.size(-1);
        next_logits = Some(p.empty(&[b, vocab], Dtype::Float32));
        // The logits processors, each output replacing the chain's last (let go once the next
        // returns); the last becomes the step's scores, the previous step's let go.
        let mut processed = options
            .repetition_penalty
            .then(|| penalized(p, b, length, vocab));
        if step == 0 {
            prefill_done(d, stages);
        }
        let p = &mut *d.process;
        if let Some(s) = options.sampling {
            sampling::warp(p, s, b, vocab, &mut processed);
        }
        if let Some(new) = processed {
            drop(scores.replace(new));
        }
        next_tokens = Some(match options.sampling {
            // probs = softmax(scores), held to the next step's; multinomial(probs, 1).squeeze(1)
            Some(_) => {
                drop(probs.replace(p.empty(&[b, vocab], Dtype::Float32)));
                sampling::multinomial(p, b, vocab, 1)
            }
            None => p.empty(&[b], Dtype::Int64),
        });
        ids = p.empty(&[b, length + 1], Dtype::Int64);
        // unfinished & ~stopping_criteria(ids): max length reached, per sequence.
        let full = p.empty(&[b], Dtype::Bool);
        let done = p.empty(&[b], Dtype::Bool);
        let is_done = p.empty(&[b], Dtype::Bool);
        drop(done);
        drop(full);
        let not = p.empty(&[b], Dtype::Bool);
        drop(is_done);
        let still = p.empty(&[b], Dtype::Int64);
        drop(not);
        unfinished = still;
        // StopCheck: `unfinished.max() == 0`.
        let max = p.empty(&[], Dtype::Int64);
        let stop = p.empty(&[], Dtype::Bool);
        drop(max);
        drop(stop);
        drop(out);
    }
    d.experts_path = super::decoder::ExpertsPath::Grouped;
    let Kwargs {
        positions,
        mask,
        inputs,
    } = kwargs;
    drop(inputs);
    drop(next_tokens);
    drop(prompt_positions);
    drop(next_logits);
    drop(scores);
    drop(probs);
    drop(positions);
    drop(mask);
    drop(ids);
    drop(unfinished);
    drop(cache);
    drop(pad);
    drop(bos);
}
