//! `mesure_memoire budget`: the GPU memory budget of a Hugging Face workload (the run replayed
//! through the allocator model), and with `--fit` the catalog's packages that hold it, with
//! `--max-batch` / `--max-context` the largest batch or context each GPU model holds.
//! `calcul_forfaits --fit` plans a budget saved with `--output`.

use super::{values, Context, Failure, Outcome};
use crate::allocator::ComputeCapability;
use crate::budget::fit::{self, Size};
use crate::budget::{
    self, presets::Presets, AllocatorSetting, Budget, BudgetSettings, Mode, Optimizer,
    WeightFormat, Workload,
};
use crate::catalog::Catalog;
use crate::measure::Dtype;
use crate::model::folder::Checkpoint;
use crate::model::{Model, Quantization};
use crate::stack::optimizer::OptimizerImpl;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// A model: a Hub id, a preset of the shipped list, a `config.json` (or its folder), or a
/// Llama-style shape given flag by flag.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// A Hugging Face Hub id ORG/NAME[@REVISION], e.g. Qwen/Qwen3-8B (read from the local
    /// Hugging Face cache, else from the Hub: config.json and the safetensors headers, never the
    /// weights; HF_TOKEN for gated models, HF_HUB_OFFLINE for the cache only), or a model preset
    /// (see `budget --list-models`), e.g. llama-3.1-8b.
    #[arg(long, conflicts_with_all = ["config", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings", "attention_bias", "experts", "experts_per_token"])]
    pub model: Option<String>,
    /// A model's config.json, or the folder that holds it.
    #[arg(long, conflicts_with_all = ["layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings", "attention_bias", "experts", "experts_per_token"])]
    pub config: Option<PathBuf>,
    /// Presets file with the columns of data/modeles.csv [default: the shipped presets].
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Decoder layers (an explicit Llama-style shape; then --hidden, --heads, --intermediate and
    /// --vocab too).
    #[arg(long, value_parser = values::positive_u64, requires_all = ["hidden", "heads", "intermediate", "vocab"])]
    pub layers: Option<u64>,
    /// Hidden width.
    #[arg(long, value_parser = values::positive_u64)]
    pub hidden: Option<u64>,
    /// Query heads.
    #[arg(long, value_parser = values::positive_u64)]
    pub heads: Option<u64>,
    /// Key/value heads [default: --heads].
    #[arg(long, value_parser = values::positive_u64)]
    pub kv_heads: Option<u64>,
    /// Width of a head [default: hidden / heads].
    #[arg(long, value_parser = values::positive_u64)]
    pub head_dim: Option<u64>,
    /// The MLP's inner width.
    #[arg(long, value_parser = values::positive_u64)]
    pub intermediate: Option<u64>,
    /// Vocabulary size.
    #[arg(long, value_parser = values::positive_u64)]
    pub vocab: Option<u64>,
    /// The LM head shares the embedding matrix.
    #[arg(long)]
    pub tied_embeddings: bool,
    /// Biases on the Q, K and V projections (a Qwen2 model).
    #[arg(long)]
    pub attention_bias: bool,
    /// Experts per layer (a Mixtral model).
    #[arg(long, value_parser = values::positive_u64, default_value = "1")]
    pub experts: u64,
    /// Experts each token goes through.
    #[arg(long, value_parser = values::positive_u64, default_value = "1")]
    pub experts_per_token: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Inference,
    Lora,
    Qlora,
    Full,
}

