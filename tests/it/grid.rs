//! The results grid through `resultats_bruts`: append from a real measurement file, refusals
//! (bad texts, bad measurements, duplicates by content, broken grids), formula neutralisation,
//! links, permissions, temporary files, the lock, concurrent and killed writers, and checks of
//! hand-edited grids.

use crate::common;

use common::grid::{append_args, blank_grid};
use common::{resultats_bruts as rb, with_flag, DATA_ERROR, FAILURE, RECORDED, ROOT, USAGE};
use iteragpu_lab::grid::measurement_identity;
use iteragpu_lab::measure::Measurement;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Distinct measurement files for the grid's bookkeeping: copies of the recorded one whose
/// `measured_at` differs, so that each is another measurement. They test the grid, not the GPU.
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

/// The recorded measurement changed by `edit`, written to `dir/name`.
fn edited_measurement(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(ROOT).join(RECORDED)).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut m);
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    p
}

fn subfolder(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn rows(grid: &Path) -> usize {
    std::fs::read_to_string(grid).unwrap().lines().count() - 1
}

/// The grid's rows as column → cell maps.
fn cells(grid: &Path) -> Vec<std::collections::HashMap<String, String>> {
    csv::Reader::from_path(grid)
        .unwrap()
        .deserialize()
        .map(Result::unwrap)
        .collect()
}

fn check_passes(grid: &Path) {
    rb().args(["check", "--grid", grid.to_str().unwrap()])
        .assert()
        .success();
}

/// Names in `dir` ending with the temporary files' suffix.
fn temporary_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".iteragpu-tmp"))
        .collect()
}

#[test]
fn append_ties_measurement_quote_and_protocol_in_one_row() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let recorded = Path::new(ROOT).join(RECORDED);
    rb().args(append_args(&grid, &recorded))
        .assert()
        .success()
        .stderr("")
        .stdout(contains("NVIDIA H200"))
        .stdout(contains("unit_cost_usd              1042.666667"));
    let text = std::fs::read_to_string(&grid).unwrap();
    let identity = measurement_identity(&Measurement::load(&recorded).unwrap());
    assert!(text.contains(&identity));
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
        .stderr(contains("already has a row for this measurement (line 2"))
        .stderr(contains("is broken").not());
    rb().args(with_flag(
        append_args(&grid, &m),
        "--accepted-results",
        Some("0"),
    ))
    .assert()
    .code(USAGE)
    .stderr(contains("--accepted-results"));
    rb().args(with_flag(
        append_args(&grid, &m),
        "--threshold",
        Some("two\nlines"),
    ))
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
fn append_refuses_empty_and_control_character_texts() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(dir.path(), 1).remove(0);
    let before = std::fs::read(&grid).unwrap();
    for (flag, value, says) in [
        ("--useful-work-unit", "", "must not be empty"),
        ("--useful-work-unit", " \u{a0} ", "must not be empty"),
        ("--threshold", "", "must not be empty"),
        (
            "--useful-work-unit",
            "ticket\u{1b}[2J",
            "control character U+001B",
        ),
        ("--threshold", "label\tequal", "control character U+0009"),
        ("--notes", "first\rsecond", "control character U+000D"),
        ("--notes", "bell\u{7}", "control character U+0007"),
        ("--notes", "one\u{2028}two", "control character U+2028"),
        ("--notes", "\u{202E}txt.exe", "control character U+202E"),
    ] {
        rb().args(with_flag(append_args(&grid, &m), flag, Some(value)))
            .assert()
            .code(USAGE)
            .stderr(contains(format!("invalid {flag}")))
            .stderr(contains(says));
    }
    // A measurement file name with a control character would be written in the row as given.
    let odd = dir.path().join("m\u{1b}[31m.json");
    std::fs::copy(&m, &odd).unwrap();
    rb().args(append_args(&grid, &odd))
        .assert()
        .code(USAGE)
        .stderr(contains("invalid --measurement"))
        .stderr(contains("control character U+001B"));
    assert_eq!(std::fs::read(&grid).unwrap(), before);
    // Empty notes are allowed; surrounding spaces are trimmed.
    rb().args(with_flag(
        with_flag(append_args(&grid, &m), "--notes", Some("")),
        "--useful-work-unit",
        Some("  one ticket  "),
    ))
    .assert()
    .success();
    let row = &cells(&grid)[0];
    assert_eq!(
        (row["notes"].as_str(), row["useful_work_unit"].as_str()),
        ("", "one ticket")
    );
    check_passes(&grid);
}

