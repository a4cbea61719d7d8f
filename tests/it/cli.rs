//! Command-line tests of `mesure_memoire` and `calcul_forfaits`: the seed's command lines, JSON
//! read back, refusals with their documented exit codes (catalog rules: tests/catalog.rs), and
//! files never overwritten.

use crate::common;

use assert_cmd::Command;
use common::{
    calcul_forfaits as cf, engine_args, json_of, mesure_memoire as mm, stand_in_companion,
    with_flag, DATA_ERROR, FAILURE, OUTPUT_EXISTS, SEED_ESTIMATE, SEED_QUOTE, UNAVAILABLE, USAGE,
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
    mm().args(SEED_ESTIMATE)
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
    let v = json_of(mm().args(SEED_ESTIMATE).arg("--json"));
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

/// The b200 7-day lot of the shipped catalog (`data/tarifs-forfaits.csv`, line 45), written here
/// and not read through the library's parser: a parser that misread prices would fail these tests.
const B200_7_DAYS_LOT_CENTS: u64 = 156_400;

#[test]
fn seed_package_quote_two_b200_lots() {
    cf().args(SEED_QUOTE)
        .assert()
        .success()
        .stdout(contains("data/tarifs-forfaits.csv (sha256 "))
        .stdout(contains("ILLUSTRATIVE"))
        .stdout(contains("2 × 2 GPU(s) per lot = 4 GPU(s)"))
        .stdout(contains(
            "lot price         USD 1564.00 (includes the lot's 2 GPU(s))",
        ))
        .stdout(contains("total             USD 3128.00 = 2 × USD 1564.00"))
        .stdout(contains("unit cost         not computed"));
}

#[test]
fn quote_json_has_null_unit_cost_without_accepted_results() {
    let v = json_of(cf().args(SEED_QUOTE).arg("--json"));
    assert!(v["unit_cost"].is_null());
    assert!(v["accepted_results"].is_null());
    assert_eq!(v["total_gpus"], 4);
    assert_eq!(v["catalog"]["illustrative"], true);
    assert_eq!(v["catalog"]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(v["lot_price_usd_cents"], B200_7_DAYS_LOT_CENTS);
    assert_eq!(v["total_usd_cents"], 2 * B200_7_DAYS_LOT_CENTS);
}

/// Unit costs at the quote level: the exact quotient, its rounding half away from zero to 6
/// decimals (the halves below would go the other way when rounded half to even or truncated), and
/// `exact` saying which happened. Expected values are computed by hand from the lot prices.
#[test]
fn quote_unit_cost_rounds_half_away_from_zero_and_says_whether_it_is_exact() {
    // (model, days, lots, accepted results, total cents, USD per result, exact)
    let cases: [(&str, &str, &str, u64, u64, &str, bool); 7] = [
        // 3128 / 1000 = 3.128: nothing to round.
        ("b200", "7", "2", 1000, 312_800, "3.128000", true),
        ("b200", "7", "2", 2, 312_800, "1564.000000", true),
        // 3128 / 3 = 1042.666666…: rounded up.
        ("b200", "7", "2", 3, 312_800, "1042.666667", false),
        // 3128 / 23552 = 0.1328125 exactly: a half after an even digit (half to even: 0.132812).
        ("b200", "7", "2", 23_552, 312_800, "0.132813", false),
        // 3128 / 1024 = 3.0546875 exactly: a half after an odd digit (truncation: 3.054687).
        ("b200", "7", "2", 1024, 312_800, "3.054688", false),
        // 29 / 58 000 000 = 0.0000005 exactly: a positive cost never shows as zero at the half.
        ("rtx4090", "3", "1", 58_000_000, 2_900, "0.000001", false),
        // 29 / 58 000 001 is just below the half: rounded down.
        ("rtx4090", "3", "1", 58_000_001, 2_900, "0.000000", false),
    ];
    for (model, days, lots, n, total, usd, exact) in cases {
        let accepted = n.to_string();
        let args = [
            "--gpu",
            model,
            "--days",
            days,
            "--lots",
            lots,
            "--accepted-results",
            &accepted,
        ];
        let v = json_of(cf().args(args).arg("--json"));
        let u = &v["unit_cost"];
        let case = format!("{model} {days} days × {lots}, {n} results");
        assert_eq!(v["total_usd_cents"], total, "{case}");
        assert_eq!(v["accepted_results"], n, "{case}");
        assert_eq!(u["usd"], usd, "{case}");
        assert_eq!(u["exact"], exact, "{case}");
        assert_eq!(u["numerator_cents"], total, "{case}");
        assert_eq!(u["denominator"], n, "{case}");
        assert!(
            u["rounding"]
                .as_str()
                .unwrap()
                .contains("rounded half away from zero to 6 decimals"),
            "{case}"
        );
        let said = if exact { "exact" } else { "rounded" };
        cf().args(args).assert().success().stdout(contains(format!(
            "USD {usd} per accepted result (USD {}.{:02} / {n} results), {said}",
            total / 100,
            total % 100
        )));
    }
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

/// Private values handed to the report's process: short ones included, none of them a word that
/// any report holds (checked below, so that the check on them cannot pass vacuously).
const PRIVATE: [(&str, &str); 6] = [
    ("USER", "Qv"),
    ("LOGNAME", "Qvj"),
    ("HOSTNAME", "qvj-host"),
    ("HOME", "/home/Qvjz"),
    ("IGL_PRIVATE_TOKEN", "Zq8"),
    ("SSH_CONNECTION", "10.99.98.97 41234 10.99.98.96 22"),
];

/// Variables kept in the baseline run, so that both runs describe the same libtorch and GPU.
/// Their values are checked against both reports.
const KEPT: [&str; 2] = ["LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"];

/// The environment report in every form (JSON as written, its decoded strings, text), run with
/// `env` as the whole environment.
fn report_forms(env: &[(String, String)]) -> String {
    let run = |json: bool| {
        let mut c = mm();
        c.env_clear().envs(env.iter().cloned());
        c.args(["environment", "--device", "cuda:0"]);
        if json {
            c.arg("--json");
        }
        let out = c.assert().success().get_output().stdout.clone();
        String::from_utf8(out).expect("the report is UTF-8")
    };
    let json = run(true);
    let mut strings = Vec::new();
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
            Value::Object(o) => o.values().for_each(|x| collect(x, out)),
            other => out.push(other.to_string()),
        }
    }
    collect(&serde_json::from_str(&json).unwrap(), &mut strings);
    format!("{json}\n{}\n{}", strings.join("\n"), run(false))
}

/// The variables whose value (2 characters or more) appears in `report` and is not a word the
/// report holds without them: the `baseline` report, made without the environment, shows the
/// report's own words (the OS name, the tool's name and version, numbers of the device...). With
/// `volatile_numbers` (a GPU is described: its free memory differs between two runs), values made
/// only of digits and dots are left out, as they could match those figures by chance.
fn leaked(
    env: &[(String, String)],
    report: &str,
    baseline: &str,
    volatile_numbers: bool,
) -> Vec<String> {
    let number = |v: &str| v.chars().all(|c| c.is_ascii_digit() || c == '.');
    env.iter()
        .filter(|(_, value)| !(volatile_numbers && number(value)))
        .filter(|(_, value)| value.chars().count() >= 2 && report.contains(value.as_str()))
        .filter(|(name, value)| KEPT.contains(&name.as_str()) || !baseline.contains(value.as_str()))
        .map(|(name, _)| name.clone())
        .collect()
}

#[test]
fn environment_report_is_valid_and_collects_no_environment_value() {
    let v = json_of(mm().args(["environment", "--device", "cuda:0", "--json"]));
    assert!(v["tool"].as_str().unwrap().starts_with("iteragpu-lab"));
    assert!(v["rust_version"].as_str().unwrap().starts_with("rustc"));
    assert_eq!(v["requested_device"], "cuda:0");
    if v["device"].is_null() {
        assert!(
            v["unavailable"].is_string(),
            "a report without a GPU says why"
        );
        assert_eq!(v["cuda_available"], false);
    } else {
        // The GPU branch: a usable device is described in full.
        assert!(v["unavailable"].is_null(), "{v}");
        assert_eq!(v["cuda_available"], true);
        assert!(v["device_count"].as_u64().unwrap() >= 1);
        assert_eq!(v["device"]["index"], 0);
        assert!(!v["device"]["name"].as_str().unwrap().is_empty());
        assert!(v["device"]["total_memory"]["bytes"].as_u64().unwrap() > 0);
        assert!(v["libtorch"]["version"].is_string());
    }

    // The whole environment of this test, with the private values above in place.
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into(), v.to_string_lossy().into()))
        .filter(|(k, _)| !PRIVATE.iter().any(|(p, _)| p == k))
        .collect();
    env.extend(PRIVATE.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let kept: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| KEPT.contains(&k.as_str()))
        .cloned()
        .collect();
    let report = report_forms(&env);
    let baseline = report_forms(&kept);
    let gpu = !v["device"].is_null();

    // Not vacuous: the private values, 2 characters and up, are no word of any report, and the
    // check finds one as soon as it appears.
    for (name, value) in PRIVATE {
        assert!(
            !baseline.contains(value),
            "{name}'s test value is a word of the report"
        );
        let planted = format!("{report} {value}");
        assert!(
            leaked(&env, &planted, &baseline, gpu).contains(&name.to_string()),
            "the check misses {name}"
        );
    }
    assert_eq!(leaked(&env, &report, &baseline, gpu), Vec::<String>::new());
}

