//! What runs on the GPU, as people run it with Hugging Face transformers: a model (from a preset,
//! a `config.json` or flags), `generate` or training (PEFT LoRA, or every weight with PyTorch's
//! AdamW), the dtype, the sizes of a step, recomputation, autocast and the allocator's setting.
//! Validated once, with every size bounded, so that the replay and every formula may rely on it.

use crate::dtype::Dtype;
use crate::model::{Attention, Model};
use crate::stack::optimizer::OptimizerImpl;
use serde::{Deserialize, Serialize};

/// How the layers' linear matrices are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "format")]
pub enum WeightFormat {
    /// Unquantized, in the compute dtype.
    Dense,
    /// NF4 with double quantization (QLoRA, bitsandbytes): 4 bits per weight, one 8-bit absmax
    /// per block of 64 weights, one float32 per 256 blocks; embeddings, the LM head, norms and
    /// routers stay in the compute dtype.
    Nf4,
    /// A checkpoint saved by GPTQ, AWQ, bitsandbytes' 8-bit or fine-grained FP8, served as
    /// saved (the model's `quantization_config`): its layers' tensors as stored
    /// (`model::prequantized`), the rest in the compute dtype; the products through its kernels
    /// replayed as 16-bit products.
    Prequantized,
}

/// The optimizer of full training.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Optimizer {
    /// `torch.optim.AdamW`: two moments in each parameter's dtype.
    Adamw,
    /// bitsandbytes' `AdamW8bit`: two 8-bit moments with float32 scales per block of 256
    /// (float32 moments for parameters under 4 096 elements).
    #[serde(rename = "adamw-8bit")]
    #[strum(serialize = "adamw-8bit")]
    Adamw8bit,
    /// bitsandbytes' `PagedAdamW8bit`: the same states, a parameter's moments of 100 000
    /// elements or more in CUDA unified memory (outside the allocator: on the GPU while it has
    /// room, else in host memory).
    #[serde(rename = "paged-adamw-8bit")]
    #[strum(serialize = "paged-adamw-8bit")]
    PagedAdamw8bit,
    /// transformers' `Adafactor` as the Trainer builds it: factored float32 second moments (a
    /// row and a column of each matrix, a vector whole), no first moment.
    Adafactor,
}

impl Optimizer {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// What the GPU does with the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Mode {
    /// `generate`: a prompt of `context` tokens, then `generated` new tokens.
    Inference { generated: u64 },
    /// PEFT LoRA of `rank` on the modules named `targets` (`q_proj`…), AdamW on the adapters.
    Lora { rank: u64, targets: Vec<String> },
    /// Every weight trained.
    Full { optimizer: Optimizer },
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Inference { .. } => "inference",
            Mode::Lora { .. } => "lora",
            Mode::Full { .. } => "full",
        }
    }
    pub fn trains(&self) -> bool {
        !matches!(self, Mode::Inference { .. })
    }
}

/// The allocator's setting (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocatorSetting {
    #[default]
    Default,
    /// `expandable_segments:True`.
    ExpandableSegments,
}

impl AllocatorSetting {
    /// The setting this one is not.
    pub fn other(self) -> AllocatorSetting {
        match self {
            AllocatorSetting::Default => AllocatorSetting::ExpandableSegments,
            AllocatorSetting::ExpandableSegments => AllocatorSetting::Default,
        }
    }
}

