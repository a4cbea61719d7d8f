//! The parameter tensors of a [`Model`], named and shaped as transformers names them, in the
//! order `named_parameters()` yields them (a tied LM head counted once, as `parameters()` does).

use super::{Attention, Layer, Mlp, Model, ModelType, QkNorm};

/// What a parameter is, for storage formats and adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    /// The token embedding (and a tied LM head).
    Embedding,
    /// An untied LM head.
    LmHead,
    /// A layer's linear projection (quantizable; a LoRA target by its module name).
    Linear,
    /// Fused 3-D expert weights `[experts, out, in]`.
    Experts,
    /// A router's weight `[experts, hidden]`.
    Router,
    /// A norm's weight or a bias.
    Vector,
    /// A tensor no adapter or quantizer takes: a convolution's weight, a position embedding,
    /// the vision projector's matrix.
    Other,
    /// A buffer of int64 position indices.
    Positions,
}

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Parameter {
    /// `model.layers.3.self_attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<u64>,
    pub role: TensorRole,
}

impl Parameter {
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// [`Parameter::elements`], `None` past 2^64.
    /// The element type of a model's buffer: int64 positions, float32 otherwise.
    pub fn buffer_dtype(&self) -> crate::dtype::Dtype {
        match self.role {
            TensorRole::Positions => crate::dtype::Dtype::Int64,
            _ => crate::dtype::Dtype::Float32,
        }
    }

    /// The element type of a model's buffer in a model made in `dtype`: Gemma's `embed_scale`
    /// is a tensor of the default type, the model's; the others as [`Parameter::buffer_dtype`].
    pub fn buffer_dtype_in(&self, dtype: crate::dtype::Dtype) -> crate::dtype::Dtype {
        match self.name.ends_with(".embed_scale") {
            true => dtype,
            false => self.buffer_dtype(),
        }
    }

    pub fn checked_elements(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }

    /// The module's short name (`q_proj`, `gate_up_proj`): the name LoRA targets use.
    pub fn module(&self) -> &str {
        let mut parts = self.name.rsplit('.');
        let last = parts.next().unwrap_or("");
        if last == "weight" || last == "bias" {
            parts.next().unwrap_or(last)
        } else {
            last
        }
    }

    pub fn is_bias(&self) -> bool {
        self.name.ends_with(".bias")
    }

    /// Whether it is a linear layer's weight (what PEFT's targets name by its module).
    pub fn is_linear_weight(&self) -> bool {
        self.role == TensorRole::Linear && !self.is_bias()
    }

    /// Whether a text-only run uses the tensor (not the vision tower's or its projector's):
    /// only those get gradients.
    pub fn used_by_text(&self) -> bool {
        !self.name.starts_with(VISION_TOWER) && !self.name.starts_with(PROJECTOR)
    }
}

const VISION_TOWER: &str = "model.vision_tower.";
const PROJECTOR: &str = "model.multi_modal_projector.";

struct List(Vec<Parameter>);

impl List {
    fn push(&mut self, name: String, shape: &[u64], role: TensorRole) {
        self.0.push(Parameter {
            name,
            shape: shape.to_vec(),
            role,
        });
    }
    fn linear(&mut self, prefix: &str, out: u64, inp: u64, bias: bool) {
        self.push(format!("{prefix}.weight"), &[out, inp], TensorRole::Linear);
        if bias {
            self.push(format!("{prefix}.bias"), &[out], TensorRole::Vector);
        }
    }
    fn norm(&mut self, prefix: &str, width: u64) {
        self.push(format!("{prefix}.weight"), &[width], TensorRole::Vector);
    }
    /// A LayerNorm: its weight and bias.
    fn layer_norm(&mut self, prefix: &str, width: u64) {
        self.norm(prefix, width);
        self.push(format!("{prefix}.bias"), &[width], TensorRole::Vector);
    }
}

impl Model {
    /// Every parameter tensor.
    pub fn parameters(&self) -> Vec<Parameter> {
        let mut p = List(Vec::new());
        self.push_parameters(&mut p, |p, i, layer| self.push_layer(p, i, layer));
        p.0
    }

