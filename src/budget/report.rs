//! The budget and the fit plan as a person reads them: text tables with exact bytes beside GiB
//! and GB, and the same tables in HTML for notebooks.

use super::compute::Budget;
use super::fit::{Basis, FitPlan, FitRow};
use super::terms::{Split, Term};
use super::workload::{AllocatorSetting, Mode, Optimizer, WeightFormat};
use crate::markup::{table, Html, Table};
use crate::units::{grouped, Bytes, ROUNDING_RULE};
use std::fmt;

/// Column titles of the budget table.
pub const TERM_COLUMNS: [&str; 7] = [
    "term", "at peak", "GiB", "GB", "own size", "status", "split",
];
/// Column titles of the stages table.
pub const STAGE_COLUMNS: [&str; 5] = ["stage", "peak allocated", "GiB", "peak reserved", "GiB"];
/// Column titles of the fit table.
pub const FIT_COLUMNS: [&str; 9] = [
    "GPU",
    "days",
    "lots",
    "GPUs",
    "room / GPU",
    "need / GPU",
    "headroom / GPU",
    "verdict",
    "total price",
];

impl Budget {
    /// Why this budget's verdicts are not replayed ones, where they are not: a checkpoint saved
    /// quantized otherwise than in NF4.
    pub fn not_replayed(&self) -> Option<&'static str> {
        (self.workload.weights == WeightFormat::Prequantized).then_some(
            "NOT A REPLAYED VERDICT: the weights as the checkpoint stores them and the KV cache \
             are exact, but the products through the quantization's kernels are replayed as \
             16-bit products (their outputs alone): the kernels' own temporaries, and a \
             repacking of the weights as they load (Marlin's, ExLlama's buffers), are not \
             emulated, and no run of this format was recorded on a GPU. The terms that depend \
             on them say `partial`.",
        )
    }

    /// One line naming the workload.
    pub fn title(&self) -> String {
        let w = &self.workload;
        let weights = match (w.weights, w.autocast) {
            (WeightFormat::Nf4, _) if w.loads_saved_nf4() => {
                format!(
                    "NF4 weights as the checkpoint saved them, {} compute",
                    w.dtype
                )
            }
            (WeightFormat::Nf4, _) => format!("NF4 weights, {} compute", w.dtype),
            (WeightFormat::Prequantized, _) => format!(
                "{} weights as the checkpoint saved them, {} compute",
                w.model
                    .quantization
                    .map(|q| q.described())
                    .unwrap_or_default(),
                w.dtype
            ),
            (_, Some(a)) => format!("{} weights under {a} autocast", w.dtype),
            _ => w.dtype.to_string(),
        };
        let mode = match &w.mode {
            Mode::Inference { generated } => format!(
                "generate, batch {}, {} prompt + {generated} new tokens{}{}{}{}",
                w.batch,
                grouped(w.context),
                match w.applied_repetition_penalty() {
                    Some(p) => format!(", repetition penalty {p}"),
                    None => String::new(),
                },
                match &w.sample {
                    Some(s) => format!(", sampling ({})", s.warper_values()),
                    None => String::new(),
                },
                match w.beams() {
                    1 => String::new(),
                    n => format!(", beam search over {n} beams"),
                },
                match w.offloaded_cache {
                    true => ", offloaded cache",
                    false => "",
                }
            ),
            Mode::Lora { rank, .. } => format!(
                "LoRA rank {rank}{}, batch {}, sequence {}",
                match w.applied_lora_dropout() {
                    Some(p) => format!(" with dropout {p}"),
                    None => String::new(),
                },
                w.batch,
                grouped(w.context)
            ),
            Mode::Full { optimizer } => format!(
                "full training ({}), batch {}, sequence {}",
                match optimizer {
                    Optimizer::Adamw => format!("{} {}", optimizer.name(), w.optimizer_impl),
                    Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit | Optimizer::Adafactor => {
                        optimizer.name().to_string()
                    }
                },
                w.batch,
                grouped(w.context)
            ),
        };
        let mut extras = Vec::new();
        if w.sft {
            extras.push("TRL SFTTrainer".to_string());
        } else if w.trainer {
            extras.push("transformers Trainer".to_string());
        }
        if w.accumulation > 1 {
            extras.push(format!(
                "gradients accumulated over {} batches",
                w.accumulation
            ));
        }
        if w.padded {
            extras.push("padded rows".to_string());
        }
        if w.padding_free {
            extras.push(format!(
                "padding-free (one row of {} tokens)",
                grouped(w.batch * w.context)
            ));
        }
        if let Some(n) = w.completion_tokens {
            extras.push(format!(
                "loss on the last {} tokens of each row",
                grouped(n)
            ));
        }
        if w.checkpointing {
            extras.push("gradient checkpointing".to_string());
        }
        if w.allocator == AllocatorSetting::ExpandableSegments {
            extras.push("expandable segments".to_string());
        }
        let extras = if extras.is_empty() {
            String::new()
        } else {
            format!(", {}", extras.join(", "))
        };
        format!(
            "{} ({}), {weights}, {mode}{extras}",
            w.source,
            w.model.type_name()
        )
    }

    fn cells(t: &Term) -> Vec<String> {
        vec![
            t.name.clone(),
            t.at_peak.grouped(),
            t.at_peak.gib(2).to_string(),
            t.at_peak.gb(2).to_string(),
            if t.bytes == t.at_peak {
                "=".into()
            } else {
                t.bytes.gib_text()
            },
            t.status.name().into(),
            split_name(t.split).into(),
        ]
    }

    fn summary(&self) -> Vec<(String, Bytes)> {
        vec![
            ("peak of allocated".into(), self.peak_allocated),
            ("peak of reserved".into(), self.peak_reserved),
            ("most in use (allocated + outside)".into(), self.peak_in_use),
            ("card at its fullest + reserve".into(), self.total),
            ("needed, with the margin".into(), self.needed),
        ]
    }

    /// The Trainer's `optim` the workload stands for.
    fn trainer_optim(&self) -> &'static str {
        let w = &self.workload;
        match (&w.mode, w.optimizer_impl) {
            (
                crate::budget::Mode::Full {
                    optimizer: crate::budget::Optimizer::Adamw8bit,
                },
                _,
            ) => "adamw_8bit",
            (
                crate::budget::Mode::Full {
                    optimizer: crate::budget::Optimizer::PagedAdamw8bit,
                },
                _,
            ) => "paged_adamw_8bit",
            (
                crate::budget::Mode::Full {
                    optimizer: crate::budget::Optimizer::Adafactor,
                },
                _,
            ) => "adafactor",
            (_, crate::stack::optimizer::OptimizerImpl::Fused) => "adamw_torch_fused",
            _ => "adamw_torch",
        }
    }

    /// The `TrainingArguments` the budget assumes (transformers 5.17's defaults but those the
    /// workload sets), one process.
    fn trainer_arguments(&self) -> String {
        let w = &self.workload;
        let precision = match (w.autocast, w.dtype) {
            (Some(crate::dtype::Dtype::Float16), _) | (None, crate::dtype::Dtype::Float16) => {
                "fp16=True (autocast to float16, its gradient scaler)"
            }
            (Some(_), _) | (None, crate::dtype::Dtype::Bfloat16) => "bf16=True",
            _ => "no mixed precision",
        };
        let optim = self.trainer_optim();
        format!(
            "TrainingArguments assumed: per_device_train_batch_size={}, {precision}, \
             optim=\"{optim}\", max_grad_norm=1.0 (0 allocates the same: the Trainer still \
             computes the gradients' norm for its logs), gradient_accumulation_steps={}, \
             gradient_checkpointing={}, one process; the others transformers 5.17's defaults.",
            w.batch,
            w.accumulation,
            if w.checkpointing { "True" } else { "False" }
        )
    }

    /// How bitsandbytes multiplies by the 4-bit weights on the GPU the budget assumes, and what
    /// of it is proven.
    fn nf4_products(&self) -> String {
        let w = &self.workload;
        let k = self.kernels;
        let derived = match w.mode {
            Mode::Inference { .. } => Some(
                "Serving a checkpoint saved in NF4: derived from 2 traces recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every stage's peaks replayed to the \
                 byte; proven on 6 runs held out (data/hf-proof-nf4-h100.json).",
            ),
            _ if w.batch * w.context <= crate::stack::bitsandbytes::DEQUANTIZING_ROWS => Some(
                "QLoRA of 1 536 tokens a step or fewer (the choice made in each forward): derived \
                 from bitsandbytes' dispatch, not yet proven on runs held out.",
            ),
            _ => None,
        };
        format!(
            "bitsandbytes' 4-bit products (bitsandbytes 0.50): each layer's kernel chosen as \
             `gemm_4bit` chooses it on a GPU of compute capability {} with {} multiprocessors \
             (--compute-capability, --multiprocessors): its own kernel at few rows for the \
             layer's shape (its output the only allocation), else the weight dequantized to {} \
             for the product and freed after it; above 1 536 rows, always dequantized.{}",
            k.compute_capability,
            k.reduction_grid.multiprocessors,
            w.dtype,
            derived.map(|d| format!(" {d}")).unwrap_or_default()
        )
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = vec![format!(
            "The run replayed through the allocator model, every allocation and free of the \
             Hugging Face stack in its order: the card is fullest (reserved and what lives \
             outside the allocator) in the {} stage.",
            self.peak_stage
        )];
        // Each read since: what it is, its held-out report, and the worst error on a run's peak
        // of reserved there.
        if let Some((what, plan, worst)) = match self.workload.model.model_type {
            crate::model::ModelType::Glm4 => Some((
                "GLM-4 (its four norms a layer, fused gate_up_proj, biased q, k and v, the \
                 rotary over part of each head with its pairs interleaved)",
                "glm4",
                "to the byte",
            )),
            crate::model::ModelType::Starcoder2 => Some((
                "StarCoder2 (layer norms with biases, a plain MLP with tanh GELU, every projection \
                 biased)",
                "starcoder2",
                "within 0.018 %",
            )),
            crate::model::ModelType::Cohere => Some((
                "Cohere (one layer norm a layer in float32, the attention and the MLP side by \
                 side, its rotary in float32 over interleaved pairs, the logits scaled)",
                "cohere",
                "within 0.076 %",
            )),
            _ => None,
        } {
            let held_out = format!(
                "proven on 9 runs held out at public widths (scripts/gpu/hf-proof-plan-{plan}.json, \
                 written before any run), every verdict on two cards right, peaks of reserved \
                 {worst} (data/hf-proof-{plan}-h100.json)"
            );
            notes.push(format!(
                "{what}: derived from 4 traces recorded on an H100 at 2 layers of 320 wide \
                 (served, trained fully, LoRA, LoRA with recomputation; \
                 docs/gpu-runs/2026-12-05-h100-records), every stage's peak of reserved \
                 replayed to the byte; {held_out}."
            ));
        }
        if self.workload.sft {
            let w = &self.workload;
            let labelled = match w.completion_tokens {
                Some(n) => format!(
                    "the loss on each row's completion alone (--completion-tokens: TRL's \
                     completion_only_loss), {} positions labelled a batch (batch × {}), proven \
                     on 5 runs held out (data/hf-proof-completion-h100.json)",
                    grouped(w.batch * n),
                    grouped(n)
                ),
                None => "every position of every row counted as labelled (batch × (sequence - \
                         1), the most there can be: --completion-tokens counts a completion \
                         alone)"
                    .into(),
            };
            notes.push(format!(
                "TRL's SFTTrainer (--sft, TRL 1.16 on the Trainer): its fused LM head gathers the \
                 positions with a label and scores them in tiles of 4 096 positions by 32 768 \
                 vocabulary entries, with float32 accumulators of the gradients, instead of \
                 making the logits; {labelled}. Derived from 3 traces recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records) whose batches had as many labelled \
                 positions as their rows' labels gave, every stage's peaks replayed to the byte; \
                 proven on 5 runs held out (data/hf-proof-padded-h100.json)."
            ));
        }
        if self.workload.padding_free {
            let w = &self.workload;
            notes.push(format!(
                "Padding-free batches (--padding-free: TRL's padding_free=True, or packing=True, \
                 whose bfd strategy implies it): each batch's {} sequences of {} tokens \
                 flattened into one row of {} tokens with their positions restarting at each, no \
                 attention mask; transformers finds the packed sequences from the positions and \
                 builds their block-diagonal causal mask for SDPA, {} booleans held through the \
                 forward (the attention kernels with a mask then run over the whole row). \
                 Derived from 2 traces recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every allocation as recorded; proven \
                 on 5 runs held out (data/hf-proof-padding-free-h100.json).",
                w.batch,
                grouped(w.context),
                grouped(w.batch * w.context),
                grouped((w.batch * w.context).pow(2)),
            ));
        }
        if self.workload.trainer {
            notes.push(self.trainer_arguments());
            let optim = self.trainer_optim();
            if optim.ends_with("adamw_8bit") {
                notes.push(format!(
                    "optim=\"{optim}\": bitsandbytes' 8-bit AdamW, the embeddings' weight kept in \
                     float32 as the Trainer registers it (optim_bits=32){}. Derived from a trace \
                     recorded on the H200 (docs/gpu-runs/2026-12-04-h200-records), every stage's \
                     peaks replayed to the byte; proven on a run held out \
                     (data/hf-proof-padded-h100.json).",
                    match optim {
                        "paged_adamw_8bit" => {
                            "; the moments of parameters of 100 000 elements or more paged in \
                             CUDA unified memory, outside the allocator and the card's need"
                        }
                        _ => "",
                    }
                ));
            }
            if self.trainer_optim() == "adafactor" {
                notes.push(
                    "optim=\"adafactor\": transformers' Adafactor (scale_parameter=False, \
                     relative_step=False), one parameter at a time: float32 copies of a \
                     half-precision gradient and parameter, the update's temporaries as large as \
                     the parameter, the last parameter's kept until the step returns. Derived from \
                     a trace recorded on the H200 (docs/gpu-runs/2026-12-04-h200-records), every \
                     stage's peaks replayed to the byte; proven on 2 runs held out \
                     (data/hf-proof-padded-h100.json)."
                        .into(),
                );
            }
        }
        if self.workload.weights == WeightFormat::Nf4 {
            notes.push(self.nf4_products());
        }
        if let Some(n) = self.not_replayed() {
            notes.push(n.into());
        }
        if self.workload.applied_repetition_penalty().is_some() {
            notes.push(
                "A repetition penalty (--repetition-penalty): for every token, the logits of the \
                 tokens seen so far gathered, penalized and scattered into a float32 copy of the \
                 logits, held until the next token's. Derived from a run recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every allocation as recorded; proven \
                 on 3 runs held out (data/hf-proof-padded-h100.json)."
                    .into(),
            );
        }
        if let Some(g) = &self.workload.generation_config {
            notes.push(format!(
                "generate's defaults read from the model's generation_config.json ({}), as \
                 transformers applies them where the call gives none: the flags given \
                 (--sample, --greedy, --temperature, --top-k, --top-p, --repetition-penalty, \
                 --num-beams) \
                 come first.",
                crate::model::generation::described(g)
            ));
        }
        if self.workload.offloaded_cache {
            notes.push(
                "The offloaded cache (--cache-implementation offloaded): each full layer's keys \
                 and values go to the CPU once its update returns (the attention's references \
                 let go after it), and the next full layer's come back before its update on a \
                 stream of their own, whose blocks the allocator keeps in that stream's pool; the \
                 sliding layers stay on the GPU. Derived from a run recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every allocation as recorded; not yet \
                 proven on runs held out."
                    .into(),
            );
        }
        if self.workload.beams() > 1 {
            notes.push(format!(
                "Beam search (--num-beams {}): the prompt's rows repeated for each beam before \
                 the prefill, the running and finished sequences held at their final length, \
                 each token's float32 log-softmax over every beam's vocabulary ranked into \
                 candidates, and the KV cache of every layer gathered anew for the beams kept; \
                 {} candidates for each beam (two, and one more for each \
                 end-of-sequence token the model's generation config names past the first). Run \
                 to --generated tokens (an end-of-sequence token can only stop it sooner; the \
                 check for one, a few bytes a token, is not replayed). \
                 Derived from 3 traces recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every stage's peaks replayed to the \
                 byte; proven on 9 runs held out (data/hf-proof-beams-h100.json).",
                self.workload.beams(),
                self.workload.candidates_per_beam()
            ));
        }
        if let Some(s) = &self.workload.sample {
            notes.push(format!(
                "Sampling (--sample: {}): at every token the warpers' outputs (float32 copies of \
                 the scores), top-k's selection, top-p's sort of the whole vocabulary and its \
                 cumulative softmax, then the probabilities and multinomial's draw; the sort's \
                 and top-k's temporaries as PyTorch 2.11 and cub take them (their tiles cub's on \
                 sm90, the reductions' grids {} multiprocessors' (--multiprocessors)). Derived \
                 from 4 traces recorded on the H200 (docs/gpu-runs/2026-12-04-h200-records), \
                 every stage's peaks replayed to the byte: 3 and 4 rows; one row and 128 rows or \
                 more take other paths, derived from PyTorch's source; proven on 10 runs held \
                 out (data/hf-proof-sampling-h100.json), but for one prefill's reserved (7 % \
                 over) and one card's verdict (one batch short).",
                s.warper_values(),
                self.kernels.reduction_grid.multiprocessors
            ));
        }
        if self.workload.applied_lora_dropout().is_some() {
            notes.push(
                "LoRA dropout (--lora-dropout): each adapter's input, cast to float32, goes \
                 through dropout, whose boolean mask is kept for the backward where the input \
                 needs a gradient. Derived from a Trainer run recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every stage's peaks replayed to the \
                 byte; proven on 4 runs held out (data/hf-proof-padded-h100.json)."
                    .into(),
            );
        }
        if self.workload.padded {
            notes.push(
                "A padded batch (--padded: rows shorter than --context padded to it): each \
                 forward builds the causal mask of the padded rows (booleans [batch, 1, queries, \
                 keys]) and each attention layer adds it as a bias in the weights' type, which a \
                 training keeps for its backward. Derived from 9 traces recorded on the H200 \
                 (docs/gpu-runs/2026-12-04-h200-records), every stage's peak of reserved \
                 replayed to the byte; proven on 15 runs held out \
                 (data/hf-proof-padded-h100.json)."
                    .into(),
            );
        } else if self.workload.trainer {
            notes.push(
                "Batches of equal lengths (every sequence --context tokens): with rows of \
                 different lengths, --padded replays the collator's padded batch and its mask."
                    .into(),
            );
        }
        if self.workload.mask_orders().len() > 1 {
            notes.push(
                "Its masks come in the order the process's string hashing gives \
                 `set(layer_types)` (random in every Python process): the run is replayed in both \
                 orders, the budget is the one with the higher peak of reserved and a card holds \
                 it only if it holds both."
                    .into(),
            );
        }
        for t in &self.terms {
            let status = match &t.status {
                super::TermStatus::Replayed { bound } => format!(" [replayed: {bound}]"),
                super::TermStatus::Measured { on, source } => {
                    format!(" [measured on {on}: {source}]")
                }
                _ => String::new(),
            };
            notes.push(format!("{}: {}{status}", t.name, t.formula));
        }
        if let Some(c) = &self.checkpoint {
            notes.push(format!(
                "Model files: {}.",
                c.agreement(&self.workload.model)
            ));
        }
        notes.push(format!(
            "Margin: {} = {} ({}).",
            self.margin.grouped(),
            self.margin.gib_text(),
            self.margin_source
        ));
        notes.push("own size: the term's own bytes where they differ from what it holds at the peak (= when equal).".into());
        notes.push(format!(
            "1 GiB = 2^30 bytes, 1 GB = 10^9 bytes; {ROUNDING_RULE}."
        ));
        notes
    }

    /// The terms, then the peaks and totals, as table rows.
    fn rows(&self) -> Vec<Vec<String>> {
        let mut rows: Vec<Vec<String>> = self.terms.iter().map(Self::cells).collect();
        for (label, b) in self.summary() {
            let mut row = vec![
                label,
                b.grouped(),
                b.gib(2).to_string(),
                b.gb(2).to_string(),
            ];
            row.resize(TERM_COLUMNS.len(), String::new());
            rows.push(row);
        }
        rows
    }

    /// Each stage's peaks, allocated and reserved side by side.
    pub fn stage_rows(&self) -> Vec<Vec<String>> {
        self.stages
            .iter()
            .map(|s| {
                vec![
                    s.stage.clone(),
                    s.peak_allocated.grouped(),
                    s.peak_allocated.gib(2).to_string(),
                    s.peak_reserved.grouped(),
                    s.peak_reserved.gib(2).to_string(),
                ]
            })
            .collect()
    }

    pub fn html(&self) -> Html {
        let mut h = table(
            &format!("Budget — {}", self.title()),
            &TERM_COLUMNS,
            &self.rows(),
        )
        .then(table(
            "Each stage of the replayed run",
            &STAGE_COLUMNS,
            &self.stage_rows(),
        ));
        for n in self.notes() {
            h = h.then(Html::note(&n));
        }
        h
    }
}