/// How a run is spread over several GPUs (`--parallel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ParallelArg {
    /// FSDP2, `fully_shard` on every decoder layer then the root (training).
    Fsdp,
    /// transformers' tensor parallelism, `tp_plan="auto"` (serving).
    Tp,
    /// DistributedDataParallel with its defaults, the whole model on every GPU (training).
    Ddp,
    /// `device_map="auto"`, layers placed on GPUs in order: not yet replayed.
    Layers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheArg {
    Dynamic,
    Offloaded,
    Static,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AutocastArg {
    Bfloat16,
    Float16,
}

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct BudgetArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// List the presets and exit.
    #[arg(long)]
    pub list_models: bool,
    /// What runs: inference (`generate`), lora, qlora or full training.
    #[arg(long, value_enum, required_unless_present = "list_models")]
    pub mode: Option<ModeArg>,
    /// Weights' and activations' dtype [default: bfloat16; float32 with --autocast].
    #[arg(long, value_parser = values::dtype)]
    pub dtype: Option<Dtype>,
    /// Sequences processed together.
    #[arg(long, value_parser = values::positive_u64, default_value = "1")]
    pub batch: u64,
    /// Prompt tokens (inference) or sequence length (training).
    #[arg(long, value_parser = values::positive_u64, required_unless_present = "list_models")]
    pub context: Option<u64>,
    /// Tokens `generate` adds after the prompt (inference) [default: 1].
    #[arg(long, value_parser = values::positive_u64)]
    pub generated: Option<u64>,
    /// generate's max_length instead of --generated: the prompt and the new tokens together
    /// (inference).
    #[arg(long, value_parser = values::positive_u64, conflicts_with = "generated")]
    pub max_length: Option<u64>,
    /// generate's repetition_penalty (inference): other than 1, its logits processor runs on
    /// every token's logits [default: none].
    #[arg(long, value_parser = values::positive_decimal)]
    pub repetition_penalty: Option<rust_decimal::Decimal>,
    /// generate's do_sample=True (inference): the token drawn from the softmax after the
    /// warpers --temperature, --top-k and --top-p turn on (the model's generation_config.json,
    /// else transformers' defaults: temperature 1, top_k 50, top_p 1) rather than chosen
    /// greedily. Without it, generate samples where the model's generation_config.json says so.
    #[arg(long, conflicts_with = "greedy")]
    pub sample: bool,
    /// generate's do_sample=False (inference), whatever the model's generation_config.json says.
    #[arg(long)]
    pub greedy: bool,
    /// Sampling's temperature (with --sample): other than 1, the scores divided [default: 1].
    #[arg(long, requires = "sample", value_parser = values::positive_decimal)]
    pub temperature: Option<rust_decimal::Decimal>,
    /// Sampling's top_k (with --sample): the k best tokens kept, 0 for none [default: 50].
    #[arg(long, requires = "sample", value_parser = values::count_u64)]
    pub top_k: Option<u64>,
    /// Sampling's top_p (with --sample): below 1, the scores sorted and the smallest set holding
    /// that share of the probability kept [default: 1].
    #[arg(long, requires = "sample", value_parser = values::top_p)]
    pub top_p: Option<rust_decimal::Decimal>,
    /// generate's num_beams (inference): above 1, beam search over that many copies of each
    /// row (the model's generation_config.json, else 1).
    #[arg(long, value_parser = values::positive_u64)]
    pub num_beams: Option<u64>,
    /// generate's cache_implementation (inference): dynamic (DynamicCache, transformers'
    /// default) or offloaded (every full layer's keys and values on the CPU between its updates);
    /// static is refused: generate compiles its decoding step for it (CUDA graphs), not emulated
    /// [default: the model's generation_config.json, else dynamic].
    #[arg(long, value_enum)]
    pub cache_implementation: Option<CacheArg>,
    /// LoRA rank (lora) [default: 16].
    #[arg(long, value_parser = values::positive_u64)]
    pub rank: Option<u64>,
    /// LoRA target modules, comma-separated: the model's module names (q_proj, v_proj…) or
    /// their short forms q, k, v, o, gate, up, down (lora) [default: q,v].
    #[arg(long, value_delimiter = ',')]
    pub targets: Option<Vec<String>>,
    /// PEFT's lora_dropout, from 0 to below 1 (lora): above 0, each adapter's input goes
    /// through dropout, its mask kept for the backward [default: 0].
    #[arg(long, value_parser = values::probability)]
    pub lora_dropout: Option<rust_decimal::Decimal>,
    /// The optimizer of full training: adamw (torch.optim.AdamW), adamw-8bit
    /// (bitsandbytes.optim.AdamW8bit), paged-adamw-8bit (PagedAdamW8bit: large moments in CUDA
    /// unified memory) or adafactor (transformers' Adafactor, with --trainer) [default: adamw].
    #[arg(long)]
    pub optimizer: Option<Optimizer>,
    /// AdamW's implementation (training): foreach (PyTorch's default on CUDA), fused or
    /// for-loop [default: foreach; fused with --trainer].
    #[arg(long)]
    pub optimizer_impl: Option<OptimizerImpl>,
    /// Gradient checkpointing (training).
    #[arg(long)]
    pub checkpointing: bool,
    /// Train float32 weights under torch.autocast of this dtype (the Trainer's mixed
    /// precision) (training).
    #[arg(long, value_enum)]
    pub autocast: Option<AutocastArg>,
    /// The steps as transformers' Trainer runs them (lora or full): bf16 mixed precision with
    /// bfloat16 weights or --autocast bfloat16, fp16 (with its gradient scaler) with --autocast
    /// float16 or float16 weights under LoRA, gradients clipped, AdamW fused by default.
    #[arg(long)]
    pub trainer: bool,
    /// The steps as TRL's SFTTrainer runs them on the Trainer (lora or full; implies --trainer):
    /// its fused LM head, which scores the positions with a label in tiles of 4 096 × 32 768
    /// rather than making the logits, and the entropy and token accuracy it logs.
    #[arg(long)]
    pub sft: bool,
    /// TRL's padding_free=True (with --sft; packing=True implies it): each batch's --batch
    /// sequences of --context tokens flattened into one row, no attention mask, the attention
    /// under the block-diagonal mask of the packed sequences.
    #[arg(long, requires = "sft")]
    pub padding_free: bool,
    /// TRL's loss on the completion alone (completion_only_loss, its default for a
    /// prompt-completion dataset; with --sft): the last N tokens of each row carry a label, the
    /// prompt's none (without it, every position is counted labelled: the most there can be).
    #[arg(long, value_name = "N", requires = "sft")]
    pub completion_tokens: Option<u64>,
    /// The batch is padded: its shorter rows padded to --context, as a tokenizer pads them, the
    /// attention under the mask built for them (inference, or training with --trainer).
    #[arg(long)]
    pub padded: bool,
    /// With --trainer: gradient_accumulation_steps, the batches each optimizer step runs forward
    /// and backward before the clipping and the optimizer's step [default: 1].
    #[arg(long, value_parser = values::positive_u64)]
    pub gradient_accumulation: Option<u64>,
    /// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
    #[arg(long)]
    pub expandable_segments: bool,
    /// A reserve in GiB (a hypothesis, not a measurement).
    #[arg(long, value_parser = values::gib, default_value = "0")]
    pub reserve_gib: crate::decimal::PlainDecimal,
    /// The GPU architecture, for the cuBLAS workspaces and bitsandbytes' choice of 4-bit kernel
    /// (9.0: H100, H200).
    #[arg(long, default_value = "9.0", value_parser = values::compute_capability)]
    pub compute_capability: ComputeCapability,
    /// The GPU's streaming multiprocessors, for bitsandbytes' choice of 4-bit kernel and what a
    /// long reduction stages (132: H100 SXM, H200).
    #[arg(long, default_value = "132", value_parser = values::positive_u64)]
    pub multiprocessors: u64,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also save the budget as JSON in this new file (for `calcul_forfaits --fit`).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also plan the budget over the catalog's packages.
    #[arg(long)]
    pub fit: bool,
    /// With --fit: per catalog model, the largest batch found to hold on one GPU, the next not.
    #[arg(long, requires = "fit", conflicts_with = "max_context")]
    pub max_batch: bool,
    /// With --fit: per catalog model, the largest context found to hold on one GPU, the next not.
    #[arg(long, requires = "fit")]
    pub max_context: bool,
    /// Also draw the budget per GPU against the catalog's GPU sizes (a new SVG file).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Also the run spread over this many GPUs (2 to 64), rank by rank: a full or LoRA training
    /// by FSDP2 (rank 0 and the last rank replayed; rank 0 alone where every rank holds as many
    /// rows of each shard) or DDP (rank 0), serving by tensor parallelism (rank 0).
    /// Several counts (`8,16,32,64`): what each GPU needs at each, beside the split rule's
    /// estimate.
    #[arg(long, value_parser = values::positive_u64, value_delimiter = ',')]
    pub gpus: Vec<u64>,
    /// The way `--gpus` spreads the run (by default FSDP2 for a training, tensor parallelism
    /// for serving; ddp for a training with one count).
    #[arg(long, value_enum, requires = "gpus")]
    pub parallel: Option<ParallelArg>,
    #[command(flatten)]
    pub plan: PlanArgs,
}

