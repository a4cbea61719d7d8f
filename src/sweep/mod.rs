//! Capacity sweeps: one dimension of the synthetic network varied over a range, each point
//! measured in its own fresh process (the cache and the allocator's retry-after-free of one point
//! never reach the next), every row written atomically to `FOLDER/sweep.csv` beside the model's
//! prediction, and the largest value that fits found by prediction first, then verified on both
//! sides by measurement (bisection when the prediction is wrong).
//!
//! - [`plan`](mod@plan): the values a sweep measures;
//! - [`folder`]: the sweep's files, its rows and its summary ([`Sweep`]);
//! - [`run`](mod@run): the points measured on one GPU or several until the stop rule says enough;
//! - [`limit`]: the largest value that fits, predicted then verified.
//!
//! The points run through a [`PointRunner`]: the command line's and the notebooks' run the GPU
//! companion program; tests use a simulated one.

pub mod folder;
pub mod limit;
pub mod plan;
pub mod run;

pub use folder::{
    csv_header, libraries_outside_allocator, Sweep, SweepError, SweepRow, SweepSummary, CSV_FILE,
    SUMMARY_FILE,
};
pub use limit::{find_limit, Capacity, LimitSearch};
pub use plan::{values, Dimension, PlanError, Spacing, MAX_POINTS};
pub use run::{run, StopRule};

use crate::measure::{MeasureConfig, Measurement};
use std::path::Path;

/// How one point ended.
#[derive(Debug, Clone)]
pub enum PointOutcome {
    /// Measured; the measurement file was written.
    Measured(Box<Measurement>),
    /// CUDA ran out of memory, in the phase named when known.
    OutOfMemory {
        phase: Option<String>,
        message: String,
    },
    /// Any other failure, with its message.
    Failed(String),
    /// The sweep was interrupted while this point ran: no row is written for it.
    Interrupted,
    /// No usable GPU or libtorch for the point's process (its exit 2): the sweep stops, and no
    /// row is written for it.
    Unavailable(String),
}

/// How a measured point ended, as its row says it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    strum::Display,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum PointStatus {
    /// Measured.
    Ok,
    /// CUDA ran out of memory.
    Oom,
    /// Any other failure.
    Error,
}

impl PointStatus {
    /// The status as the row writes it (`ok`, `oom`, `error`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Runs one point in a fresh process and writes its measurement to `output`.
pub trait PointRunner {
    fn run(&mut self, config: &MeasureConfig, output: &Path) -> PointOutcome;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{ComputeCapability, WorkspaceSettings, Workspaces};
    use crate::environment::{EnvironmentReport, GpuInfo, LibtorchInfo};
    use crate::measure::predict;
    use crate::measure::{Dtype, PhaseRecord};
    use crate::units::Bytes;

    const LIBRARIES: u64 = 170 << 20;

    /// A GPU simulated with the allocator model: a point whose predicted peak reserved exceeds
    /// `capacity` runs out of memory in the first phase that does; others "measure" the model's
    /// figures. `reports_free` is the free memory it claims at start (the capacity plus what the
    /// libraries take, unless a test makes it lie).
    struct Simulated {
        capacity: u64,
        reports_free: u64,
        runs: Vec<u64>,
        interrupt_at: Option<usize>,
    }

    impl Simulated {
        fn new(capacity: u64) -> Simulated {
            Simulated {
                capacity,
                reports_free: capacity + LIBRARIES,
                runs: Vec::new(),
                interrupt_at: None,
            }
        }
    }

    impl PointRunner for Simulated {
        fn run(&mut self, config: &MeasureConfig, output: &Path) -> PointOutcome {
            self.runs.push(config.batch);
            if self.interrupt_at == Some(self.runs.len()) {
                return PointOutcome::Interrupted;
            }
            let cc = ComputeCapability::new(9, 0);
            let ws = Workspaces::for_gpu(cc, &WorkspaceSettings::default()).unwrap();
            let p = predict(config, cc, ws).unwrap();
            if let Some(row) = p
                .phases
                .iter()
                .find(|r| r.figures.peak_reserved_bytes > self.capacity)
            {
                return PointOutcome::OutOfMemory {
                    phase: Some(row.phase.name().into()),
                    message: "CUDA out of memory".into(),
                };
            }
            let phases: Vec<PhaseRecord> = p
                .phases
                .iter()
                .map(|r| PhaseRecord {
                    phase: r.phase,
                    repetition: r.repetition,
                    passes: 1,
                    figures: r.figures,
                    host_wall_time_ms: 1.0,
                    gpu_event_time_ms: 1.0,
                    prediction: None,
                    blocks: None,
                })
                .collect();
            let reserved_end = phases.last().unwrap().figures.reserved_end_bytes;
            let mut env = EnvironmentReport::without_libtorch(
                Some(config.device),
                LibtorchInfo {
                    built_with: true,
                    ..Default::default()
                },
            );
            env.device = Some(GpuInfo {
                index: 0,
                name: "Simulated GPU".into(),
                compute_capability: "9.0".into(),
                multiprocessors: 1,
                total_memory: Bytes(self.reports_free + (1 << 30)),
                runtime_free: Bytes(self.reports_free - LIBRARIES - reserved_end),
                runtime_total: Bytes(self.reports_free + (1 << 30)),
            });
            let mut m = Measurement::new(env, config.clone(), phases).unwrap();
            m.runtime_free_at_start_bytes = Some(self.reports_free);
            m.attach_prediction(Ok(WorkspaceSettings::default()));
            crate::files::write_new_json(output, &m).unwrap();
            PointOutcome::Measured(Box::new(m))
        }
    }

