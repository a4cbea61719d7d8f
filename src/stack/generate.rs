//! `model.generate(ids, attention_mask=mask, max_new_tokens=n)` as transformers 5.17 runs it
//! with its default `DynamicCache`: the positions made from the mask, the prefill (the last
//! position's logits), then each new token's forward, the float32 copy of its logits (processed
//! by the repetition penalty where one is asked for, then by sampling's warpers), the greedy
//! choice or the draw from the softmax (`do_sample`, [`super::sampling`]), and the ids, mask and
//! positions grown by one.

use super::cache::Cache;
use super::decoder::{Decoder, Inputs};
use super::sampling::{self, Sampling};
use super::tensor::Tensor;
use crate::dtype::Dtype;

/// Where `generate` is, for the stages of a run.
pub trait Stages {
    /// The first token's logits are being processed: the prefill ends, the decode begins.
    fn prefill_done(&mut self, decoder: &mut Decoder);
}

/// What `generate` is asked for beyond the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// `max_new_tokens` (or `max_length` less the prompt).
    pub new_tokens: u64,
    /// `repetition_penalty` other than 1: `RepetitionPenaltyLogitsProcessor` on every token's
    /// logits.
    pub repetition_penalty: bool,
    /// `do_sample=True`: the warpers it runs (greedy decoding where none).
    pub sampling: Option<Sampling>,
}

/// Runs `generate` after the prompt `ids` (`[b, t]` int64) and its attention `mask`.
pub fn generate(
    d: &mut Decoder,
    ids: &Tensor,
    mask: &Tensor,
    options: Options,
    stages: &mut dyn Stages,
) {
    let new_tokens = options.new_tokens;
    let (b, t) = (ids.shape[0], ids.shape[1]);
    let windows: Vec<Option<u64>> = d.model.layers.iter().map(|l| l.window).collect();
    let mut cache = Cache::new(&windows);
    let p = &mut *d.process;
    // The special tokens as tensors (the padding token), kept to the end.
    let pad = p.empty(&[1], Dtype::Int64);
    let pad2 = p.empty(&[1], Dtype::Int64);
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
    let mut positions = p.empty(&[b, t], Dtype::Int64);
    // The prompt's positions stay referenced (by generate's own arguments) to the end.
    let prompt_positions = positions.clone();
    drop(zero);
    drop(shifted);
    let mut unfinished = p.empty(&[b], Dtype::Int64);
    let mut ids = ids.clone();
    let mut mask = mask.clone();
    let mut next_logits: Option<Tensor> = None;
    let mut next_tokens: Option<Tensor> = None;
    // The logits processors' output (`next_token_scores`) where one makes a new tensor.
    let mut scores: Option<Tensor> = None;
    // Sampling's probabilities.
    let mut probs: Option<Tensor> = None;
    // The last step's inputs (`model_inputs`), held until the next step's are made.
    let mut inputs: Option<(Tensor, Tensor, Tensor)> = None;
    for (step, length) in (0..new_tokens).zip(t..) {
        let out = if step == 0 {
            // _prefill: its own inputs (the ids cloned), gone when it returns.
            let input = d.process.clone_contiguous(&ids);
            let out = d.forward(Inputs {
                ids: &input,
                mask: Some(&mask),
                positions: Some(&positions),
                cache: Some(&mut cache),
                keep_last: true,
                labels: None,
                items: None,
            });
            drop(input);
            out
        } else {
            // prepare_inputs_for_generation: the last id and position, cloned.
            let i = d.process.empty(&[b, 1], Dtype::Int64);
            let q = d.process.empty(&[b, 1], Dtype::Int64);
            drop(inputs.take());
            let out = d.forward(Inputs {
                ids: &i,
                mask: Some(&mask),
                positions: Some(&q),
                cache: Some(&mut cache),
                keep_last: true,
                labels: None,
                items: None,
            });
            inputs = Some((i, q, mask.clone()));
            out
        };
        let p = &mut *d.process;
        // _update_model_kwargs_for_generation: arange(1) + positions[..., -1:] + 1 and the cat;
        // the mask grown by ones; the old positions go at its return.
        let range = p.empty(&[1], Dtype::Int64);
        let plus = p.empty(&[b, 1], Dtype::Int64);
        drop(range);
        let one = p.empty(&[b, 1], Dtype::Int64);
        drop(plus);
        let grown = p.empty(&[b, length + 1], Dtype::Int64);
        drop(one);
        let old_positions = std::mem::replace(&mut positions, grown);
        let ones = p.empty(&[b, 1], Dtype::Int64);
        let grown_mask = p.empty(&[b, length + 1], Dtype::Int64);
        drop(ones);
        mask = grown_mask;
        drop(old_positions);
        // next_token_logits = logits[:, -1].to(float32, copy=True)
        let vocab = out.logits.size(-1);
        next_logits = Some(p.empty(&[b, vocab], Dtype::Float32));
        // The logits processors, each output replacing the chain's last (let go once the next
        // returns); the last becomes the step's scores, the previous step's let go.
        let mut processed: Option<Tensor> = None;
        if options.repetition_penalty {
            // The logits of the tokens seen so far gathered, penalized (`torch.where(score < 0,
            // score * penalty, score / penalty)`), scattered into a copy of the logits.
            let seen = p.empty(&[b, length], Dtype::Float32);
            let negative = p.empty(&[b, length], Dtype::Bool);
            let multiplied = p.empty(&[b, length], Dtype::Float32);
            let divided = p.empty(&[b, length], Dtype::Float32);
            let penalized = p.empty(&[b, length], Dtype::Float32);
            drop((negative, multiplied, divided, seen));
            processed = Some(p.empty(&[b, vocab], Dtype::Float32));
            drop(penalized);
        }
        if step == 0 {
            // The proof script marks the prefill's end in a processor of its own, after
            // transformers' processors and before sampling's warpers.
            stages.prefill_done(d);
            // `_optimize_model_for_decode`: on a GPU, experts run as batched products.
            d.experts_path = super::decoder::ExpertsPath::Batched;
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
                sampling::multinomial(p, b, vocab)
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
    drop(pad2);
    drop(pad);
}
