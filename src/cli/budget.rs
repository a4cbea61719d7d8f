//! `mesure_memoire budget`: the GPU memory budget of a real model, term by term, and with `--fit`
//! the catalog's packages that hold it. `calcul_forfaits --fit` plans a budget saved with
//! `--output`.

use super::{values, Context, Outcome};
use crate::allocator::ComputeCapability;
use crate::budget::{
    self, presets::Presets, Budget, BudgetSettings, KvFormat, LinearTarget, Mode, ModelShape,
    Optimizer, WeightFormat, Workload,
};
use crate::catalog::Catalog;
use crate::measure::Dtype;
use std::path::PathBuf;
use std::process::ExitCode;

/// A model: a preset of the shipped list, or its shape given flag by flag (one of the two is
/// required; `shape` says so).
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// A model preset (see `budget --list-models`), e.g. llama-2-7b.
    #[arg(long, conflicts_with_all = ["layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"])]
    pub model: Option<String>,
    /// Presets file with the columns of data/modeles.csv [default: the shipped presets].
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Decoder layers (an explicit shape; then --hidden, --heads, --intermediate and --vocab too).
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
    /// Biases on the Q, K and V projections.
    #[arg(long)]
    pub attention_bias: bool,
    /// Experts per layer (mixture of experts) [default: 1].
    #[arg(long, value_parser = values::positive_u64, default_value = "1")]
    pub experts: u64,
    /// Experts each token goes through [default: 1].
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsArg {
    Dense,
    Int8,
    Int4,
}

#[derive(Debug, clap::Args)]
pub struct BudgetArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// List the presets and exit.
    #[arg(long)]
    pub list_models: bool,
    /// What runs: inference, lora, qlora (LoRA over NF4 weights) or full training.
    #[arg(long, value_enum, required_unless_present_any = ["list_models", "against"])]
    pub mode: Option<ModeArg>,
    /// Compute dtype of activations, dense weights and gradients.
    #[arg(long, value_parser = values::dtype, default_value = "bfloat16")]
    pub dtype: Dtype,
    /// Storage of the layers' linear matrices (qlora: NF4).
    #[arg(long, value_enum, default_value = "dense")]
    pub weights: WeightsArg,
    /// Group size of int4 weights.
    #[arg(long, value_parser = values::positive_u64, default_value = "128")]
    pub group_size: u64,
    /// Sequences processed together.
    #[arg(long, value_parser = values::positive_u64, default_value = "1")]
    pub batch: u64,
    /// Prompt tokens (inference) or sequence length (training).
    #[arg(long, value_parser = values::positive_u64, required_unless_present_any = ["list_models", "against"])]
    pub context: Option<u64>,
    /// Tokens generated after the prompt (inference).
    #[arg(long, value_parser = values::count_u64, default_value = "0")]
    pub generated: u64,
    /// Element type of the KV cache: float32, float16, bfloat16 or fp8 [default: --dtype].
    #[arg(long)]
    pub kv_cache: Option<KvFormat>,
    /// LoRA rank.
    #[arg(long, value_parser = values::positive_u64, default_value = "16")]
    pub rank: u64,
    /// LoRA target modules, comma-separated: q, k, v, o, gate, up, down.
    #[arg(long, value_delimiter = ',', default_value = "q,v")]
    pub targets: Vec<LinearTarget>,
    /// Optimizer of full training: adamw-mixed, adamw, sgd-momentum or adamw-8bit.
    #[arg(long, default_value = "adamw-mixed")]
    pub optimizer: Optimizer,
    /// Full-layer activation recomputation (training).
    #[arg(long)]
    pub checkpointing: bool,
    /// Attention that never materialises the score matrix (FlashAttention, SDPA).
    #[arg(long)]
    pub flash_attention: bool,
    /// A fragmentation reserve in GiB (a hypothesis, not a measurement).
    #[arg(long, value_parser = values::gib, default_value = "0")]
    pub reserve_gib: crate::decimal::PlainDecimal,
    /// The GPU architecture, for the cuBLAS workspaces (9.0: H100, H200).
    #[arg(long, default_value = "9.0", value_parser = values::compute_capability)]
    pub compute_capability: ComputeCapability,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also save the budget as JSON in this new file (for `calcul_forfaits --fit`).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also plan the budget over the catalog's packages.
    #[arg(long)]
    pub fit: bool,
    /// Also draw the budget per GPU against the catalog's GPU sizes (a new SVG file).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Instead, check the budget of each run recorded by `mesure_memoire transformer` against
    /// its figures (the run's shape and mode come from the file).
    #[arg(long, num_args = 1.., conflicts_with_all = ["model", "layers", "mode", "context", "fit", "output", "plot", "list_models"])]
    pub against: Vec<PathBuf>,
}

/// How a budget is planned over the catalog.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Catalog CSV [default: data/tarifs-forfaits.csv if present, else the built-in copy].
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// The most GPUs tried per offer.
    #[arg(long, value_parser = values::positive_u64, default_value = "64")]
    pub max_gpus: u64,
}

impl ModelArgs {
    pub fn presets(&self) -> Result<Presets, super::Failure> {
        Ok(match &self.models {
            Some(p) => Presets::load_file(p).context("cannot read --models")?,
            None => Presets::builtin(),
        })
    }

