//! Reading a `config.json` the way transformers 5.17 reads it: each supported `model_type`'s
//! fields that change memory, with the defaults its configuration class gives the ones a file
//! leaves out. The sizes that define the model are required (a file without `hidden_size` is
//! refused, never completed with a guess); every size is checked against one bound.

use super::{
    Attention, Latent, Layer, Mlp, Model, ModelType, Moe, QkNorm, Quantization, Router,
    SharedExperts, Vision,
};
use crate::dtype::Dtype;
use serde_json::Value;

/// The largest number of layers (and of experts) a model may have: far above any published
/// model (DeepSeek-V3 has 61 layers and 256 experts), so that work proportional to it stays
/// bounded.
pub const MAX_LAYERS: u64 = 4096;
/// The largest width, vocabulary or rank: 2^24, far above any published model (vocabularies
/// reach 262 144), so that products of sizes stay far from 2^64.
pub const MAX_SIZE: u64 = 1 << 24;

/// Why a configuration is refused: the field (or the model type) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "model_type `{0}` is not supported; supported: llama, mistral, mixtral, qwen2, qwen2_moe, \
         qwen3, qwen3_moe, olmo2, granite, gemma, gemma2, gemma3_text, gemma3 (with its vision tower), phi3, glm4, \
         cohere, starcoder2, deepseek_v2, deepseek_v3"
    )]
    UnknownType(String),
    #[error("`model_type` is missing: a config.json names its model type")]
    NoType,
    #[error("`{0}` is missing (transformers would fill in a default size; this tool refuses to guess one)")]
    Missing(String),
    #[error("`{field}` must be {expected}, not {found}")]
    Type {
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("`{field}` = {value} is out of range ({range})")]
    Range {
        field: String,
        value: String,
        range: String,
    },
    #[error(
        "`num_attention_heads` ({heads}) must be a multiple of `num_key_value_heads` ({kv_heads})"
    )]
    Grouping { heads: u64, kv_heads: u64 },
    #[error("{0}")]
    Invalid(String),
}

impl crate::status::Classify for ConfigError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::DataError
    }
}

/// The configuration's fields, read one by one with their names in errors.
struct Fields<'a> {
    object: &'a serde_json::Map<String, Value>,
    /// Prefix for error messages (`text_config.` inside a Gemma 3 config).
    prefix: &'static str,
}

fn shown(v: &Value) -> String {
    let s = v.to_string();
    let s = crate::text::printable(&s);
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_string()
    }
}

