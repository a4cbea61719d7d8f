//! What the results grid's tests share: a blank grid to append to, and the `append` command line
//! for the seed's quote.

use super::{ROOT, SEED_QUOTE};
use std::path::{Path, PathBuf};

/// A fresh blank grid in `dir` (a copy of the shipped `data/resultats-bruts.csv`).
pub fn blank_grid(dir: &Path) -> PathBuf {
    let grid = dir.join("resultats-bruts.csv");
    std::fs::copy(Path::new(ROOT).join("data/resultats-bruts.csv"), &grid).unwrap();
    grid
}

/// `resultats_bruts append` of `measurement` into `grid`, for the seed's quote and 3 accepted
/// results.
pub fn append_args(grid: &Path, measurement: &Path) -> Vec<String> {
    ["append"]
        .into_iter()
        .chain(SEED_QUOTE)
        .chain([
            "--useful-work-unit",
            "one support ticket classified",
            "--threshold",
            "label equals the reviewer's label",
            "--accepted-results",
            "3",
        ])
        .map(String::from)
        .chain(["--grid".into(), grid.display().to_string()])
        .chain(["--measurement".into(), measurement.display().to_string()])
        .collect()
}