#[test]
fn a_row_append_would_write_is_a_row_check_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let before = std::fs::read(&grid).unwrap();
    // (field in the measurement, grid column, JSON pointer, value that cannot make a valid row)
    let cases: [(&str, &str, &str, serde_json::Value); 6] = [
        (
            "configuration.batch",
            "batch",
            "/configuration/batch",
            0.into(),
        ),
        (
            "configuration.width",
            "width",
            "/configuration/width",
            0.into(),
        ),
        (
            "measured_at",
            "measured_at_utc",
            "/measured_at",
            "2026-02-30T05:29:56Z".into(),
        ),
        (
            "measured_at",
            "measured_at_utc",
            "/measured_at",
            "2026-11-30T05:29:56+02:00".into(),
        ),
        (
            "environment.device.name",
            "gpu_name",
            "/environment/device/name",
            "NVIDIA\u{1b}[31m H200".into(),
        ),
        (
            "environment.device.name",
            "gpu_name",
            "/environment/device/name",
            " ".into(),
        ),
    ];
    for (i, (field, column, pointer, value)) in cases.into_iter().enumerate() {
        let m = edited_measurement(dir.path(), &format!("bad{i}.json"), |m| {
            *m.pointer_mut(pointer).unwrap() = value
        });
        rb().args(append_args(&grid, &m))
            .assert()
            .code(DATA_ERROR)
            .stderr(contains(format!(
                "{}, field `{field}` (column `{column}`)",
                m.display()
            )))
            .stderr(contains("nothing was appended"));
        assert_eq!(std::fs::read(&grid).unwrap(), before, "case {i}: {field}");
    }
    // A peak of allocated above that of reserved: no GPU gives it, so the measurement itself is
    // refused before any row is made of it.
    let m = edited_measurement(dir.path(), "impossible.json", |m| {
        *m.pointer_mut("/phases/2/peak_allocated_bytes").unwrap() = 40_000_000.into()
    });
    rb().args(append_args(&grid, &m))
        .assert()
        .code(DATA_ERROR)
        .stderr(contains(
            "`phases[2]` (cold_forward): figures the caching allocator cannot give",
        ));
    assert_eq!(std::fs::read(&grid).unwrap(), before);
    // A catalog's display name with a control character is refused too, naming the catalog.
    let catalog = dir.path().join("catalog.csv");
    let published =
        std::fs::read_to_string(Path::new(ROOT).join("tests/fixtures/catalog-published.csv"))
            .unwrap();
    std::fs::write(
        &catalog,
        published.replace("NVIDIA GeForce RTX 4090", "RTX\u{1b}]0;x\u{7}4090"),
    )
    .unwrap();
    let m = measurement_copies(&subfolder(dir.path(), "ok"), 1).remove(0);
    let args = with_flag(
        with_flag(append_args(&grid, &m), "--gpu", Some("rtx4090")),
        "--catalog",
        Some(catalog.to_str().unwrap()),
    );
    rb().args(args)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains(catalog.display().to_string()));
    assert_eq!(std::fs::read(&grid).unwrap(), before);
    // The grid was never broken: the next good append works.
    rb().args(append_args(&grid, &m)).assert().success();
    check_passes(&grid);
}

