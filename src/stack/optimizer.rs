//! The optimizers of training, for memory. `torch.optim.AdamW` as PyTorch 2.11 ships it: the
//! states created at the first step (two moments per parameter, and with `fused` a step counter
//! on the device), and each implementation's temporaries (foreach: the square roots of every
//! second moment at once; for-loop: one parameter's at a time; fused: none). bitsandbytes
//! 0.50's `AdamW8bit`: per parameter of at least 4 096 elements two 8-bit moments and their
//! float32 scales per block of 256, two float32 moments for a smaller one, its two 256-entry
//! quantization maps copied to the device once, and a step that allocates nothing.
//! transformers 5.17's `Adafactor` as the Trainer builds it (`optim="adafactor"`), one
//! parameter at a time in Python: float32 copies of a half-precision gradient and parameter,
//! factored second moments (a row and a column) of a matrix or a whole one of a vector, the
//! parameter's RMS kept on the device, and each update's temporaries, the loop's variables
//! holding the last parameter's until the next one replaces them.

use super::process::Process;
use super::reduce::Reduction;
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::replay::program::Role;
use serde::{Deserialize, Serialize};

/// Which implementation of the step runs.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum OptimizerImpl {
    #[default]
    /// `foreach` (PyTorch's default on CUDA): `_foreach_sqrt` of all second moments of a
    /// (device, dtype) group, alive until the update.
    Foreach,
    /// `fused=True`: one kernel, no intermediate; the step counters on the device.
    Fused,
    /// `foreach=False`: one parameter at a time.
    ForLoop,
}

impl OptimizerImpl {
    pub const ALL: &'static [OptimizerImpl] = <OptimizerImpl as strum::VariantArray>::VARIANTS;
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The optimizer a training run steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    /// `torch.optim.AdamW`, with its implementation of the step.
    AdamW(OptimizerImpl),
    /// `bitsandbytes.optim.AdamW8bit` (`min_8bit_size` 4 096, blocks of 256), or `paged`
    /// (`PagedAdamW8bit`): the moments of a parameter of [`PAGED_ELEMENTS`] or more in CUDA
    /// unified memory, outside the caching allocator.
    AdamW8bit { paged: bool },
    /// `transformers.optimization.Adafactor(scale_parameter=False, relative_step=False)`, no
    /// first moment, no weight decay (the Trainer's defaults).
    Adafactor,
}

/// A paged optimizer's parameters of fewer elements keep their moments in the caching
/// allocator (`get_state_buffer`: `p.numel() < 1e5`).
pub const PAGED_ELEMENTS: u64 = 100_000;

/// bitsandbytes' `min_8bit_size`: smaller parameters keep float32 moments.
pub const MIN_8BIT_ELEMENTS: u64 = 4096;
/// bitsandbytes' block of elements sharing one float32 scale of an 8-bit moment.
pub const BLOCK_8BIT: u64 = 256;
/// The bytes of one of bitsandbytes' quantization maps (256 float32 entries).
pub const QMAP_BYTES: u64 = 256 * 4;

/// The tensors `AdamW8bit` makes for a parameter of `elements`, in the order it makes them:
/// (elements, type, in CUDA unified memory); float32 moments for a small one or one
/// `kept_32bit`; `paged`, the moments (the first two) of one of [`PAGED_ELEMENTS`] or more
/// outside the caching allocator.
fn adamw_8bit_states(elements: u64, kept_32bit: bool, paged: bool) -> [(u64, Dtype, bool); 4] {
    let unified = paged && elements >= PAGED_ELEMENTS;
    let [moment, scale] = if kept_32bit || elements < MIN_8BIT_ELEMENTS {
        [(elements, Dtype::Float32), (0, Dtype::Float32)]
    } else {
        [
            (elements, Dtype::Uint8),
            (elements.div_ceil(BLOCK_8BIT), Dtype::Float32),
        ]
    };
    [
        (moment.0, moment.1, unified),
        (moment.0, moment.1, unified),
        (scale.0, scale.1, false),
        (scale.0, scale.1, false),
    ]
}

