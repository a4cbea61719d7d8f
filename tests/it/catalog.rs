//! The catalog's rules through `calcul_forfaits`, one by one: each fixture in tests/fixtures/ is
//! `catalog-one-model.csv` (one valid model over the three durations) with one rule broken, and
//! must be refused with exit 65 naming the file, the line and the column. The duplicate row, the
//! missing duration, the zero or fractional price and an unknown layout are in tests/cli.rs.

use crate::common;

use common::{calcul_forfaits as cf, json_of, DATA_ERROR, ROOT};
use predicates::str::contains;
use std::path::Path;

/// `calcul_forfaits --catalog FILE --list` is refused with exit 65 and `message`.
fn refused(file: &str, message: &str) {
    cf().args(["--catalog", file, "--list"])
        .assert()
        .code(DATA_ERROR)
        .stderr(contains(format!("calcul_forfaits: error: {file}")))
        .stderr(contains(message))
        .stdout("");
}

#[test]
fn the_base_fixture_is_valid() {
    let v = json_of(cf().args([
        "--catalog",
        "tests/fixtures/catalog-one-model.csv",
        "--gpu",
        "h200",
        "--days",
        "30",
        "--lots",
        "2",
        "--json",
    ]));
    assert_eq!(v["total_usd_cents"], 391_600);
    assert_eq!(v["catalog"]["illustrative"], false);
}

#[test]
fn a_model_keeps_its_name_lot_size_and_memory_across_durations() {
    let cases = [
        (
            "catalog-name-differs.csv",
            "line 3, column `display_name`: differs from line 2 for model `h200`",
        ),
        (
            "catalog-lot-size-differs.csv",
            "line 4, column `gpus_per_lot`: differs from line 2 for model `h200`",
        ),
        (
            "catalog-memory-differs.csv",
            "line 3, column `memory_per_gpu_gib`: differs from line 2 for model `h200`",
        ),
    ];
    for (file, message) in cases {
        refused(&format!("tests/fixtures/{file}"), message);
    }
}

#[test]
fn model_keys_are_lowercase_letters_digits_and_dashes() {
    refused(
        "tests/fixtures/catalog-key-characters.csv",
        "line 2, column `model`: `H200` must use lowercase letters, digits and '-' only",
    );
    let base =
        std::fs::read_to_string(Path::new(ROOT).join("tests/fixtures/catalog-one-model.csv"))
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for key in [
        "h200_sxm",
        "h200/x",
        "h2.00",
        "h200é",
        "h200;",
        "h\u{1b}[31m",
    ] {
        let file = dir.path().join("keys.csv");
        let _ = std::fs::remove_file(&file);
        std::fs::write(&file, base.replace("\nh200,", &format!("\n{key},"))).unwrap();
        refused(&file.display().to_string(), "line 2, column `model`: ");
    }
    // Digits and dashes are fine.
    let file = dir.path().join("good.csv");
    std::fs::write(&file, base.replace("\nh200,", "\nh200-sxm-2,")).unwrap();
    cf().arg("--catalog")
        .arg(&file)
        .args(["--gpu", "h200-sxm-2", "--days", "3", "--lots", "1"])
        .assert()
        .success();
}

#[test]
fn price_status_is_illustrative_or_published() {
    refused(
        "tests/fixtures/catalog-price-status.csv",
        "line 3, column `price_status`: `estimated` must be `illustrative` or `published`",
    );
}

#[test]
fn durations_are_3_7_or_30_days_only() {
    refused(
        "tests/fixtures/catalog-duration-14.csv",
        "line 4, column `duration_days`: `14` is not one of 3, 7, 30",
    );
    let base =
        std::fs::read_to_string(Path::new(ROOT).join("tests/fixtures/catalog-one-model.csv"))
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for days in ["1", "0", "31", "7.5", "-7", "seven", ""] {
        let file = dir.path().join(format!("days-{days}.csv"));
        std::fs::write(&file, base.replace(",7,51100,", &format!(",{days},51100,"))).unwrap();
        let why = if days.is_empty() {
            "empty value".to_string()
        } else {
            format!("`{days}` is not one of 3, 7, 30")
        };
        refused(
            &file.display().to_string(),
            &format!("line 3, column `duration_days`: {why}"),
        );
    }
}