/// How a budget is planned over the catalog.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Catalog CSV (with --fit or --plot) [default: data/tarifs-forfaits.csv if present, else
    /// the built-in copy].
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// The most GPUs tried per offer (with --fit).
    #[arg(long, value_parser = values::positive_u64, default_value = "64", requires = "fit")]
    pub max_gpus: u64,
}

/// A model as the flags name it.
pub struct NamedModel {
    /// Where it comes from: the preset, the path, the repository and commit.
    pub source: String,
    pub model: Model,
    /// Its checkpoint's headers (a folder or the Hub).
    pub checkpoint: Option<Checkpoint>,
    /// Its `generation_config.json` (a folder or the Hub).
    pub generation: Option<crate::model::generation::GenerationDefaults>,
}

impl NamedModel {
    fn bare(source: String, model: Model) -> NamedModel {
        NamedModel {
            source,
            model,
            checkpoint: None,
            generation: None,
        }
    }
}

impl ModelArgs {
    pub fn presets(&self) -> Result<Presets, Failure> {
        Ok(match &self.models {
            Some(p) => Presets::load_file(p).context("cannot read --models")?,
            None => Presets::builtin(),
        })
    }

    fn no_model() -> Failure {
        Failure::usage(
            "give a model: --model PRESET, --config PATH (a config.json or its folder), or a \
             Llama-style shape (--layers, --hidden, --heads, --intermediate, --vocab and \
             optionally --kv-heads, --head-dim, --tied-embeddings, --attention-bias, --experts)",
        )
    }

    /// The model, where it comes from, its checkpoint's headers and its generation defaults
    /// when read from a folder or the Hub.
    pub fn model(&self) -> Result<NamedModel, Failure> {
        if let Some(name) = self.model.as_ref().filter(|n| n.contains('/')) {
            let id = crate::model::hub::HubId::parse(name).map_err(Failure::usage_owned)?;
            let read = crate::model::hub::read(&id, &crate::model::hub::HubSettings::from_env())
                .context(format!("--model {}", crate::text::printable(name)))?;
            let source = format!("{}, read from {}", read.name, read.read_from);
            return Ok(NamedModel {
                source,
                model: read.model,
                checkpoint: read.checkpoint,
                generation: read.generation,
            });
        }
        if let Some(name) = &self.model {
            let presets = self.presets()?;
            let p = presets.get(name).context("invalid --model")?;
            let model = p.model().context(format!("preset {}", p.preset))?;
            return Ok(NamedModel::bare(p.preset.clone(), model));
        }
        if let Some(path) = &self.config {
            let (model, checkpoint) = crate::model::folder::read_with_checkpoint(path)?;
            // transformers reads the generation defaults beside the config, in its folder.
            let folder = match path.is_dir() {
                true => Some(path.as_path()),
                false => path.parent(),
            };
            let generation = match folder {
                Some(f) => crate::model::generation::read(f)?,
                None => None,
            };
            return Ok(NamedModel {
                source: path.display().to_string(),
                model,
                checkpoint,
                generation,
            });
        }
        let Some(layers) = self.layers else {
            return Err(Self::no_model());
        };
        let need = |v: Option<u64>| v.expect("clap requires the shape flags together");
        let (hidden, heads) = (need(self.hidden), need(self.heads));
        let model_type =
            match (self.experts > 1, self.attention_bias) {
                (true, true) => return Err(Failure::usage(
                    "--experts with --attention-bias: no supported model type has both (give a \
                     config.json with --config)",
                )),
                (true, false) => "mixtral",
                (false, true) => "qwen2",
                (false, false) => "llama",
            };
        let mut config = serde_json::json!({
            "model_type": model_type,
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": self.kv_heads.unwrap_or(heads),
            "head_dim": self.head_dim.unwrap_or(hidden / heads),
            "intermediate_size": need(self.intermediate),
            "vocab_size": need(self.vocab),
            "tie_word_embeddings": self.tied_embeddings,
        });
        if self.experts > 1 {
            config["num_local_experts"] = self.experts.into();
            config["num_experts_per_tok"] = self.experts_per_token.into();
        } else if self.experts_per_token > 1 {
            return Err(Failure::usage("--experts-per-token needs --experts"));
        }
        let model = crate::model::config::from_value(&config)
            .map_err(|e| Failure::usage_owned(format!("invalid shape flags: {e}")))?;
        Ok(NamedModel::bare("the shape of the flags".into(), model))
    }
}

