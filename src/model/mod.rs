//! A causal language model as transformers 5.17 builds it from its `config.json`: the sizes,
//! attention kind (full, sliding-window, interleaved local/global, latent), mixture of experts,
//! norms and biases of each supported `model_type` ([`config`]), a Gemma 3's vision tower, its
//! parameter tensors in the order `named_parameters()` yields them ([`tensors`]), and what a
//! checkpoint saved quantized stores for them ([`prequantized`]).

pub mod config;
pub mod folder;
pub mod generation;
pub mod hub;
pub mod prequantized;
pub mod tensors;

pub use config::{ConfigError, MAX_LAYERS};
pub use tensors::{Parameter, TensorRole};

use serde::{Deserialize, Serialize};

/// The model types read from a `config.json`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ModelType {
    Llama,
    Mistral,
    Mixtral,
    Qwen2,
    Qwen2Moe,
    Qwen3,
    Qwen3Moe,
    Olmo2,
    Granite,
    Gemma,
    Gemma2,
    #[strum(serialize = "gemma3_text")]
    #[serde(rename = "gemma3_text")]
    Gemma3Text,
    Phi3,
    Glm4,
    Cohere,
    Starcoder2,
    #[strum(serialize = "deepseek_v2")]
    #[serde(rename = "deepseek_v2")]
    DeepseekV2,
    #[strum(serialize = "deepseek_v3")]
    #[serde(rename = "deepseek_v3")]
    DeepseekV3,
}

impl ModelType {
    pub const ALL: &'static [ModelType] = <ModelType as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Gemma's norms (`(1 + weight) · x` in float32), scaled embeddings and tanh GELU.
    pub fn is_gemma(self) -> bool {
        matches!(
            self,
            ModelType::Gemma | ModelType::Gemma2 | ModelType::Gemma3Text
        )
    }

    /// Granite's multipliers: the embeddings, each block's output before the residual and the
    /// logits scaled by a number (each product a new tensor, whatever the number).
    pub fn has_multipliers(self) -> bool {
        self == ModelType::Granite
    }

    /// The logits multiplied by a number (Granite's `logits_scaling`, Cohere's `logit_scale`).
    pub fn scales_logits(self) -> bool {
        matches!(self, ModelType::Granite | ModelType::Cohere)
    }

    /// StarCoder2's layers: layer norms with biases (`nn.LayerNorm`) and a plain MLP (`c_fc`,
    /// tanh GELU, `c_proj`, biased as the attention is).
    pub fn is_starcoder2(self) -> bool {
        self == ModelType::Starcoder2
    }

    /// Cohere's layer: one norm (a layer norm without bias, in float32), the attention and the
    /// MLP both on its output, their sum added to the residual; its rotary in float32 over each
    /// head's interleaved pairs.
    pub fn is_cohere(self) -> bool {
        self == ModelType::Cohere
    }

    /// OLMo 2's layer: no norm before the attention and the MLP, one after each (before the
    /// residual), its norms' weights multiplied in float32.
    pub fn norms_after_blocks(self) -> bool {
        self == ModelType::Olmo2
    }

    /// Gemma 2's and 3's norms around the attention's and the MLP's outputs.
    pub fn has_sandwich_norms(self) -> bool {
        matches!(self, ModelType::Gemma2 | ModelType::Gemma3Text)
    }

    /// GLM-4's norms of the attention's and the MLP's outputs before each residual
    /// (`post_self_attn_layernorm`, `post_mlp_layernorm`), beside Llama's two.
    pub fn has_output_norms(self) -> bool {
        self == ModelType::Glm4
    }

    /// GLM-4's rotary embedding: over the first `rotary_dim` of each head, its pairs interleaved
    /// (`cos[..., :half].repeat_interleave(2)`, `rotate_half` of `x[..., 0::2]` and
    /// `x[..., 1::2]` stacked).
    pub fn has_interleaved_rotary(self) -> bool {
        self == ModelType::Glm4
    }
}

/// Per-head norms of the queries and keys (Qwen3 before the heads are transposed, Gemma 3
/// after).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    None,
    BeforeTranspose,
    AfterTranspose,
    /// OLMo 2: over each whole projection (`q_norm(q_proj(x))`), before the heads are viewed.
    Projection,
}