fn measure_args(output: &Path) -> Vec<String> {
    ["measure", "--device", "cuda:0"]
        .into_iter()
        .chain(common::SEED_SMALL)
        .chain(["--output"])
        .map(String::from)
        .chain([output.display().to_string()])
        .collect()
}

fn has_gpu() -> bool {
    let v = json_of(mm().args(["environment", "--json"]));
    !v["device"].is_null()
}

/// Says, past the test harness's capture, that a test took its GPU branch.
fn tell(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[test]
fn measure_without_a_gpu_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mesures.json");
    if has_gpu() {
        tell("measure_without_a_gpu_exits_2_and_writes_nothing: a GPU is visible, measuring for real");
        mm().args(measure_args(&out))
            .arg("--quiet")
            .assert()
            .success();
        let m = iteragpu_lab::measure::Measurement::load(&out).unwrap();
        assert_eq!(m.phases.len(), 6);
        return;
    }
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
    let base =
        |flag: &str, value: &str| with_flag(measure_args(Path::new(&out)), flag, Some(value));
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
    let dir = tempfile::tempdir().unwrap();
    let front = common::copy_program("mesure_memoire", dir.path());
    stand_in_companion(
        dir.path(),
        "#!/bin/sh\necho 'mesure_memoire_torch: error while loading shared libraries: libtorch_cuda.so' >&2\nexit 127\n",
    );
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

#[test]
fn plot_refuses_a_file_that_is_not_a_measurement_with_65_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let recorded = std::fs::read_to_string(Path::new(common::ROOT).join(common::RECORDED)).unwrap();
    let wrong_tag = recorded.replacen(
        "\"iteragpu-lab/measurement/v1\"",
        "\"iteragpu-lab/measurement/v2\"",
        1,
    );
    assert_ne!(wrong_tag, recorded);
    // Figures no GPU could have given.
    let edited = |edit: &dyn Fn(&mut Value)| {
        let mut v: Value = serde_json::from_str(&recorded).unwrap();
        edit(&mut v);
        v.to_string()
    };
    let no_phase = edited(&|v| v["phases"] = Value::Array(vec![]));
    let low_peak = edited(&|v| v["phases"][0]["peak_allocated_bytes"] = 0.into());
    let negative = edited(&|v| v["phases"][1]["host_wall_time_ms"] = (-1.0).into());
    let cases: [(&str, &[u8], &str); 8] = [
        (
            "text.json",
            b"phase,allocated\ncold_forward,1\n",
            "not a measurement file",
        ),
        (
            "binary.json",
            &[0x89, b'P', b'N', b'G', 0, 0xff, 0xfe],
            "not a measurement file",
        ),
        ("empty.json", b"", "not a measurement file"),
        (
            "truncated.json",
            &recorded.as_bytes()[..recorded.len() / 2],
            "not a measurement file",
        ),
        (
            "wrong-tag.json",
            wrong_tag.as_bytes(),
            "schema `iteragpu-lab/measurement/v2`, expected `iteragpu-lab/measurement/v1`",
        ),
        ("no-phase.json", no_phase.as_bytes(), "`phases`: none"),
        (
            "low-peak.json",
            low_peak.as_bytes(),
            "`phases[0]` (model_load): figures the caching allocator cannot give",
        ),
        (
            "negative-time.json",
            negative.as_bytes(),
            "`phases[1].host_wall_time_ms` = -1: not a duration",
        ),
    ];
    for (name, bytes, needle) in cases {
        let input = dir.path().join(name);
        std::fs::write(&input, bytes).unwrap();
        let svg = dir.path().join(format!("{name}.svg"));
        mm().args(["plot", "--measurement"])
            .arg(&input)
            .arg("--output")
            .arg(&svg)
            .assert()
            .code(DATA_ERROR)
            .stderr(contains(input.display().to_string()))
            .stderr(contains(needle));
        assert!(!svg.exists(), "{name}: no chart written");
    }
    // The same file with the right tag is drawn: the refusal above is the tag's.
    let right = dir.path().join("right.json");
    std::fs::write(&right, &recorded).unwrap();
    mm().args(["plot", "--measurement"])
        .arg(&right)
        .arg("--output")
        .arg(dir.path().join("right.svg"))
        .assert()
        .success();
}