/// The module a LoRA target names: a short name (`q`, `k`, `v`, `o`, `gate`, `up`, `down`) is
/// Llama's `q_proj`…; any other name is the module's own.
fn target_module(t: &str) -> String {
    match t {
        "q" | "k" | "v" | "o" | "gate" | "up" | "down" => format!("{t}_proj"),
        _ => t.to_string(),
    }
}

/// Whether generate's cache is offloaded: as `--cache-implementation` (`flag`) says, else the
/// model's `generation_config.json`, else dynamic; a cache whose allocations are not emulated is
/// refused, saying why.
fn offloaded_cache(
    flag: Option<CacheArg>,
    defaults: &crate::model::generation::GenerationDefaults,
) -> Result<bool, Failure> {
    use crate::model::generation::CacheKind;
    let (kind, named, remedy) = match (flag, &defaults.cache_implementation) {
        (Some(CacheArg::Dynamic), _) => (CacheKind::Dynamic, String::new(), ""),
        (Some(CacheArg::Offloaded), _) => (CacheKind::Offloaded, String::new(), ""),
        (Some(CacheArg::Static), _) => (
            CacheKind::Compiled,
            "--cache-implementation static".to_string(),
            "budget dynamic or offloaded",
        ),
        (None, Some(name)) => (
            CacheKind::of(name).unwrap_or(CacheKind::Other),
            format!("the model's generation_config.json sets cache_implementation {name:?}"),
            "give --cache-implementation dynamic or offloaded to budget a generate call that \
                 names its cache (generate(..., cache_implementation=\"dynamic\"))",
        ),
        (None, None) => (CacheKind::Dynamic, String::new(), ""),
    };
    match kind.refusal() {
        Some(why) => Err(Failure::usage_owned(format!("{named}: {why}; {remedy}"))),
        None => Ok(kind == CacheKind::Offloaded),
    }
}

impl BudgetArgs {
    /// Refuses the flags that do not apply to the mode, naming them.
    fn check_flags(&self, mode: ModeArg) -> Result<(), Failure> {
        let trains = mode != ModeArg::Inference;
        let lora = matches!(mode, ModeArg::Lora | ModeArg::Qlora);
        let misplaced = [
            (
                self.generated.is_some() && trains,
                "--generated",
                "inference",
            ),
            (
                self.max_length.is_some() && trains,
                "--max-length",
                "inference",
            ),
            (
                self.repetition_penalty.is_some() && trains,
                "--repetition-penalty",
                "inference",
            ),
            (self.sample && trains, "--sample", "inference"),
            (
                self.num_beams.is_some() && trains,
                "--num-beams",
                "inference",
            ),
            (
                self.cache_implementation.is_some() && trains,
                "--cache-implementation",
                "inference",
            ),
            (self.greedy && trains, "--greedy", "inference"),
            (self.rank.is_some() && !lora, "--rank", "lora"),
            (self.targets.is_some() && !lora, "--targets", "lora"),
            (
                self.lora_dropout.is_some() && !lora,
                "--lora-dropout",
                "lora",
            ),
            (
                self.optimizer.is_some() && mode != ModeArg::Full,
                "--optimizer",
                "full",
            ),
            (
                self.optimizer_impl.is_some() && !trains,
                "--optimizer-impl",
                "lora or full",
            ),
            (
                self.checkpointing && !trains,
                "--checkpointing",
                "lora or full",
            ),
            (
                self.autocast.is_some() && !trains,
                "--autocast",
                "lora or full",
            ),
            (self.trainer && !trains, "--trainer", "lora or full"),
            (self.sft && !trains, "--sft", "lora or full"),
        ];
        if let Some((_, flag, modes)) = misplaced.iter().find(|(wrong, _, _)| *wrong) {
            return Err(Failure::usage_owned(format!(
                "{flag} applies to --mode {modes} only"
            )));
        }
        if let Some(o) = self.optimizer.filter(|o| *o != Optimizer::Adamw) {
            if self.optimizer_impl.is_some() {
                return Err(Failure::usage_owned(format!(
                    "--optimizer-impl chooses torch.optim.AdamW's step: it does not apply to \
                     --optimizer {o}"
                )));
            }
        }
        if self.autocast.is_some() && self.dtype.is_some_and(|d| d != Dtype::Float32) {
            return Err(Failure::usage(
                "--autocast trains float32 weights: leave --dtype out (or give float32)",
            ));
        }
        Ok(())
    }

