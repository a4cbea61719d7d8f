//! `transformers.Trainer` 5.17 (with accelerate 1.15) around the model's training step, for
//! memory: what it allocates besides the forward, the backward and the optimizer's step, in the
//! order it does (read from transformers' `trainer.py`, accelerate's `accelerator.py` and PyTorch
//! 2.11's `clip_grad.py`, and checked against the H200's traces of `scripts/gpu/hf_loops.py`'s
//! Trainer runs). Its running loss on the device; the batches of each optimizer step (one, or
//! `gradient_accumulation_steps`) the language-modelling collator makes (input ids, attention
//! mask, labels) copied to the device with the count of the labels the loss is averaged over
//! (`num_items_in_batch`), the next step's drawn before the last ones are let go; a forward and a
//! backward for each batch, the gradients accumulated in place, then the clipping and the
//! optimizer's step; the loss summed, divided by that count and multiplied in place by the number
//! of processes; accelerate's division by the accumulation steps; with bf16 or fp16 mixed
//! precision, the model's outputs converted to float32; under fp16 the gradient scaler; the
//! check of the loss for NaN and infinity; `clip_grad_norm_` (foreach) every step, to clip the
//! gradients when `max_grad_norm` > 0, else to log their norm; the optimizer's two parameter
//! groups (with weight decay, then without).

use super::process::Process;
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::model::TensorRole;
use crate::replay::program::Role;

/// The Trainer's arguments that change what a step allocates (the others as transformers 5.17
/// defaults them: `optim="adamw_torch_fused"`, `use_cache=False`, one process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainerArgs {
    /// `max_grad_norm` > 0 (1.0 by default): the gradients clipped every step (`_clip_grad_norm`,
    /// a `stepN.clip` stage). At 0 the Trainer still computes their norm for its logs, through
    /// the same `clip_grad_norm_` (`_get_grad_norm`), at the end of the backward.
    pub clip: bool,
    /// `bf16=True` (or `fp16=True`): accelerate's mixed precision, the forward under autocast
    /// and its outputs converted to float32.
    pub mixed: Option<Dtype>,
    /// `gradient_accumulation_steps`: the batches each optimizer step runs forward and backward.
    pub accumulation: u64,
    /// TRL's `SFTTrainer` (its defaults: the fused LM head, [`super::sft`]) rather than the
    /// Trainer's own loss.
    pub sft: bool,
    /// TRL's `padding_free` (or `packing`, whose default strategy implies it): each batch's
    /// sequences flattened into one row by its collator ([`Batch::flattened`]).
    pub padding_free: bool,
}

/// The most batches an optimizer step accumulates over that a replay runs (each is a forward and
/// a backward: a bound on its work).
pub const MAX_ACCUMULATION: u64 = 4096;

/// One batch on the device, as `DataCollatorForLanguageModeling(mlm=False)` (or TRL's) makes it.
pub struct Batch {
    pub ids: Tensor,
    /// The attention mask (none padding-free).
    pub mask: Option<Tensor>,
    pub labels: Tensor,
    /// Padding-free: the positions, restarting at each sequence.
    pub positions: Option<Tensor>,
    /// Padding-free: what the collator adds for variable-length kernels (`cu_seq_lens_q`,
    /// `cu_seq_lens_k`, `seq_idx`), passed to the model, which SDPA does not read.
    pub lengths: Vec<Tensor>,
}

/// The shape of a step's batches: `rows` sequences of `tokens`, or with `flattened` the
/// sequences of each batch in one row of the tokens each batch holds.
#[derive(Debug, Clone)]
pub enum BatchShape {
    Rows { rows: u64, tokens: u64 },
    Flattened { sequences: u64, tokens: Vec<u64> },
}

impl Batch {
    /// The batch of `b` sequences of `t` tokens copied to the device (`send_to_device`, in the
    /// collator's order).
    fn copied(p: &mut Process, b: u64, t: u64) -> Batch {
        let [ids, mask, labels] = p.in_role(Role::Inputs, |p| {
            [(); 3].map(|_| p.empty(&[b, t], Dtype::Int64))
        });
        Batch {
            ids,
            mask: Some(mask),
            labels,
            positions: None,
            lengths: Vec::new(),
        }
    }

