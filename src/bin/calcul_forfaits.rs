//! `calcul_forfaits --gpu b200 --days 7 --lots 2`: see `iteragpu_lab::cli::calcul_forfaits`.
// The programs' allocator (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    iteragpu_lab::cli::calcul_forfaits::main()
}
