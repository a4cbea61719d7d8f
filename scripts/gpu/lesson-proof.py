#!/usr/bin/env python3
"""GPU proof of `mesure_memoire lesson` and of what notebooks/allocated-vs-reserved.ipynb says, to
run on a machine with an NVIDIA GPU, from the repository root, with the release programs of
scripts/prepare-gpu-run (LD_LIBRARY_PATH set to PyTorch's libraries, as for scripts/gpu/proof.py).

    python3 scripts/gpu/lesson-proof.py --bin DIR --out FOLDER [--device cuda:0]

1. Runs the lesson twice, each in a fresh process, with no allocator or workspace setting inherited:
   with PyTorch's default settings into FOLDER/exemple-lecon-h200.json, and with
   `--expandable-segments` into FOLDER/exemple-lecon-h200-expandable.json (the two files the
   notebook shows, labelled as recorded elsewhere, where there is no GPU: copy them into data/).
2. Checks the refusals: the same command again exits 4 and leaves the file untouched; a
   PYTORCH_CUDA_ALLOC_CONF that conflicts with --expandable-segments exits 64 and writes nothing.
3. Checks every claim the notebook's text makes against the default record, and that every step's
   measured allocated, reserved, both peaks, requested, segment count and statistics equal the
   allocator model's prediction recorded beside them (the runtime's view, `GPU used`, is not
   predicted; the last two steps are predicted given the free memory the runtime reported when they
   started, which the model cannot know).
4. With expandable segments, asserts only what PyTorch's source guarantees (2.11,
   c10/cuda/CUDACachingAllocator.cpp: no segment and no inactive split block is counted, large-pool
   pages of 20 MiB and small-pool pages of 2 MiB, the 512-byte rounding, a block split whenever
   512 bytes remain) and reports, without asserting, what else differs from the default run
   (reserved growth, the map, the retries counter).
Writes FOLDER/lesson-proof.md (also printed); exits non-zero on any failed check.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from report import Report, g

MIB = 1 << 20
DEFAULT_FILE = "exemple-lecon-h200.json"
EXPANDABLE_FILE = "exemple-lecon-h200-expandable.json"
# Settings that change what the allocator or cuBLAS do: none reaches the lesson's processes.
CLEARED = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
           "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
           "DISABLE_ADDMM_CUDA_LT"]
PREDICTED_FIGURES = ["allocated", "reserved", "peak_allocated", "peak_reserved", "requested",
                     "segments"]



class Lesson:
    """A lesson record, its steps found by what they do."""

    def __init__(self, path):
        self.record = json.loads(Path(path).read_text())
        self.steps = self.record["steps"]

    def at(self, op, name=None):
        for i, s in enumerate(self.steps):
            step = s["step"] or {}
            if step.get("op") == op and (name is None or step.get("name") == name):
                return i
        raise KeyError(f"no step {op} {name or ''}")

    def r(self, i):
        return self.steps[i]["reading"]

    def stats(self, i):
        return self.steps[i]["stats"]

    def delta(self, i, field):
        return self.r(i)[field] - self.r(i - 1)[field]

    def blocks(self, i):
        return [b for seg in self.steps[i]["map"] for b in seg["blocks"]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="folder of mesure_memoire and mesure_memoire_torch")
    ap.add_argument("--out", required=True, help="folder for the two records and the report")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    mm = str(Path(a.bin).resolve() / "mesure_memoire")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    default_path, expandable_path = out / DEFAULT_FILE, out / EXPANDABLE_FILE
    for p in (default_path, expandable_path):
        if p.exists():
            print(f"{p} exists: give a new --out folder (a record is never overwritten)",
                  file=sys.stderr)
            return 2
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    report = Report()
    say, check = report.say, report.check

    def lesson(path, extra=(), extra_env=None):
        cmd = [mm, "lesson", "--device", a.device, "--output", str(path), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, env={**env, **(extra_env or {})})

    say("# The allocated-vs-reserved lesson on the GPU\n")
    say("## 1. Both runs, each in a fresh process\n")
    runs = {}
    for title, path, extra in (("default settings", default_path, ()),
                               ("expandable segments", expandable_path, ("--expandable-segments",))):
        p = lesson(path, extra)
        ok = check(p.returncode == 0 and path.exists(),
                   f"`mesure_memoire lesson {' '.join(extra)}` ({title}): exit {p.returncode}")
        if not ok:
            say("  - " + " / ".join((p.stderr or p.stdout).strip().splitlines()[-3:]))
            continue
        runs[title] = Lesson(path)
        say("\n```text\n" + p.stdout.rstrip() + "\n```\n")
    if len(runs) < 2:
        say(f"\nFailed checks: {report.failures}.")
        report.write(out / "lesson-proof.md")
        return 1
    d, e = runs["default settings"], runs["expandable segments"]
    env_d = d.record["environment"]
    dev = env_d.get("device") or {}
    say(f"GPU: {dev.get('name')} (compute capability {dev.get('compute_capability')}), libtorch "
        f"{env_d['libtorch'].get('version')}, CUDA {env_d['libtorch'].get('cuda_runtime')}, driver "
        f"{env_d['driver'].get('kernel_module_version')}.\n")

    say("## 2. Refusals\n")
    before = default_path.read_bytes()
    p = lesson(default_path)
    check(p.returncode == 4 and default_path.read_bytes() == before,
          f"the same output again: exit {p.returncode}, file untouched")
    refused = out / "refused.json"
    p = lesson(refused, ("--expandable-segments",), {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    check(p.returncode == 64 and not refused.exists(),
          f"--expandable-segments with PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64: exit {p.returncode}, nothing written")

    say("\n## 3. The notebook's claims, on the run with default settings\n")
    check(d.record["allocator_configuration"] is None
          and not d.record["allocator_settings"]["expandable_segments"],
          "the default run had no allocator setting")
    i = d.at("allocate", "a")
    check(d.delta(i, "allocated") == 512 and d.delta(i, "requested") == 1,
          f"1 B: allocated +{d.delta(i, 'allocated')} (512 expected), requested +{d.delta(i, 'requested')} (1)")
    check(d.delta(i, "reserved") == 2 * MIB,
          f"the first small allocation: reserved +{g(d.delta(i, 'reserved'))} (2 097 152)")
    i = d.at("allocate", "b")
    check(d.delta(i, "allocated") == 1024 and d.delta(i, "reserved") == 0,
          f"1000 B: allocated +{d.delta(i, 'allocated')} (1024), reserved +{d.delta(i, 'reserved')} (same segment)")
    i = d.at("allocate", "c")
    check(d.delta(i, "reserved") == 20 * MIB,
          f"1.5 MiB: reserved +{g(d.delta(i, 'reserved'))} (20 971 520)")
    i = d.at("allocate", "big")
    check(d.delta(i, "reserved") == 100 * MIB and d.delta(i, "allocated") == 100 * MIB,
          f"100 MiB: reserved +{g(d.delta(i, 'reserved'))}, allocated +{g(d.delta(i, 'allocated'))} (104 857 600)")
    i = d.at("free", "big")
    check(d.delta(i, "allocated") == -100 * MIB and d.delta(i, "reserved") == 0,
          f"free big: allocated {g(d.delta(i, 'allocated'))}, reserved +{d.delta(i, 'reserved')}")
    i = d.at("allocate", "reuse")
    check(d.delta(i, "reserved") == 0 and d.delta(i, "allocated") == 60 * MIB,
          f"reuse 60 MiB: reserved +{d.delta(i, 'reserved')}, allocated +{g(d.delta(i, 'allocated'))}")
    seg = next((s for s in d.steps[i]["map"] if s["size"] == 100 * MIB), None)
    check(seg is not None and len(seg["blocks"]) == 2
          and seg["blocks"][0]["label"] == "reuse" and seg["blocks"][0]["size"] == 60 * MIB
          and not seg["blocks"][1]["allocated"] and seg["blocks"][1]["size"] == 40 * MIB
          and seg["blocks"][1]["inactive_split"]
          and d.stats(i)["inactive_split_bytes"] >= 40 * MIB,
          "the map after the reuse: 60 MiB at the front of the 100 MiB segment, 40 MiB free after "
          "it, counted as inactive split")
    i = d.at("allocate", "odd")
    check(d.delta(i, "allocated") == 102 * MIB and d.delta(i, "reserved") == 102 * MIB,
          f"101 MiB + 1 B: allocated +{g(d.delta(i, 'allocated'))}, reserved +{g(d.delta(i, 'reserved'))} (106 954 752)")
    odd = [b for b in d.blocks(i) if b["label"] == "odd"]
    check(len(odd) == 1 and odd[0]["size"] == 102 * MIB and odd[0]["requested_size"] == 101 * MIB + 1,
          "the map: one 102 MiB block named odd, 101 MiB + 1 B requested")
    reset = d.at("reset_peaks")
    check(d.r(reset)["peak_allocated"] == d.r(reset)["allocated"]
          and d.r(reset)["peak_reserved"] == d.r(reset)["reserved"],
          "after the reset the peaks are the current values")
    fb = d.at("free", "burst")
    base, after = d.r(reset), d.r(fb)
    check(after["allocated"] == base["allocated"], "the burst allocated and freed: allocated back where it was")
    check(after["reserved"] - base["reserved"] == 256 * MIB,
          f"reserved stays up by {g(after['reserved'] - base['reserved'])} (268 435 456)")
    check(after["peak_allocated"] >= base["allocated"] + 256 * MIB
          and after["peak_reserved"] >= base["reserved"] + 256 * MIB,
          f"both peaks include the burst ({g(after['peak_allocated'])}, {g(after['peak_reserved'])})")
    c1, c2 = d.at("matmul", "C"), d.at("matmul", "C2")
    check(d.delta(c1, "allocated") > 4194304,
          f"first 1024² float32 product: allocated +{g(d.delta(c1, 'allocated'))} (> 4 194 304: the workspace)")
    check(any(b["label"] == "cublas_workspace" for b in d.blocks(c1)),
          "the map after it holds the cuBLAS workspace")
    check(d.delta(c2, "allocated") == 4194304,
          f"second product (after freeing C): allocated +{g(d.delta(c2, 'allocated'))} (4 194 304)")
    outside = [s["reading"]["runtime_used"] - s["reading"]["reserved"] for s in d.steps]
    check(all(x > 0 for x in outside),
          f"GPU used − reserved > 0 at every step (first {g(outside[0])} B)")
    check(outside[c1] > outside[c1 - 1],
          f"it grows at the first product (cuBLAS's handle): {g(outside[c1 - 1])} -> {g(outside[c1])}")
    ec = d.at("empty_cache")
    check(d.delta(ec, "reserved") < 0, f"empty_cache: reserved {g(d.delta(ec, 'reserved'))}")
    check(all(any(b["allocated"] for b in s["blocks"]) for s in d.steps[ec]["map"])
          and any(any(not b["allocated"] for b in s["blocks"]) for s in d.steps[ec]["map"])
          and d.stats(ec)["inactive_split_bytes"] > 0,
          "after it every segment holds a live block, and a segment with a live block stays "
          "whole, its free part included")
    fill, more = d.at("fill_cache"), d.at("beyond_free")
    rf, rm = d.steps[fill]["resolved"], d.steps[more]["resolved"]
    check(d.delta(fill, "reserved") == rf["bytes"] and d.delta(fill, "allocated") == 0,
          f"fill the cache: {g(rf['bytes'])} B ({rf['bytes'] / rf['runtime_free']:.0%} of the free "
          f"{g(rf['runtime_free'])} B) allocated and freed, still reserved")
    check(rm["bytes"] > rm["runtime_free"] and rm["bytes"] < rm["runtime_free"] + rm["releasable"],
          f"then asked {g(rm['bytes'])} B: more than the {g(rm['runtime_free'])} B free, less than "
          f"free + the {g(rm['releasable'])} B the cache could give back")
    retries = d.stats(more)["alloc_retries"] - d.stats(more - 1)["alloc_retries"]
    check(retries == 1 and d.stats(more)["ooms"] == 0,
          f"num_alloc_retries +{retries} (1), num_ooms {d.stats(more)['ooms']} (0)")
    check(any(b["label"] == "more" and b["size"] == rm["bytes"] for b in d.blocks(more)),
          "the allocation succeeded: its block is in the map")
    check(d.r(more)["reserved"] == d.r(fill - 1)["reserved"] + rm["bytes"],
          "the cached segment was released before the new one: reserved = before the fill + the new block")

    say("\n## 4. Measured against the allocator model's prediction (default settings)\n")
    pred = d.record.get("prediction")
    if not check(pred is not None, "the record holds the model's prediction"):
        say(f"  - {d.record.get('not_predicted')}")
    else:
        ps = pred["steps"]
        check(len(ps) == len(d.steps), f"{len(ps)} predicted steps for {len(d.steps)} measured")
        differ = []
        for k, (s, p) in enumerate(zip(d.steps, ps)):
            bad = [f for f in PREDICTED_FIGURES if s["reading"][f] != p["reading"][f]]
            bad += [f"stats.{f}" for f in s["stats"] if s["stats"][f] != p["stats"][f]]
            if bad:
                differ.append(f"step {k + 1} ({s['reading']['step']}): " + ", ".join(
                    f"{f} measured/predicted" for f in bad))
        check(not differ, "allocated, reserved, both peaks, requested, segments and every statistic "
              "equal to the prediction at every step (GPU used excluded: the model sees only the "
              "allocator; the last two steps sized from the measured free memory)")
        for x in differ:
            say(f"  - {x}")

    say("\n## 5. With expandable segments\n")
    check(e.record["allocator_settings"]["expandable_segments"]
          and e.record["allocator_configuration"] == "expandable_segments:True",
          "the allocator reported expandable segments on, set through PYTORCH_CUDA_ALLOC_CONF")
    differ = []
    predicted = (e.record.get("prediction") or {}).get("steps") or []
    for k, (s, p) in enumerate(zip(e.steps, predicted)):
        bad = [f for f in PREDICTED_FIGURES if s["reading"][f] != p["reading"][f]]
        bad += [f"stats.{f}" for f in s["stats"] if s["stats"][f] != p["stats"][f]]
        if bad:
            differ.append(f"step {k + 1} ({s['reading']['step']}): " + ", ".join(bad))
    check(len(predicted) == len(e.steps) and not differ,
          "the prediction recorded with expandable segments equals every step: allocated, reserved, "
          "both peaks, requested, segments and every statistic")
    for x in differ:
        say(f"  - {x}")
    check(all(s["stats"]["segments"] == 0 and s["reading"]["segments"] == 0 for s in e.steps),
          "no segment counted at any step (alloc_block returns before counting one; map_block adds "
          "to reserved_bytes only)")
    check(all(s["stats"]["inactive_split_bytes"] == 0 and s["stats"]["inactive_split_blocks"] == 0
              for s in e.steps),
          "no inactive split bytes or blocks at any step (free_block and alloc_found_block leave "
          "expandable segments out)")
    i = e.at("allocate", "a")
    check(e.delta(i, "allocated") == 512 and e.delta(i, "requested") == 1,
          "1 B: allocated +512, requested +1 (round_size does not change)")
    i = e.at("allocate", "b")
    check(e.delta(i, "allocated") == 1024, "1000 B: allocated +1024")
    i = e.at("allocate", "odd")
    check(e.delta(i, "allocated") == 101 * MIB + 512,
          f"101 MiB + 1 B: allocated +{g(e.delta(i, 'allocated'))} (105 906 688: should_split "
          "splits whenever 512 bytes remain)")
    pages = all((seg["size"] % (20 * MIB if seg["pool"] == "large" else 2 * MIB)) == 0
                for s in e.steps for seg in s["map"])
    check(pages, "every mapped range of the large pool a multiple of 20 MiB, of the small pool of 2 MiB")
    check(all(s["reading"]["reserved"] % (2 * MIB) == 0 for s in e.steps),
          "reserved a multiple of 2 MiB at every step")
    say("\nWhat differs from the default run (reported, not asserted):\n")
    say("| step | Δ reserved (default) | Δ reserved (expandable) | segments in the map (default / expandable) | retries (default / expandable) |")
    say("| --- | --- | --- | --- | --- |")
    for k in range(1, min(len(d.steps), len(e.steps))):
        say(f"| {k + 1}. {d.r(k)['step']} | {g(d.delta(k, 'reserved'))} | {g(e.delta(k, 'reserved'))} "
            f"| {len(d.steps[k]['map'])} / {len(e.steps[k]['map'])} "
            f"| {d.stats(k)['alloc_retries']} / {e.stats(k)['alloc_retries']} |")
    em = e.at("beyond_free")
    say(f"\nThe last step with expandable segments: num_alloc_retries "
        f"{e.stats(em)['alloc_retries'] - e.stats(em - 1)['alloc_retries']:+d}, reserved "
        f"{g(e.delta(em, 'reserved'))} B (the default run: +1 retry, "
        f"{g(d.delta(more, 'reserved'))} B).")

    say(f"\nFailed checks: {report.failures}.")
    report.write(out / "lesson-proof.md")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
