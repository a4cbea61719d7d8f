//! The hand-over between a program of the project and its companion: the command lines the
//! companion is given, the result file in which it says how it ended (JSON, written at its exit
//! when the parent names one in [`RESULT_VARIABLE`]), and the one place where a companion's exit
//! is read back into an [`Ending`].

use super::process::Ended;
use super::{PROGRAM, RESULT_VARIABLE};
use crate::measure::{MeasureConfig, MeasureError};
use crate::status::Status;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::path::Path;

/// The schema tag of a result file.
pub const RESULT_SCHEMA: &str = "iteragpu-lab/companion-result/1";
/// The system loader's exit code when a library is missing.
pub const LOADER_FAILED: i32 = 127;

/// How the companion ended, as it writes it in its result file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompanionResult {
    pub schema: String,
    /// The exit code (see [`Status`]).
    pub exit_code: u8,
    /// The error's message, its causes joined; absent on success.
    pub message: Option<String>,
    /// The phase (`measure`), stage (`transformer`) or step (`lesson`) that failed, when one did.
    pub during: Option<String>,
}

impl CompanionResult {
    /// The result of a run that ended with `status`, and its error's message and place.
    pub fn new(status: Status, message: Option<String>, during: Option<String>) -> Self {
        CompanionResult {
            schema: RESULT_SCHEMA.into(),
            exit_code: status.code(),
            message,
            during,
        }
    }

    /// Where an error chain says it happened: the phase of an out-of-memory or libtorch
    /// failure, or the bench's stage.
    pub fn place_of(error: &anyhow::Error) -> Option<String> {
        error
            .chain()
            .find_map(|cause| match cause.downcast_ref::<MeasureError>()? {
                MeasureError::OutOfMemory { phase, .. } | MeasureError::Torch { phase, .. } => {
                    phase.map(|p| p.name().to_string())
                }
                MeasureError::InStage { stage, .. } => Some(stage.clone()),
                _ => None,
            })
    }

    /// Writes the result where the parent asked for it, if it did. A failure to write is said on
    /// stderr: the exit code still tells the parent how the run ended.
    pub fn write_if_asked(&self) {
        let Some(path) = std::env::var_os(RESULT_VARIABLE) else {
            return;
        };
        let json = serde_json::to_vec(self).expect("a result serializes");
        if let Err(e) = std::fs::write(&path, json) {
            eprintln!("{PROGRAM}: cannot write its result file: {e}");
        }
    }
}

/// How a companion run ended, read from its exit status and its result file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exit 0: its work is done and its output written.
    Completed,
    /// Exit 2: no usable GPU or libtorch, in its own words.
    Unavailable(String),
    /// Exit 3: out of memory, and where.
    OutOfMemory {
        during: Option<String>,
        message: String,
    },
    /// Any other exit (or none, killed by a signal), with its message.
    Failed { code: Option<i32>, message: String },
    /// The system loader could not start it (a library missing).
    LoaderFailed(String),
    /// It could not be started at all.
    NotStarted(String),
    /// It was stopped because this process was interrupted.
    Interrupted,
}

impl Ending {
    /// Reads how a run ended: its exit status, the result file it wrote (`result`, when one was
    /// asked for) and its stderr's last line when the file says nothing.
    pub fn of(ended: std::io::Result<Ended>, result: Option<&Path>) -> Ending {
        let (status, stderr) = match ended {
            Err(e) => return Ending::NotStarted(format!("cannot start {PROGRAM}: {e}")),
            Ok(Ended::Interrupted) => return Ending::Interrupted,
            Ok(Ended::Exited { status, stderr }) => (status, stderr),
        };
        let written = result.and_then(read_result);
        let message = written
            .as_ref()
            .and_then(|r| r.message.clone())
            .unwrap_or_else(|| last_line(&stderr));
        let code = status.code();
        match code {
            Some(0) => Ending::Completed,
            Some(c) if c == Status::Unavailable as i32 => Ending::Unavailable(message),
            Some(c) if c == Status::OutOfMemory as i32 => Ending::OutOfMemory {
                during: written.and_then(|r| r.during),
                message,
            },
            Some(LOADER_FAILED) => Ending::LoaderFailed(message),
            None => Ending::Failed {
                code,
                message: format!("{PROGRAM} was killed by a signal"),
            },
            Some(_) => Ending::Failed { code, message },
        }
    }
}

