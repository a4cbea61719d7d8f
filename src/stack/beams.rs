//! `generate(num_beams=n)` as transformers 5.17's `_beam_search` runs it over rows already
//! repeated for each beam: its running and finished sequences, scores and beam indices kept in
//! tensors of the final length, each step's float32 log-softmax of the logits (through the
//! logits processors and, with `do_sample`, sampling's warpers), the scores of every beam's every
//! token ranked (`topk`, or drawn without replacement by `multinomial`) into twice as many
//! candidates as beams, gathered (`take_along_dim`), merged with the finished ones, and the cache
//! reordered for the beams kept (`index_select` of every layer's keys and values). The search
//! runs to `max_new_tokens`: without an end-of-sequence token the length is its only stop, and
//! with one it is the longest run.

use super::cache::Cache;
use super::decoder::Decoder;
use super::decoding::{self, Kwargs, Options, Stages};
use super::process::Process;
use super::sampling;
use super::tensor::Tensor;
use crate::dtype::Dtype;

/// Runs the search after the prompt `ids` (`[batch × beams, t]`), the model's arguments
/// `kwargs` and `cache` made for those rows; returns the best sequences (`[batch, t + new]`).
pub(super) fn search(
    d: &mut Decoder,
    ids: &Tensor,
    mut kwargs: Kwargs,
    cache: &mut Cache,
    options: Options,
    stages: &mut dyn Stages,
) -> Tensor {
    use Dtype::{Bool, Float32, Int32, Int64};
    let beams = options.beams;
    let (rows, t) = (ids.shape[0], ids.shape[1]);
    let b = rows / beams;
    let new = options.new_tokens;
    let length = t + new;
    // beams_to_keep: max(2, 1 + end-of-sequence tokens) candidates for each beam.
    let keep = (1 + options.eos_tokens).max(2) * beams;
    let merged = beams + keep;
    let p = &mut *d.process;
    let e = |p: &Process, shape: &[u64], elem| p.empty(shape, elem);
    let top_num_beam_mask = e(p, &[keep], Bool);
    let mut running = e(p, &[b, beams, length], Int64);
    let mut sequences = e(p, &[b, beams, length], Int64);
    let mut running_scores = e(p, &[b, beams], Float32);
    let mut scores = e(p, &[b, beams], Float32);
    let mut finished = e(p, &[b, beams], Bool);
    let mut unsatisfied = e(p, &[b, 1], Bool);
    let mut hits = e(p, &[b, beams], Bool);
    let mut running_indices = e(p, &[b, beams, new], Int32);
    let mut indices = e(p, &[b, beams, new], Int32);
    // `flat_running_sequences`: a view of the running sequences, holding them to the next step.
    let mut flat: Option<Tensor> = None;
    let mut logits: Option<Tensor> = None;
    let mut log_probs: Option<Tensor> = None;
    // The candidates: their scores, sequences and beam indices.
    let mut candidates: Option<(Tensor, Tensor, Tensor)> = None;
    // `beam_idx`: a view of the running beam indices, holding them to the next reorder.
    let mut beam_idx: Option<Tensor> = None;
    for (step, cur) in (0..new).zip(t..) {
        if step > 0 {
            drop(flat.replace(running.clone()));
        }
        let out = kwargs.forward(d, step, ids, cache);
        let p = &mut *d.process;
        kwargs.grow(p, rows, cur);
        let vocab = out.logits.size(-1);
        // logits[:, -1].to(float32, copy=True), log_softmax, the processors.
        drop(logits.replace(e(p, &[rows, vocab], Float32)));
        drop(log_probs.replace(e(p, &[rows, vocab], Float32)));
        let mut processed = options
            .repetition_penalty
            .then(|| decoding::penalized(p, rows, cur, vocab));
        if step == 0 {
            decoding::prefill_done(d, stages);
        }
        let p = &mut *d.process;
        if let Some(s) = options.sampling {
            sampling::warp(p, s, rows, vocab, &mut processed);
        }
        if let Some(new) = processed {
            drop(log_probs.replace(new));
        }
        drop(out);
        // + running_beam_scores[:, :, None], viewed as [b, beams × vocab].
        drop(log_probs.replace(e(p, &[rows, vocab], Float32)));
        let n = beams * vocab;

        // _get_top_k_continuations
        let (top_scores, top_indices) = match options.sampling {
            None => sampling::topk(p, b, n, keep),
            Some(_) => {
                // multinomial(softmax(log_probs), keep), then the scores gathered.
                let soft = e(p, &[b, n], Float32);
                let drawn = sampling::multinomial(p, b, n, keep);
                drop(soft);
                (e(p, &[b, keep], Float32), drawn)
            }
        };
        let current = e(p, &[b, keep], Int64);
        let top_indices_running = gather_beams(p, &running_indices, keep);
        let top_running = gather_beams(p, &running, keep);
        let top_ids = e(p, &[b, keep], Int64);
        let arange = e(p, &[b], Int64);
        let offset = e(p, &[b], Int64);
        drop(arange);
        let modified = e(p, &[b, keep], Int64);
        drop((top_indices, current, top_ids, offset, modified));
        drop(candidates.replace((top_scores, top_running, top_indices_running)));
        let (_, top_running, top_indices_running) = candidates.as_ref().expect("set");

        // stopping_criteria: max length reached, per candidate.
        let none = e(p, &[b * keep], Bool);
        let full = e(p, &[b * keep], Bool);
        let either = e(p, &[b * keep], Bool);
        drop(full);
        drop(none);
        hits = either;

        // _get_running_beams_for_next_iteration
        let as_float = e(p, &[b, keep], Float32);
        let penalty = e(p, &[b, keep], Float32);
        drop(as_float);
        let open_scores = e(p, &[b, keep], Float32);
        drop(penalty);
        let (best_scores, best) = sampling::topk(p, b, keep, beams);
        drop(best_scores);
        let next_running = gather_beams(p, top_running, beams);
        let next_scores = gather_beams(p, &open_scores, beams);
        let next_indices = gather_beams(p, top_indices_running, beams);
        drop((open_scores, best));
        running = next_running;
        running_scores = next_scores;
        running_indices = next_indices;

        // _update_finished_beams: the finished candidates scored with the length penalty,
        // merged with the finished beams, the best kept.
        let did_finish = e(p, &[b, keep], Bool);
        let penalized = e(p, &[b, keep], Float32);
        let all = e(p, &[b, 1], Bool);
        let batch_full = e(p, &[b, 1], Bool);
        drop(all);
        let as_float = e(p, &[b, 1], Float32);
        drop((as_float, e(p, &[b, 1], Float32)));
        let not = e(p, &[b, 1], Bool);
        let as_float = e(p, &[b, 1], Float32);
        drop(not);
        drop((as_float, e(p, &[b, 1], Float32)));
        let not = e(p, &[b, keep], Bool);
        drop((not, e(p, &[b, keep], Float32)));
        let merged_sequences = e(p, &[b, merged, length], Int64);
        let merged_scores = e(p, &[b, merged], Float32);
        let merged_indices = e(p, &[b, merged, new], Int32);
        let merged_finished = e(p, &[b, merged], Bool);
        let (best_scores, best) = sampling::topk(p, b, merged, beams);
        drop(best_scores);
        let next_sequences = gather_beams(p, &merged_sequences, beams);
        let next_scores = gather_beams(p, &merged_scores, beams);
        let next_indices = gather_beams(p, &merged_indices, beams);
        let next_finished = gather_beams(p, &merged_finished, beams);
        drop((penalized, did_finish, batch_full));
        drop((merged_sequences, merged_scores, merged_indices));
        drop((merged_finished, best));
        sequences = next_sequences;
        scores = next_scores;
        indices = next_indices;
        finished = next_finished;

        // The cache reordered for the beams kept.
        drop(beam_idx.replace(running_indices.clone()));
        cache.reorder(p);

        // _check_early_stop_heuristic
        let best_possible = e(p, &[b, 1], Float32);
        let min = e(p, &[b, 1], Float32);
        drop(e(p, &[b, 1], Int64));
        let floor = e(p, &[], Float32);
        let worst_finished = e(p, &[b, beams], Float32);
        drop(floor);
        drop(min);
        let better = e(p, &[b, beams], Bool);
        let any = e(p, &[b, 1], Bool);
        drop(better);
        let still = e(p, &[b, 1], Bool);
        drop(any);
        drop((best_possible, worst_finished));
        unsatisfied = still;

        // _beam_search_has_unfinished_sequences: three conditions of one element each.
        let scalar = |p: &Process| e(p, &[], Bool);
        let improvement = scalar(p);
        let all = scalar(p);
        let and = scalar(p);
        drop(all);
        let open = scalar(p);
        drop(and);
        let all = scalar(p);
        let valid = scalar(p);
        drop(all);
        let and = scalar(p);
        let go = scalar(p);
        drop(and);
        drop((improvement, open, valid, go));
    }
    let p = &mut *d.process;
    // max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max(), output_length.
    let plus = e(p, &[b, new], Int32);
    let generated = e(p, &[b, new], Bool);
    drop(plus);
    let sums = e(p, &[b], Int64);
    drop(e(p, &[b, new], Int64));
    drop(generated);
    let max = e(p, &[], Int64);
    drop(sums);
    let output_length = e(p, &[], Int64);
    // The frame let go: the model's arguments, then the locals in their order.
    let Kwargs {
        positions,
        mask,
        inputs,
    } = kwargs;
    drop((mask, positions));
    drop((top_num_beam_mask, indices, running, running_scores, scores));
    drop((finished, unsatisfied, hits, flat, inputs));
    drop((logits, log_probs, candidates, beam_idx, max, output_length));
    sequences
}

/// `_gather_beams(tensor, indices)` keeping `kept` of its second dimension: `take_along_dim`
/// materializes the indices broadcast to the result's shape (int64), then gathers.
fn gather_beams(p: &Process, tensor: &Tensor, kept: u64) -> Tensor {
    let mut shape = tensor.shape.clone();
    shape[1] = kept;
    let index = p.empty(&shape, Dtype::Int64);
    let out = p.empty(&shape, tensor.elem);
    drop(index);
    out
}
