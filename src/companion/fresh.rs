//! One piece of work in one fresh companion process, its result written to a temporary file and
//! read back: a measurement, the lesson, the environment report. Nothing of this process's own
//! allocator (a notebook's kernel) reaches them.

use super::handover::{point_args, Ending};
use super::process::Companion;
use super::{PROGRAM, RESULT_VARIABLE};
use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
use crate::files::JsonError;
use crate::lesson::record::{alloc_conf_for, AllocConfConflict, ALLOC_CONF};
use crate::lesson::LessonRecord;
use crate::measure::{MeasureConfig, MeasureError, Measurement};
use crate::reading::Phase;
use crate::status::{Classify, Status};
use std::ffi::{OsStr, OsString};
use std::process::Stdio;

/// Why a lesson could not be run in the companion, or its record read back.
#[derive(Debug, thiserror::Error)]
pub enum LessonError {
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// No GPU or no libtorch in the companion (its exit 2), in its own words.
    #[error("{0}")]
    Unavailable(String),
    /// The companion's exit 3.
    #[error("{0}")]
    OutOfMemory(String),
    #[error("{PROGRAM} failed (exit {code}): {message}")]
    Failed { code: i32, message: String },
    #[error(transparent)]
    Conflict(#[from] AllocConfConflict),
    #[error(transparent)]
    File(#[from] JsonError),
}

impl Classify for LessonError {
    fn status(&self) -> Status {
        match self {
            LessonError::Measure(e) => e.status(),
            LessonError::Unavailable(_) => Status::Unavailable,
            LessonError::OutOfMemory(_) => Status::OutOfMemory,
            LessonError::Failed { .. } => Status::Failure,
            LessonError::Conflict(e) => e.status(),
            LessonError::File(e) => e.status(),
        }
    }
}

/// A new temporary folder for a companion's output and result files.
fn temporary_folder() -> Result<tempfile::TempDir, MeasureError> {
    tempfile::tempdir().map_err(|e| MeasureError::Torch {
        phase: None,
        message: format!("cannot make a temporary folder: {e}"),
    })
}

/// Runs `args` in a fresh companion with `env`, asking for its result file in `folder`.
fn run_fresh(
    companion: &Companion,
    folder: &std::path::Path,
    args: &[OsString],
    env: &[(&str, &OsStr)],
) -> Ending {
    let result = folder.join("result.json");
    let mut env = env.to_vec();
    env.push((RESULT_VARIABLE, result.as_os_str()));
    Ending::of(companion.run(args, true, &env), Some(&result))
}

impl Companion {
    /// Measures `config` in a fresh companion process and returns the measurement: each
    /// measurement is a process's first, so its cold pass is a real first pass.
    pub fn measure_fresh(
        &self,
        config: &MeasureConfig,
        blocks: bool,
    ) -> Result<Measurement, MeasureError> {
        let dir = temporary_folder()?;
        let output = dir.path().join("measurement.json");
        let torch = |message: String| MeasureError::Torch {
            phase: None,
            message,
        };
        match run_fresh(self, dir.path(), &point_args(config, &output, blocks), &[]) {
            Ending::Completed => Measurement::load(&output).map_err(|e| torch(e.to_string())),
            Ending::Unavailable(why) => Err(MeasureError::Unavailable(why)),
            Ending::LoaderFailed(why) => Err(MeasureError::LibtorchNotLoadable(why)),
            Ending::OutOfMemory { during, message } => Err(MeasureError::OutOfMemory {
                phase: during.and_then(|p| p.parse::<Phase>().ok()),
                message,
            }),
            Ending::Failed { message, .. } | Ending::NotStarted(message) => Err(torch(message)),
            Ending::Interrupted => Err(torch("interrupted".into())),
        }
    }

    /// The environment report of a fresh companion process (`environment --json`).
    pub fn environment(&self, device: CudaDevice) -> Result<EnvironmentReport, MeasureError> {
        let out = self
            .command()
            .args(["environment", "--json", "--device", &device.to_string()])
            .stderr(Stdio::null())
            .output()
            .map_err(|e| {
                MeasureError::LibtorchNotLoadable(format!("cannot start {PROGRAM}: {e}"))
            })?;
        if !out.status.success() {
            return Err(MeasureError::LibtorchNotLoadable(format!(
                "{PROGRAM} could not report ({})",
                out.status
            )));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| MeasureError::Torch {
            phase: None,
            message: format!("{PROGRAM} printed no environment report: {e}"),
        })
    }

    /// Runs the lesson (PyTorch's default allocator settings, or with `expandable` segments) on
    /// `device` in a fresh companion process and returns its record. With `expandable`,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` is set in the companion's environment,
    /// unless this process already has it (a different value is refused).
    pub fn lesson_fresh(
        &self,
        device: CudaDevice,
        expandable: bool,
    ) -> Result<LessonRecord, LessonError> {
        let set = alloc_conf_for(expandable, std::env::var_os(ALLOC_CONF).as_deref())?;
        let dir = temporary_folder()?;
        let output = dir.path().join("lesson.json");
        let mut args: Vec<OsString> = ["lesson", "--quiet", "--device", &device.to_string()]
            .into_iter()
            .map(Into::into)
            .collect();
        args.extend(["--output".into(), output.clone().into()]);
        if expandable {
            args.push("--expandable-segments".into());
        }
        let env: Vec<(&str, &OsStr)> = set
            .map(|v| (ALLOC_CONF, OsStr::new(v)))
            .into_iter()
            .collect();
        match run_fresh(self, dir.path(), &args, &env) {
            Ending::Completed => Ok(LessonRecord::load(&output)?),
            Ending::Unavailable(why) => Err(LessonError::Unavailable(why)),
            Ending::LoaderFailed(why) => Err(LessonError::Unavailable(format!(
                "the system loader could not start {PROGRAM}: {why}"
            ))),
            Ending::NotStarted(why) => Err(LessonError::Unavailable(why)),
            Ending::OutOfMemory { message, .. } => Err(LessonError::OutOfMemory(message)),
            Ending::Failed { code, message } => Err(LessonError::Failed {
                code: code.unwrap_or(-1),
                message,
            }),
            Ending::Interrupted => Err(LessonError::Failed {
                code: Status::Interrupted as i32,
                message: "interrupted".into(),
            }),
        }
    }
}