/// Multi-head latent attention (DeepSeek-V2/V3): K and V through a compressed latent, which is
/// what the cache holds in transformers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latent {
    /// Rank of the queries' compression (`None`: one `q_proj`).
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    /// Per head: the part without rotary embedding, the rotary part, the values.
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
    /// Biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
    pub bias: bool,
    /// DeepSeek-V3's interleaved rotary embedding (V2's goes through complex numbers).
    pub interleaved_rope: bool,
}

/// How a layer attends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Attention {
    /// Query, key and value projections (fused into one `qkv_proj` in Phi-3).
    Standard {
        q_bias: bool,
        kv_bias: bool,
        o_bias: bool,
        fused_qkv: bool,
        qk_norm: QkNorm,
    },
    Latent(Latent),
}

/// The router of a mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Router {
    /// Softmax of the logits in float32, top-k, renormalised (Mixtral): float32 weights.
    SoftmaxRenormalised,
    /// Softmax in float32, top-k, cast back to the model's type (Qwen MoE).
    SoftmaxTopK { renormalise: bool },
    /// A float32 linear, softmax, top-k (DeepSeek-V2).
    DeepseekV2,
    /// A float32 linear, sigmoid, grouped top-k (DeepSeek-V3).
    DeepseekV3 { groups: u64, top_groups: u64 },
}

/// Shared experts every token goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedExperts {
    pub intermediate: u64,
    /// Qwen2-MoE multiplies the shared output by `sigmoid(shared_expert_gate(x))`.
    pub gated: bool,
}

/// A mixture of experts (fused 3-D expert weights, as transformers 5 holds them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    /// The inner width of each expert.
    pub intermediate: u64,
    pub shared: Option<SharedExperts>,
    pub router: Router,
}

/// A layer's feed-forward part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mlp {
    /// A gated MLP of this inner width.
    Dense { intermediate: u64 },
    /// The model's mixture of experts.
    Experts,
}

/// One decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// The sliding window of a local layer (`None`: global attention).
    pub window: Option<u64>,
    pub mlp: Mlp,
}

/// How quantized weights are stored in a checkpoint's `quantization_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "method")]
pub enum Quantization {
    /// bitsandbytes 4-bit (`nf4` or `fp4`), with or without double quantization.
    Bnb4 { double_quant: bool },
    /// bitsandbytes 8-bit (LLM.int8()).
    Bnb8,
    /// GPTQ or AWQ: `bits` per weight in groups of `group_size` input rows (0: one group);
    /// GPTQ's packing keeps each input row's group (`g_idx`).
    Packed {
        bits: u64,
        group_size: u64,
        g_idx: bool,
    },
    /// Fine-grained FP8 (transformers' `FineGrainedFP8Config`): float8 weights, a float32 scale
    /// per block of `block_rows` × `block_cols`.
    Fp8 { block_rows: u64, block_cols: u64 },
}

impl Quantization {
    /// The method as a person names it: `4-bit GPTQ in groups of 128`.
    pub fn described(self) -> String {
        match self {
            Quantization::Bnb4 { .. } => "bitsandbytes 4-bit".into(),
            Quantization::Bnb8 => "bitsandbytes 8-bit".into(),
            Quantization::Packed {
                bits,
                group_size,
                g_idx,
            } => format!(
                "{bits}-bit {} in {}",
                if g_idx { "GPTQ" } else { "AWQ" },
                match group_size {
                    0 => "one group".to_string(),
                    g => format!("groups of {g}"),
                }
            ),
            Quantization::Fp8 {
                block_rows,
                block_cols,
            } => format!("FP8 in blocks of {block_rows} × {block_cols}"),
        }
    }
}

/// The SigLIP vision tower and projector of a multimodal Gemma 3 (`Gemma3ForConditionalGeneration`,
/// what `AutoModelForCausalLM` builds from a `gemma3` configuration). A text-only run loads them
/// and never runs them: no activation, no gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vision {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub channels: u64,
    pub patch: u64,
    /// Patches of an image: `(image_size / patch_size)²`.
    pub positions: u64,
    /// SigLIP's attention-pooling head (`vision_use_head`).
    pub head: bool,
}

