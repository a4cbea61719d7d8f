//! TRL 1.16's `SFTTrainer` on the Trainer's step, for memory: its fused LM head
//! (`add_fused_lm_head`), which gathers the positions that have a label and computes their
//! log-probability, entropy and whether the label is the top token tile by tile
//! (`_ChunkedLogProbFunction`: tiles of 4 096 positions by 32 768 vocabulary entries, never the
//! `[batch, sequence, vocabulary]` logits), the outputs scattered back over the positions; then
//! `compute_loss`: the loss summed and divided by `num_items_in_batch`, and the entropy and token
//! accuracy it logs. Read from TRL's `sft_trainer.py`, `trainer/utils.py` and
//! `kernels/chunked_logprob.py`, checked against the H200's traces
//! `docs/gpu-runs/2026-12-04-h200-records/sft-*`.

use super::process::Process;
use super::tensor::{Node, Rule, Tensor};
use crate::dtype::Dtype;
use crate::replay::program::Role;

/// The positions `_ChunkedLogProbFunction` projects at once (`TOKEN_CHUNK_SIZE`).
const TOKEN_CHUNK: u64 = 4096;
/// The vocabulary entries of a tile (`_CHUNKED_LOGPROB_CHUNK_SIZE`): the tile buffer is this wide
/// whatever the vocabulary.
const VOCAB_CHUNK: u64 = 32_768;

/// What the fused forward returns (`FusedCausalLMOutput`), with what it holds until
/// `compute_loss` lets it go.
pub struct Fused {
    /// `labels[:, 1:] != -100` (`label_mask`).
    mask: Tensor,
    log_probs: Tensor,
    entropy: Tensor,
    is_top1: Tensor,
    /// The loss the fused forward computes (never backpropagated: `compute_loss` makes its own)
    /// and the clamped count it divides by.
    loss: [Tensor; 2],
}

/// `_fused_forward` after the backbone, under the forward's autocast: the last position of each
/// row dropped, the `labelled` positions whose next token has a label gathered (their hidden
/// states and labels), their log-probabilities, entropy and top-1 flags through the LM head's
/// `weight` in tiles, each scattered back over the `[batch, sequence - 1]` positions; the loss of
/// the log-probabilities over their count. The backbone's output goes as it returns.
pub fn fused_forward(
    p: &mut Process,
    hidden: Tensor,
    weight: &Tensor,
    labels: &Tensor,
    labelled: u64,
) -> Fused {
    let (b, t) = (hidden.shape[0], hidden.shape[1]);
    let shifted = p.slice(&hidden, 1, 0, t - 1);
    let mask = p.empty(&[b, t - 1], Dtype::Bool);
    let rows = p.index_mask(&shifted, &mask, labelled);
    let next_labels = p.slice(labels, 1, 1, t);
    let targets = p.index_mask(&next_labels, &mask, labelled);
    let [log_probs, entropy, is_top1] = chunked_log_prob(p, &rows, weight, &targets);
    drop(targets);
    drop(rows);
    let scattered = [&log_probs, &entropy, &is_top1].map(|x| p.masked_scatter(&mask, x));
    drop((log_probs, entropy, is_top1));
    // `-log_probs.sum() / mask.sum().clamp(min=1)`.
    let summed = p.empty(&[], Dtype::Float32);
    let negated = p.empty(&[], Dtype::Float32);
    drop(summed);
    let count = p.count(&mask);
    let clamped = p.empty(&[], Dtype::Int64);
    drop(count);
    let loss = p.empty(&[], Dtype::Float32);
    drop(negated);
    drop((shifted, next_labels, hidden));
    let [log_probs, entropy, is_top1] = scattered;
    Fused {
        mask,
        log_probs,
        entropy,
        is_top1,
        loss: [clamped, loss],
    }
}

