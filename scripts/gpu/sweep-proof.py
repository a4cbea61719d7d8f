#!/usr/bin/env python3
"""GPU proof of `mesure_memoire sweep`: to run on a machine with NVIDIA GPUs, from the repository
root, with the release programs of scripts/prepare-gpu-run.

    python3 scripts/gpu/sweep-proof.py --bin DIR --out DIR [--sections cost,oom,limit,orphans,parallel]

1. The floor: a process that only loads libtorch and starts CUDA (`mesure_memoire environment`),
   median of 5, against the cost of a sweep point: the wall time of a whole 50-point sweep of small
   configurations divided by 50 (and the median of its `seconds` column). A spare companion (the
   next point's process, started ahead) holds no GPU context while it waits, and measures the
   same figures as a companion started for the point.
3. A sweep over batch until out of memory (it stops after two points in a row), its chart.
4. `--find-limit` for a float32 and a bfloat16 configuration: predicted and found limits, points,
   wall time.
5. Orphans and signals: `kill -9` of `mesure_memoire` during a long measurement leaves no GPU
   process and no file; SIGTERM during a sweep exits 130, keeps the completed points, leaves a
   valid CSV and no partial file.
6. With `parallel` among the sections (two GPUs): the 50-point sweep on cuda:0,cuda:1 against the
   serial one, figures compared point by point.
The default sections are cost,oom,limit,orphans.
Writes OUT/report.md (also printed); exits non-zero on any failed check.
"""
import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from report import Report, g

SMALL = ["--context", "16", "--width", "64", "--dtype", "float32", "--warmup", "1", "--repeats", "2"]
BIG = ["--context", "8192", "--width", "1024", "--hidden", "16384", "--warmup", "1", "--repeats", "2"]
FIGURES = ["allocated_baseline_bytes", "allocated_end_bytes", "peak_allocated_bytes",
           "reserved_baseline_bytes", "reserved_end_bytes", "peak_reserved_bytes"]


def companions():
    """The companion processes, measuring or spare (matched on the program that starts their own
    command line, so that a shell whose command line merely names the program is not counted)."""
    p = subprocess.run(["pgrep", "-f", r"^\S*mesure_memoire_torch( |$)"], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def gpu_processes():
    """The process ids holding a CUDA context, as the driver lists them."""
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                       capture_output=True, text=True, check=True)
    return [int(x) for x in p.stdout.split()]



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="cost,oom,limit,orphans")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    mm = str(Path(a.bin) / "mesure_memoire")
    out = Path(a.out)
    work = Path("/tmp/sweep-proof")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    say, check = report.say, report.check

    def sweep(name, extra, devices=None):
        folder = work / name
        cmd = [mm, "sweep", "--quiet", "--output", str(folder), *extra]
        if devices:
            cmd += ["--devices", devices]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        rows = list(csv.DictReader(open(folder / "sweep.csv"))) if (folder / "sweep.csv").exists() else []
        return p, dt, rows, folder

    say("# Capacity sweep on the H200\n")
    if "parallel" in sections:
        say("## Sweep on two GPUs against one\n")
        serial = sweep("serial", ["--vary", "batch", "--from", "1", "--to", "50", "--step", "1", *SMALL])
        para = sweep("parallel", ["--vary", "batch", "--from", "1", "--to", "50", "--step", "1", *SMALL],
                     devices="cuda:0,cuda:1")
        same = [r1["value"] == r2["value"] and all(r1[k] == r2[k] for k in FIGURES)
                for r1, r2 in zip(serial[2], para[2])]
        say(f"| run | points | wall time |\n| --- | --- | --- |\n| one GPU | {len(serial[2])} | {serial[1]:.1f} s |"
            f"\n| two GPUs (`--devices cuda:0,cuda:1`) | {len(para[2])} | {para[1]:.1f} s |\n")
        check(serial[0].returncode == 0 and para[0].returncode == 0, "both sweeps exit 0")
        check(len(same) == 50 and all(same), "the six figures of every point identical in both runs")

    if "cost" in sections:
        cost(sweep, mm, say, check)
        spare(Path(a.bin) / "mesure_memoire_torch", work, say, check)
    if "oom" in sections:
        oom(sweep, mm, say, check, out)
    if "limit" in sections:
        limit(sweep, say, check)
    if "orphans" in sections:
        orphans(mm, work, say, check)
    say(f"\nFailed checks: {report.failures}.")
    report.write(out / "report.md")
    return 1 if report.failures else 0


