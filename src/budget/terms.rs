//! The budget of a workload on one GPU: the Hugging Face run replayed through the allocator
//! model (every allocation and free in the real stack's order) gives the peaks of `allocated`
//! and `reserved` and what the allocator holds at the peak, by role; the exact terms (weights,
//! adapters, gradients, optimizer states, KV cache) are arithmetic of the model; what lives
//! outside the allocator is measured; the card needs `reserved` + outside + the margin the proof
//! measured.

use super::outside::OutsideAllocator;
use super::workload::{AllocatorSetting, Mode, Optimizer, WeightFormat, Workload};
use crate::allocator::AllocatorConfig;
use crate::files::JsonError;
use crate::model::Attention;
use crate::stack::bitsandbytes;
use crate::stack::ops::Kernels;
use crate::stack::optimizer::{adamw_8bit_state_bytes, BLOCK_8BIT, MIN_8BIT_ELEMENTS, QMAP_BYTES};
use crate::stack::run::{
    program_replayed_watching, replayed, Program, Replayed, RoleBytes, Watched,
};
use crate::stack::tensor::Role;
use crate::units::{grouped, Bytes};
use serde::{Deserialize, Serialize};

/// How sure a term is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum TermStatus {
    /// Arithmetic of the model and the storage format.
    Exact,
    /// From the replay of the emulated stack through the allocator model; `bound` says how far
    /// replays were found from the GPU.
    Replayed { bound: String },
    /// Measured on a named GPU.
    Measured { on: String, source: String },
    /// A choice of the user (a reserve), not a fact.
    Hypothesis,
}

impl TermStatus {
    pub fn name(&self) -> &'static str {
        match self {
            TermStatus::Exact => "exact",
            TermStatus::Replayed { .. } => "replayed",
            TermStatus::Measured { .. } => "measured",
            TermStatus::Hypothesis => "hypothesis",
        }
    }
}

/// How a term divides when the workload is spread over `n` GPUs (the planner's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Divided evenly, rounded up (weights, gradients, optimizer states: ZeRO-3 / FSDP).
    Sharded,
    /// Divided by KV heads: each GPU holds ⌈kv_heads / n⌉ heads (tensor parallelism).
    KvHeads,
    /// Whole on every GPU.
    PerGpu,
}

/// Whether a term lives inside the caching allocator (`reserved`) or beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    Allocator,
    OutsideAllocator,
    Reserve,
}

/// One line of the budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    pub key: String,
    pub name: String,
    /// The formula with the workload's numbers, or where the figure comes from.
    pub formula: String,
    /// The term's own size (its tensors' bytes; the figure itself for replayed terms).
    pub bytes: Bytes,
    /// What it holds at the peak of `reserved` (the allocator's blocks, rounded).
    pub at_peak: Bytes,
    #[serde(flatten)]
    pub status: TermStatus,
    pub split: Split,
    pub place: Place,
}

/// One stage of the replayed run and its peaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagePeak {
    pub stage: String,
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
}

/// The tag of a budget file.
pub const SCHEMA: &str = "iteragpu-lab/budget/2";

/// The margin added to a budget: the worst error of the replays' peak `reserved` against the
/// H200 in the proofs (−0.601 %, Phi-3 mini's full training with recomputation, its peak of
/// `allocated` exact: a tie between equal free blocks broken otherwise than the driver's addresses
/// broke it), rounded up to the next 0.05 %, in millionths (`docs/benchmarks.md`, "Fit verdicts
/// on the real card").
pub const MARGIN_PPM: u64 = 6_500;
/// Where the margin comes from, said in every budget.
pub const MARGIN_SOURCE: &str = "the worst error of a replay's peak reserved against the H200 in \
scripts/gpu/hf-proof.py and hf-record.py (docs/benchmarks.md, Fit verdicts on the real card)";

