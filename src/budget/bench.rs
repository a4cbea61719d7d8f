//! The transformer bench: a synthetic decoder-only transformer of a given [`ModelShape`] run on
//! the GPU stage by stage (weights, KV cache, prefill, decode; or training iterations), each stage
//! read from the CUDA caching allocator. This module holds the run, its validation, the report and
//! the trait a GPU backend implements; the libtorch side is in crate `iteragpu-torch`.

use super::shape::{AttentionKind, LinearTarget, ModelShape, ShapeError};
use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
use crate::measure::{Dtype, MeasureError};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies the JSON layout of a [`BenchReport`].
pub const SCHEMA: &str = "iteragpu-lab/transformer-bench/v1";

/// The largest element or byte count a run may imply (tensor sizes are signed 64-bit in libtorch).
const LIMIT: u64 = 1 << 62;

/// The stages' names, as reports and tests write them.
pub mod stage {
    /// Every weight tensor created on the GPU, one allocation each, in `ModelShape::tensors()` order.
    pub const WEIGHTS: &str = "weights";
    /// K and V of every layer, preallocated for `context + generated` positions.
    pub const KV_CACHE: &str = "kv_cache";
    /// The prompt's forward pass, writing the cache; logits of the last position only.
    pub const PREFILL: &str = "prefill";
    /// `generated` steps of one token each over the cache.
    pub const DECODE: &str = "decode";
    /// The LoRA adapters (A and B of each targeted linear layer, float32).
    pub const ADAPTERS: &str = "adapters";
    /// AdamW's states, created before the first step: fp32 master copies (16-bit weights only),
    /// `exp_avg` and `exp_avg_sq`.
    pub const OPTIMIZER_STATES: &str = "optimizer_states";
    /// One whole iteration: forward, backward, optimizer step.
    pub const FIRST_STEP: &str = "first_step";
    /// The second iteration's forward pass, up to the loss.
    pub const FORWARD: &str = "forward";
    /// The second iteration's `loss.backward()`.
    pub const BACKWARD: &str = "backward";
    /// The second iteration's optimizer step, gradients freed at its end.
    pub const OPTIMIZER_STEP: &str = "optimizer_step";
}

/// What the bench runs.
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
#[serde(rename_all = "snake_case")]
#[strum(
    serialize_all = "snake_case",
    parse_err_fn = unknown_mode,
    parse_err_ty = String
)]
pub enum BenchMode {
    /// Prefill then decode with a preallocated KV cache, no autograd.
    Inference,
    /// Every weight trained with mixed-precision AdamW.
    Full,
    /// Frozen weights, float32 LoRA adapters trained with AdamW.
    Lora,
}

impl BenchMode {
    pub const ALL: &'static [BenchMode] = <BenchMode as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Whether the mode trains (runs forward, backward and optimizer steps).
    pub fn trains(self) -> bool {
        self != BenchMode::Inference
    }

    /// The stages this mode records, in order.
    pub fn stages(self) -> &'static [&'static str] {
        use stage::*;
        match self {
            BenchMode::Inference => &[WEIGHTS, KV_CACHE, PREFILL, DECODE],
            BenchMode::Full => &[
                WEIGHTS,
                OPTIMIZER_STATES,
                FIRST_STEP,
                FORWARD,
                BACKWARD,
                OPTIMIZER_STEP,
            ],
            BenchMode::Lora => &[
                WEIGHTS,
                ADAPTERS,
                OPTIMIZER_STATES,
                FIRST_STEP,
                FORWARD,
                BACKWARD,
                OPTIMIZER_STEP,
            ],
        }
    }
}

fn unknown_mode(s: &str) -> String {
    format!("unknown mode `{s}`; expected inference, full or lora")
}

/// One bench run. Build it field by field and call [`BenchRun::validated`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchRun {
    /// A dense model with full attention (`experts` 1, `attention` full).
    pub shape: ModelShape,
    /// Element type of the weights and activations (LoRA adapters and optimizer states are float32).
    pub dtype: Dtype,
    pub mode: BenchMode,
    pub batch: u64,
    /// Prompt length for inference; sequence length for training.
    pub context: u64,
    /// Tokens decoded after the prompt (inference only; 0 otherwise).
    pub generated: u64,
    /// Rank of the LoRA adapters (mode lora only; 0 otherwise).
    pub lora_rank: u64,
    /// The linear layers that get an adapter (mode lora only; empty otherwise).
    pub lora_targets: Vec<LinearTarget>,
    /// Full-layer recomputation: only each layer's input is kept by the forward pass (training only).
    pub checkpointing: bool,
    /// Attention through `scaled_dot_product_attention` (fused kernels) instead of the explicit
    /// `softmax(q kᵀ) v` with its `[batch, heads, seq, seq]` scores.
    pub flash_attention: bool,
    pub device: CudaDevice,
    /// Record the allocator's block map at the end of each stage.
    #[serde(default)]
    pub blocks: bool,
}

