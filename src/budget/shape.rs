//! The shape of a decoder-only transformer (Llama, Mistral, Mixtral, Qwen families): everything a
//! memory budget needs, and the list of its weight tensors in the order a model builds them.

use serde::{Deserialize, Serialize};

/// How a layer attends to earlier positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    /// Every position attends to every earlier one; K and V kept for the whole context, shared by
    /// groups of query heads when `kv_heads` < `heads` (grouped-query attention).
    Full,
    /// Attention limited to the last `window` positions (the KV cache is bounded by the window).
    SlidingWindow,
    /// K and V compressed into a shared latent (multi-head latent attention).
    Latent,
}

impl AttentionKind {
    pub fn name(self) -> &'static str {
        match self {
            AttentionKind::Full => "full",
            AttentionKind::SlidingWindow => "sliding_window",
            AttentionKind::Latent => "latent",
        }
    }
}

impl std::str::FromStr for AttentionKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            AttentionKind::Full,
            AttentionKind::SlidingWindow,
            AttentionKind::Latent,
        ]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| format!("unknown attention kind {s:?} (full, sliding_window or latent)"))
    }
}

/// A decoder-only transformer: token embedding, `layers` × (RMSNorm, attention, RMSNorm, SwiGLU
/// MLP or mixture of SwiGLU experts), a final RMSNorm and the LM head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub layers: u64,
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (= `heads` without grouped-query attention).
    pub kv_heads: u64,
    pub head_dim: u64,
    /// The MLP's inner width (of each expert in a mixture).
    pub intermediate: u64,
    pub vocab: u64,
    /// The LM head shares the embedding's matrix.
    pub tied_embeddings: bool,
    /// Biases on the Q, K and V projections (Qwen2).
    pub attention_bias: bool,
    /// Experts per layer; 1 for a dense MLP.
    pub experts: u64,
    /// Experts each token goes through (1 for a dense MLP).
    pub experts_per_token: u64,
    pub attention: AttentionKind,
}

/// A weight tensor of the model: its name (one layer's tensors are named `layers.N.…`) and its
/// number of elements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightTensor {
    pub name: String,
    pub elements: u64,
    /// A matrix of a linear layer (quantizable, a LoRA target); vectors and embeddings are not.
    pub linear: Option<LinearTarget>,
}

/// The linear layers LoRA may adapt, by their usual module names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinearTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LinearTarget {
    pub const ALL: [LinearTarget; 7] = [
        LinearTarget::Q,
        LinearTarget::K,
        LinearTarget::V,
        LinearTarget::O,
        LinearTarget::Gate,
        LinearTarget::Up,
        LinearTarget::Down,
    ];
    /// The module name used by Hugging Face's Llama (`q_proj`, …, `down_proj`).
    pub fn module(self) -> &'static str {
        match self {
            LinearTarget::Q => "q_proj",
            LinearTarget::K => "k_proj",
            LinearTarget::V => "v_proj",
            LinearTarget::O => "o_proj",
            LinearTarget::Gate => "gate_proj",
            LinearTarget::Up => "up_proj",
            LinearTarget::Down => "down_proj",
        }
    }
}

impl std::str::FromStr for LinearTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let short = s.trim_end_matches("_proj");
        LinearTarget::ALL
            .into_iter()
            .find(|t| t.module().trim_end_matches("_proj") == short)
            .ok_or_else(|| {
                format!(
                    "unknown module {s:?} (q, k, v, o, gate, up or down, with or without _proj)"
                )
            })
    }
}

/// Why a shape is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("heads ({heads}) must be a multiple of kv_heads ({kv_heads})")]
    Grouping { heads: u64, kv_heads: u64 },
    #[error("experts_per_token ({per_token}) must be between 1 and experts ({experts})")]
    Routing { per_token: u64, experts: u64 },
    #[error("the model is too large to count in 64 bits")]
    Overflow,
    #[error("{field} = {value} is above {max}")]
    Range {
        field: &'static str,
        value: u64,
        max: u64,
    },
}

/// The most experts a layer may have: 4 096, sixteen times the most any published model has.
pub const MAX_EXPERTS: u64 = 4096;