    /// Every parameter tensor in the order the modules make them, each decoder layer's pushed
    /// by `each_layer` (its index and specification).
    fn push_parameters(&self, p: &mut List, mut each_layer: impl FnMut(&mut List, usize, &Layer)) {
        let (h, v) = (self.hidden, self.vocab);
        if let Some(vision) = self.vision {
            self.push_vision(p, vision);
        }
        let text = self.text_prefix();
        p.push(
            format!("{text}embed_tokens.weight"),
            &[v, h],
            TensorRole::Embedding,
        );
        for (i, layer) in self.layers.iter().enumerate() {
            each_layer(p, i, layer);
        }
        match self.model_type.is_starcoder2() {
            true => p.layer_norm(&format!("{text}norm"), h),
            false => p.norm(&format!("{text}norm"), h),
        }
        if !self.tied_embeddings {
            p.push("lm_head.weight".into(), &[v, h], TensorRole::LmHead);
        }
    }

    /// Decoder layer `i`'s parameters.
    fn push_layer(&self, p: &mut List, i: usize, layer: &Layer) {
        let h = self.hidden;
        let l = format!("{}layers.{i}", self.text_prefix());
        self.push_attention(p, &l);
        match layer.mlp {
            Mlp::Dense { intermediate } => self.push_dense(p, &format!("{l}.mlp"), intermediate),
            Mlp::Experts => self.push_experts(p, &format!("{l}.mlp")),
        }
        let norm = |p: &mut List, name: &str| match self.model_type.is_starcoder2() {
            true => p.layer_norm(&format!("{l}.{name}"), h),
            false => p.norm(&format!("{l}.{name}"), h),
        };
        if !self.model_type.norms_after_blocks() {
            norm(p, "input_layernorm");
        }
        if !self.model_type.is_cohere() {
            norm(p, "post_attention_layernorm");
        }
        if self.model_type.norms_after_blocks() {
            p.norm(&format!("{l}.post_feedforward_layernorm"), h);
        }
        if self.model_type.has_sandwich_norms() {
            p.norm(&format!("{l}.pre_feedforward_layernorm"), h);
            p.norm(&format!("{l}.post_feedforward_layernorm"), h);
        }
        if self.model_type.has_output_norms() {
            p.norm(&format!("{l}.post_self_attn_layernorm"), h);
            p.norm(&format!("{l}.post_mlp_layernorm"), h);
        }
    }

    /// The buffers the model holds on the GPU besides its parameters, in `named_buffers()`
    /// order: the vision tower's patch positions (int64), then float32 ones: Gemma's embedding
    /// scale, DeepSeek-V3's routers' score corrections, the rotary frequencies (with their
    /// originals; Gemma 3 one pair per attention kind present).
    pub fn buffers(&self) -> Vec<Parameter> {
        let mut b = List(Vec::new());
        if let Some(vision) = self.vision {
            b.push(
                format!("{VISION_TOWER}embeddings.position_ids"),
                &[1, vision.positions],
                TensorRole::Positions,
            );
        }
        let text = self.text_prefix();
        if self.model_type.is_gemma() {
            b.push(
                format!("{text}embed_tokens.embed_scale"),
                &[],
                TensorRole::Vector,
            );
        }
        if self.model_type == ModelType::DeepseekV3 {
            let experts = self.moe.map_or(0, |m| m.experts);
            for (i, l) in self.layers.iter().enumerate() {
                if l.mlp == Mlp::Experts {
                    b.push(
                        format!("{text}layers.{i}.mlp.gate.e_score_correction_bias"),
                        &[experts],
                        TensorRole::Vector,
                    );
                }
            }
        }
        let half = self.rotary_dim.div_ceil(2);
        let mut kinds: Vec<&str> = Vec::new();
        if self.model_type == ModelType::Gemma3Text {
            if self.has_global_layers() {
                kinds.push("full_attention_");
            }
            if self.has_sliding_layers() {
                kinds.push("sliding_attention_");
            }
        } else {
            kinds.push("");
        }
        for k in kinds {
            b.push(
                format!("{text}rotary_emb.{k}inv_freq"),
                &[half],
                TensorRole::Vector,
            );
            b.push(
                format!("{text}rotary_emb.{k}original_inv_freq"),
                &[half],
                TensorRole::Vector,
            );
        }
        b.0
    }

