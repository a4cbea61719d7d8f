//! The specification a GPU proof script runs (`scripts/gpu/hf-run.py`'s: model_type, config,
//! mode, dtype, autocast, batch, context, generated, lora, optimizer, optimizer_impl,
//! checkpointing, steps, loading, quantization, mask_order, for a Trainer run loop
//! trainer_args, lengths and completion_tokens, for `generate` left_padding and its keyword arguments
//! (max_length, max_new_tokens, repetition_penalty, do_sample, temperature, top_k, top_p); the
//! script's other fields are its own), read as a serde type and turned into the [`Run`] the
//! emulation makes, with the H200's kernels.

use super::ddp::Ddp;
use super::fsdp::Sharding;
use super::loading::{Loading, Lora};
use super::optimizer::{Optimizer, OptimizerImpl};
use super::process::{Kernels, MaskOrder};
use super::run::{Run, Work};
use super::tensor_parallel::TensorParallel;
use super::trainer::{TrainerArgs, MAX_ACCUMULATION};
use crate::dtype::Dtype;
use serde::Deserialize;

/// Why a workload specification was refused: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("config: {0}")]
    Config(#[from] crate::model::ConfigError),
    #[error("{0}")]
    Field(String),
}

/// What a proof script ran.
#[derive(Debug, Clone, Deserialize)]
pub struct Spec {
    pub model_type: String,
    /// The config.json fields of the model.
    pub config: serde_json::Map<String, serde_json::Value>,
    pub mode: SpecMode,
    #[serde(default = "bfloat16")]
    pub dtype: Dtype,
    /// Float32 weights trained under `torch.autocast` of this type.
    #[serde(default)]
    pub autocast: Option<Dtype>,
    pub batch: u64,
    pub context: u64,
    #[serde(default)]
    pub generated: Option<u64>,
    #[serde(default)]
    pub lora: Option<SpecLora>,
    #[serde(default)]
    pub optimizer: SpecOptimizer,
    #[serde(default)]
    pub optimizer_impl: OptimizerImpl,
    #[serde(default)]
    pub checkpointing: bool,
    #[serde(default = "three")]
    pub steps: u64,
    #[serde(default)]
    pub loading: SpecLoading,
    /// How a checkpoint loaded `prequantized` was saved: `{"method": "bnb4"}` (NF4 with double
    /// quantization).
    #[serde(default)]
    pub quantization: Option<SpecQuantization>,
    /// The order the recorded process iterated `set(layer_types)` in.
    #[serde(default)]
    pub mask_order: Option<Vec<String>>,
    /// `trainer`: the steps through `transformers.Trainer`; `sft`: through TRL's `SFTTrainer`;
    /// absent, written by hand.
    #[serde(default, rename = "loop")]
    pub training_loop: Option<String>,
    /// The Trainer's arguments the run gave (the others its defaults).
    #[serde(default)]
    pub trainer_args: SpecTrainerArgs,
    /// Each sequence's length before the collator pads them (absent: `context` each).
    #[serde(default)]
    pub lengths: Option<Vec<u64>>,
    /// TRL's SFTTrainer (`loop` `sft`): the positions with a label in each batch it drew, in
    /// order (the Trainer's sampler chose the rows: read from the run's trace); absent, every
    /// position but each row's last.
    #[serde(default)]
    pub labelled: Vec<u64>,
    /// TRL's `completion_only_loss`: each row's last N tokens labelled (every batch then has
    /// batch × N labelled positions).
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// TRL's padding-free batches: the tokens of each it drew, in order (read from the run's
    /// trace); absent, `batch × context`.
    #[serde(default)]
    pub tokens: Vec<u64>,
    /// `generate`'s rows: each row's count of pad tokens on the left, cycling (absent: none).
    #[serde(default)]
    pub left_padding: Option<Vec<u64>>,
    /// The keyword arguments `generate` was called with beyond the greedy default.
    #[serde(default)]
    pub generate: Option<serde_json::Map<String, serde_json::Value>>,
    /// This process as one rank of several (`hf_loops.py`'s `distributed`).
    #[serde(default)]
    pub distributed: Option<SpecDistributed>,
    /// DDP's `gradient_as_bucket_view`.
    #[serde(default)]
    pub gradient_as_bucket_view: bool,
    /// DDP's `bucket_cap_mb` (absent: the 25 `hf_loops.py` gives; null: DDP's default).
    #[serde(default = "twenty_five")]
    pub bucket_cap_mb: Option<f64>,
}

fn twenty_five() -> Option<f64> {
    Some(25.0)
}