/// `SFTTrainer.compute_loss` after the model's forward: `-log_probs` summed and divided by
/// `num_items_in_batch` clamped to 1, times the number of processes; the logged counts of
/// labelled positions and of top-1 labels and the entropy's sum, each ratio read back; the
/// batch's attention mask summed for the token count. Then the outputs and its locals go.
pub fn compute_loss(p: &mut Process, fused: Fused, attention_mask: Option<&Tensor>) -> Tensor {
    let scalar = |p: &mut Process, elem| p.empty(&[], elem);
    let per_token = p.neg(&fused.log_probs);
    let summed = p.sum_all(&per_token);
    let items = scalar(p, Dtype::Int64);
    let divided = p.div(&summed, &items);
    drop(summed);
    drop(items);
    let loss = p.scale(&divided);
    drop(divided);
    let labelled = p.count(&fused.mask);
    let num_valid = p.count(&labelled);
    drop(labelled);
    let entropy_sum = scalar(p, Dtype::Float32);
    let total_entropy = scalar(p, Dtype::Float32);
    drop(entropy_sum);
    let top1 = p.count(&fused.is_top1);
    let num_correct = p.count(&top1);
    drop(top1);
    // `num_valid > 0`, then each ratio, read back.
    for _ in 0..2 {
        drop(scalar(p, Dtype::Bool));
        drop(scalar(p, Dtype::Float32));
    }
    // The tokens: the mask's sum (a temporary), or padding-free the row's length as a tensor
    // (`local_num_tokens`, held to the return).
    let local_tokens = match attention_mask {
        Some(mask) => {
            let tokens = p.count(mask);
            drop(p.count(&tokens));
            drop(tokens);
            None
        }
        None => {
            let tokens = scalar(p, Dtype::Int64);
            drop(p.count(&tokens));
            Some(tokens)
        }
    };
    let Fused {
        mask,
        log_probs,
        entropy,
        is_top1,
        loss: fused_loss,
    } = fused;
    drop(fused_loss);
    drop((log_probs, entropy, is_top1, mask));
    drop((
        per_token,
        num_valid,
        total_entropy,
        num_correct,
        local_tokens,
    ));
    loss
}

/// `_ChunkedLogProbFunction.forward` of `rows [n, hidden]` through `weight [vocab, hidden]` in
/// the compute dtype (the autocast's, else the rows'): seven float32 statistics per row and the
/// tile buffer, then from them the log-normalizer, the log-probabilities, the entropy and the
/// top-1 flags (each with its temporaries), the statistics and the buffer let go as it returns.
/// The node keeps the rows, the targets, the log-normalizer and the entropy.
fn chunked_log_prob(
    p: &mut Process,
    rows: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> [Tensor; 3] {
    let n = rows.shape[0];
    let compute = p.autocast.unwrap_or(rows.elem);
    let statistics: Vec<Tensor> = (0..7).map(|_| p.empty(&[n], Dtype::Float32)).collect();
    let tile = p.empty(&[n.min(TOKEN_CHUNK), VOCAB_CHUNK], compute);
    p.matmul_workspace(false);
    let row = |p: &mut Process, elem| p.empty(&[n], elem);
    let log_sum = row(p, Dtype::Float32);
    let log_z = row(p, Dtype::Float32);
    drop(log_sum);
    let mut log_probs = row(p, Dtype::Float32);
    let ratio = row(p, Dtype::Float32);
    let mut entropy = row(p, Dtype::Float32);
    drop(ratio);
    let at_least = row(p, Dtype::Bool);
    let above = row(p, Dtype::Bool);
    let is_top1 = row(p, Dtype::Bool);
    drop(at_least);
    drop(above);
    drop(statistics);
    drop(tile);
    let saved = if p.autograd.records(&[rows, weight]) {
        vec![
            rows.clone(),
            targets.clone(),
            log_z.clone(),
            entropy.clone(),
        ]
    } else {
        Vec::new()
    };
    p.autograd.record(
        Rule::ChunkedLogProb { compute },
        &[rows, weight],
        saved,
        &mut [&mut log_probs, &mut entropy],
    );
    [log_probs, entropy, is_top1]
}

/// `_ChunkedLogProbFunction.backward` with the log-probabilities' gradient (the entropy's is
/// none: it is only logged): float32 accumulators of the rows' and the weight's gradients (each
/// where wanted), the tile buffer, each tile's product on the backward thread's cuBLAS handle;
/// then the accumulators cast to the inputs' types, and the accumulators and the buffer let go.
pub(super) fn chunked_log_prob_backward(
    p: &mut Process,
    node: &Node,
    rows_wanted: bool,
    weight_wanted: bool,
) -> Vec<Option<Tensor>> {
    let (rows, weight) = (&node.inputs[0], &node.inputs[1]);
    let n = rows.shape[0];
    let Rule::ChunkedLogProb { compute } = node.rule else {
        unreachable!("a chunked log-probability node")
    };
    let rows_sum = rows_wanted.then(|| p.empty(&rows.shape, Dtype::Float32));
    let weight_sum = weight_wanted.then(|| p.empty(&weight.shape, Dtype::Float32));
    let tile = p.empty(&[n.min(TOKEN_CHUNK), VOCAB_CHUNK], compute);
    p.matmul_workspace(false);
    let rows_grad = rows_sum.as_ref().map(|_| p.empty(&rows.shape, rows.elem));
    let weight_grad = (weight_sum.as_ref())
        .map(|_| p.in_role(Role::Gradients, |p| p.empty(&weight.shape, weight.elem)));
    drop((rows_sum, weight_sum, tile));
    vec![rows_grad, weight_grad]
}
