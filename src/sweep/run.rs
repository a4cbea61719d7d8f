//! The points of a sweep measured until the stop rule says enough: on one GPU or several in
//! parallel (one runner, thus one fresh process at a time, per GPU), each point recorded as it
//! ends. The command line and the notebooks run their sweeps through it.

use super::{PointOutcome, PointRunner, PointStatus, Sweep, SweepError, SweepRow};
use std::sync::Mutex;
use std::time::Instant;

/// When a sweep stops before its last value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopRule {
    /// After two points in a row (in value order) ran out of memory: the values beyond are
    /// larger still.
    TwoOutOfMemoryInARow,
    /// Never: every value is measured (`--keep-going`).
    Never,
}

impl StopRule {
    /// Whether the recorded rows say to stop.
    fn says_stop(self, rows: &[SweepRow]) -> bool {
        match self {
            StopRule::Never => false,
            StopRule::TwoOutOfMemoryInARow => rows
                .windows(2)
                .any(|w| w[0].status == PointStatus::Oom && w[1].status == PointStatus::Oom),
        }
    }
}

/// Measures every value of `values` the sweep does not hold yet, in order, each in a fresh
/// process of one of `runners` (one thread per runner: the points then run in parallel, one per
/// GPU), records each row as its point ends and tells `on_row`. Each worker records its point and
/// decides whether to go on under one lock, so that a stop is seen before the next point starts.
/// Stops when `stop` says so, at an interruption ([`SweepError::Interrupted`], the completed rows
/// kept), or when a point finds no GPU ([`SweepError::Unavailable`], nothing recorded for it).
pub fn run(
    sweep: &mut Sweep,
    values: &[u64],
    runners: Vec<Box<dyn PointRunner + Send + '_>>,
    stop: StopRule,
    on_row: &(dyn Fn(&Sweep, &SweepRow) + Sync),
) -> Result<(), SweepError> {
    let folder = sweep.folder.clone();
    let points: Vec<(u64, crate::measure::MeasureConfig, std::path::PathBuf)> = values
        .iter()
        .filter(|v| sweep.row(**v).is_none())
        .map(|v| {
            let (config, file) = sweep.point(*v);
            (*v, config, folder.join(file))
        })
        .collect();
    struct Shared<'s> {
        sweep: &'s mut Sweep,
        next: usize,
        stop: bool,
        interrupted: bool,
        failure: Option<SweepError>,
    }
    let shared = Mutex::new(Shared {
        sweep,
        next: 0,
        stop: false,
        interrupted: false,
        failure: None,
    });
    std::thread::scope(|scope| {
        for mut runner in runners {
            let (shared, points) = (&shared, &points);
            scope.spawn(move || loop {
                let started = Instant::now();
                let ((value, config, output), written) = {
                    let mut s = shared.lock().expect("no worker panics");
                    if s.stop {
                        break;
                    }
                    let Some(point) = points.get(s.next) else {
                        break;
                    };
                    s.next += 1;
                    (point, s.sweep.written_earlier(point.0))
                };
                let outcome = written.unwrap_or_else(|| runner.run(config, output));
                let mut s = shared.lock().expect("no worker panics");
                if matches!(outcome, PointOutcome::Interrupted) {
                    s.stop = true;
                    s.interrupted = true;
                    break;
                }
                match s
                    .sweep
                    .record(*value, outcome, started.elapsed().as_secs_f64())
                {
                    Ok(Some(row)) => {
                        on_row(s.sweep, &row);
                        if stop.says_stop(&s.sweep.rows) {
                            s.stop = true;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        s.stop = true;
                        s.failure.get_or_insert(e);
                    }
                }
            });
        }
    });
    let shared = shared.into_inner().expect("no worker panics");
    if let Some(e) = shared.failure {
        return Err(e);
    }
    if shared.interrupted {
        return Err(SweepError::Interrupted {
            done: shared.sweep.rows.len(),
            folder: shared.sweep.folder.clone(),
        });
    }
    Ok(())
}
