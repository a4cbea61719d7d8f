#!/usr/bin/env python3
"""GPU proof of the allocator model (`mesure_memoire predict`, `measure --blocks`): to run on a
machine with an NVIDIA GPU, from the repository root, with the release programs of
scripts/prepare-gpu-run.

    python3 scripts/gpu/model-proof.py --bin DIR --out DIR [--sections grid,blocks,settings]

1. A grid of configurations × float32/float16/bfloat16, each measured in its own process by
   `mesure_memoire measure`, which records beside every phase row the model's prediction and the
   residual (measured − predicted): every residual must be 0.
2. A subset measured again with `--blocks`: the six figures of every row must be identical to the
   run without it (reading the map costs no byte), no block may be `unknown`, the map at the end of
   the last phase must equal the model's segment by segment (pool, size, named blocks), the
   tensors alive at each phase's peak must be the ones the model names, and the allocator's other
   statistics at each end (requested bytes, inactive split bytes and blocks, segments, retries,
   out-of-memory errors) the model's.
3. The workspace settings PyTorch reads (CUBLAS_WORKSPACE_CONFIG, CUBLASLT_WORKSPACE_SIZE,
   TORCH_CUBLASLT_UNIFIED_WORKSPACE, DISABLE_ADDMM_CUDA_LT), each on the seed's small run.
It writes OUT/report.md (also printed) and exits non-zero on any residual or mismatch.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from report import Report, g

MIB = 1 << 20
# name: (batch, context, width, hidden or None (4 × width), warmup, repeats)
SHAPES = {
    "tiny 1×1×1": (1, 1, 1, None, 1, 2),
    "hidden 1": (1, 1, 2, 1, 1, 2),
    "seed's first": (1, 16, 64, None, 1, 2),
    "seed's second": (2, 128, 1024, None, 3, 5),
    "odd sizes": (3, 7, 33, 97, 2, 3),
    "odd, no warm-up": (5, 11, 129, None, 0, 2),
    "one row, wide": (1, 1, 4097, None, 1, 2),
    "hidden < width": (4, 64, 1024, 256, 1, 2),
    "hidden > width": (2, 32, 64, 8192, 1, 2),
    "hidden act. = 1 MiB (f32)": (1, 256, 256, 1024, 1, 2),
    "hidden act. = 1 MiB + 1 KiB (f32)": (1, 256, 256, 1025, 1, 2),
    "hidden act. = 1 MiB − 4 KiB (f32)": (1, 255, 256, 1024, 1, 2),
    "weights = 1 MiB (f32)": (1, 8, 512, 512, 1, 2),
    "hidden act. = 2 MiB (f32)": (1, 512, 256, 1024, 1, 2),
    "hidden act. = 10 MiB (f32)": (1, 2560, 256, 1024, 1, 2),
    "hidden act. = 10 MiB + 4 KiB (f32)": (1, 2561, 256, 1024, 1, 2),
    "hidden act. = 20 MiB + 4 KiB (f32)": (1, 5121, 256, 1024, 2, 2),
    "mixed": (4, 1000, 3000, None, 2, 3),
    "larger": (16, 512, 2048, None, 1, 3),
    "several GB": (8, 4096, 8192, None, 1, 2),
}
DTYPES = ["float32", "float16", "bfloat16"]
BLOCK_SHAPES = ["tiny 1×1×1", "seed's first", "seed's second", "odd sizes", "hidden act. = 1 MiB + 1 KiB (f32)",
                "hidden act. = 10 MiB + 4 KiB (f32)", "hidden act. = 20 MiB + 4 KiB (f32)", "mixed"]
SETTINGS = [
    {"CUBLASLT_WORKSPACE_SIZE": "2048"},
    {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"},
    {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"},
    {"DISABLE_ADDMM_CUDA_LT": "1"},
]
FIGURES = ["allocated_baseline_bytes", "allocated_end_bytes", "peak_allocated_bytes",
           "reserved_baseline_bytes", "reserved_end_bytes", "peak_reserved_bytes"]



def flags(shape, dtype):
    b, c, w, h, wu, r = shape
    f = ["--batch", str(b), "--context", str(c), "--width", str(w), "--dtype", dtype,
         "--warmup", str(wu), "--repeats", str(r)]
    return f + (["--hidden", str(h)] if h else [])


def canonical(segments):
    """A map as a sorted list of (pool, size, blocks): addresses are the driver's, not compared."""
    return sorted((s["pool"], s["size"], tuple((b["label"] or "free", b["size"]) for b in s["blocks"]))
                  for s in segments)


