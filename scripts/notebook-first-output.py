#!/usr/bin/env python3
"""Where a notebook's first output goes: starts the project's kernel, times it to its first
answer, then runs the first code cell of NOTEBOOK (its `:dep` and first call) and times its first
output. With --trace, the kernel is followed by strace meanwhile and every subprocess that ran
longer than 0.15 s is listed with its start (seconds after the cell was sent) and duration: what
of the cell is cargo, rustc and the linker, and what is the kernel's own work between them.

    source scripts/env.sh && source scripts/kernel.sh
    $IGL_VENV/bin/python scripts/notebook-first-output.py [--trace] notebooks/budget-vram.ipynb

Runs from the notebook's folder, as Jupyter does; writes nothing but strace's log in a
temporary folder (removed).
"""
import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

from jupyter_client.manager import KernelManager


def subprocesses(log: Path, since: float, longer_than: float = 0.15):
    """(start after `since`, duration, command) of each process strace saw exec and exit."""
    started, out = {}, []
    for line in log.read_text().splitlines():
        m = re.match(r"(\d+)\s+(\d+)\.(\d+)\s+(.*)", line)
        if not m:
            continue
        pid, sec, frac, rest = m.groups()
        t = float(f"{sec}.{frac}")
        if rest.startswith("execve(") and "ENOENT" not in rest:
            args = re.findall(r'"([^"]*)"', rest)[1:6]
            started[pid] = (t, " ".join(Path(a).name if "/" in a else a for a in args))
        elif rest.startswith("+++ exited") or rest.startswith("exit_group"):
            if pid in started:
                t0, cmd = started.pop(pid)
                if t - t0 > longer_than:
                    out.append((t0 - since, t - t0, cmd))
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="iteragpu-rust")
    ap.add_argument("--trace", action="store_true", help="follow the kernel with strace")
    ap.add_argument("notebook")
    a = ap.parse_args()
    path = Path(a.notebook)
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    source = "".join(cell["source"])

    km = KernelManager(kernel_name=a.kernel)
    started = time.perf_counter()
    km.start_kernel(cwd=str(path.parent.resolve()))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=600)
    ready = time.perf_counter() - started
    print(f"kernel answering: {ready:.2f} s after its start")

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "strace.log"
        tracer = None
        if a.trace:
            tracer = subprocess.Popen(["strace", "-f", "-ttt", "-qq", "-e", "trace=execve,exit_group",
                                       "-e", "signal=none", "-o", str(log),
                                       "-p", str(km.provisioner.process.pid)])
            time.sleep(1.0)
        sent = time.perf_counter()
        sent_wall = time.time()
        msg_id = kc.execute(source)
        first = None
        while True:
            m = kc.get_iopub_msg(timeout=600)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            kind = m["msg_type"]
            if kind in ("execute_result", "display_data", "stream", "error") and first is None:
                first = time.perf_counter() - sent
                if kind == "error":
                    print("error:", m["content"].get("evalue", "")[:500])
            if kind == "status" and m["content"]["execution_state"] == "idle":
                break
        done = time.perf_counter() - sent
        if tracer:
            tracer.terminate()
            tracer.wait()
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        if first is None:
            print(f"first cell: no output, done {done:.2f} s after it was sent")
        else:
            print(f"first cell: first output {first:.2f} s after it was sent, done {done:.2f} s "
                  f"({ready + first:.2f} s after the kernel's start)")
        if a.trace:
            print("subprocesses longer than 0.15 s (start after the cell was sent, duration):")
            for t0, d, cmd in subprocesses(log, sent_wall):
                print(f"  {t0:6.2f} s  {d:5.2f} s  {cmd[:100]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