/// Why a run is refused; each names the field at fault where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("{field}: {why}")]
    Unsupported { field: &'static str, why: String },
    #[error("{field} applies to {applies} only, not to mode {mode}")]
    NotInMode {
        field: &'static str,
        applies: &'static str,
        mode: BenchMode,
    },
    #[error("lora_targets names {0} twice")]
    DuplicateTarget(&'static str),
    #[error(
        "the run is too large: {what} would exceed 2^62 elements or bytes; reduce batch, context, \
         generated or the shape"
    )]
    TooLarge { what: &'static str },
}

impl BenchError {
    /// The field at fault, as [`BenchRun`] and [`ModelShape`] name it.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            BenchError::Shape(ShapeError::Zero { field }) => Some(field),
            BenchError::Shape(ShapeError::Grouping { .. }) => Some("kv_heads"),
            BenchError::Shape(ShapeError::Routing { .. }) => Some("experts_per_token"),
            BenchError::Shape(ShapeError::Range { field, .. }) => Some(field),
            BenchError::Shape(ShapeError::Overflow) | BenchError::TooLarge { .. } => None,
            BenchError::Zero { field }
            | BenchError::Unsupported { field, .. }
            | BenchError::NotInMode { field, .. } => Some(field),
            BenchError::DuplicateTarget(_) => Some("lora_targets"),
        }
    }
}

impl crate::status::Classify for BenchError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// `a × b × …`, refused beyond [`LIMIT`].
fn product(what: &'static str, factors: &[u64]) -> Result<u64, BenchError> {
    factors
        .iter()
        .try_fold(1u64, |acc, f| acc.checked_mul(*f))
        .filter(|v| *v <= LIMIT)
        .ok_or(BenchError::TooLarge { what })
}

impl BenchRun {
    /// Checks every field: sizes at least 1, a dense full-attention shape, each setting in the mode
    /// it applies to, and every tensor the run makes countable in 64 bits.
    pub fn validated(self) -> Result<BenchRun, BenchError> {
        let shape = self.shape.clone().validated()?;
        if shape.experts != 1 {
            return Err(BenchError::Unsupported {
                field: "experts",
                why: format!(
                    "the bench builds dense models only (experts = 1), got {}",
                    shape.experts
                ),
            });
        }
        if shape.attention != AttentionKind::Full {
            return Err(BenchError::Unsupported {
                field: "attention",
                why: format!(
                    "the bench builds full attention only, got {}",
                    shape.attention.name()
                ),
            });
        }
        for (field, v) in [("batch", self.batch), ("context", self.context)] {
            if v == 0 {
                return Err(BenchError::Zero { field });
            }
        }
        let not_in = |field, applies| BenchError::NotInMode {
            field,
            applies,
            mode: self.mode,
        };
        if self.mode.trains() && self.generated > 0 {
            return Err(not_in("generated", "mode inference"));
        }
        if !self.mode.trains() && self.checkpointing {
            return Err(not_in("checkpointing", "modes full and lora"));
        }
        if self.mode == BenchMode::Lora {
            if self.lora_rank == 0 {
                return Err(BenchError::Zero { field: "lora_rank" });
            }
            if self.lora_targets.is_empty() {
                return Err(BenchError::Zero {
                    field: "lora_targets",
                });
            }
            let mut seen = Vec::new();
            for t in &self.lora_targets {
                if seen.contains(t) {
                    return Err(BenchError::DuplicateTarget(t.module()));
                }
                seen.push(*t);
            }
        } else if self.lora_rank != 0 {
            return Err(not_in("lora_rank", "mode lora"));
        } else if !self.lora_targets.is_empty() {
            return Err(not_in("lora_targets", "mode lora"));
        }
        self.check_sizes(&shape)?;
        Ok(BenchRun { shape, ..self })
    }

