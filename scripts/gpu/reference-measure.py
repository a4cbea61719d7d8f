#!/usr/bin/env python3
"""Reference: the same measurement protocol through PyTorch's own Python API.

Used by scripts/gpu/proof.py to check, byte for byte, the allocator figures that `mesure_memoire
measure` reads through libtorch, and as the baseline of the speed benchmark. Same phases, same
network (nn.Sequential(Linear, GELU, Linear) built on the CPU in float32, then moved), same
readings: memory_allocated, memory_reserved, max_memory_allocated, max_memory_reserved after
reset_peak_memory_stats. Prints nothing but the JSON file it writes.
"""
import argparse
import json
import os
import sys
import time

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", required=True)
    for name in ("batch", "context", "width", "warmup", "repeats"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--hidden", type=int)
    p.add_argument("--dtype", choices=DTYPES, required=True)
    p.add_argument("--output", required=True)
    a = p.parse_args()
    if os.path.exists(a.output):
        print(f"{a.output} exists", file=sys.stderr)
        return 4
    if not torch.cuda.is_available():
        print("CUDA unavailable", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    dtype = DTYPES[a.dtype]
    hidden = a.hidden or 4 * a.width
    torch.cuda.init()
    torch.manual_seed(0)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    state = {"model": None, "x": None, "out": None}
    rows = []

    def phase(name, repetition, passes, work):
        torch.cuda.synchronize(dev)
        base_a = torch.cuda.memory_allocated(dev)
        base_r = torch.cuda.memory_reserved(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        start.record()
        work()
        end.record()
        end.synchronize()
        gpu_ms = start.elapsed_time(end)
        torch.cuda.synchronize(dev)
        host_ms = (time.perf_counter() - t0) * 1e3
        rows.append({
            "phase": name, "repetition": repetition, "passes": passes,
            "allocated_baseline_bytes": base_a,
            "allocated_end_bytes": torch.cuda.memory_allocated(dev),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
            "reserved_baseline_bytes": base_r,
            "reserved_end_bytes": torch.cuda.memory_reserved(dev),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev),
            "host_wall_time_ms": host_ms, "gpu_event_time_ms": gpu_ms,
        })
        state["out"] = None

    def load():
        model = torch.nn.Sequential(
            torch.nn.Linear(a.width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, a.width))
        state["model"] = model.to(device=dev, dtype=dtype)

    def inputs():
        state["x"] = torch.randn(a.batch, a.context, a.width, device=dev, dtype=dtype)

    def forward():
        with torch.no_grad():
            state["out"] = state["model"](state["x"])

    def warmup():
        for _ in range(a.warmup):
            state["out"] = None
            forward()

    phase("model_load", None, 0, load)
    phase("inputs", None, 0, inputs)
    phase("cold_forward", None, 1, forward)
    phase("warmup", None, a.warmup, warmup)
    for r in range(1, a.repeats + 1):
        phase("warm_forward", r, 1, forward)
    with open(a.output, "x") as f:
        json.dump({"torch": torch.__version__, "phases": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