/// The budget of a workload on one GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Budget {
    pub schema: String,
    pub workload: Workload,
    pub parameters: u64,
    /// The parameters training updates: those that get a gradient (not a vision tower's).
    pub trainable_parameters: u64,
    /// What the allocator holds at its peak, by term, then what is outside it and the reserve;
    /// the `at_peak` column sums to `total`.
    pub terms: Vec<Term>,
    /// The replayed run's stages.
    pub stages: Vec<StagePeak>,
    /// The stage where `reserved` peaks.
    pub peak_stage: String,
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    pub outside_allocator: Bytes,
    /// The proof's worst error on `reserved`, in bytes of this budget.
    pub margin: Bytes,
    pub margin_source: String,
    /// `peak_reserved` + `outside_allocator` + the reserve: what the card must have, before
    /// the margin.
    pub total: Bytes,
    /// `total` + the margin: what the planner asks of a GPU.
    pub needed: Bytes,
    pub outside: OutsideAllocator,
    pub kernels: Kernels,
    /// The checkpoint's headers, when the model was read from its folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::model::folder::Checkpoint>,
    /// The programs of the workload's runs (one per order its masks may take), kept for the
    /// planner's replays on a card (not in the file: read back, they are emulated again when
    /// needed).
    #[serde(skip)]
    pub programs: Vec<std::sync::Arc<Program>>,
    /// The replays limited to a card that the budget's own replay showed needed and ran beside
    /// it (not in the file).
    #[serde(skip)]
    pub replayed_on_cards: Vec<CardReplay>,
}

/// Whether one of a budget's programs completed on an allocator limited to a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardReplay {
    /// Its index in [`Budget::programs`].
    pub program: usize,
    /// The bytes the allocator may use on the card.
    pub usable: u64,
    pub allocator: AllocatorSetting,
    pub completed: bool,
}

/// The largest reserve `--reserve-gib` takes: 2^50 bytes (1 PiB), more than any GPU.
pub const MAX_RESERVE_BYTES: u64 = 1 << 50;

/// The inputs of a budget besides the workload.
#[derive(Debug, Clone)]
pub struct BudgetSettings {
    /// Workspace sizes of the GPU's architecture.
    pub kernels: Kernels,
    pub outside: OutsideAllocator,
    /// A reserve chosen by the user.
    pub reserve_bytes: u64,
}

impl BudgetSettings {
    /// PyTorch's defaults for the architecture `cc`, the outside memory measured on the H200,
    /// and a reserve.
    pub fn for_gpu(cc: crate::allocator::ComputeCapability, reserve_bytes: u64) -> BudgetSettings {
        BudgetSettings {
            kernels: Kernels::for_gpu(cc),
            outside: OutsideAllocator::h200(),
            reserve_bytes,
        }
    }

    /// The H200's architecture (9.0), no reserve.
    pub fn h200() -> BudgetSettings {
        BudgetSettings::for_gpu(crate::allocator::ComputeCapability::new(9, 0), 0)
    }
}

/// The allocator configuration of a workload's setting, new segments placed as the CUDA driver
/// placed them in a transformers process (where equal free blocks tie, the allocator picks the
/// lowest address: docs/allocator-model.md).
pub fn allocator_config(setting: AllocatorSetting) -> AllocatorConfig {
    AllocatorConfig {
        expandable_segments: setting == AllocatorSetting::ExpandableSegments,
        address_order: crate::allocator::AddressOrder::Driver,
    }
}

fn role(roles: &RoleBytes, r: Role) -> u64 {
    roles[Role::ALL
        .iter()
        .position(|x| *x == r)
        .expect("a listed role")]
}

