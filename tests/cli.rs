//! Command-line tests of `mesure_memoire` and `calcul_forfaits`: the seed's command lines, JSON
//! read back, every refusal with its documented exit code, and files never overwritten.

mod common;

use assert_cmd::Command;
use common::{
    calcul_forfaits as cf, json_of, mesure_memoire as mm, DATA_ERROR, FAILURE, OUTPUT_EXISTS,
    UNAVAILABLE, USAGE,
};
use predicates::prelude::*;
use predicates::str::contains;
use serde_json::Value;
use std::path::Path;

#[test]
fn clap_definitions_are_consistent() {
    use clap::CommandFactory;
    use iteragpu_lab::cli;
    cli::mesure_memoire::Args::command().debug_assert();
    cli::calcul_forfaits::Args::command().debug_assert();
    cli::resultats_bruts::Args::command().debug_assert();
    cli::paquet_lab::Args::command().debug_assert();
}

#[test]
fn seed_estimate_prints_bytes_gib_and_gb() {
    mm().args([
        "estimate",
        "--parameters",
        "7000000000",
        "--bits",
        "16",
        "--reserve-gib",
        "4",
    ])
    .assert()
    .success()
    .stdout(contains("14000000000 bytes = 13.04 GiB = 14.00 GB"))
    .stdout(contains("reserve (hypothesis)"))
    .stdout(contains("18294967296 bytes = 17.04 GiB = 18.29 GB"))
    .stdout(contains("KV cache"))
    .stdout(contains("does not predict"));
}

#[test]
fn estimate_json_parses_back() {
    let v = json_of(mm().args([
        "estimate",
        "--parameters",
        "7000000000",
        "--bits",
        "16",
        "--reserve-gib",
        "4",
        "--json",
    ]));
    assert_eq!(v["weights"]["bytes"], 14_000_000_000u64);
    assert_eq!(v["weights"]["gib"], "13.038516");
    assert_eq!(v["weights"]["gb"], "14.000000");
    assert_eq!(v["reserve"]["bytes"], 4u64 << 30);
    assert_eq!(v["reserve_gib_hypothesis"], "4");
    assert_eq!(v["total"]["bytes"], 18_294_967_296u64);
    assert_eq!(v["not_included"].as_array().unwrap().len(), 6);
}

#[test]
fn estimate_refuses_bad_input_naming_the_flag() {
    let cases = [
        ("--parameters 0 --bits 16", "--parameters"),
        ("--parameters -5 --bits 16", "--parameters"),
        ("--parameters 1.5 --bits 16", "--parameters"),
        ("--parameters 7e9 --bits 16", "--parameters"),
        (
            "--parameters 99999999999999999999 --bits 16",
            "--parameters",
        ),
        (
            "--parameters 18446744073709551615 --bits 16",
            "--parameters",
        ),
        ("--parameters 10 --bits 0", "--bits"),
        ("--parameters 10 --bits 65", "--bits"),
        ("--parameters 10 --bits x", "--bits"),
        ("--parameters 10 --bits 8 --reserve-gib -1", "--reserve-gib"),
        (
            "--parameters 10 --bits 8 --reserve-gib 4GiB",
            "--reserve-gib",
        ),
        (
            "--parameters 10 --bits 8 --reserve-gib 99999999999999999999",
            "--reserve-gib",
        ),
    ];
    for (args, flag) in cases {
        mm().arg("estimate")
            .args(args.split_whitespace())
            .assert()
            .code(USAGE)
            .stderr(contains(flag))
            .stderr(contains("panicked").not());
    }
}

#[test]
fn seed_package_quote_two_b200_lots() {
    let csv =
        iteragpu_lab::catalog::Catalog::parse(iteragpu_lab::catalog::BUILTIN_CSV, "x").unwrap();
    let lot = csv.offer("b200", 7).unwrap().lot_price_usd_cents.0;
    cf().args(["--gpu", "b200", "--days", "7", "--lots", "2"])
        .assert()
        .success()
        .stdout(contains("data/tarifs-forfaits.csv (sha256 "))
        .stdout(contains("ILLUSTRATIVE"))
        .stdout(contains("2 × 2 GPU(s) per lot = 4 GPU(s)"))
        .stdout(contains(format!(
            "USD {}.{:02} = 2 ×",
            lot * 2 / 100,
            lot * 2 % 100
        )))
        .stdout(contains("unit cost         not computed"));
}

#[test]
fn quote_json_has_null_unit_cost_without_accepted_results() {
    let v = json_of(cf().args(["--gpu", "b200", "--days", "7", "--lots", "2", "--json"]));
    assert!(v["unit_cost"].is_null());
    assert!(v["accepted_results"].is_null());
    assert_eq!(v["total_gpus"], 4);
    assert_eq!(v["catalog"]["illustrative"], true);
    assert_eq!(v["catalog"]["sha256"].as_str().unwrap().len(), 64);
    let total = v["total_usd_cents"].as_u64().unwrap();
    assert_eq!(total, 2 * v["lot_price_usd_cents"].as_u64().unwrap());
}