    /// Every tensor the run makes, at its widest, fits in 2^62 elements and bytes (float32: 4 bytes).
    fn check_sizes(&self, s: &ModelShape) -> Result<(), BenchError> {
        use crate::budget::workload::{MAX_GENERATED, MAX_TOKENS};
        for (field, value, max) in [
            ("batch", self.batch, MAX_TOKENS),
            ("context", self.context, MAX_TOKENS),
            ("generated", self.generated, MAX_GENERATED),
            ("lora_rank", self.lora_rank, crate::model::config::MAX_SIZE),
        ] {
            if value > max {
                return Err(BenchError::Shape(ShapeError::Range { field, value, max }));
            }
        }
        let positions = self.positions().ok_or(BenchError::TooLarge {
            what: "context + generated",
        })?;
        let (b, widest) = (self.batch, s.hidden.max(s.q_dim()).max(s.intermediate));
        product("the token ids", &[b, positions, 8])?;
        product("an activation", &[b, positions, widest, 4])?;
        product(
            "a layer's KV cache",
            &[b, s.kv_heads, positions, s.head_dim, 4],
        )?;
        product("the logits", &[b, positions, s.vocab, 4])?;
        if !self.flash_attention {
            product(
                "the attention scores",
                &[b, s.heads, positions, positions, 4],
            )?;
        }
        product("a LoRA adapter", &[self.lora_rank, widest, 4])?;
        Ok(())
    }

    /// Positions held by the KV cache: the prompt and the generated tokens.
    pub fn positions(&self) -> Option<u64> {
        self.context.checked_add(self.generated)
    }

    /// The LoRA targets in module order (`q, k, v, o, gate, up, down`), as adapters are built.
    pub fn ordered_targets(&self) -> Vec<LinearTarget> {
        LinearTarget::ALL
            .into_iter()
            .filter(|t| self.lora_targets.contains(t))
            .collect()
    }

    /// One line saying what is run, for messages.
    pub fn summary(&self) -> String {
        let s = &self.shape;
        let mut line = format!(
            "{} {}, {} layers, hidden {}, heads {}/{} (kv), head_dim {}, intermediate {}, vocab {}{}, \
             batch {}, context {}",
            self.mode,
            self.dtype,
            s.layers,
            s.hidden,
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.intermediate,
            s.vocab,
            if s.tied_embeddings { " (tied)" } else { "" },
            self.batch,
            self.context
        );
        if self.mode == BenchMode::Inference {
            line += &format!(", generated {}", self.generated);
        }
        if self.mode == BenchMode::Lora {
            let targets: Vec<_> = self.ordered_targets().iter().map(|t| t.module()).collect();
            line += &format!(", LoRA rank {} on {}", self.lora_rank, targets.join(","));
        }
        if self.checkpointing {
            line += ", checkpointing";
        }
        line += if self.flash_attention {
            ", flash attention"
        } else {
            ", explicit attention"
        };
        line + &format!(" on {}", self.device)
    }
}

/// The bench's names of layer `layer`'s KV cache tensors, K then V. The bench names its blocks
/// with these and the allocator model's replay names its own with them: `budget --against`
/// compares the two maps block by block, names included.
pub fn kv_cache_names(layer: u64) -> [String; 2] {
    ["k", "v"].map(|x| format!("layers.{layer}.{x}_cache"))
}

/// The bench's names of the LoRA adapter on layer `layer`'s `target`, A then B (see
/// [`kv_cache_names`]).
pub fn adapter_names(layer: u64, target: LinearTarget) -> [String; 2] {
    ["lora_A", "lora_B"].map(|part| format!("layers.{layer}.{}.{part}", target.module()))
}

/// The bench's names of AdamW's states of the parameter `parameter`, in the order they are made:
/// its float32 master copy (with `master`), `exp_avg`, `exp_avg_sq` (see [`kv_cache_names`]).
pub fn optimizer_state_names(parameter: &str, master: bool) -> Vec<String> {
    let kinds: &[&str] = if master {
        &["master", "exp_avg", "exp_avg_sq"]
    } else {
        &["exp_avg", "exp_avg_sq"]
    };
    kinds.iter().map(|k| format!("{parameter}.{k}")).collect()
}

