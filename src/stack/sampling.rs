//! `generate(do_sample=True)` as transformers 5.17 runs it on PyTorch 2.11: the logits warpers
//! the generation config turns on (`TemperatureLogitsWarper`, `TopKLogitsWarper`,
//! `TopPLogitsWarper`, in that order), the softmax and `torch.multinomial`'s draw, with what
//! their CUDA kernels take from the caching allocator besides their outputs: `topk`'s multi-block
//! radix select (`TensorTopK.cu`), `sort`'s paths by rows and length (`Sort.cpp`,
//! `SortStable.cu`, cub's onesweep radix sort), the single-row `cumsum` (cub's scan) and the
//! long reductions' staging. The layouts are cub's (`AliasTemporaries`: each piece rounded up to
//! 256 bytes, 255 more for the alignment); the tiles are those cub's tuning gives on sm90, the
//! H200's architecture the traces were recorded on.

use super::process::Process;
use super::reduce::Reduction;
use super::tensor::Tensor;
use crate::dtype::Dtype;

/// The warpers sampling runs, as `_get_logits_processor` picks them from the generation config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// `temperature` other than 1: the scores divided into a new tensor.
    pub temperature: bool,
    /// `top_k` (transformers' default 50; 0 runs no warper).
    pub top_k: u64,
    /// `top_p` below 1: the scores sorted, their cumulative softmax cut.
    pub top_p: bool,
}

/// The most `top_k` emulated: above it PyTorch sorts the selected values with a full sort and a
/// gather rather than in place.
pub const MAX_TOP_K: u64 = 4096;

/// The scores after the warpers (`None` where none ran and the scores are the logits), the
/// chain's `current` output replaced by each warper's and let go after it returns.
pub fn warp(
    p: &mut Process,
    sampling: Sampling,
    rows: u64,
    vocab: u64,
    current: &mut Option<Tensor>,
) {
    let shape = [rows, vocab];
    let mut replace = |new: Tensor| drop(current.replace(new));
    if sampling.temperature {
        // scores / temperature
        replace(p.empty(&shape, Dtype::Float32));
    }
    if sampling.top_k > 0 {
        // scores < torch.topk(scores, k)[0][..., -1, None]; scores.masked_fill(...)
        let k = sampling.top_k.min(vocab);
        let (values, indices) = topk(p, rows, vocab, k);
        drop(indices);
        let below = p.empty(&shape, Dtype::Bool);
        drop(values);
        let filled = p.empty(&shape, Dtype::Float32);
        drop(below);
        replace(filled);
    }
    if sampling.top_p {
        // sort ascending; softmax().cumsum(); <= 1 - top_p; scatter back; masked_fill
        let (sorted, order) = sort(p, rows, vocab);
        let soft = p.empty(&shape, Dtype::Float32);
        let cumulative = p.empty(&shape, Dtype::Float32);
        if rows == 1 {
            scan_scratch(p, vocab, Dtype::Float32);
        }
        drop(soft);
        let cut = p.empty(&shape, Dtype::Bool);
        let scattered = p.empty(&shape, Dtype::Bool);
        let filled = p.empty(&shape, Dtype::Float32);
        drop((sorted, order, cumulative, cut, scattered));
        replace(filled);
    }
}

/// `torch.multinomial(probs, num_samples)` (without replacement) of `[rows, vocab]`
/// probabilities: its checks (`max() < inf & min() >= 0`, `(sum(1) == 0).any()`, asserted on
/// the GPU), the exponential noise `q` and the argmax of `probs / q` (one sample) or its
/// smallest `num_samples` by `topk` into its result, which it returns.
pub fn multinomial(p: &mut Process, rows: u64, vocab: u64, samples: u64) -> Tensor {
    let result = p.empty(&[rows, samples], Dtype::Int64);
    let whole = Reduction::whole(rows * vocab);
    let max = p.empty(&[], Dtype::Float32);
    p.reduction_staging(whole, Dtype::Float32);
    let finite = p.empty(&[], Dtype::Bool);
    let min = p.empty(&[], Dtype::Float32);
    p.reduction_staging(whole, Dtype::Float32);
    let positive = p.empty(&[], Dtype::Bool);
    let valid = p.empty(&[], Dtype::Bool);
    drop((positive, min, finite, max));
    let by_row = Reduction::sum_to(&[rows, vocab], &[rows, 1]);
    let sums = p.empty(&[rows], Dtype::Float32);
    p.reduction_staging(by_row, Dtype::Float32);
    let zero = p.empty(&[rows], Dtype::Bool);
    let any = p.empty(&[], Dtype::Bool);
    drop((zero, sums));
    drop(p.empty(&[], Dtype::Bool));
    let q = p.empty(&[rows, vocab], Dtype::Float32);
    if samples == 1 {
        // argmax's accumulator: a (value, index) pair of 16 bytes.
        p.reduction_staging_bytes(by_row, 16);
    } else {
        let values = p.empty(&[rows, samples], Dtype::Float32);
        topk_scratch(p, rows, vocab);
        drop(values);
    }
    drop(q);
    drop((any, valid));
    result
}