impl<'a> Fields<'a> {
    fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    /// The value of `field`, `None` when absent or null.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.object.get(field).filter(|v| !v.is_null())
    }

    /// A whole number in `min..=max`: `default` when absent (an error when there is none), and
    /// refused when null (transformers refuses a null size, or fails building the model).
    fn number(
        &self,
        field: &str,
        default: Option<u64>,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        let Some(v) = self.object.get(field) else {
            return default.ok_or_else(|| ConfigError::Missing(self.name(field)));
        };
        let n = v.as_u64().ok_or_else(|| ConfigError::Type {
            field: self.name(field),
            expected: "a whole number",
            found: shown(v),
        })?;
        if n < min || n > max {
            return Err(ConfigError::Range {
                field: self.name(field),
                value: n.to_string(),
                range: format!("{min} to {max}"),
            });
        }
        Ok(n)
    }

    /// A required size between 1 and [`MAX_SIZE`].
    fn size(&self, field: &str) -> Result<u64, ConfigError> {
        self.number(field, None, 1, MAX_SIZE)
    }

    /// A size, `default` when absent.
    fn size_or(&self, field: &str, default: u64) -> Result<u64, ConfigError> {
        self.number(field, Some(default), 1, MAX_SIZE)
    }

    /// A size whose null, like its absence, means `default`.
    fn size_nullable(&self, field: &str, default: u64) -> Result<u64, ConfigError> {
        match self.get(field) {
            None => Ok(default),
            Some(_) => self.size(field),
        }
    }

    /// A count of layers or experts from `min`, `default` when absent.
    fn count(&self, field: &str, default: u64, min: u64) -> Result<u64, ConfigError> {
        self.number(field, Some(default), min, MAX_LAYERS)
    }

    /// A size that null (or absence) turns off.
    fn optional_size(&self, field: &str) -> Result<Option<u64>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.size(field).map(Some),
        }
    }

    fn flag(&self, field: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(field) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ConfigError::Type {
                field: self.name(field),
                expected: "true or false",
                found: shown(v),
            }),
        }
    }

    fn float(&self, field: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ConfigError::Type {
                field: self.name(field),
                expected: "a number",
                found: shown(v),
            }),
        }
    }

    /// A list of whole numbers (layer indices).
    fn indices(&self, field: &str) -> Result<Vec<u64>, ConfigError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) if a.len() as u64 <= MAX_LAYERS => a
                .iter()
                .map(|v| {
                    v.as_u64().ok_or_else(|| ConfigError::Type {
                        field: self.name(field),
                        expected: "a list of layer indices",
                        found: shown(v),
                    })
                })
                .collect(),
            Some(v) => Err(ConfigError::Type {
                field: self.name(field),
                expected: "a list of layer indices",
                found: shown(v),
            }),
        }
    }

    /// `layer_types` if given: one `full_attention` or `sliding_attention` per layer.
    fn layer_types(&self, layers: u64) -> Result<Option<Vec<bool>>, ConfigError> {
        let Some(v) = self.get("layer_types") else {
            return Ok(None);
        };
        let field = self.name("layer_types");
        let Value::Array(a) = v else {
            return Err(ConfigError::Type {
                field,
                expected: "a list of layer types",
                found: shown(v),
            });
        };
        if a.len() as u64 != layers {
            return Err(ConfigError::Invalid(format!(
                "`{field}` lists {} layers, `num_hidden_layers` is {layers}",
                a.len()
            )));
        }
        a.iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(false),
                Some("sliding_attention") => Ok(true),
                _ => Err(ConfigError::Type {
                    field: field.clone(),
                    expected: "\"full_attention\" or \"sliding_attention\" for each layer",
                    found: shown(t),
                }),
            })
            .collect::<Result<Vec<bool>, _>>()
            .map(Some)
    }
}

/// Reads a `config.json`'s bytes.
pub fn parse(bytes: &[u8]) -> Result<Model, ConfigError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ConfigError::Invalid(format!("not JSON: {e}")))?;
    from_value(&value)
}

/// Reads a parsed `config.json`.
pub fn from_value(value: &Value) -> Result<Model, ConfigError> {
    let object = value
        .as_object()
        .ok_or_else(|| ConfigError::Invalid("a config.json holds one JSON object".into()))?;
    let top = Fields { object, prefix: "" };
    let name = match top.get("model_type") {
        None => return Err(ConfigError::NoType),
        Some(Value::String(s)) => s.as_str(),
        Some(v) => {
            return Err(ConfigError::Type {
                field: "model_type".into(),
                expected: "a string",
                found: shown(v),
            })
        }
    };
    if name == "gemma3" {
        let text = top
            .get("text_config")
            .and_then(Value::as_object)
            .ok_or_else(|| ConfigError::Missing("text_config".into()))?;
        let fields = Fields {
            object: text,
            prefix: "text_config.",
        };
        let mut model = build(ModelType::Gemma3Text, &fields)?;
        model.vision = Some(vision_of(&top)?);
        // `Gemma3ForConditionalGeneration` ties its head by the top-level flag and applies no
        // final soft-capping.
        model.tied_embeddings = top.flag("tie_word_embeddings", true)?;
        model.final_softcap = false;
        if model.dtype.is_none() {
            model.dtype = dtype_of(&top)?;
        }
        if model.quantization.is_none() {
            model.quantization = quantization_of(&top)?;
        }
        return bounded(model);
    }
    let model_type: ModelType = name
        .parse()
        .map_err(|_| ConfigError::UnknownType(crate::text::printable(name).to_string()))?;
    bounded(build(model_type, &top)?)
}

/// The most parameters a model may have: 2^50, a thousand times the largest published models,
/// so that every byte count of its budget (at most 16 B a parameter, and their sums) stays far
/// below 2^64.
pub const MAX_PARAMETERS: u64 = 1 << 50;

