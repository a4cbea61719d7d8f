#!/usr/bin/env python3
"""Executes notebooks headless under the project's Rust kernel and fails on any cell error.

    python3 scripts/run-notebooks.py [--kernel iteragpu-rust] [--first-cell-only] NOTEBOOK...

Each notebook runs from its own folder (as under Jupyter) on an in-memory copy: nothing is written
back (unless --save names a folder for executed copies). Prints, per notebook, the time from kernel
start to the first output and to the end, and fails (exit 1) when a cell stops with an error, when
any cell carries an error output, or when a code cell with code in it has no execution count after
the run (it did not run). With --first-cell-only, only the first code cell of each notebook runs
(its `:dep` lines): scripts/lab does this before JupyterLab opens, so that the dependencies are
already compiled in the kernel's build folder when a person opens a notebook.
"""
import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="iteragpu-rust")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--save", help="also write the executed copies into this folder")
    ap.add_argument("--first-cell-only", action="store_true",
                    help="run only each notebook's first code cell (compiles its dependencies)")
    ap.add_argument("notebooks", nargs="+")
    a = ap.parse_args()
    failed = 0
    for path in map(Path, a.notebooks):
        nb = nbformat.read(path, as_version=4)
        if a.first_cell_only:
            nb.cells = [next(c for c in nb.cells if c.cell_type == "code")]
        started = time.perf_counter()
        first = {}

        def on_cell_executed(cell, cell_index, execute_reply, **_):
            if cell.get("outputs") and "t" not in first:
                first["t"] = time.perf_counter() - started

        # The kernel compiles the library as it starts (scripts/kernel.sh): minutes on a new
        # machine, so its start is given as long as a cell.
        client = NotebookClient(nb, kernel_name=a.kernel, timeout=a.timeout,
                                startup_timeout=a.timeout,
                                resources={"metadata": {"path": str(path.parent.resolve())}},
                                on_cell_executed=on_cell_executed)
        problems = []
        try:
            client.execute()
        except CellExecutionError as e:
            problems.append(str(e))
        total = time.perf_counter() - started
        if a.save:
            Path(a.save).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(a.save) / path.name)
        cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        ran = sum(1 for _, c in cells if c.get("execution_count") is not None)
        for i, c in cells:
            if any(o.get("output_type") == "error" for o in c.get("outputs", [])):
                problems.append(f"cell {i} has an error output")
            if c.get("execution_count") is None and c.source.strip():
                problems.append(f"code cell {i} did not run")
        failed += bool(problems)
        print(f"{path}: {'FAILED' if problems else 'ok'}: {ran}/{len(cells)} code cells ran, first "
              f"output after {first.get('t', float('nan')):.1f} s, finished after {total:.1f} s",
              flush=True)
        for problem in problems:
            print(f"  {problem}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