/// `int(bucket_cap_mb * 1024 * 1024)`, as DDP takes it, for a size within (0, 10^6] MiB (the
/// product is then exact to the byte and positive).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn mib_bytes(mb: f64) -> u64 {
    (mb * 1_048_576.0) as u64
}

/// The rank a distributed run was, and how the work was spread.
#[derive(Debug, Clone, Deserialize)]
pub struct SpecDistributed {
    pub strategy: String,
    pub world_size: u64,
    pub rank: u64,
    /// FSDP2's `MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32)` on a model built
    /// in float32 (the default), else none on a model built in `dtype`.
    #[serde(default = "yes")]
    pub mixed_precision: bool,
}

fn yes() -> bool {
    true
}

/// The `TrainingArguments` a Trainer run gave, of those the emulation follows.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecTrainerArgs {
    #[serde(default)]
    pub bf16: bool,
    #[serde(default)]
    pub fp16: bool,
    #[serde(default)]
    pub optim: Option<String>,
    #[serde(default)]
    pub max_grad_norm: Option<f64>,
    #[serde(default)]
    pub gradient_accumulation_steps: Option<u64>,
    /// TRL's `padding_free`.
    #[serde(default)]
    pub padding_free: bool,
    /// TRL's `packing` (its default strategy, `bfd`, flattens batches as padding-free does; the
    /// dataset given is prepared already, so nothing is packed before).
    #[serde(default)]
    pub packing: bool,
    /// TRL's `max_length`: it truncates when TRL prepares the dataset, which the runs skip.
    #[serde(default)]
    pub max_length: Option<u64>,
}

fn bfloat16() -> Dtype {
    Dtype::Bfloat16
}

