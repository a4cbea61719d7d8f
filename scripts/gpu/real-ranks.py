#!/usr/bin/env python3
"""Runs workloads over several real GPUs, one fresh `hf-run.py` process per rank (each given its
GPU as device 0, NCCL as the backend, NVLink multicast off), and writes each rank's record and a
summary of every rank's stages (peak `allocated` and `reserved`, what lived outside the allocator)
beside the same rank's record through the fake process group, where one was recorded:

    python3 scripts/gpu/real-ranks.py OUT_DIR FAKE_RECORD.json.gz [...]

Each FAKE_RECORD (`docs/gpu-runs/*/dist-*.json.gz`) gives the spec; its world size is run on as
many GPUs, every rank. Writes OUT_DIR/summary.json. Standard library and the GPU machine's Python.
"""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGE_FIELDS = ("stage", "peak_allocated", "peak_reserved", "outside_after")


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    for i, fake_path in enumerate(sys.argv[2:]):
        fake = json.load(gzip.open(fake_path))
        spec = dict(fake["spec"])
        spec.pop("trace", None)
        world = spec["distributed"]["world_size"]
        name = spec["name"].rsplit("-r", 1)[0] + "-nccl"
        procs = []
        for rank in range(world):
            s = dict(spec, name=f"{name}-r{rank}",
                     distributed=dict(spec["distributed"], rank=rank, backend="nccl", port=29600 + i))
            spec_path, result = out / f"{s['name']}.spec.json", out / f"{s['name']}.json"
            spec_path.write_text(json.dumps(s))
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(rank), NCCL_NVLS_ENABLE="0",
                       TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            log = open(out / f"{s['name']}.log", "w")
            procs.append((rank, result, subprocess.Popen(
                [sys.executable, str(HERE / "hf-run.py"), str(spec_path), str(result)],
                env=env, stdout=log, stderr=subprocess.STDOUT)))
        for rank, result, p in procs:
            p.wait(timeout=600)
            rec = json.loads(result.read_text()) if result.exists() else {"outcome": "no record"}
            stages = [{k: st.get(k) for k in STAGE_FIELDS} for st in rec.get("stages", [])]
            row = dict(name=f"{name}-r{rank}", world_size=world, rank=rank, outcome=rec.get("outcome"),
                       message=rec.get("message"), stages=stages,
                       environment=rec.get("environment"))
            if fake["spec"]["distributed"]["rank"] == rank:
                row["fake"] = dict(record=Path(fake_path).name,
                                   stages=[{k: st.get(k) for k in STAGE_FIELDS} for st in fake["stages"]])
            summary.append(row)
            print(f"- {row['name']}: {row['outcome']} {row.get('message') or ''}", flush=True)
            for st in stages:
                other = next((f for f in row.get("fake", {}).get("stages", []) if f["stage"] == st["stage"]), None)
                print(f"    {st['stage']:18} allocated {st['peak_allocated']:>14} reserved {st['peak_reserved']:>14}"
                      + (f"   fake: {other['peak_allocated']:>14} {other['peak_reserved']:>14}" if other else ""),
                      flush=True)
    (out / "summary.json").write_text(json.dumps(dict(schema="iteragpu-lab/real-ranks/1", runs=summary), indent=1))


if __name__ == "__main__":
    main()
