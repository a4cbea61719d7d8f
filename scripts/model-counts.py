#!/usr/bin/env python3
"""What Hugging Face transformers itself counts for small model configurations.

Usage:
    python3 scripts/model-counts.py OUT.json           write the fixture
    python3 scripts/model-counts.py --check FIX.json   recompute every entry of FIX.json from its
                                                       own `config`; exit 1 printing the
                                                       differences if anything differs

Needs torch and transformers (the fixture in tests/fixtures/model-counts.json was written with
transformers 5.17.0); no network, no GPU: every model is built on the meta device.

For each configuration: `cfg = AutoConfig.for_model(model_type, **fields)`, then
`AutoModelForCausalLM.from_config(cfg)` inside `with torch.device("meta"):`, and the entry records

  name, model_type, config        the fields exactly as a config.json holds them, model_type included
  auto_class                      the class AutoModelForCausalLM picks for the config
  class                           the class counted (the same)
  parameters                      sum(p.numel() for p in model.parameters()) (tied weights once)
  layer_tensor_count              the number of parameter tensors named_parameters() yields
  tensors                         [name, shape] in named_parameters() order; for more than 3
                                  layers only the tensors of layers 0..2 and the non-layer ones
                                  (tensors_truncated says so)
  buffer_count, buffers           [name, shape, dtype] from named_buffers(), truncated the same way
  layer_types, sliding_window     as the built config resolved them (null when absent)
  resolved                        head_dim, num_key_value_heads, tie_word_embeddings and the
                                  expert counts as the built config resolved them
  mlp_only_layers, decoder_sparse_step, first_k_dense_replace    where the config has them

gemma3: AutoModelForCausalLM builds Gemma3ForConditionalGeneration for a Gemma3Config in
transformers 5.17: the SigLIP vision tower and its projector beside the text model, all counted
(the layer fields above are the text config's).

Entries with `refused` record configurations transformers rejects (the exception's type and its
message, whitespace collapsed) instead of counts.
"""

import json
import re
import sys
import warnings

WRITTEN_WITH = "5.17.0"

# Width-like fields: within one configuration they must all be distinct numbers (and distinct from
# heads * head_dim), so that a formula using the wrong one cannot give the right shape by accident.
WIDTH_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "head_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)


def c(name, model_type, **fields):
    return {"name": name, "config": {"model_type": model_type, **fields}}


def g3(name, top=None, **text_fields):
    """A gemma3 (multimodal) config.json whose text_config holds the fields."""
    config = {"model_type": "gemma3", **(top or {}), "text_config": {"model_type": "gemma3_text", **text_fields}}
    return {"name": name, "config": config}