/// `model`, if its parameter count (counted without overflow) is at most [`MAX_PARAMETERS`].
fn bounded(model: Model) -> Result<Model, ConfigError> {
    let count = model.checked_parameter_count();
    match count {
        Some(n) if n <= MAX_PARAMETERS => Ok(model),
        _ => Err(ConfigError::Range {
            field: "parameter count".into(),
            value: count.map_or("more than 2^64".into(), crate::units::grouped),
            range: format!("at most 2^50 = {}", crate::units::grouped(MAX_PARAMETERS)),
        }),
    }
}

fn dtype_of(f: &Fields) -> Result<Option<Dtype>, ConfigError> {
    for field in ["dtype", "torch_dtype"] {
        if let Some(v) = f.get(field) {
            let s = v.as_str().unwrap_or("");
            return match s {
                "float32" => Ok(Some(Dtype::Float32)),
                "float16" => Ok(Some(Dtype::Float16)),
                "bfloat16" => Ok(Some(Dtype::Bfloat16)),
                _ => Err(ConfigError::Type {
                    field: f.name(field),
                    expected: "\"float32\", \"float16\" or \"bfloat16\"",
                    found: shown(v),
                }),
            };
        }
    }
    Ok(None)
}

fn quantization_of(f: &Fields) -> Result<Option<Quantization>, ConfigError> {
    let Some(q) = f.get("quantization_config") else {
        return Ok(None);
    };
    let object = q.as_object().ok_or_else(|| ConfigError::Type {
        field: f.name("quantization_config"),
        expected: "an object",
        found: shown(q),
    })?;
    let qf = Fields {
        object,
        prefix: "quantization_config.",
    };
    let method = qf.get("quant_method").and_then(Value::as_str).unwrap_or("");
    match method {
        "bitsandbytes" => {
            if qf.flag("load_in_4bit", false)? {
                Ok(Some(Quantization::Bnb4 {
                    double_quant: qf.flag("bnb_4bit_use_double_quant", false)?,
                }))
            } else if qf.flag("load_in_8bit", false)? {
                Ok(Some(Quantization::Bnb8))
            } else {
                Err(ConfigError::Invalid(
                    "quantization_config: bitsandbytes without load_in_4bit or load_in_8bit".into(),
                ))
            }
        }
        "gptq" | "awq" => {
            let bits = qf.number("bits", Some(4), 2, 8)?;
            let group_size = match qf.get("group_size").and_then(Value::as_i64) {
                Some(-1) => 0,
                _ => qf.size_or("group_size", 128)?,
            };
            if qf.flag("lm_head", false)? {
                return Err(ConfigError::Invalid(
                    "quantization_config.lm_head: a quantized LM head is not supported".into(),
                ));
            }
            Ok(Some(Quantization::Packed {
                bits,
                group_size,
                g_idx: method == "gptq",
            }))
        }
        "fp8" => {
            // FineGrainedFP8Config's `weight_block_size`, (128, 128) by default.
            let [block_rows, block_cols] = match qf.get("weight_block_size") {
                None => [128, 128],
                Some(v) => {
                    let sizes: Option<Vec<Option<u64>>> =
                        v.as_array().map(|a| a.iter().map(Value::as_u64).collect());
                    match sizes.as_deref() {
                        Some(&[Some(r), Some(c)]) if r > 0 && c > 0 => [r, c],
                        _ => {
                            return Err(ConfigError::Type {
                                field: qf.name("weight_block_size"),
                                expected: "two positive integers",
                                found: shown(v),
                            })
                        }
                    }
                }
            };
            Ok(Some(Quantization::Fp8 {
                block_rows,
                block_cols,
            }))
        }
        other => Err(ConfigError::Invalid(format!(
            "quantization_config.quant_method `{}` is not supported (bitsandbytes, gptq, awq, fp8)",
            crate::text::printable(other)
        ))),
    }
}

/// `num_key_value_heads` when absent (`None`: the number of query heads), as each configuration
/// class defaults it.
fn default_kv_heads(model_type: ModelType) -> Option<u64> {
    use ModelType as T;
    match model_type {
        T::Mistral | T::Mixtral => Some(8),
        T::Qwen2 | T::Qwen3 => Some(32),
        T::Qwen2Moe => Some(16),
        T::Qwen3Moe | T::Gemma2 | T::Gemma3Text => Some(4),
        T::Gemma => Some(16),
        T::Glm4 | T::Starcoder2 => Some(2),
        T::DeepseekV3 => Some(128),
        T::Llama | T::Phi3 | T::DeepseekV2 | T::Granite | T::Olmo2 | T::Cohere => None,
    }
}