/// A model as transformers builds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    pub model_type: ModelType,
    pub vocab: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// Per-head width of the queries and keys (the rotary part, for latent attention).
    pub head_dim: u64,
    /// The dense MLP's inner width.
    pub intermediate: u64,
    pub tied_embeddings: bool,
    pub attention: Attention,
    /// Biases on the MLP's projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Phi-3's fused `gate_up_proj`.
    pub fused_gate_up: bool,
    /// Width of the rotary part of a head (Phi-3's `partial_rotary_factor`).
    pub rotary_dim: u64,
    pub layers: Vec<Layer>,
    pub moe: Option<Moe>,
    /// Gemma 2's final logit soft-capping (three more logits-sized tensors).
    pub final_softcap: bool,
    /// The configuration names a beginning-of-sequence token (`bos_token_id` not null, its
    /// class's default when absent): `generate` makes it a tensor.
    #[serde(default = "crate::model::yes")]
    pub bos_token: bool,
    /// The dtype the config names (`dtype` or `torch_dtype`).
    pub dtype: Option<crate::dtype::Dtype>,
    pub quantization: Option<Quantization>,
    /// The vision tower beside the text model (`None`: a text-only model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<Vision>,
    /// The longest sequence its positions are configured for (`max_position_embeddings`), when
    /// the configuration says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
}

fn yes() -> bool {
    true
}

