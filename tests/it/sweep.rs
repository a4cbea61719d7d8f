//! `mesure_memoire sweep` and `predict` on the command line, without a GPU: every refusal of the
//! sweep's flags with its exit code, a folder with results never overwritten, exit 2 without the
//! GPU companion, and `predict`'s figures and refusals.

use crate::common;

use assert_cmd::Command;
use common::{
    json_of, mesure_memoire as mm, stand_in_companion, with_flag, DATA_ERROR, OUTPUT_EXISTS,
    SEED_SMALL, UNAVAILABLE, USAGE,
};
use predicates::str::contains;

fn sweep_args(extra: &[&str], output: &std::path::Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "sweep",
        "--vary",
        "batch",
        "--from",
        "1",
        "--to",
        "8",
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
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend(["--output".to_string(), output.display().to_string()]);
    a
}

#[test]
fn sweep_flags_are_validated_before_any_gpu_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    let cases: [(&[&str], &str); 6] = [
        (&["--from", "5", "--to", "4"], "from 5 is above to 4"),
        (&["--steps", "0"], "--steps"),
        (&["--step", "0"], "--step"),
        (&["--vary", "depth"], "unknown dimension `depth`"),
        (&["--batch", "2"], "--batch is the dimension --vary sweeps"),
        (&["--steps", "3", "--geometric"], "--geometric"),
    ];
    for (extra, needle) in cases {
        let mut args = sweep_args(&[], &out);
        // The defaults above are replaced in place (clap keeps the last value of a repeated flag
        // only where allowed), other flags added.
        for pair in extra.chunks(2) {
            args = with_flag(args, pair[0], pair.get(1).copied());
        }
        mm().args(&args)
            .assert()
            .code(USAGE)
            .stderr(contains(needle));
        assert!(!out.exists(), "{extra:?} created the folder");
    }
    // A missing fixed dimension is named.
    let mut args = sweep_args(&[], &out);
    let i = args.iter().position(|a| a == "--width").unwrap();
    args.drain(i..i + 2);
    mm().args(&args)
        .assert()
        .code(USAGE)
        .stderr(contains("--width is required"));
}

#[test]
fn without_the_companion_a_sweep_exits_2_and_a_folder_with_results_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let front = common::copy_program("mesure_memoire", dir.path());
    let out = dir.path().join("s");
    Command::new(&front)
        .args(sweep_args(&[], &out))
        .assert()
        .code(UNAVAILABLE)
        .stderr(contains("mesure_memoire_torch"));
    assert!(!out.exists());
    // A folder that already holds results is never overwritten without --resume.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("sweep.csv"), "earlier results\n").unwrap();
    mm().env("IGL_COMPANION", &front)
        .args(sweep_args(&[], &out))
        .assert()
        .code(OUTPUT_EXISTS)
        .stderr(contains("--resume"));
    assert_eq!(
        std::fs::read_to_string(out.join("sweep.csv")).unwrap(),
        "earlier results\n"
    );
}

/// A companion that finds no GPU (exit 2, as `measure` does) stops the sweep after its first
/// point: exit 2, no row written, no folder left.
#[test]
fn without_a_gpu_a_sweep_exits_2_after_its_first_point_and_writes_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let standin = stand_in_companion(
        dir.path(),
        "#!/bin/sh\n\
         tr '\\0' ' ' >> \"$STANDIN_LOG\"\n\
         echo >> \"$STANDIN_LOG\"\n\
         echo 'mesure_memoire: error: no usable GPU: CUDA is not available' >&2\n\
         exit 2\n",
    );
    let out = dir.path().join("s");
    mm().env("IGL_COMPANION", &standin)
        .env("STANDIN_LOG", &log)
        .args(sweep_args(&["--step", "1"], &out))
        .assert()
        .code(UNAVAILABLE)
        .stderr(contains("no usable GPU"))
        .stderr(contains("no row written"));
    assert!(!out.exists(), "the sweep's folder is left behind");
    let given = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        given.lines().filter(|l| l.contains("measure")).count(),
        1,
        "{given}"
    );
}

