//! What PyTorch 2.11's CUDA reduction kernel (`ATen/native/cuda/Reduce.cuh`) allocates besides
//! its output. Its launch configuration (`setReduceConfig`) splits a long reduction over several
//! blocks of a grid sized to the GPU's resident threads; their partial results are staged in
//! global memory, with a semaphore per column of blocks, both taken from the caching allocator
//! and given back once the kernel is launched (the semaphores first). An autograd reduction of a
//! broadcast operand's gradient (a norm's weight over every token) stages tens of megabytes.
//! Measured on the H200 by `scripts/gpu/kernel-allocations.py reductions` (`tests/fixtures/reduce-staging-h200.json`).
//! Tensors of 2^31 elements or more are reduced by the kernel in 32-bit pieces, each with its own
//! staging; they are counted here as one reduction, which stages at least as much.

use crate::dtype::Dtype;

/// The threads a GPU keeps resident, which size the grid a reduction aims at
/// (`multiProcessorCount` × `maxThreadsPerMultiProcessor` / the block's threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReductionGrid {
    pub multiprocessors: u64,
    pub threads_per_multiprocessor: u64,
}

impl ReductionGrid {
    /// The H200's: 132 multiprocessors of 2 048 threads.
    pub const H200: ReductionGrid = ReductionGrid {
        multiprocessors: 132,
        threads_per_multiprocessor: 2048,
    };
}

/// One reduction as the kernel sees it (its dimensions coalesced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    pub outputs: u64,
    pub inputs_per_output: u64,
    /// The reduced dimension is the input's fastest-moving one (a whole tensor, or each row);
    /// otherwise an outer one, the outputs contiguous (a weight's gradient over every token).
    pub along_fastest: bool,
    /// The size of the innermost output dimension (for an outer reduction's vector loads).
    pub innermost_outputs: u64,
}

/// The global memory a reduction stages: (partial results, semaphores), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staging {
    pub buffer: u64,
    pub semaphores: u64,
}

/// Threads of a block at most (`mnt_wrapper<T>::MAX_NUM_THREADS`, every type but complex
/// double).
const MAX_THREADS: u64 = 512;
const WARP: u64 = 32;
/// Values a thread loads at once along the reduced dimension (`input_vec_size` = `vt0`).
const INPUT_VECTOR: u64 = 4;
const MIN_VALUES_PER_THREAD: u64 = 16;
const MAX_VALUES_PER_THREAD: u64 = 256;

/// The largest power of two not above `n` (`last_pow2`), for `n` ≥ 1.
fn last_pow2(n: u64) -> u64 {
    1 << (63 - n.max(1).leading_zeros())
}

impl Reduction {
    /// The reduction of a tensor of `input` shape to `output` (the same rank or fewer
    /// dimensions, aligned at the right, as `sum_to` reduces).
    pub fn sum_to(input: &[u64], output: &[u64]) -> Reduction {
        let outputs: u64 = output.iter().product();
        let inputs: u64 = input.iter().product();
        let innermost_in = input.last().copied().unwrap_or(1);
        let innermost_out = output.last().copied().unwrap_or(1);
        Reduction {
            outputs,
            inputs_per_output: inputs / outputs.max(1),
            along_fastest: innermost_out == 1 && innermost_in > 1,
            innermost_outputs: innermost_out,
        }
    }

    /// The reduction of all of `n` values to one (`mean()` or `sum()` of a whole tensor).
    pub fn whole(n: u64) -> Reduction {
        Reduction::sum_to(&[n], &[])
    }

