# Sourced after scripts/env.sh: installs (once) the evcxr Rust kernel and the project's own
# kernelspec `iteragpu-rust`, whose environment lets a notebook build and load libtorch and names
# the GPU companion program the notebooks measure through (IGL_COMPANION: the release build of
# scripts/build, which scripts/lab and scripts/test run first).
#   evcxr_jupyter 0.22.0 -> $IGL_CACHE/evcxr/bin; build folders kept in $IGL_CACHE/evcxr-build,
#                           one per running kernel (scripts/evcxr-kernel)
#   kernelspec           -> $IGL_VENV/share/jupyter/kernels/iteragpu-rust
# evcxr keeps its own build folder: CARGO_TARGET_DIR is not passed on to the kernel.
IGL_EVCXR_VERSION=0.22.0
IGL_EVCXR=$IGL_CACHE/evcxr/bin/evcxr_jupyter
IGL_KERNEL=iteragpu-rust

if ! cargo install --list --root "$IGL_CACHE/evcxr" 2>/dev/null | grep -q "^evcxr_jupyter v$IGL_EVCXR_VERSION:"; then
    igl_log "installing evcxr_jupyter $IGL_EVCXR_VERSION (once; several minutes)"
    if command -v rustup >/dev/null; then rustup component add rust-src >&2; fi
    cargo install --locked --quiet evcxr_jupyter --version "$IGL_EVCXR_VERSION" --root "$IGL_CACHE/evcxr"
fi

mkdir -p "$IGL_VENV/share/jupyter/kernels/$IGL_KERNEL" "$IGL_CACHE/evcxr-build"
# The kernel's compiled cells link Rust's standard library dynamically: it must be found too.
IGL_RUST_LIB=$(rustc --print target-libdir)
# The kernel adds the library as it starts, before it answers (evcxr runs init.evcxr from
# EVCXR_CONFIG_DIR): compiled, linked, and its sources loaded by evcxr's rust-analyzer, which it
# does at the first variable whose type comes from the library (`_iteragpu_lab_ready`: an
# underscore name, not kept). A notebook's own `:dep` line then finds the library there, and its
# first output comes in about a second after Run All (docs/benchmarks.md, "Notebooks: time to
# first result").
IGL_EVCXR_CONFIG=$IGL_VENV/share/jupyter/kernels/$IGL_KERNEL/evcxr
mkdir -p "$IGL_EVCXR_CONFIG"
printf ':dep iteragpu-lab = { path = "%s", default-features = false }\n%s\n' "$IGL_ROOT" \
    'let _iteragpu_lab_ready = iteragpu_lab::catalog::Catalog::load;' > "$IGL_EVCXR_CONFIG/init.evcxr.new"
mv "$IGL_EVCXR_CONFIG/init.evcxr.new" "$IGL_EVCXR_CONFIG/init.evcxr"
"$IGL_VENV/bin/python" - "$IGL_VENV/share/jupyter/kernels/$IGL_KERNEL/kernel.json" <<PY
import json, sys
spec = {
    "argv": ["$IGL_ROOT/scripts/evcxr-kernel", "--control_file", "{connection_file}"],
    "display_name": "Rust (IteraGPU Lab)",
    "language": "rust",
    "interrupt_mode": "message",
    "env": {
        "LIBTORCH_USE_PYTORCH": "1",
        "VIRTUAL_ENV": "$IGL_VENV",
        "PATH": "$IGL_VENV/bin:$PATH",
        "LD_LIBRARY_PATH": "$LD_LIBRARY_PATH:$IGL_RUST_LIB",
        "IGL_EVCXR": "$IGL_EVCXR",
        "IGL_EVCXR_BUILD": "$IGL_CACHE/evcxr-build",
        "EVCXR_CONFIG_DIR": "$IGL_EVCXR_CONFIG",
        "IGL_COMPANION": "$CARGO_TARGET_DIR/release/mesure_memoire_torch",
    },
}
json.dump(spec, open(sys.argv[1], "w"), indent=1)
PY
unset CARGO_TARGET_DIR