/// The exact size of the weights (and buffers) as stored.
fn weight_bytes(w: &Workload) -> (u64, String) {
    let e = w.dtype.bytes();
    let buffers: u64 = w
        .model
        .buffers()
        .iter()
        .map(|b| b.elements() * crate::stack::tensor::Elem::of_buffer(b).size())
        .sum();
    let n = w.model.parameter_count();
    if w.weights == WeightFormat::Nf4 {
        let (quantized, kept): (Vec<_>, Vec<_>) = w
            .model
            .parameters()
            .into_iter()
            .partition(crate::stack::bitsandbytes::quantizes);
        let q: u64 = quantized.iter().map(|p| p.elements()).sum();
        let q_bytes: u64 = quantized
            .iter()
            .map(|p| bitsandbytes::quantized_bytes(p.elements()))
            .sum::<u64>()
            + bitsandbytes::dynamic_map_bytes();
        let kept_bytes: u64 = kept.iter().map(|p| p.elements() * e).sum();
        return (
            q_bytes + kept_bytes + buffers,
            format!(
                "{} linear-layer parameters in NF4 ({} B: half a byte each, an 8-bit scale per \
                 {} and a float32 per {} of those, codes and maps) + {} others × {e} B ({}) + \
                 {} B of float32 buffers",
                grouped(q),
                grouped(q_bytes),
                bitsandbytes::BLOCK,
                bitsandbytes::SCALE_BLOCK,
                grouped(n - q),
                w.dtype,
                grouped(buffers),
            ),
        );
    }
    let params: u64 = w.model.parameters().iter().map(|p| p.elements() * e).sum();
    (
        params + buffers,
        format!(
            "{} parameters × {e} B ({}) + {}",
            grouped(n),
            w.dtype,
            match (w.model.vision, w.model.model_type.is_gemma()) {
                (Some(_), _) => format!(
                    "{} B of buffers (float32 rotary frequencies and embedding scale, the vision \
                     tower's int64 patch positions); the vision tower's parameters included",
                    grouped(buffers)
                ),
                (None, gemma) => format!(
                    "{} B of float32 buffers (rotary frequencies{})",
                    grouped(buffers),
                    if gemma { ", embedding scale" } else { "" }
                ),
            }
        ),
    )
}

/// The parameters a text-only run uses (all but a vision tower's).
fn text_parameters(w: &Workload) -> Vec<crate::model::Parameter> {
    let mut p = w.model.parameters();
    p.retain(crate::model::Parameter::used_by_text);
    p
}

/// LoRA's adapter parameters, rank × (in + out) on every targeted linear layer: all of them, and
/// those a text-only run trains (a vision tower's adapters get no gradient).
fn lora_parameters(w: &Workload, rank: u64, targets: &[String]) -> (u64, u64) {
    w.model
        .parameters()
        .iter()
        .filter(|p| p.is_linear_weight() && targets.iter().any(|t| t == p.module()))
        .fold((0, 0), |(all, trained), p| {
            let n = rank * (p.shape[0] + p.shape[1]);
            (all + n, trained + if p.used_by_text() { n } else { 0 })
        })
}

/// The KV cache's final size: every layer's keys and values as `DynamicCache` holds them after
/// the last forward (a sliding layer its window's worth; a latent layer the latent and the
/// rotary key).
fn kv_bytes(w: &Workload) -> (u64, String) {
    let m = &w.model;
    let e = w.dtype.bytes();
    let Mode::Inference { generated } = w.mode else {
        return (0, String::new());
    };
    // The last new token is never fed back.
    let tokens = w.context + generated.max(1) - 1;
    let per_token = match m.attention {
        Attention::Latent(l) => l.kv_lora_rank + l.qk_rope_head_dim,
        Attention::Standard { .. } => 2 * m.kv_dim(),
    };
    let bytes: u64 = m
        .layers
        .iter()
        .map(|l| {
            let kept = match l.window {
                Some(window) if tokens > window => window,
                _ => tokens,
            };
            w.batch * kept * per_token * e
        })
        .sum();
    let sliding = m.layers.iter().filter(|l| l.window.is_some()).count();
    let formula = format!(
        "{} layers × batch {} × {} tokens{} × {} per token × {e} B",
        m.layers.len(),
        w.batch,
        grouped(tokens),
        if sliding > 0 {
            format!(" ({sliding} sliding layers keep at most their window)")
        } else {
            String::new()
        },
        match m.attention {
            Attention::Latent(l) => format!(
                "{} (latent {} + rotary key {})",
                grouped(per_token),
                l.kv_lora_rank,
                l.qk_rope_head_dim
            ),
            Attention::Standard { .. } => format!(
                "{} (K and V: 2 × {} KV heads × {})",
                grouped(per_token),
                m.kv_heads,
                m.head_dim
            ),
        },
    );
    (bytes, formula)
}

/// Why no budget was given.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error(transparent)]
    Workload(#[from] super::workload::WorkloadError),
}

