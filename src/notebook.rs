//! What a notebook calls to measure: each measurement, lesson and environment report in a fresh
//! GPU process (never in the notebook's kernel, so that nothing of the kernel's own allocator
//! reaches a figure), and, where nothing can be measured here, what was recorded on an H200,
//! labelled as recorded elsewhere with why nothing was measured here.

use crate::companion::{Companion, CompanionRunner, LessonError};
use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
use crate::lesson::record::{LessonRecord, RECORDED_DEFAULT, RECORDED_EXPANDABLE};
use crate::lesson::Lessons;
use crate::measure::{MeasureConfig, MeasureError, Measurement};
use crate::shown::Shown;
use crate::sweep::{Dimension, PointRunner, StopRule, Sweep, SweepError};
use std::path::{Path, PathBuf};

/// The environment report for `device`, from a fresh GPU process when the project's GPU program
/// is installed, else a report that says why no libtorch was reached (always a valid report).
pub fn environment(device: CudaDevice) -> EnvironmentReport {
    match Companion::locate() {
        Ok(c) => c.environment(device).unwrap_or_else(|e| {
            EnvironmentReport::companion_unreachable(device, true, e.to_string())
        }),
        Err(e) => EnvironmentReport::companion_unreachable(device, false, e.to_string()),
    }
}

/// Measures `config` in a fresh GPU process (its block map too, with `blocks`), or says why
/// nothing could be measured (the reason of exit code 2).
pub fn measure(config: &MeasureConfig, blocks: bool) -> Result<Measurement, MeasureError> {
    Companion::locate()?.measure_fresh(config, blocks)
}

/// The measurement `result` holds, else the one recorded in `recorded`, labelled so.
pub fn shown(result: &Result<Measurement, MeasureError>, recorded: &Path) -> Shown<Measurement> {
    Shown::or_recorded(result.as_ref().cloned(), recorded, Measurement::load)
}

/// Why no file holds the measurement shown.
#[derive(Debug, thiserror::Error)]
pub enum NoFile {
    /// Nothing was measured here and the recording could not be read.
    #[error("{0}")]
    NothingShown(String),
    #[error(transparent)]
    Write(#[from] crate::files::WriteError),
}

impl Shown<Measurement> {
    /// A file holding this measurement, for the results grid: the recorded file itself, or a new
    /// file written in `folder`.
    pub fn file_in(&self, folder: &Path) -> Result<PathBuf, NoFile> {
        if let Some(file) = self.recorded_file() {
            return Ok(file.to_path_buf());
        }
        let m = self.value_or_why().map_err(NoFile::NothingShown)?;
        let path = folder.join(format!("mesures-{}.json", m.measured_at.replace(':', "")));
        crate::files::write_new_json(&path, m)?;
        Ok(path)
    }
}

/// Runs the lesson on `device` in a fresh GPU process, first with PyTorch's default allocator
/// settings, then with expandable segments (one after the other: each sizes its last steps from
/// the free memory, which the other must not hold); each one that cannot run here is read instead
/// from its recording in `data` (`exemple-lecon-h200.json`,
/// `exemple-lecon-h200-expandable.json`), labelled as recorded elsewhere, with why nothing was
/// measured here.
pub fn lessons(device: CudaDevice, data: &Path) -> Lessons {
    let run = |expandable| Companion::locate()?.lesson_fresh(device, expandable);
    let default = run(false);
    // Without a GPU or a companion the second run would fail the same way: it is not started.
    let expandable = match &default {
        Err(LessonError::Unavailable(why)) => Err(LessonError::Unavailable(why.clone())),
        Err(LessonError::Measure(e @ MeasureError::NoCompanion { .. })) => {
            Err(LessonError::Unavailable(e.to_string()))
        }
        _ => run(true),
    };
    Lessons {
        default: Shown::or_recorded(
            default,
            &data.join(RECORDED_DEFAULT),
            LessonRecord::load_recording,
        ),
        expandable: Shown::or_recorded(
            expandable,
            &data.join(RECORDED_EXPANDABLE),
            LessonRecord::load_recording,
        ),
    }
}

/// Sweeps `dimension` over `values` from `base`, each point in a fresh GPU process on `base`'s
/// device, in a new temporary folder, until two points in a row run out of memory; without a GPU
/// (the first point finds none), reads the sweep recorded in `recorded` instead, labelled so.
pub fn sweep(
    base: &MeasureConfig,
    dimension: Dimension,
    values: &[u64],
    recorded: &Path,
) -> Result<Shown<Sweep>, SweepError> {
    let (first, last) = match (values.first(), values.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => {
            return Ok(Shown::recorded(
                recorded,
                "no value to sweep".into(),
                Sweep::load,
            ))
        }
    };
    let companion = match Companion::locate() {
        Ok(c) => c,
        Err(e) => return Ok(Shown::recorded(recorded, e.to_string(), Sweep::load)),
    };
    let folder = tempfile::Builder::new()
        .prefix("iteragpu-sweep-")
        .tempdir()
        .map_err(|source| SweepError::Io {
            file: std::env::temp_dir().display().to_string(),
            source,
        })?
        .keep()
        .join("sweep");
    let mut sweep = Sweep::open(&folder, dimension, first, last, base, false)?;
    let runner: Box<dyn PointRunner + Send> =
        Box::new(CompanionRunner::new(companion, base.device));
    let done = crate::sweep::run(
        &mut sweep,
        values,
        vec![runner],
        StopRule::TwoOutOfMemoryInARow,
        &|_, _| {},
    );
    match done {
        Ok(()) => Ok(Shown::here(sweep)),
        Err(SweepError::Unavailable(why)) => Ok(Shown::recorded(recorded, why, Sweep::load)),
        Err(e) => Err(e),
    }
}