    /// TRL's padding-free batch of `sequences` flattened into one row of `tokens`, copied to the
    /// device in its collator's order: the ids, labels and positions, the cumulative lengths
    /// twice (int32, one more than the sequences) and each token's sequence index (int32).
    fn flattened(p: &mut Process, sequences: u64, tokens: u64) -> Batch {
        p.in_role(Role::Inputs, |p| {
            let [ids, labels, positions] = [(); 3].map(|_| p.empty(&[1, tokens], Dtype::Int64));
            let lengths = vec![
                p.empty(&[sequences + 1], Dtype::Int32),
                p.empty(&[sequences + 1], Dtype::Int32),
                p.empty(&[1, tokens], Dtype::Int32),
            ];
            Batch {
                ids,
                mask: None,
                labels,
                positions: Some(positions),
                lengths,
            }
        })
    }

    /// `[rows, tokens]` of its ids.
    fn shape(&self) -> (u64, u64) {
        (self.ids.shape[0], self.ids.shape[1])
    }
}

/// The batches of one optimizer step (`get_batch_samples`), and `num_items_in_batch`: the labels
/// that count (not `-100`) past each sequence's first position, over all of them.
pub struct Batches {
    pub batches: Vec<Batch>,
    pub items: Tensor,
}

impl Batches {
    /// `accumulation` batches of `shape` drawn from accelerate's loader (each copied to the
    /// device as it is drawn; flattened, the next of `drawn` so far takes the next token count,
    /// the last one repeated), then counted: `sum(batch["labels"][..., 1:].ne(-100).sum() for
    /// ...)`, each comparison's booleans summed through an int64 copy, Python's `sum` adding each
    /// count to the total so far (to 0 first) and letting the count go.
    pub fn load(
        p: &mut Process,
        accumulation: u64,
        shape: &BatchShape,
        drawn: &mut usize,
    ) -> Batches {
        let batches: Vec<Batch> = (0..accumulation)
            .map(|_| {
                *drawn += 1;
                match shape {
                    BatchShape::Rows { rows, tokens } => Batch::copied(p, *rows, *tokens),
                    BatchShape::Flattened { sequences, tokens } => {
                        let t = tokens.get(*drawn - 1).or(tokens.last()).copied();
                        Batch::flattened(p, *sequences, t.expect("a token count"))
                    }
                }
            })
            .collect();
        let mut total = None;
        for batch in &batches {
            let (b, t) = batch.shape();
            let counted = p.empty(&[b, t - 1], Dtype::Bool);
            let count = p.empty(&[], Dtype::Int64);
            let widened = p.empty(&[b, t - 1], Dtype::Int64);
            drop(widened);
            drop(counted);
            drop(total.replace(p.empty(&[], Dtype::Int64)));
            drop(count);
        }
        Batches {
            batches,
            items: total.expect("at least one batch"),
        }
    }

    /// Let go once the next step's batches are drawn: the list (its batches last first, but the
    /// last, which the loop's variable still holds), the count, then that last batch.
    pub fn release(mut self) {
        let last = self.batches.pop();
        while let Some(batch) = self.batches.pop() {
            drop(batch);
        }
        drop(self.items);
        drop(last);
    }
}

/// The Trainer's running loss (`self._tr_loss = torch.tensor(0.0)` on the device).
pub fn running_loss(p: &mut Process) -> Tensor {
    p.empty(&[], Dtype::Float32)
}

/// `logging_nan_inf_filter`: `torch.isnan(loss) or torch.isinf(loss)`, each read back (`isinf`
/// through the absolute value compared with infinity); the sum into the running loss is in place.
pub fn check_loss(p: &mut Process, loss: &Tensor) {
    let nan = p.empty(&[], Dtype::Bool);
    drop(nan);
    let absolute = p.empty(&[], loss.elem);
    let inf = p.empty(&[], Dtype::Bool);
    drop(absolute);
    drop(inf);
}

/// `torch.amp.GradScaler` as accelerate runs it under `fp16=True` (PyTorch 2.11's
/// `grad_scaler.py`): its scale and growth tracker (made at the first `scale`, kept), the loss
/// multiplied by the scale before each backward, the gradients unscaled before they are clipped,
/// and what its `step` and `update` hold around the optimizer's step.
#[derive(Default)]
pub struct GradScaler {
    state: Option<[Tensor; 2]>,
    /// The copy of `found_inf` the optimizer's state keeps from `unscale_` to `update`.
    found_inf: Option<Tensor>,
}

impl GradScaler {
    /// `scale(loss)`: `loss * scale`, a product autograd records (the scale and growth tracker
    /// made the first time).
    pub fn scale(&mut self, p: &mut Process, loss: &Tensor) -> Tensor {
        if self.state.is_none() {
            let scale = p.empty(&[], Dtype::Float32);
            let growth = p.empty(&[], Dtype::Int32);
            self.state = Some([scale, growth]);
        }
        p.scale(loss)
    }