impl crate::status::Classify for BudgetError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// The budget of a validated workload, with the programs of its runs (for the verdicts on
/// cards).
pub fn budget(w: &Workload, settings: &BudgetSettings) -> Budget {
    budget_on_cards(w, settings, &[])
}

/// The budget of a validated workload, with the programs of its runs and, for cards on which
/// the allocator may use each of `capacities` bytes, the replays limited to the card under both
/// settings that its replay showed needed, run beside it ([`crate::stack::run::Watched`]).
pub fn budget_on_cards(w: &Workload, settings: &BudgetSettings, capacities: &[u64]) -> Budget {
    let mut capacities = capacities.to_vec();
    capacities.sort_unstable();
    capacities.dedup();
    let allocators = [w.allocator, w.allocator.other()];
    let configs = allocators.map(allocator_config);
    let watched = Watched {
        capacities: &capacities,
        configs: &configs,
        at_most: Watched::two_a_core(),
    };
    let mut replayed_on_cards = Vec::new();
    let (programs, replays): (Vec<Program>, Vec<Replayed>) = w
        .runs(settings.kernels)
        .iter()
        .enumerate()
        .map(|(program, run)| {
            let (p, r, limited) = program_replayed_watching(run, configs[0], &watched);
            replayed_on_cards.extend(limited.into_iter().map(|l| CardReplay {
                program,
                usable: l.capacity,
                allocator: allocators[l.config],
                completed: l.completed,
            }));
            (p, r)
        })
        .unzip();
    Budget {
        programs: programs.into_iter().map(std::sync::Arc::new).collect(),
        replayed_on_cards,
        ..budget_of(w, settings, &replays)
    }
}

/// The budget of a validated workload alone: the programs of its runs are not kept (verdicts
/// on cards emulate them again), so that a long run takes no memory for its events.
pub fn budget_alone(w: &Workload, settings: &BudgetSettings) -> Budget {
    let replays: Vec<Replayed> = w
        .runs(settings.kernels)
        .iter()
        .map(|run| replayed(run, allocator_config(w.allocator)))
        .collect();
    budget_of(w, settings, &replays)
}

/// The budget from the replays of a workload's runs: of several possible runs, the one that
/// needs the most.
fn budget_of(w: &Workload, settings: &BudgetSettings, replays: &[Replayed]) -> Budget {
    let worst = replays
        .iter()
        .max_by_key(|r| (r.peak_reserved, r.peak_allocated))
        .expect("a workload makes a run");
    from_replay(w, settings, worst)
}

