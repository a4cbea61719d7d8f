//! What every command-line test file shares: the programs, the repository root, the exit codes
//! by name, the seed's command lines, editing and parsing argument lists, reading JSON from a
//! successful run, stand-in companions and named pipes; [`bundle`] for the bundle's tests;
//! [`grid`] for the results grid's; [`lesson`] for lesson records made by the model (test
//! fixtures).
#![allow(dead_code)]

pub mod bundle;
pub mod grid;
pub mod lesson;

use assert_cmd::Command;
use iteragpu_lab::status::Status;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The repository root (tests run the programs from here where they read `data/`).
pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A measurement recorded on an NVIDIA H200 by `mesure_memoire measure` (see docs/benchmarks.md).
pub const RECORDED: &str = "data/exemple-mesure-h200-petit-essai.json";

/// The shape of the seed's first measurement, as flags (`--batch 1 --context 16 --width 64
/// --dtype float32 --warmup 1 --repeats 2`).
pub const SEED_SMALL: [&str; 12] = [
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
];

/// The seed's estimate (`estimate --parameters 7000000000 --bits 16 --reserve-gib 4`).
pub const SEED_ESTIMATE: [&str; 7] = [
    "estimate",
    "--parameters",
    "7000000000",
    "--bits",
    "16",
    "--reserve-gib",
    "4",
];

/// The seed's quote, as `calcul_forfaits` flags (`--gpu b200 --days 7 --lots 2`).
pub const SEED_QUOTE: [&str; 6] = ["--gpu", "b200", "--days", "7", "--lots", "2"];

/// Longer than any command of the tests takes on a loaded machine, far shorter than reading
/// `/dev/zero` until memory runs out or waiting for a named pipe's writer: a hang fails the test
/// instead of blocking it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// An exit status's code, as `assert_cmd` compares them.
pub const fn code(status: Status) -> i32 {
    status as i32
}
pub const FAILURE: i32 = code(Status::Failure);
pub const UNAVAILABLE: i32 = code(Status::Unavailable);
pub const OUT_OF_MEMORY: i32 = code(Status::OutOfMemory);
pub const OUTPUT_EXISTS: i32 = code(Status::OutputExists);
pub const USAGE: i32 = code(Status::Usage);
pub const DATA_ERROR: i32 = code(Status::DataError);

fn program(name: &str) -> Command {
    let mut c = Command::cargo_bin(name).unwrap();
    c.current_dir(ROOT);
    c
}

/// `mesure_memoire`, run from the repository root.
pub fn mesure_memoire() -> Command {
    program("mesure_memoire")
}

/// `calcul_forfaits`, run from the repository root.
pub fn calcul_forfaits() -> Command {
    program("calcul_forfaits")
}

/// `resultats_bruts`, run from the repository root.
pub fn resultats_bruts() -> Command {
    program("resultats_bruts")
}

/// `paquet_lab`, run from the repository root.
pub fn paquet_lab() -> Command {
    program("paquet_lab")
}

/// The JSON a successful run printed.
pub fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out).expect("stdout is JSON")
}

/// Copies the program `name` into `dir` (to run it without its companion, or beside a stand-in)
/// and waits until it can be started: while another test thread forks, the copy's write handle
/// may live on in the child for a moment and the kernel answers "text file busy".
pub fn copy_program(name: &str, dir: &Path) -> PathBuf {
    let dest = dir.join(name);
    std::fs::copy(assert_cmd::cargo::cargo_bin(name), &dest).unwrap();
    for _ in 0..100 {
        match std::process::Command::new(&dest).arg("--version").output() {
            Err(e) if e.raw_os_error() == Some(26) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => return dest,
        }
    }
    panic!("{} stays busy", dest.display());
}

/// A stand-in companion: the shell `script` written to `dir/mesure_memoire_torch`, executable
/// (mode 0755); its path. The front program copied into `dir` ([`copy_program`]) starts it.
pub fn stand_in_companion(dir: &Path, script: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("mesure_memoire_torch");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `args` with `flag`'s value replaced by `value` (or the flag added with it; a flag without a
/// value is added when absent).
pub fn with_flag(mut args: Vec<String>, flag: &str, value: Option<&str>) -> Vec<String> {
    match (args.iter().position(|a| a == flag), value) {
        (Some(i), Some(v)) => args[i + 1] = v.into(),
        (Some(_), None) => {}
        (None, v) => {
            args.push(flag.into());
            args.extend(v.map(String::from));
        }
    }
    args
}

/// `mesure_memoire`'s arguments `args` (the subcommand first) parsed as the program parses them,
/// to run the command line in this process.
pub fn engine_args(args: Vec<String>) -> iteragpu_lab::cli::mesure_memoire::Args {
    use clap::Parser;
    let line = std::iter::once("mesure_memoire".to_string()).chain(args);
    iteragpu_lab::cli::mesure_memoire::Args::try_parse_from(line).unwrap()
}

/// Creates a named pipe at `path`.
pub fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A model folder as the Hub gives it: `config.json` and `model.safetensors` (a small Llama,
/// every tensor in bfloat16).
pub fn model_folder(dir: &std::path::Path, drop_one: bool) {
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let model = iteragpu_lab::model::config::from_value(&config).unwrap();
    let mut params = model.parameters();
    if drop_one {
        params.pop();
    }
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = params
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                vec![0u8; p.elements() as usize * 2],
                p.shape.iter().map(|&d| d as usize).collect(),
            )
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, d, s)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::tensor::serialize(views, &None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}