/// The allocator's figures for one stage. Peaks are reset at the stage's start, so they are the
/// stage's own; `allocated` is part of `reserved` (never add them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageReading {
    pub stage: String,
    pub allocated_before: u64,
    pub allocated_after: u64,
    pub reserved_after: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Host wall time of the stage, synchronisation included.
    pub host_ms: f64,
    /// The allocator's block map at the end of a stage that only makes named tensors (weights,
    /// KV cache, adapters, optimizer states; with `--blocks`), each block named after its tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<crate::allocator::SegmentView>>,
}

impl StageReading {
    /// `allocated_after − allocated_before` (negative when the stage freed more than it kept).
    pub fn allocated_delta(&self) -> i128 {
        i128::from(self.allocated_after) - i128::from(self.allocated_before)
    }
}

/// What every bench report says about its own scope.
pub const NOTES: [&str; 4] = [
    "Counters cover only the PyTorch caching allocator of this process on the measured GPU: not \
     the CUDA context, the driver, other processes or other GPUs.",
    "Peaks are reset at each stage's start: peak_allocated and peak_reserved are the stage's own \
     maxima. allocated is part of reserved: never add them.",
    "Weights and token ids are random, created directly on the GPU; rotary position embedding is \
     left out (it adds only small temporaries).",
    "Full training keeps fp32 master copies only for 16-bit weights; float32 weights are their \
     own master, as in torch.optim.AdamW.",
];

/// The result of a bench run, as written to its JSON file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    pub schema: String,
    /// UTC time the run finished, RFC 3339.
    pub measured_at: String,
    pub run: BenchRun,
    /// Parameters of the model (adapters not included).
    pub parameters: u64,
    /// libtorch, CUDA and the GPU (name, total memory, compute capability).
    pub environment: EnvironmentReport,
    pub stages: Vec<StageReading>,
    pub notes: Vec<String>,
}

impl BenchReport {
    /// The report of a validated `run`, dated now.
    pub fn new(run: BenchRun, environment: EnvironmentReport, stages: Vec<StageReading>) -> Self {
        BenchReport {
            schema: SCHEMA.into(),
            measured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string(),
            parameters: run.shape.parameters(),
            run,
            environment,
            stages,
            notes: NOTES.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Reads a report written by `mesure_memoire transformer`, checking its schema and its run.
    pub fn load(path: &std::path::Path) -> Result<BenchReport, crate::files::JsonError> {
        let r: BenchReport = crate::files::load_tagged(path)?;
        r.checked(&path.display().to_string())
    }

    /// [`load`](Self::load) of a report's bytes, `file` naming it in errors.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<BenchReport, crate::files::JsonError> {
        let r: BenchReport = crate::files::parse_tagged(bytes, file)?;
        r.checked(file)
    }

    fn checked(self, file: &str) -> Result<BenchReport, crate::files::JsonError> {
        self.run.clone().validated().map_err(|e| {
            crate::files::JsonError::invalid(file, crate::files::Input::BenchReport, e.to_string())
        })?;
        Ok(self)
    }

    /// The stage named `name`.
    pub fn stage(&self, name: &str) -> Option<&StageReading> {
        self.stages.iter().find(|s| s.stage == name)
    }
}

/// The stage table's columns.
const COLUMNS: [&str; 6] = [
    "stage",
    "allocated before",
    "allocated after",
    "peak allocated",
    "peak reserved",
    "host ms",
];

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gpu = self.environment.gpu_name();
        writeln!(f, "Transformer bench on {gpu}, {}", self.measured_at)?;
        writeln!(
            f,
            "  {}; {} parameters",
            self.run.summary(),
            self.parameters
        )?;
        let rows = self
            .stages
            .iter()
            .map(|s| {
                let mut row = vec![s.stage.clone()];
                row.extend(
                    [
                        s.allocated_before,
                        s.allocated_after,
                        s.peak_allocated,
                        s.peak_reserved,
                    ]
                    .map(|b| Bytes(b).grouped()),
                );
                row.push(format!("{:.1}", s.host_ms));
                row
            })
            .collect();
        let table =
            crate::markup::Table::new(&COLUMNS, rows).with_min_widths(&[16, 19, 19, 19, 19, 10]);
        write!(f, "{table}")
    }
}