impl ModelShape {
    /// Checks what the formulas rely on.
    pub fn validated(self) -> Result<Self, ShapeError> {
        for (field, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate", self.intermediate),
            ("vocab", self.vocab),
            ("experts", self.experts),
            ("experts_per_token", self.experts_per_token),
        ] {
            if v == 0 {
                return Err(ShapeError::Zero { field });
            }
            // Bounded before any work that loops over layers or experts.
            let max = match field {
                "layers" => crate::model::config::MAX_LAYERS,
                "experts" | "experts_per_token" => MAX_EXPERTS,
                _ => crate::model::config::MAX_SIZE,
            };
            if v > max {
                return Err(ShapeError::Range {
                    field,
                    value: v,
                    max,
                });
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ShapeError::Grouping {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        if self.experts_per_token > self.experts {
            return Err(ShapeError::Routing {
                per_token: self.experts_per_token,
                experts: self.experts,
            });
        }
        // Every later product fits if the total of the tensors does, at most 2^50 parameters.
        let parameters = self
            .try_tensors()
            .and_then(|t| t.iter().try_fold(0u64, |s, t| s.checked_add(t.elements)))
            .ok_or(ShapeError::Overflow)?;
        let max = crate::model::config::MAX_PARAMETERS;
        if parameters > max {
            return Err(ShapeError::Range {
                field: "parameters",
                value: parameters,
                max,
            });
        }
        Ok(self)
    }

    /// Width of the queries (heads × head_dim).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }
    /// Width of the keys, and of the values (kv_heads × head_dim).
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// `(out_features, in_features)` of the linear layer `target`: its weight is `[out, in]`, a
    /// LoRA adapter's A is `[rank, in]` and its B `[out, rank]`.
    pub fn linear_features(&self, target: LinearTarget) -> (u64, u64) {
        let (h, q, kv, i) = (self.hidden, self.q_dim(), self.kv_dim(), self.intermediate);
        match target {
            LinearTarget::Q => (q, h),
            LinearTarget::K | LinearTarget::V => (kv, h),
            LinearTarget::O => (h, q),
            LinearTarget::Gate | LinearTarget::Up => (i, h),
            LinearTarget::Down => (h, i),
        }
    }

    /// The weight tensors in build order: embedding, each layer, final norm, LM head (absent
    /// when tied).
    pub fn tensors(&self) -> Vec<WeightTensor> {
        self.try_tensors().expect("a validated shape")
    }

    fn try_tensors(&self) -> Option<Vec<WeightTensor>> {
        let mul = |a: u64, b: u64| a.checked_mul(b);
        let (h, q, kv) = (self.hidden, self.q_dim(), self.kv_dim());
        let tensor = |name: String, elements: u64, linear| WeightTensor {
            name,
            elements,
            linear,
        };
        let linear = |name: String, target: LinearTarget| {
            let (out, inp) = self.linear_features(target);
            Some(tensor(name, mul(out, inp)?, Some(target)))
        };
        let mut out = vec![tensor("embed_tokens".into(), mul(self.vocab, h)?, None)];
        for l in 0..self.layers {
            let n = |part: &str| format!("layers.{l}.{part}");
            out.push(tensor(n("input_layernorm"), h, None));
            for target in [LinearTarget::Q, LinearTarget::K, LinearTarget::V] {
                out.push(linear(n(target.module()), target)?);
            }
            if self.attention_bias {
                out.push(tensor(n("q_proj.bias"), q, None));
                out.push(tensor(n("k_proj.bias"), kv, None));
                out.push(tensor(n("v_proj.bias"), kv, None));
            }
            out.push(linear(n(LinearTarget::O.module()), LinearTarget::O)?);
            out.push(tensor(n("post_attention_layernorm"), h, None));
            if self.experts > 1 {
                out.push(tensor(n("router"), mul(self.experts, h)?, None));
            }
            for e in 0..self.experts {
                let m = |part: &str| {
                    if self.experts > 1 {
                        n(&format!("experts.{e}.{part}"))
                    } else {
                        n(part)
                    }
                };
                for target in [LinearTarget::Gate, LinearTarget::Up, LinearTarget::Down] {
                    out.push(linear(m(target.module()), target)?);
                }
            }
        }
        out.push(tensor("norm".into(), h, None));
        if !self.tied_embeddings {
            out.push(tensor("lm_head".into(), mul(self.vocab, h)?, None));
        }
        out.iter()
            .try_fold(0u64, |sum, t| sum.checked_add(t.elements))?;
        Some(out)
    }

    /// Number of parameters.
    pub fn parameters(&self) -> u64 {
        self.tensors().iter().map(|t| t.elements).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-2 7B's published configuration.
    fn llama2_7b() -> ModelShape {
        ModelShape {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            intermediate: 11008,
            vocab: 32000,
            tied_embeddings: false,
            attention_bias: false,
            experts: 1,
            experts_per_token: 1,
            attention: AttentionKind::Full,
        }
    }

    #[test]
    fn llama2_7b_has_its_published_parameter_count() {
        // 6 738 415 616, the count Hugging Face reports for meta-llama/Llama-2-7b-hf.
        assert_eq!(llama2_7b().validated().unwrap().parameters(), 6_738_415_616);
    }

    #[test]
    fn mixtral_counts_every_expert_and_the_router() {
        let mixtral = ModelShape {
            hidden: 4096,
            intermediate: 14336,
            kv_heads: 8,
            experts: 8,
            experts_per_token: 2,
            ..llama2_7b()
        };
        // 46 702 792 704, Mixtral-8x7B-v0.1's published count.
        assert_eq!(mixtral.validated().unwrap().parameters(), 46_702_792_704);
    }

    #[test]
    fn refusals_name_the_field() {
        let zero = ModelShape {
            kv_heads: 0,
            ..llama2_7b()
        };
        assert_eq!(
            zero.validated().unwrap_err().to_string(),
            "kv_heads must be at least 1"
        );
        let grouping = ModelShape {
            kv_heads: 5,
            ..llama2_7b()
        };
        assert!(matches!(
            grouping.validated(),
            Err(ShapeError::Grouping { .. })
        ));
        let huge = ModelShape {
            vocab: u64::MAX / 2,
            ..llama2_7b()
        };
        assert_eq!(
            huge.validated(),
            Err(ShapeError::Range {
                field: "vocab",
                value: u64::MAX / 2,
                max: 1 << 24
            })
        );
        // Sizes within their bounds whose tensors together pass 2^50 parameters.
        let many = ModelShape {
            layers: 4096,
            hidden: 1 << 20,
            intermediate: 1 << 20,
            ..llama2_7b()
        };
        assert!(matches!(
            many.validated(),
            Err(ShapeError::Range {
                field: "parameters",
                ..
            })
        ));
    }
}