fn split_name(s: Split) -> &'static str {
    match s {
        Split::Sharded => "sharded",
        Split::KvHeads => "by KV heads",
        Split::PerGpu => "per GPU",
    }
}

/// `rows` under `header` as aligned text columns (first column left, others right).
fn text_table(f: &mut fmt::Formatter<'_>, header: &[&str], rows: &[Vec<String>]) -> fmt::Result {
    write!(f, "{}", Table::new(header, rows.to_vec()).with_gap(2))
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Budget — {}", self.title())?;
        writeln!(
            f,
            "{} parameters, {} trained",
            grouped(self.parameters),
            grouped(self.trainable_parameters)
        )?;
        text_table(f, &TERM_COLUMNS, &self.rows())?;
        writeln!(f, "Each stage of the replayed run:")?;
        text_table(f, &STAGE_COLUMNS, &self.stage_rows())?;
        for n in self.notes() {
            writeln!(f, "- {n}")?;
        }
        Ok(())
    }
}

fn basis_name(b: Basis) -> &'static str {
    match b {
        Basis::PeakFits => "fits (peak)",
        Basis::ReplayCompleted => "fits (replayed on the card)",
        Basis::WithinMargin => "fits, within the margin",
        Basis::ReplayOutOfMemory => "out of memory",
        Basis::SplitEstimate => "split estimate",
        Basis::RankReplay => "FSDP2 ranks replayed",
        Basis::RankReplayWithinMargin => "FSDP2 ranks, within the margin",
        Basis::TensorParallelReplay => "TP rank replayed",
        Basis::TensorParallelWithinMargin => "TP rank, within the margin",
        Basis::DdpReplay => "DDP rank replayed",
        Basis::DdpWithinMargin => "DDP rank, within the margin",
    }
}