/// Why a bench run gave no report: refused before any GPU work, or failed on the GPU.
#[derive(Debug, thiserror::Error)]
pub enum BenchFailure {
    #[error(transparent)]
    Refused(#[from] BenchError),
    #[error(transparent)]
    Gpu(#[from] MeasureError),
}

impl crate::status::Classify for BenchFailure {
    fn status(&self) -> crate::status::Status {
        match self {
            BenchFailure::Refused(e) => e.status(),
            BenchFailure::Gpu(e) => e.status(),
        }
    }
}

impl crate::files::Tagged for BenchReport {
    const SCHEMA: &'static str = SCHEMA;
    const KIND: crate::files::Input = crate::files::Input::BenchReport;
    fn schema(&self) -> &str {
        &self.schema
    }
}

/// A way to run the bench on a GPU: the libtorch backend implements it (reached through
/// [`crate::gpu::Gpu::transformer`]). This crate never links libtorch.
pub trait TransformerBench {
    /// Runs `run` stage by stage and returns the report (not yet written). A run that does not
    /// validate is refused; without a usable GPU: [`MeasureError::NoGpu`] or
    /// [`MeasureError::DeviceMissing`]; a failure inside a stage (out of memory included) comes
    /// as [`MeasureError::InStage`] naming the stage.
    fn run(&self, run: &BenchRun) -> Result<BenchReport, BenchFailure>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_shape() -> ModelShape {
        ModelShape {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 128,
            vocab: 256,
            tied_embeddings: false,
            attention_bias: false,
            experts: 1,
            experts_per_token: 1,
            attention: AttentionKind::Full,
        }
    }

    fn inference() -> BenchRun {
        BenchRun {
            shape: tiny_shape(),
            dtype: Dtype::Bfloat16,
            mode: BenchMode::Inference,
            batch: 2,
            context: 16,
            generated: 4,
            lora_rank: 0,
            lora_targets: vec![],
            checkpointing: false,
            flash_attention: true,
            device: CudaDevice { index: 0 },
            blocks: false,
        }
    }

    fn lora() -> BenchRun {
        BenchRun {
            mode: BenchMode::Lora,
            generated: 0,
            lora_rank: 8,
            lora_targets: vec![LinearTarget::V, LinearTarget::Q],
            checkpointing: true,
            ..inference()
        }
    }

    fn field_of(run: BenchRun) -> Option<&'static str> {
        run.validated().unwrap_err().field()
    }

    #[test]
    fn valid_runs_pass_and_targets_come_in_module_order() {
        assert_eq!(inference().validated().unwrap(), inference());
        let l = lora().validated().unwrap();
        assert_eq!(l.ordered_targets(), [LinearTarget::Q, LinearTarget::V]);
        assert_eq!(l.positions(), Some(16));
    }

    #[test]
    fn zero_sizes_are_refused_naming_the_field() {
        let zero_batch = BenchRun {
            batch: 0,
            ..inference()
        };
        assert_eq!(
            zero_batch.clone().validated().unwrap_err().to_string(),
            "batch must be at least 1"
        );
        assert_eq!(field_of(zero_batch), Some("batch"));
        assert_eq!(
            field_of(BenchRun {
                context: 0,
                ..inference()
            }),
            Some("context")
        );
        let mut no_layers = inference();
        no_layers.shape.layers = 0;
        assert_eq!(field_of(no_layers), Some("layers"));
        assert_eq!(
            field_of(BenchRun {
                lora_rank: 0,
                ..lora()
            }),
            Some("lora_rank")
        );
        assert_eq!(
            field_of(BenchRun {
                lora_targets: vec![],
                ..lora()
            }),
            Some("lora_targets")
        );
    }

    #[test]
    fn unsupported_shapes_are_refused() {
        let mut grouping = inference();
        grouping.shape.kv_heads = 3;
        assert_eq!(field_of(grouping), Some("kv_heads"));
        let mut moe = inference();
        moe.shape.experts = 8;
        moe.shape.experts_per_token = 2;
        let e = moe.validated().unwrap_err();
        assert_eq!(e.field(), Some("experts"));
        assert!(e.to_string().contains("dense models only"), "{e}");
        let mut sliding = inference();
        sliding.shape.attention = AttentionKind::SlidingWindow;
        assert_eq!(field_of(sliding), Some("attention"));
    }

    #[test]
    fn settings_outside_their_mode_are_refused() {
        let generated_in_training = BenchRun {
            generated: 1,
            ..lora()
        };
        assert_eq!(
            generated_in_training.validated().unwrap_err().to_string(),
            "generated applies to mode inference only, not to mode lora"
        );
        assert_eq!(
            field_of(BenchRun {
                checkpointing: true,
                ..inference()
            }),
            Some("checkpointing")
        );
        assert_eq!(
            field_of(BenchRun {
                lora_rank: 16,
                ..inference()
            }),
            Some("lora_rank")
        );
        assert_eq!(
            field_of(BenchRun {
                lora_targets: vec![LinearTarget::Q],
                ..inference()
            }),
            Some("lora_targets")
        );
        let twice = BenchRun {
            lora_targets: vec![LinearTarget::Q, LinearTarget::Q],
            ..lora()
        };
        assert_eq!(
            twice.validated().unwrap_err(),
            BenchError::DuplicateTarget("q_proj")
        );
    }

    #[test]
    fn runs_too_large_to_count_are_refused() {
        // Each size is bounded first, naming it...
        let huge = BenchRun {
            batch: 1 << 40,
            context: 1 << 20,
            ..inference()
        };
        assert!(matches!(
            huge.validated(),
            Err(BenchError::Shape(ShapeError::Range { field: "batch", .. }))
        ));
        let long = BenchRun {
            context: u64::MAX,
            generated: 1,
            ..inference()
        };
        assert!(matches!(
            long.validated(),
            Err(BenchError::Shape(ShapeError::Range {
                field: "context",
                ..
            }))
        ));
        // ...then the tensors the sizes make together.
        let logits = BenchRun {
            batch: 1 << 24,
            context: 1 << 24,
            shape: ModelShape {
                vocab: 1 << 20,
                ..inference().shape
            },
            ..inference()
        };
        assert_eq!(
            logits.validated().unwrap_err(),
            BenchError::TooLarge { what: "the logits" }
        );
        // The explicit attention's scores are the widest tensor: refused only without flash.
        let scores = BenchRun {
            batch: 1 << 12,
            context: 1 << 24,
            generated: 0,
            ..inference()
        };
        assert!(scores.clone().validated().is_ok());
        assert_eq!(
            BenchRun {
                flash_attention: false,
                ..scores
            }
            .validated()
            .unwrap_err(),
            BenchError::TooLarge {
                what: "the attention scores"
            }
        );
    }

    #[test]
    fn linear_features_hold_each_matrix_of_the_shape() {
        let shape = ModelShape {
            attention_bias: true,
            ..tiny_shape()
        };
        let mut matrices = 0;
        for t in shape.tensors() {
            if let Some(target) = t.linear {
                let (out, inp) = shape.linear_features(target);
                assert_eq!(out * inp, t.elements, "{}", t.name);
                matrices += 1;
            }
        }
        assert_eq!(matrices, 7 * shape.layers);
    }

    #[test]
    fn modes_parse_and_list_their_stages() {
        for m in BenchMode::ALL {
            assert_eq!(m.name().parse::<BenchMode>(), Ok(*m));
            assert_eq!(m.stages()[0], stage::WEIGHTS);
        }
        assert!("qlora".parse::<BenchMode>().unwrap_err().contains("qlora"));
        assert_eq!(BenchMode::Lora.stages().len(), 7);
    }

    #[test]
    fn reports_round_trip_through_json() {
        let environment =
            EnvironmentReport::without_libtorch(Some(CudaDevice { index: 0 }), Default::default());
        let stages = vec![StageReading {
            stage: stage::WEIGHTS.into(),
            allocated_before: 0,
            allocated_after: 1536,
            reserved_after: 2 << 20,
            peak_allocated: 1536,
            peak_reserved: 2 << 20,
            host_ms: 0.25,
            blocks: None,
        }];
        let report = BenchReport::new(lora().validated().unwrap(), environment, stages);
        let text = serde_json::to_string_pretty(&report).unwrap();
        assert!(text.contains("\"mode\": \"lora\""), "{text}");
        assert!(text.contains("\"lora_targets\": [\n      \"v\",\n      \"q\"\n    ]"));
        let back: BenchReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back.run, report.run);
        assert_eq!(back.stages, report.stages);
        assert_eq!(back.schema, SCHEMA);
        assert_eq!(back.parameters, tiny_shape().parameters());
        assert_eq!(back.stage(stage::WEIGHTS).unwrap().allocated_delta(), 1536);
        let shown = report.to_string();
        assert!(shown.contains("2 097 152 B"), "{shown}");
        assert!(shown.contains("LoRA rank 8 on q_proj,v_proj"), "{shown}");
    }
}
