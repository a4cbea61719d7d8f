//! `resultats_bruts`: see `iteragpu_lab::cli::resultats_bruts`.
fn main() -> std::process::ExitCode {
    iteragpu_lab::cli::resultats_bruts::main()
}