fn three() -> u64 {
    3
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecMode {
    Inference,
    Full,
    Lora,
    Qlora,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SpecLora {
    pub rank: u64,
    pub targets: Vec<String>,
    /// `LoraConfig.lora_dropout`.
    #[serde(default)]
    pub dropout: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum SpecOptimizer {
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
    #[serde(rename = "adamw-8bit")]
    AdamW8bit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecLoading {
    #[default]
    FromConfig,
    Pretrained,
    /// A checkpoint saved quantized, loaded with `from_pretrained` (its own
    /// `quantization_config`).
    Prequantized,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SpecQuantization {
    pub method: String,
}

impl Run {
    /// The workload a GPU proof script ran, with the H200's kernels.
    pub fn from_spec(spec: &serde_json::Value) -> Result<Run, SpecError> {
        let spec = Spec::deserialize(spec).map_err(|e| SpecError::Field(e.to_string()))?;
        Run::try_from(spec)
    }
}

impl TryFrom<Spec> for Run {
    type Error = SpecError;

    fn try_from(s: Spec) -> Result<Run, SpecError> {
        let field = |name: &str, message: &str| SpecError::Field(format!("`{name}`: {message}"));
        let mut config = s.config;
        config.insert("model_type".into(), s.model_type.into());
        let model = crate::model::config::from_value(&serde_json::Value::Object(config))?;
        model.check_runnable()?;
        for (name, value) in [
            ("batch", s.batch),
            ("context", s.context),
            ("steps", s.steps),
        ] {
            if value == 0 {
                return Err(field(name, "not a whole number above 0"));
            }
        }
        if !s.dtype.is_float() {
            return Err(field("dtype", "float32, float16 or bfloat16"));
        }
        if s.autocast
            .is_some_and(|a| !a.is_float() || a == Dtype::Float32)
        {
            return Err(field("autocast", "bfloat16 or float16"));
        }
        // Under autocast the weights are float32.
        let dtype = match s.autocast {
            Some(_) => Dtype::Float32,
            None => s.dtype,
        };
        let trainer = match s.training_loop.as_deref() {
            None => None,
            Some(name @ ("trainer" | "sft")) => Some(TrainerArgs {
                sft: name == "sft",
                padding_free: match (name, s.trainer_args.padding_free || s.trainer_args.packing) {
                    (_, false) => false,
                    ("sft", true) => true,
                    _ => {
                        return Err(field(
                            "trainer_args",
                            "padding_free and packing are TRL's SFTTrainer's (loop sft)",
                        ))
                    }
                },
                clip: s.trainer_args.max_grad_norm.is_none_or(|n| n > 0.0),
                mixed: match (s.trainer_args.bf16, s.trainer_args.fp16) {
                    (true, _) => Some(Dtype::Bfloat16),
                    (false, true) if s.trainer_args.max_grad_norm == Some(0.0) => {
                        return Err(field(
                            "trainer_args",
                            "fp16 is emulated with its gradients clipped (max_grad_norm > 0)",
                        ))
                    }
                    (false, true) => Some(Dtype::Float16),
                    (false, false) => None,
                },
                accumulation: match s.trainer_args.gradient_accumulation_steps {
                    None => 1,
                    Some(n @ 1..=MAX_ACCUMULATION) => n,
                    Some(_) => {
                        return Err(field(
                            "trainer_args",
                            "gradient_accumulation_steps from 1 to 4096",
                        ))
                    }
                },
            }),
            Some(_) => return Err(field("loop", "absent (by hand), trainer or sft")),
        };
        // The collator pads each batch to its longest row: the context, as every recorded batch
        // held a row that long.
        let lengths = s.lengths.as_deref().unwrap_or_default();
        if lengths.iter().any(|&n| n == 0 || n > s.context)
            || !(lengths.is_empty() || lengths.contains(&s.context))
        {
            return Err(field(
                "lengths",
                "from 1 to the context, the context among them (each batch padded to it)",
            ));
        }
        let sft = trainer.is_some_and(|t| t.sft);
        let padding_free = trainer.is_some_and(|t| t.padding_free);
        if !s.tokens.is_empty() && !padding_free {
            return Err(field("tokens", "given to padding-free batches only"));
        }
        if (s.tokens.iter()).any(|&n| n < s.batch || n > s.batch * s.context) {
            return Err(field(
                "tokens",
                "from batch to batch × context tokens in each padding-free batch",
            ));
        }
        if padding_free && model.layers.iter().any(|l| l.window.is_some()) {
            return Err(field(
                "trainer_args",
                "padding-free batches are emulated for models without sliding-window layers",
            ));
        }
        if !s.labelled.is_empty() && !sft {
            return Err(field("labelled", "given to TRL's SFTTrainer only"));
        }
        if (s.labelled.iter()).any(|&n| n == 0 || n > s.batch * (s.context - 1)) {
            return Err(field(
                "labelled",
                "from 1 to batch × (context - 1) positions in each batch",
            ));
        }
        let labelled = match s.completion_tokens {
            None => s.labelled,
            Some(_) if !sft => {
                return Err(field("completion_tokens", "given to TRL's SFTTrainer only"))
            }
            Some(_) if !s.labelled.is_empty() => {
                return Err(field(
                    "completion_tokens",
                    "given instead of labelled, not with it",
                ))
            }
            Some(n) if n == 0 || n >= s.context => {
                return Err(field(
                    "completion_tokens",
                    "from 1 to context - 1 tokens a row",
                ))
            }
            Some(n) => {
                let draws = s.steps * trainer.map_or(1, |t| t.accumulation);
                vec![s.batch * n; usize::try_from(draws).unwrap_or(usize::MAX)]
            }
        };
        if sft && s.autocast.is_some() {
            return Err(field(
                "autocast",
                "TRL's fused head over float32 weights under autocast is not emulated",
            ));
        }
        if !lengths.is_empty() && trainer.is_none() {
            return Err(field("lengths", "given to the Trainer's collator only"));
        }
        // `generate`'s keyword arguments: its length, a repetition penalty, sampling.
        let kwargs = s.generate.clone().unwrap_or_default();
        const KNOWN: [&str; 10] = [
            "eos_token_id",
            "max_length",
            "max_new_tokens",
            "repetition_penalty",
            "do_sample",
            "temperature",
            "top_k",
            "top_p",
            "num_beams",
            "cache_implementation",
        ];
        let unknown: Vec<&str> = (kwargs.keys().map(String::as_str))
            .filter(|k| !KNOWN.contains(k))
            .collect();
        if !unknown.is_empty() {
            return Err(field(
                "generate",
                &format!(
                    "emulated with {}, not {}",
                    KNOWN.join(", "),
                    unknown.join(", ")
                ),
            ));
        }
        let whole = |key: &str| kwargs.get(key).map(|v| v.as_u64().filter(|&n| n > 0));
        let generated = match (whole("max_new_tokens"), whole("max_length")) {
            (Some(Some(n)), None) => Some(n),
            (None, Some(Some(n))) if n > s.context => Some(n - s.context),
            (None, None) => s.generated,
            _ => {
                return Err(field(
                    "generate",
                    "max_new_tokens a whole number above 0, or max_length above the context",
                ))
            }
        };
        let repetition_penalty = match kwargs.get("repetition_penalty") {
            None => false,
            Some(v) => match v.as_f64() {
                Some(p) if p > 0.0 && p.is_finite() => p != 1.0,
                _ => return Err(field("generate", "repetition_penalty a number above 0")),
            },
        };
        let number = |key: &str| {
            kwargs
                .get(key)
                .map(|v| v.as_f64().filter(|x| x.is_finite()))
        };
        let sampling = match kwargs.get("do_sample").map(|v| v.as_bool()) {
            None | Some(Some(false)) => None,
            Some(Some(true)) => Some(crate::stack::sampling::Sampling {
                temperature: match number("temperature") {
                    None => false,
                    Some(Some(t)) if t > 0.0 => t != 1.0,
                    _ => return Err(field("generate", "temperature a number above 0")),
                },
                top_k: match kwargs.get("top_k").map(|v| v.as_u64()) {
                    None => 50,
                    Some(Some(k)) if k <= crate::stack::sampling::MAX_TOP_K => k,
                    _ => return Err(field("generate", "top_k a whole number up to 4096")),
                },
                top_p: match number("top_p") {
                    None => false,
                    Some(Some(p)) if p > 0.0 && p <= 1.0 => p < 1.0,
                    _ => return Err(field("generate", "top_p a number above 0, up to 1")),
                },
            }),
            Some(None) => return Err(field("generate", "do_sample true or false")),
        };
        let offloaded_cache = match kwargs.get("cache_implementation").map(|v| v.as_str()) {
            None | Some(Some("dynamic")) => false,
            Some(Some("offloaded")) => true,
            _ => {
                return Err(field(
                    "generate",
                    "cache_implementation dynamic or offloaded",
                ))
            }
        };
        // `eos_token_id`: one id, a list of them, or none.
        let eos_tokens = match kwargs.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => 0,
            Some(v) if v.is_u64() => 1,
            Some(serde_json::Value::Array(ids)) if ids.iter().all(|i| i.is_u64()) => {
                ids.len() as u64
            }
            _ => {
                return Err(field(
                    "generate",
                    "eos_token_id a token id or a list of them",
                ))
            }
        };
        let beams = match whole("num_beams") {
            None => 1,
            Some(Some(n)) => n,
            Some(None) => return Err(field("generate", "num_beams a whole number above 0")),
        };
        // `hf_loops.py` pads generate's rows by the counts in turn, each at most the context
        // less one.
        let pads = s.left_padding.as_deref().unwrap_or_default();
        let left_padded = (pads.iter().zip(0..s.batch)).any(|(&p, _)| p.min(s.context - 1) > 0);
        let padded = left_padded || lengths.iter().any(|&n| n < s.context);
        let optimizer = match (s.optimizer, s.trainer_args.optim.as_deref(), trainer) {
            (SpecOptimizer::AdamW, _, None) => Optimizer::AdamW(s.optimizer_impl),
            (SpecOptimizer::AdamW8bit, _, None) => Optimizer::AdamW8bit { paged: false },
            (_, None | Some("adamw_torch_fused"), Some(_)) => {
                Optimizer::AdamW(OptimizerImpl::Fused)
            }
            (_, Some("adamw_torch"), Some(_)) => Optimizer::AdamW(OptimizerImpl::Foreach),
            (_, Some("adamw_8bit"), Some(_)) => Optimizer::AdamW8bit { paged: false },
            (_, Some("paged_adamw_8bit"), Some(_)) => Optimizer::AdamW8bit { paged: true },
            (_, Some("adafactor"), Some(_)) => Optimizer::Adafactor,
            (_, Some(_), Some(_)) => {
                return Err(field(
                    "trainer_args",
                    "optim: adamw_torch_fused, adamw_torch, adamw_8bit, paged_adamw_8bit or \
                     adafactor",
                ))
            }
        };
        let lora = || -> Result<Lora, SpecError> {
            let l = s.lora.clone().ok_or_else(|| field("lora", "missing"))?;
            if l.rank == 0 {
                return Err(field("lora", "rank: not a whole number above 0"));
            }
            if !(0.0..1.0).contains(&l.dropout) {
                return Err(field("lora", "dropout: a probability from 0 to below 1"));
            }
            Ok(Lora {
                rank: l.rank,
                targets: l.targets,
                dropout: l.dropout > 0.0,
            })
        };
        let train = |lora| Work::Train {
            lora,
            optimizer,
            checkpointing: s.checkpointing,
            steps: s.steps,
            trainer,
        };
        let work = match s.mode {
            SpecMode::Inference => Work::Generate {
                generated: generated
                    .filter(|&n| n > 0)
                    .ok_or_else(|| field("generated", "not a whole number above 0"))?,
                repetition_penalty,
                sampling,
                beams,
                eos_tokens,
                offloaded_cache,
            },
            SpecMode::Full => train(None),
            SpecMode::Lora | SpecMode::Qlora => train(Some(lora()?)),
        };
        // QLoRA's script saves a checkpoint and loads it quantized.
        let saved_nf4 = s.quantization.as_ref().is_some_and(|q| q.method == "bnb4");
        let loading = match (s.mode, s.loading) {
            (SpecMode::Qlora | SpecMode::Inference, SpecLoading::Prequantized) if saved_nf4 => {
                Loading::PrequantizedNf4
            }
            (_, SpecLoading::Prequantized) => return Err(field(
                "loading",
                "`prequantized` is emulated for QLoRA and serving of a checkpoint saved in NF4 \
                     (bnb4)",
            )),
            (SpecMode::Qlora, _) => Loading::PretrainedNf4,
            (_, SpecLoading::FromConfig) => Loading::FromConfig,
            (_, SpecLoading::Pretrained) => Loading::Pretrained,
        };
        // A tensor-parallel run loads a checkpoint saved on disk (`hf_loops.py`).
        let tensor_parallel_run = s.distributed.as_ref().is_some_and(|d| d.strategy == "tp");
        let loading = match tensor_parallel_run {
            true => Loading::Pretrained,
            false => loading,
        };
        if let Some(d) = &s.distributed {
            if d.world_size < 2 || d.rank >= d.world_size {
                return Err(field(
                    "distributed",
                    "a world_size above 1 and a rank below it",
                ));
            }
        }
        let sharding = match &s.distributed {
            None => None,
            Some(d) if d.strategy == "fsdp" => {
                if !matches!(s.dtype, Dtype::Bfloat16 | Dtype::Float16) {
                    return Err(field(
                        "distributed",
                        "FSDP2 is emulated for parameters gathered in bfloat16 or float16",
                    ));
                }
                if model.tied_embeddings {
                    return Err(field(
                        "distributed",
                        "FSDP2 of a model with tied embeddings is not yet emulated",
                    ));
                }
                if !matches!(s.mode, SpecMode::Full | SpecMode::Lora)
                    || trainer.is_some()
                    || s.autocast.is_some()
                {
                    return Err(field(
                        "distributed",
                        "FSDP2 is emulated for full training and LoRA written by hand",
                    ));
                }
                Some(Sharding {
                    world: d.world_size,
                    rank: d.rank,
                    mixed_precision: d.mixed_precision,
                })
            }
            Some(d) if matches!(d.strategy.as_str(), "tp" | "ddp") => None,
            Some(_) => {
                return Err(field(
                    "distributed",
                    "the strategies emulated are fsdp, ddp and tp",
                ))
            }
        };
        let ddp = match &s.distributed {
            Some(d) if d.strategy == "ddp" => {
                if !matches!(s.mode, SpecMode::Full | SpecMode::Lora) || trainer.is_some() {
                    return Err(field(
                        "distributed",
                        "DDP is emulated for full training and LoRA written by hand",
                    ));
                }
                let bucket_cap = match s.bucket_cap_mb {
                    None => None,
                    Some(mb) if mb > 0.0 && mb <= 1e6 => Some(mib_bytes(mb)),
                    Some(_) => return Err(field("bucket_cap_mb", "not a size in MiB above 0")),
                };
                Some(Ddp {
                    world: d.world_size,
                    rank: d.rank,
                    gradient_as_bucket_view: s.gradient_as_bucket_view,
                    bucket_cap,
                })
            }
            _ => None,
        };
        let tensor_parallel = match &s.distributed {
            Some(d) if tensor_parallel_run => {
                if s.mode != SpecMode::Inference {
                    return Err(field(
                        "distributed",
                        "tensor parallelism is emulated for serving (mode inference)",
                    ));
                }
                let tp = TensorParallel {
                    world: d.world_size,
                    rank: d.rank,
                };
                if let Some(why) = tp.refusal(&model) {
                    return Err(field("distributed", &why));
                }
                Some(tp)
            }
            _ => None,
        };
        let mask_order =
            match s.mask_order.as_deref().and_then(|o| o.first()) {
                None => MaskOrder::FullFirst,
                Some(kind) if kind == "sliding_attention" => MaskOrder::SlidingFirst,
                Some(kind) if kind == "full_attention" => MaskOrder::FullFirst,
                Some(_) => return Err(field(
                    "mask_order",
                    "not a list of layer kinds beginning with sliding_attention or full_attention",
                )),
            };
        Ok(Run {
            model,
            dtype,
            autocast: s.autocast,
            batch: s.batch,
            context: s.context,
            work,
            loading,
            kernels: Kernels::for_gpu(crate::allocator::ComputeCapability::new(9, 0)),
            mask_order,
            padded,
            sharding,
            tensor_parallel,
            ddp,
            labelled,
            flat_tokens: s.tokens,
        })
    }
}