/// `torch.topk(x, k)` of `[rows, n]` float32 scores: its values and indices, and what the
/// multi-block radix select allocates where PyTorch's heuristic picks it
/// (`should_use_multiblock`); the single-block kernel allocates nothing, and the `k` values are
/// sorted in place.
pub fn topk(p: &mut Process, rows: u64, n: u64, k: u64) -> (Tensor, Tensor) {
    let values = p.empty(&[rows, k], Dtype::Float32);
    let indices = p.empty(&[rows, k], Dtype::Int64);
    topk_scratch(p, rows, n);
    (values, indices)
}

/// What `topk` of `[rows, n]` allocates besides its outputs.
fn topk_scratch(p: &mut Process, rows: u64, n: u64) {
    if multiblock_topk(rows, n) {
        const THREADS: u64 = 256;
        const DIGITS: u64 = 256;
        // Registers limit a multiprocessor to 65 536 / (40 × 256) = 6 blocks of the kernel.
        let grid = p.kernels.reduction_grid;
        let per_thread = (rows * n)
            .div_ceil(grid.multiprocessors * 6 * THREADS)
            .clamp(4, 64);
        let blocks = rows * n.div_ceil(per_thread * THREADS);
        let bytes = |n: u64| p.empty(&[n], Dtype::Uint8);
        let kth_values = bytes(rows * 4);
        let ks_to_find = bytes(2 * rows * 4);
        let desired = bytes(2 * rows * 4);
        let counts = bytes(blocks * DIGITS * 2);
        let digit_sums = bytes(rows * DIGITS * 4);
        let within = bytes(blocks * 4);
        let kth_counts = bytes(blocks * 4);
        for _ in 0..2 {
            // cub's inclusive_sum_by_key over the blocks: its tile states (16 bytes each, 32
            // more) and each tile's previous key; tiles of 256 × 15 items.
            let tiles = blocks.div_ceil(256 * 15);
            drop(bytes(cub_temporaries(&[
                (tiles + 32) * 16,
                (tiles + 1) * 4,
            ])));
        }
        drop((
            kth_counts, within, digit_sums, counts, desired, ks_to_find, kth_values,
        ));
    }
}

/// `should_use_multiblock` (PyTorch 2.11, cub with scan by key).
fn multiblock_topk(rows: u64, n: u64) -> bool {
    match rows {
        0..=20 => n >= 20_000,
        21..=40 => n >= 10_000,
        41..=80 => n >= 8_000,
        81..=199 => n >= 5_000,
        200..=799 => n >= 3_000,
        800..=4000 => n >= 800,
        _ => n >= 400,
    }
}

/// `torch.sort(x)` of `[rows, n]` float32 scores along the last dimension: the sorted values,
/// their indices and each path's temporaries.
fn sort(p: &mut Process, rows: u64, n: u64) -> (Tensor, Tensor) {
    let values = p.empty(&[rows, n], Dtype::Float32);
    let indices = p.empty(&[rows, n], Dtype::Int64);
    let total = rows * n;
    let bytes = |n: u64| p.empty(&[n], Dtype::Uint8);
    // Keys of 4 bytes, values (an int64 index, or an int2 of row and index) of 8.
    let pairs = |n: u64| onesweep_temporaries(n, 4, 8, 32, ONESWEEP_PAIRS_TILE);
    if n <= 4096 {
        // sortKeyValueInplace in place; the indices filled from an arange of the row.
        drop(p.empty(&[n], Dtype::Int64));
    } else if rows == 1 {
        // segmented_sort_large_segments: the row's indices, then one radix sort of pairs.
        let row_indices = bytes(n * 8);
        drop(bytes(pairs(n)));
        drop(row_indices);
    } else if rows < 128 {
        // segmented_sort_pairs_by_full_sort: (row, index) pairs sorted by value over the whole
        // tensor, into a buffer for the keys, then stably by row (its low bits only).
        let pairs_in = bytes(total * 8);
        let pairs_out = bytes(total * 8);
        let keys_out = bytes(total * 4);
        drop(bytes(pairs(total)));
        drop(keys_out);
        let row_bits = (64 - (rows - 1).leading_zeros() as u64).max(1);
        drop(bytes(onesweep_temporaries(
            total,
            8,
            0,
            row_bits,
            ONESWEEP_KEYS_TILE,
        )));
        drop((pairs_out, pairs_in));
    } else {
        // segmented_sort_pairs: reverse indices, then cub's segmented radix sort, whose
        // temporaries are the alternate keys and values.
        let reverse = bytes(total * 8);
        drop(bytes(cub_temporaries(&[total * 4, total * 8])));
        drop(reverse);
    }
    (values, indices)
}