    /// A sweep of batch from 1 to `to` over [`base`] in `folder`.
    fn open(folder: &Path, to: u64, resume: bool) -> Result<Sweep, SweepError> {
        Sweep::open(folder, Dimension::Batch, 1, to, &base(), resume)
    }

    fn base() -> MeasureConfig {
        MeasureConfig {
            context: 4096,
            width: 1024,
            hidden: Some(16384),
            dtype: Dtype::Bfloat16,
            ..Default::default()
        }
    }

    /// The largest batch the simulated GPU holds, by brute force on the model.
    fn true_limit(capacity: u64) -> u64 {
        let mut sim = Simulated::new(capacity);
        let dir = tempfile::tempdir().unwrap();
        (1..1000)
            .take_while(|b| {
                let c = Dimension::Batch.apply(&base(), *b);
                matches!(
                    sim.run(&c, &dir.path().join(format!("{b}.json"))),
                    PointOutcome::Measured(_)
                )
            })
            .last()
            .unwrap()
    }

    #[test]
    fn points_become_rows_and_the_csv_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("sweep");
        let mut sweep = open(&folder, 64, false).unwrap();
        let mut gpu = Simulated::new(6 << 30);
        for v in values(1, 64, Spacing::Geometric).unwrap() {
            sweep.measure(&mut gpu, v).unwrap().unwrap();
        }
        let statuses: Vec<_> = sweep.rows.iter().map(|r| r.status.name()).collect();
        assert_eq!(statuses, ["ok", "ok", "ok", "ok", "ok", "oom", "oom"]);
        assert_eq!(sweep.rows[5].oom_phase, "cold_forward");
        // Measured figures come with the model's beside them, and here they agree.
        let first = &sweep.rows[0];
        assert_eq!(
            first.peak_reserved_bytes,
            first.predicted_peak_reserved_bytes
        );
        assert_eq!(first.libraries_outside_allocator_bytes, Some(LIBRARIES));
        let text = std::fs::read_to_string(folder.join(CSV_FILE)).unwrap();
        assert_eq!(text.lines().next().unwrap(), csv_header().join(","));
        let back: Vec<SweepRow> = csv::Reader::from_reader(text.as_bytes())
            .deserialize()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, sweep.rows);
        assert!(folder.join("point-batch-16.json").exists());
        let summary: SweepSummary =
            serde_json::from_slice(&std::fs::read(folder.join(SUMMARY_FILE)).unwrap()).unwrap();
        assert_eq!((summary.points, summary.out_of_memory), (7, 2));
        assert!(summary.environment.is_some());
    }

    #[test]
    fn the_limit_is_predicted_then_verified_on_both_sides() {
        let capacity = 40 << 30;
        let expected = true_limit(capacity);
        let dir = tempfile::tempdir().unwrap();
        let mut sweep = open(&dir.path().join("s"), 512, false).unwrap();
        let mut gpu = Simulated::new(capacity);
        let search = find_limit(&mut sweep, &mut gpu, 1, 512).unwrap();
        assert_eq!(search.predicted, Some(expected));
        assert_eq!(search.found, Some(expected));
        assert!(search.bounded);
        // The first point, the prediction, and the value after it.
        assert_eq!(gpu.runs, [1, expected, expected + 1]);
        assert_eq!(search.points, 3);
        assert!(search.how.contains("fits"), "{}", search.how);
    }

    #[test]
    fn a_wrong_prediction_falls_back_to_bisection() {
        let capacity = 30 << 30;
        let expected = true_limit(capacity);
        let dir = tempfile::tempdir().unwrap();
        let mut sweep = open(&dir.path().join("s"), 512, false).unwrap();
        let mut gpu = Simulated::new(capacity);
        gpu.reports_free = capacity + LIBRARIES + (8 << 30); // it claims 8 GiB it does not have
        let search = find_limit(&mut sweep, &mut gpu, 1, 512).unwrap();
        assert!(search.predicted.unwrap() > expected);
        assert_eq!(search.found, Some(expected));
        assert!(search.how.contains("bisection"), "{}", search.how);
        let oom: Vec<u64> = sweep
            .rows
            .iter()
            .filter(|r| r.status == PointStatus::Oom)
            .map(|r| r.value)
            .collect();
        assert!(oom.contains(&(expected + 1)));
    }

    #[test]
    fn results_are_never_overwritten_and_resume_skips_done_points() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("s");
        let mut gpu = Simulated::new(20 << 30);
        let mut sweep = open(&folder, 8, false).unwrap();
        sweep.measure(&mut gpu, 1).unwrap();
        sweep.measure(&mut gpu, 2).unwrap();
        let before = std::fs::read(folder.join(CSV_FILE)).unwrap();
        assert!(matches!(
            open(&folder, 8, false),
            Err(SweepError::Exists(_))
        ));
        assert_eq!(std::fs::read(folder.join(CSV_FILE)).unwrap(), before);
        let mut resumed = open(&folder, 8, true).unwrap();
        assert_eq!(resumed.rows.len(), 2);
        let mut again = Simulated::new(20 << 30);
        for v in [1, 2, 4] {
            resumed.measure(&mut again, v).unwrap();
        }
        assert_eq!(again.runs, [4], "done points are not measured again");
        // A folder of another sweep is refused.
        let other = MeasureConfig {
            width: 2048,
            ..base()
        };
        assert!(matches!(
            Sweep::open(&folder, Dimension::Batch, 1, 8, &other, true),
            Err(SweepError::Invalid { .. })
        ));
    }

    #[test]
    fn resume_records_a_point_written_but_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("s");
        let mut sweep = open(&folder, 8, false).unwrap();
        let mut gpu = Simulated::new(20 << 30);
        sweep.measure(&mut gpu, 1).unwrap();
        // Point 2's process wrote its measurement; the sweep was killed before its row.
        let (config, file) = sweep.point(2);
        gpu.run(&config, &folder.join(file));
        // A file of another configuration under point 4's name is not taken for it.
        let (_, file4) = sweep.point(4);
        gpu.run(&sweep.point(3).0, &folder.join(file4));
        let mut resumed = open(&folder, 8, true).unwrap();
        let mut again = Simulated::new(20 << 30);
        let row = resumed.measure(&mut again, 2).unwrap().unwrap();
        assert_eq!((row.status.name(), row.batch), ("ok", 2));
        assert!(again.runs.is_empty(), "not measured again");
        assert!(resumed.written_earlier(4).is_none());
        assert_eq!(Sweep::load(&folder).unwrap().rows.len(), 2);
    }

    #[test]
    fn an_interrupted_point_leaves_the_completed_ones_and_a_valid_csv() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("s");
        let mut gpu = Simulated::new(20 << 30);
        gpu.interrupt_at = Some(3);
        let mut sweep = open(&folder, 8, false).unwrap();
        assert!(sweep.measure(&mut gpu, 1).unwrap().is_some());
        assert!(sweep.measure(&mut gpu, 2).unwrap().is_some());
        assert!(sweep.measure(&mut gpu, 3).unwrap().is_none());
        let back = Sweep::load(&folder).unwrap();
        assert_eq!(back.rows.len(), 2);
        assert!(!folder.join("point-batch-3.json").exists());
        // The limit search reports the interruption with its status.
        let mut gpu = Simulated::new(20 << 30);
        gpu.interrupt_at = Some(1);
        let mut s2 = open(&dir.path().join("s2"), 8, false).unwrap();
        let e = find_limit(&mut s2, &mut gpu, 1, 8).unwrap_err();
        assert_eq!(
            crate::status::Classify::status(&e),
            crate::status::Status::Interrupted
        );
    }

    #[test]
    fn a_recorded_sweep_draws_its_chart() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("s");
        let mut sweep = open(&folder, 512, false).unwrap();
        let mut gpu = Simulated::new(40 << 30);
        find_limit(&mut sweep, &mut gpu, 1, 512).unwrap();
        let svg = Sweep::load(&folder).unwrap().chart().0;
        assert!(svg.starts_with("<svg"));
        for label in [
            "measured peak reserved",
            "predicted peak reserved",
            "out of memory",
            "capacity of the allocator",
            "limit found",
        ] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