impl FitRow {
    fn cells(&self) -> Vec<String> {
        let (lots, gpus, need, headroom, price, verdict) = match &self.fit {
            Some(fit) => (
                fit.lots.to_string(),
                fit.gpus.to_string(),
                fit.need_per_gpu.gib_text(),
                fit.headroom_per_gpu.gib_text(),
                fit.total_usd_cents.to_string(),
                basis_name(fit.basis).to_string(),
            ),
            None if self.lot_above_max_gpus => (
                "—".into(),
                "—".into(),
                "not tried".into(),
                "a lot holds more GPUs than --max-gpus".into(),
                "—".into(),
                "—".into(),
            ),
            None => (
                "—".into(),
                "—".into(),
                "does not fit".into(),
                self.shortfall
                    .map_or("—".into(), |s| format!("short by {}", s.gib_text())),
                "—".into(),
                basis_name(self.basis).to_string(),
            ),
        };
        // On one GPU, what the other allocator setting would do.
        let verdict = match self.other_setting {
            Some(o) => format!(
                "{verdict}; 1 GPU {} with {}",
                if o.fits { "fits" } else { "runs out" },
                match o.allocator {
                    AllocatorSetting::ExpandableSegments => "expandable segments",
                    AllocatorSetting::Default => "the default allocator",
                }
            ),
            None => verdict,
        };
        vec![
            format!("{} ({})", self.model, self.display_name),
            self.duration_days.to_string(),
            lots,
            gpus,
            self.room_per_gpu.gib_text(),
            need,
            headroom,
            verdict,
            price,
        ]
    }
}

