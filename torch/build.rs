//! Build script: compiles `csrc/allocator_shim.cpp` against the libtorch that torch-sys found, and links the CUDA libraries it calls so that every artifact keeps `libtorch_cuda.so`.

fn main() {
    torch_shim::build();
}

mod torch_shim {
    use std::path::{Path, PathBuf};

    pub fn build() {
        println!("cargo:rerun-if-changed=build.rs");
        println!("cargo:rerun-if-changed=csrc/allocator_shim.cpp");
        println!("cargo:rerun-if-changed=csrc/allocator_shim.h");
        println!("cargo:rerun-if-env-changed=IGL_CUDA_INCLUDE");
        println!("cargo:rerun-if-env-changed=IGL_CUDA_LIB");
        let lib = PathBuf::from(std::env::var("DEP_TCH_LIBTORCH_LIB").expect(
            "torch-sys did not report its libtorch directory; build with LIBTORCH_USE_PYTORCH=1 \
             in the project's virtual environment (scripts/env.sh sets it up)",
        ));
        let include = lib
            .parent()
            .expect("libtorch lib has a parent")
            .join("include");
        let (cuda_include, cuda_lib) = cuda_dirs(&lib);

        cc::Build::new()
            .cpp(true)
            .pic(true)
            .std("c++17")
            .define("_GLIBCXX_USE_CXX11_ABI", "1")
            .flag_if_supported("-Wno-unused-parameter")
            .include(&include)
            .include(include.join("torch/csrc/api/include"))
            .include(&cuda_include)
            .file("csrc/allocator_shim.cpp")
            .compile("igl_allocator_shim");

        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-search=native={}", cuda_lib.display());
        for name in ["torch_cuda", "c10_cuda", "torch_cpu", "c10"] {
            println!("cargo:rustc-link-lib=dylib={name}");
        }
        // The pip CUDA runtime ships only the versioned soname.
        if cuda_lib.join("libcudart.so").exists() {
            println!("cargo:rustc-link-lib=dylib=cudart");
        } else {
            println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
        }
        // Keep the libraries reachable for this package's binaries and tests without LD_LIBRARY_PATH,
        // on the build machine only: these folders are its cache. Elsewhere the rule is
        // LD_LIBRARY_PATH (scripts/env.sh sets it; README, Quick start).
        for dir in [&lib, &cuda_lib] {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }

    /// CUDA headers and runtime: `IGL_CUDA_INCLUDE` / `IGL_CUDA_LIB`, else the pip layout beside torch
    /// (`nvidia/cu13`, from `cuda-toolkit[nvcc]`), else `/usr/local/cuda`.
    fn cuda_dirs(torch_lib: &Path) -> (PathBuf, PathBuf) {
        let from_env = |name: &str| std::env::var_os(name).map(PathBuf::from);
        let site = torch_lib.parent().and_then(Path::parent);
        let pip = site.map(|s| s.join("nvidia/cu13"));
        let root = match pip {
            Some(p) if p.join("include/cuda_runtime_api.h").exists() => p,
            _ => PathBuf::from("/usr/local/cuda"),
        };
        let include = from_env("IGL_CUDA_INCLUDE").unwrap_or_else(|| root.join("include"));
        assert!(
            include.join("cuda_runtime_api.h").exists(),
            "cuda_runtime_api.h not found in {}: install the pip package cuda-toolkit[nvcc,cccl]==13.0.2 \
             beside torch, or set IGL_CUDA_INCLUDE",
            include.display()
        );
        let lib = from_env("IGL_CUDA_LIB").unwrap_or_else(|| {
            if root.join("lib64").exists() {
                root.join("lib64")
            } else {
                root.join("lib")
            }
        });
        (include, lib)
    }
}