/// The budget of `w` from a replay of its run.
pub fn from_replay(w: &Workload, settings: &BudgetSettings, r: &Replayed) -> Budget {
    let parameters = w.model.parameter_count();
    let e = w.dtype.bytes();
    let bound = format!(
        "the replays of the runs recorded on the H200 are within {:.2} % of their peak reserved",
        MARGIN_PPM as f64 / 10_000.0
    );
    let replay_status = || TermStatus::Replayed {
        bound: bound.clone(),
    };
    let mut terms = Vec::new();
    let mut push = |key: &str,
                    name: &str,
                    formula: String,
                    bytes: u64,
                    at_peak: u64,
                    status: TermStatus,
                    split: Split,
                    place: Place| {
        terms.push(Term {
            key: key.into(),
            name: name.into(),
            formula,
            bytes: Bytes(bytes),
            at_peak: Bytes(at_peak),
            status,
            split,
            place,
        });
    };
    let roles = &r.roles_at_peak;
    let (wb, wf) = weight_bytes(w);
    push(
        "weights",
        "Weights",
        wf,
        wb,
        role(roles, Role::Weights),
        TermStatus::Exact,
        Split::Sharded,
        Place::Allocator,
    );
    // What requires a gradient, and what gets one (a vision tower's tensors do not).
    let (trainable, trained) = match &w.mode {
        Mode::Inference { .. } => (0, 0),
        Mode::Full { .. } => (
            parameters,
            text_parameters(w).iter().map(|p| p.elements()).sum(),
        ),
        Mode::Lora { rank, targets } => lora_parameters(w, *rank, targets),
    };
    let untrained = |what: &str| match trainable - trained {
        0 => String::new(),
        n => format!(
            " (not the vision tower's {} {what}: no gradient)",
            grouped(n)
        ),
    };
    match &w.mode {
        Mode::Inference { .. } => {
            let (kb, kf) = kv_bytes(w);
            push(
                "kv_cache",
                "KV cache",
                kf,
                kb,
                role(roles, Role::KvCache),
                TermStatus::Exact,
                Split::KvHeads,
                Place::Allocator,
            );
        }
        Mode::Lora { rank, targets } => {
            let formula = |count: u64, what: &str| {
                format!(
                    "{} adapter parameters (rank {rank} × (in + out) on {}) × {what}",
                    grouped(count),
                    targets.join(", ")
                )
            };
            let trained_formula =
                |what: &str| formula(trained, what) + &untrained("adapter parameters");
            push(
                "lora_adapters",
                "LoRA adapters",
                formula(trainable, "4 B (float32)"),
                trainable * 4,
                role(roles, Role::Adapters),
                TermStatus::Exact,
                Split::Sharded,
                Place::Allocator,
            );
            push(
                "gradients",
                "Gradients",
                trained_formula("4 B (float32)"),
                trained * 4,
                role(roles, Role::Gradients),
                TermStatus::Exact,
                Split::Sharded,
                Place::Allocator,
            );
            push(
                "optimizer_states",
                "Optimizer states",
                trained_formula("8 B (AdamW: two float32 moments)"),
                trained * 8,
                role(roles, Role::OptimizerStates),
                TermStatus::Exact,
                Split::Sharded,
                Place::Allocator,
            );
        }
        Mode::Full { optimizer } => {
            push(
                "gradients",
                "Gradients",
                format!(
                    "{} parameters × {e} B ({}){}",
                    grouped(trained),
                    w.dtype,
                    untrained("parameters")
                ),
                trained * e,
                role(roles, Role::Gradients),
                TermStatus::Exact,
                Split::Sharded,
                Place::Allocator,
            );
            let (formula, bytes) = match optimizer {
                Optimizer::Adamw => (
                    format!(
                        "{} parameters × 2 × {e} B ({}: two moments in {}){}",
                        grouped(trained),
                        optimizer.name(),
                        w.dtype,
                        untrained("parameters")
                    ),
                    trained * 2 * e,
                ),
                Optimizer::Adamw8bit => (
                    format!(
                        "{} parameters × 2 × 1 B ({}: two 8-bit moments, a float32 scale per \
                         {BLOCK_8BIT} elements of each; float32 moments for a parameter under \
                         {} elements; two quantization maps of {QMAP_BYTES} B){}",
                        grouped(trained),
                        optimizer.name(),
                        grouped(MIN_8BIT_ELEMENTS),
                        untrained("parameters")
                    ),
                    adamw_8bit_state_bytes(text_parameters(w).iter().map(|t| t.elements())),
                ),
            };
            push(
                "optimizer_states",
                "Optimizer states",
                formula,
                bytes,
                role(roles, Role::OptimizerStates),
                TermStatus::Exact,
                Split::Sharded,
                Place::Allocator,
            );
        }
    }
    // In training the forward also builds a cache (transformers' `use_cache`, on unless
    // checkpointing turns it off): a temporary of the step there, the KV cache term in inference.
    let training_cache = if w.mode.trains() {
        role(roles, Role::KvCache)
    } else {
        0
    };
    let temporaries = role(roles, Role::Activations)
        + role(roles, Role::Inputs)
        + role(roles, Role::OptimizerStep)
        + training_cache;
    push(
        "activations",
        "Activations and temporaries",
        format!(
            "what the run holds at its peak ({}) besides the terms above: {}",
            r.peak_stage,
            if w.mode.trains() {
                "activations kept for backward, temporaries, the inputs, the cache the forward \
                 builds (use_cache) and the optimizer step's"
            } else {
                "the inputs, the forward's temporaries and the logits"
            }
        ),
        temporaries,
        temporaries,
        replay_status(),
        Split::PerGpu,
        Place::Allocator,
    );
    let workspaces = role(roles, Role::Workspaces);
    push(
        "workspaces",
        "cuBLAS, cuBLASLt and kernel workspaces",
        format!(
            "{} B for cuBLAS per thread that multiplies{}",
            grouped(settings.kernels.cublas_workspace),
            if settings.kernels.cublaslt_workspace > 0 {
                format!(
                    ", {} B for cuBLASLt with a bias",
                    grouped(settings.kernels.cublaslt_workspace)
                )
            } else {
                String::new()
            }
        ),
        workspaces,
        workspaces,
        replay_status(),
        Split::PerGpu,
        Place::Allocator,
    );
    let cached = r.peak_reserved.saturating_sub(r.allocated_at_peak);
    push(
        "cached_free",
        "Reserved but unallocated",
        format!(
            "blocks the caching allocator holds free at the peak ({}): the cost of its segments \
             and splits under {}",
            r.peak_stage,
            match w.allocator {
                AllocatorSetting::Default => "the default settings",
                AllocatorSetting::ExpandableSegments => "expandable_segments:True",
            }
        ),
        cached,
        cached,
        replay_status(),
        Split::PerGpu,
        Place::Allocator,
    );
    let outside = settings.outside.for_mode(w.mode.trains());
    push(
        "outside_allocator",
        "CUDA context and libraries",
        format!(
            "outside the allocator in a {} process ({})",
            if w.mode.trains() {
                "training"
            } else {
                "generate"
            },
            settings.outside.software
        ),
        outside,
        outside,
        TermStatus::Measured {
            on: settings.outside.measured_on.clone(),
            source: settings.outside.source.clone(),
        },
        Split::PerGpu,
        Place::OutsideAllocator,
    );
    push(
        "reserve",
        "Reserve",
        "chosen by the user (--reserve-gib)".into(),
        settings.reserve_bytes,
        settings.reserve_bytes,
        TermStatus::Hypothesis,
        Split::PerGpu,
        Place::Reserve,
    );
    // Bounded sizes keep these sums far below 2^64; saturating, an absurd reserve given to the
    // library fits no card rather than wrapping into a small total.
    let total = r
        .peak_reserved
        .saturating_add(outside)
        .saturating_add(settings.reserve_bytes);
    let margin = r
        .peak_reserved
        .div_ceil(1_000_000)
        .saturating_mul(MARGIN_PPM);
    Budget {
        schema: SCHEMA.into(),
        workload: w.clone(),
        parameters,
        trainable_parameters: trained,
        terms,
        stages: r
            .stages
            .iter()
            .map(|(stage, f)| StagePeak {
                stage: stage.clone(),
                peak_allocated: Bytes(f.peak_allocated_bytes),
                peak_reserved: Bytes(f.peak_reserved_bytes),
            })
            .collect(),
        peak_stage: r.peak_stage.clone(),
        peak_allocated: Bytes(r.peak_allocated),
        peak_reserved: Bytes(r.peak_reserved),
        outside_allocator: Bytes(outside),
        margin: Bytes(margin),
        margin_source: MARGIN_SOURCE.into(),
        total: Bytes(total),
        needed: Bytes(total.saturating_add(margin)),
        outside: settings.outside.clone(),
        kernels: settings.kernels,
        checkpoint: None,
        programs: Vec::new(),
        replayed_on_cards: Vec::new(),
    }
}

