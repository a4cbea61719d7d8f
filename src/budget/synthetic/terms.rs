//! The budget: every term of a workload's GPU memory as a named formula with its bytes, its
//! status (exact arithmetic, a named estimate, a measured constant or a user's hypothesis), the
//! part of it present at the peak, and how it splits over several GPUs.

use super::activations::{self, Activations};
use super::constants::GpuConstants;
use super::workload::{Mode, Optimizer, WeightFormat, Workload};
use crate::allocator::Workspaces;
use crate::budget::shape::{LinearTarget, WeightTensor};
pub use crate::budget::terms::{Place, Split};
use crate::files::JsonError;
use crate::units::{grouped, Bytes};
use serde::{Deserialize, Serialize};

/// How sure a term is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum TermStatus {
    /// Arithmetic of the shape and of the storage format: no approximation.
    Exact,
    /// A formula derived from what the computation keeps; `source` names it, `bound` says how
    /// far it was found from a measurement.
    Estimated { source: String, bound: String },
    /// A constant recorded on a named GPU.
    Measured { on: String, source: String },
    /// A choice of the user (a reserve), not a fact.
    Hypothesis,
}

impl TermStatus {
    pub fn name(&self) -> &'static str {
        match self {
            TermStatus::Exact => "exact",
            TermStatus::Estimated { .. } => "estimated",
            TermStatus::Measured { .. } => "measured",
            TermStatus::Hypothesis => "hypothesis",
        }
    }
}

/// One line of the budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    pub key: String,
    pub name: String,
    /// The formula with the workload's numbers.
    pub formula: String,
    pub bytes: Bytes,
    /// The part of the term present at the peak (gradients and activations do not all coexist).
    pub at_peak: Bytes,
    #[serde(flatten)]
    pub status: TermStatus,
    pub split: Split,
    pub place: Place,
}

/// A moment of the step and what differs then from the terms' full sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moment {
    pub name: String,
    /// (term key, bytes held at this moment) for the terms not held whole.
    pub partial: Vec<(String, u64)>,
}

impl Moment {
    fn new(name: &str, partial: &[(&str, u64)]) -> Moment {
        Moment {
            name: name.into(),
            partial: partial.iter().map(|(k, b)| (k.to_string(), *b)).collect(),
        }
    }
    /// Bytes `term` holds at this moment.
    pub fn held(&self, term: &Term) -> u64 {
        self.partial
            .iter()
            .find(|(k, _)| *k == term.key)
            .map_or(term.bytes.0, |(_, b)| *b)
    }
}

/// The tag of a budget file.
pub const SCHEMA: &str = "iteragpu-lab/budget/1";

/// The budget of a workload on one GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Budget {
    pub schema: String,
    pub workload: Workload,
    pub parameters: u64,
    pub trainable_parameters: u64,
    pub terms: Vec<Term>,
    /// The moments that may be the peak; each term's `at_peak` is its share of the largest on
    /// one GPU. Spread over several GPUs another moment may be the largest (the fit planner
    /// takes the largest for each number of GPUs).
    pub moments: Vec<Moment>,
    /// The moment that is the peak on one GPU.
    pub peak_moment: String,
    /// What the peak is made of, in words.
    pub peak_rule: String,
    /// Σ at_peak of the allocator's terms: the predicted peak of `allocated`.
    pub peak_allocated: Bytes,
    /// The whole peak on one GPU: allocator, outside it and the reserve.
    pub total: Bytes,
    pub constants: GpuConstants,
}

/// The inputs of a budget besides the workload.
#[derive(Debug, Clone)]
pub struct BudgetSettings {
    pub constants: GpuConstants,
    /// cuBLAS/cuBLASLt workspaces of the GPU's architecture (`allocator::workspace`).
    pub workspaces: Workspaces,
    /// A reserve for fragmentation, chosen by the user.
    pub reserve_bytes: u64,
}

impl BudgetSettings {
    /// The H200's measured constants, PyTorch's default workspaces of the architecture `cc`, and
    /// a reserve of `reserve_bytes`.
    pub fn for_gpu(cc: crate::allocator::ComputeCapability, reserve_bytes: u64) -> BudgetSettings {
        BudgetSettings {
            constants: super::constants::h200(),
            workspaces: Workspaces::for_gpu(cc, &crate::allocator::WorkspaceSettings::default())
                .expect("the default settings are valid"),
            reserve_bytes,
        }
    }

    /// [`for_gpu`](Self::for_gpu) of the H200's architecture (9.0), no reserve.
    pub fn h200() -> BudgetSettings {
        BudgetSettings::for_gpu(crate::allocator::ComputeCapability::new(9, 0), 0)
    }
}

struct Builder {
    terms: Vec<Term>,
}

