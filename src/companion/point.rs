//! A sweep's points, each measured in a fresh companion process on one device; while a point
//! runs, the next point's process is already started as a spare.

use super::handover::{point_args, Ending};
use super::process::{Companion, Spare};
use crate::device::CudaDevice;
use crate::measure::{MeasureConfig, Measurement};
use crate::sweep::{PointOutcome, PointRunner};
use std::path::{Path, PathBuf};

/// A point's outcome from how its companion ended.
fn point_outcome(ending: Ending, output: &Path) -> PointOutcome {
    match ending {
        Ending::Completed => match Measurement::load(output) {
            Ok(m) => PointOutcome::Measured(Box::new(m)),
            Err(e) => PointOutcome::Failed(e.to_string()),
        },
        // Stopped after writing its measurement (the file is written whole or not at all), in
        // its teardown: the point was measured. Stopped before, it may have left a temporary file.
        Ending::Interrupted => match Measurement::load(output) {
            Ok(m) => PointOutcome::Measured(Box::new(m)),
            Err(_) => {
                crate::files::remove_leftovers(output);
                PointOutcome::Interrupted
            }
        },
        Ending::OutOfMemory { during, message } => PointOutcome::OutOfMemory {
            phase: during,
            message,
        },
        Ending::Unavailable(why) | Ending::LoaderFailed(why) => PointOutcome::Unavailable(why),
        Ending::Failed { code, message } => PointOutcome::Failed(match code {
            Some(code) => format!("exit {code}: {message}"),
            None => message,
        }),
        Ending::NotStarted(why) => PointOutcome::Failed(why),
    }
}

/// Runs each point in a fresh companion process on one device. While a point runs, the next
/// point's process is already started as a [`Spare`]: it loads its libraries meanwhile and touches
/// no GPU until it is given its point, after this one has exited.
pub struct CompanionRunner {
    companion: Companion,
    device: CudaDevice,
    spare: Option<Spare>,
    /// Where the companions write their result files.
    results: Option<tempfile::TempDir>,
    started: u64,
}

impl CompanionRunner {
    pub fn new(companion: Companion, device: CudaDevice) -> CompanionRunner {
        CompanionRunner {
            companion,
            device,
            spare: None,
            results: tempfile::tempdir().ok(),
            started: 0,
        }
    }

    /// A spare companion with a result file of its own.
    fn spare(&mut self) -> std::io::Result<Spare> {
        self.started += 1;
        let folder = self
            .results
            .as_ref()
            .map_or_else(std::env::temp_dir, |d| d.path().to_path_buf());
        let result: PathBuf = folder.join(format!("companion-{}.json", self.started));
        self.companion.spare(&result)
    }
}

impl PointRunner for CompanionRunner {
    fn run(&mut self, config: &MeasureConfig, output: &Path) -> PointOutcome {
        let config = MeasureConfig {
            device: self.device,
            ..config.clone()
        };
        let spare = match self.spare.take() {
            Some(spare) => Ok(spare),
            None => self.spare(),
        };
        self.spare = self.spare().ok();
        let (ending, result) = match spare {
            Err(e) => (Ending::of(Err(e), None), None),
            Ok(s) => {
                let result = s.result.clone();
                let ended = s.run(&point_args(&config, output, false));
                (Ending::of(ended, Some(&result)), Some(result))
            }
        };
        if let Some(result) = result {
            let _ = std::fs::remove_file(result);
        }
        point_outcome(ending, output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_stopped_after_writing_its_measurement_was_measured() {
        let dir = tempfile::tempdir().unwrap();
        let written = dir.path().join("point.json");
        let recorded =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data/exemple-mesure-h200-petit-essai.json");
        std::fs::copy(recorded, &written).unwrap();
        assert!(matches!(
            point_outcome(Ending::Interrupted, &written),
            PointOutcome::Measured(_)
        ));
        assert!(matches!(
            point_outcome(Ending::Interrupted, &dir.path().join("none.json")),
            PointOutcome::Interrupted
        ));
    }
}