/// A Gemma 3's vision tower from its `vision_config`, SiglipVisionConfig's defaults where a field
/// (or the whole `vision_config`) is absent: 12 layers of 768, 224-pixel images in 16-pixel
/// patches, the pooling head.
fn vision_of(top: &Fields) -> Result<Vision, ConfigError> {
    let empty = serde_json::Map::new();
    let object = match top.get("vision_config") {
        None => &empty,
        Some(value) => value.as_object().ok_or_else(|| ConfigError::Type {
            field: top.name("vision_config"),
            expected: "an object",
            found: shown(value),
        })?,
    };
    let f = Fields {
        object,
        prefix: "vision_config.",
    };
    let image = f.size_or("image_size", 224)?;
    let patch = f.size_or("patch_size", 16)?;
    let side = image / patch;
    let positions = side.checked_mul(side).filter(|&n| n > 0 && n <= MAX_SIZE);
    let positions = positions.ok_or_else(|| ConfigError::Range {
        field: f.name("image_size"),
        value: image.to_string(),
        range: format!(
            "at least `{}` ({patch}), with (image_size / patch_size)² at most {MAX_SIZE}",
            f.name("patch_size")
        ),
    })?;
    Ok(Vision {
        hidden: f.size_or("hidden_size", 768)?,
        intermediate: f.size_or("intermediate_size", 3072)?,
        layers: f.number("num_hidden_layers", Some(12), 1, MAX_LAYERS)?,
        channels: f.size_or("num_channels", 3)?,
        patch,
        positions,
        head: f.flag("vision_use_head", true)?,
    })
}