#[test]
fn spreadsheet_formulas_are_neutralised_in_every_text_cell() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let published =
        std::fs::read_to_string(Path::new(ROOT).join("tests/fixtures/catalog-published.csv"))
            .unwrap();
    std::fs::write(
        dir.path().join("+catalog.csv"),
        published.replace("NVIDIA GeForce RTX 4090", "@SUM(1+1)"),
    )
    .unwrap();
    edited_measurement(dir.path(), "-m.json", |m| {
        m["environment"]["device"]["name"] = "=HYPERLINK(\"http://x\",\"H200\")".into()
    });
    let args = [
        "append",
        "--grid",
        grid.to_str().unwrap(),
        "--measurement=-m.json",
        "--catalog=+catalog.csv",
        "--gpu",
        "rtx4090",
        "--days",
        "7",
        "--lots",
        "1",
        "--useful-work-unit",
        "=1+1",
        "--threshold",
        "  +label matches",
        "--accepted-results",
        "3",
        "--notes",
        "@risk: -5% at night",
    ];
    rb().current_dir(dir.path()).args(args).assert().success();
    let row = &cells(&grid)[0];
    for (column, written) in [
        ("package_display_name", "'@SUM(1+1)"),
        ("gpu_name", "'=HYPERLINK(\"http://x\",\"H200\")"),
        ("measurement_file", "'-m.json"),
        ("catalog_file", "'+catalog.csv"),
        ("useful_work_unit", "'=1+1"),
        ("acceptance_threshold", "'+label matches"),
        ("notes", "'@risk: -5% at night"),
    ] {
        assert_eq!(row[column], written, "{column}");
    }
    check_passes(&grid);
    // A cell edited by hand into a formula is reported.
    let text = std::fs::read_to_string(&grid).unwrap();
    std::fs::write(
        &grid,
        text.replace(",'@risk: -5% at night", ",=cmd|'/C calc'!A0"),
    )
    .unwrap();
    rb().args(["check", "--grid", grid.to_str().unwrap()])
        .assert()
        .code(DATA_ERROR)
        .stdout(contains(
            "line 2, column `notes`: starts with '=', which a spreadsheet runs as a formula",
        ));
}

#[test]
fn the_same_measurement_reformatted_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(dir.path(), 2);
    rb().args(append_args(&grid, &m[0])).assert().success();
    let text = std::fs::read_to_string(&m[0]).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let trailing_newline = dir.path().join("newline.json");
    std::fs::write(&trailing_newline, format!("{text}\n")).unwrap();
    let compact = dir.path().join("compact.json");
    std::fs::write(&compact, serde_json::to_string(&value).unwrap()).unwrap();
    for same in [&trailing_newline, &compact] {
        rb().args(append_args(&grid, same))
            .assert()
            .code(DATA_ERROR)
            .stderr(contains("already has a row for this measurement (line 2"));
    }
    assert_eq!(rows(&grid), 1);
    rb().args(append_args(&grid, &m[1])).assert().success();
    assert_eq!(rows(&grid), 2);
}

#[test]
fn appending_through_a_symbolic_link_writes_to_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let real = blank_grid(&subfolder(dir.path(), "real"));
    let link = dir.path().join("grid-link.csv");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let m = measurement_copies(dir.path(), 1).remove(0);
    rb().args(append_args(&link, &m)).assert().success();
    assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), real);
    assert_eq!(rows(&real), 1);
    // The lock sits beside the real file, so writers through the link and through the file share it.
    assert!(dir.path().join("real/.resultats-bruts.csv.lock").is_file());
    assert!(!dir.path().join(".grid-link.csv.lock").exists());
    check_passes(&link);
}

#[test]
fn the_grid_keeps_its_permissions_and_a_read_only_grid_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(&subfolder(dir.path(), "m"), 2);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    std::fs::set_permissions(&grid, std::fs::Permissions::from_mode(0o664)).unwrap();
    rb().args(append_args(&grid, &m[0])).assert().success();
    assert_eq!(mode(&grid), 0o664);
    std::fs::set_permissions(&grid, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&grid).unwrap();
    rb().args(append_args(&grid, &m[1]))
        .assert()
        .code(FAILURE)
        .stderr(contains(format!("{} is read-only", grid.display())));
    assert_eq!(std::fs::read(&grid).unwrap(), before);
    assert_eq!(mode(&grid), 0o444);
    assert_eq!(temporary_files(dir.path()), Vec::<String>::new());
}

