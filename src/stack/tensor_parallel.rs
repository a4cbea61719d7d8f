//! One rank of transformers 5.17's tensor parallelism serving a model
//! (`from_pretrained(..., tp_plan="auto")` then `generate`), read from
//! `transformers/distributed/tensor_parallel.py` and `core_model_loading.py`:
//!
//! - the plan of the dense decoders (`base_model_tp_plan`): queries, keys, values, gate and up
//!   projections split by rows ("colwise"), the output and down projections by columns
//!   ("rowwise"), the head by rows ("colwise_gather_output"); the embeddings and norms whole;
//! - loading: each rank reads its own slice (`DtensorShardOperation.shard_tensor`) in the
//!   checkpoint's order after the allocator's warm-up, which counts a split tensor's bytes
//!   divided by the world;
//! - the forward without grad runs the local kernels: the rank's heads and its part of the MLP's
//!   width, the row-parallel outputs all-reduced in place (nothing allocated);
//! - the head's logits gathered (`all_gather_into_tensor` along the first dimension, then
//!   `_maybe_view_chunk_cat` onto the last: a copy unless every dimension before it is 1).
//!
//! With every split even, every rank allocates alike.

use crate::model::{Attention, Mlp, Model, ModelType, Parameter, TensorRole};

/// This process as rank `rank` of `world` in a tensor-parallel run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorParallel {
    pub world: u64,
    pub rank: u64,
}

/// What the plan splits over the ranks, each count named: the heads, the key-value heads, the
/// head's rows (the vocabulary) and each dense MLP's width.
fn even_splits(model: &Model) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    let dense_widths = model.layers.iter().filter_map(|l| match l.mlp {
        Mlp::Dense { intermediate } => Some(intermediate),
        Mlp::Experts => None,
    });
    [
        ("attention heads", model.heads),
        ("key and value heads", model.kv_heads),
        ("vocabulary", model.vocab),
    ]
    .into_iter()
    .chain(dense_widths.map(|i| ("MLP width", i)))
}

