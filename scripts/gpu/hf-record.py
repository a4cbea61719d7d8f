#!/usr/bin/env python3
"""Records the allocator's own trace of real Hugging Face workloads on the GPU, the material the
budget's replay of each workload is derived from (docs/hf-workloads.md says how it was used).

    python3 scripts/gpu/hf-record.py --out FOLDER [--budget-s 540] [--only TEXT]

Three sets, each workload in a fresh process of scripts/gpu/hf-run.py:
- small: every supported architecture at 2 layers with distinct small widths, inference
  (`generate`), full fine-tuning (AdamW as shipped), LoRA, and for Llama the variants
  (recomputation, autocast, float16, float32, fused and for-loop AdamW, expandable segments,
  QLoRA and 8-bit AdamW through bitsandbytes when it is importable), traced with Python stacks,
  several processes at a time;
- medium: the same architectures at their public widths with 2 layers, traced (sizes only);
- large: whole public models, one at a time, measured without a trace (what a process holds
  outside the allocator is read only there, with no other process on the GPU).
Writes FOLDER/<run>.json for each run and FOLDER/summary.md. Stops starting runs after
--budget-s seconds.
"""
import argparse
import time
from pathlib import Path

from hf_workloads import PUBLIC, run_all, small, spec  # noqa: E402
from report import Report

ARCHS = ["llama", "qwen2", "mistral", "mixtral", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text",
         "gemma3", "phi3", "deepseek_v2", "deepseek_v3"]


def lora_targets(model_type):
    if model_type == "phi3":
        return ["qkv_proj", "o_proj"]
    if model_type == "deepseek_v2":
        return ["q_proj", "kv_b_proj"]
    if model_type == "deepseek_v3":
        return ["q_b_proj", "kv_b_proj"]
    return ["q_proj", "v_proj"]


