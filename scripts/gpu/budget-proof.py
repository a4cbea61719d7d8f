#!/usr/bin/env python3
"""GPU proof of `mesure_memoire transformer`: to run on a machine with an NVIDIA GPU, from the
repository root, with the release programs of scripts/prepare-gpu-run (and LD_LIBRARY_PATH set to
torch's lib and nvidia/cu13/lib, as for scripts/gpu/proof.py).

    python3 scripts/gpu/budget-proof.py --bin DIR --out FOLDER [--only TEXT]

Runs the synthetic decoder-only transformer stage by stage, each configuration in its own
process, for three shapes -- "125m" (12 layers, hidden 768), "1b" (16 layers, hidden 2048, 8 KV
heads of 32, vocabulary 128256, tied embeddings) and "7b-layers" (4 layers of a 7B model) -- in
float16 and bfloat16, in four modes each, all with batch 4, context 1024 and flash attention:
inference (64 generated tokens), full training, full training with recomputation, LoRA (rank 16
on q,k,v,o); plus full training of 125m in bfloat16 with the explicit attention; plus held-out
configurations the formulas were not derived from (HELD_OUT). Then every run is checked against
its budget (`mesure_memoire budget --against`): the exact terms must equal the allocator model's
figure to the byte and the peak of `allocated` must be predicted within 1 %. `--only TEXT` keeps
the runs whose name contains TEXT.

Writes FOLDER/<run>.json (one report per run) and FOLDER/summary.md, a table per run (stage,
allocated delta, peak allocated), also printed; neither is ever overwritten (the folder must not
hold them already). Exits non-zero if any run failed. About two minutes on an H200.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from report import Report, g

SHAPES = {
    "125m": dict(layers=12, hidden=768, heads=12, kv_heads=12, head_dim=64, intermediate=3072, vocab=32000),
    "1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, intermediate=8192, vocab=128256,
               tied_embeddings=True),
    "7b-layers": dict(layers=4, hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=32000),
}
DTYPES = ["float16", "bfloat16"]
BATCH = ["--batch", "4", "--context", "1024"]
MODES = {
    "inference": ["--mode", "inference", *BATCH, "--generated", "64", "--flash-attention"],
    "full": ["--mode", "full", *BATCH, "--flash-attention"],
    "full-checkpointing": ["--mode", "full", *BATCH, "--flash-attention", "--checkpointing"],
    "lora": ["--mode", "lora", *BATCH, "--lora-rank", "16", "--lora-targets", "q,k,v,o", "--flash-attention"],
}
EXTRA = [
    ("125m", "bfloat16", "full-explicit-attention", ["--mode", "full", *BATCH]),
    ("1b", "bfloat16", "full-explicit-attention", ["--mode", "full", *BATCH]),
    ("1b", "bfloat16", "lora-all-checkpointing",
     ["--mode", "lora", *BATCH, "--lora-rank", "32", "--lora-targets", "q,k,v,o,gate,up,down",
      "--flash-attention", "--checkpointing"]),
    ("7b-layers", "float16", "lora-mlp",
     ["--mode", "lora", "--batch", "2", "--context", "2048", "--lora-rank", "64",
      "--lora-targets", "gate,up,down", "--flash-attention"]),
    ("125m", "float32", "full", ["--mode", "full", *BATCH, "--flash-attention"]),
    ("7b-layers", "bfloat16", "inference-explicit-attention",
     ["--mode", "inference", "--batch", "8", "--context", "2048", "--generated", "16"]),
]
# A shape with grouped KV heads and biases (cuBLASLt's workspace), as Qwen2.5 has.
SHAPES["qwen-like"] = dict(layers=4, hidden=896, heads=14, kv_heads=2, head_dim=64, intermediate=4864,
                           vocab=151936, tied_embeddings=True, attention_bias=True)
# Configurations the formulas were not derived from, run after them to check them (a first set
# found four gaps, fixed in src/budget/ from PyTorch's behaviour; this set came after the fixes).
HELD_OUT = [
    ("1b", "float16", "inference-explicit-attention",
     ["--mode", "inference", "--batch", "2", "--context", "2048", "--generated", "8"]),
    ("7b-layers", "float16", "lora-qv-checkpointing",
     ["--mode", "lora", *BATCH, "--lora-rank", "8", "--lora-targets", "q,v", "--flash-attention",
      "--checkpointing"]),
    ("qwen-like", "bfloat16", "full-explicit-attention", ["--mode", "full", "--batch", "2", "--context", "512"]),
    ("1b", "bfloat16", "inference-long",
     ["--mode", "inference", "--batch", "1", "--context", "8192", "--generated", "16", "--flash-attention"]),
    ("125m", "bfloat16", "lora-down-only",
     ["--mode", "lora", *BATCH, "--lora-rank", "4", "--lora-targets", "down", "--flash-attention"]),
    ("1b", "float32", "lora", ["--mode", "lora", "--batch", "2", "--context", "512", "--lora-rank", "16",
                               "--lora-targets", "q,k,v,o", "--flash-attention"]),
    ("1b", "bfloat16", "full-explicit-checkpointing",
     ["--mode", "full", "--batch", "2", "--context", "2048", "--checkpointing"]),
    ("7b-layers", "bfloat16", "lora-all-explicit-checkpointing",
     ["--mode", "lora", "--batch", "2", "--context", "2048", "--lora-rank", "32", "--lora-targets",
      "q,k,v,o,gate,up,down", "--checkpointing"]),
]
# Terms that are arithmetic of the shape: their residual against the allocator model must be 0.
EXACT = {"weights", "kv_cache", "lora_adapters", "optimizer_states", "cublas_workspace"}
PEAK_TARGET_PERCENT = 1.0
TIMEOUT_S = 120


def shape_flags(shape):
    flags = []
    for key, value in shape.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def runs():
    for shape in SHAPES:
        for dtype in DTYPES:
            for mode, flags in MODES.items():
                yield f"{shape}-{dtype}-{mode}", shape, dtype, flags
    for shape, dtype, mode, flags in EXTRA + HELD_OUT:
        yield f"{shape}-{dtype}-{mode}", shape, dtype, flags



def signed(n):
    return ("+" if n > 0 else "−" if n < 0 else "") + g(abs(n))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="folder holding mesure_memoire and mesure_memoire_torch")
    ap.add_argument("--out", required=True, help="folder of the reports and summary.md")
    ap.add_argument("--only", default="", help="keep the runs whose name contains this text")
    a = ap.parse_args()
    mm = Path(a.bin) / "mesure_memoire"
    for program in (mm, Path(a.bin) / "mesure_memoire_torch"):
        if not program.is_file():
            print(f"budget-proof: {program} is missing: build it with scripts/prepare-gpu-run", file=sys.stderr)
            return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [r for r in runs() if a.only in r[0]]
    taken = [p for p in [out / "summary.md", *(out / f"{name}.json" for name, *_ in chosen)] if p.exists()]
    if taken:
        print(f"budget-proof: {len(taken)} result file(s) already in {out}, e.g. {taken[0]}: "
              "results are never overwritten; give a new --out", file=sys.stderr)
        return 4
    summary, failed, start = Report(), [], time.perf_counter()
    say = summary.say

    say("# Transformer bench on the GPU\n")
    for name, shape, dtype, flags in chosen:
        report = out / f"{name}.json"
        cmd = [str(mm), "transformer", *shape_flags(SHAPES[shape]), "--dtype", dtype, *flags,
               "--device", "cuda:0", "--blocks", "--quiet", "--output", str(report)]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
            code, stderr = p.returncode, p.stderr.strip()
        except subprocess.TimeoutExpired:
            code, stderr = None, f"stopped after {TIMEOUT_S} s"
        seconds = time.perf_counter() - t0
        shown = " ".join(["mesure_memoire", *cmd[1:-1], f"{name}.json"])
        say(f"## {name}\n\n`{shown}`\n")
        if code != 0 or not report.exists():
            failed.append(name)
            say(f"**FAILED** (exit {code}, {seconds:.1f} s): {stderr.splitlines()[-1] if stderr else 'no message'}\n")
            continue
        r = json.load(open(report))
        device = (r["environment"].get("device") or {}).get("name", "unknown GPU")
        weight_bytes = r["parameters"] * (4 if dtype == "float32" else 2)
        say(f"{device}, {g(r['parameters'])} parameters ({g(weight_bytes)} B of weights in {dtype}), "
            f"{seconds:.1f} s\n")
        say("| stage | allocated delta | peak allocated |\n| --- | ---: | ---: |")
        for s in r["stages"]:
            say(f"| {s['stage']} | {signed(s['allocated_after'] - s['allocated_before'])} B | "
                f"{g(s['peak_allocated'])} B |")
        say()
    total = time.perf_counter() - start
    say(f"{len(chosen)} runs in {total:.0f} s; failed: {', '.join(failed) if failed else 'none'}.\n")
    # Every run against its budget: `mesure_memoire budget --against` (no GPU needed).
    reports = sorted(str(out / f"{name}.json") for name, *_ in chosen if (out / f"{name}.json").exists())
    if reports:
        p = subprocess.run([str(mm), "budget", "--against", *reports, "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            failed.append("budget --against")
            say(f"**budget --against FAILED** (exit {p.returncode}): {p.stderr.strip()}")
        else:
            say("# Budgets against the runs\n")
            say("| run | exact terms (residual) | block maps equal to the model's | kept by forward: budget / measured | peak allocated: budget / measured | error |")
            say("| --- | --- | --- | --- | --- | ---: |")
            for path, v in zip(reports, json.loads(p.stdout)):
                exact = [c for c in v["checks"] if c["term"] in EXACT]
                wrong = [c for c in exact if c["residual"] != 0]
                kept = [c for c in v["checks"] if c["stage"] == "forward"]
                kept_text = (f"{g(kept[0]['formula']['bytes'])} / {g(kept[0]['measured']['bytes'])}" if kept else "—")
                error = v["peak_error_percent"]
                maps = v.get("maps", [])
                maps_text = f"{sum(m['equal'] for m in maps)}/{len(maps)}" + "".join(
                    f" ({m['stage']}: {m['difference']})" for m in maps if not m["equal"])
                if wrong or abs(error) >= PEAK_TARGET_PERCENT or not all(m["equal"] for m in maps):
                    failed.append(Path(path).stem)
                say(f"| {Path(path).stem} | {len(exact) - len(wrong)}/{len(exact)} exact"
                    f"{'' if not wrong else ' (' + ', '.join(c['term'] + ' ' + str(c['residual']) for c in wrong) + ')'} | "
                    f"{maps_text} | {kept_text} | {g(v['predicted_peak']['bytes'])} / {g(v['measured_peak']['bytes'])} | {error:+.4f} % |")
            say()
    say(f"Failed: {', '.join(failed) if failed else 'none'}.")
    summary.write(out / "summary.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