    /// The validated workload of these flags, and the checkpoint's headers of a model folder.
    pub fn workload(&self) -> Result<(Workload, Option<Checkpoint>), Failure> {
        let mode_arg = self.mode.expect("clap requires --mode");
        self.check_flags(mode_arg)?;
        let NamedModel {
            source,
            model,
            checkpoint,
            generation,
        } = self.model.model()?;
        // generate's defaults from the model's generation_config.json, under the flags given.
        let generation = generation.filter(|_| mode_arg == ModeArg::Inference);
        let defaults = generation.clone().unwrap_or_default();
        let autocast = self.autocast.map(|a| match a {
            AutocastArg::Bfloat16 => Dtype::Bfloat16,
            AutocastArg::Float16 => Dtype::Float16,
        });
        let dtype = match (self.dtype, autocast) {
            (Some(d), _) => d,
            (None, Some(_)) => Dtype::Float32,
            (None, None) => Dtype::Bfloat16,
        };
        let mode = match mode_arg {
            ModeArg::Inference => Mode::Inference {
                generated: match (self.max_length, self.context) {
                    (Some(n), Some(c)) if n > c => n - c,
                    (Some(n), _) => {
                        return Err(Failure::usage_owned(format!(
                            "--max-length {n} leaves no token to generate after the {} of \
                             --context: give more than the context",
                            self.context.unwrap_or(0)
                        )))
                    }
                    (None, _) => self.generated.unwrap_or(1),
                },
            },
            ModeArg::Lora | ModeArg::Qlora => {
                let mut targets: Vec<String> = self
                    .targets
                    .clone()
                    .unwrap_or_else(|| vec!["q".into(), "v".into()])
                    .iter()
                    .map(|t| target_module(t))
                    .collect();
                targets.sort();
                targets.dedup();
                Mode::Lora {
                    rank: self.rank.unwrap_or(16),
                    targets,
                }
            }
            ModeArg::Full => Mode::Full {
                optimizer: self.optimizer.unwrap_or(Optimizer::Adamw),
            },
        };
        // QLoRA quantizes as it loads (or loads a checkpoint saved in NF4); a checkpoint saved in
        // NF4 is served as saved, and so is one saved by GPTQ, AWQ, bitsandbytes' 8-bit or FP8.
        let weights = match (mode_arg, model.quantization) {
            (ModeArg::Qlora, _) => WeightFormat::Nf4,
            (ModeArg::Inference, Some(Quantization::Bnb4 { double_quant: true })) => {
                WeightFormat::Nf4
            }
            (ModeArg::Inference, Some(Quantization::Bnb4 { .. }) | None) => WeightFormat::Dense,
            (ModeArg::Inference, Some(_)) => WeightFormat::Prequantized,
            _ => WeightFormat::Dense,
        };
        let workload = Workload {
            source,
            model,
            mode,
            dtype,
            weights,
            batch: self.batch,
            context: self.context.expect("clap requires --context"),
            checkpointing: self.checkpointing,
            // The Trainer's default optimizer is `adamw_torch_fused`.
            optimizer_impl: (self.optimizer_impl).unwrap_or(match self.trainer || self.sft {
                true => OptimizerImpl::Fused,
                false => OptimizerImpl::Foreach,
            }),
            autocast,
            allocator: if self.expandable_segments {
                AllocatorSetting::ExpandableSegments
            } else {
                AllocatorSetting::Default
            },
            trainer: self.trainer || self.sft,
            accumulation: self.gradient_accumulation.unwrap_or(1),
            padded: self.padded,
            lora_dropout: self.lora_dropout,
            sft: self.sft,
            padding_free: self.padding_free,
            completion_tokens: self.completion_tokens,
            repetition_penalty: self.repetition_penalty.or(defaults.repetition_penalty),
            sample: (self.sample || (!self.greedy && defaults.do_sample == Some(true))).then_some(
                crate::budget::workload::SampleArgs {
                    temperature: self.temperature.or(defaults.temperature),
                    top_k: self.top_k.or(defaults.top_k),
                    top_p: self.top_p.or(defaults.top_p),
                },
            ),
            beams: self.num_beams.or(defaults.num_beams),
            offloaded_cache: offloaded_cache(self.cache_implementation, &defaults)?,
            generation_config: generation,
        };
        // A quantized checkpoint is refused, but what its tensors store is said.
        let stored = checkpoint
            .as_ref()
            .filter(|_| workload.model.quantization.is_some())
            .map(|c| c.stored(&workload.model));
        let workload = match (workload.validated(), stored) {
            (Ok(w), _) => w,
            (Err(e), Some(stored)) => {
                return Err(Failure::usage_owned(format!(
                    "invalid model or workload flags: {e}; {stored}"
                )))
            }
            (Err(crate::budget::WorkloadError::Targets { targets, known }), None)
                if self.targets.is_none() =>
            {
                return Err(Failure::usage_owned(format!(
                    "the default LoRA targets (--targets q,v) name {}, which the model lacks: it \
                     has {known}; give --targets",
                    targets.join(" and ")
                )))
            }
            (Err(e), None) => return Err(e).context("invalid model or workload flags"),
        };
        Ok((workload, checkpoint))
    }