impl FitPlan {
    fn verdict(&self) -> String {
        match (self.cheapest(), self.smallest_shortfall()) {
            (Some(r), _) => {
                let fit = r.fit.as_ref().expect("a fitting row");
                format!(
                    "Cheapest: {} lot(s) of {} ({} GPU(s)) for {} days, {} ({}).",
                    fit.lots,
                    r.model,
                    fit.gpus,
                    r.duration_days,
                    fit.total_usd_cents,
                    basis_name(fit.basis)
                )
            }
            (None, Some(r)) => format!(
                "Nothing in the catalog fits on up to {} GPUs; the smallest shortfall is {} per GPU, on {}.",
                self.max_gpus,
                r.shortfall.expect("a short row").gib_text(),
                r.model
            ),
            (None, None) => "Nothing in the catalog fits.".into(),
        }
    }

    fn caption(&self) -> String {
        format!(
            "Fit — {} (on one GPU the run uses {} at its fullest; with the reserve and the \
             margin, a card of {})",
            self.workload,
            self.need_on_one_gpu.gib_text(),
            self.budget_needed.gib_text()
        )
    }

    pub fn html(&self) -> Html {
        let rows: Vec<Vec<String>> = self.rows.iter().map(FitRow::cells).collect();
        table(&self.caption(), &FIT_COLUMNS, &rows)
            .then(Html::note(&self.verdict()))
            .then(
                self.not_replayed
                    .as_deref()
                    .map_or(Html(String::new()), Html::note),
            )
            .then(Html::note(&format!("Room: {}", self.margin_rule)))
            .then(Html::note(&format!("Split rule: {}", self.split_rule)))
            .then(Html::note(&format!("Catalog: {}", self.catalog)))
            .then(Html::note(self.catalog.banner()))
    }
}