/// The bytes of `AdamW8bit`'s states for parameters of these element counts, each with whether
/// it is kept in 32 bits (maps included).
pub fn adamw_8bit_state_bytes(elements: impl IntoIterator<Item = (u64, bool)>) -> u64 {
    let (allocated, paged) = paged_adamw_8bit_state_bytes(elements, false);
    allocated + paged
}

/// The bytes of `AdamW8bit`'s states (maps included) in the caching allocator and, `paged`, in
/// CUDA unified memory outside it.
pub fn paged_adamw_8bit_state_bytes(
    elements: impl IntoIterator<Item = (u64, bool)>,
    paged: bool,
) -> (u64, u64) {
    let mut maps = 0;
    let (mut allocated, mut unified) = (0, 0);
    for (n, kept_32bit) in elements {
        if !kept_32bit && n >= MIN_8BIT_ELEMENTS {
            maps = 2 * QMAP_BYTES;
        }
        for (count, elem, in_unified) in adamw_8bit_states(n, kept_32bit, paged) {
            match in_unified {
                true => unified += count * elem.bytes(),
                false => allocated += count * elem.bytes(),
            }
        }
    }
    (allocated + maps, unified)
}

/// An optimizer's state for the trained parameters.
pub struct OptimizerState {
    optimizer: Optimizer,
    /// Per parameter: the tensors made at the first step (AdamW: the step counter on the device
    /// when fused, the two moments; AdamW8bit: its moments and their scales).
    states: Vec<Vec<Tensor>>,
    /// AdamW8bit's quantization maps on the device.
    maps: Vec<Tensor>,
    /// AdamW8bit's parameters given float32 moments whatever their size (the Trainer registers
    /// every `nn.Embedding`'s weight so: `optim_bits=32`).
    kept_32bit: Vec<Tensor>,
    /// Adafactor's RMS of each parameter, on the device, replaced at each step.
    rms: Vec<Option<Tensor>>,
}

/// The variables of Adafactor's loop over the parameters, which keep the last parameter's
/// tensors until the next parameter's replace them (and until `step` returns).
#[derive(Default)]
struct AdafactorLoop {
    /// `grad = p.grad`, made float32 (`grad.float()`) when in half precision.
    grad: Option<Tensor>,
    /// `p_data_fp32`: the parameter made float32 when in half precision.
    parameter: Option<Tensor>,
    update: Option<Tensor>,
}

impl OptimizerState {
    pub fn new(optimizer: Optimizer) -> OptimizerState {
        OptimizerState {
            optimizer,
            states: Vec::new(),
            maps: Vec::new(),
            kept_32bit: Vec::new(),
            rms: Vec::new(),
        }
    }

    /// The parameters AdamW8bit gives float32 moments whatever their size.
    pub fn keep_32bit(&mut self, params: Vec<Tensor>) {
        self.kept_32bit = params;
    }

    /// `step()` over its parameter groups (each in its order), whose gradients exist: per
    /// group, the group's states made at the first step, then its update.
    pub fn step(&mut self, p: &mut Process, groups: &[Vec<Tensor>]) {
        let first = self.states.is_empty();
        if self.optimizer == Optimizer::Adafactor {
            let params: Vec<&Tensor> = groups.iter().flatten().collect();
            return self.adafactor_step(p, &params, first);
        }
        for params in groups.iter().filter(|g| !g.is_empty()) {
            match self.optimizer {
                Optimizer::AdamW(implementation) => {
                    if first {
                        self.init_adamw(p, params, implementation);
                    }
                    adamw_update(p, params, implementation);
                }
                Optimizer::AdamW8bit { paged } => {
                    if first {
                        self.init_8bit(p, params, paged);
                    }
                }
                Optimizer::Adafactor => unreachable!("stepped above"),
            }
        }
    }