    fn settings(&self) -> Result<BudgetSettings, Failure> {
        let reserve = crate::units::gib_to_bytes(self.reserve_gib)
            .filter(|&b| b <= crate::budget::settings::MAX_RESERVE_BYTES)
            .ok_or_else(|| {
                Failure::usage_owned(format!(
                    "--reserve-gib {} is above 2^20 GiB (1 PiB), more than any GPU",
                    self.reserve_gib
                ))
            })?;
        let settings = BudgetSettings::for_gpu(self.compute_capability, reserve);
        Ok(BudgetSettings {
            kernels: settings.kernels.with_multiprocessors(self.multiprocessors),
            ..settings
        })
    }
}

/// The largest batch (or context) of each GPU model of the catalog, per allocator setting.
#[derive(Debug, Clone, Serialize)]
pub struct Largest {
    pub size: Size,
    /// The smallest size searched: 1, or the smallest the workload allows.
    pub first: u64,
    /// The largest size searched: the most the workload allows (`batch × (context + generated)`
    /// tokens a step and the sizes' own bounds), or for a context the model's window less the
    /// tokens generated. A row at it may hold more.
    pub limit: u64,
    /// The model's window (`max_position_embeddings`) where it set the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    pub rows: Vec<LargestRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LargestRow {
    pub model: String,
    /// The GPUs a lot of the model rents: the row holds for each of them, one copy of the
    /// workload on each.
    pub gpus_per_lot: u32,
    pub memory_per_gpu: crate::units::Bytes,
    /// With the workload's allocator setting.
    pub largest: Option<u64>,
    /// With `expandable_segments:True` (when the workload's setting is the default), where it
    /// differs.
    pub with_expandable_segments: Option<u64>,
    /// Where no size holds on one GPU and the plan spreads the workload over several of this
    /// model: the largest that holds on that many, its ranks replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<LargestSpread>,
}

/// The largest size over the GPUs of the plan's row, each rank replayed.
#[derive(Debug, Clone, Serialize)]
pub struct LargestSpread {
    pub gpus: u64,
    pub strategy: fit::Strategy,
    pub largest: u64,
}

impl std::fmt::Display for Largest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.size {
            Size::Batch => "batch",
            Size::Context => "context",
        };
        writeln!(
            f,
            "The largest {what} found to hold on one GPU of each model, the next one not \
             (near that edge a larger one may hold again: docs/benchmarks.md); where none \
             does, on the GPUs the plan spreads it over, every rank replayed:"
        )?;
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    match r.gpus_per_lot {
                        1 => r.model.clone(),
                        n => format!("{} (lots of {n})", r.model),
                    },
                    r.memory_per_gpu.gib_text(),
                    match (r.largest, &r.spread) {
                        (None, Some(s)) => format!(
                            "{} on {} GPUs ({} ranks replayed)",
                            s.largest,
                            s.gpus,
                            s.strategy.name()
                        ),
                        (None, None) if self.first > 1 => {
                            format!("none fits, {} included", self.first)
                        }
                        (None, None) => "none fits".into(),
                        (Some(n), _) if n == self.limit && self.window.is_some() => {
                            format!("{n} (the whole window)")
                        }
                        (Some(n), _) if n == self.limit => format!("{n} (the most searched)"),
                        (Some(n), _) => n.to_string(),
                    },
                    r.with_expandable_segments
                        .map_or(String::new(), |n| format!("{n} with expandable segments")),
                ]
            })
            .collect();
        write!(
            f,
            "{}",
            crate::markup::Table::new(&["GPU", "memory", what, ""], rows).with_gap(2)
        )?;
        if self.first > 1 {
            write!(
                f,
                "\nThe search starts at {}, the smallest the workload allows (`mesure_memoire \
                 budget` with a smaller one says why).",
                self.first
            )?;
        }
        let at_limit = self.rows.iter().any(|r| r.largest == Some(self.limit));
        if let (true, Some(window)) = (at_limit, self.window) {
            write!(
                f,
                "\nThe model's window: {} context tokens and the {} generated make its {window} \
                 positions (max_position_embeddings); the search stops there (`mesure_memoire \
                 budget --context` replays a longer one).",
                self.limit,
                window - self.limit
            )?;
        } else if at_limit {
            write!(
                f,
                "\n{} is the most the workload allows: a larger one is refused (`mesure_memoire \
                 budget` with it says why).",
                self.limit
            )?;
        }
        Ok(())
    }
}

