"""The Hugging Face workloads the GPU proofs run (scripts/gpu/hf-record.py, scripts/gpu/hf-proof.py):
public configurations, small configurations of the same architectures for traces, and the
specification scripts/gpu/hf-run.py takes. Standard library only."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

def gemma3_public(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
                  head_dim, query_pre_attn_scalar):
    """A public Gemma 3 config.json (model type gemma3): its text model's widths, and the SigLIP
    vision tower and image tokens every size shares."""
    text = dict(vocab_size=262208, hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                num_key_value_heads=num_key_value_heads, head_dim=head_dim, sliding_window=1024,
                query_pre_attn_scalar=query_pre_attn_scalar, max_position_embeddings=131072,
                rope_scaling=dict(rope_type="linear", factor=8.0))
    vision = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                  image_size=896, patch_size=14, vision_use_head=False)
    return "gemma3", dict(text_config=text, vision_config=vision, mm_tokens_per_image=256,
                          image_token_index=262144, boi_token_index=255999, eoi_token_index=256000)


# Public configurations (the fields of each model's config.json that change memory).
PUBLIC = {
    "llama-3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                                   tie_word_embeddings=False)),
    "llama-2-7b": ("llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                 tie_word_embeddings=False)),
    "llama-2-13b": ("llama", dict(vocab_size=32000, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                                  num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096,
                                  tie_word_embeddings=False)),
    "llama-3.2-1b": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                   max_position_embeddings=131072, tie_word_embeddings=True)),
    "qwen2.5-7b": ("qwen2", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
                                 tie_word_embeddings=False)),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   tie_word_embeddings=True)),
    "mistral-7b-v0.1": ("mistral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                        max_position_embeddings=32768, sliding_window=4096,
                                        tie_word_embeddings=False)),
    "mixtral-8x7b": ("mixtral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                                     num_experts_per_tok=2, max_position_embeddings=32768, tie_word_embeddings=False)),
    "qwen3-8b": ("qwen3", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               max_position_embeddings=40960, tie_word_embeddings=False)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                        moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                                        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                                        norm_topk_prob=True, max_position_embeddings=40960,
                                        tie_word_embeddings=False)),
    "gemma-2-2b": ("gemma2", dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096,
                                  query_pre_attn_scalar=256, final_logit_softcapping=30.0,
                                  attn_logit_softcapping=50.0, max_position_embeddings=8192)),
    "gemma-3-12b": ("gemma3_text", dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360,
                                        num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                                        head_dim=256, sliding_window=1024, query_pre_attn_scalar=256,
                                        max_position_embeddings=131072)),
    "gemma-3-4b": gemma3_public(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                                num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                query_pre_attn_scalar=256),
    "gemma-3-27b": gemma3_public(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
                                 num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                                 query_pre_attn_scalar=168),
    "phi-3-mini": ("phi3", dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                sliding_window=2047, tie_word_embeddings=False)),
    "deepseek-v2-lite": ("deepseek_v2", dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                                             moe_intermediate_size=1408, num_hidden_layers=27,
                                             num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
                                             q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                             v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
                                             num_experts_per_tok=6, first_k_dense_replace=1,
                                             max_position_embeddings=163840, tie_word_embeddings=False)),
    "deepseek-v3": ("deepseek_v3", dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                                        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                                        num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                                        n_group=8, topk_group=4, first_k_dense_replace=3, norm_topk_prob=True,
                                        routed_scaling_factor=2.5, max_position_embeddings=163840,
                                        tie_word_embeddings=False)),
    # Public configurations of the blind round (`scripts/hf-proof-plan --blind`): none of them was
    # traced or run before its plan was written.
    "llama-3.2-3b": ("llama", dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                                   num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=131072, tie_word_embeddings=True,
                                   rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=8192))),
    "qwen2.5-14b": ("qwen2", dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                                  num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=32768,
                                  tie_word_embeddings=False)),
    "qwen2.5-1.5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                                   tie_word_embeddings=True)),
    "mistral-nemo-12b": ("mistral", dict(vocab_size=131072, hidden_size=5120, intermediate_size=14336,
                                         num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                                         head_dim=128, max_position_embeddings=1024000, sliding_window=None,
                                         tie_word_embeddings=False)),
    "phi-3-medium": ("phi3", dict(vocab_size=32064, hidden_size=5120, intermediate_size=17920, num_hidden_layers=40,
                                  num_attention_heads=40, num_key_value_heads=10, max_position_embeddings=4096,
                                  sliding_window=2047, tie_word_embeddings=False)),
    "qwen3-4b": ("qwen3", dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               max_position_embeddings=40960, tie_word_embeddings=True)),
    "gemma-2-9b": ("gemma2", dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                                  num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=4096,
                                  query_pre_attn_scalar=256, final_logit_softcapping=30.0,
                                  attn_logit_softcapping=50.0, max_position_embeddings=8192)),
    # Public configurations of the second blind round (`scripts/hf-proof-plan --second-blind`), planned
    # with new segments placed as the driver places them: none was traced or run before its plan was written.
    "qwen2.5-3b": ("qwen2", dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                 num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                                 tie_word_embeddings=True)),
    "mistral-7b-v0.3": ("mistral", dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336,
                                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                        max_position_embeddings=32768, sliding_window=None,
                                        tie_word_embeddings=False)),
    "qwen3-14b": ("qwen3", dict(vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                                num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                                max_position_embeddings=40960, tie_word_embeddings=False)),
    "gemma-2-27b": ("gemma2", dict(vocab_size=256000, hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
                                   num_attention_heads=32, num_key_value_heads=16, head_dim=128, sliding_window=4096,
                                   query_pre_attn_scalar=144, final_logit_softcapping=30.0,
                                   attn_logit_softcapping=50.0, max_position_embeddings=8192)),
    "llama-3.1-70b": ("llama", dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                    num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072,
                                    tie_word_embeddings=False,
                                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                      high_freq_factor=4.0, original_max_position_embeddings=8192))),
    "qwen2.5-32b": ("qwen2", dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                                  num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=32768,
                                  tie_word_embeddings=False)),
    "qwen1.5-moe-a2.7b": ("qwen2_moe", dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                                            moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                                            num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                                            num_experts=60, num_experts_per_tok=4,
                                            max_position_embeddings=8192, tie_word_embeddings=False)),
    # Architectures read since: Gemma (1), Granite 3, OLMo 2 (their public config.json fields).
    "gemma-7b": ("gemma", dict(vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=16, head_dim=256,
                               max_position_embeddings=8192)),
    "gemma-2b": ("gemma", dict(vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                               num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                               max_position_embeddings=8192)),
    "granite-3.1-8b": ("granite", dict(vocab_size=49155, hidden_size=4096, intermediate_size=12800,
                                       num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                                       embedding_multiplier=12.0, residual_multiplier=0.22,
                                       attention_multiplier=0.0078125, logits_scaling=16.0,
                                       max_position_embeddings=131072, tie_word_embeddings=True)),
    # GLM-4 0414 (its public config.json fields).
    "glm-4-9b": ("glm4", dict(vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,
                              num_attention_heads=32, num_key_value_heads=2, head_dim=128, partial_rotary_factor=0.5,
                              attention_bias=True, max_position_embeddings=32768, pad_token_id=151329,
                              tie_word_embeddings=False)),
    "glm-4-32b": ("glm4", dict(vocab_size=151552, hidden_size=6144, intermediate_size=23040, num_hidden_layers=61,
                               num_attention_heads=48, num_key_value_heads=2, head_dim=128, partial_rotary_factor=0.5,
                               attention_bias=True, max_position_embeddings=32768, pad_token_id=151329,
                               tie_word_embeddings=False)),
    # Cohere (Aya Expanse 8B and Command R 08-2024: their public config.json fields).
    "aya-expanse-8b": ("cohere", dict(vocab_size=256000, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      logit_scale=0.125, max_position_embeddings=8192, use_qk_norm=False,
                                      tie_word_embeddings=True)),
    "command-r-08-2024": ("cohere", dict(vocab_size=256000, hidden_size=8192, intermediate_size=22528,
                                         num_hidden_layers=40, num_attention_heads=64, num_key_value_heads=8,
                                         logit_scale=0.0625, max_position_embeddings=131072, use_qk_norm=False,
                                         tie_word_embeddings=True)),
    # StarCoder2 3B and 7B (their public config.json fields).
    "starcoder2-3b": ("starcoder2", dict(vocab_size=49152, hidden_size=3072, intermediate_size=12288,
                                         num_hidden_layers=30, num_attention_heads=24, num_key_value_heads=2,
                                         max_position_embeddings=16384, sliding_window=4096, use_bias=True,
                                         tie_word_embeddings=True)),
    "starcoder2-7b": ("starcoder2", dict(vocab_size=49152, hidden_size=4608, intermediate_size=18432,
                                         num_hidden_layers=32, num_attention_heads=36, num_key_value_heads=4,
                                         max_position_embeddings=16384, sliding_window=4096, use_bias=True,
                                         tie_word_embeddings=False)),
    "olmo-2-7b": ("olmo2", dict(vocab_size=100352, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                rope_theta=500000, tie_word_embeddings=False)),
    "olmo-2-1b": ("olmo2", dict(vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
                                rope_theta=500000, tie_word_embeddings=True)),
}


def small(model_type, variant=0):
    """A small configuration of `model_type` (2 layers) whose widths are all distinct, so that a
    trace tells which width each allocation comes from; `variant` 1 changes every width."""
    h, heads, kv, hd, inter, vocab = [(320, 5, 1, 72, 448, 1160), (384, 6, 2, 56, 608, 1416)][variant]
    c = dict(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=2,
             num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, max_position_embeddings=4096,
             tie_word_embeddings=False, pad_token_id=0)
    if model_type in ("mixtral",):
        c.update(num_local_experts=4, num_experts_per_tok=2)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        c.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=inter // 2 + 8)
        if model_type == "qwen2_moe":
            c.update(shared_expert_intermediate_size=inter + 16)
    if model_type == "mistral":
        c.update(sliding_window=24)
    if model_type in ("gemma2", "gemma3_text"):
        c.update(sliding_window=24, query_pre_attn_scalar=hd)
    if model_type == "gemma2":
        c.update(final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    if model_type == "gemma3_text":
        c.update(num_hidden_layers=3, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    if model_type == "phi3":
        c.update(num_key_value_heads=heads, sliding_window=None)
    if model_type == "gemma3":
        # The multimodal configuration: the text model of gemma3_text, a SigLIP vision tower of
        # other widths, the image token inside the vocabulary as in the public checkpoints.
        vision = [dict(hidden_size=176, intermediate_size=232, num_attention_heads=4),
                  dict(hidden_size=208, intermediate_size=264, num_attention_heads=8)][variant]
        vision.update(num_hidden_layers=2, image_size=56, patch_size=14, vision_use_head=False)
        text = small("gemma3_text", variant)
        text.pop("tie_word_embeddings")
        return dict(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=vocab - 60,
                    boi_token_index=vocab - 61, eoi_token_index=vocab - 59)
    # The architectures read since (each small, its own features switched on).
    if model_type == "granite":
        c.update(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                 logits_scaling=8.0)
    if model_type == "cohere":
        c.update(logit_scale=0.0625, tie_word_embeddings=True)
    if model_type == "glm4":
        c.update(partial_rotary_factor=0.5, attention_bias=True)
    if model_type == "starcoder2":
        c.update(use_bias=True, sliding_window=24, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh")
    if model_type == "gemma":
        c.update(tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh")
    if model_type == "llama4_text":
        c.update(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=inter + 32,
                 interleave_moe_layer_step=2, use_qk_norm=True, attention_chunk_size=24,
                 no_rope_layers=[1, 0], layer_types=["chunked_attention", "full_attention"])
    if model_type == "gpt_oss":
        c.update(num_local_experts=4, num_experts_per_tok=2, sliding_window=24,
                 layer_types=["sliding_attention", "full_attention"], attention_bias=True)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        c.pop("head_dim")
        c.update(num_key_value_heads=heads, kv_lora_rank=96 + 8 * variant, q_lora_rank=None if model_type ==
                 "deepseek_v2" else 112, qk_nope_head_dim=48, qk_rope_head_dim=16, v_head_dim=40,
                 n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                 moe_intermediate_size=inter // 2 + 8)
        if model_type == "deepseek_v3":
            c.update(n_group=2, topk_group=1)
    return c


def spec(name, model_type, config, mode, dtype="bfloat16", batch=3, context=40, generated=5, **extra):
    s = dict(name=name, model_type=model_type, config=config, mode=mode, dtype=dtype, batch=batch,
             context=context, generated=generated)
    s.update(extra)
    return s


def run_spec(s, out_dir: Path, expandable=False, timeout=600):
    """Runs one spec in a fresh process; returns the result record (or an error record)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / f"{s['name']}.spec.json"
    result_path = out_dir / f"{s['name']}.json"
    spec_path.write_text(json.dumps(s))
    env = dict(os.environ)
    if "python_hash_seed" in s:
        env["PYTHONHASHSEED"] = str(s["python_hash_seed"])
    else:
        env.pop("PYTHONHASHSEED", None)
    if expandable or s.get("expandable"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    start = time.time()
    log = open(out_dir / f"{s['name']}.log", "w")
    p = subprocess.Popen([sys.executable, str(HERE / "hf-run.py"), str(spec_path), str(result_path)], env=env,
                         stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()
    return p, start, result_path


def finish(p, start, result_path, timeout=600):
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    wall = time.time() - start
    out = result_path.with_suffix(".log").read_text(errors="replace")
    if result_path.exists():
        record = json.loads(result_path.read_text())
    else:
        record = dict(outcome="crashed", message=out[-3000:])
    record["wall_s"] = round(wall, 2)
    record["exit_code"] = p.returncode
    record["log_tail"] = out[-2000:]
    result_path.write_text(json.dumps(record, separators=(",", ":")))
    return record


def run_all(specs, out_dir: Path, parallel=1, deadline=None, say=print):
    """Runs every spec, `parallel` processes at a time, none started after `deadline` (a time())."""
    pending, running, records = list(specs), [], []
    while pending or running:
        while pending and len(running) < parallel and (deadline is None or time.time() < deadline):
            s = pending.pop(0)
            running.append((s, *run_spec(s, out_dir)))
        if not running:
            for s in pending:
                say(f"- {s['name']}: not run (out of time)")
            break
        s, p, start, path = running.pop(0)
        r = finish(p, start, path)
        peak = max((st.get("peak_reserved", 0) for st in r.get("stages", [])), default=0)
        say(f"- {s['name']}: {r.get('outcome')} in {r['wall_s']} s, peak reserved {peak:,} B"
            + (f" ({r.get('message', '')[:200]})" if r.get("outcome") != "ok" else ""))
        records.append(r)
    return records