def cost(sweep, mm, say, check):
    say("## 1. Cost of a point against the floor\n")
    floor = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([mm, "environment", "--json"], capture_output=True, check=True)
        floor.append(time.perf_counter() - t0)
    p, dt, rows, _ = sweep("small-50", ["--vary", "batch", "--from", "1", "--to", "50", "--step", "1", *SMALL])
    libraries = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([str(Path(mm).with_name("mesure_memoire_torch")), "--version"], capture_output=True, check=True)
        libraries.append(time.perf_counter() - t0)
    f = statistics.median(floor)
    per_point = dt / max(len(rows), 1)
    column = statistics.median(float(r["seconds"]) for r in rows)
    say(f"| figure | seconds |\n| --- | --- |\n| floor: `mesure_memoire environment` (loads libtorch, starts CUDA), median of 5 | {f:.3f} |"
        f"\n| of which loading the libraries: `mesure_memoire_torch --version`, median of 5 | {statistics.median(libraries):.3f} |"
        f"\n| a sweep point: the whole 50-point sweep's wall time / 50 | {per_point:.3f} |"
        f"\n| ratio | {per_point / f:.2f} |"
        f"\n| a sweep point: median of the `seconds` column (its process given its point, to its exit) | {column:.3f} |"
        f"\n| the 50-point sweep, whole command | {dt:.1f} |\n")
    check(p.returncode == 0 and len(rows) == 50 and all(r["status"] == "ok" for r in rows), "50 points measured")
    check(per_point <= 1.1 * f, "a point costs at most 1.1 × the floor")
    check(dt <= 45, "the 50-point sweep takes at most 45 s")