/// `--plot` names a file that exists: refused before any GPU work (so also here, without a GPU),
/// the file untouched and no result written.
#[test]
fn measure_refuses_an_existing_plot_file_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mesures.json");
    let plot = dir.path().join("phases.svg");
    std::fs::write(&plot, "previous chart").unwrap();
    mm().args(measure_args(&out))
        .arg("--plot")
        .arg(&plot)
        .assert()
        .code(OUTPUT_EXISTS)
        .stderr(contains(plot.display().to_string()))
        .stderr(contains("already exists"))
        .stderr(contains("mesure_memoire_torch").not());
    assert_eq!(std::fs::read_to_string(&plot).unwrap(), "previous chart");
    assert!(!out.exists());
}

/// A device of `capacity` bytes under the phase protocol: the network's real sizes are allocated
/// in 2 MiB segments, and a request beyond the capacity fails as libtorch reports it.
struct SimulatedDevice {
    sizes: iteragpu_lab::measure::SyntheticModel,
    capacity: u64,
    live: u64,
    reserved: u64,
    peak_live: u64,
    peak_reserved: u64,
    output: u64,
}

impl SimulatedDevice {
    fn alloc(&mut self, n: u64) -> Result<(), iteragpu_lab::measure::MeasureError> {
        let reserved = self.reserved.max((self.live + n).next_multiple_of(1 << 21));
        if reserved > self.capacity {
            return Err(iteragpu_lab::measure::MeasureError::from_torch_message(
                &format!(
                    "CUDA out of memory. Tried to allocate {n} bytes. GPU 0 has a total capacity of {} bytes",
                    self.capacity
                ),
            ));
        }
        self.live += n;
        self.reserved = reserved;
        self.peak_live = self.peak_live.max(self.live);
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        Ok(())
    }
}