    /// AdamW's `_init_group`: per parameter the step counter on the device when fused, then
    /// the two moments.
    fn init_adamw(&mut self, p: &mut Process, params: &[Tensor], implementation: OptimizerImpl) {
        let fused = implementation == OptimizerImpl::Fused;
        p.in_role(Role::OptimizerStates, |p| {
            for w in params {
                let mut s = Vec::new();
                if fused {
                    s.push(p.empty(&[], Dtype::Float32));
                }
                s.push(p.empty_like(&super::tensor::Meta::of(w)));
                s.push(p.empty_like(&super::tensor::Meta::of(w)));
                self.states.push(s);
            }
        });
    }

    /// `AdamW8bit`'s states of each parameter made as its turn comes at the first step, the
    /// maps at the first 8-bit parameter's (paged: a large parameter's moments outside the
    /// allocator, their scales in it); its update kernels allocate nothing.
    fn init_8bit(&mut self, p: &mut Process, params: &[Tensor], paged: bool) {
        p.in_role(Role::OptimizerStates, |p| {
            for w in params {
                let kept = self.kept_32bit.iter().any(|k| k.shares_storage(w));
                if !kept && w.numel() >= MIN_8BIT_ELEMENTS && self.maps.is_empty() {
                    // `name2qmap["dynamic"]` and `["udynamic"]` moved to the device.
                    self.maps.push(p.empty(&[256], Dtype::Float32));
                    self.maps.push(p.empty(&[256], Dtype::Float32));
                }
                let states = (adamw_8bit_states(w.numel(), kept, paged).iter())
                    .filter(|&&(count, _, in_unified)| count > 0 && !in_unified)
                    .map(|&(count, elem, _)| p.empty(&[count], elem))
                    .collect();
                self.states.push(states);
            }
        });
    }
}

impl OptimizerState {
    /// Adafactor's `step`: each parameter in turn (the groups one after the other).
    fn adafactor_step(&mut self, p: &mut Process, params: &[&Tensor], first: bool) {
        let mut vars = AdafactorLoop::default();
        for (i, w) in params.iter().enumerate() {
            let shape = &w.shape;
            let n: u64 = shape.iter().product();
            let half = matches!(w.elem, Dtype::Bfloat16 | Dtype::Float16);
            let f32 = |p: &Process, shape: &[u64]| p.empty(shape, Dtype::Float32);
            let factored = shape.len() >= 2;
            let (rows, columns) = match factored {
                true => {
                    let (last, lead) = shape.split_last().expect("two dimensions");
                    let (_, outer) = lead.split_last().expect("two dimensions");
                    (lead.to_vec(), [outer, &[*last][..]].concat())
                }
                false => (vec![], vec![]),
            };
            // grad = p.grad; grad = grad.float()
            drop(vars.grad.take());
            p.in_role(Role::OptimizerStep, |p| {
                vars.grad = half.then(|| f32(p, shape));
            });
            if first {
                // The second moments: zeros made on the host, then moved (`.to(grad)`).
                p.in_role(Role::OptimizerStates, |p| {
                    self.states.push(match factored {
                        true => vec![f32(p, &rows), f32(p, &columns)],
                        false => vec![f32(p, shape)],
                    });
                });
                self.rms.push(None);
            }
            p.in_role(Role::OptimizerStep, |p| {
                // p_data_fp32 = p.float()
                drop(vars.parameter.take());
                vars.parameter = half.then(|| f32(p, shape));
                // state["RMS"] = norm(p_data_fp32) / numel ** 0.5, kept on the device.
                let norm = f32(p, &[]);
                p.reduction_staging(Reduction::whole(n), Dtype::Float32);
                let rms = p.in_role(Role::OptimizerStates, |p| f32(p, &[]));
                drop(norm);
                drop(self.rms[i].replace(rms));
                // update = grad ** 2 + eps
                let squared = f32(p, shape);
                let update = f32(p, shape);
                drop(squared);
                drop(vars.update.replace(update));
                let update = match factored {
                    true => {
                        // The row and column means into the moments, then `_approx_sq_grad`:
                        // rsqrt(row / row.mean()) ⊗ rsqrt(column).
                        let mean = |p: &mut Process, out: &[u64], kept: &[u64]| {
                            let m = f32(p, out);
                            p.reduction_staging(Reduction::sum_to(shape, kept), Dtype::Float32);
                            m
                        };
                        let unit = |dims: &[u64]| -> Vec<u64> { [dims, &[1][..]].concat() };
                        drop(mean(p, &rows, &unit(&rows)));
                        let column_kept: Vec<u64> = [
                            &rows[..rows.len() - 1],
                            &[1][..],
                            &[shape[shape.len() - 1]][..],
                        ]
                        .concat();
                        drop(mean(p, &columns, &column_kept));
                        let row_mean = f32(p, &unit(&rows[..rows.len() - 1]));
                        p.reduction_staging(
                            Reduction::sum_to(&rows, &unit(&rows[..rows.len() - 1])),
                            Dtype::Float32,
                        );
                        let row_factor = f32(p, &rows);
                        drop(row_mean);
                        let column_factor = f32(p, &columns);
                        let product = f32(p, shape);
                        drop(row_factor);
                        drop(column_factor);
                        product
                    }
                    // exp_avg_sq.rsqrt()
                    false => f32(p, shape),
                };
                drop(vars.update.replace(update));
                // update.div_((rms(update) / clip_threshold).clamp_(min=1.0))
                let rms = root_mean_square(p, n);
                let divisor = f32(p, &[]);
                drop(rms);
                drop(divisor);
                // p_data_fp32.add_(-update)
                drop(f32(p, shape));
            });
        }
        // The loop's variables go as `step` returns, in the order Python made them.
        drop(vars.grad);
        drop(vars.parameter);
        drop(vars.update);
    }
}