impl fmt::Display for FitPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.caption())?;
        let rows: Vec<Vec<String>> = self.rows.iter().map(FitRow::cells).collect();
        text_table(f, &FIT_COLUMNS, &rows)?;
        writeln!(f, "{}", self.verdict())?;
        if let Some(n) = &self.not_replayed {
            writeln!(f, "{n}")?;
        }
        writeln!(f, "Usable memory: {}", self.margin_rule)?;
        writeln!(f, "Split rule: {}", self.split_rule)?;
        writeln!(f, "Catalog: {}", self.catalog)?;
        write!(f, "{}", self.catalog.banner())
    }
}

const RANK_COLUMNS: [&str; 5] = [
    "rank",
    "peak allocated",
    "peak reserved",
    "need / GPU",
    "at its fullest",
];

impl fmt::Display for super::fit::RankBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.strategy {
            super::fit::Strategy::Fsdp2 => writeln!(
                f,
                "FSDP2 over {} GPUs, each rank running the batch ({}): {} per GPU",
                self.gpus,
                match self.ranks.len() {
                    1 => "every rank holding as many rows of each shard, alike: rank 0 replayed",
                    _ => "replayed rank by rank",
                },
                self.need_per_gpu.gib_text()
            )?,
            super::fit::Strategy::TensorParallel => writeln!(
                f,
                "Tensor parallelism over {} of {} GPUs (the most that split the model evenly), \
                 every rank alike (rank 0 replayed): {} per GPU",
                self.world,
                self.gpus,
                self.need_per_gpu.gib_text()
            )?,
            super::fit::Strategy::Ddp => writeln!(
                f,
                "DDP over {} GPUs, every rank holding the whole model and running the batch \
                 (rank 0 replayed): {} per GPU",
                self.gpus,
                self.need_per_gpu.gib_text()
            )?,
        }
        let rows: Vec<Vec<String>> = (self.ranks.iter())
            .map(|r| {
                // The roles of a mebibyte or more (the JSON has them all).
                let held: Vec<String> = (r.at_peak.iter())
                    .filter(|h| h.bytes.0 >= 1 << 20)
                    .map(|h| format!("{} {}", h.role, h.bytes.gib_text()))
                    .collect();
                vec![
                    r.rank.to_string(),
                    r.peak_allocated.gib_text(),
                    r.peak_reserved.gib_text(),
                    r.need_per_gpu.gib_text(),
                    format!("{}: {}", r.peak_stage, held.join(", ")),
                ]
            })
            .collect();
        text_table(f, &RANK_COLUMNS, &rows)?;
        write!(f, "Rule: {}", self.rule)
    }
}