    /// The preset's name (if any) and the shape.
    pub fn shape(&self) -> Result<(Option<String>, ModelShape), super::Failure> {
        if let Some(name) = &self.model {
            let presets = self.presets()?;
            let p = presets.get(name).context("invalid --model")?;
            return Ok((Some(p.preset.clone()), p.shape()));
        }
        if self.layers.is_none() {
            return Err(super::Failure::usage(
                "give a model: --model PRESET, or its shape (--layers, --hidden, --heads, \
                 --intermediate, --vocab and optionally --kv-heads, --head-dim, \
                 --tied-embeddings, --attention-bias)",
            ));
        }
        let need = |v: Option<u64>| v.expect("clap requires the shape flags together");
        let (hidden, heads) = (need(self.hidden), need(self.heads));
        let shape = ModelShape {
            layers: need(self.layers),
            hidden,
            heads,
            kv_heads: self.kv_heads.unwrap_or(heads),
            head_dim: self.head_dim.unwrap_or(hidden / heads),
            intermediate: need(self.intermediate),
            vocab: need(self.vocab),
            tied_embeddings: self.tied_embeddings,
            attention_bias: self.attention_bias,
            experts: self.experts,
            experts_per_token: self.experts_per_token,
            attention: budget::AttentionKind::Full,
        };
        Ok((None, shape))
    }
}

impl BudgetArgs {
    /// The validated workload of these flags.
    pub fn workload(&self) -> Result<Workload, super::Failure> {
        let (preset, shape) = self.model.shape()?;
        let mode = self.mode.expect("clap requires --mode");
        let weights = match (mode, self.weights) {
            (ModeArg::Qlora, WeightsArg::Dense) => WeightFormat::Nf4,
            (ModeArg::Qlora, _) => {
                return Err(super::Failure::usage(
                    "--mode qlora stores the weights in NF4; leave --weights out",
                ))
            }
            (_, WeightsArg::Dense) => WeightFormat::Dense,
            (_, WeightsArg::Int8) => WeightFormat::Int8,
            (_, WeightsArg::Int4) => WeightFormat::Int4 {
                group_size: self.group_size,
            },
        };
        let mode = match mode {
            ModeArg::Inference => Mode::Inference {
                generated: self.generated,
                kv_cache: self.kv_cache.unwrap_or(KvFormat::of(self.dtype)),
            },
            ModeArg::Lora | ModeArg::Qlora => {
                let mut targets = self.targets.clone();
                targets.sort();
                targets.dedup();
                Mode::Lora {
                    rank: self.rank,
                    targets,
                }
            }
            ModeArg::Full => Mode::Full {
                optimizer: self.optimizer,
            },
        };
        let workload = Workload {
            preset,
            shape,
            mode,
            dtype: self.dtype,
            weights,
            batch: self.batch,
            context: self.context.expect("clap requires --context"),
            checkpointing: self.checkpointing,
            flash_attention: self.flash_attention,
        };
        workload
            .validated()
            .context("invalid model or workload flags")
    }

    /// The budget of these flags.
    pub fn budget(&self) -> Result<Budget, super::Failure> {
        let workload = self.workload()?;
        let reserve = crate::units::gib_to_bytes(self.reserve_gib)
            .ok_or_else(|| super::Failure::usage("--reserve-gib is too large"))?;
        let settings = BudgetSettings::for_gpu(self.compute_capability, reserve);
        Ok(budget::budget(&workload, settings))
    }
}

pub fn run(a: &BudgetArgs) -> Outcome {
    if !a.against.is_empty() {
        let mut all = Vec::new();
        for path in &a.against {
            let report = crate::budget::BenchReport::load(path)?;
            let v = crate::budget::verify::verify(&report, BudgetSettings::h200())
                .context(format!("cannot check {}", path.display()))?;
            all.push(v);
        }
        super::print(&crate::budget::verify::Verifications(all), a.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.list_models {
        let presets = a.model.presets()?;
        super::print(&presets, a.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    for out in [&a.output, &a.plot].into_iter().flatten() {
        crate::files::check_new_file(out)?;
    }
    let b = a.budget()?;
    super::print(&b, a.json)?;
    if let Some(out) = &a.output {
        crate::files::write_new_json(out, &b)?;
        super::say(format_args!("Budget written to {}", out.display()))?;
    }
    if !a.fit && a.plot.is_none() {
        return Ok(ExitCode::SUCCESS);
    }
    // Read once for the plan and the chart.
    let catalog = Catalog::load(a.plan.catalog.as_deref())?;
    if a.fit {
        plan_and_print(&b, &catalog, a.plan.max_gpus, a.json)?;
    }
    if let Some(plot) = &a.plot {
        crate::plot::budget_chart(&b, &catalog).write_new(plot)?;
        super::say(format_args!("Chart written to {}", plot.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Plans `budget` over `catalog` and prints the plan.
pub fn plan_and_print(
    b: &Budget,
    catalog: &Catalog,
    max_gpus: u64,
    json: bool,
) -> Result<(), super::Failure> {
    let p = budget::plan(b, catalog, max_gpus)?;
    super::print(&p, json)
}
