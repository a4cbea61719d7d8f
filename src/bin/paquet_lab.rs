//! `paquet_lab`: see `iteragpu_lab::cli::paquet_lab`.
fn main() -> std::process::ExitCode {
    iteragpu_lab::cli::paquet_lab::main()
}
