#!/usr/bin/env python3
"""Turns a notebook's code cells into a Rust program, to run the notebook where Jupyter and Rust
are absent (the GPU machine): the same code, cell after cell, in one `main`.

    python3 scripts/notebook-program.py NOTEBOOK OUT_DIR

Rules: each `:dep NAME = { path = "..", ... }` line becomes the same dependency of the program,
its path taken from the notebook's folder as the kernel takes it; a cell
whose last line is an expression (no trailing `;` or `}`) has that value shown with its
`evcxr_display()`, exactly what the kernel does. Each cell is announced on stdout by a line
`=== cell N`, and its rich output is framed by the kernel's EVCXR_BEGIN_CONTENT / EVCXR_END_CONTENT
markers. Run the program from the notebook's folder.
"""
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    notebook, out = Path(sys.argv[1]), Path(sys.argv[2])
    cells = [c for c in json.load(open(notebook))["cells"] if c["cell_type"] == "code"]
    body, deps = [], []
    for n, cell in enumerate(cells, 1):
        lines = [l.rstrip("\n") for l in "".join(cell["source"]).split("\n")]
        for l in lines:
            dep = re.match(r'\s*:dep\s+([\w-]+)\s*=\s*(\{.*\})\s*$', l)
            if dep:
                spec = re.sub(r'path\s*=\s*"([^"]+)"',
                              lambda m: f'path = "{(notebook.parent / m.group(1)).resolve()}"',
                              dep.group(2))
                deps.append(f"{dep.group(1)} = {spec}")
        lines = [l for l in lines if not l.lstrip().startswith(":")]
        while lines and not lines[-1].strip():
            lines.pop()
        if lines and not lines[-1].rstrip().endswith((";", "}")):
            lines[-1] = f"({lines[-1].strip()}).evcxr_display();"
        body.append(f'println!("=== cell {n}");')
        body += lines
    name = "notebook-" + notebook.stem
    (out / "src").mkdir(parents=True, exist_ok=True)
    (out / "Cargo.toml").write_text(
        f'[package]\nname = "{name}"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
        "[dependencies]\n" + "\n".join(deps) + "\n\n[workspace]\n")
    shutil.copy(ROOT / "Cargo.lock", out / "Cargo.lock")
    program = "\n".join("    " + l if l else "" for l in body)
    (out / "src" / "main.rs").write_text(
        f"//! Generated from {notebook.name} by scripts/notebook-program.py: do not edit.\n"
        "#![allow(unused_imports, unused_variables, unused_mut)]\n\n"
        f"fn main() {{\n{program}\n}}\n")
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
