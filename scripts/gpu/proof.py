#!/usr/bin/env python3
"""GPU proof of `mesure_memoire measure`, to run on a machine with an NVIDIA GPU and PyTorch.

    python3 scripts/gpu/proof.py --bin DIR --out DIR [--tests TEST_BINARY ...]

DIR holds the release programs from scripts/build (mesure_memoire, mesure_memoire_torch). It:
1. runs the seed's two command lines and `environment`;
2. for 3 configurations (one of several GB) × float32/float16/bfloat16, runs the Rust program and
   scripts/gpu/reference-measure.py (PyTorch's Python API) side by side and compares every allocator
   figure of every phase, byte for byte;
3. checks the refusals: out-of-memory (exit 3, no file), missing device (exit 2), existing output
   (exit 4), libtorch not loadable (exit 2, no file);
4. runs the GPU-gated Rust tests given with --tests, and the notebooks' code cells turned into
   programs (--notebooks), checking that every cell measured for real (no "no GPU" path taken);
5. benchmarks whole-process wall time of a small measurement and the warm-pass host overhead
   (host time minus CUDA-event time), Rust against the Python reference.
It prints a Markdown report (also written to OUT/report.md) and exits non-zero on any difference.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from report import Report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def fallback_labels():
    """The words that mark a figure not measured here, read from their one definition in
    src/markup.rs (module `labels`), so that this check and the notebooks cannot drift apart."""
    import re
    text = (ROOT / "src" / "markup.rs").read_text()
    block = text[text.index("pub mod labels"):]
    block = block[:block.index("\n}")]
    return re.findall(r'pub const \w+: &str = "([^"]+)";', block)
FIELDS = ["allocated_baseline_bytes", "allocated_end_bytes", "peak_allocated_bytes",
          "reserved_baseline_bytes", "reserved_end_bytes", "peak_reserved_bytes"]
CONFIGS = [
    ("seed-small", dict(batch=1, context=16, width=64, warmup=1, repeats=2)),
    ("seed-large", dict(batch=2, context=128, width=1024, warmup=3, repeats=5)),
    ("several-gb", dict(batch=8, context=4096, width=8192, warmup=3, repeats=5)),
]
DTYPES = ["float32", "float16", "bfloat16"]


def flags(cfg, dtype, output):
    f = ["--device", "cuda:0", "--dtype", dtype, "--output", str(output)]
    for k, v in cfg.items():
        f += [f"--{k}", str(v)]
    return f


def run(cmd, env=None, cwd=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    return p, time.perf_counter() - t0


def compare(rust_file, py_file):
    rust = json.load(open(rust_file))["phases"]
    py = json.load(open(py_file))["phases"]
    diffs = []
    if len(rust) != len(py):
        return [f"row count {len(rust)} != {len(py)}"], 0
    bytes_off = 0
    for r, q in zip(rust, py):
        for k in ["phase", "repetition", "passes"]:
            if r[k] != q[k]:
                diffs.append(f"{r['phase']}: {k} {r[k]} != {q[k]}")
        for k in FIELDS:
            if r[k] != q[k]:
                diffs.append(f"{r['phase']}#{r['repetition']}: {k} rust {r[k]} python {q[k]}")
                bytes_off += abs(r[k] - q[k])
    return diffs, bytes_off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tests", nargs="*", default=[])
    ap.add_argument("--notebooks", nargs="*", default=[],
                    help="notebook programs from scripts/notebook-program.py")
    a = ap.parse_args()
    bin_dir, out = Path(a.bin), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mm = str(bin_dir / "mesure_memoire")
    ref = [sys.executable, str(HERE / "reference-measure.py")]
    report, failures = Report(), 0
    say = report.say

    env_json, _ = run([mm, "environment", "--device", "cuda:0", "--json"])
    (out / "environment.json").write_text(env_json.stdout)
    say("## Environment (`mesure_memoire environment --device cuda:0 --json`)\n")
    say("```json\n" + env_json.stdout.strip() + "\n```\n")

    say("## Seed command lines\n")
    for name, cfg in CONFIGS[:2]:
        target = out / f"seed-{name}.json"
        p, _ = run([mm, "measure"] + flags(cfg, "float32", target))
        say(f"- `{name}` float32: exit {p.returncode}, file {'written' if target.exists() else 'MISSING'}")
        failures += p.returncode != 0
        if name == "seed-small":
            say("\n```\n" + p.stdout.strip() + "\n```\n")

    say("\n## Byte-for-byte comparison with PyTorch's Python API\n")
    say("| configuration | dtype | phase rows | differing fields | differing bytes | Rust peak reserved |")
    say("| --- | --- | --- | --- | --- | --- |")
    total_bytes_off = 0
    for name, cfg in CONFIGS:
        for dtype in DTYPES:
            rf, pf = out / f"rust-{name}-{dtype}.json", out / f"py-{name}-{dtype}.json"
            pr, _ = run([mm, "measure", "--quiet"] + flags(cfg, dtype, rf))
            pp, _ = run(ref + flags(cfg, dtype, pf))
            if pr.returncode or pp.returncode:
                say(f"| {name} | {dtype} | run failed: rust {pr.returncode} {pr.stderr.strip()[-300:]} python {pp.returncode} {pp.stderr.strip()[-300:]} | | | |")
                failures += 1
                continue
            diffs, off = compare(rf, pf)
            total_bytes_off += off
            rows = len(json.load(open(rf))["phases"])
            peak = max(r["peak_reserved_bytes"] for r in json.load(open(rf))["phases"])
            say(f"| {name} {cfg} | {dtype} | {rows} | {len(diffs)} | {off} | {peak} |")
            for d in diffs[:10]:
                say(f"  - {d}")
            failures += bool(diffs)
    say(f"\nTotal differing bytes over all configurations: **{total_bytes_off}**\n")

    say("## Refusals\n")
    oom = out / "oom.json"
    p, _ = run([mm, "measure", "--device", "cuda:0", "--batch", "64", "--context", "65536",
                "--width", "1024", "--hidden", "16384", "--dtype", "float16", "--warmup", "0",
                "--repeats", "1", "--output", str(oom), "--quiet"])
    ok = p.returncode == 3 and not oom.exists()
    say(f"- out of memory: exit {p.returncode}, file written: {oom.exists()} -> {'OK' if ok else 'FAIL'}")
    say(f"  - message: `{p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}`")
    failures += not ok
    missing = out / "missing-device.json"
    p, _ = run([mm, "measure"] + flags(CONFIGS[0][1], "float32", missing)[2:] + ["--device", "cuda:7"])
    ok = p.returncode == 2 and not missing.exists()
    say(f"- device cuda:7: exit {p.returncode}, file written: {missing.exists()} -> {'OK' if ok else 'FAIL'}")
    say(f"  - message: `{p.stderr.strip()}`")
    failures += not ok
    existing = out / "rust-seed-small-float32.json"
    before = existing.read_bytes()
    p, _ = run([mm, "measure"] + flags(CONFIGS[0][1], "float32", existing))
    ok = p.returncode == 4 and existing.read_bytes() == before
    say(f"- existing output: exit {p.returncode}, file unchanged: {existing.read_bytes() == before} -> {'OK' if ok else 'FAIL'}")
    failures += not ok
    bare = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    unloadable = out / "no-libtorch.json"
    p, _ = run([mm, "measure"] + flags(CONFIGS[0][1], "float32", unloadable), env=bare)
    ok = p.returncode == 2 and not unloadable.exists()
    say(f"- libtorch not loadable (LD_LIBRARY_PATH unset): exit {p.returncode}, file written: {unloadable.exists()} -> {'OK' if ok else 'FAIL'}")
    say("  - message: `" + " / ".join(p.stderr.strip().splitlines()) + "`")
    failures += not ok

    if a.tests:
        say("\n## GPU-gated Rust tests\n")
        for t in a.tests:
            p, _ = run([t, "--include-ignored", "--test-threads=1"])
            tail = [l for l in p.stdout.splitlines() if l.startswith("test ")]
            say(f"- `{Path(t).name}`: exit {p.returncode}")
            for l in tail:
                say(f"  - {l}")
            failures += p.returncode != 0

    if a.notebooks:
        say("\n## The notebooks' code cells, run as programs\n")
        for prog in a.notebooks:
            env = {**os.environ, "IGL_COMPANION": str((Path(a.bin) / "mesure_memoire_torch").resolve())}
            p, dt = run([str(Path(prog).resolve())], env=env, cwd=ROOT / "notebooks")
            (out / (Path(prog).name + ".out")).write_text(p.stdout + p.stderr)
            cells = p.stdout.count("=== cell ")
            outputs = p.stdout.count("EVCXR_BEGIN_CONTENT")
            fake = [m for m in fallback_labels() if m in p.stdout]
            ok = p.returncode == 0 and not fake
            say(f"- `{Path(prog).name}`: exit {p.returncode}, {cells} cells, {outputs} rich outputs, "
                f"{dt:.1f} s, fallback or failure markers: {fake or 'none'} -> {'OK' if ok else 'FAIL'}")
            failures += not ok
            if Path(prog).name == "notebook-mesure-memoire":
                # The figures against the sentences the notebook states.
                c = subprocess.run([sys.executable, str(HERE / "notebook-claims.py"),
                                    str(out / (Path(prog).name + ".out"))], capture_output=True, text=True)
                for line in c.stdout.splitlines():
                    say(f"  - {line}")
                failures += c.returncode != 0

    say("\n## Benchmark: Rust against the Python reference, same machine, same call\n")
    small = CONFIGS[0][1]
    walls = {"rust": [], "python": []}
    for i in range(7):
        for who, cmd in (("rust", [mm, "measure", "--quiet"]), ("python", ref)):
            f = out / f"bench-{who}-{i}.json"
            p, dt = run(cmd + flags(small, "float32", f))
            if p.returncode:
                failures += 1
            walls[who].append(dt)
            f.unlink(missing_ok=True)
    overhead = {}
    for who, cmd in (("rust", [mm, "measure", "--quiet"]), ("python", ref)):
        f = out / f"overhead-{who}.json"
        run(cmd + flags(dict(small, warmup=10, repeats=200), "float32", f))
        rows = [r for r in json.load(open(f))["phases"] if r["phase"] == "warm_forward"]
        overhead[who] = statistics.median(r["host_wall_time_ms"] - r["gpu_event_time_ms"] for r in rows)
        f.unlink()
    rw, pw = statistics.median(walls["rust"]), statistics.median(walls["python"])
    say("| figure | Rust | Python reference | ratio |")
    say("| --- | --- | --- | --- |")
    say(f"| whole process, seed small measurement (median of 7), s | {rw:.3f} | {pw:.3f} | Python/Rust = {pw / rw:.2f}x |")
    say(f"| warm pass host time minus CUDA-event time (median of 200), ms | {overhead['rust']:.4f} | {overhead['python']:.4f} | Rust/Python = {overhead['rust'] / overhead['python']:.2f} |")
    say(f"\nTargets: whole process at least 3x faster ({'met' if pw / rw >= 3 else 'NOT met'}); "
        f"harness overhead at most half of Python's ({'met' if overhead['rust'] <= overhead['python'] / 2 else 'NOT met'}).")
    say(f"\nFailures: {failures}")
    report.write(out / "report.md")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
