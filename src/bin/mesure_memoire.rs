//! `mesure_memoire estimate|environment|measure`: see `iteragpu_lab::cli::mesure_memoire`.
fn main() -> std::process::ExitCode {
    iteragpu_lab::cli::mesure_memoire::main(iteragpu_lab::cli::mesure_memoire::Mode::Front)
}
