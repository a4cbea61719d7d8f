//! The results grid through `resultats_bruts`: append from a real measurement file, refusals,
//! duplicates, concurrent writers, killed writers, and checks of hand-edited grids.

mod common;

use common::{resultats_bruts as rb, DATA_ERROR, RECORDED, ROOT, USAGE};
use predicates::str::contains;
use std::path::{Path, PathBuf};

/// A fresh blank grid in a temporary folder.
fn blank_grid(dir: &Path) -> PathBuf {
    let grid = dir.join("resultats-bruts.csv");
    std::fs::copy(Path::new(ROOT).join("data/resultats-bruts.csv"), &grid).unwrap();
    grid
}

/// Distinct measurement files for the grid's bookkeeping: copies of the recorded one whose
/// `measured_at` differs, so that each has its own SHA-256. They test the grid, not the GPU.
fn measurement_copies(dir: &Path, n: usize) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(RECORDED)).unwrap();
    (0..n)
        .map(|i| {
            let p = dir.join(format!("m{i}.json"));
            let copy = text.replacen("T05:29:", &format!("T05:{:02}:", i % 60), 1);
            let copy = copy.replacen("2026-11-30T", &format!("2026-11-{:02}T", 1 + i / 60), 1);
            std::fs::write(&p, copy).unwrap();
            p
        })
        .collect()
}

fn subfolder(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn append_args(grid: &Path, measurement: &Path) -> Vec<String> {
    [
        "append",
        "--gpu",
        "b200",
        "--days",
        "7",
        "--lots",
        "2",
        "--useful-work-unit",
        "one support ticket classified",
        "--threshold",
        "label equals the reviewer's label",
        "--accepted-results",
        "3",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--grid".into(), grid.display().to_string()])
    .chain(["--measurement".into(), measurement.display().to_string()])
    .collect()
}

fn rows(grid: &Path) -> usize {
    std::fs::read_to_string(grid).unwrap().lines().count() - 1
}

#[test]
fn append_ties_measurement_quote_and_protocol_in_one_row() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let recorded = Path::new(ROOT).join(RECORDED);
    rb().args(append_args(&grid, &recorded))
        .assert()
        .success()
        .stdout(contains("NVIDIA H200"))
        .stdout(contains("unit_cost_usd              1042.666667"));
    let text = std::fs::read_to_string(&grid).unwrap();
    let sha = iteragpu_lab::sha256_hex(&std::fs::read(&recorded).unwrap());
    assert!(text.contains(&sha));
    assert!(text.contains(",312800,1042.666667,data/tarifs-forfaits.csv,"));
    rb().args(["check", "--grid", grid.to_str().unwrap()])
        .assert()
        .success()
        .stdout(contains("1 row(s), no problem found"));
}

#[test]
fn append_refuses_bad_input_and_duplicates_and_keeps_the_grid() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(dir.path(), 1).remove(0);
    rb().args(append_args(&grid, &m)).assert().success();
    let before = std::fs::read(&grid).unwrap();
    rb().args(append_args(&grid, &m))
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("already has a row for measurement"));
    let mut bad = append_args(&grid, &m);
    let i = bad.iter().position(|a| a == "--accepted-results").unwrap();
    bad[i + 1] = "0".into();
    rb().args(&bad)
        .assert()
        .code(USAGE)
        .stderr(contains("--accepted-results"));
    let mut bad = append_args(&grid, &m);
    let i = bad.iter().position(|a| a == "--threshold").unwrap();
    bad[i + 1] = "two\nlines".into();
    rb().args(&bad)
        .assert()
        .code(USAGE)
        .stderr(contains("--threshold"));
    let not_json = dir.path().join("not.json");
    std::fs::write(&not_json, "{}").unwrap();
    rb().args(append_args(&grid, &not_json))
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("not a measurement file"));
    assert_eq!(
        std::fs::read(&grid).unwrap(),
        before,
        "refusals leave the grid as it was"
    );
}

#[test]
fn concurrent_appends_lose_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let files = measurement_copies(dir.path(), 12);
    let bin = assert_cmd::cargo::cargo_bin("resultats_bruts");
    let children: Vec<_> = files
        .iter()
        .map(|m| {
            std::process::Command::new(&bin)
                .current_dir(ROOT)
                .args(append_args(&grid, m))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(rows(&grid), 12);
    rb().args(["check", "--grid", grid.to_str().unwrap()])
        .assert()
        .success();
}

#[test]
fn a_killed_writer_leaves_the_grid_whole() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let files = measurement_copies(dir.path(), 25);
    let bin = assert_cmd::cargo::cargo_bin("resultats_bruts");
    for (i, m) in files.iter().enumerate() {
        let before = rows(&grid);
        let mut child = std::process::Command::new(&bin)
            .current_dir(ROOT)
            .args(append_args(&grid, m))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_micros(300 * i as u64));
        let _ = child.kill();
        let _ = child.wait();
        let after = rows(&grid);
        assert!(
            after == before || after == before + 1,
            "{before} -> {after}"
        );
        rb().args(["check", "--grid", grid.to_str().unwrap()])
            .assert()
            .success();
    }
    // The next append removes what killed writers left behind.
    let last = measurement_copies(&subfolder(dir.path(), "x"), 1).remove(0);
    rb().args(append_args(&grid, &last)).assert().success();
    let leftovers = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn check_reports_each_bad_row_by_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(dir.path(), 2);
    rb().args(append_args(&grid, &m[0])).assert().success();
    rb().args(append_args(&grid, &m[1])).assert().success();
    let text = std::fs::read_to_string(&grid).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[1] = lines[1].replace(",1042.666667,", ",1042.67,");
    lines[2] = lines[2]
        .replace(",b200,", ",,")
        .replace(",float32,", ",float64,");
    lines.push("not,enough,fields".into());
    lines.push(lines[1].clone());
    std::fs::write(&grid, lines.join("\n") + "\n").unwrap();
    rb().args(["check", "--grid", grid.to_str().unwrap()])
        .assert()
        .code(DATA_ERROR)
        .stdout(contains("line 2, column `unit_cost_usd`: `1042.67` but 312800 cents / 3 results gives 1042.666667"))
        .stdout(contains("line 3, column `gpu_model`: must not be empty"))
        .stdout(contains("line 3, column `dtype`"))
        .stdout(contains("line 4, column `(row)`: 3 fields, expected 26"))
        .stdout(contains("line 5, column `measurement_sha256`: the same measurement is already on line 2"));
    // A broken grid is never appended to.
    let extra = measurement_copies(&subfolder(dir.path(), "y"), 1).remove(0);
    rb().args(append_args(&grid, &extra))
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("nothing was appended"));
}