def names(segments):
    return collections.Counter(b["label"] for s in segments for b in s["blocks"] if b["allocated"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="grid,blocks,settings",
                    help="which parts to run (the blocks part measures its configurations without "
                         "--blocks too when the grid part is left out)")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    mm = str(Path(a.bin) / "mesure_memoire")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report, failures = Report(), 0
    say = report.say

    def measure(name, shape, dtype, extra=(), env=None):
        f = out / f"{name}.json"
        t0 = time.perf_counter()
        p = subprocess.run([mm, "measure", "--device", "cuda:0", "--quiet", "--output", str(f),
                            *flags(shape, dtype), *extra], capture_output=True, text=True,
                           env={**os.environ, **(env or {})})
        if p.returncode:
            raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr}")
        return json.load(open(f)), time.perf_counter() - t0

    def verdict(m):
        model = m.get("model") or {}
        if model.get("not_predicted"):
            return None, model["not_predicted"]
        worst = max(abs(v) for row in m["phases"] for v in row["prediction"]["residual"].values())
        return worst, f'{model["exact_rows"]}/{model["rows"]}'

    say("# Allocator model against the H200\n")
    env_done = False
    grid = SHAPES if "grid" in sections else {n: SHAPES[n] for n in BLOCK_SHAPES}
    dtypes = DTYPES if "grid" in sections else ["float32"]
    say("## 1. Every figure of every phase, predicted then measured\n")
    say("| configuration | batch, context, width, hidden | warm-up, repeats | dtype | peak allocated | "
        "peak reserved | rows exact | largest residual |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    runs = rows = figures = 0
    measured = {}
    for name, shape in grid.items():
        for dtype in dtypes:
            m, _ = measure(f"grid-{len(measured)}", shape, dtype)
            measured[(name, dtype)] = m
            if not env_done:
                e = m["environment"]
                env_line = (f'{e["device"]["name"]}, compute capability {e["device"]["compute_capability"]}, '
                            f'libtorch {e["libtorch"]["version"]} (CUDA {e["libtorch"]["cuda_build"]}), '
                            f'driver {e["driver"]["kernel_module_version"]}')
                env_done = True
            worst, exact = verdict(m)
            c = m["configuration"]
            runs += 1
            rows += len(m["phases"])
            figures += 6 * len(m["phases"])
            peak_a = max(r["peak_allocated_bytes"] for r in m["phases"])
            peak_r = max(r["peak_reserved_bytes"] for r in m["phases"])
            ok = worst == 0
            failures += not ok
            say(f'| {name} | {c["batch"]}, {c["context"]}, {c["width"]}, {c["hidden"]} | {c["warmup"]}, {c["repeats"]} '
                f'| {dtype} | {g(peak_a)} B | {g(peak_r)} B ({g(round(peak_r / MIB))} MiB) | {exact} | '
                f'{worst if worst is not None else "not predicted"}{"" if ok else " **MISS**"} |')
    say(f"\nEnvironment: {env_line}.")
    say(f"\n{runs} runs, {rows} phase rows, {figures} figures; runs with a residual: {failures}.\n")

    if "blocks" not in sections:
        BLOCK_SHAPES.clear()
    say("## 2. The allocator's own map with `--blocks`\n")
    say("| configuration | figures as without `--blocks` | unknown blocks | end map = model's | "
        "tensors at each peak = model's | statistics at each end = model's |")
    say("| --- | --- | --- | --- | --- | --- |")
    for name in BLOCK_SHAPES:
        shape = SHAPES[name]
        m, _ = measure(f"blocks-{BLOCK_SHAPES.index(name)}", shape, "float32", ["--blocks"])
        plain = measured[(name, "float32")]
        same = all(r[k] == q[k] for r, q in zip(m["phases"], plain["phases"]) for k in FIGURES)
        unknown = sum(names(r["blocks"][w]).get("unknown", 0) for r in m["phases"] for w in ("at_end", "at_peak"))
        p = subprocess.run([mm, "predict", "--json", "--compute-capability",
                            m["environment"]["device"]["compute_capability"], *flags(shape, "float32")],
                           capture_output=True, text=True, check=True)
        predicted = json.loads(p.stdout)["phases"]
        end_same = canonical(m["phases"][-1]["blocks"]["at_end"]) == canonical(predicted[-1]["segments_at_end"])
        peaks_same = all(names(r["blocks"]["at_peak"]) == collections.Counter(t["name"] for t in q["live_at_peak"])
                         for r, q in zip(m["phases"], predicted))
        stats_same = all(r["blocks"]["stats_at_end"] == q["stats_at_end"] for r, q in zip(m["phases"], predicted))
        ok = same and unknown == 0 and end_same and peaks_same and stats_same
        failures += not ok
        if not end_same:
            (out / f"blocks-{BLOCK_SHAPES.index(name)}-maps.json").write_text(json.dumps(
                {"measured": canonical(m["phases"][-1]["blocks"]["at_end"]),
                 "predicted": canonical(predicted[-1]["segments_at_end"])}, indent=1))
        say(f"| {name} | {'yes' if same else '**NO**'} | {unknown} | {'yes' if end_same else '**NO**'} | "
            f"{'yes' if peaks_same else '**NO**'} | {'yes' if stats_same else '**NO**'} |")
    if BLOCK_SHAPES:
        example = m["phases"][2]["blocks"]["at_peak"]
        say("\nThe last one's `cold_forward` at its peak, as the allocator lists it:\n")
        for s in example:
            say(f'- {s["pool"]} segment of {g(s["size"])} B: ' + ", ".join(
                f'{b["label"] or "free"} {g(b["size"])} B' for b in s["blocks"]))

    say("\n## 3. Workspace settings (seed's first run, float32)\n")
    say("| setting | rows exact | largest residual | cold-pass jump in `allocated` |")
    say("| --- | --- | --- | --- |")
    for i, env in enumerate(SETTINGS if "settings" in sections else []):
        m, _ = measure(f"settings-{i}", SHAPES["seed's first"], "float32", env=env)
        worst, exact = verdict(m)
        failures += worst != 0
        cold = m["phases"][2]
        say(f'| `{" ".join(f"{k}={v}" for k, v in env.items())}` | {exact} | {worst} | '
            f'{g(cold["allocated_end_bytes"] - cold["allocated_baseline_bytes"])} B |')

    say(f"\nMismatches: {failures}.")
    report.write(out / "report.md")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