impl iteragpu_lab::measure::Backend for SimulatedDevice {
    fn synchronize(&mut self) -> Result<(), iteragpu_lab::measure::MeasureError> {
        Ok(())
    }
    fn read_allocator(
        &mut self,
    ) -> Result<iteragpu_lab::reading::AllocatorReading, iteragpu_lab::measure::MeasureError> {
        Ok(iteragpu_lab::reading::AllocatorReading {
            allocated: self.live,
            reserved: self.reserved,
            peak_allocated: self.peak_live,
            peak_reserved: self.peak_reserved,
        })
    }
    fn reset_peaks(&mut self) -> Result<(), iteragpu_lab::measure::MeasureError> {
        self.peak_live = self.live;
        self.peak_reserved = self.reserved;
        Ok(())
    }
    fn start_gpu_timer(&mut self) -> Result<(), iteragpu_lab::measure::MeasureError> {
        Ok(())
    }
    fn stop_gpu_timer(&mut self) -> Result<f64, iteragpu_lab::measure::MeasureError> {
        Ok(0.0)
    }
    fn load_model(&mut self) -> Result<(), iteragpu_lab::measure::MeasureError> {
        self.alloc(self.sizes.parameter_bytes)
    }
    fn create_inputs(&mut self) -> Result<(), iteragpu_lab::measure::MeasureError> {
        self.alloc(self.sizes.input_bytes)
    }
    fn forward(&mut self) -> Result<(), iteragpu_lab::measure::MeasureError> {
        let hidden = self.sizes.hidden_activation_bytes;
        self.alloc(hidden)?;
        self.alloc(hidden)?; // GELU's output beside its input
        self.live -= 2 * hidden;
        self.alloc(self.sizes.input_bytes)?;
        self.output = self.sizes.input_bytes;
        Ok(())
    }
    fn release_output(&mut self) {
        self.live -= self.output;
        self.output = 0;
    }
}