CONFIGS = [
    # ---- llama: head_dim defaults to hidden/heads, kv heads to heads; attention_bias, mlp_bias
    c("llama-defaults", "llama", hidden_size=320, intermediate_size=864, vocab_size=2011,
      num_hidden_layers=2, num_attention_heads=5),
    c("llama-gqa-tied", "llama", hidden_size=384, intermediate_size=1000, vocab_size=1537,
      num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True),
    c("llama-attn-and-mlp-bias", "llama", hidden_size=288, intermediate_size=776, vocab_size=2203,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
      attention_bias=True, mlp_bias=True),
    c("llama-head-dim-5-layers", "llama", hidden_size=256, intermediate_size=688, vocab_size=1733,
      num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=40,
      attention_bias=True, mlp_bias=False, tie_word_embeddings=False),
    c("llama-mlp-bias-tied", "llama", hidden_size=448, intermediate_size=1184, vocab_size=2789,
      num_hidden_layers=4, num_attention_heads=7, num_key_value_heads=7, mlp_bias=True,
      tie_word_embeddings=True),
    # ---- mistral: num_key_value_heads defaults to 8 (not heads); head_dim null or absent -> hidden//heads
    c("mistral-mqa", "mistral", hidden_size=352, intermediate_size=928, vocab_size=1907,
      num_hidden_layers=2, num_attention_heads=11, num_key_value_heads=1),
    c("mistral-kv-default-8", "mistral", hidden_size=416, intermediate_size=1120, vocab_size=2477,
      num_hidden_layers=3, num_attention_heads=16),
    c("mistral-hidden-not-multiple-tied", "mistral", hidden_size=330, intermediate_size=870,
      vocab_size=1301, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      tie_word_embeddings=True),
    c("mistral-head-dim-6-layers", "mistral", hidden_size=480, intermediate_size=1248,
      vocab_size=2099, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=3,
      head_dim=96, sliding_window=None),
    c("mistral-head-dim-null", "mistral", hidden_size=200, intermediate_size=536, vocab_size=997,
      num_hidden_layers=1, num_attention_heads=5, num_key_value_heads=5, head_dim=None),
    # ---- mixtral: num_local_experts (alias num_experts) default 8, kv heads default 8
    c("mixtral-4-experts", "mixtral", hidden_size=256, intermediate_size=344, vocab_size=1499,
      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, num_local_experts=4,
      num_experts_per_tok=2),
    c("mixtral-alias-num-experts-tied", "mixtral", hidden_size=320, intermediate_size=424,
      vocab_size=1811, num_hidden_layers=4, num_attention_heads=16, num_experts=3,
      num_experts_per_tok=2, tie_word_embeddings=True),
    c("mixtral-head-dim", "mixtral", hidden_size=192, intermediate_size=520, vocab_size=2311,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, head_dim=56,
      num_local_experts=6, num_experts_per_tok=1),
    c("mixtral-experts-default-8", "mixtral", hidden_size=368, intermediate_size=296,
      vocab_size=1187, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1),
    c("mixtral-both-expert-names", "mixtral", hidden_size=176, intermediate_size=232,
      vocab_size=1847, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
      num_local_experts=5, num_experts=3, num_experts_per_tok=1),
    # ---- qwen2: q/k/v always biased; num_key_value_heads defaults to 32; head_dim not a field but honoured
    c("qwen2-mqa-tied", "qwen2", hidden_size=320, intermediate_size=880, vocab_size=2039,
      num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1, tie_word_embeddings=True),
    c("qwen2-kv-default-32", "qwen2", hidden_size=256, intermediate_size=712, vocab_size=1607,
      num_hidden_layers=3, num_attention_heads=8),
    c("qwen2-head-dim-4-layers", "qwen2", hidden_size=384, intermediate_size=1056,
      vocab_size=2543, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
      head_dim=80),
    c("qwen2-sliding-attention-bias-ignored", "qwen2", hidden_size=224, intermediate_size=600,
      vocab_size=1201, num_hidden_layers=2, num_attention_heads=7, num_key_value_heads=7,
      use_sliding_window=True, sliding_window=128, max_window_layers=1, attention_bias=False),
    # ---- qwen3: head_dim defaults to 128, kv heads to 32; q_norm/k_norm; attention_bias
    c("qwen3-head-dim-default-128", "qwen3", hidden_size=320, intermediate_size=896,
      vocab_size=1931, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    c("qwen3-head-dim-tied", "qwen3", hidden_size=288, intermediate_size=744, vocab_size=2269,
      num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3, head_dim=40,
      tie_word_embeddings=True),
    c("qwen3-attention-bias-4-layers", "qwen3", hidden_size=384, intermediate_size=1064,
      vocab_size=1409, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
      head_dim=56, attention_bias=True),
    c("qwen3-kv-default-32-bias-tied", "qwen3", hidden_size=256, intermediate_size=680,
      vocab_size=2851, num_hidden_layers=2, num_attention_heads=4, head_dim=36,
      attention_bias=True, tie_word_embeddings=True),
    c("qwen3-sliding-6-layers", "qwen3", hidden_size=448, intermediate_size=1216, vocab_size=1013,
      num_hidden_layers=6, num_attention_heads=7, num_key_value_heads=1, head_dim=72,
      use_sliding_window=True, sliding_window=256, max_window_layers=4),
    # ---- qwen2_moe: shared expert + its gate, qkv_bias, decoder_sparse_step, mlp_only_layers, kv default 16
    c("qwen2_moe-basic", "qwen2_moe", hidden_size=256, intermediate_size=704, vocab_size=1531,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
      num_experts_per_tok=2, moe_intermediate_size=96, shared_expert_intermediate_size=344),
    c("qwen2_moe-no-qkv-bias-sparse-step-2", "qwen2_moe", hidden_size=320, intermediate_size=832,
      vocab_size=2143, num_hidden_layers=4, num_attention_heads=5, num_key_value_heads=5,
      num_experts=6, num_experts_per_tok=2, moe_intermediate_size=112,
      shared_expert_intermediate_size=408, qkv_bias=False, decoder_sparse_step=2),
    c("qwen2_moe-mlp-only-kv-default-16-tied", "qwen2_moe", hidden_size=384,
      intermediate_size=1008, vocab_size=1777, num_hidden_layers=3, num_attention_heads=6,
      num_experts=5, num_experts_per_tok=2, moe_intermediate_size=136,
      shared_expert_intermediate_size=520, mlp_only_layers=[0, 2], tie_word_embeddings=True),
    c("qwen2_moe-step-2-mlp-only-head-dim", "qwen2_moe", hidden_size=192, intermediate_size=488,
      vocab_size=2671, num_hidden_layers=5, num_attention_heads=3, num_key_value_heads=1,
      num_experts=3, num_experts_per_tok=1, moe_intermediate_size=72,
      shared_expert_intermediate_size=264, decoder_sparse_step=2, mlp_only_layers=[3],
      head_dim=48),
    c("qwen2_moe-zero-experts-sliding", "qwen2_moe", hidden_size=288, intermediate_size=760,
      vocab_size=1117, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
      num_experts=0, num_experts_per_tok=1, moe_intermediate_size=80,
      shared_expert_intermediate_size=216, use_sliding_window=True, max_window_layers=1),
    c("qwen2_moe-num-local-experts-ignored", "qwen2_moe", hidden_size=160, intermediate_size=424,
      vocab_size=1279, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=36,
      shared_expert_intermediate_size=116),
    # ---- qwen3_moe: no head_dim default (hidden/heads), kv default 4, q_norm/k_norm, no shared expert
    c("qwen3_moe-head-dim", "qwen3_moe", hidden_size=256, intermediate_size=720, vocab_size=1693,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
      num_experts_per_tok=2, moe_intermediate_size=88, head_dim=80),
    c("qwen3_moe-sparse-step-2-kv-default-4", "qwen3_moe", hidden_size=320,
      intermediate_size=848, vocab_size=2417, num_hidden_layers=4, num_attention_heads=8,
      num_experts=6, num_experts_per_tok=2, moe_intermediate_size=104, decoder_sparse_step=2),
    c("qwen3_moe-alias-mlp-only-bias-tied", "qwen3_moe", hidden_size=384, intermediate_size=976,
      vocab_size=1303, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
      num_local_experts=5, num_experts_per_tok=2, moe_intermediate_size=120,
      mlp_only_layers=[1], attention_bias=True, head_dim=72, tie_word_embeddings=True),
    c("qwen3_moe-step-3-mlp-only", "qwen3_moe", hidden_size=224, intermediate_size=616,
      vocab_size=2953, num_hidden_layers=5, num_attention_heads=7, num_key_value_heads=1,
      num_experts=3, num_experts_per_tok=1, moe_intermediate_size=68, decoder_sparse_step=3,
      mlp_only_layers=[2], head_dim=44),
    c("qwen3_moe-sliding", "qwen3_moe", hidden_size=416, intermediate_size=1088, vocab_size=1999,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, num_experts=8,
      num_experts_per_tok=3, moe_intermediate_size=152, head_dim=100, use_sliding_window=True,
      sliding_window=512),
    c("qwen3_moe-both-expert-names", "qwen3_moe", hidden_size=208, intermediate_size=560,
      vocab_size=1657, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
      num_experts=3, num_local_experts=5, num_experts_per_tok=1, moe_intermediate_size=84,
      head_dim=28),
    # ---- starcoder2: kv default 2, tied by default, layer norms with biases, c_fc/c_proj, use_bias
    c("starcoder2-defaults", "starcoder2", hidden_size=256, intermediate_size=704, vocab_size=1811,
      num_hidden_layers=2, num_attention_heads=4),
    c("starcoder2-no-bias-untied-window", "starcoder2", hidden_size=320, intermediate_size=936,
      vocab_size=1201, num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1,
      use_bias=False, tie_word_embeddings=False, sliding_window=64),
    # ---- cohere: kv default = heads, tied by default, one norm a layer (no bias), no MLP bias
    c("cohere-defaults", "cohere", hidden_size=256, intermediate_size=712, vocab_size=1733,
      num_hidden_layers=2, num_attention_heads=4),
    c("cohere-gqa-untied-bias", "cohere", hidden_size=320, intermediate_size=888, vocab_size=1291,
      num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1, attention_bias=True,
      tie_word_embeddings=False, logit_scale=0.25),
    # ---- glm4: kv default 2, head_dim default 128, q/k/v biased by default (o never), fused
    #      gate_up_proj, four norms per layer, partial rotary (0.5 by default)
    c("glm4-defaults", "glm4", hidden_size=256, intermediate_size=696, vocab_size=1607,
      num_hidden_layers=2, num_attention_heads=4, pad_token_id=0),
    c("glm4-head-dim-no-bias-tied", "glm4", hidden_size=320, intermediate_size=872, vocab_size=1319,
      num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1, head_dim=72,
      attention_bias=False, partial_rotary_factor=0.75, tie_word_embeddings=True, pad_token_id=0),
    # ---- olmo2: q_norm and k_norm over whole projections, norms after attention and MLP only
    c("olmo2-gqa", "olmo2", hidden_size=256, intermediate_size=688, vocab_size=1531,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    c("olmo2-kv-default-bias-tied", "olmo2", hidden_size=320, intermediate_size=840, vocab_size=1297,
      num_hidden_layers=2, num_attention_heads=5, attention_bias=True, tie_word_embeddings=True),
    # ---- granite: Llama's tensors, kv default = heads, mlp_bias honoured, multipliers (no tensors)
    c("granite-multipliers", "granite", hidden_size=256, intermediate_size=704, vocab_size=1723,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, embedding_multiplier=12.0,
      residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0),
    c("granite-kv-default-biases-tied", "granite", hidden_size=320, intermediate_size=856,
      vocab_size=1433, num_hidden_layers=2, num_attention_heads=5, attention_bias=True, mlp_bias=True,
      tie_word_embeddings=True),
    # ---- gemma: head_dim default 256, kv default 16, tied by default, two norms per layer
    c("gemma-head-dim", "gemma", hidden_size=256, intermediate_size=712, vocab_size=1609,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=56),
    c("gemma-defaults-untied", "gemma", hidden_size=320, intermediate_size=888, vocab_size=2111,
      num_hidden_layers=4, num_attention_heads=16, tie_word_embeddings=False),
    c("gemma-attention-bias", "gemma", hidden_size=384, intermediate_size=1000, vocab_size=1877,
      num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=40,
      attention_bias=True),
    # ---- gemma2: head_dim default 256, kv default 4, tied by default, four norms per layer
    c("gemma2-head-dim", "gemma2", hidden_size=256, intermediate_size=696, vocab_size=1583,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=48),
    c("gemma2-head-dim-default-256-untied", "gemma2", hidden_size=320, intermediate_size=872,
      vocab_size=2213, num_hidden_layers=4, num_attention_heads=5, num_key_value_heads=1,
      tie_word_embeddings=False),
    c("gemma2-layer-types-attention-bias", "gemma2", hidden_size=384, intermediate_size=1016,
      vocab_size=1847, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
      head_dim=72, attention_bias=True,
      layer_types=["full_attention", "sliding_attention", "full_attention"]),
    c("gemma2-pattern-ignored-kv-default-4", "gemma2", hidden_size=192, intermediate_size=504,
      vocab_size=2591, num_hidden_layers=6, num_attention_heads=4, head_dim=60,
      sliding_window_pattern=3, sliding_window=96),
    c("gemma2-tied-explicit", "gemma2", hidden_size=448, intermediate_size=1200, vocab_size=1051,
      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, head_dim=52,
      tie_word_embeddings=True),
    # ---- gemma3_text: as gemma2 plus q_norm/k_norm; sliding_window_pattern default 6
    c("gemma3_text-head-dim", "gemma3_text", hidden_size=256, intermediate_size=664,
      vocab_size=1627, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
      head_dim=44),
    c("gemma3_text-pattern-3-head-dim-default-untied", "gemma3_text", hidden_size=320,
      intermediate_size=816, vocab_size=2381, num_hidden_layers=6, num_attention_heads=5,
      num_key_value_heads=5, sliding_window_pattern=3, tie_word_embeddings=False),
    c("gemma3_text-layer-types-attention-bias", "gemma3_text", hidden_size=384,
      intermediate_size=1032, vocab_size=1433, num_hidden_layers=4, num_attention_heads=6,
      num_key_value_heads=2, head_dim=88, attention_bias=True,
      layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"]),
    c("gemma3_text-default-pattern-kv-default-4", "gemma3_text", hidden_size=192,
      intermediate_size=552, vocab_size=2729, num_hidden_layers=5, num_attention_heads=3,
      head_dim=52, sliding_window=200),
    c("gemma3_text-all-full", "gemma3_text", hidden_size=352, intermediate_size=952,
      vocab_size=1163, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
      head_dim=68, layer_types=["full_attention"] * 3),
    # ---- gemma3 (multimodal config: its vision tower, Gemma 3's default one, counted too)
    g3("gemma3-text-head-dim", hidden_size=256, intermediate_size=648, vocab_size=1697,
       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=40),
    g3("gemma3-text-pattern-2-head-dim-default-untied", hidden_size=320, intermediate_size=792,
       vocab_size=2027, num_hidden_layers=6, num_attention_heads=5, num_key_value_heads=1,
       sliding_window_pattern=2, tie_word_embeddings=False),
    g3("gemma3-text-layer-types-attention-bias", hidden_size=384, intermediate_size=1048,
       vocab_size=1361, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
       head_dim=60, attention_bias=True,
       layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    g3("gemma3-text-kv-default-4-tied", hidden_size=288, intermediate_size=736, vocab_size=2593,
       num_hidden_layers=4, num_attention_heads=4, head_dim=76, tie_word_embeddings=True),
    g3("gemma3-top-level-untied", top={"tie_word_embeddings": False}, hidden_size=416,
       intermediate_size=1144, vocab_size=1229, num_hidden_layers=2, num_attention_heads=8,
       num_key_value_heads=4, head_dim=36),
    # ---- phi3: fused qkv_proj (o_proj first), fused gate_up_proj; pad_token_id default 32000
    c("phi3-kv-default", "phi3", hidden_size=256, intermediate_size=728, vocab_size=1571,
      num_hidden_layers=2, num_attention_heads=4, pad_token_id=None),
    c("phi3-mqa-partial-0.5", "phi3", hidden_size=320, intermediate_size=856, vocab_size=2287,
      num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=1, pad_token_id=2286,
      partial_rotary_factor=0.5),
    c("phi3-gqa-partial-0.75-tied", "phi3", hidden_size=384, intermediate_size=1040,
      vocab_size=1459, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
      partial_rotary_factor=0.75, pad_token_id=0, tie_word_embeddings=True),
    c("phi3-odd-rotary-dim", "phi3", hidden_size=216, intermediate_size=568, vocab_size=2617,
      num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
      partial_rotary_factor=0.75, pad_token_id=None),
    c("phi3-head-dim-honoured", "phi3", hidden_size=448, intermediate_size=1176, vocab_size=1093,
      num_hidden_layers=5, num_attention_heads=7, num_key_value_heads=7, pad_token_id=1092,
      sliding_window=262, head_dim=80),
    # ---- deepseek_v2: MLA; first_k_dense_replace dense layers then MoE; shared experts fused
    c("deepseek_v2-no-q-lora", "deepseek_v2", hidden_size=256, intermediate_size=740,
      vocab_size=1669, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=None,
      kv_lora_rank=48, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20,
      n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=56, num_experts_per_tok=2,
      first_k_dense_replace=0),
    c("deepseek_v2-q-lora-first-dense-bias", "deepseek_v2", hidden_size=320,
      intermediate_size=888, vocab_size=2333, num_hidden_layers=3, num_attention_heads=5,
      q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=28, qk_rope_head_dim=12, v_head_dim=36,
      n_routed_experts=6, n_shared_experts=2, moe_intermediate_size=68, num_experts_per_tok=2,
      first_k_dense_replace=1, attention_bias=True),
    c("deepseek_v2-no-shared-2-dense-tied", "deepseek_v2", hidden_size=384,
      intermediate_size=1080, vocab_size=1483, num_hidden_layers=4, num_attention_heads=6,
      q_lora_rank=None, kv_lora_rank=80, qk_nope_head_dim=20, qk_rope_head_dim=8, v_head_dim=44,
      n_routed_experts=5, n_shared_experts=0, moe_intermediate_size=76, num_experts_per_tok=2,
      first_k_dense_replace=2, tie_word_embeddings=True),
    c("deepseek_v2-alias-defaults-mlp-bias", "deepseek_v2", hidden_size=192,
      intermediate_size=528, vocab_size=2719, num_hidden_layers=2, num_attention_heads=4,
      q_lora_rank=60, kv_lora_rank=40, qk_nope_head_dim=18, qk_rope_head_dim=10, v_head_dim=26,
      num_experts=3, moe_intermediate_size=44, num_experts_per_tok=1, mlp_bias=True),
    c("deepseek_v2-group-limited-head-dim-overridden", "deepseek_v2", hidden_size=448,
      intermediate_size=1232, vocab_size=1123, num_hidden_layers=5, num_attention_heads=8,
      num_key_value_heads=2, q_lora_rank=112, kv_lora_rank=88, qk_nope_head_dim=30,
      qk_rope_head_dim=14, v_head_dim=34, n_routed_experts=7, n_shared_experts=1,
      moe_intermediate_size=92, num_experts_per_tok=2, first_k_dense_replace=1,
      topk_method="group_limited_greedy", n_group=7, topk_group=2, head_dim=50),
    # ---- deepseek_v3: as v2 (no mlp_bias) plus a persistent e_score_correction_bias buffer per MoE layer
    c("deepseek_v3-no-q-lora", "deepseek_v3", hidden_size=256, intermediate_size=760,
      vocab_size=1723, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=None,
      kv_lora_rank=52, qk_nope_head_dim=22, qk_rope_head_dim=14, v_head_dim=30,
      n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=60, num_experts_per_tok=2,
      n_group=2, topk_group=1, first_k_dense_replace=1),
    c("deepseek_v3-q-lora-all-moe-tied", "deepseek_v3", hidden_size=320, intermediate_size=904,
      vocab_size=2351, num_hidden_layers=4, num_attention_heads=5, q_lora_rank=100,
      kv_lora_rank=68, qk_nope_head_dim=26, qk_rope_head_dim=18, v_head_dim=38,
      n_routed_experts=8, n_shared_experts=2, moe_intermediate_size=84, num_experts_per_tok=2,
      n_group=4, topk_group=2, first_k_dense_replace=0, tie_word_embeddings=True),
    c("deepseek_v3-dense-default-3-no-shared-bias", "deepseek_v3", hidden_size=384,
      intermediate_size=1096, vocab_size=1493, num_hidden_layers=5, num_attention_heads=6,
      q_lora_rank=76, kv_lora_rank=92, qk_nope_head_dim=32, qk_rope_head_dim=12, v_head_dim=46,
      n_routed_experts=6, n_shared_experts=0, moe_intermediate_size=64, num_experts_per_tok=3,
      n_group=3, topk_group=1, attention_bias=True),
    c("deepseek_v3-alias-hidden-not-multiple", "deepseek_v3", hidden_size=210,
      intermediate_size=584, vocab_size=2647, num_hidden_layers=3, num_attention_heads=4,
      q_lora_rank=56, kv_lora_rank=36, qk_nope_head_dim=16, qk_rope_head_dim=10, v_head_dim=24,
      num_local_experts=5, n_shared_experts=1, moe_intermediate_size=48, num_experts_per_tok=2,
      n_group=1, topk_group=1, first_k_dense_replace=2),
    c("deepseek_v3-mtp-ignored", "deepseek_v3", hidden_size=448, intermediate_size=1240,
      vocab_size=1031, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
      q_lora_rank=120, kv_lora_rank=96, qk_nope_head_dim=34, qk_rope_head_dim=16, v_head_dim=42,
      n_routed_experts=4, moe_intermediate_size=100, num_experts_per_tok=1, n_group=2,
      topk_group=2, first_k_dense_replace=1, num_nextn_predict_layers=1),
    c("deepseek_v3-both-expert-names", "deepseek_v3", hidden_size=240, intermediate_size=632,
      vocab_size=1777, num_hidden_layers=1, num_attention_heads=4, q_lora_rank=None,
      kv_lora_rank=44, qk_nope_head_dim=20, qk_rope_head_dim=12, v_head_dim=28,
      n_routed_experts=5, num_local_experts=3, n_shared_experts=1, moe_intermediate_size=52,
      num_experts_per_tok=1, n_group=1, topk_group=1, first_k_dense_replace=0),
    # ---- configurations transformers refuses
    c("refused-llama-hidden-not-multiple-of-heads", "llama", hidden_size=330,
      intermediate_size=872, vocab_size=1409, num_hidden_layers=2, num_attention_heads=4,
      head_dim=64),
    c("refused-deepseek_v2-hidden-not-multiple-of-heads", "deepseek_v2", hidden_size=210,
      intermediate_size=584, vocab_size=2647, num_hidden_layers=2, num_attention_heads=4,
      q_lora_rank=None, kv_lora_rank=36, qk_nope_head_dim=16, qk_rope_head_dim=10,
      v_head_dim=24, n_routed_experts=4, moe_intermediate_size=48, num_experts_per_tok=2),
    c("refused-phi3-default-pad-token-outside-vocab", "phi3", hidden_size=256,
      intermediate_size=728, vocab_size=1571, num_hidden_layers=2, num_attention_heads=4),
    c("refused-qwen2-head-dim-null", "qwen2", hidden_size=256, intermediate_size=712,
      vocab_size=1607, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
      head_dim=None),
    c("refused-qwen3-head-dim-null", "qwen3", hidden_size=288, intermediate_size=744,
      vocab_size=2269, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
      head_dim=None),
    c("refused-qwen2_moe-kv-heads-null", "qwen2_moe", hidden_size=256, intermediate_size=704,
      vocab_size=1531, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=None,
      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96,
      shared_expert_intermediate_size=344),
    c("refused-mixtral-kv-heads-null", "mixtral", hidden_size=256, intermediate_size=344,
      vocab_size=1499, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=None,
      num_local_experts=4, num_experts_per_tok=2),
    c("refused-deepseek_v3-first-k-dense-null", "deepseek_v3", hidden_size=256,
      intermediate_size=760, vocab_size=1723, num_hidden_layers=2, num_attention_heads=4,
      q_lora_rank=None, kv_lora_rank=52, qk_nope_head_dim=22, qk_rope_head_dim=14,
      v_head_dim=30, n_routed_experts=4, moe_intermediate_size=60, num_experts_per_tok=2,
      n_group=2, topk_group=1, first_k_dense_replace=None),
    c("refused-qwen3-float-layer-count", "qwen3", hidden_size=320, intermediate_size=896,
      vocab_size=1931, num_hidden_layers=2.0, num_attention_heads=4, num_key_value_heads=2),
]


def check_widths(spec):
    """Within one configuration every width is a distinct number (write mode only)."""
    config = spec["config"]
    fields = config.get("text_config", config)
    widths = {k: fields[k] for k in WIDTH_FIELDS if isinstance(fields.get(k), int)}
    heads = fields.get("num_attention_heads")
    if "head_dim" in widths and isinstance(heads, int):
        widths["heads*head_dim"] = heads * widths["head_dim"]
    seen = {}
    for key, value in widths.items():
        if value in seen and value != 0:
            raise SystemExit(f"{spec['name']}: {key} and {seen[value]} are both {value}")
        seen[value] = key


def shape(t):
    return list(t.shape)


def layer_index(name):
    m = re.match(r"^(?:model\.)?layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def keep(name, layers):
    idx = layer_index(name)
    return layers <= 3 or idx is None or idx < 3


def resolved_of(cfg):
    out = {}
    for key in ("head_dim", "num_key_value_heads", "tie_word_embeddings", "num_experts",
                "num_local_experts", "n_routed_experts", "n_shared_experts", "q_lora_rank",
                "qk_head_dim", "n_group", "topk_group"):
        try:
            if hasattr(cfg, key):
                out[key] = getattr(cfg, key)
        except Exception:  # an attribute_map alias to a missing attribute
            pass
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict) and "partial_rotary_factor" in rope:
        out["partial_rotary_factor"] = rope["partial_rotary_factor"]
    return out


def compute(name, config):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    entry = {"name": name, "model_type": config["model_type"], "config": config}
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        cfg = AutoConfig.for_model(config["model_type"], **fields)
        auto_class = AutoModelForCausalLM._model_mapping[type(cfg)]
        entry["auto_class"] = auto_class.__name__
        counted_cfg = cfg.get_text_config()
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as e:  # noqa: BLE001 - recorded as the refusal it is
        entry.pop("auto_class", None)
        entry["refused"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
        return entry

    layers = counted_cfg.num_hidden_layers
    params = list(model.named_parameters())
    buffers = list(model.named_buffers())
    entry["class"] = type(model).__name__
    entry["parameters"] = sum(p.numel() for p in model.parameters())
    entry["layer_tensor_count"] = len(params)
    entry["tensors_truncated"] = layers > 3
    entry["tensors"] = [[n, shape(p)] for n, p in params if keep(n, layers)]
    entry["buffer_count"] = len(buffers)
    entry["buffers"] = [[n, shape(b), str(b.dtype).replace("torch.", "")]
                        for n, b in buffers if keep(n, layers)]
    entry["layer_types"] = getattr(counted_cfg, "layer_types", None)
    entry["sliding_window"] = getattr(counted_cfg, "sliding_window", None)
    entry["resolved"] = resolved_of(counted_cfg)
    for key in ("mlp_only_layers", "decoder_sparse_step", "first_k_dense_replace"):
        if hasattr(counted_cfg, key):
            entry[key] = getattr(counted_cfg, key)
    # JSON round trip, so that a fresh entry compares equal to one read back from the fixture
    return json.loads(json.dumps(entry))


def quiet():
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.__version__


def write(path):
    version = quiet()
    if version != WRITTEN_WITH:
        print(f"note: transformers {version}, the fixture is meant for {WRITTEN_WITH}", file=sys.stderr)
    names = [s["name"] for s in CONFIGS]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate configuration names")
    for spec in CONFIGS:
        check_widths(spec)
    entries = [compute(s["name"], s["config"]) for s in CONFIGS]
    with open(path, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n")
    refused = sum(1 for e in entries if "refused" in e)
    print(f"{path}: {len(entries)} entries ({refused} refused), transformers {version}")


def describe(a, b, path):
    """Differences between two JSON values, as lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a:
                out.append(f"{path}.{k}: missing in fixture, now {json.dumps(b[k])[:200]}")
            elif k not in b:
                out.append(f"{path}.{k}: {json.dumps(a[k])[:200]} in fixture, now missing")
            else:
                out += describe(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and path.endswith((".tensors", ".buffers")):
        out = []
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else None
            y = b[i] if i < len(b) else None
            if x != y:
                out.append(f"{path}[{i}]: fixture {json.dumps(x)}, now {json.dumps(y)}")
        return out
    if a != b:
        return [f"{path}: fixture {json.dumps(a)[:200]}, now {json.dumps(b)[:200]}"]
    return []


def check(path):
    version = quiet()
    with open(path) as f:
        entries = json.load(f)
    differences = []
    for old in entries:
        new = compute(old["name"], old["config"])
        differences += describe(old, new, old["name"])
    known = {s["name"]: s["config"] for s in CONFIGS}
    in_fixture = {e["name"]: e["config"] for e in entries}
    for name in known:
        if name not in in_fixture:
            differences.append(f"{name}: in the script, not in the fixture")
        elif known[name] != in_fixture[name]:
            differences.append(f"{name}: the script's config differs from the fixture's")
    for name in in_fixture:
        if name not in known:
            differences.append(f"{name}: in the fixture, not in the script")
    for line in differences:
        print(line)
    print(f"{path}: {len(entries)} entries, {len(differences)} differences, transformers {version}")
    return 1 if differences else 0


def main(argv):
    if len(argv) == 2 and argv[0] == "--check":
        return check(argv[1])
    if len(argv) == 1 and not argv[0].startswith("-"):
        write(argv[0])
        return 0
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
