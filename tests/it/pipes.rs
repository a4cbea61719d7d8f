//! Output into a closed pipe (`| head -1` under `pipefail`), for every program: the output stops
//! quietly, nothing panics, a file the command writes is still written whole, and the exit code is
//! still the verdict's (0 for a success, 65 for a broken grid or a tampered bundle).

use crate::common;

use common::grid::blank_grid;
use common::{DATA_ERROR, RECORDED, ROOT, SEED_ESTIMATE, SEED_QUOTE, SEED_SMALL};
use std::process::{Command, Stdio};

/// Runs `program args` with its standard output the write end of a pipe whose read end is already
/// closed, so that every write fails with a broken pipe; returns the exit code.
fn into_closed_pipe(program: &str, args: &[&str]) -> i32 {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(assert_cmd::cargo::cargo_bin(program))
        .args(args)
        .current_dir(ROOT)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{program} {args:?}: {stderr}");
    out.status.code().expect("exited, not killed")
}

/// Runs `program args` into a closed pipe, then again with `--json`: both exit with `code`.
fn plain_and_json_exit(program: &str, args: &[&str], code: i32) {
    for extra in [&[][..], &["--json"][..]] {
        let args: Vec<&str> = args.iter().chain(extra).copied().collect();
        assert_eq!(into_closed_pipe(program, &args), code, "{args:?}");
    }
}

#[test]
fn successes_exit_0_into_a_closed_pipe() {
    let predict: Vec<&str> = ["predict"].into_iter().chain(SEED_SMALL).collect();
    plain_and_json_exit("mesure_memoire", &SEED_ESTIMATE, 0);
    plain_and_json_exit("mesure_memoire", &predict, 0);
    plain_and_json_exit("calcul_forfaits", &SEED_QUOTE, 0);
    plain_and_json_exit("calcul_forfaits", &["--list"], 0);
    plain_and_json_exit(
        "resultats_bruts",
        &["check", "--grid", "data/resultats-bruts.csv"],
        0,
    );
}

#[test]
fn files_are_still_written_into_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("phases.svg");
    let code = into_closed_pipe(
        "mesure_memoire",
        &[
            "plot",
            "--measurement",
            RECORDED,
            "--output",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("</svg>"));
    let grid = blank_grid(dir.path());
    let code = into_closed_pipe(
        "resultats_bruts",
        &[
            "append",
            "--grid",
            grid.to_str().unwrap(),
            "--measurement",
            RECORDED,
            "--gpu",
            "b200",
            "--days",
            "7",
            "--lots",
            "2",
            "--useful-work-unit",
            "one ticket classified",
            "--threshold",
            "label equals the reviewer's label",
            "--accepted-results",
            "1200",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&grid).unwrap().lines().count(), 2);
}

#[test]
fn failures_keep_their_code_into_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let grid = dir.path().join("broken.csv");
    std::fs::write(&grid, "not,the,header\n1,2,3\n").unwrap();
    let tampered = dir.path().join("bundle");
    plain_and_json_exit(
        "resultats_bruts",
        &["check", "--grid", grid.to_str().unwrap()],
        DATA_ERROR,
    );
    // A folder with a manifest that does not match its files.
    std::fs::create_dir(&tampered).unwrap();
    std::fs::write(tampered.join("MANIFEST.json"), "{\"schema\": \"other\"}").unwrap();
    plain_and_json_exit(
        "paquet_lab",
        &["verify", tampered.to_str().unwrap()],
        DATA_ERROR,
    );
}