/// A GPU backend of `capacity` bytes, handed to the command line as the libtorch one would be.
struct SimulatedGpu {
    capacity: u64,
}

impl iteragpu_lab::gpu::Gpu for SimulatedGpu {
    fn environment(
        &self,
        device: Option<iteragpu_lab::device::CudaDevice>,
    ) -> iteragpu_lab::environment::EnvironmentReport {
        iteragpu_lab::environment::EnvironmentReport::without_libtorch(device, Default::default())
    }
    fn measure(
        &self,
        config: &iteragpu_lab::measure::MeasureConfig,
        _blocks: bool,
        on_phase: &mut dyn FnMut(&iteragpu_lab::measure::PhaseRecord),
    ) -> Result<iteragpu_lab::measure::Measurement, iteragpu_lab::measure::MeasureError> {
        let mut device = SimulatedDevice {
            sizes: config.model()?,
            capacity: self.capacity,
            live: 0,
            reserved: 0,
            peak_live: 0,
            peak_reserved: 0,
            output: 0,
        };
        let phases = iteragpu_lab::measure::run_protocol(
            &mut device,
            config.warmup,
            config.repeats,
            on_phase,
        )?;
        Ok(iteragpu_lab::measure::Measurement::new(
            self.environment(Some(config.device)),
            config.clone(),
            phases,
        )?)
    }
}

/// Exit 3 from an out-of-memory met while measuring: the command line run with a simulated device
/// whose memory holds the weights and the input but not the first pass's activations.
#[test]
fn measure_out_of_memory_is_exit_3_naming_the_phase_and_writes_nothing() {
    use iteragpu_lab::cli::mesure_memoire::{run, Mode};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mesures.json");
    let plot = dir.path().join("phases.svg");
    // batch 64, context 1024, width 256 (hidden 1024), float32: weights 2 102 272 bytes, input
    // 64 MiB, each hidden activation 256 MiB; a pass holds two activations at once.
    let mut line = measure_args(&out);
    for (flag, value) in [("--batch", "64"), ("--context", "1024"), ("--width", "256")] {
        line = with_flag(line, flag, Some(value));
    }
    line.extend([
        "--plot".into(),
        plot.display().to_string(),
        "--quiet".into(),
    ]);
    let args = engine_args(line);

    let small = SimulatedGpu {
        capacity: 512 << 20,
    };
    let failure = run(&args, Mode::Companion(&small)).unwrap_err();
    let message = format!("{:#}", failure.error);
    assert_eq!(
        common::code(failure.status),
        common::OUT_OF_MEMORY,
        "{message}"
    );
    assert!(
        message.contains("CUDA ran out of memory during phase `cold_forward`")
            && message.contains("Tried to allocate 268435456 bytes")
            && message.contains("measuring [batch 64, context 1024, width 256], hidden 1024"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no result, no chart, no temporary file"
    );

    // The same command line on a device large enough measures and writes both files.
    let large = SimulatedGpu { capacity: 2 << 30 };
    run(&args, Mode::Companion(&large)).unwrap();
    let m = iteragpu_lab::measure::Measurement::load(&out).unwrap();
    assert_eq!(m.phases.len(), 6);
    assert_eq!(
        m.phases[2].figures.peak_allocated_bytes - m.phases[2].figures.allocated_baseline_bytes,
        512 << 20
    );
    assert!(plot.exists());
}