/// A workload whose budget can be computed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Where the model comes from: a preset's name or a config file.
    pub source: String,
    pub model: Model,
    pub mode: Mode,
    /// The weights' and activations' dtype (float32 under autocast).
    pub dtype: Dtype,
    pub weights: WeightFormat,
    /// Sequences processed together.
    pub batch: u64,
    /// Prompt tokens (inference) or sequence length (training).
    pub context: u64,
    /// Gradient checkpointing (training).
    pub checkpointing: bool,
    /// The AdamW implementation (training).
    pub optimizer_impl: OptimizerImpl,
    /// Training's forward under `torch.autocast` of this dtype (the Trainer's mixed precision:
    /// float32 weights).
    pub autocast: Option<Dtype>,
    pub allocator: AllocatorSetting,
    /// Training steps as `transformers.Trainer` runs them (its batches, mixed precision, loss
    /// scaling, gradient clipping and two parameter groups); otherwise a loop written by hand.
    #[serde(default)]
    pub trainer: bool,
    /// The Trainer's `gradient_accumulation_steps`: the batches each optimizer step runs.
    #[serde(default = "one")]
    pub accumulation: u64,
    /// Some rows of the batch are shorter than the context, padded to it as a tokenizer pads
    /// them (`generate`'s on the left, the Trainer collator's on the right): the attention runs
    /// under the mask built for them.
    #[serde(default)]
    pub padded: bool,
    /// PEFT's `lora_dropout` (LoRA): above 0, an `nn.Dropout` runs on each adapter's input and
    /// its mask is kept for the backward; 0 or none, an `nn.Identity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_dropout: Option<rust_decimal::Decimal>,
    /// Through TRL's `SFTTrainer` on the Trainer (`trainer` set too): its fused LM head, which
    /// scores the positions with a label in tiles rather than making the logits, and the metrics
    /// it logs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sft: bool,
    /// TRL's `padding_free` (with `sft`; `packing`'s default strategy implies it): each batch's
    /// rows flattened into one row of `batch × context` tokens, no attention mask, the attention
    /// under the block-diagonal mask transformers builds from the restarting positions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub padding_free: bool,
    /// TRL's loss on the completion alone (`completion_only_loss`, its default for a
    /// prompt-completion dataset; with `sft`): the last `completion_tokens` tokens of each row
    /// carry a label, the prompt's none, so its fused head scores that many positions a row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// `generate`'s `repetition_penalty` (inference): other than 1, its logits processor runs on
    /// every token's logits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<rust_decimal::Decimal>,
    /// `generate(do_sample=True, ...)` (inference): the softmax's draw after the warpers the
    /// values given turn on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleArgs>,
    /// `generate`'s `num_beams` (inference): above 1, beam search over that many copies of
    /// each row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beams: Option<u64>,
    /// `generate(cache_implementation="offloaded")` (inference): every full layer's keys and
    /// values on the CPU between its updates, the next one brought back ahead of its own on a
    /// stream of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offloaded_cache: bool,
    /// The model's `generation_config.json` (inference), whose values apply where no flag gives
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_config: Option<crate::model::generation::GenerationDefaults>,
}

/// The sampling values given to `generate`; one not given is transformers' default
/// (`temperature` 1, `top_k` 50, `top_p` 1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<rust_decimal::Decimal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<rust_decimal::Decimal>,
}

impl SampleArgs {
    /// `temperature 0.7, top_k 50, top_p 0.9`: the values the warpers run with (`no warper`).
    pub fn warper_values(&self) -> String {
        let w = self.warpers();
        let parts = [
            w.temperature
                .then(|| format!("temperature {}", self.temperature.unwrap_or_default())),
            (w.top_k > 0).then(|| format!("top_k {}", w.top_k)),
            w.top_p
                .then(|| format!("top_p {}", self.top_p.unwrap_or_default())),
        ];
        let given: Vec<String> = parts.into_iter().flatten().collect();
        match given.is_empty() {
            true => "no warper".into(),
            false => given.join(", "),
        }
    }

    /// The warpers these values turn on, as `_get_logits_processor` picks them.
    pub fn warpers(&self) -> crate::stack::sampling::Sampling {
        use rust_decimal::Decimal;
        crate::stack::sampling::Sampling {
            temperature: self.temperature.is_some_and(|t| t != Decimal::ONE),
            top_k: self.top_k.unwrap_or(50),
            top_p: self.top_p.is_some_and(|p| p < Decimal::ONE),
        }
    }
}

fn one() -> u64 {
    1
}