def small_set():
    out = []
    for mt in ARCHS:
        c = small(mt)
        lora = dict(rank=8, targets=lora_targets(mt))
        out.append(spec(f"small-{mt}-inference", mt, c, "inference", trace="stacks"))
        out.append(spec(f"small-{mt}-full", mt, c, "full", trace="stacks"))
        out.append(spec(f"small-{mt}-lora", mt, c, "lora", lora=lora, trace="stacks"))
    c0, c1 = small("llama"), small("llama", 1)
    all7 = dict(rank=12, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    qv = dict(rank=8, targets=["q_proj", "v_proj"])
    v = [
        spec("small-llama-v1-inference", "llama", c1, "inference", batch=2, context=56, generated=7),
        spec("small-llama-v1-full", "llama", c1, "full", batch=2, context=56),
        spec("small-llama-v1-lora", "llama", c1, "lora", batch=2, context=56, lora=all7),
        spec("small-llama-full-checkpointing", "llama", c0, "full", checkpointing=True),
        spec("small-llama-lora-checkpointing", "llama", c0, "lora", checkpointing=True, lora=qv),
        spec("small-llama-v1-lora-checkpointing", "llama", c1, "lora", checkpointing=True, lora=all7, batch=2,
             context=56),
        spec("small-llama-full-autocast-bf16", "llama", c0, "full", autocast="bfloat16"),
        spec("small-llama-full-autocast-fp16", "llama", c0, "full", autocast="float16"),
        spec("small-llama-lora-autocast-bf16", "llama", c0, "lora", autocast="bfloat16", lora=qv),
        spec("small-llama-full-float16", "llama", c0, "full", dtype="float16"),
        spec("small-llama-full-float32", "llama", c0, "full", dtype="float32"),
        spec("small-llama-inference-float32", "llama", c0, "inference", dtype="float32"),
        spec("small-llama-full-fused", "llama", c0, "full", optimizer_impl="fused"),
        spec("small-llama-full-forloop", "llama", c0, "full", optimizer_impl="for-loop"),
        spec("small-llama-inference-expandable", "llama", c0, "inference", expandable=True),
        spec("small-llama-full-expandable", "llama", c0, "full", expandable=True),
        spec("small-llama-qlora", "llama", c0, "qlora", lora=qv),
        spec("small-llama-full-adamw8bit", "llama", c0, "full", optimizer="adamw-8bit"),
        spec("small-qwen2-full-checkpointing", "qwen2", small("qwen2"), "full", checkpointing=True),
        spec("small-mixtral-lora-checkpointing", "mixtral", small("mixtral"), "lora", checkpointing=True, lora=qv),
        spec("small-mixtral-inference-float16", "mixtral", small("mixtral"), "inference", dtype="float16"),
    ]
    for s in v:
        s.setdefault("trace", "stacks")
    return out + v


def layers(name, n):
    mt, c = PUBLIC[name]
    c = dict(c, num_hidden_layers=n)
    if mt == "gemma3_text":
        c["layer_types"] = ["sliding_attention"] * (n - 1) + ["full_attention"]
    return mt, c


def medium_set():
    qv = dict(rank=16, targets=["q_proj", "v_proj"])
    allt = dict(rank=16, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    out = []

    def add(tag, name, n, mode, **kw):
        mt, c = layers(name, n)
        out.append(spec(f"medium-{name}-{tag}", mt, c, mode, trace="sizes", **kw))

    add("inference", "llama-3.1-8b", 2, "inference", batch=2, context=1024, generated=16)
    add("full", "llama-3.1-8b", 2, "full", batch=1, context=1024)
    add("full-checkpointing", "llama-3.1-8b", 2, "full", batch=2, context=1024, checkpointing=True)
    add("lora", "llama-3.1-8b", 2, "lora", batch=2, context=1024, lora=allt)
    add("inference-expandable", "llama-3.1-8b", 2, "inference", batch=2, context=1024, generated=16,
        expandable=True)
    add("full-expandable", "llama-3.1-8b", 2, "full", batch=1, context=1024, expandable=True)
    add("lora", "qwen2.5-7b", 2, "lora", batch=2, context=1024, lora=qv)
    add("inference", "mistral-7b-v0.1", 2, "inference", batch=1, context=5000, generated=16)
    add("inference", "mixtral-8x7b", 2, "inference", batch=2, context=512, generated=8)
    add("lora", "mixtral-8x7b", 2, "lora", batch=1, context=1024, lora=qv)
    add("inference", "gemma-2-2b", 2, "inference", batch=2, context=1024, generated=8)
    add("lora", "gemma-2-2b", 2, "lora", batch=2, context=1024, lora=qv)
    add("inference", "gemma-3-12b", 3, "inference", batch=1, context=2048, generated=8)
    add("inference", "deepseek-v2-lite", 2, "inference", batch=2, context=1024, generated=8)
    add("lora", "deepseek-v2-lite", 2, "lora", batch=1, context=1024,
        lora=dict(rank=16, targets=["q_proj", "kv_b_proj"]))
    add("lora", "qwen3-30b-a3b", 2, "lora", batch=2, context=1024, lora=qv)
    add("full-autocast-bf16", "llama-3.2-1b", 2, "full", batch=2, context=1024, autocast="bfloat16")
    add("full", "phi-3-mini", 2, "full", batch=2, context=1024)
    # bitsandbytes (when importable): QLoRA (NF4, double quantization) and 8-bit AdamW.
    add("qlora", "llama-3.1-8b", 2, "qlora", batch=2, context=1024, lora=qv)
    add("qlora-checkpointing", "llama-3.1-8b", 2, "qlora", batch=2, context=1024, lora=allt, checkpointing=True)
    add("qlora", "qwen2.5-7b", 2, "qlora", batch=1, context=2048, lora=qv)
    add("full-adamw8bit", "llama-3.2-1b", 2, "full", batch=2, context=1024, optimizer="adamw-8bit")
    # Training under a sliding window (its mask), with 16-bit and with 4-bit weights.
    add("lora-b1-2048", "mistral-7b-v0.1", 2, "lora", batch=1, context=2048, lora=qv)
    add("qlora-b1-2048", "mistral-7b-v0.1", 2, "qlora", batch=1, context=2048, lora=qv)
    add("8layers-qlora-b1-2048", "mistral-7b-v0.1", 8, "qlora", batch=1, context=2048, lora=qv, steps=2)
    return out


def large_set():
    qv = dict(rank=16, targets=["q_proj", "v_proj"])
    out = []

    def add(tag, name, mode, n=None, **kw):
        mt, c = layers(name, n) if n else PUBLIC[name]
        out.append(spec(f"large-{name}-{tag}", mt, c, mode, **kw))

    add("inference-b4-8192-512", "llama-3.1-8b", "inference", batch=4, context=8192, generated=512)
    add("full-checkpointing-b1-2048", "llama-3.1-8b", "full", batch=1, context=2048, checkpointing=True,
        steps=2)
    add("lora-b4-1024", "qwen2.5-7b", "lora", batch=4, context=1024, lora=qv, steps=2)
    add("inference-b2-6144-256", "mistral-7b-v0.1", "inference", batch=2, context=6144, generated=256)
    add("full-autocast-bf16-b4-1024", "llama-3.2-1b", "full", batch=4, context=1024, autocast="bfloat16",
        steps=2)
    add("lora-8layers-b2-1024", "mixtral-8x7b", "lora", n=8, batch=2, context=1024, lora=qv, steps=2)
    # The sliding window's prefill past the window, every layer, traced (sizes only).
    add("prefill-traced-b2-6144", "mistral-7b-v0.1", "inference", batch=2, context=6144, generated=1,
        trace="sizes")
    add("qlora-8layers-b2-2048", "qwen2.5-7b", "qlora", n=8, batch=2, context=2048, lora=qv, steps=2)
    add("qlora-checkpointing-8layers-b4-1024", "llama-3.1-8b", "qlora", n=8, batch=4, context=1024, lora=qv,
        checkpointing=True, steps=2)
    add("full-adamw8bit-b4-1024", "llama-3.2-1b", "full", batch=4, context=1024, optimizer="adamw-8bit", steps=2)
    return out


# The sets recorded for the runs users launch beyond the hand-written loop (scripts/gpu/hf_loops.py).
CARDS = {"l4": 23654363627, "rtx4090": 25759066357}  # the catalog's GiB × 2^30, rounded down


def edge_set():
    """Runs on an emulated card past the planner's largest batch, where the unlimited replay's peak
    of `reserved` is far above the card and the allocator must free its cache and retry: traced,
    with what lives outside the allocator sampled layer by layer."""
    out = []

    def add(name, mt, c, mode, card, batch, **kw):
        out.append(spec(f"edge-{name}-{card}-b{batch}", mt, c, mode, batch=batch, card=card,
                        card_bytes=CARDS[card], trace="sizes", outside_samples=True, loading="pretrained",
                        steps=2, **kw))

    mt, c = "llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                          tie_word_embeddings=False)
    for b in (10, 11):
        add("llama-2-7b-inference-1024-128", mt, c, "inference", "l4", b, context=1024, generated=128)
    add("llama-2-7b-inference-1024-128-expandable", mt, c, "inference", "l4", 15, context=1024, generated=128,
        expandable=True)
    mt, c = PUBLIC["qwen2.5-0.5b"]
    add("qwen2.5-0.5b-full-autocast-1024", mt, c, "full", "rtx4090", 5, context=1024, autocast="bfloat16")
    add("qwen2.5-0.5b-full-autocast-1024-expandable", mt, c, "full", "rtx4090", 6, context=1024,
        autocast="bfloat16", expandable=True)
    return out


def distributed_set():
    """FSDP2, DDP and tensor parallelism, rank by rank through the fake process group."""
    out = []
    qv = dict(rank=8, targets=["q_proj", "v_proj"])

    def add(name, mt, c, mode, strategy, ws, rank, **kw):
        kw.setdefault("trace", "stacks")
        out.append(spec(f"dist-{name}-{strategy}-ws{ws}-r{rank}", mt, c, mode,
                        distributed=dict(strategy=strategy, world_size=ws, rank=rank), steps=2, **kw))

    c = small("llama")
    for ws, rank in ((4, 0), (4, 3), (3, 0), (3, 2)):
        add("small-llama-full", "llama", c, "full", "fsdp", ws, rank)
    add("small-llama-full-fused", "llama", c, "full", "fsdp", 4, 1, optimizer_impl="fused")
    add("small-llama-full-checkpointing", "llama", c, "full", "fsdp", 4, 0, checkpointing=True)
    add("small-llama-lora", "llama", c, "lora", "fsdp", 4, 0, lora=qv)
    add("small-llama-lora-checkpointing", "llama", c, "lora", "fsdp", 2, 1, lora=qv, checkpointing=True)
    add("small-qwen2-full", "qwen2", small("qwen2"), "full", "fsdp", 4, 2)
    add("small-mixtral-full", "mixtral", small("mixtral"), "full", "fsdp", 2, 0)
    add("small-gemma2-full", "gemma2", small("gemma2"), "full", "fsdp", 2, 1)
    add("small-llama-full", "llama", c, "full", "ddp", 2, 0)
    add("small-llama-full-autocast", "llama", c, "full", "ddp", 2, 1, autocast="bfloat16")
    add("small-llama-full-bucket-view", "llama", c, "full", "ddp", 2, 0, gradient_as_bucket_view=True)
    add("small-llama-lora", "llama", c, "lora", "ddp", 2, 0, lora=qv)
    c1 = small("llama", 1)
    for rank in (0, 1):
        add("small-llama-inference", "llama", c1, "inference", "tp", 2, rank, batch=2, context=40, generated=4)
    add("small-qwen2-inference", "qwen2", small("qwen2", 1), "inference", "tp", 2, 1, batch=2, context=40,
        generated=4)
    mt, c8 = layers("llama-3.1-8b", 2)
    for rank in (0, 7):
        add("medium-llama-3.1-8b-full", mt, c8, "full", "fsdp", 8, rank, batch=2, context=1024, trace="sizes")
    add("medium-llama-3.1-8b-lora", mt, c8, "lora", "fsdp", 8, 3, batch=2, context=1024, lora=qv, trace="sizes")
    add("medium-llama-3.1-8b-full", mt, c8, "full", "ddp", 4, 0, batch=1, context=1024, trace="sizes")
    add("medium-llama-3.1-8b-inference", mt, c8, "inference", "tp", 4, 3, batch=2, context=1024, generated=8,
        trace="sizes")
    mt, c70 = layers("llama-3.1-70b", 2)
    for ws, rank in ((64, 0), (64, 63), (12, 11)):
        add("medium-llama-3.1-70b-full-checkpointing", mt, c70, "full", "fsdp", ws, rank, batch=1, context=1024,
            checkpointing=True, trace="sizes")
    return out


def trainer_set():
    """Trainer and SFTTrainer as shipped, and the options people change."""
    out = []
    qv = dict(rank=8, targets=["q_proj", "v_proj"])
    c = small("llama")

    def add(name, mode, loop="trainer", mt="llama", config=c, **kw):
        kw.setdefault("trace", "stacks")
        kw.setdefault("lengths", [40, 29, 33])
        out.append(spec(f"{loop}-{name}", mt, config, mode, loop=loop, steps=2, **kw))

    add("small-llama-lora-bf16", "lora", lora=qv, trainer_args=dict(bf16=True))
    add("small-llama-lora-bf16-checkpointing", "lora", lora=qv, checkpointing=True, trainer_args=dict(bf16=True))
    add("small-llama-lora-dropout", "lora", lora=dict(qv, dropout=0.1), trainer_args=dict(bf16=True))
    add("small-llama-full-fp32-bf16", "full", dtype="float32", trainer_args=dict(bf16=True))
    add("small-llama-full-fp32-fp16", "full", dtype="float32", trainer_args=dict(fp16=True))
    add("small-llama-full-bf16-accumulation", "full", trainer_args=dict(bf16=True, gradient_accumulation_steps=2))
    add("small-llama-full-adamw-torch", "full", trainer_args=dict(bf16=True, optim="adamw_torch"))
    add("small-llama-full-adafactor", "full", trainer_args=dict(bf16=True, optim="adafactor"))
    add("small-llama-full-adamw-8bit", "full", trainer_args=dict(bf16=True, optim="adamw_8bit"))
    add("small-llama-full-paged-adamw-8bit", "full", trainer_args=dict(bf16=True, optim="paged_adamw_8bit"))
    add("small-llama-full-no-clip", "full", trainer_args=dict(bf16=True, max_grad_norm=0.0))
    add("small-llama-full-equal-lengths", "full", lengths=[40], trainer_args=dict(bf16=True))
    add("small-llama-full-accumulation-2-equal-lengths", "full", lengths=[40],
        trainer_args=dict(bf16=True, gradient_accumulation_steps=2))
    add("small-llama-lora-accumulation-3-equal-lengths", "lora", lora=qv, lengths=[40],
        trainer_args=dict(bf16=True, gradient_accumulation_steps=3))
    add("small-llama-full-fp32-fp16-scaler-equal-lengths", "full", dtype="float32", lengths=[40],
        trainer_args=dict(fp16=True))
    add("small-llama-lora-fp16-scaler-equal-lengths", "lora", dtype="float16", lora=qv, lengths=[40],
        trainer_args=dict(fp16=True))
    add("small-llama-lora", "lora", loop="sft", lora=qv, trainer_args=dict(bf16=True))
    add("small-llama-full", "full", loop="sft", trainer_args=dict(bf16=True))
    add("small-llama-full-padding-free", "full", loop="sft", trainer_args=dict(bf16=True, padding_free=True,
                                                                           max_length=None))
    add("small-llama-full-packing", "full", loop="sft", trainer_args=dict(bf16=True, packing=True))
    add("small-qwen2-lora", "lora", mt="qwen2", config=small("qwen2"), lora=qv, trainer_args=dict(bf16=True))
    mt, phi = layers("phi-3-mini", 2)
    add("medium-phi-3-mini-lora-checkpointing-4096", "lora", mt=mt, config=phi, batch=4, context=4096,
        lengths=[4096], checkpointing=True, trace="sizes",
        lora=dict(rank=8, targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        trainer_args=dict(bf16=True))
    mt, c8 = layers("llama-3.1-8b", 2)
    add("medium-llama-3.1-8b-lora", "lora", loop="sft", mt=mt, config=c8, batch=2, context=1024,
        lengths=[1024, 700], trace="sizes", lora=qv, trainer_args=dict(bf16=True))
    return out


def generate_set():
    """`generate` as called: sampling, penalties, left padding, beams, other caches."""
    out = []
    c = small("llama")

    def add(name, mt="llama", config=c, batch=3, context=40, generated=6, **kw):
        kw.setdefault("trace", "stacks")
        out.append(spec(f"generate-{name}", mt, config, "inference", batch=batch, context=context,
                        generated=generated, **kw))

    sample = dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9)
    add("small-llama-sample", generate=sample)
    add("small-llama-sample-padded", generate=sample, left_padding=[0, 7, 13])
    add("small-llama-greedy-padded", generate={}, left_padding=[0, 7, 13])
    add("small-llama-repetition", generate=dict(repetition_penalty=1.2))
    add("small-llama-top-p", generate=dict(do_sample=True, top_p=0.95))
    add("small-llama-beams", generate=dict(num_beams=3))
    add("small-llama-beams-sample", generate=dict(num_beams=2, do_sample=True))
    add("small-llama-static", generate=dict(cache_implementation="static"))
    add("small-llama-offloaded", generate=dict(cache_implementation="offloaded"))
    add("small-llama-max-length", generate=dict(max_length=44))
    # A user's end of sequence: one id or a list (the model's generation config), checked each step.
    add("small-llama-eos", generate=dict(eos_token_id=[1157, 1158, 1159]))
    add("small-llama-eos-one", generate=dict(eos_token_id=1159))
    add("small-llama-eos-sample", generate=dict(sample, eos_token_id=[1157, 1158, 1159]))
    add("small-llama-eos-padded", generate=dict(eos_token_id=[1157, 1158, 1159]), left_padding=[0, 7, 13])
    add("small-gemma2-sample-padded", mt="gemma2", config=small("gemma2"), generate=sample,
        left_padding=[0, 5, 9])
    mt, c8 = layers("llama-3.1-8b", 2)
    add("medium-llama-3.1-8b-sample-padded", mt=mt, config=c8, batch=4, context=1024, generated=16,
        generate=sample, left_padding=[0, 100, 300, 0], trace="sizes")
    add("medium-llama-3.1-8b-beams", mt=mt, config=c8, batch=2, context=1024, generated=8,
        generate=dict(num_beams=4), trace="sizes")
    return out


NEW_ARCHS = ["gemma", "olmo2", "granite", "cohere", "glm4", "starcoder2", "llama4_text", "gpt_oss"]


def archs_set():
    """The architectures read since, small, traced."""
    out = []
    qv = dict(rank=8, targets=["q_proj", "v_proj"])
    for mt in NEW_ARCHS:
        extra = dict(attn_implementation="eager") if mt == "gpt_oss" else {}
        for mode in ("inference", "full", "lora"):
            out.append(spec(f"arch-small-{mt}-{mode}", mt, small(mt), mode, lora=qv, trace="stacks", steps=2,
                            **extra))
        out.append(spec(f"arch-small-{mt}-lora-checkpointing", mt, small(mt), "lora", lora=qv, checkpointing=True,
                        trace="stacks", steps=2, **extra))
    return out


def quantized_set():
    """Checkpoints shipped pre-quantized, loaded with a device map, then generate or QLoRA."""
    out = []
    qv = dict(rank=8, targets=["q_proj", "v_proj"])
    c = small("llama")
    for method in ("bnb4", "bnb8", "fp8"):
        out.append(spec(f"prequantized-small-llama-{method}-inference", "llama", c, "inference",
                        loading="prequantized", quantization=dict(method=method), trace="stacks"))
    out.append(spec("prequantized-small-llama-bnb4-qlora", "llama", c, "qlora", loading="prequantized",
                    quantization=dict(method="bnb4"), lora=qv, trace="stacks", steps=2))
    mt, c8 = layers("llama-3.1-8b", 2)
    for method in ("bnb4", "fp8"):
        out.append(spec(f"prequantized-medium-llama-3.1-8b-{method}-inference", mt, c8, "inference", batch=2,
                        context=1024, generated=8, loading="prequantized", quantization=dict(method=method),
                        trace="sizes"))
    return out


SETS = {
    "small": ("Small, traced with stacks", small_set, 12),
    "medium": ("Medium, traced", medium_set, 3),
    "large": ("Large, one at a time", large_set, 1),
    "edge": ("On an emulated card past the planner's largest batch, one at a time", edge_set, 1),
    "distributed": ("Several GPUs, rank by rank through the fake process group", distributed_set, 8),
    "trainer": ("Trainer and SFTTrainer", trainer_set, 8),
    "generate": ("generate as called", generate_set, 8),
    "archs": ("Architectures read since", archs_set, 8),
    "quantized": ("Pre-quantized checkpoints", quantized_set, 3),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--only", default="", help="runs whose name contains one of these (comma-separated)")
    ap.add_argument("--sets", default="small,medium,large", help=f"comma-separated, of {','.join(SETS)}")
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    r = Report()
    r.say("# Hugging Face workloads recorded on the GPU")
    sets = [(SETS[k][0], SETS[k][1](), SETS[k][2]) for k in args.sets.split(",")]
    only = args.only.split(",")
    sets = [(title, [s for s in specs if any(o in s["name"] for o in only)], n) for title, specs, n in sets]
    # One run first, alone: a script that cannot run here stops before the rest is tried.
    first = next(specs[0] for _, specs, _ in sets if specs)
    probe = run_all([first], args.out, say=r.say)[0]
    if probe.get("outcome") not in ("ok", "oom"):
        r.say(probe.get("log_tail", ""))
        r.write(args.out / "summary.md")
        raise SystemExit(1)
    for title, specs, parallel in sets:
        r.say(f"\n## {title}\n")
        run_all([s for s in specs if s is not first], args.out, parallel=parallel, deadline=deadline, say=r.say)
    r.write(args.out / "summary.md")


if __name__ == "__main__":
    main()