impl Builder {
    fn push(
        &mut self,
        key: &'static str,
        name: &'static str,
        formula: String,
        bytes: u64,
    ) -> &mut Term {
        self.terms.push(Term {
            key: key.into(),
            name: name.into(),
            formula,
            bytes: Bytes(bytes),
            at_peak: Bytes(bytes),
            status: TermStatus::Exact,
            split: Split::Sharded,
            place: Place::Allocator,
        });
        self.terms.last_mut().expect("just pushed")
    }
}

impl Term {
    fn status(&mut self, status: TermStatus) -> &mut Self {
        self.status = status;
        self
    }
    fn split(&mut self, split: Split) -> &mut Self {
        self.split = split;
        self
    }
    fn place(&mut self, place: Place) -> &mut Self {
        self.place = place;
        self
    }
}

/// Bytes of a weight tensor stored in `format` (quantization metadata apart), and its metadata.
fn stored(t: &WeightTensor, w: &Workload) -> (u64, u64) {
    let dense = t.elements * w.dtype.bytes();
    let (rows_out, cols_in) = t
        .linear
        .map_or((0, 0), |target| w.shape.linear_features(target));
    match (t.linear, w.weights) {
        (None, _) | (_, WeightFormat::Dense) => (dense, 0),
        (Some(_), WeightFormat::Int8) => (t.elements, rows_out * 4),
        (Some(_), WeightFormat::Int4 { group_size }) => {
            // qweight: 8 weights per int32; scales: float16 per (group, column); qzeros: 8 per
            // int32 per group; g_idx: one int32 per input row.
            let groups = cols_in / group_size;
            (
                t.elements / 2,
                groups * rows_out * 2 + groups * rows_out / 2 + cols_in * 4,
            )
        }
        (Some(_), WeightFormat::Nf4) => {
            // 64-weight blocks with an 8-bit absmax; one float32 per 256 blocks (double
            // quantization); rounded up per tensor.
            let blocks = t.elements.div_ceil(64);
            (t.elements.div_ceil(2), blocks + blocks.div_ceil(256) * 4)
        }
    }
}

/// LoRA parameters: for every layer (and expert) and target, rank × (in + out).
fn lora_parameters(
    w: &Workload,
    tensors: &[WeightTensor],
    rank: u64,
    targets: &[LinearTarget],
) -> u64 {
    tensors
        .iter()
        .filter_map(|t| t.linear.filter(|l| targets.contains(l)))
        .map(|l| {
            let (out, inp) = w.shape.linear_features(l);
            rank * (out + inp)
        })
        .sum()
}

fn estimated(source: &str, bound: &str) -> TermStatus {
    TermStatus::Estimated {
        source: source.into(),
        bound: bound.into(),
    }
}

/// Computes the budget of a validated workload.
pub fn budget(w: &Workload, settings: BudgetSettings) -> Budget {
    budget_and_activations(w, settings).0
}

/// [`budget`], with the activation estimate it was made from.
pub(crate) fn budget_and_activations(
    w: &Workload,
    settings: BudgetSettings,
) -> (Budget, Activations) {
    let tensors = w.shape.tensors();
    let parameters: u64 = tensors.iter().map(|t| t.elements).sum();
    let mut b = Builder { terms: Vec::new() };
    push_weights(&mut b, w, &tensors, parameters);
    let trainable = match &w.mode {
        Mode::Inference { .. } => 0,
        Mode::Full { .. } => parameters,
        Mode::Lora { rank, targets } => lora_parameters(w, &tensors, *rank, targets),
    };
    let acts = activations::estimate(w, &tensors);
    let moments = push_mode(&mut b, w, &tensors, trainable, &acts);
    push_per_gpu(&mut b, w, &settings);
    let mut terms = b.terms;
    let on_one_gpu = |m: &Moment| -> u64 {
        terms
            .iter()
            .filter(|t| t.place == Place::Allocator)
            .map(|t| m.held(t))
            .sum()
    };
    let peak = moments
        .iter()
        .max_by_key(|m| on_one_gpu(m))
        .expect("at least one moment")
        .clone();
    let peak_allocated = on_one_gpu(&peak);
    for t in &mut terms {
        t.at_peak = Bytes(peak.held(t));
    }
    let total = terms.iter().map(|t| t.at_peak.0).sum();
    let budget = Budget {
        schema: SCHEMA.into(),
        workload: w.clone(),
        parameters,
        trainable_parameters: trainable,
        peak_rule: acts.peak_rule.clone(),
        terms,
        moments,
        peak_moment: peak.name,
        peak_allocated: Bytes(peak_allocated),
        total: Bytes(total),
        constants: settings.constants,
    };
    (budget, acts)
}

