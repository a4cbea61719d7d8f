//! Hostile inputs through the programs: files that are not regular or too large (catalog,
//! measurement, grid), numbers at the edges of their range, catalogs with lax numbers, unclosed
//! quotes and terminal escapes, OS errors said once, and a missing folder for `append`.

use crate::common;

use common::grid::{append_args, blank_grid};
use common::{
    calcul_forfaits as cf, json_of, mesure_memoire as mm, mkfifo, resultats_bruts as rb, with_flag,
    DATA_ERROR, FAILURE, PATIENCE, RECORDED, ROOT, SEED_SMALL, USAGE,
};
use iteragpu_lab::files::Input;
use predicates::prelude::*;
use predicates::str::contains;
use std::path::{Path, PathBuf};

/// The ways to hand a program an input file of each kind, where a program reads that kind from a
/// path given on its command line (`None`: only the library reads it, `files::tests` covers it).
/// The command reading `path` as `kind`, and the path its messages name.
fn read_as(kind: Input, path: &Path, scratch: &Path) -> Option<(assert_cmd::Command, String)> {
    let mut shown = path.display().to_string();
    let given = shown.clone();
    let path = given.as_str();
    let mut cmd = match kind {
        Input::Catalog => {
            let mut c = cf();
            c.args(["--list", "--catalog", path]);
            c
        }
        Input::Measurement => {
            let mut c = mm();
            c.args(["plot", "--measurement", path, "--output"])
                .arg(scratch.join("phases.svg"));
            c
        }
        Input::Grid => {
            let mut c = rb();
            c.args(["check", "--grid", path]);
            c
        }
        Input::Budget => {
            let mut c = cf();
            c.args(["--fit", path]);
            c
        }
        Input::Presets => {
            let mut c = mm();
            c.args(["budget", "--list-models", "--models", path]);
            c
        }
        Input::Sweep => {
            // A sweep is read from its folder: its summary is the file.
            let folder = scratch.join(format!("sweep-of-{}", path.replace('/', "_")));
            std::fs::create_dir_all(&folder).unwrap();
            let summary = folder.join("sweep.json");
            let _ = std::fs::remove_file(&summary);
            std::os::unix::fs::symlink(path, &summary).unwrap();
            shown = summary.display().to_string();
            let mut c = mm();
            c.args(["plot", "--sweep"])
                .arg(&folder)
                .arg("--output")
                .arg(scratch.join("sweep.svg"));
            c
        }
        Input::ModelConfig => {
            let mut c = mm();
            c.args([
                "budget",
                "--config",
                path,
                "--mode",
                "inference",
                "--context",
                "8",
            ]);
            c
        }
        Input::Lesson | Input::CompanionResult | Input::SafetensorsHeader | Input::ProofReport => {
            return None
        }
    };
    cmd.timeout(PATIENCE);
    Some((cmd, shown))
}

fn stderr_of(cmd: &mut assert_cmd::Command, code: i32) -> Vec<u8> {
    cmd.assert().code(code).get_output().stderr.clone()
}

#[test]
fn dev_zero_as_any_input_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for &kind in Input::ALL {
        let Some((mut cmd, shown)) = read_as(kind, Path::new("/dev/zero"), dir.path()) else {
            continue;
        };
        cmd.assert().code(DATA_ERROR).stderr(contains(format!(
            "cannot read {kind} {shown}: it is a device, not a regular file"
        )));
    }
    let grid = blank_grid(dir.path());
    rb().args(append_args(&grid, Path::new("/dev/zero")))
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("cannot read measurement /dev/zero"));
}

#[test]
fn named_pipes_as_inputs_do_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    mkfifo(&fifo);
    for &kind in Input::ALL {
        let Some((mut cmd, shown)) = read_as(kind, &fifo, dir.path()) else {
            continue;
        };
        cmd.assert()
            .code(DATA_ERROR)
            .stderr(contains("it is a named pipe, not a regular file"))
            .stderr(contains(shown));
    }
}

