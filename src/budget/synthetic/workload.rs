//! What runs on the GPU: a model shape, a mode (inference, LoRA, QLoRA, full training), the
//! storage of its weights and the sizes of a step. Validated once, so that every formula of
//! [`super::terms`] may rely on it.

use crate::budget::shape::{AttentionKind, LinearTarget, ModelShape, ShapeError};
use crate::measure::Dtype;
use serde::{Deserialize, Serialize};

/// How the layers' linear matrices are stored (embeddings, the LM head, norms and biases stay in
/// the compute dtype, as bitsandbytes, GPTQ and AWQ leave them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "format")]
pub enum WeightFormat {
    /// Unquantized, in the compute dtype.
    Dense,
    /// LLM.int8() (bitsandbytes): one byte per weight and one float32 scale per output row.
    Int8,
    /// GPTQ: 4 bits per weight; per group of `group_size` input rows and per output column a
    /// float16 scale and a 4-bit zero point; one int32 group index per input row.
    Int4 { group_size: u64 },
    /// NF4 with double quantization (QLoRA, bitsandbytes): 4 bits per weight, one 8-bit absmax
    /// per block of 64 weights, one float32 per 256 blocks.
    Nf4,
}

impl WeightFormat {
    pub fn name(self) -> String {
        match self {
            WeightFormat::Dense => "dense".into(),
            WeightFormat::Int8 => "int8".into(),
            WeightFormat::Int4 { group_size } => format!("int4 (group {group_size})"),
            WeightFormat::Nf4 => "nf4".into(),
        }
    }
}

/// The optimizer of full training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// AdamW with mixed precision: float32 master weights, float32 moments, 16-bit weights and
    /// gradients (the usual `torch.amp` + fp32 optimizer recipe).
    AdamwMixed,
    /// AdamW with moments in the weights' own dtype, no master copy.
    Adamw,
    /// SGD with momentum: one buffer in the weights' dtype.
    SgdMomentum,
    /// bitsandbytes' 8-bit AdamW: two 8-bit moments with one float32 absmax per block of 256.
    Adamw8bit,
}

impl Optimizer {
    pub const ALL: [Optimizer; 4] = [
        Optimizer::AdamwMixed,
        Optimizer::Adamw,
        Optimizer::SgdMomentum,
        Optimizer::Adamw8bit,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::AdamwMixed => "adamw-mixed",
            Optimizer::Adamw => "adamw",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adamw8bit => "adamw-8bit",
        }
    }
}

impl std::str::FromStr for Optimizer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Optimizer::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| {
                format!("unknown optimizer {s:?} (adamw-mixed, adamw, sgd-momentum or adamw-8bit)")
            })
    }
}

/// Element width of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvFormat {
    Float32,
    Float16,
    Bfloat16,
    /// One byte per element (FP8 KV cache, as in vLLM and TensorRT-LLM), scales ignored.
    Fp8,
}

impl KvFormat {
    pub fn bytes(self) -> u64 {
        match self {
            KvFormat::Float32 => 4,
            KvFormat::Float16 | KvFormat::Bfloat16 => 2,
            KvFormat::Fp8 => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::Float32 => "float32",
            KvFormat::Float16 => "float16",
            KvFormat::Bfloat16 => "bfloat16",
            KvFormat::Fp8 => "fp8",
        }
    }
    pub fn of(dtype: Dtype) -> KvFormat {
        match dtype {
            Dtype::Float32 => KvFormat::Float32,
            Dtype::Float16 => KvFormat::Float16,
            Dtype::Bfloat16 => KvFormat::Bfloat16,
        }
    }
}

impl std::str::FromStr for KvFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            KvFormat::Float32,
            KvFormat::Float16,
            KvFormat::Bfloat16,
            KvFormat::Fp8,
        ]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| format!("unknown KV-cache format {s:?} (float32, float16, bfloat16 or fp8)"))
    }
}

/// What the GPU does with the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Mode {
    /// Prefill of `context` prompt tokens, then `generated` tokens decoded one at a time.
    Inference { generated: u64, kv_cache: KvFormat },
    /// Frozen base weights, trained float32 adapters of `rank` on the `targets` of every layer,
    /// AdamW on the adapters. QLoRA is this mode with NF4 base weights.
    Lora {
        rank: u64,
        targets: Vec<LinearTarget>,
    },
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

/// A workload whose budget can be computed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// The preset the shape comes from, if any (`llama-2-7b`).
    pub preset: Option<String>,
    pub shape: ModelShape,
    pub mode: Mode,
    /// Dtype of activations, of dense weights and of gradients: float32, float16 or bfloat16.
    pub dtype: Dtype,
    pub weights: WeightFormat,
    /// Sequences processed together.
    pub batch: u64,
    /// Prompt tokens (inference) or sequence length (training).
    pub context: u64,
    /// Full-layer activation recomputation (training).
    pub checkpointing: bool,
    /// Attention without the materialised score matrix (FlashAttention, PyTorch's SDPA).
    pub flash_attention: bool,
}

