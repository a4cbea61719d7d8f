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

from hf_workloads import PUBLIC, run_all, small, spec
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--only", default="", help="runs whose name contains one of these (comma-separated)")
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    r = Report()
    r.say("# Hugging Face workloads recorded on the GPU")
    sets = [("Small, traced with stacks", small_set(), 12), ("Medium, traced", medium_set(), 3),
            ("Large, one at a time", large_set(), 1)]
    only = args.only.split(",")
    sets = [(title, [s for s in specs if any(o in s["name"] for o in only)], n) for title, specs, n in sets]
    # One run first, alone: a script that cannot run here stops before the rest is tried.
    first = next(specs[0] for _, specs, _ in sets if specs)
    probe = run_all([first], args.out, say=r.say)[0]
    if probe.get("outcome") != "ok":
        r.say(probe.get("log_tail", ""))
        r.write(args.out / "summary.md")
        raise SystemExit(1)
    for title, specs, parallel in sets:
        r.say(f"\n## {title}\n")
        run_all([s for s in specs if s is not first], args.out, parallel=parallel, deadline=deadline, say=r.say)
    r.write(args.out / "summary.md")


if __name__ == "__main__":
    main()