#[test]
fn only_the_programs_own_temporary_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(&subfolder(dir.path(), "m"), 1).remove(0);
    let users = [
        ".resultats-bruts.csv.backup.tmp",
        ".resultats-bruts.csv.old.tmp",
        ".resultats-bruts.csv.notes.iteragpu-tmp",
    ];
    for name in users {
        std::fs::write(dir.path().join(name), "the user's own file").unwrap();
    }
    let leftover = dir
        .path()
        .join(".resultats-bruts.csv.Ab3dEf7hIj9kLm0p.iteragpu-tmp");
    std::fs::write(&leftover, "half a grid").unwrap();
    rb().args(append_args(&grid, &m)).assert().success();
    assert!(!leftover.exists(), "a killed writer's leftover is removed");
    for name in users {
        assert!(dir.path().join(name).exists(), "{name} was removed");
    }
}

#[test]
fn a_held_lock_makes_another_writer_wait_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(&subfolder(dir.path(), "m"), 1).remove(0);
    let lock_file = dir.path().join(".resultats-bruts.csv.lock");
    let lock = std::fs::File::create(&lock_file).unwrap();
    lock.lock().unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("resultats_bruts"))
        .current_dir(ROOT)
        .args(append_args(&grid, &m))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            tx.send(line.unwrap()).unwrap();
        }
    });
    let said = rx.recv_timeout(Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    let running = child.try_wait().unwrap().is_none();
    let rows_while_held = rows(&grid);
    drop(lock);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let said = said.expect("the waiting writer says so on stderr");
    assert_eq!(
        said,
        format!(
            "waiting for the lock {}: another writer is appending to {}",
            lock_file.display(),
            grid.display()
        )
    );
    assert!(running, "the writer waits while the lock is held");
    assert_eq!(rows_while_held, 0);
    assert!(status.success());
    assert_eq!(rx.try_iter().count(), 0, "one line only");
    assert_eq!(rows(&grid), 1);
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
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let lock = format!(
        "waiting for the lock {}",
        dir.path().join(".resultats-bruts.csv.lock").display()
    );
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.lines().count() <= 1 && stderr.lines().all(|l| l.starts_with(&lock)),
            "{stderr}"
        );
    }
    assert_eq!(rows(&grid), 12);
    check_passes(&grid);
}

/// Writes a valid grid of `rows` rows of about `row_bytes` bytes each (long notes), from the row
/// a real append wrote, each with its own measurement identity.
fn large_grid(grid: &Path, measurement: &Path, rows: usize, row_bytes: usize) {
    rb().args(append_args(grid, measurement)).assert().success();
    let text = std::fs::read_to_string(grid).unwrap();
    let (header, row) = text.trim_end().split_once('\n').unwrap();
    let identity = &cells(grid)[0]["measurement_sha256"];
    assert!(row.ends_with(','), "the row's notes are empty");
    let mut big = format!("{header}\n");
    for i in 0..rows {
        let unique = format!("{:064x}", i + 1);
        big.push_str(&row.replace(identity.as_str(), &unique));
        big.push_str(&"x".repeat(row_bytes));
        big.push('\n');
    }
    std::fs::write(grid, big).unwrap();
}

/// A fingerprint of the folder that changes as soon as a writer starts writing: its entries, and
/// the grid's size, modification time and inode.
fn folder_state(
    dir: &Path,
    grid: &Path,
) -> (
    Vec<std::ffi::OsString>,
    Option<(u64, std::time::SystemTime, u64)>,
) {
    use std::os::unix::fs::MetadataExt;
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    let meta = std::fs::metadata(grid)
        .ok()
        .map(|m| (m.len(), m.modified().unwrap(), m.ino()));
    (names, meta)
}

