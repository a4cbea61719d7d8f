//! The lines of a budget: what each part of the run holds when the card is fullest. The exact
//! terms (weights, adapters, gradients, optimizer states, KV cache) are arithmetic of the model
//! and the storage format, and their bytes at the peak are the replay's; the activations and
//! temporaries, the workspaces and the allocator's free blocks are the replay's alone; what lives
//! outside the allocator is measured; the reserve is the user's.

use super::settings::{BudgetSettings, MARGIN_PPM};
use super::workload::{AllocatorSetting, Mode, Optimizer, WeightFormat, Workload};
use crate::model::Attention;
use crate::replay::{Replayed, Role};
use crate::stack::bitsandbytes;
use crate::stack::optimizer::{
    paged_adamw_8bit_state_bytes, BLOCK_8BIT, MIN_8BIT_ELEMENTS, PAGED_ELEMENTS, QMAP_BYTES,
};
use crate::stack::trainer::optimized_in_32_bits;
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
    /// From a replay that leaves part of the run out (`unreplayed` says which).
    Partial { unreplayed: String },
    /// A choice of the user (a reserve), not a fact.
    Hypothesis,
}

impl TermStatus {
    pub fn name(&self) -> &'static str {
        match self {
            TermStatus::Exact => "exact",
            TermStatus::Replayed { .. } => "replayed",
            TermStatus::Measured { .. } => "measured",
            TermStatus::Partial { .. } => "partial",
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
    /// What it holds when the card is fullest (the allocator's blocks, rounded).
    pub at_peak: Bytes,
    #[serde(flatten)]
    pub status: TermStatus,
    pub split: Split,
    pub place: Place,
}

/// The terms of a budget, built one by one from a replay's figures at the card's fullest.
struct Terms<'a> {
    replayed: &'a Replayed,
    terms: Vec<Term>,
    /// What the replay leaves out of the run, if anything.
    unreplayed: Option<&'static str>,
}

impl Terms<'_> {
    /// What the blocks of `role` held when the card was fullest.
    fn held(&self, role: Role) -> u64 {
        self.replayed
            .tags_at_peak
            .get(role.index())
            .copied()
            .unwrap_or(0)
    }

    /// A term of the model's arithmetic (`bytes` exact), holding `role`'s blocks at the peak.
    fn exact(
        &mut self,
        key: &str,
        name: &str,
        formula: String,
        bytes: u64,
        role: Role,
        split: Split,
    ) {
        let at_peak = self.held(role);
        self.push(
            key,
            name,
            formula,
            (bytes, at_peak),
            TermStatus::Exact,
            split,
            Place::Allocator,
        );
    }

    /// A term the replay alone gives: `bytes` held at the peak.
    fn replayed(&mut self, key: &str, name: &str, formula: String, bytes: u64) {
        let status = match self.unreplayed {
            Some(what) => TermStatus::Partial {
                unreplayed: what.into(),
            },
            None => TermStatus::Replayed {
                bound: format!(
                    "the replays of the runs recorded on the H200 are within {:.2} % of their \
                     peak reserved",
                    MARGIN_PPM as f64 / 10_000.0
                ),
            },
        };
        self.push(
            key,
            name,
            formula,
            (bytes, bytes),
            status,
            Split::PerGpu,
            Place::Allocator,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        key: &str,
        name: &str,
        formula: String,
        (bytes, at_peak): (u64, u64),
        status: TermStatus,
        split: Split,
        place: Place,
    ) {
        self.terms.push(Term {
            key: key.into(),
            name: name.into(),
            formula,
            bytes: Bytes(bytes),
            at_peak: Bytes(at_peak),
            status,
            split,
            place,
        });
    }
}

/// Every term of `w`'s budget from the replay `r` of its run: the model's, then the replay's,
/// what lives outside the allocator and the reserve; `at_peak` sums to the card's fullest
/// (`r.peak_device`) and the reserve.
pub fn terms(w: &Workload, settings: &BudgetSettings, r: &Replayed) -> Vec<Term> {
    let mut t = Terms {
        replayed: r,
        terms: Vec::new(),
        unreplayed: (w.weights == WeightFormat::Prequantized).then_some(
            "the quantization's kernels (their products replayed as 16-bit ones, their own \
             temporaries and a repacking at load left out)",
        ),
    };
    let (bytes, formula) = weight_bytes(w);
    t.exact(
        "weights",
        "Weights",
        formula,
        bytes,
        Role::Weights,
        Split::Sharded,
    );
    trained_terms(w, &mut t);
    replayed_terms(w, settings, &mut t);
    let outside = &settings.outside;
    let status = TermStatus::Measured {
        on: outside.measured_on.clone(),
        source: outside.source.clone(),
    };
    let formula = format!(
        "outside the allocator when the card is fullest ({}), measured in a {} process: {} B \
         before the first forward pass, {} B after it, {} B after the first backward pass, {} B \
         while decoding",
        r.peak_stage,
        if w.mode.trains() {
            "training"
        } else {
            "generate"
        },
        grouped(outside.bytes.context),
        grouped(outside.bytes.forward),
        grouped(outside.bytes.backward),
        grouped(outside.bytes.decode),
    );
    let at_peak = r.outside_at_peak;
    let key = ("outside_allocator", "CUDA context and libraries");
    t.push(
        key.0,
        key.1,
        formula,
        (at_peak, at_peak),
        status,
        Split::PerGpu,
        Place::OutsideAllocator,
    );
    let reserve = settings.reserve_bytes;
    let formula = "chosen by the user (--reserve-gib)".into();
    let hypothesis = TermStatus::Hypothesis;
    t.push(
        "reserve",
        "Reserve",
        formula,
        (reserve, reserve),
        hypothesis,
        Split::PerGpu,
        Place::Reserve,
    );
    t.terms
}