/// Items per tile of cub's onesweep radix sort on sm90: 384 threads × 14 items for 4-byte keys
/// with 8-byte values (a 64-bit item count), × 15 for 8-byte keys alone.
const ONESWEEP_PAIRS_TILE: u64 = 384 * 14;
const ONESWEEP_KEYS_TILE: u64 = 384 * 15;
/// Items one onesweep portion sorts.
const ONESWEEP_PORTION: u64 = 1 << 28;

/// The temporary storage of cub's onesweep radix sort of `n` items with keys of `key_bytes`,
/// values of `value_bytes` (0: keys alone) and `bits` sorted: the bins of every pass and
/// portion, the blocks' look-back, the alternate keys and values (more than one pass, the
/// output not the input's buffer) and the counters.
fn onesweep_temporaries(n: u64, key_bytes: u64, value_bytes: u64, bits: u64, tile: u64) -> u64 {
    let passes = bits.div_ceil(8);
    let portions = n.div_ceil(ONESWEEP_PORTION);
    let blocks = n.min(ONESWEEP_PORTION).div_ceil(tile);
    let alternate = |bytes: u64| if passes > 1 { n * bytes } else { 0 };
    cub_temporaries(&[
        portions * passes * 256 * 8,
        blocks * 256 * 4,
        alternate(key_bytes),
        alternate(value_bytes),
        portions * passes * 4,
    ])
}

/// A single row's `cumsum` of `n` values goes through cub's inclusive scan: its tile states,
/// one for each tile and 32 more, tiles of 128 threads × 24 items of 4 bytes on sm90 (cub scales
/// the items a thread takes to the item's size: 12 of 8 bytes). A float32 tile's state is one
/// 8-byte word (status and value); an int64 one's is a status word and two values, 24 bytes.
pub(super) fn scan_scratch(p: &mut Process, n: u64, elem: Dtype) {
    let (items, state) = match elem.bytes() {
        8 => (12, 24),
        _ => (24, 8),
    };
    let tiles = n.div_ceil(128 * items);
    drop(p.empty(&[cub_temporaries(&[(tiles + 32) * state])], Dtype::Uint8));
}

/// cub's `AliasTemporaries`: each piece rounded up to 256 bytes, and 255 more to align the whole.
fn cub_temporaries(pieces: &[u64]) -> u64 {
    pieces.iter().map(|b| b.next_multiple_of(256)).sum::<u64>() + 255
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The temporaries the H200 allocated sorting 4 rows of Llama 3's 128 256 logits (the trace
    /// `generate-medium-llama-3.1-8b-sample-padded`): the pairs' radix sort, then the rows'.
    #[test]
    fn onesweep_temporaries_are_cubs_layout() {
        let n = 4 * 128_256;
        assert_eq!(
            onesweep_temporaries(n, 4, 8, 32, ONESWEEP_PAIRS_TILE),
            6_263_295
        );
        assert_eq!(onesweep_temporaries(n, 8, 0, 2, ONESWEEP_KEYS_TILE), 94_719);
        assert_eq!(cub_temporaries(&[33 * 16, 2 * 4]), 1279);
    }

    #[test]
    fn topk_takes_the_multi_block_select_past_pytorchs_bounds() {
        assert!(multiblock_topk(4, 128_256));
        assert!(!multiblock_topk(3, 1160));
        assert!(!multiblock_topk(20, 19_999));
        assert!(multiblock_topk(1000, 800));
    }
}