/// The model of `model_type` from its fields.
fn build(model_type: ModelType, f: &Fields) -> Result<Model, ConfigError> {
    use ModelType as T;
    let vocab = f.size("vocab_size")?;
    let hidden = f.size("hidden_size")?;
    let layers = f.number("num_hidden_layers", None, 1, MAX_LAYERS)?;
    let heads = f.size("num_attention_heads")?;
    let intermediate = f.size("intermediate_size")?;
    let latent = matches!(model_type, T::DeepseekV2 | T::DeepseekV3);
    // A null count of key/value heads means one per query head where transformers derives it;
    // elsewhere it is refused.
    let kv_null = f
        .object
        .get("num_key_value_heads")
        .is_some_and(Value::is_null);
    let kv_heads = if kv_null
        && (latent
            || matches!(
                model_type,
                T::Llama | T::Qwen2 | T::Qwen3 | T::Phi3 | T::Granite | T::Olmo2
            )) {
        heads
    } else {
        f.size_or(
            "num_key_value_heads",
            default_kv_heads(model_type).unwrap_or(heads),
        )?
    };
    // Llama, Gemma and DeepSeek-V2 check that the heads divide the hidden size.
    if matches!(
        model_type,
        T::Llama | T::Gemma | T::Gemma2 | T::Gemma3Text | T::DeepseekV2
    ) && !hidden.is_multiple_of(heads)
    {
        return Err(ConfigError::Invalid(format!(
            "`{}` ({hidden}) must be a multiple of `{}` ({heads})",
            f.name("hidden_size"),
            f.name("num_attention_heads")
        )));
    }
    let default_head_dim = match model_type {
        T::Qwen3 | T::Glm4 => 128,
        T::Gemma | T::Gemma2 | T::Gemma3Text => 256,
        _ => hidden / heads,
    };
    let mut head_dim = if matches!(
        model_type,
        T::Llama | T::Mistral | T::Mixtral | T::Starcoder2
    ) {
        f.size_nullable("head_dim", default_head_dim)?
    } else {
        f.size_or("head_dim", default_head_dim)?
    };
    let tied_embeddings = f.flag(
        "tie_word_embeddings",
        model_type.is_gemma() || matches!(model_type, T::Cohere | T::Starcoder2),
    )?;
    if model_type == T::Cohere {
        if f.flag("use_qk_norm", false)? {
            return Err(ConfigError::Invalid(format!(
                "`{}`: Cohere's per-head layer norms of the queries and keys (Command R+) are \
                 not yet replayed",
                f.name("use_qk_norm")
            )));
        }
        // `logits * logit_scale`: a number (null would fail in the forward).
        if f.object.contains_key("logit_scale") && f.float("logit_scale")?.is_none() {
            return Err(ConfigError::Type {
                field: f.name("logit_scale"),
                expected: "a number",
                found: "null".into(),
            });
        }
    }
    let attention_bias = match model_type {
        // StarCoder2's `use_bias`: every linear layer's, the MLP's too.
        T::Starcoder2 => f.flag("use_bias", true)?,
        _ => f.flag("attention_bias", model_type == T::Glm4)?,
    };
    let mlp_bias = match model_type {
        T::Starcoder2 => attention_bias,
        T::Llama | T::DeepseekV2 | T::Granite => f.flag("mlp_bias", false)?,
        _ => false,
    };
    let mut rotary_dim = head_dim;
    let attention = if latent {
        let m = Latent {
            q_lora_rank: if f.object.contains_key("q_lora_rank") {
                f.optional_size("q_lora_rank")?
            } else {
                Some(1536)
            },
            kv_lora_rank: f.size_or("kv_lora_rank", 512)?,
            qk_nope_head_dim: f.size_or("qk_nope_head_dim", 128)?,
            qk_rope_head_dim: f.size_or("qk_rope_head_dim", 64)?,
            v_head_dim: f.size_or("v_head_dim", 128)?,
            bias: attention_bias,
            interleaved_rope: model_type == T::DeepseekV3,
        };
        // The configuration overwrites head_dim with the rotary width.
        head_dim = m.qk_rope_head_dim;
        rotary_dim = head_dim;
        Attention::Latent(m)
    } else {
        let (q_bias, kv_bias, o_bias) = match model_type {
            T::Qwen2 => (true, true, false),
            T::Qwen2Moe => {
                let b = f.flag("qkv_bias", true)?;
                (b, b, false)
            }
            T::Mistral | T::Mixtral | T::Phi3 => (false, false, false),
            T::Glm4 => (attention_bias, attention_bias, false),
            _ => (attention_bias, attention_bias, attention_bias),
        };
        if matches!(model_type, T::Phi3 | T::Glm4) {
            let factor = match f.float("partial_rotary_factor")? {
                Some(factor) => factor,
                // transformers 5 saves it among the rope parameters.
                None => rope_parameter(f, "partial_rotary_factor")?
                    .unwrap_or(if model_type == T::Glm4 { 0.5 } else { 1.0 }),
            };
            if !(factor > 0.0 && factor <= 1.0) {
                return Err(ConfigError::Range {
                    field: f.name("partial_rotary_factor"),
                    value: factor.to_string(),
                    range: "above 0, at most 1".into(),
                });
            }
            // `int(head_dim * factor)`: with the factor in (0, 1], in [0, head_dim].
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "the product lies in [0, head_dim]"
            )]
            {
                rotary_dim = ((head_dim as f64) * factor) as u64;
            }
        }
        Attention::Standard {
            q_bias,
            kv_bias,
            o_bias,
            fused_qkv: model_type == T::Phi3,
            qk_norm: match model_type {
                T::Qwen3 | T::Qwen3Moe => QkNorm::BeforeTranspose,
                T::Gemma3Text => QkNorm::AfterTranspose,
                T::Olmo2 => QkNorm::Projection,
                _ => QkNorm::None,
            },
        }
    };
    let moe = moe_of(model_type, f)?;
    let windows = windows_of(model_type, f, layers)?;
    let dense_layers = dense_layers_of(model_type, f, layers)?;
    let layers = (0..layers)
        .zip(windows)
        .map(|(i, window)| Layer {
            window,
            mlp: if moe.is_some() && !dense_layers.contains(&i) {
                Mlp::Experts
            } else {
                Mlp::Dense { intermediate }
            },
        })
        .collect();
    Ok(Model {
        model_type,
        vocab,
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        tied_embeddings,
        attention,
        mlp_bias,
        fused_gate_up: matches!(model_type, T::Phi3 | T::Glm4),
        rotary_dim,
        layers,
        moe,
        bos_token: match f.object.get("bos_token_id") {
            Some(id) => !id.is_null(),
            // Qwen2, Qwen3, their mixtures, OLMo 2 and GLM-4 default to none.
            None => !matches!(
                model_type,
                T::Qwen2 | T::Qwen2Moe | T::Qwen3 | T::Qwen3Moe | T::Olmo2 | T::Glm4
            ),
        },
        final_softcap: match model_type {
            T::Gemma2 => softcap(f, true)?,
            T::Gemma3Text => softcap(f, false)?,
            _ => false,
        },
        dtype: dtype_of(f)?,
        quantization: quantization_of(f)?,
        vision: None,
        window: f.optional_size("max_position_embeddings")?,
    })
}

