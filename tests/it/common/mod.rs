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

/// A small Llama saved by GPTQ in float16, as the Hub gives it: `config.json` with its
/// `quantization_config` and `model.safetensors` whose tensors are named and shaped as GPTQ's
/// packer writes them (4-bit values packed along the input rows in int32, zeros packed in int32,
/// float16 scales, each input row's group), written here by hand; the bytes and elements its
/// tensors hold.
pub fn gptq_folder(dir: &std::path::Path) -> (u64, u64) {
    let (hidden, inter, vocab, layers) = (64u64, 128u64, 256u64, 2);
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "torch_dtype": "float16",
        "tie_word_embeddings": false,
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                "desc_act": false, "sym": true}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    // (name, dtype, shape)
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<u64>)> = Vec::new();
    let (f16, i32) = (safetensors::Dtype::F16, safetensors::Dtype::I32);
    tensors.push(("model.embed_tokens.weight".into(), f16, vec![vocab, hidden]));
    tensors.push(("model.norm.weight".into(), f16, vec![hidden]));
    tensors.push(("lm_head.weight".into(), f16, vec![vocab, hidden]));
    for l in 0..layers {
        let at = format!("model.layers.{l}");
        tensors.push((format!("{at}.input_layernorm.weight"), f16, vec![hidden]));
        tensors.push((
            format!("{at}.post_attention_layernorm.weight"),
            f16,
            vec![hidden],
        ));
        for (module, out, inp) in [
            ("self_attn.q_proj", hidden, hidden),
            ("self_attn.k_proj", 32, hidden),
            ("self_attn.v_proj", 32, hidden),
            ("self_attn.o_proj", hidden, hidden),
            ("mlp.gate_proj", inter, hidden),
            ("mlp.up_proj", inter, hidden),
            ("mlp.down_proj", hidden, inter),
        ] {
            let groups = inp.div_ceil(128);
            tensors.push((format!("{at}.{module}.qweight"), i32, vec![inp / 8, out]));
            tensors.push((format!("{at}.{module}.qzeros"), i32, vec![groups, out / 8]));
            tensors.push((format!("{at}.{module}.scales"), f16, vec![groups, out]));
            tensors.push((format!("{at}.{module}.g_idx"), i32, vec![inp]));
        }
    }
    let shape = |s: &[u64]| -> Vec<usize> { s.iter().map(|&d| d as usize).collect() };
    let data: Vec<Vec<u8>> = (tensors.iter())
        .map(|(_, d, s)| vec![0u8; shape(s).iter().product::<usize>() * d.size()])
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = (tensors.iter().zip(&data))
        .map(|((name, d, s), bytes)| {
            let view = safetensors::tensor::TensorView::new(*d, shape(s), bytes).unwrap();
            (name.clone(), view)
        })
        .collect();
    let file = safetensors::tensor::serialize(views, &None).unwrap();
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    let elements = tensors
        .iter()
        .map(|(_, _, s)| s.iter().product::<u64>())
        .sum();
    (data.iter().map(|d| d.len() as u64).sum(), elements)
}