impl crate::files::Tagged for Budget {
    const SCHEMA: &'static str = SCHEMA;
    const KIND: crate::files::Input = crate::files::Input::Budget;
    fn schema(&self) -> &str {
        &self.schema
    }
}

impl Budget {
    /// What the terms of `place` hold at the peak.
    pub fn held_at_peak(&self, place: Place) -> u64 {
        self.terms
            .iter()
            .filter(|t| t.place == place)
            .fold(0u64, |s, t| s.saturating_add(t.at_peak.0))
    }

    /// Reads a budget written by `mesure_memoire budget --output`: [`BudgetFile::parse`], then
    /// [`BudgetFile::verify`].
    pub fn load(path: &std::path::Path) -> Result<Budget, JsonError> {
        let bytes = crate::files::read_capped(path, crate::files::Input::Budget)?;
        BudgetFile::parse(&bytes, &path.display().to_string())?.verify()
    }
}

/// A budget file as read, untrusted: its structure and bounds checked, none of its figures
/// believed yet ([`BudgetFile::verify`] gives the budget the planner takes).
#[derive(Debug)]
pub struct BudgetFile {
    file: String,
    value: serde_json::Value,
    checkpoint: Option<crate::model::folder::Checkpoint>,
    workload: Workload,
    settings: BudgetSettings,
}