impl Model {
    /// The `model_type` of the configuration read: `gemma3` for a Gemma 3 with its vision tower.
    pub fn type_name(&self) -> &'static str {
        match self.vision {
            Some(_) => "gemma3",
            None => self.model_type.name(),
        }
    }

    /// Where the text model's tensors are named: `model.`, or `model.language_model.` beside a
    /// vision tower.
    pub fn text_prefix(&self) -> &'static str {
        match self.vision {
            Some(_) => "model.language_model.",
            None => "model.",
        }
    }

    /// Queries' width (heads × per-head query width).
    pub fn q_dim(&self) -> u64 {
        match self.attention {
            Attention::Latent(l) => self.heads * (l.qk_nope_head_dim + l.qk_rope_head_dim),
            Attention::Standard { .. } => self.heads * self.head_dim,
        }
    }

    /// Keys' (and values') width of a standard attention layer.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// The widest row a token makes in a step: the hidden state, the MLP's or an expert's inner
    /// width (times the experts each token goes through), the queries, keys and values, the
    /// router's scores or the logits.
    pub fn widest(&self) -> u64 {
        let experts = self.moe.as_ref().map_or(0, |m| {
            m.top_k
                .saturating_mul(m.intermediate)
                .saturating_mul(2)
                .max(m.experts)
        });
        [
            self.hidden,
            self.intermediate * 2,
            self.q_dim(),
            self.kv_dim() * 2,
            self.vocab,
            experts,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// The bounds every model read from a `config.json` keeps (sizes from 1 to
    /// [`config::MAX_SIZE`], at most [`MAX_LAYERS`] layers and experts, parameters counted below
    /// [`config::MAX_PARAMETERS`]): what a model given otherwise (a budget file's) is checked
    /// against before anything is computed from it.
    pub fn check_bounds(&self) -> Result<(), ConfigError> {
        use config::MAX_SIZE;
        let range = |field: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::Range {
                    field: field.into(),
                    value: value.to_string(),
                    range: format!("{min} to {max}"),
                })
            }
        };
        let size = |field: &str, value: u64| range(field, value, 1, MAX_SIZE);
        size("vocab", self.vocab)?;
        size("hidden", self.hidden)?;
        size("heads", self.heads)?;
        size("kv_heads", self.kv_heads)?;
        size("head_dim", self.head_dim)?;
        size("intermediate", self.intermediate)?;
        range("rotary_dim", self.rotary_dim, 0, self.head_dim)?;
        range("layers", self.layers.len() as u64, 1, MAX_LAYERS)?;
        for l in &self.layers {
            if let Some(w) = l.window {
                size("layers[].window", w)?;
            }
            match l.mlp {
                Mlp::Dense { intermediate } => size("layers[].mlp.intermediate", intermediate)?,
                Mlp::Experts if self.moe.is_none() => {
                    return Err(ConfigError::Invalid(
                        "a layer of experts in a model without a mixture of experts".into(),
                    ))
                }
                Mlp::Experts => {}
            }
        }
        if let Some(m) = &self.moe {
            range("moe.experts", m.experts, 1, MAX_LAYERS)?;
            range("moe.top_k", m.top_k, 1, m.experts)?;
            size("moe.intermediate", m.intermediate)?;
            if let Some(shared) = m.shared {
                range(
                    "moe.shared.intermediate",
                    shared.intermediate,
                    0,
                    MAX_SIZE * MAX_LAYERS,
                )?;
            }
            if let Router::DeepseekV3 { groups, top_groups } = m.router {
                range("moe.router.groups", groups, 1, MAX_LAYERS)?;
                range("moe.router.top_groups", top_groups, 1, MAX_LAYERS)?;
            }
        }
        if let Attention::Latent(l) = &self.attention {
            if let Some(q) = l.q_lora_rank {
                size("attention.q_lora_rank", q)?;
            }
            size("attention.kv_lora_rank", l.kv_lora_rank)?;
            size("attention.qk_nope_head_dim", l.qk_nope_head_dim)?;
            size("attention.qk_rope_head_dim", l.qk_rope_head_dim)?;
            size("attention.v_head_dim", l.v_head_dim)?;
        }
        if let Some(v) = &self.vision {
            size("vision.hidden", v.hidden)?;
            size("vision.intermediate", v.intermediate)?;
            range("vision.layers", v.layers, 1, MAX_LAYERS)?;
            size("vision.channels", v.channels)?;
            size("vision.patch", v.patch)?;
            size("vision.positions", v.positions)?;
        }
        match self.checked_parameter_count() {
            Some(n) if n <= config::MAX_PARAMETERS => self.check_runnable(),
            _ => Err(ConfigError::Range {
                field: "parameters".into(),
                value: "more than 2^50".into(),
                range: format!(
                    "at most 2^50 = {}",
                    crate::units::grouped(config::MAX_PARAMETERS)
                ),
            }),
        }
    }

    /// What transformers builds but cannot run: key/value heads that do not divide the query
    /// heads (transformers counts the parameters of such a model, its attention then fails).
    pub fn check_runnable(&self) -> Result<(), ConfigError> {
        if matches!(self.attention, Attention::Standard { .. })
            && !self.heads.is_multiple_of(self.kv_heads)
        {
            return Err(ConfigError::Grouping {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        // DeepSeek-V3's router views the experts' scores as `n_group` groups of equal size, keeps
        // the `topk_group` best groups and picks the experts among them.
        if let Some(Moe {
            experts,
            top_k,
            router: Router::DeepseekV3 { groups, top_groups },
            ..
        }) = self.moe
        {
            if !experts.is_multiple_of(groups) {
                return Err(ConfigError::Invalid(format!(
                    "`n_group` ({groups}) must divide `n_routed_experts` ({experts}): \
                     transformers' router views the experts as groups of equal size"
                )));
            }
            if top_groups > groups || top_k > top_groups * (experts / groups) {
                return Err(ConfigError::Invalid(format!(
                    "`topk_group` ({top_groups}) groups of {} experts cannot give \
                     `num_experts_per_tok` ({top_k}) experts out of `n_group` ({groups}) groups",
                    experts / groups
                )));
            }
        }
        Ok(())
    }

    /// Whether any layer uses a sliding window.
    pub fn has_sliding_layers(&self) -> bool {
        self.layers.iter().any(|l| l.window.is_some())
    }

    /// Whether some layer attends to every position (no sliding window).
    pub fn has_global_layers(&self) -> bool {
        self.layers.iter().any(|l| l.window.is_none())
    }

    /// Whether sliding layers and layers of global attention alternate (Gemma 2 and 3).
    pub fn mixes_sliding_and_global(&self) -> bool {
        self.has_sliding_layers() && self.has_global_layers()
    }
}