/// The largest batch, context or count of generated tokens a workload may have: 2^24, far above
/// any real run, so that every product of sizes stays far from 2^64 and the replay's work
/// stays bounded.
pub const MAX_TOKENS: u64 = 1 << 24;
/// The most tokens a budget's replay runs (batch × positions): a bound on its work.
pub const MAX_BATCH_TOKENS: u64 = 1 << 26;
/// The most tokens `generate` may add: each is a decode step the replay runs through every
/// layer, so its work grows with this count (`docs/benchmarks.md` gives the time at this bound).
pub const MAX_GENERATED: u64 = 1 << 14;

/// The most bytes the tokens of a step may make across the layers (tokens × the widest row ×
/// 4 B × layers): 2^56, 64 PiB, far beyond any GPU, so that what a replay holds (a few tens of
/// such rows a layer at most, with the weights) stays below 2^64.
pub const MAX_STEP_BYTES: u64 = 1 << 56;

/// Why a workload is refused; the messages name the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("{field} must be between 1 and {max}, not {value}")]
    Range {
        field: &'static str,
        value: u64,
        max: u64,
    },
    #[error(transparent)]
    Model(#[from] crate::model::ConfigError),
    #[error("{0}")]
    Unsupported(String),
    #[error("LoRA targets {targets:?}: the model has no linear layer named so (it has {known})")]
    Targets { targets: Vec<String>, known: String },
}