#[test]
fn quote_unit_cost_is_exact_with_its_rule() {
    let v = json_of(cf().args([
        "--gpu",
        "b200",
        "--days",
        "7",
        "--lots",
        "2",
        "--accepted-results",
        "3",
        "--json",
    ]));
    let total = v["total_usd_cents"].as_u64().unwrap();
    let u = &v["unit_cost"];
    assert_eq!(u["numerator_cents"], total);
    assert_eq!(u["denominator"], 3);
    assert!(u["rounding"]
        .as_str()
        .unwrap()
        .contains("half away from zero"));
    let usd: f64 = u["usd"].as_str().unwrap().parse().unwrap();
    assert!((usd - total as f64 / 300.0).abs() < 1e-6);
}

#[test]
fn quote_refuses_bad_input_naming_the_flag() {
    let cases = [
        ("--gpu b200 --days 7 --lots 0", "--lots"),
        ("--gpu b200 --days 7 --lots -2", "--lots"),
        ("--gpu b200 --days 7 --lots 1.5", "--lots"),
        ("--gpu b200 --days 5 --lots 1", "--days"),
        (
            "--gpu b200 --days 7 --lots 1 --accepted-results 0",
            "--accepted-results",
        ),
        (
            "--gpu b200 --days 7 --lots 1 --accepted-results -3",
            "--accepted-results",
        ),
        (
            "--gpu b200 --days 7 --lots 1 --accepted-results 2.5",
            "--accepted-results",
        ),
        ("--gpu tpu-v9 --days 7 --lots 1", "models: rtx4090"),
        (
            "--gpu b200 --days 7 --lots 18446744073709551615",
            "overflows",
        ),
        ("--gpu b200 --days 7", "--lots"),
    ];
    for (args, needle) in cases {
        cf().args(args.split_whitespace())
            .assert()
            .code(USAGE)
            .stderr(contains(needle));
    }
}

#[test]
fn catalog_lists_and_loads_from_a_path() {
    cf().args(["--list"]).assert().success().stdout(
        contains("b200")
            .and(contains("NVIDIA H200"))
            .and(contains("ILLUSTRATIVE")),
    );
    let v = json_of(cf().args(["--list", "--json"]));
    assert_eq!(v["rows"].as_array().unwrap().len(), 45);
    let v = json_of(cf().args([
        "--catalog",
        "tests/fixtures/catalog-published.csv",
        "--gpu",
        "h200",
        "--days",
        "30",
        "--lots",
        "1",
        "--json",
    ]));
    assert_eq!(v["catalog"]["illustrative"], false);
    assert_eq!(v["catalog"]["file"], "tests/fixtures/catalog-published.csv");
}

#[test]
fn broken_catalogs_are_refused_with_file_line_and_column() {
    let cases = [
        (
            "catalog-duplicate.csv",
            "line 47, column `duration_days`: duplicate row for (rtx5090, 3 days), first on line 5",
        ),
        (
            "catalog-missing-duration.csv",
            "model `l4` lacks duration(s) 30 days",
        ),
        (
            "catalog-price-zero.csv",
            "line 3, column `lot_price_usd_cents`: `0` is not a positive integer",
        ),
        (
            "catalog-price-not-cents.csv",
            "line 3, column `lot_price_usd_cents`: `1234.50` is not a positive integer",
        ),
        (
            "catalog-unknown-layout.csv",
            "line 1, column `(header)`: expected columns",
        ),
    ];
    for (file, needle) in cases {
        let path = format!("tests/fixtures/{file}");
        cf().args([
            "--catalog",
            &path,
            "--gpu",
            "b200",
            "--days",
            "7",
            "--lots",
            "1",
        ])
        .assert()
        .code(DATA_ERROR)
        .stderr(contains(path.as_str()))
        .stderr(contains(needle));
    }
    cf().args(["--catalog", "tests/fixtures/absent.csv", "--list"])
        .assert()
        .code(FAILURE)
        .stderr(contains("tests/fixtures/absent.csv"));
}

#[test]
fn environment_without_a_gpu_is_a_valid_report() {
    let v = json_of(mm().args(["environment", "--device", "cuda:0", "--json"]));
    assert!(v["tool"].as_str().unwrap().starts_with("iteragpu-lab"));
    assert!(v["rust_version"].as_str().unwrap().starts_with("rustc"));
    if v["device"].is_null() {
        assert!(
            v["unavailable"].is_string(),
            "a report without a GPU says why"
        );
        assert_eq!(v["cuda_available"], false);
    }
    let text = serde_json::to_string(&v).unwrap();
    for private in ["HOME", "USER", "PATH"] {
        if let Ok(value) = std::env::var(private) {
            assert!(
                value.len() < 4 || !text.contains(&value),
                "{private} leaked into the report"
            );
        }
    }
}

