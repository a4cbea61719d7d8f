//! Command-line tests of `mesure_memoire budget` and `calcul_forfaits --fit`: presets and explicit
//! shapes, the JSON read back, refusals with their exit codes, and budget files never
//! overwritten.

mod common;

use common::{
    calcul_forfaits as cf, json_of, mesure_memoire as mm, DATA_ERROR, OUTPUT_EXISTS, USAGE,
};
use predicates::str::contains;

const LLAMA2_7B: [&str; 8] = [
    "budget",
    "--model",
    "llama-2-7b",
    "--mode",
    "inference",
    "--context",
    "4096",
    "--flash-attention",
];

#[test]
fn a_preset_budget_names_every_term_with_bytes_gib_and_gb() {
    mm().args(LLAMA2_7B)
        .assert()
        .success()
        .stdout(contains("6 738 415 616 parameters"))
        // 2 × 32 layers × 4096 tokens × 32 heads × 128 × 2 B.
        .stdout(contains(
            "KV cache                      2 147 483 648 B   2.00   2.15",
        ))
        .stdout(contains(
            "Weights                      13 476 831 232 B  12.55  13.48",
        ))
        .stdout(contains("CUDA context and libraries"))
        .stdout(contains("measured on NVIDIA H200"))
        .stdout(contains("1 GiB = 2^30 bytes, 1 GB = 10^9 bytes"));
}

#[test]
fn the_json_budget_holds_each_term_and_its_status() {
    let v = json_of(mm().args(LLAMA2_7B).arg("--json"));
    let terms = v["terms"].as_array().unwrap();
    let kv = terms.iter().find(|t| t["key"] == "kv_cache").unwrap();
    assert_eq!(kv["bytes"]["bytes"], 2_147_483_648u64);
    assert_eq!(kv["status"], "exact");
    assert_eq!(kv["split"], "kv_heads");
    let acts = terms.iter().find(|t| t["key"] == "activations").unwrap();
    assert_eq!(acts["status"], "estimated");
    assert!(acts["source"]
        .as_str()
        .unwrap()
        .contains("Hugging Face's Llama operations"));
    assert!(acts["bound"].as_str().unwrap().contains("H200"));
    assert_eq!(v["schema"], "iteragpu-lab/budget/1");
}

#[test]
fn an_explicit_shape_equals_its_preset() {
    let explicit = json_of(mm().args([
        "budget",
        "--layers",
        "32",
        "--hidden",
        "4096",
        "--heads",
        "32",
        "--intermediate",
        "11008",
        "--vocab",
        "32000",
        "--mode",
        "inference",
        "--context",
        "4096",
        "--flash-attention",
        "--json",
    ]));
    let preset = json_of(mm().args(LLAMA2_7B).arg("--json"));
    assert_eq!(explicit["terms"], preset["terms"]);
}

#[test]
fn refusals_name_what_is_wrong() {
    let cases: [(&str, &str); 5] = [
        (
            "--model llama-9 --mode inference",
            "unknown model preset \"llama-9\"; known: llama-2-7b",
        ),
        (
            "--model mistral-7b-v0.1 --mode inference",
            "mistral-7b-v0.1 uses sliding-window attention",
        ),
        (
            "--model llama-2-7b --mode qlora --weights int8",
            "--mode qlora stores the weights in NF4",
        ),
        (
            "--layers 2 --hidden 64 --heads 6 --kv-heads 4 --intermediate 128 --vocab 10 --mode full",
            "heads (6) must be a multiple of kv_heads (4)",
        ),
        (
            "--model llama-2-7b --mode lora --targets q,x",
            "unknown module \"x\"",
        ),
    ];
    for (flags, message) in cases {
        mm().arg("budget")
            .args(flags.split(' '))
            .args(["--context", "8"])
            .assert()
            .code(USAGE)
            .stderr(contains(message));
    }
}