/// A number among the `rope_parameters` (where transformers 5 saves the rotary's settings).
fn rope_parameter(f: &Fields, field: &str) -> Result<Option<f64>, ConfigError> {
    match f.get("rope_parameters") {
        Some(Value::Object(object)) => Fields {
            object,
            prefix: "rope_parameters.",
        }
        .float(field),
        _ => Ok(None),
    }
}

/// Whether the final logits are soft-capped: `final_logit_softcapping` not null (its class's
/// default when absent: Gemma 2's is 30, Gemma 3's none).
fn softcap(f: &Fields, default: bool) -> Result<bool, ConfigError> {
    if f.object.contains_key("final_logit_softcapping") {
        Ok(f.float("final_logit_softcapping")?.is_some())
    } else {
        Ok(default)
    }
}

/// The mixture of experts of the MoE types.
fn moe_of(model_type: ModelType, f: &Fields) -> Result<Option<Moe>, ConfigError> {
    use ModelType as T;
    // The expert count's field, and the alias that wins when both are given (transformers
    // sets an undeclared key after the declared one).
    // Per type: the expert count's field, the alias that wins when both are given (transformers
    // sets an undeclared key after the declared one), the defaults of the count, of the experts
    // per token (DeepSeek-V2 has none) and of the experts' width.
    let (declared, alias, experts, top_k, width) = match model_type {
        T::Mixtral => ("num_local_experts", Some("num_experts"), 8, Some(2), None),
        T::Qwen2Moe => ("num_experts", None, 60, Some(4), Some(1408)),
        T::Qwen3Moe => (
            "num_experts",
            Some("num_local_experts"),
            128,
            Some(8),
            Some(768),
        ),
        T::DeepseekV2 => (
            "n_routed_experts",
            Some("num_experts"),
            64,
            None,
            Some(1407),
        ),
        T::DeepseekV3 => (
            "n_routed_experts",
            Some("num_local_experts"),
            256,
            Some(8),
            Some(2048),
        ),
        _ => return Ok(None),
    };
    let field = alias.filter(|a| f.get(a).is_some()).unwrap_or(declared);
    // Qwen's MoE layers need experts (none: every layer dense); the others always have them.
    let qwen = matches!(model_type, T::Qwen2Moe | T::Qwen3Moe);
    let experts = f.count(field, experts, u64::from(!qwen))?;
    if experts == 0 {
        return Ok(None);
    }
    let top_k = f.number("num_experts_per_tok", top_k, 1, MAX_LAYERS)?;
    if top_k > experts {
        return Err(ConfigError::Invalid(format!(
            "`{}` ({top_k}) is more than the {experts} experts",
            f.name("num_experts_per_tok")
        )));
    }
    let intermediate = match width {
        None => f.size("intermediate_size")?,
        Some(w) => f.size_or("moe_intermediate_size", w)?,
    };
    let shared = match model_type {
        T::Qwen2Moe => Some(SharedExperts {
            intermediate: f.size_or("shared_expert_intermediate_size", 5632)?,
            gated: true,
        }),
        T::DeepseekV2 | T::DeepseekV3 => {
            // Zero shared experts still build empty tensors.
            let n = f.count(
                "n_shared_experts",
                if model_type == T::DeepseekV2 { 2 } else { 1 },
                0,
            )?;
            Some(SharedExperts {
                intermediate: intermediate * n,
                gated: false,
            })
        }
        _ => None,
    };
    let router = match model_type {
        T::Mixtral => Router::SoftmaxRenormalised,
        T::Qwen2Moe | T::Qwen3Moe => Router::SoftmaxTopK {
            renormalise: f.flag("norm_topk_prob", false)?,
        },
        T::DeepseekV2 => Router::DeepseekV2,
        _ => Router::DeepseekV3 {
            groups: f.count("n_group", 8, 1)?,
            top_groups: f.count("topk_group", 4, 1)?,
        },
    };
    Ok(Some(Moe {
        experts,
        top_k,
        intermediate,
        shared,
        router,
    }))
}

