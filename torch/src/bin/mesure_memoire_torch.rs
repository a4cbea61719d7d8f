//! The libtorch-linked half of `mesure_memoire`: `environment`, `measure` and `lesson` run here,
//! through [`iteragpu_torch::TorchGpu`]; the command line is `iteragpu_lab::cli::mesure_memoire`.
//! Started by another program of the project, it dies with that program.
fn main() -> std::process::ExitCode {
    use iteragpu_lab::cli::mesure_memoire::{main, Mode};
    if !iteragpu_torch::follow_parent() {
        eprintln!("mesure_memoire_torch: the program that started it has ended; nothing measured");
        return iteragpu_lab::status::Status::Interrupted.into();
    }
    main(Mode::Engine(&iteragpu_torch::TorchGpu))
}
