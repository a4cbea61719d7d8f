//! What `generate`'s decoding strategies (greedy, sampled, beams) share: the options asked for,
//! the stages marked, the model's arguments carried from step to step (each step's forward, the
//! positions and mask grown), the repetition penalty and the prefill's end.

use super::cache::Cache;
use super::decoder::{Decoder, Inputs, Output};
use super::process::Process;
use super::sampling::Sampling;
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
    /// `num_beams` (1: no beam search).
    pub beams: u64,
    /// The end-of-sequence tokens (`eos_token_id`: one id or a list; 0 for none).
    pub eos_tokens: u64,
    /// `cache_implementation="offloaded"`: the cache's full layers on the CPU between their
    /// updates.
    pub offloaded_cache: bool,
}

/// The model's arguments `generate` carries from step to step (`model_kwargs`).
pub(super) struct Kwargs {
    /// `position_ids`, grown by one each step.
    pub positions: Tensor,
    /// `attention_mask`, grown by one each step.
    pub mask: Tensor,
    /// The last step's inputs (`model_inputs`: the last ids and position, and the mask), held
    /// until the next step's are made.
    pub inputs: Option<(Tensor, Tensor, Tensor)>,
}

impl Kwargs {
    pub(super) fn new(positions: Tensor, mask: Tensor) -> Kwargs {
        Kwargs {
            positions,
            mask,
            inputs: None,
        }
    }

    /// Step `step`'s forward: the prefill over the prompt `ids`, then the last token's.
    pub(super) fn forward(
        &mut self,
        d: &mut Decoder,
        step: u64,
        ids: &Tensor,
        cache: &mut Cache,
    ) -> Output {
        let rows = ids.shape[0];
        if step == 0 {
            // _prefill: its own inputs (the ids cloned), gone when it returns.
            let input = d.process.clone_contiguous(ids);
            let out = d.forward(Inputs {
                ids: &input,
                mask: Some(&self.mask),
                positions: Some(&self.positions),
                cache: Some(cache),
                keep_last: true,
                labels: None,
                items: None,
            });
            drop(input);
            return out;
        }
        // prepare_inputs_for_generation: the last id and position, cloned.
        let i = d.process.empty(&[rows, 1], Dtype::Int64);
        let q = d.process.empty(&[rows, 1], Dtype::Int64);
        drop(self.inputs.take());
        let out = d.forward(Inputs {
            ids: &i,
            mask: Some(&self.mask),
            positions: Some(&q),
            cache: Some(cache),
            keep_last: true,
            labels: None,
            items: None,
        });
        self.inputs = Some((i, q, self.mask.clone()));
        out
    }

    /// `_update_model_kwargs_for_generation` after a step over `rows` of `length` tokens:
    /// arange(1) + positions[..., -1:] + 1 and the cat; the mask grown by ones; the old positions
    /// go at its return.
    pub(super) fn grow(&mut self, p: &mut Process, rows: u64, length: u64) {
        let range = p.empty(&[1], Dtype::Int64);
        let plus = p.empty(&[rows, 1], Dtype::Int64);
        drop(range);
        let one = p.empty(&[rows, 1], Dtype::Int64);
        drop(plus);
        let grown = p.empty(&[rows, length + 1], Dtype::Int64);
        drop(one);
        let old_positions = std::mem::replace(&mut self.positions, grown);
        let ones = p.empty(&[rows, 1], Dtype::Int64);
        let grown_mask = p.empty(&[rows, length + 1], Dtype::Int64);
        drop(ones);
        self.mask = grown_mask;
        drop(old_positions);
    }
}

/// `RepetitionPenaltyLogitsProcessor` on `[rows, vocab]` scores after `length` tokens: the
/// scores of the tokens seen gathered, penalized (`torch.where(score < 0, score * penalty,
/// score / penalty)`), scattered into a copy of the scores, which it returns.
pub(super) fn penalized(p: &mut Process, rows: u64, length: u64, vocab: u64) -> Tensor {
    let seen = p.empty(&[rows, length], Dtype::Float32);
    let negative = p.empty(&[rows, length], Dtype::Bool);
    let multiplied = p.empty(&[rows, length], Dtype::Float32);
    let divided = p.empty(&[rows, length], Dtype::Float32);
    let penalized = p.empty(&[rows, length], Dtype::Float32);
    drop((negative, multiplied, divided, seen));
    let scores = p.empty(&[rows, vocab], Dtype::Float32);
    drop(penalized);
    scores
}

/// The first token's logits are processed: the proof script marks the prefill's end in a
/// processor of its own, after transformers' processors and before sampling's warpers; then
/// `_optimize_model_for_decode` (on a GPU, experts run as batched products).
pub(super) fn prefill_done(d: &mut Decoder, stages: &mut dyn Stages) {
    stages.prefill_done(d);
    d.experts_path = super::decoder::ExpertsPath::Batched;
}