    /// `unscale_(optimizer)`: the inverse scale computed in float64 then cast, `found_inf`, and
    /// `_unscale_grads_`'s copies of both for the device (`found_inf`'s first, as the call reads
    /// its arguments), the inverse scale's let go with the function's locals; the copy of
    /// `found_inf` kept.
    pub fn unscale(&mut self, p: &mut Process) {
        // Two float64 scalars (8 bytes each, as an int64's: the emulation has no float64).
        let double = p.empty(&[], Dtype::Int64);
        let reciprocal = p.empty(&[], Dtype::Int64);
        drop(double);
        let inverse = p.empty(&[], Dtype::Float32);
        drop(reciprocal);
        let found_inf = p.empty(&[], Dtype::Float32);
        self.found_inf = Some(p.empty(&[], Dtype::Float32));
        let inverse_copy = p.empty(&[], Dtype::Float32);
        drop(inverse_copy);
        drop(inverse);
        drop(found_inf);
    }

    /// `step(optimizer)` around the optimizer's own `step` (`optimizer_step`): a fused optimizer
    /// is handed `found_inf` summed over the devices (`sum([...])`, a new tensor), dropped once it
    /// stepped; the others are stepped after a read of it. Then `update()`, which lets the copy of
    /// `found_inf` go.
    pub fn step(
        &mut self,
        p: &mut Process,
        fused: bool,
        optimizer_step: impl FnOnce(&mut Process),
    ) {
        let summed = fused.then(|| p.empty(&[], Dtype::Float32));
        optimizer_step(p);
        drop(summed);
        drop(self.found_inf.take());
    }
}

/// The elements one block of `_foreach_norm`'s multi-tensor kernel reduces (PyTorch's
/// `kChunkSize`).
const FOREACH_CHUNK: u64 = 65_536;

/// `clip_grad_norm_(parameters, max_norm)` with the foreach implementation, on the gradients of
/// the trained parameters in their order; returns the total norm (kept by the Trainer until the
/// next step's). Per group of one dtype, `_foreach_norm`: its float32 partial sums (every
/// tensor's as many chunks as the largest tensor has), each tensor's norm in the gradients' dtype;
/// then the norms stacked and their norm; the list freed last to first. Then the coefficient:
/// `max_norm / (total + 1e-6)` (a tensor's `__rtruediv__`: its reciprocal times the number),
/// clamped at 1, and every gradient multiplied in place.
pub fn clip_grad_norm(p: &mut Process, grads: &[Tensor]) -> Option<Tensor> {
    if grads.is_empty() {
        return None;
    }
    let mut groups: Vec<(Dtype, Vec<&Tensor>)> = Vec::new();
    for g in grads {
        match groups.iter_mut().find(|(d, _)| *d == g.elem) {
            Some((_, members)) => members.push(g),
            None => groups.push((g.elem, vec![g])),
        }
    }
    let mut norms = Vec::new();
    for (elem, members) in &groups {
        let chunks = (members.iter())
            .map(|g| g.shape.iter().product::<u64>().div_ceil(FOREACH_CHUNK))
            .max()
            .unwrap_or(1);
        let partial = p.empty(&[members.len() as u64 * chunks], Dtype::Float32);
        norms.extend(members.iter().map(|_| p.empty(&[], *elem)));
        drop(partial);
    }
    let elem = (groups.iter().map(|(e, _)| *e))
        .reduce(Dtype::promote)
        .expect("a group");
    let stacked = p.empty(&[norms.len() as u64], elem);
    let total = p.empty(&[], elem);
    drop(stacked);
    while let Some(norm) = norms.pop() {
        drop(norm);
    }
    let shifted = p.empty(&[], elem);
    let reciprocal = p.empty(&[], elem);
    let coefficient = p.empty(&[], elem);
    drop(reciprocal);
    drop(shifted);
    let clamped = p.empty(&[], elem);
    drop(coefficient);
    drop(clamped);
    Some(total)
}

/// Whether the Trainer has bitsandbytes give the parameter of `role` float32 moments whatever
/// its optimizer's bits: it registers every `nn.Embedding`'s weight so (`optim_bits=32`).
pub fn optimized_in_32_bits(role: TensorRole) -> bool {
    role == TensorRole::Embedding
}

/// Whether the Trainer's optimizer applies weight decay to the parameter named `name`
/// (`get_decay_parameter_names`: not a bias, not a norm's weight, the names lower-cased).
pub fn decays(name: &str) -> bool {
    let name = name.to_lowercase();
    let norm = |part: &str| part == "norm" || part.ends_with("_norm");
    !(name.contains("bias")
        || name.contains("layernorm")
        || name.contains("rmsnorm")
        || name.split('.').any(norm))
}