/// Weights and their quantization metadata.
fn push_weights(b: &mut Builder, w: &Workload, tensors: &[WeightTensor], parameters: u64) {
    let e = w.dtype.bytes();
    let (weight_bytes, metadata_bytes) = tensors
        .iter()
        .map(|t| stored(t, w))
        .fold((0, 0), |(a, m), (x, y)| (a + x, m + y));
    let weights_formula = match w.weights {
        WeightFormat::Dense => format!("{} parameters × {e} B ({})", grouped(parameters), w.dtype),
        f => format!(
            "layers' linear matrices in {}, embeddings, LM head, norms and biases in {} ({e} B)",
            f.name(),
            w.dtype
        ),
    };
    b.push("weights", "Weights", weights_formula, weight_bytes);
    if metadata_bytes > 0 {
        let formula = match w.weights {
            WeightFormat::Int8 => "one float32 scale per output row of each linear matrix".into(),
            WeightFormat::Int4 { group_size } => format!(
                "per group of {group_size} input rows and output column: float16 scale + 4-bit \
                 zero point; one int32 group index per input row"
            ),
            WeightFormat::Nf4 => {
                "one 8-bit absmax per 64 weights + one float32 per 256 blocks".into()
            }
            WeightFormat::Dense => unreachable!("dense weights carry no metadata"),
        };
        b.push(
            "quantization_metadata",
            "Quantization metadata",
            formula,
            metadata_bytes,
        );
    }
}

/// The terms of the mode (KV cache; adapters, gradients, optimizer states; activations) and the
/// moments that may be the peak.
fn push_mode(
    b: &mut Builder,
    w: &Workload,
    tensors: &[WeightTensor],
    trainable: u64,
    acts: &Activations,
) -> Vec<Moment> {
    let s = &w.shape;
    let e = w.dtype.bytes();
    // Full training trains every parameter.
    let parameters = trainable;
    let mut moments = vec![Moment::new("prefill", &[])];
    match &w.mode {
        Mode::Inference { kv_cache, .. } => {
            let kv = 2 * s.layers * w.batch * w.tokens() * s.kv_dim() * kv_cache.bytes();
            b.push(
                "kv_cache",
                "KV cache",
                format!(
                    "2 (K, V) × {} layers × batch {} × {} tokens × {} KV heads × {} head dim × {} B ({})",
                    s.layers,
                    w.batch,
                    w.tokens(),
                    s.kv_heads,
                    s.head_dim,
                    kv_cache.bytes(),
                    kv_cache.name()
                ),
                kv,
            )
            .split(Split::KvHeads);
            push_activations(b, acts);
        }
        Mode::Lora { rank, targets } => {
            let names: Vec<&str> = targets.iter().map(|t| t.module()).collect();
            let formula = |what: &str, per: u64| {
                format!(
                    "{} adapter parameters (rank {rank} × (in + out) on {} of every \
                     layer) × {per} B {what}",
                    grouped(trainable),
                    names.join(", ")
                )
            };
            b.push(
                "lora_adapters",
                "LoRA adapters",
                formula("(float32)", 4),
                trainable * 4,
            );
            b.push(
                "gradients",
                "Gradients",
                formula("(float32 adapter gradients)", 4),
                trainable * 4,
            );
            b.push(
                "optimizer_states",
                "Optimizer states",
                formula("(AdamW: two float32 moments)", 8),
                trainable * 8,
            );
            push_activations(b, acts);
            moments = vec![
                Moment::new("loss backward", &[("gradients", 0)]),
                Moment::new("end of backward", &[("activations", 0), ("logits", 0)]),
            ];
            moments.extend(recompute_moments(acts));
        }
        Mode::Full { optimizer } => {
            let grads = parameters * e;
            // The peak is at the loss's backward (every kept activation and the loss's
            // gradients) or at the optimizer step, when every gradient exists.
            b.push(
                "gradients",
                "Gradients",
                format!("{} parameters × {e} B ({})", grouped(parameters), w.dtype),
                grads,
            );
            if *optimizer == Optimizer::AdamwMixed && e < 4 {
                b.push(
                    "master_weights",
                    "Master weights",
                    format!("{} parameters × 4 B (float32 copy)", grouped(parameters)),
                    parameters * 4,
                );
            }
            let (per, what) = match optimizer {
                Optimizer::AdamwMixed => (8, "two float32 moments".to_string()),
                Optimizer::Adamw => (2 * e, format!("two moments in {}", w.dtype)),
                Optimizer::SgdMomentum => (e, format!("one momentum buffer in {}", w.dtype)),
                Optimizer::Adamw8bit => (2, "two 8-bit moments".to_string()),
            };
            b.push(
                "optimizer_states",
                "Optimizer states",
                format!("{} parameters × {per} B ({what})", grouped(parameters)),
                parameters * per,
            );
            if *optimizer == Optimizer::Adamw8bit {
                let blocks: u64 = tensors.iter().map(|t| t.elements.div_ceil(256)).sum();
                b.push(
                    "optimizer_metadata",
                    "Optimizer quantization metadata",
                    format!("2 moments × {blocks} blocks of 256 × 4 B (float32 absmax)"),
                    2 * blocks * 4,
                )
                .status(estimated(
                    "bitsandbytes 8-bit blockwise optimizers (block 256)",
                    "tensors under 4096 elements keep 32-bit states in bitsandbytes: not counted",
                ));
            }
            push_activations(b, acts);
            moments = vec![
                Moment::new("loss backward", &[("gradients", 0)]),
                Moment::new(
                    "optimizer step",
                    &[("activations", acts.step_bytes), ("logits", 0)],
                ),
            ];
            moments.extend(recompute_moments(acts));
        }
    }

    moments
}