const SPREAD_COLUMNS: [&str; 5] = [
    "GPUs",
    "ranks",
    "need / GPU, replayed",
    "split estimate",
    "estimate − replay",
];

impl super::fit::Spread {
    fn caption(&self) -> String {
        format!(
            "Over several GPUs by {}: {}",
            self.strategy.name(),
            self.workload
        )
    }

    fn cells(&self) -> Vec<Vec<String>> {
        (self.rows.iter())
            .map(|r| {
                let (e, p) = (r.split_estimate.0, r.replayed.0);
                let sign = if e >= p { "" } else { "−" };
                vec![
                    r.gpus.to_string(),
                    r.world.to_string(),
                    r.replayed.gib_text(),
                    r.split_estimate.gib_text(),
                    format!("{sign}{}", Bytes(e.abs_diff(p)).gib_text()),
                ]
            })
            .collect()
    }

    pub fn html(&self) -> Html {
        table(&self.caption(), &SPREAD_COLUMNS, &self.cells())
            .then(Html::note(&format!("Rule: {}", self.rule)))
    }
}

impl fmt::Display for super::fit::Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.caption())?;
        text_table(f, &SPREAD_COLUMNS, &self.cells())?;
        write!(f, "Rule: {}", self.rule)
    }
}

const PRESET_COLUMNS: [&str; 8] = [
    "preset",
    "name",
    "model_type",
    "parameters",
    "layers",
    "hidden",
    "heads/KV",
    "attention",
];