impl crate::status::Classify for WorkloadError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// Why [`Workload::preset`] failed: the name or the model.
#[derive(Debug, thiserror::Error)]
pub enum PresetOrWorkload {
    #[error(transparent)]
    Preset(#[from] super::PresetError),
    #[error(transparent)]
    Model(#[from] crate::model::ConfigError),
}

impl Workload {
    /// A shipped preset with the defaults of `mesure_memoire budget`: `generate` of one token
    /// after a prompt of 1024, batch 1, bfloat16, AdamW foreach, the default allocator. Change a
    /// field with `Workload { batch: 8, ..w }`, then [`validated`](Self::validated).
    pub fn preset(name: &str) -> Result<Workload, PresetOrWorkload> {
        let presets = super::Presets::builtin();
        let p = presets.get(name)?;
        Ok(Workload {
            source: p.preset.clone(),
            model: p.model()?,
            mode: Mode::Inference { generated: 1 },
            dtype: Dtype::Bfloat16,
            weights: WeightFormat::Dense,
            batch: 1,
            context: 1024,
            checkpointing: false,
            optimizer_impl: OptimizerImpl::Foreach,
            autocast: None,
            allocator: AllocatorSetting::Default,
            trainer: false,
            accumulation: 1,
            padded: false,
            lora_dropout: None,
            sft: false,
            padding_free: false,
            completion_tokens: None,
            repetition_penalty: None,
            sample: None,
            beams: None,
            offloaded_cache: false,
            generation_config: None,
        })
    }

    /// The repetition penalty `generate` applies: one other than 1 (at 1 it runs no processor).
    pub fn applied_repetition_penalty(&self) -> Option<rust_decimal::Decimal> {
        self.repetition_penalty
            .filter(|p| *p != rust_decimal::Decimal::ONE)
    }

    /// The beams `generate` searches with (1: no beam search).
    pub fn beams(&self) -> u64 {
        self.beams.unwrap_or(1)
    }

    /// The end-of-sequence tokens `generate` checks each new token against: those the model's
    /// generation config names (none read: none).
    pub fn eos_tokens(&self) -> u64 {
        (self.generation_config.as_ref())
            .and_then(|g| g.eos_tokens)
            .unwrap_or(0)
    }

    /// The candidates beam search keeps for each beam: `max(2, 1 + end-of-sequence tokens)`.
    pub fn candidates_per_beam(&self) -> u64 {
        (1 + self.eos_tokens()).max(2)
    }

    /// PEFT's dropout probability where it runs a dropout (above 0; at 0 an `nn.Identity`).
    pub fn applied_lora_dropout(&self) -> Option<rust_decimal::Decimal> {
        self.lora_dropout.filter(|p| !p.is_zero())
    }

    /// The tokens `generate` makes after the prompt (none in training).
    pub fn generated(&self) -> u64 {
        match self.mode {
            Mode::Inference { generated } => generated,
            _ => 0,
        }
    }

    /// Checks the sizes and refuses what the emulated stack does not run.
    pub fn validated(self) -> Result<Self, WorkloadError> {
        self.model.check_bounds()?;
        let generated = self.generated();
        for (field, value, min, max) in [
            ("batch", self.batch, 1, MAX_TOKENS),
            ("context", self.context, 1, MAX_TOKENS),
            ("generated", generated, 0, MAX_GENERATED),
        ] {
            if value < min || value > max {
                return Err(WorkloadError::Range { field, value, max });
            }
        }
        let tokens = self
            .batch
            .checked_mul(self.context + generated)
            .filter(|&n| n <= MAX_BATCH_TOKENS)
            .ok_or(WorkloadError::Range {
                field: "batch × (context + generated)",
                value: self.batch.saturating_mul(self.context + generated),
                max: MAX_BATCH_TOKENS,
            })?;
        let step_bytes = tokens
            .checked_mul(self.model.widest())
            .and_then(|b| b.checked_mul(4))
            .and_then(|b| b.checked_mul(self.model.layers.len() as u64))
            .filter(|&b| b <= MAX_STEP_BYTES);
        if step_bytes.is_none() {
            return Err(WorkloadError::Unsupported(format!(
                "batch × tokens ({tokens}) × the widest row a token makes ({}) × 4 B × {} layers \
                 is above 2^56 B = 64 PiB: no GPU holds it, and its replay would overflow",
                self.model.widest(),
                self.model.layers.len()
            )));
        }
        if let Mode::Lora { rank, targets } = &self.mode {
            if *rank == 0 || *rank > crate::model::config::MAX_SIZE {
                return Err(WorkloadError::Range {
                    field: "rank",
                    value: *rank,
                    max: crate::model::config::MAX_SIZE,
                });
            }
            // Every linear layer's module name, and whether the text model has one of that name.
            let mut linears: std::collections::BTreeMap<String, bool> = Default::default();
            for p in self.model.parameters() {
                if p.is_linear_weight() {
                    *linears.entry(p.module().to_string()).or_default() |= p.used_by_text();
                }
            }
            let unknown: Vec<String> = targets
                .iter()
                .filter(|t| !linears.contains_key(*t))
                .cloned()
                .collect();
            if targets.is_empty() || !unknown.is_empty() {
                let known: Vec<&str> = linears.keys().map(String::as_str).collect();
                return Err(WorkloadError::Targets {
                    targets: if targets.is_empty() { vec![] } else { unknown },
                    known: known.join(", "),
                });
            }
            if !targets.iter().any(|t| linears[t]) {
                let text: Vec<&str> = linears
                    .iter()
                    .filter(|(_, &text)| text)
                    .map(|(m, _)| m.as_str())
                    .collect();
                return Err(WorkloadError::Unsupported(format!(
                    "--targets {} names only the vision tower's layers, which a text-only run \
                     never uses: nothing would be trained; the text model's: {}",
                    targets.join(","),
                    text.join(", ")
                )));
            }
        }
        if self.autocast.is_some()
            && !matches!(self.mode, Mode::Inference { .. })
            && self.dtype != Dtype::Float32
        {
            return Err(WorkloadError::Unsupported(
                "--autocast trains float32 weights (the Trainer's mixed precision): --dtype float32".into(),
            ));
        }
        if !(1..=crate::stack::trainer::MAX_ACCUMULATION).contains(&self.accumulation) {
            return Err(WorkloadError::Range {
                field: "--gradient-accumulation",
                value: self.accumulation,
                max: crate::stack::trainer::MAX_ACCUMULATION,
            });
        }
        if self.accumulation > 1 && !self.trainer {
            return Err(WorkloadError::Unsupported(
                "--gradient-accumulation is replayed through the Trainer: add --trainer".into(),
            ));
        }
        if self.sft && !self.trainer {
            return Err(WorkloadError::Unsupported(
                "--sft runs TRL's SFTTrainer on the Trainer: the workload needs trainer set".into(),
            ));
        }
        if let Some(n) = self.completion_tokens {
            if !self.sft {
                return Err(WorkloadError::Unsupported(
                    "--completion-tokens is the loss of TRL's SFTTrainer: add --sft".into(),
                ));
            }
            if n == 0 || n >= self.context {
                return Err(WorkloadError::Unsupported(format!(
                    "--completion-tokens {n}: a completion of 1 to {} tokens follows a prompt of \
                     at least one within --context {}",
                    crate::units::grouped(self.context - 1),
                    crate::units::grouped(self.context)
                )));
            }
        }
        if self.padding_free && !self.sft {
            return Err(WorkloadError::Unsupported(
                "--padding-free flattens TRL's SFTTrainer batches: add --sft".into(),
            ));
        }
        if self.padding_free && self.model.layers.iter().any(|l| l.window.is_some()) {
            return Err(WorkloadError::Unsupported(
                "--padding-free is replayed for models without sliding-window layers (their \
                 mask with packed sequences is not replayed yet)"
                    .into(),
            ));
        }
        if self.padding_free && self.padded {
            return Err(WorkloadError::Unsupported(
                "--padding-free pads nothing: leave --padded out (each batch is one row of \
                 batch × context tokens, every sequence at the context)"
                    .into(),
            ));
        }
        if self.trainer {
            self.check_trainer()?;
        }
        if self.padded {
            if !matches!(self.mode, Mode::Inference { .. }) && !self.trainer {
                return Err(WorkloadError::Unsupported(
                    "--padded training batches come from the Trainer's collator (its attention \
                     mask): add --trainer"
                        .into(),
                ));
            }
            if self.batch < 2 || self.context < 2 {
                return Err(WorkloadError::Unsupported(
                    "--padded pads the shorter rows of a batch to the longest: a batch of 2 rows or \
                     more, a context of 2 tokens or more"
                        .into(),
                ));
            }
        }
        match self.repetition_penalty {
            Some(_) if !matches!(self.mode, Mode::Inference { .. }) => {
                return Err(WorkloadError::Unsupported(
                    "--repetition-penalty applies to --mode inference only".into(),
                ))
            }
            Some(p) if p.is_sign_negative() || p.is_zero() => {
                return Err(WorkloadError::Unsupported(format!(
                    "--repetition-penalty is a number above 0, not {p}"
                )))
            }
            _ => {}
        }
        if matches!(
            self.mode,
            Mode::Full {
                optimizer: Optimizer::Adafactor
            }
        ) && !self.trainer
        {
            return Err(WorkloadError::Unsupported(
                "--optimizer adafactor is replayed as transformers.Trainer builds it \
                 (optim=\"adafactor\"): add --trainer"
                    .into(),
            ));
        }
        if self.offloaded_cache && !matches!(self.mode, Mode::Inference { .. }) {
            return Err(WorkloadError::Unsupported(
                "--cache-implementation applies to --mode inference only".into(),
            ));
        }
        match self.beams {
            Some(_) if !matches!(self.mode, Mode::Inference { .. }) => {
                return Err(WorkloadError::Unsupported(
                    "--num-beams applies to --mode inference only".into(),
                ))
            }
            Some(0) => {
                return Err(WorkloadError::Unsupported(
                    "--num-beams is a whole number above 0, not 0".into(),
                ))
            }
            _ => {}
        }
        if let Some(s) = &self.sample {
            use rust_decimal::Decimal;
            let refuse = |m: String| Err(WorkloadError::Unsupported(m));
            if !matches!(self.mode, Mode::Inference { .. }) {
                return refuse("--sample applies to --mode inference only".into());
            }
            match (s.temperature, s.top_k, s.top_p) {
                (Some(t), _, _) if t <= Decimal::ZERO => {
                    return refuse(format!("--temperature is a number above 0, not {t}"))
                }
                (_, Some(k), _) if k > crate::stack::sampling::MAX_TOP_K => {
                    return refuse(format!(
                        "--top-k {k}: up to {} is emulated (PyTorch sorts more with a full sort \
                         and a gather)",
                        crate::stack::sampling::MAX_TOP_K
                    ))
                }
                (_, _, Some(p)) if p <= Decimal::ZERO || p > Decimal::ONE => {
                    return refuse(format!("--top-p is a number above 0, up to 1, not {p}"))
                }
                _ => {}
            }
        }
        if let Some(p) = self.lora_dropout {
            if !matches!(self.mode, Mode::Lora { .. }) {
                return Err(WorkloadError::Unsupported(
                    "--lora-dropout applies to --mode lora or qlora only".into(),
                ));
            }
            if p.is_sign_negative() || p >= rust_decimal::Decimal::ONE {
                return Err(WorkloadError::Unsupported(format!(
                    "--lora-dropout is a probability from 0 to below 1, not {p}"
                )));
            }
        }
        let served_as_saved = self.loads_saved_nf4() || self.weights == WeightFormat::Prequantized;
        if let Some(q) = self.model.quantization.filter(|_| !served_as_saved) {
            return Err(WorkloadError::Unsupported(format!(
                "the model's quantization_config ({}) is {}: quantized weights load and \
                 compute through kernels that are not emulated, and a budget of dense weights \
                 would be wrong; remove quantization_config to budget the model unquantized",
                q.described(),
                match q {
                    crate::model::Quantization::Bnb4 { double_quant: true } => {
                        "replayed for serving (--mode inference) and QLoRA (--mode qlora)"
                    }
                    crate::model::Quantization::Bnb4 {
                        double_quant: false,
                    } => "not replayed yet",
                    _ => "budgeted for serving as saved (--mode inference), not trained",
                }
            )));
        }
        if self.weights == WeightFormat::Prequantized {
            let q = self.model.quantization;
            let saved_otherwise =
                q.is_some_and(|q| !matches!(q, crate::model::Quantization::Bnb4 { .. }));
            if !matches!(self.mode, Mode::Inference { .. }) || !saved_otherwise {
                return Err(WorkloadError::Unsupported(
                    "weights stored as a checkpoint saved by GPTQ, AWQ, bitsandbytes' 8-bit or \
                     FP8 are served as saved (--mode inference) from its quantization_config"
                        .into(),
                ));
            }
            if self.model.moe.is_some() {
                return Err(WorkloadError::Unsupported(
                    "a mixture of experts saved quantized is not budgeted: its experts' \
                     quantized layout is not followed"
                        .into(),
                ));
            }
        }
        let serves_nf4 = matches!(self.mode, Mode::Inference { .. }) && self.loads_saved_nf4();
        if self.weights == WeightFormat::Nf4
            && !matches!(self.mode, Mode::Lora { .. })
            && !serves_nf4
        {
            return Err(WorkloadError::Unsupported(
                "NF4 weights quantized as they load are QLoRA's (--mode qlora); a checkpoint \
                 saved in NF4 is also served (--mode inference)"
                    .into(),
            ));
        }
        if self.weights == WeightFormat::Nf4 {
            self.check_nf4()?;
        }
        if self.dtype == Dtype::Float32 && self.autocast.is_none() {
            // SDPA in float32 runs the memory-efficient kernel, whose buffers are not emulated.
            return Err(WorkloadError::Unsupported(
                "float32 attention (PyTorch's memory-efficient kernel) is not replayed yet; use \
                 float16 or bfloat16, or --autocast for float32 weights"
                    .into(),
            ));
        }
        if let Attention::Standard { .. } = self.model.attention {
            if self.model.head_dim > 256 || !self.model.head_dim.is_multiple_of(8) {
                return Err(WorkloadError::Unsupported(format!(
                    "head_dim {} is outside cuDNN attention's range (a multiple of 8, at most \
                     256): another SDPA kernel would run, which is not emulated",
                    self.model.head_dim
                )));
            }
        }
        Ok(self)
    }

    /// What the Trainer's replay covers (proven on the H200: `data/hf-proof-trainer*-h200.json`):
    /// LoRA or full training, bfloat16 weights or float32 ones under bfloat16 autocast, float32
    /// weights under float16 autocast or LoRA of float16 weights (fp16 and its gradient scaler),
    /// AdamW fused or foreach; bitsandbytes' 8-bit AdamW derived, not yet proven on runs held out.
    fn check_trainer(&self) -> Result<(), WorkloadError> {
        let unsupported = |m: &str| Err(WorkloadError::Unsupported(m.into()));
        if let Mode::Inference { .. } = self.mode {
            return unsupported("--trainer runs training: --mode lora or full");
        }
        if self.weights == WeightFormat::Nf4 {
            return unsupported("--trainer with --mode qlora is not replayed yet");
        }
        if self.dtype == Dtype::Float16 && !matches!(self.mode, Mode::Lora { .. }) {
            return unsupported(
                "--trainer with float16 weights trains LoRA adapters (fp16=True: the gradient \
                 scaler refuses to unscale float16 gradients); float32 weights with --autocast \
                 float16 for a full training",
            );
        }
        if self.sft && self.autocast.is_some() {
            return unsupported(
                "--sft over float32 weights under --autocast is not replayed yet: TRL's fused head \
                 then casts its tiles, which no trace shows",
            );
        }
        if self.optimizer_impl == OptimizerImpl::ForLoop {
            return unsupported(
                "--trainer's AdamW is fused (adamw_torch_fused) or foreach (adamw_torch), not for-loop",
            );
        }
        Ok(())
    }

    /// Whether QLoRA loads a checkpoint saved in NF4 with double quantization (its
    /// `quantization_config`, as bitsandbytes saves it) instead of quantizing as it loads.
    pub(crate) fn loads_saved_nf4(&self) -> bool {
        self.weights == WeightFormat::Nf4
            && self.model.quantization
                == Some(crate::model::Quantization::Bnb4 { double_quant: true })
    }

    /// The Trainer's arguments of this workload: bf16 (or fp16, with its gradient scaler) mixed
    /// precision with bfloat16 (float16) weights or under `--autocast`, gradients clipped (its
    /// default `max_grad_norm` of 1).
    fn trainer_args(&self) -> Option<crate::stack::trainer::TrainerArgs> {
        self.trainer.then(|| crate::stack::trainer::TrainerArgs {
            clip: true,
            mixed: (self.autocast).or(match self.dtype {
                Dtype::Bfloat16 | Dtype::Float16 => Some(self.dtype),
                _ => None,
            }),
            accumulation: self.accumulation,
            sft: self.sft,
            padding_free: self.padding_free,
        })
    }

    /// What the replay of bitsandbytes' 4-bit weights covers: dense layers (experts' weights and
    /// latent attention are not proven), no autocast, no vision tower.
    fn check_nf4(&self) -> Result<(), WorkloadError> {
        let unsupported = |m: &str| Err(WorkloadError::Unsupported(m.into()));
        if self
            .model
            .layers
            .iter()
            .any(|l| matches!(l.mlp, crate::model::Mlp::Experts))
        {
            return unsupported(
                "NF4 weights of a mixture of experts are not replayed: transformers' bitsandbytes \
                 loading of expert weights is not proven",
            );
        }
        if !matches!(self.model.attention, Attention::Standard { .. }) {
            return unsupported("NF4 weights with latent attention are not replayed: not proven");
        }
        if self.model.vision.is_some() {
            return unsupported(
                "NF4 weights of a model with a vision tower (Gemma 3) are not replayed: which of \
                 its layers bitsandbytes quantizes is not proven",
            );
        }
        if self.autocast.is_some() {
            return unsupported("--autocast with NF4 weights is not replayed");
        }
        Ok(())
    }

    /// Tokens in the KV cache at the end (inference), or processed per step (training).
    pub fn tokens(&self) -> u64 {
        match self.mode {
            Mode::Inference { generated } => self.context + generated,
            _ => self.context,
        }
    }

    /// The runs the workload may make: one, or, for a model whose masks come in the order the
    /// process's string hashing gives (Gemma 3 with its vision tower, with sliding and full
    /// layers), one for each order. A card holds the workload only if it holds every run.
    pub fn runs(&self, kernels: crate::stack::process::Kernels) -> Vec<crate::stack::run::Run> {
        self.mask_orders()
            .iter()
            .map(|&mask_order| crate::stack::run::Run {
                mask_order,
                ..self.run(kernels)
            })
            .collect()
    }

    /// The orders the process may make the masks in: both for a Gemma 3 with its vision tower
    /// and sliding and full layers, else the one order of a model's own forward.
    pub fn mask_orders(&self) -> &'static [crate::stack::process::MaskOrder] {
        use crate::stack::process::MaskOrder;
        let m = &self.model;
        match m.vision.is_some() && m.mixes_sliding_and_global() {
            true => &MaskOrder::BOTH,
            false => &MaskOrder::BOTH[..1],
        }
    }

    /// The emulated run (one training step: its peak is the second step's, the states made).
    fn run(&self, kernels: crate::stack::process::Kernels) -> crate::stack::run::Run {
        use crate::stack::loading::{Loading, Lora};
        use crate::stack::run::{Run, Work};
        let work = match &self.mode {
            Mode::Inference { generated } => Work::Generate {
                generated: (*generated).max(1),
                repetition_penalty: self.applied_repetition_penalty().is_some(),
                sampling: self.sample.as_ref().map(SampleArgs::warpers),
                beams: self.beams(),
                eos_tokens: self.eos_tokens(),
                offloaded_cache: self.offloaded_cache,
            },
            Mode::Lora { rank, targets } => Work::Train {
                lora: Some(Lora {
                    rank: *rank,
                    targets: targets.clone(),
                    dropout: self.applied_lora_dropout().is_some(),
                }),
                optimizer: crate::stack::optimizer::Optimizer::AdamW(self.optimizer_impl),
                checkpointing: self.checkpointing,
                steps: 2,
                trainer: self.trainer_args(),
            },
            Mode::Full { optimizer } => Work::Train {
                lora: None,
                optimizer: match optimizer {
                    Optimizer::Adamw => {
                        crate::stack::optimizer::Optimizer::AdamW(self.optimizer_impl)
                    }
                    Optimizer::Adamw8bit => {
                        crate::stack::optimizer::Optimizer::AdamW8bit { paged: false }
                    }
                    Optimizer::PagedAdamw8bit => {
                        crate::stack::optimizer::Optimizer::AdamW8bit { paged: true }
                    }
                    Optimizer::Adafactor => crate::stack::optimizer::Optimizer::Adafactor,
                },
                checkpointing: self.checkpointing,
                steps: 2,
                trainer: self.trainer_args(),
            },
        };
        Run {
            model: self.model.clone(),
            dtype: self.dtype,
            autocast: self.autocast,
            batch: self.batch,
            context: self.context,
            work,
            loading: match self.weights {
                WeightFormat::Nf4 if self.loads_saved_nf4() => Loading::PrequantizedNf4,
                WeightFormat::Nf4 => Loading::PretrainedNf4,
                WeightFormat::Prequantized => match self.model.quantization {
                    Some(q) => Loading::Prequantized(q),
                    None => Loading::Pretrained,
                },
                WeightFormat::Dense => Loading::Pretrained,
            },
            kernels,
            mask_order: Default::default(),
            padded: self.padded,
            sharding: None,
            tensor_parallel: None,
            ddp: None,
            // Each row's completion labelled: the positions whose next token has a label.
            labelled: match self.completion_tokens {
                Some(n) => (0..2 * self.accumulation).map(|_| self.batch * n).collect(),
                None => Vec::new(),
            },
            flat_tokens: Vec::new(),
        }
    }
}