    /// The number of parameters (what `sum(p.numel() for p in model.parameters())` gives).
    pub fn parameter_count(&self) -> u64 {
        self.checked_parameter_count()
            .expect("a model's parameters counted below 2^64 (bounded as it is built)")
    }

    /// The number of parameters, `None` past 2^64. Layers of the same specification hold the
    /// same tensors but for their names: each specification's are listed once.
    pub fn checked_parameter_count(&self) -> Option<u64> {
        let elements = |list: &List| {
            list.0
                .iter()
                .try_fold(0u64, |sum, p| sum.checked_add(p.checked_elements()?))
        };
        let mut per_layer: Vec<(Layer, Option<u64>)> = Vec::new();
        let mut in_layers = Some(0u64);
        let mut p = List(Vec::new());
        self.push_parameters(&mut p, |_, i, layer| {
            let count = match per_layer.iter().find(|(l, _)| l == layer) {
                Some(&(_, count)) => count,
                None => {
                    let mut one = List(Vec::new());
                    self.push_layer(&mut one, i, layer);
                    let count = elements(&one);
                    per_layer.push((*layer, count));
                    count
                }
            };
            in_layers = in_layers.zip(count).and_then(|(a, b)| a.checked_add(b));
        });
        in_layers
            .zip(elements(&p))
            .and_then(|(a, b)| a.checked_add(b))
    }

    /// SigLIP's vision tower (with its pooling head where it has one) and Gemma 3's projector,
    /// in the order their modules make them.
    fn push_vision(&self, p: &mut List, v: super::Vision) {
        let t = VISION_TOWER;
        let (h, i) = (v.hidden, v.intermediate);
        p.push(
            format!("{t}embeddings.patch_embedding.weight"),
            &[h, v.channels, v.patch, v.patch],
            TensorRole::Other,
        );
        p.push(
            format!("{t}embeddings.patch_embedding.bias"),
            &[h],
            TensorRole::Vector,
        );
        p.push(
            format!("{t}embeddings.position_embedding.weight"),
            &[v.positions, h],
            TensorRole::Other,
        );
        for layer in 0..v.layers {
            let l = format!("{t}encoder.layers.{layer}");
            p.layer_norm(&format!("{l}.layer_norm1"), h);
            for proj in ["k_proj", "v_proj", "q_proj", "out_proj"] {
                p.linear(&format!("{l}.self_attn.{proj}"), h, h, true);
            }
            p.layer_norm(&format!("{l}.layer_norm2"), h);
            p.linear(&format!("{l}.mlp.fc1"), i, h, true);
            p.linear(&format!("{l}.mlp.fc2"), h, i, true);
        }
        p.layer_norm(&format!("{t}post_layernorm"), h);
        if v.head {
            // SiglipMultiheadAttentionPoolingHead: a probe, `nn.MultiheadAttention`, a norm, an MLP.
            let a = format!("{t}head.attention");
            p.push(format!("{t}head.probe"), &[1, 1, h], TensorRole::Other);
            p.push(
                format!("{a}.in_proj_weight"),
                &[3 * h, h],
                TensorRole::Other,
            );
            p.push(format!("{a}.in_proj_bias"), &[3 * h], TensorRole::Vector);
            p.linear(&format!("{a}.out_proj"), h, h, true);
            p.layer_norm(&format!("{t}head.layernorm"), h);
            p.linear(&format!("{t}head.mlp.fc1"), i, h, true);
            p.linear(&format!("{t}head.mlp.fc2"), h, i, true);
        }
        p.push(
            format!("{PROJECTOR}mm_input_projection_weight"),
            &[h, self.hidden],
            TensorRole::Other,
        );
        p.norm(&format!("{PROJECTOR}mm_soft_emb_norm"), h);
    }