impl super::Presets {
    fn cells(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|p| {
                let m = p.model().expect("presets are checked when read");
                let attention = match m.attention {
                    crate::model::Attention::Latent(_) => "latent".to_string(),
                    _ if m.mixes_sliding_and_global() => "local/global".into(),
                    _ if m.has_sliding_layers() => "sliding window".into(),
                    _ => "full".into(),
                };
                let attention = if m.moe.is_some() {
                    format!("{attention}, experts")
                } else {
                    attention
                };
                vec![
                    crate::text::printable(&p.preset).to_string(),
                    crate::text::printable(&p.name).to_string(),
                    m.type_name().to_string(),
                    grouped(p.parameters),
                    m.layers.len().to_string(),
                    m.hidden.to_string(),
                    format!("{}/{}", m.heads, m.kv_heads),
                    attention,
                ]
            })
            .collect()
    }

    pub fn html(&self) -> Html {
        table(
            &format!("Model presets ({})", self.file),
            &PRESET_COLUMNS,
            &self.cells(),
        )
        .then(Html::note(SOURCES_NOTE))
    }
}

const SOURCES_NOTE: &str = "Sources: the config.json named in each row of the file; the parameter counts are transformers' own for those fields.";

impl fmt::Display for super::Presets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Model presets ({})", crate::text::printable(&self.file))?;
        text_table(f, &PRESET_COLUMNS, &self.cells())?;
        write!(f, "{SOURCES_NOTE}")
    }
}