#[test]
fn a_saved_budget_is_planned_by_calcul_forfaits_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("budget.json");
    let mut args: Vec<String> = [
        "budget",
        "--model",
        "llama-3.1-70b",
        "--mode",
        "qlora",
        "--context",
        "2048",
        "--checkpointing",
        "--flash-attention",
        "--output",
    ]
    .map(String::from)
    .to_vec();
    args.push(file.display().to_string());
    mm().args(&args)
        .assert()
        .success()
        .stdout(contains("Budget written to"));
    let saved = std::fs::read(&file).unwrap();
    mm().args(&args).assert().code(OUTPUT_EXISTS);
    assert_eq!(std::fs::read(&file).unwrap(), saved);

    let fit = cf().arg("--fit").arg(&file).assert().success();
    let out = String::from_utf8(fit.get_output().stdout.clone()).unwrap();
    assert!(out.contains("Cheapest: "), "{out}");
    assert!(out.contains("ILLUSTRATIVE"), "{out}");
    assert!(out.contains("sha256 "), "{out}");
    // The same plan as `budget --fit`.
    let direct = mm()
        .args(&args[..args.len() - 2])
        .arg("--fit")
        .assert()
        .success();
    let direct = String::from_utf8(direct.get_output().stdout.clone()).unwrap();
    assert!(direct.ends_with(&out), "{direct}\n---\n{out}");
}

#[test]
fn a_bad_budget_file_is_a_data_error_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.json");
    std::fs::write(
        &file,
        "{\"schema\": \"iteragpu-lab/budget/1\",\n \"workload\": 7}",
    )
    .unwrap();
    cf().arg("--fit")
        .arg(&file)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("is not a budget file"))
        .stderr(contains("line 2 column"));
    cf().args(["--fit", "data/tarifs-forfaits.csv"])
        .assert()
        .code(DATA_ERROR);
    cf().args(["--fit", "data/modeles.csv", "--gpu", "h200"])
        .assert()
        .code(USAGE)
        .stderr(contains("cannot be used with"));
}

#[test]
fn presets_are_listed_with_their_parameter_counts() {
    mm().args(["budget", "--list-models"])
        .assert()
        .success()
        .stdout(contains("llama-3.1-70b"))
        .stdout(contains("70 553 706 496"))
        .stdout(contains("mixtral-8x7b"));
}

/// The synthetic transformer's runs recorded on the H200 (`scripts/gpu/budget-proof.py`).
const RECORDED_RUNS: &str = "docs/gpu-runs/2026-11-30-h200-budget";

#[test]
fn budgets_match_the_runs_recorded_on_the_h200() {
    let mut reports: Vec<String> =
        std::fs::read_dir(std::path::Path::new(common::ROOT).join(RECORDED_RUNS))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| p.display().to_string())
            .collect();
    reports.sort();
    assert!(reports.len() >= 25, "{reports:?}");
    let v = json_of(mm().args(["budget", "--json", "--against"]).args(&reports));
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), reports.len());
    let mut maps = 0;
    const EXACT: [&str; 5] = [
        "weights",
        "kv_cache",
        "lora_adapters",
        "optimizer_states",
        "cublas_workspace",
    ];
    for (run, path) in runs.iter().zip(&reports) {
        assert!(run["gpu"].as_str().unwrap().contains("H200"), "{path}");
        for c in run["checks"].as_array().unwrap() {
            if EXACT.contains(&c["term"].as_str().unwrap()) {
                assert_eq!(c["residual"], 0, "{path}: {c}");
            }
        }
        for m in run["maps"].as_array().unwrap() {
            assert_eq!(m["equal"], true, "{path}: {m}");
            maps += 1;
        }
        let error = run["peak_error_percent"].as_f64().unwrap();
        assert!(error.abs() < 1.0, "{path}: peak off by {error} %");
    }
    // The runs recorded with --blocks: their weights', KV cache's, adapters' and states' maps.
    assert!(maps >= 100, "{maps} block maps");
}

#[test]
fn a_report_that_is_not_a_bench_run_is_a_data_error() {
    mm().args(["budget", "--against", common::RECORDED])
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("is not a transformer bench report"));
}