/// The result file, when it holds one (a companion killed before its exit wrote none).
fn read_result(path: &Path) -> Option<CompanionResult> {
    crate::files::load_tagged(path).ok()
}

impl crate::files::Tagged for CompanionResult {
    const SCHEMA: &'static str = RESULT_SCHEMA;
    const KIND: crate::files::Input = crate::files::Input::CompanionResult;
    fn schema(&self) -> &str {
        &self.schema
    }
}

/// The last non-empty line of `text`, without the program's prefix (`NAME: error: `).
fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    line.split_once(": error: ")
        .map_or(line, |(_, m)| m)
        .to_string()
}

/// The command line of `measure` for `config` (without `--output`).
pub fn measure_args(config: &MeasureConfig) -> Vec<String> {
    let mut a = vec![
        "measure".to_string(),
        "--device".into(),
        config.device.to_string(),
        "--batch".into(),
        config.batch.to_string(),
        "--context".into(),
        config.context.to_string(),
        "--width".into(),
        config.width.to_string(),
        "--dtype".into(),
        config.dtype.name().into(),
        "--warmup".into(),
        config.warmup.to_string(),
        "--repeats".into(),
        config.repeats.to_string(),
    ];
    if let Some(h) = config.hidden {
        a.extend(["--hidden".into(), h.to_string()]);
    }
    a
}

/// The companion's command line measuring `config` into `output`, quietly.
pub fn point_args(config: &MeasureConfig, output: &Path, blocks: bool) -> Vec<OsString> {
    let mut args: Vec<OsString> = measure_args(config).into_iter().map(Into::into).collect();
    args.extend(["--quiet".into(), "--output".into(), output.into()]);
    if blocks {
        args.push("--blocks".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn exited(code: i32, stderr: &str) -> std::io::Result<Ended> {
        Ok(Ended::Exited {
            status: std::process::ExitStatus::from_raw(code << 8),
            stderr: stderr.into(),
        })
    }

    #[test]
    fn an_out_of_memory_says_where_from_its_result_file_not_its_text() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("result.json");
        let written = CompanionResult::new(
            Status::OutOfMemory,
            Some("CUDA out of memory. Tried to allocate 2.00 GiB".into()),
            Some("cold_forward".into()),
        );
        std::fs::write(&file, serde_json::to_vec(&written).unwrap()).unwrap();
        assert_eq!(
            Ending::of(exited(3, "mesure_memoire: error: anything"), Some(&file)),
            Ending::OutOfMemory {
                during: Some("cold_forward".into()),
                message: "CUDA out of memory. Tried to allocate 2.00 GiB".into()
            }
        );
        // No file (killed before its exit): the exit code and stderr still tell.
        assert_eq!(
            Ending::of(
                exited(3, "x: error: out of memory\n"),
                Some(&dir.path().join("none"))
            ),
            Ending::OutOfMemory {
                during: None,
                message: "out of memory".into()
            }
        );
        assert_eq!(
            Ending::of(exited(2, "mesure_memoire: error: no usable GPU"), None),
            Ending::Unavailable("no usable GPU".into())
        );
        assert!(matches!(
            Ending::of(exited(127, "libtorch_cpu.so: cannot open"), None),
            Ending::LoaderFailed(_)
        ));
        assert_eq!(
            Ending::of(Ok(Ended::Interrupted), None),
            Ending::Interrupted
        );
    }

    #[test]
    fn the_place_of_a_failure_is_read_from_its_error() {
        let e = anyhow::Error::new(
            MeasureError::from_torch_message("CUDA out of memory")
                .in_phase(crate::reading::Phase::Warmup),
        )
        .context("measuring");
        assert_eq!(CompanionResult::place_of(&e).as_deref(), Some("warmup"));
        let e = anyhow::Error::new(MeasureError::from_torch_message("boom").in_stage("decode"));
        assert_eq!(CompanionResult::place_of(&e).as_deref(), Some("decode"));
    }

    #[test]
    fn the_measure_command_line_names_every_size() {
        let a = measure_args(&MeasureConfig {
            hidden: Some(8),
            ..Default::default()
        });
        assert_eq!(a[0], "measure");
        assert!(a.windows(2).any(|w| w == ["--hidden", "8"]));
    }
}