#[test]
fn a_lot_holds_at_least_one_gpu() {
    refused(
        "tests/fixtures/catalog-zero-gpus.csv",
        "line 2, column `gpus_per_lot`: `0` is not a positive integer",
    );
}

#[test]
fn an_empty_catalog_is_refused() {
    refused(
        "tests/fixtures/catalog-header-only.csv",
        "catalog-header-only.csv: no rows",
    );
    refused(
        "tests/fixtures/catalog-zero-bytes.csv",
        "line 1, column `(header)`: expected columns",
    );
}

#[test]
fn extra_fields_and_columns_are_refused() {
    refused(
        "tests/fixtures/catalog-extra-field.csv",
        "line 3, column `(row)`: ",
    );
    refused(
        "tests/fixtures/catalog-extra-column.csv",
        "line 1, column `(header)`: expected columns model,display_name,gpus_per_lot,\
         memory_per_gpu_gib,duration_days,lot_price_usd_cents,snapshot_date,price_status in that \
         order; missing: [], unknown: [region]",
    );
}

#[test]
fn columns_in_another_order_are_refused() {
    refused(
        "tests/fixtures/catalog-columns-swapped.csv",
        "line 1, column `(header)`: expected columns model,display_name,gpus_per_lot,\
         memory_per_gpu_gib,duration_days,lot_price_usd_cents,snapshot_date,price_status in that \
         order; missing: [], unknown: []",
    );
}

/// Without `--catalog` and without `data/` in the current folder, the copy built into the program
/// is read, named as such, with the SHA-256 of the shipped file; with `data/tarifs-forfaits.csv`
/// present, that file is read instead.
#[test]
fn the_built_in_copy_is_used_when_data_is_absent() {
    let shipped = std::fs::read(Path::new(ROOT).join("data/tarifs-forfaits.csv")).unwrap();
    let empty = tempfile::tempdir().unwrap();
    let run = |dir: &Path, args: &[&str]| {
        let mut c = assert_cmd::Command::cargo_bin("calcul_forfaits").unwrap();
        c.current_dir(dir).args(args);
        c
    };
    let v = json_of(&mut run(
        empty.path(),
        &["--gpu", "b200", "--days", "7", "--lots", "2", "--json"],
    ));
    assert_eq!(
        v["catalog"]["file"],
        "built-in copy of data/tarifs-forfaits.csv"
    );
    assert_eq!(v["catalog"]["sha256"], iteragpu_lab::sha256_hex(&shipped));
    assert_eq!(v["catalog"]["illustrative"], true);
    assert_eq!(v["total_usd_cents"], 312_800);
    run(empty.path(), &["--list"])
        .assert()
        .success()
        .stdout(contains(
            "Catalog: built-in copy of data/tarifs-forfaits.csv (sha256 ",
        ));
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "nothing written"
    );

    // A catalog at data/tarifs-forfaits.csv in the current folder wins over the built-in copy.
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir(project.path().join("data")).unwrap();
    std::fs::copy(
        Path::new(ROOT).join("tests/fixtures/catalog-one-model.csv"),
        project.path().join("data/tarifs-forfaits.csv"),
    )
    .unwrap();
    let v = json_of(&mut run(
        project.path(),
        &["--gpu", "h200", "--days", "7", "--lots", "1", "--json"],
    ));
    assert_eq!(v["catalog"]["file"], "data/tarifs-forfaits.csv");
    assert_eq!(v["catalog"]["illustrative"], false);
    run(
        project.path(),
        &["--gpu", "b200", "--days", "7", "--lots", "1"],
    )
    .assert()
    .code(common::USAGE)
    .stderr(contains("unknown model `b200`"));
}
