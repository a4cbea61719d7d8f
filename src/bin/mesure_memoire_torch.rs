//! The libtorch-linked half of `mesure_memoire` (environment and measure run here).
fn main() -> std::process::ExitCode {
    iteragpu_lab::cli::mesure_memoire::main(iteragpu_lab::cli::mesure_memoire::Mode::Engine)
}