/// The largest `size` on one GPU of each GPU model of `catalog` (a model rented in lots of
/// several GPUs too: what one of them holds); where none holds and `plan` spreads the workload
/// (of budget `b`) over several of them with its ranks replayed, the largest on that many.
fn largest(
    b: &Budget,
    plan: Option<&crate::budget::FitPlan>,
    settings: &BudgetSettings,
    catalog: &Catalog,
    size: Size,
) -> Result<Largest, Failure> {
    let w = &b.workload;
    let mut cards: Vec<&crate::catalog::CatalogRow> = Vec::new();
    for row in &catalog.rows {
        if !cards.iter().any(|c| c.model == row.model) {
            cards.push(row);
        }
    }
    let memories: Vec<u64> = cards.iter().map(|r| fit::memory_bytes(r)).collect();
    // Where the default allocator is asked, expandable segments are tried too.
    let mut allocators = vec![w.allocator];
    if w.allocator == AllocatorSetting::Default {
        allocators.push(AllocatorSetting::ExpandableSegments);
    }
    let what = match size {
        Size::Batch => "--max-batch",
        Size::Context => "--max-context",
    };
    // A context is searched within the model's window, the tokens generated included.
    let generated = w.generated();
    let window = w.model.window.filter(|_| size == Size::Context);
    let limit = match window {
        Some(window) if window <= generated => {
            return Err(Failure::usage_owned(format!(
                "{what}: --generated {generated} leaves no context within the model's window of \
                 {window} positions (max_position_embeddings)"
            )))
        }
        Some(window) => window - generated,
        None => crate::budget::workload::MAX_TOKENS,
    };
    let mut search = fit::SizeSearch::new(w, settings, size, limit, &memories, &allocators)
        .map_err(|e| {
            Failure::from(e).context(format!("{what}: no size of this workload is allowed"))
        })?;
    let asked: Vec<(u64, AllocatorSetting)> = memories
        .iter()
        .flat_map(|&memory| allocators.iter().map(move |&a| (memory, a)))
        .collect();
    let found = search.largest_of_each(&asked);
    let limit = search.limit();
    let mut rows: Vec<LargestRow> = cards
        .iter()
        .zip(memories)
        .zip(found.chunks(allocators.len()))
        .map(|((row, memory), found)| {
            let largest = found[0];
            let with_expandable_segments = found
                .get(1)
                .copied()
                .flatten()
                .filter(|n| Some(*n) != largest);
            LargestRow {
                model: row.model.clone(),
                gpus_per_lot: row.gpus_per_lot,
                memory_per_gpu: crate::units::Bytes(memory),
                largest,
                with_expandable_segments,
                spread: None,
            }
        })
        .collect();
    spread_largest(b, plan, settings, size, limit, &mut rows);
    Ok(Largest {
        size,
        first: search.first(),
        window: window.filter(|&window| limit == window - generated),
        limit,
        rows,
    })
}

/// Fills each row none of whose sizes holds on one GPU with the largest on the fewest GPUs of
/// its model that `plan` found to hold the workload, where its ranks are replayed (the size
/// asked held there: the search starts from it).
fn spread_largest(
    b: &Budget,
    plan: Option<&crate::budget::FitPlan>,
    settings: &BudgetSettings,
    size: Size,
    limit: u64,
    rows: &mut [LargestRow],
) {
    let (Some(plan), Some(strategy)) = (plan, fit::Sharded::of(b).map(|s| s.strategy)) else {
        return;
    };
    let mut lots: Vec<(usize, u64, u64)> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        if row.largest.is_some() {
            continue;
        }
        let fewest = (plan.rows.iter())
            .filter(|r| r.model == row.model)
            .filter_map(|r| r.fit.as_ref().map(|f| (f, r.room_per_gpu.0)))
            .filter(|(f, _)| f.gpus > 1 && f.basis != fit::Basis::SplitEstimate)
            .min_by_key(|(f, _)| f.gpus);
        if let Some((f, room)) = fewest {
            lots.push((i, f.gpus, room));
        }
    }
    let start = match size {
        Size::Batch => b.workload.batch,
        Size::Context => b.workload.context,
    };
    let asked: Vec<(u64, u64)> = lots.iter().map(|&(_, g, r)| (g, r)).collect();
    let found = fit::largest_spread(&b.workload, settings, size, start, limit, &asked);
    for ((i, gpus, _), largest) in lots.into_iter().zip(found) {
        rows[i].spread = Some(LargestSpread {
            gpus,
            strategy,
            largest,
        });
    }
}

/// One JSON document for a budget with what was asked of it.
#[derive(Serialize)]
struct Document<'a> {
    budget: &'a Budget,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a crate::budget::FitPlan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    largest: Option<&'a Largest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sharded: Option<&'a fit::RankBudget>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spread: Option<&'a fit::Spread>,
}