def spare(companion, work, say, check):
    """A spare companion waits with its libraries loaded and no CUDA context, then measures the same
    figures as a companion started with its command line."""
    say("\n### The spare companion\n")
    args = ["measure", "--device", "cuda:0", "--batch", "8", *SMALL, "--quiet", "--output"]
    s = subprocess.Popen([str(companion)], env={**os.environ, "IGL_SPARE": "1"}, stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(3)
    waiting, on_gpu = s.poll() is None, gpu_processes()
    given = "\0".join([*args, str(work / "spare.json")]) + "\0"
    _, err = s.communicate(given.encode())
    plain = subprocess.run([str(companion), *args, str(work / "plain.json")], capture_output=True, text=True)
    check(waiting and s.pid not in on_gpu and not on_gpu,
          f"a spare waiting 3 s holds no CUDA context (processes on the GPU: {on_gpu or 'none'})")
    same = False
    if s.returncode == 0 and plain.returncode == 0:
        figures = [[[ph[k] for k in FIGURES] for ph in json.load(open(work / f))["phases"]]
                   for f in ("spare.json", "plain.json")]
        same = figures[0] == figures[1]
    check(same, f"given its point, it measures the six figures of every phase as a plain companion does "
                f"(exit {s.returncode} {err.decode().strip()[-200:]})")


def oom(sweep, mm, say, check, out):
    say("\n## 2. A sweep over batch until out of memory\n")
    p, dt, rows, folder = sweep("batch-oom", ["--vary", "batch", "--from", "32", "--to", "1024", "--step", "32",
                                              "--dtype", "bfloat16", *BIG])
    say("| batch | status | peak allocated | peak reserved | predicted peak reserved | seconds |")
    say("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        say(f'| {r["value"]} | {r["status"]} {r["oom_phase"]} | {g(r["peak_allocated_bytes"] or 0)} B | '
            f'{g(r["peak_reserved_bytes"] or 0)} B | {g(r["predicted_peak_reserved_bytes"] or 0)} B | {float(r["seconds"]):.2f} |')
    exact = all(r["peak_reserved_bytes"] == r["predicted_peak_reserved_bytes"] for r in rows if r["status"] == "ok")
    say(f"\n{len(rows)} points in {dt:.1f} s.")
    check(p.returncode == 0 and sum(r["status"] == "oom" for r in rows) == 2, "the sweep ran past the boundary and stopped after two out-of-memory points")
    check(exact, "every measured peak reserved equals the predicted one")
    subprocess.run([mm, "plot", "--sweep", str(folder), "--output", str(out / "sweep-batch-oom.svg")], check=True)
    for name in ("sweep.csv", "sweep.json"):
        shutil.copy(folder / name, out / f"batch-oom-{name}")


def limit(sweep, say, check):
    say("\n## 3. The limit, predicted then verified\n")
    say("| dtype | predicted | found | points | wall time | how |\n| --- | --- | --- | --- | --- | --- |")
    for dtype in ("float32", "bfloat16"):
        p, dt, rows, folder = sweep(f"limit-{dtype}", ["--vary", "batch", "--from", "1", "--to", "4096",
                                                       "--find-limit", "--dtype", dtype, *BIG])
        limit = json.load(open(folder / "sweep.json"))["limit"] or {}
        say(f'| {dtype} | {limit.get("predicted")} | {limit.get("found")} | {limit.get("points")} | {dt:.1f} s | {limit.get("how")} |')
        found = limit.get("found")
        ok_at = {int(r["value"]): r["status"] for r in rows}
        check(p.returncode == 0 and found is not None and ok_at.get(found) == "ok" and ok_at.get(found + 1) == "oom",
              f"{dtype}: the found limit fits and the next value runs out of memory, both measured")


def orphans(mm, work, say, check):
    say("\n## 4. No orphan, no partial file\n")
    target = work / "killed.json"
    front = subprocess.Popen([mm, "measure", "--device", "cuda:0", "--batch", "64", "--context", "8192", "--width", "1024",
                              "--hidden", "16384", "--dtype", "bfloat16", "--warmup", "10000", "--repeats", "1",
                              "--quiet", "--output", str(target)])
    time.sleep(6)
    companion_seen = bool(companions())
    front.send_signal(signal.SIGKILL)
    front.wait()
    time.sleep(2)
    left = bool(companions())
    check(companion_seen and not left, "kill -9 of mesure_memoire during a measurement: its GPU process is gone too")
    check(not target.exists() and not list(work.glob(".killed*")), "and no file is left")
    folder = work / "terminated"
    sw = subprocess.Popen([mm, "sweep", "--quiet", "--output", str(folder), "--vary", "batch", "--from", "1", "--to", "200",
                           "--step", "1", *SMALL])
    time.sleep(8)
    sw.send_signal(signal.SIGTERM)
    code = sw.wait()
    time.sleep(1)
    rows = list(csv.DictReader(open(folder / "sweep.csv")))
    jsons = sorted(folder.glob("point-*.json"))
    left = bool(companions())
    check(code == 130, f"SIGTERM during a sweep: exit {code} (130 expected)")
    check(0 < len(rows) < 200 and len(jsons) == len(rows) and all(r["status"] == "ok" for r in rows),
          f"{len(rows)} completed points kept, one measurement file each, the CSV valid")
    check(not left and not [p for p in folder.iterdir() if p.name.startswith(".")], "no GPU process and no partial file left")
    p = subprocess.run([mm, "sweep", "--quiet", "--output", str(folder), "--resume", "--vary", "batch", "--from", "1",
                        "--to", "200", "--step", "50", *SMALL], capture_output=True, text=True)
    rows2 = list(csv.DictReader(open(folder / "sweep.csv")))
    check(p.returncode == 0 and len(rows2) >= len(rows), f"--resume continues it ({len(rows2)} rows)")


if __name__ == "__main__":
    sys.exit(main())