/// The terms each GPU holds whole: cuBLAS workspaces, the CUDA context, the reserve.
fn push_per_gpu(b: &mut Builder, w: &Workload, settings: &BudgetSettings) {
    // cuBLAS workspaces: one per handle, and a handle per thread; training runs backward on
    // autograd's own thread. cuBLASLt's own workspace comes only with a bias (addmm's cuBLASLt
    // path).
    let ws = settings.workspaces;
    let lt = match ws.cublaslt_bytes {
        Some(lt) if w.shape.attention_bias && ws.addmm_cublaslt => lt,
        _ => 0,
    };
    let threads = if w.mode.trains() { 2 } else { 1 };
    b.push(
        "cublas_workspace",
        "cuBLAS workspaces",
        format!(
            "{threads} thread(s) × {} cuBLAS{} (PyTorch 2.11 defaults for the architecture; \
             training runs backward on autograd's thread, with a handle of its own)",
            grouped(ws.cublas_bytes),
            if lt > 0 {
                format!(
                    " + {} cuBLASLt for the biases' forward products",
                    grouped(lt)
                )
            } else {
                String::new()
            }
        ),
        threads * ws.cublas_bytes + lt,
    )
    .status(TermStatus::Measured {
        on: "NVIDIA H200 (compute capability 9.0)".into(),
        source: "docs/allocator-model.md".into(),
    })
    .split(Split::PerGpu);
    let c = settings.constants.clone();
    b.push(
        "cuda_context",
        "CUDA context and libraries",
        format!(
            "{} B context + {} B cuBLAS handle, outside the allocator ({})",
            grouped(c.cuda_context_bytes),
            grouped(c.libraries_bytes),
            c.software
        ),
        c.cuda_context_bytes + c.libraries_bytes,
    )
    .status(TermStatus::Measured {
        on: c.recorded_on.clone(),
        source: c.source.clone(),
    })
    .split(Split::PerGpu)
    .place(Place::OutsideAllocator);
    b.push(
        "reserve",
        "Fragmentation reserve",
        "chosen by the user (--reserve-gib); cached but unused blocks of the allocator".into(),
        settings.reserve_bytes,
    )
    .status(TermStatus::Hypothesis)
    .split(Split::PerGpu)
    .place(Place::Reserve);
}

/// The moments inside a recomputed layer's backward (with checkpointing).
fn recompute_moments(a: &Activations) -> Vec<Moment> {
    a.recompute
        .iter()
        .map(|(name, activations, gradients)| {
            Moment::new(
                name,
                &[
                    ("activations", *activations),
                    ("logits", 0),
                    ("gradients", *gradients),
                ],
            )
        })
        .collect()
}

fn push_activations(b: &mut Builder, a: &Activations) {
    b.push("activations", "Activations", a.formula.clone(), a.bytes)
        .status(estimated(activations::SOURCE, activations::BOUND))
        .split(Split::PerGpu);
    if a.logits_bytes > 0 {
        b.push(
            "logits",
            "Logits and loss",
            a.logits_formula.clone(),
            a.logits_bytes,
        )
        .status(estimated(activations::SOURCE, activations::BOUND))
        .split(Split::PerGpu);
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
    /// Reads a budget written by `mesure_memoire budget --output`.
    pub fn load(path: &std::path::Path) -> Result<Budget, JsonError> {
        let bytes = crate::files::read_capped(path, crate::files::Input::Budget)?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// Parses budget bytes and checks what the planner relies on.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Budget, JsonError> {
        let invalid =
            |message: String| JsonError::invalid(file, crate::files::Input::Budget, message);
        let b: Budget = crate::files::parse_tagged(bytes, file)?;
        b.workload
            .clone()
            .validated()
            .map_err(|e| invalid(format!("workload: {e}")))?;
        if let Some(t) = b.terms.iter().find(|t| t.at_peak > t.bytes) {
            return Err(invalid(format!("term {}: at_peak exceeds bytes", t.key)));
        }
        if b.moments.is_empty() {
            return Err(invalid("no moment: the planner needs at least one".into()));
        }
        Ok(b)
    }
}