#[test]
fn oversized_inputs_are_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    for &kind in Input::ALL {
        let mib = kind.limit() >> 20;
        let big = dir
            .path()
            .join(format!("big-{}", kind.name().replace(' ', "-")));
        // Sparse: refused from its size, never read.
        std::fs::File::create(&big)
            .unwrap()
            .set_len((mib << 20) + 1)
            .unwrap();
        let Some((mut cmd, shown)) = read_as(kind, &big, dir.path()) else {
            continue;
        };
        cmd.assert()
            .code(DATA_ERROR)
            .stderr(contains(shown))
            .stderr(contains(format!(
                "larger than {mib} MiB ({} bytes), the limit for a {kind}",
                mib << 20
            )));
    }
}

#[test]
fn warmup_and_repeats_state_the_documented_bound() {
    let predict = |flag: &str, value: &str| {
        let args: Vec<String> = ["predict"]
            .into_iter()
            .chain(SEED_SMALL)
            .map(String::from)
            .collect();
        mm().args(with_flag(args, flag, Some(value))).assert()
    };
    for (flag, value) in [
        ("--warmup", "10001"),
        ("--warmup", "4294967296"),
        ("--repeats", "10001"),
        ("--repeats", "99999999999999999999"),
    ] {
        predict(flag, value)
            .code(USAGE)
            .stderr(contains(flag))
            .stderr(contains("at most 10000"))
            .stderr(contains("4294967295").not())
            .stderr(contains("18446744073709551615").not());
    }
    predict("--warmup", "10000").success();
    predict("--repeats", "10000").success();
}

#[test]
fn a_tiny_positive_reserve_is_at_least_one_byte() {
    let tiny = "0.00000000000000000000000000001";
    let v = json_of(mm().args([
        "estimate",
        "--parameters",
        "1",
        "--bits",
        "8",
        "--reserve-gib",
        tiny,
        "--json",
    ]));
    assert_eq!(v["reserve"]["bytes"], 1);
    assert_eq!(v["total"]["bytes"], 2);
    assert_eq!(v["reserve_gib_hypothesis"], tiny);
}

#[test]
fn reserves_beyond_28_digits_are_refused_not_rounded() {
    for value in [
        "1.00000000000000000000000000001",
        "0.12345678901234567890123456789",
        "12345678901234567890123456789",
    ] {
        mm().args([
            "estimate",
            "--parameters",
            "1",
            "--bits",
            "8",
            "--reserve-gib",
            value,
        ])
        .assert()
        .code(USAGE)
        .stderr(contains("--reserve-gib"))
        .stderr(contains("at most 28"))
        .stderr(contains(value));
    }
}

#[test]
fn out_of_range_values_state_the_flags_range() {
    mm().args([
        "estimate",
        "--parameters",
        "1",
        "--bits",
        "99999999999999999999",
    ])
    .assert()
    .code(USAGE)
    .stderr(contains("--bits"))
    .stderr(contains("between 1 and 64"))
    .stderr(contains("18446744073709551615").not());
    cf().args(["--gpu", "b200", "--days", "99999999999", "--lots", "1"])
        .assert()
        .code(USAGE)
        .stderr(contains("--days"))
        .stderr(contains("3, 7 or 30"))
        .stderr(contains("4294967295").not());
    let dir = tempfile::tempdir().unwrap();
    let grid = blank_grid(dir.path());
    let args = append_args(&grid, &Path::new(ROOT).join(RECORDED));
    rb().args(with_flag(args, "--days", Some("4294967296")))
        .assert()
        .code(USAGE)
        .stderr(contains("3, 7 or 30"))
        .stderr(contains("4294967295").not());
}

#[test]
fn an_os_error_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent");
    let grid = blank_grid(dir.path());
    let mut append = rb();
    append.args(append_args(&grid, &absent));
    for mut cmd in [
        read_as(Input::Catalog, &absent, dir.path()).unwrap().0,
        read_as(Input::Measurement, &absent, dir.path()).unwrap().0,
        read_as(Input::Grid, &absent, dir.path()).unwrap().0,
        append,
    ] {
        let err = String::from_utf8(stderr_of(&mut cmd, FAILURE)).unwrap();
        assert_eq!(err.matches("os error 2").count(), 1, "{err}");
        assert!(err.contains(&absent.display().to_string()), "{err}");
    }
}

