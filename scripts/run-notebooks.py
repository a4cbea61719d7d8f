#!/usr/bin/env python3
"""Executes notebooks headless under the project's Rust kernel and fails on any cell error.

    python3 scripts/run-notebooks.py [--kernel iteragpu-rust] NOTEBOOK...

Each notebook runs from its own folder (as under Jupyter) on an in-memory copy: nothing is written
back (unless --save names a folder for executed copies). Prints, per notebook, the time from kernel start to the first output and to the end, and
fails (exit 1) on an error output or a cell whose output says it failed.
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
    ap.add_argument("notebooks", nargs="+")
    a = ap.parse_args()
    failed = 0
    for path in map(Path, a.notebooks):
        nb = nbformat.read(path, as_version=4)
        started = time.perf_counter()
        first = {}

        def on_cell_executed(cell, cell_index, execute_reply, **_):
            if cell.get("outputs") and "t" not in first:
                first["t"] = time.perf_counter() - started

        client = NotebookClient(nb, kernel_name=a.kernel, timeout=a.timeout,
                                resources={"metadata": {"path": str(path.parent.resolve())}},
                                on_cell_executed=on_cell_executed)
        try:
            client.execute()
            status = "ok"
        except CellExecutionError as e:
            status = f"FAILED\n{e}"
            failed += 1
        total = time.perf_counter() - started
        if a.save:
            Path(a.save).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(a.save) / path.name)
        cells = [c for c in nb.cells if c.cell_type == "code"]
        ran = sum(1 for c in cells if c.get("execution_count") is not None)
        print(f"{path}: {status}: {ran}/{len(cells)} code cells, first output after "
              f"{first.get('t', float('nan')):.1f} s, finished after {total:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
