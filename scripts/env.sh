# Sourced by scripts/lab and scripts/test: creates (once) and activates the cached tool environment.
#   IGL_CACHE       where heavy installs live (default ~/.cache/iteragpu-lab), outside the checkout
#   PyTorch 2.11.0 (the libtorch that tch 0.24 links) with the CUDA headers the allocator shim needs,
#   Jupyter for the notebooks. Everything is installed once and reused; delete IGL_CACHE to start over.
set -euo pipefail

IGL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IGL_CACHE=${IGL_CACHE:-$HOME/.cache/iteragpu-lab}
IGL_VENV=$IGL_CACHE/venv
IGL_TORCH_VERSION=2.11.0
IGL_PIP_PACKAGES=("torch==$IGL_TORCH_VERSION" "cuda-toolkit[nvcc,cccl]==13.0.2" "jupyterlab" "nbclient" "nbformat" "ipykernel")
mkdir -p "$IGL_CACHE"

igl_log() { printf '[iteragpu-lab] %s\n' "$*" >&2; }

# The venv is complete only once its stamp names exactly the packages above.
igl_stamp="${IGL_PIP_PACKAGES[*]}"
if [ "$(cat "$IGL_VENV/.igl-stamp" 2>/dev/null)" != "$igl_stamp" ]; then
    igl_log "installing PyTorch $IGL_TORCH_VERSION and Jupyter into $IGL_VENV (once; several GB)"
    python3 -m venv "$IGL_VENV"
    "$IGL_VENV/bin/python" -m pip install --quiet --upgrade pip
    "$IGL_VENV/bin/python" -m pip install --quiet "${IGL_PIP_PACKAGES[@]}"
    printf '%s' "$igl_stamp" > "$IGL_VENV/.igl-stamp"
fi

export VIRTUAL_ENV=$IGL_VENV
export PATH=$IGL_VENV/bin:$PATH
IGL_SITE=$("$IGL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LIBTORCH_USE_PYTORCH=1
export LD_LIBRARY_PATH=$IGL_SITE/torch/lib:$IGL_SITE/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Build outputs are kept outside the checkout so that a fresh clone reuses them.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$IGL_CACHE/target}