/// Killed while writing, a writer leaves the grid as it was or with its whole row, never part of
/// it. The grid is several megabytes and each writer is killed the moment the folder shows it has
/// started to write (a temporary file appears, or the grid changes), so that a writer that wrote
/// the grid in place would be caught with a partial grid.
#[test]
fn a_killed_writer_leaves_the_grid_whole() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let measurements = subfolder(dir.path(), "m");
    let files = measurement_copies(&measurements, 9);
    large_grid(&grid, &files[0], 24, 256 * 1024);
    check_passes(&grid);
    let bin = assert_cmd::cargo::cargo_bin("resultats_bruts");
    let mut killed_while_writing = 0;
    for m in &files[1..] {
        let before = std::fs::read(&grid).unwrap();
        let start = folder_state(dir.path(), &grid);
        let mut child = std::process::Command::new(&bin)
            .current_dir(ROOT)
            .args(append_args(&grid, m))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            let now = folder_state(dir.path(), &grid);
            // Entries only removed (an earlier leftover cleaned up) do not mean writing started.
            let started = now.1 != start.1 || now.0.iter().any(|n| !start.0.contains(n));
            if started {
                let _ = child.kill();
                killed_while_writing += 1;
                break;
            }
        }
        let _ = child.wait();
        let after = std::fs::read(&grid).unwrap();
        let whole = after == before
            || (after.starts_with(&before)
                && after[before.len()..]
                    .iter()
                    .filter(|b| **b == b'\n')
                    .count()
                    == 1
                && after.ends_with(b"\n"));
        assert!(
            whole,
            "the grid went from {} to {} bytes",
            before.len(),
            after.len()
        );
        check_passes(&grid);
    }
    assert!(
        killed_while_writing > 0,
        "no writer was killed while writing"
    );
    // The next append removes what killed writers left behind, and only that.
    let last = measurement_copies(&subfolder(dir.path(), "x"), 1).remove(0);
    rb().args(append_args(&grid, &last)).assert().success();
    assert_eq!(temporary_files(dir.path()), Vec::<String>::new());
    check_passes(&grid);
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
        .replace(",float32,", ",float64,")
        .replace(",7,2,4,", ",7,+2,4,");
    lines.push("not,enough,fields".into());
    lines.push(lines[1].clone());
    std::fs::write(&grid, lines.join("\n") + "\n").unwrap();
    rb().args(["check", "--grid", grid.to_str().unwrap()])
        .assert()
        .code(DATA_ERROR)
        .stdout(contains("line 2, column `unit_cost_usd`: `1042.67` but 312800 cents / 3 results gives 1042.666667"))
        .stdout(contains("line 3, column `gpu_model`: must not be empty"))
        .stdout(contains("line 3, column `dtype`"))
        .stdout(contains("line 3, column `lots`: `+2` is not a positive integer"))
        .stdout(contains("line 4, column `(row)`: 3 fields, expected 26"))
        .stdout(contains("line 5, column `measurement_sha256`: the same measurement is already on line 2"));
    // A broken grid is never appended to, and the refusal says the grid is broken, not that the
    // measurement is a duplicate.
    let extra = measurement_copies(&subfolder(dir.path(), "y"), 1).remove(0);
    let broken = std::fs::read(&grid).unwrap();
    rb().args(append_args(&grid, &extra))
        .assert()
        .code(DATA_ERROR)
        .stderr(contains(format!("{} is broken", grid.display())))
        .stderr(contains("line 4, column `(row)`: 3 fields, expected 26"))
        .stderr(contains("already has a row").not());
    assert_eq!(std::fs::read(&grid).unwrap(), broken);
}

#[test]
fn check_json_reports_rows_and_problems() {
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let m = measurement_copies(dir.path(), 1).remove(0);
    rb().args(append_args(&grid, &m)).assert().success();
    let out = rb()
        .args(["check", "--json", "--grid", grid.to_str().unwrap()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        report,
        serde_json::json!({"file": grid.display().to_string(), "rows": 1, "problems": []})
    );
    let text = std::fs::read_to_string(&grid).unwrap();
    std::fs::write(&grid, text.replace(",cuda:0,", ",cuda,")).unwrap();
    let out = rb()
        .args(["check", "--json", "--grid", grid.to_str().unwrap()])
        .assert()
        .code(DATA_ERROR)
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        report["problems"],
        serde_json::json!([{"line": 2, "column": "device", "message": "`cuda` is not cuda:N"}])
    );
    assert_eq!(report["rows"], 1);
}