#[test]
fn append_into_a_missing_folder_is_a_usage_error_naming_the_folder() {
    let grid = Path::new("/nonexistent-igl-grid-folder/resultats-bruts.csv");
    rb().args(append_args(grid, &Path::new(ROOT).join(RECORDED)))
        .assert()
        .code(USAGE)
        .stderr(contains("the folder /nonexistent-igl-grid-folder "))
        .stderr(contains("does not exist"))
        .stderr(contains(".lock").not());
}

/// The shipped catalog with the value of `column` on `line` (2: the first row) replaced.
fn catalog_with(dir: &Path, line: usize, column: usize, value: &str) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(ROOT).join("data/tarifs-forfaits.csv")).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut values: Vec<&str> = lines[line - 1].split(',').collect();
    values[column] = value;
    lines[line - 1] = values.join(",");
    let path = dir.join(format!("catalog-{line}-{column}.csv"));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn lax_catalog_numbers_are_refused_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    for (line, column, value, name) in [
        (3, 5, "+6400", "lot_price_usd_cents"),
        (3, 5, " 6400 ", "lot_price_usd_cents"),
        (3, 5, "006400", "lot_price_usd_cents"),
        (3, 5, "6.4e3", "lot_price_usd_cents"),
        (2, 3, "2.399e1", "memory_per_gpu_gib"),
        (2, 3, " 23.99", "memory_per_gpu_gib"),
        (2, 3, "+23.99", "memory_per_gpu_gib"),
        (2, 3, "023.99", "memory_per_gpu_gib"),
        (4, 2, "+1", "gpus_per_lot"),
        (4, 2, "01", "gpus_per_lot"),
        (3, 4, "07", "duration_days"),
        (3, 4, " 7", "duration_days"),
        (2, 7, " illustrative", "price_status"),
    ] {
        let path = catalog_with(dir.path(), line, column, value);
        read_as(Input::Catalog, &path, dir.path())
            .unwrap()
            .0
            .assert()
            .code(DATA_ERROR)
            .stderr(contains(format!(
                "{}, line {line}, column `{name}`: `{value}`",
                path.display()
            )));
    }
}

#[test]
fn an_unclosed_quote_is_reported_on_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = catalog_with(dir.path(), 5, 1, "\"NVIDIA GeForce RTX 5090");
    let crlf = dir.path().join("crlf.csv");
    std::fs::write(
        &crlf,
        std::fs::read_to_string(&path)
            .unwrap()
            .replace('\n', "\r\n"),
    )
    .unwrap();
    for p in [&path, &crlf] {
        read_as(Input::Catalog, p, dir.path())
            .unwrap()
            .0
            .assert()
            .code(DATA_ERROR)
            .stderr(contains(format!(
                "{}, line 5, column `display_name`: a quote opens on this line",
                p.display()
            )));
    }
}

#[test]
fn terminal_escapes_in_a_catalog_never_reach_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    for (column, value) in [
        (1, "NVIDIA \u{1b}[2J\u{1b}[31mH200"),
        (1, "NVIDIA\0H200"),
        (1, "NVIDIA \u{202e}002H"),
        (7, "illustrative\u{1b}]0;pwned\u{7}"),
    ] {
        let path = catalog_with(dir.path(), 2, column, value);
        let err = stderr_of(
            &mut read_as(Input::Catalog, &path, dir.path()).unwrap().0,
            DATA_ERROR,
        );
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("contains the control character"), "{err}");
        assert!(
            !err.contains(['\u{1b}', '\0', '\u{7}', '\u{202e}']),
            "{err:?}"
        );
    }
}

#[test]
fn terminal_escapes_in_a_measurement_are_escaped_in_messages() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(Path::new(ROOT).join(RECORDED)).unwrap();
    let hostile = text.replacen(
        "\"iteragpu-lab/measurement/v1\"",
        "\"\\u001b[2J\\u001b]0;pwned\\u0007\"",
        1,
    );
    assert_ne!(hostile, text);
    let path = dir.path().join("m.json");
    std::fs::write(&path, hostile).unwrap();
    let err = stderr_of(
        &mut read_as(Input::Measurement, &path, dir.path()).unwrap().0,
        DATA_ERROR,
    );
    let err = String::from_utf8(err).unwrap();
    assert!(err.contains("schema `\\u{1b}[2J"), "{err}");
    assert!(!err.contains(['\u{1b}', '\u{7}']), "{err:?}");
}