fn measure_args(output: &Path) -> Vec<String> {
    [
        "measure",
        "--device",
        "cuda:0",
        "--batch",
        "1",
        "--context",
        "16",
        "--width",
        "64",
        "--dtype",
        "float32",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--output",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([output.display().to_string()])
    .collect()
}

fn has_gpu() -> bool {
    let v = json_of(mm().args(["environment", "--json"]));
    !v["device"].is_null()
}

#[test]
fn measure_without_a_gpu_exits_2_and_writes_nothing() {
    if has_gpu() {
        eprintln!("skipped: a GPU is visible here; tests/gpu.rs measures for real");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mesures.json");
    mm().args(measure_args(&out))
        .assert()
        .code(UNAVAILABLE)
        .stderr(contains("nothing was measured, no file written"));
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no temporary file left"
    );
}

#[test]
fn measure_refuses_an_existing_output_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mesures.json");
    std::fs::write(&out, "previous result").unwrap();
    mm().args(measure_args(&out))
        .assert()
        .code(OUTPUT_EXISTS)
        .stderr(contains("already exists"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous result");
}

#[test]
fn measure_validates_every_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.json").display().to_string();
    let base = |flag: &str, value: &str| {
        let mut a: Vec<String> = measure_args(Path::new(&out));
        let i = a.iter().position(|x| x == flag).unwrap();
        a[i + 1] = value.into();
        a
    };
    let cases = [
        ("--batch", "0"),
        ("--context", "-4"),
        ("--width", "1.5"),
        ("--dtype", "float64"),
        ("--device", "cpu"),
        ("--device", "cuda:x"),
        ("--repeats", "0"),
        ("--warmup", "-1"),
    ];
    for (flag, value) in cases {
        mm().args(base(flag, value))
            .assert()
            .code(USAGE)
            .stderr(contains(flag));
    }
    mm().args(base("--width", "4611686018427387904"))
        .assert()
        .code(USAGE)
        .stderr(contains("overflow"));
    mm().args(base("--output", "/nonexistent-igl-folder/m.json"))
        .assert()
        .code(USAGE)
        .stderr(contains("/nonexistent-igl-folder/m.json"));
    assert!(!Path::new(&out).exists());
}

/// The front program explains a companion that the system loader refuses. The loader's refusal
/// is stood in for by a companion that exits 127, as `ld.so` does; the real refusal is shown on
/// the GPU machine by scripts/gpu/proof.py (LD_LIBRARY_PATH unset).
#[test]
fn an_unloadable_libtorch_is_exit_2_for_measure_and_a_report_for_environment() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let front = common::copy_program("mesure_memoire", dir.path());
    let engine = dir.path().join("mesure_memoire_torch");
    std::fs::write(
        &engine,
        "#!/bin/sh\necho 'mesure_memoire_torch: error while loading shared libraries: libtorch_cuda.so' >&2\nexit 127\n",
    )
    .unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("m.json");
    Command::new(&front)
        .args(measure_args(&out))
        .assert()
        .code(UNAVAILABLE)
        .stderr(contains("libtorch could not be loaded"));
    assert!(!out.exists());
    let out = Command::new(&front)
        .args(["environment", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["libtorch"]["built_with"], true);
    assert!(v["libtorch"]["load_error"]
        .as_str()
        .unwrap()
        .contains("system loader"));
}

/// Without its companion the front program cannot reach a GPU: exit 2, nothing written, and
/// `environment` still reports why.
#[test]
fn without_a_companion_measure_exits_2_and_environment_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let front = common::copy_program("mesure_memoire", dir.path());
    let out = dir.path().join("m.json");
    Command::new(&front)
        .args(measure_args(&out))
        .assert()
        .code(UNAVAILABLE)
        .stderr(contains("mesure_memoire_torch"))
        .stderr(contains("nothing was measured, no file written"));
    assert!(!out.exists());
    let v = json_of(Command::new(&front).args(["environment", "--json"]));
    assert_eq!(v["libtorch"]["built_with"], false);
    assert!(v["unavailable"]
        .as_str()
        .unwrap()
        .contains("does not link libtorch"));
}

#[test]
fn plot_draws_a_recorded_measurement_without_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("phases.svg");
    let recorded = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/exemple-mesure-h200-petit-essai.json"
    );
    mm().args(["plot", "--measurement", recorded, "--output"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("NVIDIA H200"));
    mm().args(["plot", "--measurement", recorded, "--output"])
        .arg(&svg)
        .assert()
        .code(OUTPUT_EXISTS);
    mm().args(["plot", "--measurement", "Cargo.toml", "--output"])
        .arg(dir.path().join("x.svg"))
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("not a measurement file"));
}