/// Each layer's sliding window, as the configuration class resolves `layer_types`.
fn windows_of(
    model_type: ModelType,
    f: &Fields,
    layers: u64,
) -> Result<Vec<Option<u64>>, ConfigError> {
    use ModelType as T;
    let n = usize::try_from(layers).expect("at most MAX_LAYERS layers");
    let sliding = |window: Option<u64>, is_sliding: &dyn Fn(u64) -> bool| -> Vec<Option<u64>> {
        (0..layers)
            .map(|i| window.filter(|_| is_sliding(i)))
            .collect()
    };
    let given = f.layer_types(layers)?;
    let window_field = |default: Option<u64>| -> Result<Option<u64>, ConfigError> {
        if f.object.contains_key("sliding_window") {
            f.optional_size("sliding_window")
        } else {
            Ok(default)
        }
    };
    Ok(match model_type {
        T::Llama
        | T::Olmo2
        | T::Granite
        | T::Gemma
        | T::Glm4
        | T::Cohere
        | T::DeepseekV2
        | T::DeepseekV3 => {
            vec![None; n]
        }
        T::Mistral | T::Mixtral | T::Phi3 | T::Starcoder2 => {
            let default = (model_type == T::Mistral).then_some(4096);
            let window = window_field(default)?;
            match given {
                Some(types) => types.iter().map(|&s| window.filter(|_| s)).collect(),
                None => sliding(window, &|_| true),
            }
        }
        T::Qwen2 | T::Qwen3 | T::Qwen2Moe | T::Qwen3Moe => {
            let use_sliding = f.flag("use_sliding_window", false)?;
            let window = if use_sliding {
                window_field(Some(4096))?
            } else {
                None
            };
            let max_window_layers = f.count("max_window_layers", 28, 0)?;
            match (given, model_type) {
                (Some(types), _) => types.iter().map(|&s| window.filter(|_| s)).collect(),
                (None, T::Qwen3Moe) => sliding(window, &|_| true),
                (None, T::Qwen2Moe) => {
                    sliding(window, &|i| (i + 1) % 2 == 1 && i < max_window_layers)
                }
                (None, _) => sliding(window, &|i| i >= max_window_layers),
            }
        }
        T::Gemma2 | T::Gemma3Text => {
            let window = window_field(Some(4096))?;
            match given {
                Some(types) => types.iter().map(|&s| window.filter(|_| s)).collect(),
                None if model_type == T::Gemma2 => sliding(window, &|i| (i + 1) % 2 == 1),
                None => {
                    let pattern = f.count("sliding_window_pattern", 6, 1)?;
                    sliding(window, &|i| (i + 1) % pattern != 0)
                }
            }
        }
    })
}

/// The layers of an MoE model that keep a dense MLP.
fn dense_layers_of(
    model_type: ModelType,
    f: &Fields,
    layers: u64,
) -> Result<Vec<u64>, ConfigError> {
    use ModelType as T;
    Ok(match model_type {
        T::Qwen2Moe | T::Qwen3Moe => {
            let only = f.indices("mlp_only_layers")?;
            let step = f.count("decoder_sparse_step", 1, 1)?;
            (0..layers)
                .filter(|i| only.contains(i) || (i + 1) % step != 0)
                .collect()
        }
        T::DeepseekV2 | T::DeepseekV3 => {
            let first = f.count(
                "first_k_dense_replace",
                if model_type == T::DeepseekV2 { 0 } else { 3 },
                0,
            )?;
            (0..layers.min(first)).collect()
        }
        _ => Vec::new(),
    })
}
