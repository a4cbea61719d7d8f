//! The companion started as a spare (`IGL_SPARE=1`): it reads its command line from stdin, each
//! argument followed by a NUL byte, and runs it as if it had been given on its own command line;
//! let go with nothing, it exits 0 quietly. No GPU needed.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn spare(given: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mesure_memoire_torch"))
        .env("IGL_SPARE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(given).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_spare_runs_the_command_line_it_is_given() {
    let out = spare(b"environment\0--json\0--device\0cuda:0\0");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["libtorch"]["built_with"], true);
    assert!(report["tool"].as_str().unwrap().starts_with("iteragpu-lab"));
}

#[test]
fn a_spare_keeps_each_argument_whole_and_refuses_a_bad_one() {
    let out = spare(b"measure\0--bogus\0");
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("--bogus"),
        "{}",
        text(&out.stderr)
    );
    // An argument with spaces and a non-UTF-8 byte arrives as one argument, byte for byte.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("a measurement \u{e9}.json");
    let mut given = b"plot\0--measurement\0".to_vec();
    given.extend_from_slice(missing.as_os_str().as_encoded_bytes());
    given.extend_from_slice(b"\0--output\0");
    given.extend_from_slice(dir.path().as_os_str().as_encoded_bytes());
    given.extend_from_slice(b"/chart \xff.svg\0");
    let out = spare(&given);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("a measurement \u{e9}.json"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_spare_let_go_exits_quietly() {
    let out = spare(b"");
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
}