impl BudgetFile {
    /// Parses budget bytes: the schema, no control character in any text, a model and a workload
    /// within every bound a `config.json` and the command line keep, kernels that are an
    /// architecture's, the outside memory this version ships, a reserve within
    /// [`MAX_RESERVE_BYTES`].
    pub fn parse(bytes: &[u8], file: &str) -> Result<BudgetFile, JsonError> {
        let invalid =
            |message: String| JsonError::invalid(file, crate::files::Input::Budget, message);
        let b: Budget = crate::files::parse_tagged(bytes, file)?;
        // Text the budget prints comes from the file: none may reach a terminal as a control.
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if let Some((pointer, c)) = crate::text::first_unsafe_in_json(&value) {
            return Err(invalid(format!(
                "`{pointer}` holds the control character {}",
                c.escape_unicode()
            )));
        }
        let workload = b
            .workload
            .clone()
            .validated()
            .map_err(|e| invalid(format!("workload: {e}")))?;
        if b.parameters != workload.model.parameter_count() {
            return Err(invalid("parameters: not the model's count".into()));
        }
        let cc = crate::allocator::workspace::KNOWN_ARCHITECTURES
            .into_iter()
            .find(|&cc| Kernels::for_gpu(cc) == b.kernels)
            .ok_or_else(|| {
                invalid(
                    "kernels: not the workspaces of an architecture PyTorch 2.11 runs on".into(),
                )
            })?;
        let reserve = b
            .terms
            .iter()
            .find(|t| t.place == Place::Reserve)
            .map_or(0, |t| t.bytes.0);
        if reserve > MAX_RESERVE_BYTES {
            return Err(invalid(format!(
                "terms: a reserve of {reserve} B, above 2^50 B (1 PiB)"
            )));
        }
        let settings = BudgetSettings::for_gpu(cc, reserve);
        if b.outside != settings.outside {
            return Err(invalid(
                "outside: not the measurement of what lives outside the allocator that this \
                 version ships"
                    .into(),
            ));
        }
        Ok(BudgetFile {
            file: file.to_string(),
            value,
            checkpoint: b.checkpoint,
            workload,
            settings,
        })
    }

    /// The file's workload, within every bound.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The workload budgeted again; the file must say exactly what that budget says (a file
    /// edited, or written by another version of the replay, is refused, naming the first field
    /// that differs). The budget returned is the one computed here, with the programs the
    /// planner replays.
    pub fn verify(self) -> Result<Budget, JsonError> {
        let again = Budget {
            checkpoint: self.checkpoint,
            ..budget(&self.workload, &self.settings)
        };
        let computed = serde_json::to_value(&again).expect("a budget serializes");
        match first_difference(&self.value, &computed, String::new()) {
            None => Ok(again),
            Some(pointer) => Err(JsonError::invalid(
                &self.file,
                crate::files::Input::Budget,
                format!(
                    "`{pointer}` is not what this version computes for the file's workload \
                     (edited, or written by another version): budget it again with \
                     `mesure_memoire budget --output`"
                ),
            )),
        }
    }
}

/// The JSON pointer of the first place where `a` and `b` differ, if any.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let here = format!("{at}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => {
                        if let Some(d) = first_difference(p, q, here) {
                            return Some(d);
                        }
                    }
                    _ => return Some(here),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if let Some(d) = first_difference(p, q, format!("{at}/{i}")) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| format!("{at}/{}", x.len().min(y.len())))
        }
        _ => (a != b).then_some(if at.is_empty() { "/".into() } else { at }),
    }
}
