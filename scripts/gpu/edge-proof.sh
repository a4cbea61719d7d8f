#!/usr/bin/env bash
# The GPU proof of the planner's verdicts where the allocator frees its cache and retries
# (scripts/gpu/hf-proof-plan-retry.json: the planner's largest batch and one more on emulated
# cards), and budget-vram.ipynb's code cells run as a program and rendered, in one call:
#   scripts/gpu/edge-proof.sh BIN_DIR OUT_DIR     (BIN_DIR: mesure_memoire, notebook-budget-vram)
# Writes OUT_DIR/retry/ (every record and proof.json -> data/hf-proof-retry-h200.json) and
# OUT_DIR/notebook-budget-vram.md (-> docs/gpu-runs/).
set -euo pipefail
bin=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH=$site/torch/lib:$site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv"
(cd "$here/../../notebooks" && "$bin/notebook-budget-vram" > "$out/notebook-budget-vram.out")
python3 "$here/render-cells.py" "$out/notebook-budget-vram.out" > "$out/notebook-budget-vram.md"
python3 "$here/hf-proof.py" "$here/hf-proof-plan-retry.json" "$out/retry"
