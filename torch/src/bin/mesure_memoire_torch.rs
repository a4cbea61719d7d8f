//! The libtorch-linked half of `mesure_memoire`: `environment`, `measure` and `lesson` run here,
//! through [`iteragpu_torch::TorchGpu`]; the command line is `iteragpu_lab::cli::mesure_memoire`.
//! Started by another program of the project, it dies with that program. Started as a spare
//! (`IGL_SPARE`), it has loaded its libraries and touched no GPU when it reads its command line
//! from stdin.
fn main() -> std::process::ExitCode {
    use iteragpu_lab::cli::mesure_memoire::{main_from, Mode};
    use iteragpu_lab::status::Status;
    if !iteragpu_torch::follow_parent() {
        eprintln!("mesure_memoire_torch: the program that started it has ended; nothing measured");
        return Status::Interrupted.into();
    }
    match iteragpu_lab::companion::command_line() {
        Ok(Some(args)) => main_from(Mode::Companion(&iteragpu_torch::TorchGpu), args),
        // A spare let go: it was not needed.
        Ok(None) => Status::Ok.into(),
        Err(e) => {
            eprintln!("mesure_memoire_torch: error: cannot read its command line: {e}");
            Status::Usage.into()
        }
    }
}