    /// What `setReduceConfig` stages for accumulators of `acc_bytes` on `grid`; `None` when each
    /// output is reduced within one block.
    pub fn staging(&self, acc_bytes: u64, grid: ReductionGrid) -> Option<Staging> {
        let (outputs, inputs) = (self.outputs.max(1), self.inputs_per_output.max(1));
        let (mut dim0, dim1) = match self.along_fastest {
            true => (inputs, outputs),
            false => (outputs, inputs),
        };
        // Vector loads: along the reduced dimension, or across contiguous outputs.
        let mut output_vector = 1;
        if self.along_fastest {
            if dim0 >= 128 {
                dim0 /= INPUT_VECTOR;
            }
        } else {
            output_vector = [4, 2, 1]
                .into_iter()
                .find(|v| self.innermost_outputs.is_multiple_of(*v) && outputs.is_multiple_of(*v))
                .unwrap_or(1);
            dim0 /= output_vector;
        }
        // set_block_dimension
        let max_threads = MAX_THREADS / output_vector;
        let bound = |d: u64| {
            if d < max_threads {
                last_pow2(d)
            } else {
                max_threads
            }
        };
        let (d0, d1) = (bound(dim0), bound(dim1));
        let height = d1.min(max_threads / d0.min(WARP));
        let width = d0.min(max_threads / height);
        let threads = width * height;
        let (mut step_input, mut step_output) = (1, 1);
        match self.along_fastest {
            true => step_input *= width,
            false => step_output *= width,
        }
        let values_per_thread = |step: u64| inputs.div_ceil(step);
        let across_warps =
            values_per_thread(step_input) >= (height * 16).min(MAX_VALUES_PER_THREAD);
        match across_warps {
            true => step_input *= height,
            false => step_output *= height,
        }
        let target = grid.multiprocessors * (grid.threads_per_multiprocessor / threads);
        let columns = (outputs / output_vector).div_ceil(step_output);
        let values = values_per_thread(step_input);
        if !across_warps || values < MAX_VALUES_PER_THREAD || columns > target {
            return None;
        }
        let ctas = target
            .div_ceil(columns)
            .min(values.div_ceil(MIN_VALUES_PER_THREAD))
            .max(values.div_ceil(MAX_VALUES_PER_THREAD));
        if ctas <= 1 {
            return None;
        }
        let mut buffer = acc_bytes * outputs * ctas;
        if !self.along_fastest {
            buffer *= width * output_vector;
        }
        Some(Staging {
            buffer,
            semaphores: 4 * columns,
        })
    }
}

/// The accumulator of a reduction of `elem` values: float32, double for double.
pub fn accumulator_bytes(elem: Dtype) -> u64 {
    elem.bytes().max(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reduction `scripts/gpu/kernel-allocations.py reductions` measured on the H200: over the leading
    /// dimensions of a `[b, t, h]` tensor (as `sum_to` reduces a norm's weight gradient) and
    /// over the whole tensor, in float32 and bfloat16.
    #[test]
    fn staging_is_what_the_h200_allocated() {
        let text = include_str!("../../tests/fixtures/reduce-staging-h200.json");
        let measured: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(measured["sms"], 132);
        let rows = measured["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 36);
        let staged = |r: Reduction, elem| {
            r.staging(accumulator_bytes(elem), ReductionGrid::H200)
                .map_or(vec![], |s| vec![s.buffer, s.semaphores])
        };
        for row in rows {
            let shape: Vec<u64> = row["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let elem = match row["dtype"].as_str().unwrap() {
                "torch.float32" => Dtype::Float32,
                _ => Dtype::Bfloat16,
            };
            let sizes = |key: &str| -> Vec<u64> {
                let all: Vec<u64> = row[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                // The output first, then what the kernel staged.
                all[1..].to_vec()
            };
            let h = *shape.last().unwrap();
            let leading = Reduction::sum_to(&shape, &[h]);
            assert_eq!(
                staged(leading, elem),
                sizes("sum_leading"),
                "{shape:?} {elem:?}"
            );
            let whole = Reduction::sum_to(&shape, &[]);
            assert_eq!(
                staged(whole, elem),
                sizes("sum_all"),
                "{shape:?} {elem:?} whole"
            );
        }
    }
}