    fn push_attention(&self, p: &mut List, l: &str) {
        let (h, d) = (self.hidden, self.head_dim);
        let a = format!("{l}.self_attn");
        match self.attention {
            Attention::Standard {
                q_bias,
                kv_bias,
                o_bias,
                fused_qkv,
                qk_norm,
            } => {
                let (q, kv) = (self.q_dim(), self.kv_dim());
                if fused_qkv {
                    p.linear(&format!("{a}.o_proj"), h, q, o_bias);
                    p.linear(&format!("{a}.qkv_proj"), q + 2 * kv, h, q_bias);
                    return;
                }
                p.linear(&format!("{a}.q_proj"), q, h, q_bias);
                p.linear(&format!("{a}.k_proj"), kv, h, kv_bias);
                p.linear(&format!("{a}.v_proj"), kv, h, kv_bias);
                p.linear(&format!("{a}.o_proj"), h, q, o_bias);
                match qk_norm {
                    QkNorm::None => {}
                    QkNorm::Projection => {
                        p.norm(&format!("{a}.q_norm"), q);
                        p.norm(&format!("{a}.k_norm"), kv);
                    }
                    QkNorm::BeforeTranspose | QkNorm::AfterTranspose => {
                        p.norm(&format!("{a}.q_norm"), d);
                        p.norm(&format!("{a}.k_norm"), d);
                    }
                }
            }
            Attention::Latent(m) => {
                let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                match m.q_lora_rank {
                    None => p.linear(&format!("{a}.q_proj"), self.heads * qk, h, false),
                    Some(r) => {
                        p.linear(&format!("{a}.q_a_proj"), r, h, m.bias);
                        p.norm(&format!("{a}.q_a_layernorm"), r);
                        p.linear(&format!("{a}.q_b_proj"), self.heads * qk, r, false);
                    }
                }
                p.linear(
                    &format!("{a}.kv_a_proj_with_mqa"),
                    m.kv_lora_rank + m.qk_rope_head_dim,
                    h,
                    m.bias,
                );
                p.norm(&format!("{a}.kv_a_layernorm"), m.kv_lora_rank);
                p.linear(
                    &format!("{a}.kv_b_proj"),
                    self.heads * (m.qk_nope_head_dim + m.v_head_dim),
                    m.kv_lora_rank,
                    false,
                );
                p.linear(&format!("{a}.o_proj"), h, self.heads * m.v_head_dim, m.bias);
            }
        }
    }

    fn push_dense(&self, p: &mut List, m: &str, intermediate: u64) {
        let h = self.hidden;
        if self.model_type.is_starcoder2() {
            p.linear(&format!("{m}.c_fc"), intermediate, h, self.mlp_bias);
            p.linear(&format!("{m}.c_proj"), h, intermediate, self.mlp_bias);
            return;
        }
        if self.fused_gate_up {
            p.linear(&format!("{m}.gate_up_proj"), 2 * intermediate, h, false);
        } else {
            p.linear(&format!("{m}.gate_proj"), intermediate, h, self.mlp_bias);
            p.linear(&format!("{m}.up_proj"), intermediate, h, self.mlp_bias);
        }
        p.linear(&format!("{m}.down_proj"), h, intermediate, self.mlp_bias);
    }

    fn push_experts(&self, p: &mut List, m: &str) {
        let moe = self.moe.expect("an MoE layer has the model's experts");
        let (h, e, i) = (self.hidden, moe.experts, moe.intermediate);
        let router = |p: &mut List| p.push(format!("{m}.gate.weight"), &[e, h], TensorRole::Router);
        let experts = |p: &mut List| {
            p.push(
                format!("{m}.experts.gate_up_proj"),
                &[e, 2 * i, h],
                TensorRole::Experts,
            );
            p.push(
                format!("{m}.experts.down_proj"),
                &[e, h, i],
                TensorRole::Experts,
            );
        };
        // The router comes first where the layer builds it first.
        if matches!(self.model_type, ModelType::Mixtral | ModelType::Qwen2Moe) {
            router(p);
            experts(p);
        } else {
            experts(p);
            router(p);
        }
        if let Some(shared) = moe.shared {
            let name = if self.model_type == ModelType::Qwen2Moe {
                "shared_expert"
            } else {
                "shared_experts"
            };
            let s = format!("{m}.{name}");
            let bias = self.mlp_bias;
            p.linear(&format!("{s}.gate_proj"), shared.intermediate, h, bias);
            p.linear(&format!("{s}.up_proj"), shared.intermediate, h, bias);
            p.linear(&format!("{s}.down_proj"), h, shared.intermediate, bias);
            if shared.gated {
                p.linear(&format!("{m}.shared_expert_gate"), 1, h, false);
            }
        }
    }
}