/// The terms of what is trained (or, in inference, the KV cache).
fn trained_terms(w: &Workload, t: &mut Terms) {
    let e = w.dtype.bytes();
    // What requires a gradient, and what gets one (a vision tower's tensors do not).
    let (trainable, trained) = trained_parameters(w);
    let untrained = |what: &str| match trainable - trained {
        0 => String::new(),
        n => format!(
            " (not the vision tower's {} {what}: no gradient)",
            grouped(n)
        ),
    };
    match &w.mode {
        Mode::Inference { .. } => {
            let (bytes, formula) = kv_bytes(w);
            t.exact(
                "kv_cache",
                "KV cache",
                formula,
                bytes,
                Role::KvCache,
                Split::KvHeads,
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
            let adapters = formula(trainable, "4 B (float32)");
            t.exact(
                "lora_adapters",
                "LoRA adapters",
                adapters,
                trainable * 4,
                Role::Adapters,
                Split::Sharded,
            );
            let gradients = trained_formula("4 B (float32)");
            t.exact(
                "gradients",
                "Gradients",
                gradients,
                trained * 4,
                Role::Gradients,
                Split::Sharded,
            );
            let states = trained_formula("8 B (AdamW: two float32 moments)");
            t.exact(
                "optimizer_states",
                "Optimizer states",
                states,
                trained * 8,
                Role::OptimizerStates,
                Split::Sharded,
            );
        }
        Mode::Full { optimizer } => {
            let gradients = format!(
                "{} parameters × {e} B ({}){}",
                grouped(trained),
                w.dtype,
                untrained("parameters")
            );
            t.exact(
                "gradients",
                "Gradients",
                gradients,
                trained * e,
                Role::Gradients,
                Split::Sharded,
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
                Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit => {
                    let paged = *optimizer == Optimizer::PagedAdamw8bit;
                    let (allocated, unified) = paged_adamw_8bit_state_bytes(
                        text_parameters(w)
                            .iter()
                            .map(|t| (t.elements(), w.trainer && optimized_in_32_bits(t.role))),
                        paged,
                    );
                    (
                        format!(
                            "{} parameters × 2 × 1 B ({}: two 8-bit moments, a float32 scale per \
                             {BLOCK_8BIT} elements of each; float32 moments for a parameter under \
                             {} elements{}; two quantization maps of {QMAP_BYTES} B){}{}",
                            grouped(trained),
                            optimizer.name(),
                            grouped(MIN_8BIT_ELEMENTS),
                            if w.trainer {
                                " and for the embeddings' weight (the Trainer's optim_bits=32)"
                            } else {
                                ""
                            },
                            untrained("parameters"),
                            match paged {
                                true => format!(
                                    "; in the allocator: the scales, the maps and the moments of \
                                     parameters under {} elements; the other moments, {} B, paged \
                                     in CUDA unified memory outside it (on the GPU while it has \
                                     room, else in host memory: not counted in the card's need)",
                                    grouped(PAGED_ELEMENTS),
                                    grouped(unified)
                                ),
                                false => String::new(),
                            }
                        ),
                        allocated,
                    )
                }
                Optimizer::Adafactor => (
                    format!(
                        "{} parameters' second moments in float32 ({}: a row and a column of each \
                         matrix, a vector whole) and each parameter's RMS (4 B){}",
                        grouped(trained),
                        optimizer.name(),
                        untrained("parameters")
                    ),
                    text_parameters(w)
                        .iter()
                        .map(|t| {
                            let moments: u64 = match t.shape.split_last() {
                                Some((last, lead)) if !lead.is_empty() => {
                                    let rows: u64 = lead.iter().product();
                                    rows + lead[..lead.len() - 1].iter().product::<u64>() * last
                                }
                                _ => t.elements(),
                            };
                            4 * (moments + 1)
                        })
                        .sum(),
                ),
            };
            t.exact(
                "optimizer_states",
                "Optimizer states",
                formula,
                bytes,
                Role::OptimizerStates,
                Split::Sharded,
            );
        }
    }
}

/// The parameters that require a gradient, and those that get one (not a vision tower's).
pub fn trained_parameters(w: &Workload) -> (u64, u64) {
    match &w.mode {
        Mode::Inference { .. } => (0, 0),
        Mode::Full { .. } => (
            w.model.parameter_count(),
            text_parameters(w).iter().map(|p| p.elements()).sum(),
        ),
        Mode::Lora { rank, targets } => lora_parameters(w, *rank, targets),
    }
}

/// The terms the replay alone gives: activations and temporaries, workspaces, free blocks.
fn replayed_terms(w: &Workload, settings: &BudgetSettings, t: &mut Terms) {
    let r = t.replayed;
    // In training the forward also builds a cache (transformers' `use_cache`, on unless
    // checkpointing turns it off): a temporary of the step there, the KV cache term in inference.
    let training_cache = if w.mode.trains() {
        t.held(Role::KvCache)
    } else {
        0
    };
    let temporaries = t.held(Role::Activations)
        + t.held(Role::Inputs)
        + t.held(Role::OptimizerStep)
        + training_cache;
    let formula = format!(
        "what the run holds when the card is fullest ({}) besides the terms above: {}",
        r.peak_stage,
        if w.mode.trains() {
            "activations kept for backward, temporaries, the inputs, the cache the forward \
             builds (use_cache) and the optimizer step's"
        } else {
            "the inputs, the forward's temporaries and the logits"
        }
    );
    t.replayed(
        "activations",
        "Activations and temporaries",
        formula,
        temporaries,
    );
    let k = settings.kernels;
    let formula = format!(
        "{} B for cuBLAS per thread that multiplies{}",
        grouped(k.cublas_workspace),
        if k.cublaslt_workspace > 0 {
            format!(
                ", {} B for cuBLASLt with a bias",
                grouped(k.cublaslt_workspace)
            )
        } else {
            String::new()
        }
    );
    let workspaces = t.held(Role::Workspaces);
    t.replayed(
        "workspaces",
        "cuBLAS, cuBLASLt and kernel workspaces",
        formula,
        workspaces,
    );
    let cached = r.reserved_at_peak.saturating_sub(r.allocated_at_peak);
    let formula = format!(
        "blocks the caching allocator holds free when the card is fullest ({}): the cost of its \
         segments and splits under {}",
        r.peak_stage,
        match w.allocator {
            AllocatorSetting::Default => "the default settings",
            AllocatorSetting::ExpandableSegments => "expandable_segments:True",
        }
    );
    t.replayed("cached_free", "Reserved but unallocated", formula, cached);
}

/// The exact size of the weights (and buffers) as stored.
fn weight_bytes(w: &Workload) -> (u64, String) {
    let e = w.dtype.bytes();
    let buffers: u64 = w
        .model
        .buffers()
        .iter()
        .map(|b| b.elements() * b.buffer_dtype().bytes())
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
    if let (WeightFormat::Prequantized, Some(q)) = (w.weights, w.model.quantization) {
        let (mut stored, mut kept, mut layers) = (0, 0, 0);
        for p in w.model.parameters() {
            match crate::model::prequantized::stored_bytes(&p, q) {
                Some(b) => {
                    stored += b;
                    layers += 1;
                }
                None => kept += p.elements() * e,
            }
        }
        return (
            stored + kept + buffers,
            format!(
                "{layers} linear layers as the checkpoint stores them in {} ({}): {} B + the \
                 other parameters × {e} B ({}): {} B + {} B of float32 buffers",
                q.described(),
                crate::model::prequantized::layout(q),
                grouped(stored),
                w.dtype,
                grouped(kept),
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
pub fn text_parameters(w: &Workload) -> Vec<crate::model::Parameter> {
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
    let layer_bytes = |window: Option<u64>| {
        let kept = match window {
            Some(window) if tokens > window => window,
            _ => tokens,
        };
        w.batch * w.beams() * kept * per_token * e
    };
    let bytes: u64 = m.layers.iter().map(|l| layer_bytes(l.window)).sum();
    let sliding = m.layers.iter().filter(|l| l.window.is_some()).count();
    // Offloaded, the full layers wait on the CPU: the first comes back before the next forward.
    let full = (m.layers.len() - sliding) as u64;
    let (bytes, offloaded) =
        match w.offloaded_cache && full > 0 {
            false => (bytes, String::new()),
            true => (
                bytes - (full - 1) * layer_bytes(None),
                format!(
                "offloaded: {} B of {} full layers on the CPU, on the GPU the first brought back \
                 for the next forward{}; of ",
                grouped((full - 1) * layer_bytes(None)),
                full - 1,
                if sliding > 0 { " and the sliding layers" } else { "" }
            ),
            ),
        };
    let shape = format!(
        "{} layers × batch {}{} × {} tokens{} × {} per token × {e} B",
        m.layers.len(),
        w.batch,
        match w.beams() {
            1 => String::new(),
            n => format!(" × {n} beams"),
        },
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
    (bytes, format!("{offloaded}{shape}"))
}
