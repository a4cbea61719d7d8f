//! `mesure_memoire estimate|environment|measure`: see `iteragpu_lab::cli::mesure_memoire`.
// The programs' allocator (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    iteragpu_lab::cli::mesure_memoire::main(iteragpu_lab::cli::mesure_memoire::Mode::Front)
}
