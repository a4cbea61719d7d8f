#!/usr/bin/env python3
"""The GPU proof of the budget's replay and of the planner's verdicts, on real Hugging Face
workloads: each run of a plan (written here by `scripts/hf-proof-plan` from the budgets
`mesure_memoire budget` gives) in a fresh process of `scripts/gpu/hf-run.py`, loaded as users
load a model (`from_pretrained` with a device map).

    python3 scripts/gpu/hf-proof.py PLAN.json OUT_DIR [SECONDS]

PLAN.json: {"runs": [{"name", "spec", "kind": "grid" | "card", "expect": null | "fits" | "oom"}]}.
Grid runs go three at a time (their allocator figures are their own process's); card runs, on a
card emulated by taking the memory beyond it (`card_bytes` in the spec), go one at a time and
measure what the process holds outside the allocator. Writes OUT_DIR/<name>.json for each run and
OUT_DIR/proof.json (every record's stages, outcome and outside memory; the environment), written
again after each run so that a call stopped early keeps what ran. No run starts after the plan's
`seconds` (or SECONDS) have passed.
Standard library only (the runs need torch, transformers, peft).
"""
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hf_workloads as W  # noqa: E402


def main():
    plan = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + float(sys.argv[3] if len(sys.argv) > 3 else plan.get("seconds", 540))
    runs = plan["runs"]
    grid = [r for r in runs if r["kind"] == "grid"]
    cards = [r for r in runs if r["kind"] == "card"]
    records = []

    def save():
        summary = dict(schema="iteragpu-lab/hf-proof/1", records=[{k: v for k, v in r.items() if k != "trace"}
                                                                  for r in records])
        (out / "proof.json").write_text(json.dumps(summary, separators=(",", ":")))
    # Cards first, one at a time: each needs the GPU alone.
    for r in cards:
        if time.time() > deadline:
            print(f"- {r['name']}: not run (out of time)", flush=True)
            continue
        p, start, path = W.run_spec(r["spec"], out)
        rec = W.finish(p, start, path)
        rec["expect"] = r.get("expect")
        rec["kind"] = "card"
        print(f"- {r['name']}: {rec.get('outcome')} (expected {r.get('expect')}) in {rec['wall_s']} s", flush=True)
        records.append(rec)
        save()
    for rec in W.run_all([r["spec"] for r in grid], out, parallel=int(plan.get("parallel", 3)), deadline=deadline,
                         say=lambda s: print(s, flush=True)):
        rec["kind"] = "grid"
        records.append(rec)
        save()
    bad = [r for r in records if r["kind"] == "card" and r.get("expect") and
           (r.get("outcome") == "ok") != (r["expect"] == "fits")]
    errors = [r for r in records if r.get("outcome") not in ("ok", "oom")]
    print(f"{len(records)} runs; {len(bad)} verdicts contradicted; {len(errors)} errors", flush=True)


if __name__ == "__main__":
    main()
