//! The largest value of the varied dimension that fits on this GPU: predicted by the allocator
//! model against the memory the allocator can get, then verified by measurement on both sides
//! (the limit fits, the next value runs out of memory), with bisection between measured points
//! when the prediction is wrong.

use super::{Dimension, Sweep, SweepError};
use crate::allocator::{ComputeCapability, Workspaces};
use crate::measure::predict;
use crate::measure::MeasureConfig;
use serde::{Deserialize, Serialize};

/// What the allocator of a fresh process can take on this GPU, measured from one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// Free device memory once a process has started CUDA.
    pub runtime_free_at_start_bytes: u64,
    /// What the libraries (cuBLAS) then take outside the allocator.
    pub libraries_outside_allocator_bytes: u64,
}

impl Capacity {
    /// Bytes the allocator can reserve: free at start − the libraries' share.
    pub fn for_allocator(&self) -> u64 {
        self.runtime_free_at_start_bytes
            .saturating_sub(self.libraries_outside_allocator_bytes)
    }
}

/// The outcome of a limit search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSearch {
    pub dimension: Dimension,
    /// The capacity the prediction used.
    pub capacity: Option<Capacity>,
    /// The largest value whose predicted peak reserved fits the capacity (`None`: not even
    /// `from`, or no prediction possible).
    pub predicted: Option<u64>,
    /// The largest value measured to fit, with the next one measured out of memory (`None`:
    /// none fits; `to` when every value up to `to` fits).
    pub found: Option<u64>,
    /// Whether `found` is bounded by a measured out-of-memory at `found + 1` (false when the
    /// search reached `to` without one).
    pub bounded: bool,
    /// Points measured by the search.
    pub points: usize,
    /// How the search went, in words.
    pub how: String,
}

/// The largest value in `[lo, hi]` whose predicted peak reserved fits `capacity`, by bisection
/// on the model (peak reserved grows with every dimension).
pub fn predicted_limit(
    dimension: Dimension,
    base: &MeasureConfig,
    lo: u64,
    hi: u64,
    model: (ComputeCapability, Workspaces),
    capacity: u64,
) -> Option<u64> {
    let fits = |v: u64| {
        predict(&dimension.apply(base, v), model.0, model.1)
            .is_ok_and(|p| p.max_peak_reserved() <= capacity)
    };
    if !fits(lo) {
        return None;
    }
    let (mut good, mut bad) = (lo, hi.checked_add(1)?);
    if fits(hi) {
        return Some(hi);
    }
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

/// Finds the limit in `[from, to]`: measures `from` (to learn the capacity and the architecture),
/// predicts, verifies the prediction and its next value, and bisects between the closest measured
/// fit and out-of-memory when the prediction is wrong. Every point is a row of the sweep.
pub fn find_limit(
    sweep: &mut Sweep,
    runner: &mut dyn super::PointRunner,
    from: u64,
    to: u64,
) -> Result<LimitSearch, SweepError> {
    let dimension = sweep.dimension;
    let mut points = 0;
    let mut status =
        |sweep: &mut Sweep, v: u64, points: &mut usize| -> Result<Option<bool>, SweepError> {
            let before = sweep.row(v).is_some();
            let row = match sweep.measure(runner, v)? {
                Some(row) => row,
                None => {
                    return Err(SweepError::Interrupted {
                        done: sweep.rows.len(),
                        folder: sweep.folder.clone(),
                    })
                }
            };
            if !before {
                *points += 1;
            }
            Ok(match row.status {
                super::PointStatus::Ok => Some(true),
                super::PointStatus::Oom => Some(false),
                _ => None,
            })
        };
    let mut search = LimitSearch {
        dimension,
        capacity: None,
        predicted: None,
        found: None,
        bounded: false,
        points: 0,
        how: String::new(),
    };
    match status(sweep, from, &mut points)? {
        Some(true) => {}
        Some(false) => {
            search.how = format!("{dimension} = {from} already runs out of memory");
            search.bounded = true;
            search.points = points;
            return Ok(search);
        }
        None => {
            search.how = format!("{dimension} = {from} failed: no limit can be searched");
            search.points = points;
            return Ok(search);
        }
    }
    let first = sweep.row(from).cloned().expect("measured");
    search.capacity = match (
        first.runtime_free_at_start_bytes,
        first.libraries_outside_allocator_bytes,
    ) {
        (Some(free), Some(libs)) => Some(Capacity {
            runtime_free_at_start_bytes: free,
            libraries_outside_allocator_bytes: libs,
        }),
        _ => None,
    };
    if let (Some(capacity), Some(model)) = (search.capacity, sweep.model) {
        search.predicted = predicted_limit(
            dimension,
            &sweep.base,
            from,
            to,
            model,
            capacity.for_allocator(),
        );
    }
    // Known bounds: `good` measured to fit, `bad` measured out of memory (or past `to`).
    let (mut good, mut bad) = (from, to.saturating_add(1));
    let mut check =
        |v: u64, good: &mut u64, bad: &mut u64, sweep: &mut Sweep| -> Result<(), SweepError> {
            if v <= *good || v >= *bad {
                return Ok(());
            }
            match status(sweep, v, &mut points)? {
                Some(true) => *good = v,
                // A failure other than out-of-memory counts against the value: the limit is below it.
                _ => *bad = v,
            }
            Ok(())
        };
    if let Some(p) = search.predicted {
        check(p, &mut good, &mut bad, sweep)?;
        check(p.saturating_add(1), &mut good, &mut bad, sweep)?;
    }
    let verified = search.predicted.is_some_and(|p| good == p && bad == p + 1);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        check(mid, &mut good, &mut bad, sweep)?;
    }
    search.found = Some(good);
    search.bounded = bad <= to;
    search.points = points;
    search.how = match (search.predicted, verified) {
        (Some(p), true) => format!(
            "predicted {p}; measured: {p} fits and {} runs out of memory",
            p + 1
        ),
        (Some(p), false) => format!("predicted {p}; measurement disagreed, bisection found {good}"),
        (None, _) => format!("no prediction possible; bisection found {good}"),
    };
    sweep.summary.limit = Some(search.clone());
    sweep.save()?;
    Ok(search)
}