pub fn run(a: &BudgetArgs) -> Outcome {
    if a.list_models {
        if a.output.is_some() || a.fit || a.plot.is_some() {
            return Err(Failure::usage(
                "--list-models takes no --output, --fit or --plot",
            ));
        }
        let presets = a.model.presets()?;
        super::print(&presets, a.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.plan.catalog.is_some() && !a.fit && a.plot.is_none() {
        return Err(Failure::usage(
            "--catalog is read by --fit and --plot only: add one of them",
        ));
    }
    for out in [&a.output, &a.plot].into_iter().flatten() {
        crate::files::check_new_file(out)?;
    }
    if let (Some(output), Some(plot)) = (&a.output, &a.plot) {
        if crate::files::same_destination(output, plot) {
            return Err(Failure::usage("--output and --plot name the same file"));
        }
    }
    let (workload, checkpoint) = a.workload()?;
    let settings = a.settings()?;
    // Everything is computed and checked before anything is written.
    let catalog = if a.fit || a.plot.is_some() {
        Some(Catalog::load(a.plan.catalog.as_deref())?)
    } else {
        None
    };
    // The programs are kept only for the verdicts on cards, and the verdicts on one GPU of each
    // offer replayed beside the budget's own replay where it shows them needed.
    let b = Budget {
        checkpoint,
        ..match (&catalog, a.fit) {
            (Some(c), true) => fit::budget_for_catalog(&workload, &settings, c),
            (Some(_), false) => budget::budget(&workload, &settings),
            (None, _) => budget::compute::budget_alone(&workload, &settings),
        }
    };
    let plan = match (&catalog, a.fit) {
        (Some(c), true) => Some(budget::plan(&b, c, a.plan.max_gpus)?),
        _ => None,
    };
    let size = if a.max_batch {
        Some(Size::Batch)
    } else if a.max_context {
        Some(Size::Context)
    } else {
        None
    };
    let largest = match (&catalog, size) {
        (Some(c), Some(size)) => Some(largest(&b, plan.as_ref(), &settings, c, size)?),
        _ => None,
    };
    let (sharded, spread) = spread_over_gpus(&b, &a.gpus, a.parallel)?;
    let chart = match (&catalog, &a.plot) {
        (Some(c), Some(_)) => Some(crate::plot::budget_chart(&b, c)),
        _ => None,
    };
    let budget_json = serde_json::to_vec_pretty(&b).expect("a budget serializes");
    let mut written = Vec::new();
    if let Some(out) = &a.output {
        crate::files::write_new_file(out, &budget_json)?;
        written.push(out.clone());
    }
    if let (Some(chart), Some(plot)) = (&chart, &a.plot) {
        if let Err(e) = chart.write_new(plot) {
            // Together or not at all: the budget file just written goes.
            for w in &written {
                let _ = std::fs::remove_file(w);
            }
            return Err(e.into());
        }
        written.push(plot.clone());
    }
    if a.json {
        super::print_json(&Document {
            budget: &b,
            plan: plan.as_ref(),
            largest: largest.as_ref(),
            sharded: sharded.as_ref(),
            spread: spread.as_ref(),
        })?;
        for w in &written {
            super::note(format_args!("Written to {}", w.display()))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    super::print(&b, false)?;
    if let Some(p) = &plan {
        super::print(p, false)?;
    }
    if let Some(l) = &largest {
        super::print(l, false)?;
    }
    if let Some(r) = &sharded {
        super::print(r, false)?;
    }
    if let Some(r) = &spread {
        super::print(r, false)?;
    }
    for w in &written {
        super::say(format_args!("Written to {}", w.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--gpus` (with `--parallel`): one count's ranks, or several counts' needs beside the split
/// rule's estimate; a count outside 2 to the planner's most, or a spread not replayed for the
/// run, is refused with the reason.
fn spread_over_gpus(
    b: &Budget,
    counts: &[u64],
    parallel: Option<ParallelArg>,
) -> Result<(Option<fit::RankBudget>, Option<fit::Spread>), Failure> {
    if counts.is_empty() {
        return Ok((None, None));
    }
    if let Some(&n) = counts.iter().find(|&&n| !(2..=fit::MAX_GPUS).contains(&n)) {
        return Err(Failure::usage_owned(format!(
            "--gpus: {n} is not a count of 2 to {} GPUs (one GPU is the budget itself)",
            fit::MAX_GPUS
        )));
    }
    if parallel == Some(ParallelArg::Ddp) {
        let Some(s) = fit::Sharded::ddp(b) else {
            return Err(Failure::usage(
                "--parallel ddp: DDP is replayed for a full training with AdamW or a LoRA of \
                 unquantized weights, written by hand (no --trainer), of a model without a \
                 vision tower",
            ));
        };
        return match counts {
            [gpus] => Ok((Some(s.rank_budget(*gpus)), None)),
            _ => Err(Failure::usage(
                "--parallel ddp: every GPU holds the whole model whatever their count; give one \
                 count (--gpus 8)",
            )),
        };
    }
    let Some(s) = fit::Sharded::of(b) else {
        return Err(Failure::usage(
            "--gpus: FSDP2 is replayed for a full training with AdamW or a LoRA of unquantized \
             weights, written by hand (no --trainer), computed in bfloat16 or float16, of a model \
             without a vision tower or tied embeddings; tensor parallelism for serving \
             unquantized weights of a dense model without tied embeddings whose heads, key and \
             value heads, MLP width and vocabulary split evenly over 2 GPUs",
        ));
    };
    let replayed = match s.strategy {
        fit::Strategy::TensorParallel => ParallelArg::Tp,
        fit::Strategy::Fsdp2 | fit::Strategy::Ddp => ParallelArg::Fsdp,
    };
    match parallel {
        Some(ParallelArg::Layers) => {
            return Err(Failure::usage(
                "--parallel layers: not yet replayed (fsdp and ddp for a training, tp for serving \
                 are)",
            ))
        }
        Some(ParallelArg::Tp) if replayed != ParallelArg::Tp => {
            return Err(Failure::usage(
                "--parallel tp: tensor parallelism is replayed for serving; this training is \
                 spread by FSDP2 (--parallel fsdp) or DDP (--parallel ddp)",
            ))
        }
        Some(ParallelArg::Fsdp) if replayed != ParallelArg::Fsdp => {
            return Err(Failure::usage(
                "--parallel fsdp: FSDP2 is replayed for a training; this run is served by \
                 tensor parallelism (--parallel tp)",
            ))
        }
        _ => {}
    }
    Ok(match counts {
        [gpus] => (Some(s.rank_budget(*gpus)), None),
        _ => (None, Some(s.spread(counts))),
    })
}

/// Plans `budget` over `catalog` and prints the plan (one JSON document: the budget and its
/// plan).
pub fn plan_and_print(
    b: &Budget,
    catalog: &Catalog,
    max_gpus: u64,
    json: bool,
) -> Result<(), Failure> {
    let p = budget::plan(b, catalog, max_gpus)?;
    if json {
        return super::print_json(&Document {
            budget: b,
            plan: Some(&p),
            largest: None,
            sharded: None,
            spread: None,
        });
    }
    super::print(&p, false)
}