/// Each point is handed to a companion started ahead as a spare (`IGL_SPARE=1`, its command line on
/// stdin), and no companion outlives the sweep, the one started for a next point included. The
/// stand-in companion logs what it is given and runs out of memory, as a GPU would for a point
/// too large, saying in its result file (`IGL_RESULT_FILE`) in which phase.
#[test]
fn each_point_goes_to_a_spare_companion_and_none_outlives_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let standin = stand_in_companion(
        dir.path(),
        "#!/bin/sh\n\
         echo \"started $$\" >> \"$STANDIN_LOG\"\n\
         [ \"$IGL_SPARE\" = 1 ] || { echo 'not a spare' >&2; exit 1; }\n\
         given=$(tr '\\0' ' ')\n\
         echo \"given $$ $given\" >> \"$STANDIN_LOG\"\n\
         echo 'error: CUDA out of memory' >&2\n\
         printf '{\"schema\":\"iteragpu-lab/companion-result/1\",\"exit_code\":3,\
         \"message\":\"CUDA out of memory\",\"during\":\"cold_forward\"}' > \"$IGL_RESULT_FILE\"\n\
         exit 3\n",
    );
    let out = dir.path().join("s");
    let args = with_flag(
        sweep_args(&["--step", "1", "--keep-going"], &out),
        "--to",
        Some("4"),
    );
    mm().env("IGL_COMPANION", &standin)
        .env("STANDIN_LOG", &log)
        .args(&args)
        .assert()
        .success();
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    assert!(
        rows.iter().all(|r| r.contains(",oom,cold_forward,")),
        "{csv}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    let given: Vec<&str> = log.lines().filter(|l| l.starts_with("given ")).collect();
    assert_eq!(given.len(), 4, "{log}");
    for (i, line) in given.iter().enumerate() {
        assert!(line.contains(" measure --device cuda:0 --batch "), "{line}");
        assert!(line.contains(&format!(" --batch {} ", i + 1)), "{line}");
    }
    for pid in log.lines().filter_map(|l| l.strip_prefix("started ")) {
        assert!(
            !std::path::Path::new("/proc").join(pid).exists(),
            "companion {pid} outlived the sweep:\n{log}"
        );
    }
}

#[test]
fn predict_gives_every_figure_and_names_every_block() {
    let v = json_of(mm().arg("predict").args(SEED_SMALL).arg("--json"));
    let cold = &v["phases"][2];
    assert_eq!(cold["phase"], "cold_forward");
    assert_eq!(cold["figures"]["allocated_end_bytes"], 34_743_808u64);
    assert_eq!(cold["figures"]["peak_reserved_bytes"], 35_651_584u64);
    let names: Vec<&str> = cold["live_at_end"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"cublas_workspace") && names.contains(&"output"),
        "{names:?}"
    );
    mm().arg("predict")
        .args(SEED_SMALL)
        .assert()
        .success()
        .stdout(contains(
            "cold_forward     -        136 704     34 743 808     34 772 480",
        ))
        .stdout(contains("cublas_workspace 33 554 432 B"));
}

#[test]
fn predict_refuses_what_it_does_not_model() {
    let base: Vec<String> = [
        "predict",
        "--batch",
        "1",
        "--context",
        "1",
        "--width",
        "1",
        "--dtype",
        "float32",
        "--warmup",
        "0",
        "--repeats",
        "1",
    ]
    .map(String::from)
    .into();
    mm().args(&base)
        .args(["--compute-capability", "13.7"])
        .assert()
        .code(USAGE)
        .stderr(contains("13.7"));
    mm().args(&base)
        .env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        .assert()
        .code(USAGE)
        .stderr(contains("PYTORCH_CUDA_ALLOC_CONF"));
    mm().args(&base)
        .env("CUBLASLT_WORKSPACE_SIZE", "2 MiB")
        .assert()
        .code(USAGE)
        .stderr(contains("CUBLASLT_WORKSPACE_SIZE"));
    mm().args(with_flag(base, "--width", Some("4611686018427387904")))
        .assert()
        .code(USAGE)
        .stderr(contains("overflow"));
}

