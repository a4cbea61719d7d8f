//! The libtorch-linked half of `mesure_memoire`: `environment` and `measure` run here, through
//! [`iteragpu_torch::TorchGpu`]; the command line is `iteragpu_lab::cli::mesure_memoire`.
fn main() -> std::process::ExitCode {
    use iteragpu_lab::cli::mesure_memoire::{main, Mode};
    main(Mode::Engine(&iteragpu_torch::TorchGpu))
}