/// The most ranks, up to `gpus`, that split `model` evenly (1 when no more do): the largest
/// divisor of every count the plan splits.
pub fn most_ranks(model: &Model, gpus: u64) -> u64 {
    let gcd = |a: u64, b: u64| -> u64 {
        let (mut a, mut b) = (a, b);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let common = even_splits(model).fold(0, |g, (_, n)| gcd(g, n));
    (1..=gpus.min(common))
        .rev()
        .find(|w| common % w == 0)
        .unwrap_or(1)
}

impl TensorParallel {
    /// Why `model` cannot be served this way as emulated (`None`: it can).
    pub fn refusal(&self, model: &Model) -> Option<String> {
        let w = self.world;
        let standard_plan = matches!(
            model.model_type,
            ModelType::Llama
                | ModelType::Mistral
                | ModelType::Qwen2
                | ModelType::Qwen3
                | ModelType::Granite
                | ModelType::Gemma
                | ModelType::Gemma2
                | ModelType::Gemma3Text
        );
        if !standard_plan || model.moe.is_some() || model.vision.is_some() {
            return Some(format!(
                "tensor parallelism is emulated for dense decoders whose plan splits q, k, v, gate \
                 and up by rows and o and down by columns (not {})",
                model.type_name()
            ));
        }
        if model.tied_embeddings {
            return Some(
                "tensor parallelism of a model with tied embeddings is not yet emulated".into(),
            );
        }
        let biased_rows = match model.attention {
            Attention::Standard { o_bias, .. } => o_bias || model.mlp_bias,
            Attention::Latent(_) => true,
        };
        if biased_rows {
            return Some(
                "tensor parallelism of row-split projections with a bias is not yet emulated"
                    .into(),
            );
        }
        for (what, n) in even_splits(model) {
            if n % w != 0 {
                return Some(format!(
                    "{n} {what} do not split evenly over {w} GPUs (transformers' plan needs whole \
                     heads and the head's rows split evenly)"
                ));
            }
        }
        None
    }

    /// The model as this rank runs it: its share of the heads and of each MLP's width (the
    /// head's rows are split as it loads, [`TensorParallel::parameters`]).
    pub fn rank_model(&self, model: &Model) -> Model {
        let w = self.world;
        let mut local = model.clone();
        local.heads /= w;
        local.kv_heads /= w;
        local.intermediate /= w;
        for layer in &mut local.layers {
            if let Mlp::Dense { intermediate } = &mut layer.mlp {
                *intermediate /= w;
            }
        }
        local
    }

    /// The parameters this rank loads, of its model ([`TensorParallel::rank_model`]): the head's
    /// rows split too.
    pub fn parameters(&self, rank_model: &Model) -> Vec<Parameter> {
        let mut params = rank_model.parameters();
        for t in &mut params {
            if t.role == TensorRole::LmHead {
                t.shape[0] /= self.world;
            }
        }
        params
    }

    /// The head's logits of `local` shape gathered over the ranks (`colwise_gather_output`).
    pub fn gathered_logits(&self, local: &[u64]) -> GatheredLogits {
        let mut stacked = local.to_vec();
        stacked[0] *= self.world;
        let mut logits = local.to_vec();
        *logits.last_mut().expect("logits have dimensions") *= self.world;
        let before_last: u64 = local[..local.len() - 1].iter().product();
        GatheredLogits {
            stacked,
            logits,
            copied: before_last != 1,
        }
    }
}

/// How the ranks' logits are gathered: `all_gather_into_tensor` stacks them along the first
/// dimension, then `_maybe_view_chunk_cat` moves them onto the last: a view when every dimension
/// before the last is 1, else a copy.
#[derive(Debug, PartialEq, Eq)]
pub struct GatheredLogits {
    pub stacked: Vec<u64>,
    pub logits: Vec<u64>,
    pub copied: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Workload;

    fn model(preset: &str) -> Model {
        Workload::preset(preset).unwrap().model
    }

    #[test]
    fn a_rank_holds_its_share_of_the_heads_the_mlp_and_the_head() {
        // Llama 3.1 70B over 8: 8 query heads and 1 key-value head of 128, 3 584 of the MLP's
        // 28 672, 16 032 of the head's 128 256 rows; the embeddings and norms whole.
        let full = model("llama-3.1-70b");
        let tp = TensorParallel { world: 8, rank: 7 };
        assert_eq!(tp.refusal(&full), None);
        let local = tp.rank_model(&full);
        assert_eq!(
            (local.heads, local.kv_heads, local.intermediate),
            (8, 1, 3584)
        );
        let shape = |name: &str| {
            let params = tp.parameters(&local);
            params.into_iter().find(|p| p.name == name).unwrap().shape
        };
        assert_eq!(shape("lm_head.weight"), [16032, 8192]);
        assert_eq!(shape("model.embed_tokens.weight"), [128256, 8192]);
        assert_eq!(
            shape("model.layers.0.self_attn.q_proj.weight"),
            [1024, 8192]
        );
        assert_eq!(shape("model.layers.0.self_attn.k_proj.weight"), [128, 8192]);
        assert_eq!(
            shape("model.layers.0.self_attn.o_proj.weight"),
            [8192, 1024]
        );
        assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), [8192, 3584]);
        assert_eq!(shape("model.norm.weight"), [8192]);
    }

    #[test]
    fn what_transformers_cannot_split_evenly_or_is_not_emulated_is_refused() {
        let tp = |world| TensorParallel { world, rank: 0 };
        // 8 key-value heads over 16 GPUs: half a head each.
        let why = tp(16).refusal(&model("llama-3.1-70b")).unwrap();
        assert!(why.contains("8 key and value heads"), "{why}");
        // 28 heads over 8.
        assert!(tp(8).refusal(&model("qwen2.5-7b")).is_some());
        assert_eq!(tp(4).refusal(&model("qwen2.5-7b")), None);
        // Tied embeddings, experts, Phi-3's fused projections (gathered rather than split).
        assert!(tp(2)
            .refusal(&model("gemma-2-9b"))
            .unwrap()
            .contains("tied"));
        assert!(tp(2).refusal(&model("mixtral-8x7b")).is_some());
        assert!(tp(2).refusal(&model("phi-3-mini")).is_some());
        // The most ranks that split them, as the refusals say.
        let seventy = model("llama-3.1-70b");
        assert_eq!(
            [2, 7, 12, 64].map(|g| most_ranks(&seventy, g)),
            [2, 4, 8, 8]
        );
        assert_eq!(most_ranks(&model("qwen2.5-7b"), 8), 4);
        for g in 2..=16 {
            let most = most_ranks(&seventy, g);
            assert_eq!(tp(most).refusal(&seventy), None);
            assert!((most + 1..=g).all(|w| tp(w).refusal(&seventy).is_some()));
        }
    }

    #[test]
    fn logits_are_gathered_as_a_copy_unless_all_but_the_last_dimension_are_one() {
        let tp = TensorParallel { world: 4, rank: 0 };
        let gathered = |stacked: [u64; 3], logits: [u64; 3], copied| GatheredLogits {
            stacked: stacked.to_vec(),
            logits: logits.to_vec(),
            copied,
        };
        let one = gathered([4, 1, 1000], [1, 1, 4000], false);
        assert_eq!(tp.gathered_logits(&[1, 1, 1000]), one);
        let three = gathered([12, 1, 1000], [3, 1, 4000], true);
        assert_eq!(tp.gathered_logits(&[3, 1, 1000]), three);
    }
}