/// The sweep recorded on an H200 and shipped in `data/` draws its chart without a GPU.
#[test]
fn the_recorded_sweep_draws_its_chart() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("sweep.svg");
    mm().args(["plot", "--sweep", "data/exemple-balayage-h200", "--output"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    for label in [
        "NVIDIA H200",
        "measured peak reserved",
        "predicted peak reserved",
        "out of memory",
        "device memory",
    ] {
        assert!(text.contains(label), "{label}");
    }
    mm().args(["plot", "--sweep", "data/exemple-balayage-h200", "--output"])
        .arg(&svg)
        .assert()
        .code(OUTPUT_EXISTS);
}

/// The shipped H200 sweep copied into `dir`.
fn recorded_sweep_in(dir: &std::path::Path) {
    for f in ["sweep.csv", "sweep.json"] {
        let from = std::path::Path::new(common::ROOT).join("data/exemple-balayage-h200");
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
}

/// A sweep folder read back is untrusted: its files never followed through a link, one row per
/// point, figures the caching allocator can give, measurement files inside the folder.
#[test]
fn a_sweep_folder_read_back_is_checked_row_by_row() {
    let plot = |dir: &std::path::Path| {
        let svg = dir.join("chart.svg");
        let _ = std::fs::remove_file(&svg);
        mm().args(["plot", "--sweep"])
            .arg(dir)
            .arg("--output")
            .arg(&svg)
            .assert()
    };
    let dir = tempfile::tempdir().unwrap();
    recorded_sweep_in(dir.path());
    plot(dir.path()).success();
    let csv = std::fs::read_to_string(dir.path().join("sweep.csv")).unwrap();
    let first_row = csv.lines().nth(1).unwrap();
    for (edited, said) in [
        (format!("{csv}{first_row}\n"), "two rows for batch = 32"),
        (
            csv.replacen(",17818486784,17819500544,", ",1,17819500544,", 1),
            "its row for batch = 32: figures the caching allocator cannot give",
        ),
        (
            csv.replacen("point-batch-32.json", "../point-batch-32.json", 1),
            "is not a file of the folder",
        ),
    ] {
        assert_ne!(edited, csv, "{said}");
        std::fs::write(dir.path().join("sweep.csv"), &edited).unwrap();
        plot(dir.path()).code(DATA_ERROR).stderr(contains(said));
    }
    // A link to a file outside the folder is neither read nor rewritten.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("sweep.csv"), &csv).unwrap();
    std::fs::remove_file(dir.path().join("sweep.csv")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("sweep.csv"),
        dir.path().join("sweep.csv"),
    )
    .unwrap();
    plot(dir.path())
        .code(DATA_ERROR)
        .stderr(contains("is a symbolic link"));
    assert_eq!(
        std::fs::read_to_string(outside.path().join("sweep.csv")).unwrap(),
        csv
    );
}

/// `--resume` continues a sweep only with the sizes and passes it was made with.
#[test]
fn a_sweep_is_resumed_only_as_it_was_made() {
    let dir = tempfile::tempdir().unwrap();
    recorded_sweep_in(dir.path());
    let before = std::fs::read(dir.path().join("sweep.csv")).unwrap();
    mm().args([
        "sweep",
        "--vary",
        "batch",
        "--from",
        "32",
        "--to",
        "1024",
        "--geometric",
    ])
    .args(["--context", "8192", "--width", "1024", "--hidden", "16384"])
    .args([
        "--dtype",
        "bfloat16",
        "--warmup",
        "1",
        "--repeats",
        "3",
        "--resume",
    ])
    .arg("--output")
    .arg(dir.path())
    .assert()
    .code(DATA_ERROR)
    .stderr(contains("the sweep was made over batch"))
    .stderr(contains("repeats 2; this one differs"));
    assert_eq!(std::fs::read(dir.path().join("sweep.csv")).unwrap(), before);
}