/// `tensor.norm(2) / tensor.numel() ** 0.5` of `n` float32 values: the norm (its reduction's
/// staging), the quotient returned.
fn root_mean_square(p: &mut Process, n: u64) -> Tensor {
    let norm = p.empty(&[], Dtype::Float32);
    p.reduction_staging(Reduction::whole(n), Dtype::Float32);
    let rms = p.empty(&[], Dtype::Float32);
    drop(norm);
    rms
}

/// One group's AdamW update: its temporaries (foreach: every square root of the group at once,
/// freed from the last; for-loop: one parameter's at a time; fused: none).
fn adamw_update(p: &mut Process, params: &[Tensor], implementation: OptimizerImpl) {
    p.in_role(Role::OptimizerStep, |p| match implementation {
        OptimizerImpl::Fused => {}
        OptimizerImpl::Foreach => {
            let sqrt: Vec<Tensor> = params.iter().map(|w| p.empty(&w.shape, w.elem)).collect();
            // A list goes from its last item to its first.
            for t in sqrt.into_iter().rev() {
                drop(t);
            }
        }
        OptimizerImpl::ForLoop => {
            for w in params {
                let sqrt = p.empty(&w.shape, w.elem);
                let denom = p.empty(&w.shape, w.elem);
                drop(sqrt);
                drop(denom);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_bit_states_follow_bitsandbytes_rules() {
        // 4 096 elements: 8-bit moments and 16 scales each; 4 095: float32 moments; 10^6
        // elements: 3 907 blocks (the last one partial); the two maps once.
        let bytes = adamw_8bit_state_bytes([(4096, false), (4095, false), (1_000_000, false)]);
        assert_eq!(
            bytes,
            (2 * 4096 + 2 * 4 * 16) + 2 * 4 * 4095 + (2 * 1_000_000 + 2 * 4 * 3907) + 2 * 1024
        );
        // No parameter large enough: no maps.
        assert_eq!(adamw_8bit_state_bytes([(100, false)]), 800);
        // One kept in 32 bits (the Trainer's embeddings): float32 moments, and no maps for it.
        assert_eq!(adamw_8bit_state_bytes([(1_000_000, true)]), 8_000_000);
    }
}