/// Why a workload is refused; the messages name the field and, for a preset, the preset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error(
        "{model} uses {kind} attention, which these formulas do not cover (its KV cache and \
         attention memory differ from full attention's: {why}); no budget is given rather than a \
         wrong one"
    )]
    Attention {
        model: String,
        kind: &'static str,
        why: &'static str,
    },
    #[error("{mode} takes {weights} base weights; use {allowed}")]
    Weights {
        mode: &'static str,
        weights: String,
        allowed: &'static str,
    },
    #[error("quantized weights are computed in a 16-bit dtype, not float32")]
    QuantizedFloat32,
    #[error("int4 group size {0} must divide every linear layer's input width ({1})")]
    GroupSize(u64, u64),
    #[error("LoRA needs at least one target module")]
    NoTargets,
    #[error("the workload is too large to count in 64 bits")]
    Overflow,
}

impl crate::status::Classify for WorkloadError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

impl Workload {
    /// A shipped preset in `mode`, bfloat16 dense weights, flash attention, no recomputation,
    /// validated; change a field with `Workload { batch: 8, ..w }` and validate again.
    pub fn preset(
        name: &str,
        mode: Mode,
        batch: u64,
        context: u64,
    ) -> Result<Workload, PresetOrWorkload> {
        let presets = crate::budget::Presets::builtin();
        let p = presets.get(name)?;
        Ok(Workload {
            preset: Some(p.preset.clone()),
            shape: p.shape().map_err(|e| WorkloadError::Attention {
                model: name.to_string(),
                kind: "this",
                why: Box::leak(e.into_boxed_str()),
            })?,
            mode,
            dtype: Dtype::Bfloat16,
            weights: WeightFormat::Dense,
            batch,
            context,
            checkpointing: false,
            flash_attention: true,
        }
        .validated()?)
    }

    /// Checks the shape and the sizes, and refuses what the formulas do not cover.
    pub fn validated(mut self) -> Result<Self, WorkloadError> {
        self.shape = self.shape.validated()?;
        for (field, v) in [("batch", self.batch), ("context", self.context)] {
            if v == 0 {
                return Err(WorkloadError::Zero { field });
            }
        }
        let model = self
            .preset
            .clone()
            .unwrap_or_else(|| "this model".to_string());
        match self.shape.attention {
            AttentionKind::Full => {}
            AttentionKind::SlidingWindow => return Err(WorkloadError::Attention {
                model,
                kind: "sliding-window",
                why: "the cache holds at most the window per layer, and some layers may be global",
            }),
            AttentionKind::Latent => {
                return Err(WorkloadError::Attention {
                    model,
                    kind: "multi-head latent",
                    why: "K and V are cached as one compressed latent plus a rotary key",
                })
            }
        }
        let quantized = self.weights != WeightFormat::Dense;
        if quantized && self.dtype == Dtype::Float32 {
            return Err(WorkloadError::QuantizedFloat32);
        }
        if let WeightFormat::Int4 { group_size } = self.weights {
            let widths = [
                self.shape.hidden,
                self.shape.q_dim(),
                self.shape.intermediate,
            ];
            if let Some(w) = widths
                .into_iter()
                .find(|w| group_size == 0 || w % group_size != 0)
            {
                return Err(WorkloadError::GroupSize(group_size, w));
            }
        }
        match &self.mode {
            Mode::Inference { .. } => {}
            Mode::Lora { rank, targets } => {
                if *rank == 0 {
                    return Err(WorkloadError::Zero { field: "rank" });
                }
                if targets.is_empty() {
                    return Err(WorkloadError::NoTargets);
                }
            }
            Mode::Full { .. } if quantized => {
                return Err(WorkloadError::Weights {
                    mode: "full training",
                    weights: self.weights.name(),
                    allowed: "dense weights (train adapters over quantized weights with lora)",
                })
            }
            Mode::Full { .. } => {}
        }
        Ok(self)
    }

    /// Tokens in the KV cache at the end (inference), or processed per step (training).
    pub fn tokens(&self) -> u64 {
        match self.mode {
            Mode::Inference { generated, .. } => self.context + generated,
            _ => self.context,
        }
    }
}

/// Why [`Workload::preset`] failed: the name or the workload.
#[derive(Debug, thiserror::Error)]
pub enum PresetOrWorkload {
    #[error(transparent)]
    Preset(#[from] crate::budget::PresetError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
}
