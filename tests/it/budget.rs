//! Command-line tests of `mesure_memoire budget` and `calcul_forfaits --fit`: presets and explicit
//! shapes, the JSON read back, refusals with their exit codes, and budget files never
//! overwritten.

use crate::common;

use common::{
    calcul_forfaits as cf, json_of, mesure_memoire as mm, model_folder, DATA_ERROR, OUTPUT_EXISTS,
    USAGE,
};
use predicates::str::contains;

const LLAMA2_7B: [&str; 7] = [
    "budget",
    "--model",
    "llama-2-7b",
    "--mode",
    "inference",
    "--context",
    "4096",
];

#[test]
fn a_preset_budget_names_every_term_with_bytes_gib_and_gb() {
    mm().args(LLAMA2_7B)
        .assert()
        .success()
        .stdout(contains("6 738 415 616 parameters"))
        // 2 × 32 layers × (4096 prompt + 1 new − 1) tokens × 32 KV heads × 128 × 2 B.
        .stdout(contains(
            "KV cache                                 2 147 483 648 B   2.00   2.15",
        ))
        .stdout(contains("measured on NVIDIA H200"))
        .stdout(contains("the card is fullest (reserved and what lives outside the allocator) in the decode stage"))
        .stdout(contains("Each stage of the replayed run"))
        .stdout(contains("1 GiB = 2^30 bytes, 1 GB = 10^9 bytes"));
}

#[test]
fn the_json_budget_holds_each_term_and_sums_to_its_total() {
    let v = json_of(mm().args(LLAMA2_7B).arg("--json"));
    let b = &v["budget"];
    assert_eq!(b["schema"], "iteragpu-lab/budget/3");
    let terms = b["terms"].as_array().unwrap();
    let term = |key: &str| terms.iter().find(|t| t["key"] == key).unwrap();
    assert_eq!(term("kv_cache")["bytes"]["bytes"], 2_147_483_648u64);
    assert_eq!(term("kv_cache")["status"], "exact");
    assert_eq!(term("kv_cache")["split"], "kv_heads");
    assert_eq!(term("activations")["status"], "replayed");
    assert_eq!(term("outside_allocator")["status"], "measured");
    let at_peak: u64 = terms
        .iter()
        .map(|t| t["at_peak"]["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(at_peak, b["total"]["bytes"].as_u64().unwrap());
    let bytes = |k: &str| b[k]["bytes"].as_u64().unwrap();
    assert_eq!(
        bytes("total"),
        bytes("peak_reserved") + bytes("outside_allocator")
    );
    assert!(bytes("peak_allocated") <= bytes("peak_reserved"));
    assert!(v.get("plan").is_none());
}

#[test]
fn a_shape_from_flags_and_from_a_config_file_equal_the_preset() {
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
        "--json",
    ]));
    let preset = json_of(mm().args(LLAMA2_7B).arg("--json"));
    assert_eq!(explicit["budget"]["terms"], preset["budget"]["terms"]);
    assert_eq!(explicit["budget"]["stages"], preset["budget"]["stages"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let row = iteragpu_lab::budget::Presets::builtin()
        .get("llama-2-7b")
        .unwrap()
        .clone();
    std::fs::write(
        &config,
        serde_json::to_vec(&row.config_json().unwrap()).unwrap(),
    )
    .unwrap();
    let from_file = json_of(mm().args(["budget", "--config"]).arg(&config).args([
        "--mode",
        "inference",
        "--context",
        "4096",
        "--json",
    ]));
    assert_eq!(from_file["budget"]["terms"], preset["budget"]["terms"]);
}

/// The config.json of a shipped preset.
fn preset_config(name: &str) -> serde_json::Value {
    iteragpu_lab::budget::Presets::builtin()
        .get(name)
        .unwrap()
        .config_json()
        .unwrap()
}

/// A checkpoint saved in NF4 with double quantization: QLoRA of it is replayed loading the
/// saved tensors (its weights stage never holds a 16-bit copy).
#[test]
fn a_checkpoint_saved_in_nf4_is_loaded_as_saved_for_qlora() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = preset_config("llama-3.1-8b");
    config["quantization_config"] = serde_json::json!({
        "quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "bfloat16"
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let out = mm()
            .args(["budget", "--config"])
            .arg(dir.path())
            .args(args)
            .args(["--batch", "1", "--context", "2048", "--json"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let saved = json(&["--mode", "qlora"]);
    let stage = |b: &serde_json::Value, name: &str| {
        b["budget"]["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == name)
            .unwrap()
            .clone()
    };
    let held = |b: &serde_json::Value| b["budget"]["terms"][0]["at_peak"]["bytes"].as_u64();
    let weights = stage(&saved, "weights");
    assert_eq!(saved["budget"]["terms"][0]["key"], "weights");
    assert_eq!(weights["peak_allocated"]["bytes"].as_u64(), held(&saved));
    // Quantized as it loads, the same model stages each weight in bfloat16 first.
    std::fs::write(
        dir.path().join("config.json"),
        {
            let mut c = config.clone();
            c.as_object_mut().unwrap().remove("quantization_config");
            c
        }
        .to_string(),
    )
    .unwrap();
    let quantizing = json(&["--mode", "qlora"]);
    let staged = stage(&quantizing, "weights");
    assert!(staged["peak_allocated"]["bytes"].as_u64() > held(&quantizing));
}

/// Serving a checkpoint saved in NF4: its weights as saved, each product by the kernel
/// bitsandbytes picks on the GPU the flags name.
#[test]
fn a_checkpoint_saved_in_nf4_is_served_as_saved() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = preset_config("llama-3.1-8b");
    let dense_config = config.to_string();
    config["quantization_config"] = serde_json::json!({
        "quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "bfloat16"
    });
    let serve = |config: &str, gpu: &[&str]| -> serde_json::Value {
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        let out = mm()
            .args(["budget", "--config"])
            .arg(dir.path())
            .args(["--mode", "inference", "--batch", "8", "--context", "2048"])
            .args(["--generated", "16", "--json"])
            .args(gpu)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let peak = |b: &serde_json::Value, stage: &str| {
        (b["budget"]["stages"].as_array().unwrap().iter())
            .find(|s| s["stage"] == stage)
            .unwrap()["peak_allocated"]["bytes"]
            .as_u64()
            .unwrap()
    };
    let h200 = serve(&config.to_string(), &[]);
    let dense = serve(&dense_config, &[]);
    // The weights in 4 bits and their scales against 16 bits, the head and embeddings as they are.
    assert!(peak(&h200, "weights") < peak(&dense, "weights") / 2);
    // Decoding 8 rows, the H200 dequantizes the attention's and down_proj's weights; an L4
    // (8.9, 58 SMs) runs bitsandbytes' kernel on every layer, which makes only its output.
    let l4 = serve(
        &config.to_string(),
        &["--compute-capability", "8.9", "--multiprocessors", "58"],
    );
    assert!(peak(&l4, "decode") < peak(&h200, "decode"));
    assert_eq!(
        l4["budget"]["kernels"]["reduction_grid"]["multiprocessors"],
        58
    );
    // The text names the weights as saved and the GPU the kernels were chosen for.
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args([
            "--mode",
            "inference",
            "--context",
            "2048",
            "--multiprocessors",
            "58",
        ])
        .assert()
        .success()
        .stdout(contains(
            "NF4 weights as the checkpoint saved them, bfloat16 compute",
        ))
        .stdout(contains("compute capability 9.0 with 58 multiprocessors"))
        .stdout(contains(
            "proven on 6 runs held out (data/hf-proof-nf4-h100.json)",
        ));
}

#[test]
fn a_quantized_config_is_refused_not_budgeted_dense() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = preset_config("llama-2-13b");
    for (q, mode, refusal) in [
        // Saved in 4 bits without double quantization.
        (
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true}),
            "inference",
            "(bitsandbytes 4-bit) is not replayed yet",
        ),
        (
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_8bit": true}),
            "lora",
            "(bitsandbytes 8-bit) is budgeted for serving as saved (--mode inference), not trained",
        ),
        (
            serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 128}),
            "full",
            "(4-bit GPTQ in groups of 128) is budgeted for serving as saved",
        ),
        (
            serde_json::json!({"quant_method": "compressed-tensors"}),
            "inference",
            "quant_method `compressed-tensors` is not supported (bitsandbytes, gptq, awq, fp8)",
        ),
    ] {
        config["quantization_config"] = q;
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        mm().args(["budget", "--config"])
            .arg(dir.path())
            .args(["--mode", mode, "--context", "512"])
            .assert()
            .failure()
            .stdout("")
            .stderr(contains(refusal));
    }
}

/// A checkpoint saved by GPTQ ([`common::gptq_folder`]) is served as saved: its weights exact from its
/// layout, the checkpoint's headers agreeing, and the verdict said not to be a replayed one.
#[test]
fn a_checkpoint_saved_by_gptq_is_budgeted_as_stored_and_said_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let (stored, elements) = common::gptq_folder(dir.path());
    let run = |args: &[&str]| {
        mm().args(["budget", "--config"])
            .arg(dir.path())
            .args([
                "--mode",
                "inference",
                "--dtype",
                "float16",
                "--context",
                "64",
            ])
            .args(args)
            .assert()
            .success()
    };
    let out = run(&["--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let b = &json["budget"];
    assert_eq!(b["workload"]["weights"]["format"], "prequantized");
    let term = |key: &str| {
        (b["terms"].as_array().unwrap().iter())
            .find(|t| t["key"] == key)
            .unwrap()
            .clone()
    };
    // The checkpoint's bytes, and beside them the rotary frequencies' buffers (`inv_freq` and
    // `original_inv_freq`, 8 float32 each), which no checkpoint stores.
    let weights = term("weights");
    assert_eq!(bytes(&weights["bytes"]), stored + 2 * 8 * 4, "{weights}");
    assert_eq!(weights["status"], "exact");
    assert_eq!(term("kv_cache")["status"], "exact");
    assert_eq!(term("activations")["status"], "partial");
    let text = String::from_utf8(run(&[]).get_output().stdout.clone()).unwrap();
    assert!(
        text.contains(
            "4-bit GPTQ in groups of 128 weights as the checkpoint saved them, float16 compute"
        ),
        "{text}"
    );
    assert!(text.contains("NOT A REPLAYED VERDICT"), "{text}");
    assert!(
        text.contains(&format!(
            ": the {} elements the config's",
            iteragpu_lab::units::grouped(elements)
        )),
        "{text}"
    );
    let fit = run(&["--fit"]);
    fit.stdout(contains("NOT A REPLAYED VERDICT"));
}

#[test]
fn a_model_folder_is_read_with_its_checkpoint_headers() {
    let dir = tempfile::tempdir().unwrap();
    model_folder(dir.path(), false);
    let args = ["--mode", "inference", "--context", "64"];
    let budget_text = || {
        let out = mm()
            .args(["budget", "--config"])
            .arg(dir.path())
            .args(args)
            .assert()
            .success();
        String::from_utf8(out.get_output().stdout.clone()).unwrap()
    };
    let text = budget_text();
    assert!(
        text.contains("the checkpoint (model.safetensors in 1 file) holds 21 tensors"),
        "{text}"
    );
    assert!(
        text.contains("B in BF16): the 106 816 parameters the config describes"),
        "{text}"
    );
    // One tensor fewer: said, and the budget is the config's.
    model_folder(dir.path(), true);
    let text = budget_text();
    assert!(
        text.contains("where the config describes 106 816 parameters"),
        "{text}"
    );
    // A header that lies about its length is refused, naming the file.
    let st = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    bytes[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&st, bytes).unwrap();
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("model.safetensors: header length"));
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("holds no config.json"));
}

#[test]
fn refusals_name_what_is_wrong() {
    let cases: &[(&str, &str)] = &[
        ("--model llama-9 --mode inference", "unknown model preset \"llama-9\"; known: llama-2-7b"),
        ("--model mixtral-8x7b --mode qlora --batch 2 --context 1024", "NF4 weights of a mixture of experts are not replayed"),
        (
            "--layers 2 --hidden 64 --heads 6 --kv-heads 4 --intermediate 128 --vocab 10 --mode full",
            "invalid shape flags: `hidden_size` (64) must be a multiple of `num_attention_heads` (6)",
        ),
        ("--model llama-2-7b --mode lora --targets q,x", "LoRA targets [\"x\"]: the model has no linear layer named so"),
        ("--model llama-2-7b --mode full --generated 3", "--generated applies to --mode inference only"),
        ("--model llama-2-7b --mode inference --rank 4", "--rank applies to --mode lora only"),
        ("--model llama-2-7b --mode inference --trainer", "--trainer applies to --mode lora or full only"),
        (
            "--model llama-2-7b --mode full --trainer --dtype float16",
            "the gradient scaler refuses to unscale float16 gradients",
        ),
        ("--model llama-2-7b --mode full --trainer --optimizer-impl for-loop", "not for-loop"),
        ("--model llama-3.2-1b --mode qlora --trainer --batch 2 --context 2048", "--trainer with --mode qlora is not replayed yet"),
        (
            "--model llama-2-7b --mode full --optimizer adamw-8bit --optimizer-impl fused",
            "--optimizer-impl chooses torch.optim.AdamW's step: it does not apply to --optimizer adamw-8bit",
        ),
        ("--model llama-2-7b --mode inference --dtype float32", "float32 attention"),
        ("--model llama-2-7b --mode inference --batch 16777217", "batch must be between 1 and 16777216"),
        ("--model llama-2-7b --mode inference --generated 16385", "generated must be between 1 and 16384"),
        ("--model mixtral-8x7b --experts 100000000 --mode inference", "cannot be used with"),
        ("--model llama-2-7b --mode inference --reserve-gib 17179869183", "--reserve-gib 17179869183 is above 2^20 GiB"),
        ("--model llama-2-7b --tied-embeddings --mode inference", "cannot be used with"),
        (
            "--layers 4096 --hidden 16777216 --heads 65536 --intermediate 16777216 --vocab 16777216 --mode full --context 1",
            "`parameter count` = 8 071 013 619 657 080 832 is out of range (at most 2^50",
        ),
        (
            "--layers 4096 --hidden 64 --heads 1 --intermediate 64 --vocab 16777216 --mode inference --batch 4 --context 16777215",
            "is above 2^56 B = 64 PiB: no GPU holds it",
        ),
        ("--model llama-2-7b --mode inference --max-batch", "--fit"),
        ("--model llama-2-7b --mode lora --padded", "--padded training batches come from the Trainer's collator"),
        ("--model llama-2-7b --mode inference --padded --batch 1", "--padded pads the shorter rows of a batch"),
        (
            "--model llama-2-7b --mode inference --generated 4096 --fit --max-context",
            "--max-context: --generated 4096 leaves no context within the model's window of 4096 positions",
        ),
        // A negative value is the flag's, named.
        ("--model llama-2-7b --mode inference --reserve-gib -1", "--reserve-gib"),
        ("--model llama-2-7b --mode inference --max-gpus 2", "--fit"),
        ("--model llama-2-7b --mode inference --catalog data/tarifs-forfaits.csv", "--catalog is read by --fit and --plot only"),
        (
            "--model phi-3-mini --mode lora",
            "the default LoRA targets (--targets q,v) name q_proj and v_proj, which the model lacks",
        ),
    ];
    for &(flags, message) in cases {
        let context = if flags.contains("--context") {
            &[][..]
        } else {
            &["--context", "8"][..]
        };
        mm().arg("budget")
            .args(flags.split(' '))
            .args(context)
            .assert()
            .code(USAGE)
            .stderr(contains(message));
    }
}

#[test]
fn a_saved_budget_has_the_permissions_the_umask_gives() {
    let dir = tempfile::tempdir().unwrap();
    for (umask, mode) in [("022", 0o644), ("027", 0o640)] {
        let file = dir.path().join(format!("budget-{umask}.json"));
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
            .arg(assert_cmd::cargo::cargo_bin("mesure_memoire"))
            .args(["budget", "--model", "qwen2.5-0.5b", "--mode", "inference"])
            .args(["--context", "64", "--output"])
            .arg(&file)
            .current_dir(common::ROOT)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        use std::os::unix::fs::PermissionsExt;
        let got = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, mode, "umask {umask}: {got:o}");
    }
}

#[test]
fn a_saved_budget_is_planned_by_calcul_forfaits_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("budget.json");
    let mut args: Vec<String> = [
        "budget",
        "--model",
        "qwen2.5-7b",
        "--mode",
        "lora",
        "--context",
        "1024",
        "--checkpointing",
        "--output",
    ]
    .map(String::from)
    .to_vec();
    args.push(file.display().to_string());
    mm().args(&args)
        .assert()
        .success()
        .stdout(contains("Written to"));
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
    // A budget whose figures were edited is not what its workload gives: refused, not planned.
    let text = String::from_utf8(saved).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let total = v["total"]["bytes"].as_u64().unwrap();
    let edited = text.replacen(
        &format!("\"bytes\": {total}"),
        &format!("\"bytes\": {}", total - 1),
        1,
    );
    assert_ne!(edited, text);
    let bad = dir.path().join("edited.json");
    std::fs::write(&bad, edited).unwrap();
    cf().arg("--fit")
        .arg(&bad)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("is not a budget file"))
        .stderr(contains("`/total/bytes` is not what this version computes"));
    // Text a budget prints comes from its file: a control character in it is refused.
    let edited = text.replacen(
        "\"source\": \"qwen2.5-7b\"",
        "\"source\": \"qwen\\u001b[31m\"",
        1,
    );
    assert_ne!(edited, text);
    std::fs::write(&bad, edited).unwrap();
    cf().arg("--fit")
        .arg(&bad)
        .assert()
        .code(DATA_ERROR)
        .stdout("")
        .stderr(contains(
            "`/workload/source` holds the control character \\u{1b}",
        ));
}

#[test]
fn outputs_are_refused_before_any_work_and_long_names_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "budget",
        "--model",
        "qwen2.5-0.5b",
        "--mode",
        "inference",
        "--context",
        "64",
    ];
    // `--plot` naming `--output`'s file another way.
    let out = dir.path().join("same.json");
    let same = dir.path().join(".").join("same.json");
    mm().args(base)
        .arg("--output")
        .arg(&out)
        .arg("--plot")
        .arg(&same)
        .assert()
        .code(USAGE)
        .stderr(contains("--output and --plot name the same file"));
    assert!(!out.exists());
    // A folder that is a file.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    mm().args(base)
        .arg("--output")
        .arg(file.join("budget.json"))
        .assert()
        .code(USAGE)
        .stderr(contains("is a file, not a folder"));
    // The longest name a folder takes (255 bytes) is written, its temporary name within it.
    let long = dir.path().join(format!("{}.json", "b".repeat(250)));
    mm().args(base)
        .arg("--output")
        .arg(&long)
        .assert()
        .success();
    assert!(long.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".iteragpu-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A lot of more GPUs than `--max-gpus` is said to be above it, not short by nothing.
#[test]
fn a_lot_larger_than_max_gpus_is_not_tried() {
    let out = mm()
        .args([
            "budget",
            "--model",
            "llama-3.1-8b",
            "--mode",
            "full",
            "--context",
            "512",
        ])
        .args(["--fit", "--max-gpus", "1"])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with("a100-80"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("a lot holds more GPUs than --max-gpus"),
        "{row}"
    );
    assert!(!row.contains("short by 0.00"), "{row}");
}

/// `--max-context` searches within the model's window (`max_position_embeddings`), the tokens
/// generated included: where every card holds the whole window, each row says so.
#[test]
fn the_largest_context_is_searched_within_the_models_window() {
    let args = [
        "budget",
        "--model",
        "qwen2.5-0.5b",
        "--mode",
        "inference",
        "--context",
        "512",
        "--generated",
        "16",
    ];
    let largest = &json_of(mm().args(args).args(["--fit", "--max-context", "--json"]))["largest"];
    assert_eq!(largest["window"], 32768, "{largest}");
    assert_eq!(largest["limit"], 32768 - 16, "{largest}");
    let rows = largest["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["model"] == "h200"), "{largest}");
    for row in rows {
        assert_eq!(row["largest"], 32752, "{row}");
    }
    let out = mm()
        .args(args)
        .args(["--fit", "--max-context"])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.contains("h200                 139.80 GiB  32752 (the whole window)"),
        "{text}"
    );
    assert!(
        text.contains("32752 context tokens and the 16 generated make its 32768 positions (max_position_embeddings)"),
        "{text}"
    );
}

/// A padded batch (`--padded`) adds its mask: served, the causal mask of the padded rows at each
/// forward and each layer's bias; trained through the Trainer, every layer's bias kept for the
/// backward. The budget says what it assumed and where the rule comes from.
#[test]
fn a_padded_batch_adds_its_attention_mask_and_says_so() {
    let budget = |args: &[&str], padded: &[&str]| {
        let mut cmd = mm();
        cmd.args([
            "budget",
            "--model",
            "llama-3.2-1b",
            "--context",
            "2048",
            "--batch",
            "4",
        ])
        .args(args)
        .args(padded);
        cmd
    };
    let serve = ["--mode", "inference", "--generated", "16"];
    let train = ["--mode", "lora", "--trainer"];
    // Served, at least the mask: [4, 1, 2048, 2048] booleans, 16 MiB. Trained, at least each of
    // the 16 layers' bias, kept for the backward: [4, 1, 2048, 2048] in bfloat16, 32 MiB.
    for (args, more) in [(&serve[..], 16 << 20), (&train[..], 16 * (32 << 20))] {
        let peak = |padded: &[&str]| {
            let b = &json_of(budget(args, padded).arg("--json"))["budget"];
            (bytes(&b["peak_allocated"]), b["workload"]["padded"].clone())
        };
        let (plain, no) = peak(&[]);
        let (padded, yes) = peak(&["--padded"]);
        assert_eq!((no, yes), (false.into(), true.into()));
        assert!(padded >= plain + more, "{args:?}: {plain} then {padded}");
        let out = budget(args, &["--padded"]).assert().success();
        let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
        assert!(text.contains("A padded batch (--padded"), "{text}");
        assert!(
            text.contains("proven on 15 runs held out (data/hf-proof-padded-h100.json)"),
            "{text}"
        );
    }
}

/// `--max-length` stands for `--generated` (the prompt and the new tokens together), and
/// `--repetition-penalty` adds its processor's float32 copy of the logits, said in the title and
/// a note; refused outside serving or where nothing would be generated.
#[test]
fn generate_takes_max_length_and_a_repetition_penalty() {
    // A short prompt and a long generation for many rows: the run is fullest in a decode step.
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--model", "llama-3.2-1b", "--mode", "inference"])
            .args(["--context", "16", "--batch", "64"])
            .args(more);
        cmd
    };
    let figures = |more: &[&str]| {
        let b = &json_of(budget(more).arg("--json"))["budget"];
        (bytes(&b["peak_allocated"]), bytes(&b["peak_reserved"]))
    };
    assert_eq!(
        figures(&["--max-length", "272"]),
        figures(&["--generated", "256"])
    );
    let (plain, penalized) = (
        figures(&["--generated", "256"]).0,
        figures(&["--generated", "256", "--repetition-penalty", "1.1"]).0,
    );
    // At least the processed scores, held from token to token: 64 × 128 256 float32.
    assert!(
        penalized >= plain + 64 * 128_256 * 4,
        "{plain} then {penalized}"
    );
    assert_eq!(
        figures(&["--generated", "256", "--repetition-penalty", "1"]).0,
        plain,
        "a penalty of 1 is no processor"
    );
    budget(&["--generated", "256", "--repetition-penalty", "1.10"])
        .assert()
        .success()
        .stdout(contains("256 new tokens, repetition penalty 1.1"))
        .stdout(contains("A repetition penalty (--repetition-penalty)"));
    let mut full = mm();
    full.args([
        "budget",
        "--model",
        "llama-3.2-1b",
        "--mode",
        "full",
        "--context",
        "1024",
    ]);
    full.args(["--repetition-penalty", "1.1"]);
    for (mut cmd, says) in [
        (
            budget(&["--max-length", "16"]),
            "--max-length 16 leaves no token",
        ),
        (
            budget(&["--repetition-penalty", "0"]),
            "--repetition-penalty",
        ),
        (full, "--repetition-penalty applies to --mode inference"),
    ] {
        cmd.assert().code(USAGE).stderr(contains(says));
    }
}

/// `--optimizer adafactor` with `--trainer`: transformers' Adafactor keeps a row and a column of
/// float32 second moments per matrix where AdamW keeps two moments as large as each parameter,
/// said in the title, the TrainingArguments and a note; refused without the Trainer.
#[test]
fn the_trainers_adafactor_keeps_factored_moments() {
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args([
            "budget",
            "--model",
            "llama-3.2-1b",
            "--mode",
            "full",
            "--trainer",
        ])
        .args(["--batch", "2", "--context", "1024"])
        .args(more);
        cmd
    };
    let states = |more: &[&str]| {
        let doc = json_of(budget(more).arg("--json"));
        let terms = doc["budget"]["terms"].as_array().unwrap().clone();
        let t = terms
            .iter()
            .find(|t| t["key"] == "optimizer_states")
            .unwrap();
        (bytes(&t["bytes"]), bytes(&doc["budget"]["peak_allocated"]))
    };
    let (adamw, adamw_peak) = states(&[]);
    let (adafactor, adafactor_peak) = states(&["--optimizer", "adafactor"]);
    // Llama 3.2 1B: 1 235 814 400 parameters, two bfloat16 moments each with AdamW.
    assert_eq!(adamw, 1_235_814_400 * 2 * 2);
    assert!(adafactor * 1000 < adamw, "{adafactor} against {adamw}");
    assert!(
        adafactor_peak < adamw_peak,
        "{adafactor_peak} against {adamw_peak}"
    );
    budget(&["--optimizer", "adafactor"])
        .assert()
        .success()
        .stdout(contains("full training (adafactor)"))
        .stdout(contains("optim=\"adafactor\""));
    let mut by_hand = mm();
    by_hand
        .args(["budget", "--model", "llama-3.2-1b", "--mode", "full"])
        .args(["--context", "1024", "--optimizer", "adafactor"]);
    by_hand.assert().code(USAGE).stderr(contains(
        "--optimizer adafactor is replayed as transformers.Trainer builds it",
    ));
}

/// `--optimizer paged-adamw-8bit`: bitsandbytes' paged 8-bit AdamW keeps the moments of its large
/// parameters in CUDA unified memory, outside the allocator: the optimizer states term holds the
/// rest, and says how much is paged.
#[test]
fn the_paged_8_bit_adamw_keeps_large_moments_outside_the_allocator() {
    let figures = |optimizer: &str| {
        let doc = json_of(
            mm().args(["budget", "--model", "qwen2.5-0.5b", "--mode", "full"])
                .args([
                    "--trainer",
                    "--batch",
                    "2",
                    "--context",
                    "512",
                    "--optimizer",
                    optimizer,
                    "--json",
                ]),
        );
        let terms = doc["budget"]["terms"].as_array().unwrap().clone();
        let t = terms
            .iter()
            .find(|t| t["key"] == "optimizer_states")
            .unwrap()
            .clone();
        (
            bytes(&t["bytes"]),
            bytes(&doc["budget"]["peak_allocated"]),
            t,
        )
    };
    let (states, peak, _) = figures("adamw-8bit");
    let (paged_states, paged_peak, term) = figures("paged-adamw-8bit");
    // Qwen2.5 0.5B: 494 032 768 parameters; about 2 bytes of moments each leave the allocator.
    assert!(
        states - paged_states > 900_000_000,
        "{states} then {paged_states}"
    );
    assert!(paged_peak < peak, "{peak} then {paged_peak}");
    let formula = term["formula"].as_str().unwrap();
    assert!(
        formula.contains("paged in CUDA unified memory"),
        "{formula}"
    );
}

/// `--sample` draws each token from the softmax after the warpers its values turn on: top-p's
/// sort of every row's vocabulary and its temporaries, the probabilities and multinomial's noise,
/// said in the title and a note; refused outside serving, above PyTorch's in-place top-k, and
/// for a warper's value without it.
#[test]
fn generate_samples_with_the_warpers_asked_for() {
    // A short prompt and a long generation for many rows: the run is fullest in a decode step.
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--model", "llama-3.2-1b", "--mode", "inference"])
            .args(["--context", "16", "--batch", "64", "--generated", "256"])
            .args(more);
        cmd
    };
    let peak =
        |more: &[&str]| bytes(&json_of(budget(more).arg("--json"))["budget"]["peak_allocated"]);
    let items = 64 * 128_256;
    let greedy = peak(&[]);
    // The draw alone: at least the probabilities, float32, held from token to token.
    let drawn = peak(&["--sample", "--top-k", "0"]);
    assert!(drawn >= greedy + 4 * items, "{greedy} then {drawn}");
    // Top-p's sort of 64 rows: the sorted values and indices, the (row, index) pairs and their
    // sorted copy, cub's keys out and alternate keys and pairs: 44 bytes an item at least.
    let sorted = peak(&["--sample", "--top-k", "0", "--top-p", "0.9"]);
    assert!(sorted >= greedy + 44 * items, "{greedy} then {sorted}");
    budget(&["--sample", "--temperature", "0.7", "--top-p", "0.90"])
        .assert()
        .success()
        .stdout(contains(
            "256 new tokens, sampling (temperature 0.7, top_k 50, top_p 0.9)",
        ))
        .stdout(contains(
            "Sampling (--sample: temperature 0.7, top_k 50, top_p 0.9)",
        ));
    let mut full = mm();
    full.args(["budget", "--model", "llama-3.2-1b", "--mode", "full"])
        .args(["--context", "1024", "--sample"]);
    for (mut cmd, says) in [
        (budget(&["--sample", "--top-k", "5000"]), "--top-k 5000"),
        (budget(&["--temperature", "0.7"]), "--sample"),
        (budget(&["--sample", "--top-p", "1.5"]), "--top-p"),
        (full, "--sample applies to --mode inference"),
    ] {
        cmd.assert().code(USAGE).stderr(contains(says));
    }
}

/// `--num-beams`: the prompt's rows repeated for each beam, so one row searched over 4 beams
/// holds the KV cache of 4 rows and more than greedy decoding of 4 rows (the sequences, the
/// candidates, the cache gathered anew); refused in training, naming the flag.
#[test]
fn generate_searches_with_the_beams_asked_for() {
    let budget = |batch: &str, more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--model", "llama-3.2-1b", "--mode", "inference"])
            .args(["--context", "512", "--generated", "64", "--batch", batch])
            .args(more)
            .arg("--json");
        json_of(&mut cmd)
    };
    let greedy = budget("4", &[]);
    let beams = budget("1", &["--num-beams", "4"]);
    assert_eq!(
        bytes(&kv_term(&beams)["bytes"]),
        bytes(&kv_term(&greedy)["bytes"])
    );
    let peak = |j: &serde_json::Value| bytes(&j["budget"]["peak_allocated"]);
    assert!(
        peak(&beams) > peak(&greedy),
        "{} against {}",
        peak(&beams),
        peak(&greedy)
    );
    assert_eq!(beams["budget"]["workload"]["beams"], 4);
    let mut full = mm();
    full.args(["budget", "--model", "llama-3.2-1b", "--mode", "full"])
        .args(["--context", "1024", "--num-beams", "2"]);
    full.assert()
        .code(USAGE)
        .stderr(contains("--num-beams applies to --mode inference"));
}

/// `--cache-implementation offloaded`: the cache's full layers wait on the CPU, so a long
/// generation holds far less on the GPU than with the dynamic cache, and the KV term says where
/// the rest is; refused in training, naming the flag.
#[test]
fn the_offloaded_cache_keeps_one_full_layer_on_the_gpu() {
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--model", "llama-3.1-8b", "--mode", "inference"])
            .args(["--context", "32768", "--generated", "16", "--batch", "1"])
            .args(more)
            .arg("--json");
        json_of(&mut cmd)
    };
    let (dynamic, offloaded) = (
        budget(&[]),
        budget(&["--cache-implementation", "offloaded"]),
    );
    // 32 layers of 32 783 tokens × 8 KV heads × 128 × 2 (K and V) × 2 bytes: one on the GPU.
    let layer: u64 = 32_783 * 8 * 128 * 2 * 2;
    assert_eq!(bytes(&kv_term(&dynamic)["bytes"]), 32 * layer);
    assert_eq!(bytes(&kv_term(&offloaded)["bytes"]), layer);
    assert!(kv_term(&offloaded)["formula"]
        .as_str()
        .unwrap()
        .contains("on the CPU"));
    let peak = |j: &serde_json::Value| bytes(&j["budget"]["peak_allocated"]);
    assert!(
        peak(&offloaded) + 28 * layer < peak(&dynamic),
        "{} against {}",
        peak(&offloaded),
        peak(&dynamic)
    );
    let mut full = mm();
    full.args(["budget", "--model", "llama-3.2-1b", "--mode", "full"])
        .args(["--context", "1024", "--cache-implementation", "offloaded"]);
    full.assert().code(USAGE).stderr(contains(
        "--cache-implementation applies to --mode inference",
    ));
}

/// `--max-batch` where no batch holds on one GPU of a model: the largest on the fewest GPUs of
/// it the plan spreads the training over, every rank replayed; the plan itself agrees (at that
/// batch it holds on those GPUs, at the next it needs more).
#[test]
fn the_largest_batch_is_searched_over_the_gpus_the_plan_spreads_it_over() {
    let budget = |batch: &str, more: &[&str]| {
        let mut cmd = mm();
        cmd.args([
            "budget",
            "--model",
            "llama-3.1-8b",
            "--mode",
            "full",
            "--checkpointing",
        ])
        .args(["--context", "1024", "--batch", batch, "--fit", "--json"])
        .args(more);
        json_of(&mut cmd)
    };
    let doc = budget("1", &["--max-batch"]);
    let rows = doc["largest"]["rows"].as_array().unwrap();
    let a40 = rows.iter().find(|r| r["model"] == "a40").unwrap();
    assert!(a40["largest"].is_null(), "{a40}");
    let spread = &a40["spread"];
    assert_eq!(spread["strategy"], "fsdp2");
    let (gpus, largest) = (
        spread["gpus"].as_u64().unwrap(),
        spread["largest"].as_u64().unwrap(),
    );
    assert!(gpus > 1 && largest > 1, "{spread}");
    let gpus_at = |batch: u64| {
        let plan = budget(&batch.to_string(), &[]);
        let rows = plan["plan"]["rows"].as_array().unwrap().clone();
        let row = rows.into_iter().find(|r| r["model"] == "a40").unwrap();
        row["fit"]["gpus"].as_u64()
    };
    assert_eq!(gpus_at(largest), Some(gpus));
    assert!(gpus_at(largest + 1).is_none_or(|g| g > gpus));
    // As text: the batch, its GPUs and how they were found.
    let mut text = mm();
    text.args([
        "budget",
        "--model",
        "llama-3.1-8b",
        "--mode",
        "full",
        "--checkpointing",
    ])
    .args(["--context", "1024", "--fit", "--max-batch"]);
    text.assert().success().stdout(contains(format!(
        "{largest} on {gpus} GPUs (FSDP2 ranks replayed)"
    )));
}

/// A model folder's `generation_config.json` gives `generate` its defaults as transformers applies
/// them (sampling with its warpers, a repetition penalty, beams) where no flag gives them, and
/// the budget says so; `--greedy` and the flags come first; a training reads none; a file that
/// lies is refused naming it.
#[test]
fn a_model_folders_generation_config_gives_generate_its_defaults() {
    let dir = tempfile::tempdir().unwrap();
    model_folder(dir.path(), false);
    let file = dir.path().join("generation_config.json");
    std::fs::write(
        &file,
        r#"{"do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
            "repetition_penalty": 1.05}"#,
    )
    .unwrap();
    let budget = |mode: &str, more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--config"])
            .arg(dir.path())
            .args(["--mode", mode, "--context", "64"])
            .args(more);
        cmd
    };
    budget("inference", &[])
        .assert()
        .success()
        .stdout(contains(
            "repetition penalty 1.05, sampling (temperature 0.7, top_k 20, top_p 0.8)",
        ))
        .stdout(contains(
            "generation_config.json (do_sample true, temperature 0.7",
        ));
    budget(
        "inference",
        &["--sample", "--top-k", "0", "--repetition-penalty", "1"],
    )
    .assert()
    .success()
    .stdout(contains("sampling (temperature 0.7, top_p 0.8)"));
    let out = budget("inference", &["--greedy"]).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(!text.contains("sampling ("), "{text}");
    let out = budget("lora", &[]).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(!text.contains("generation_config"), "{text}");
    std::fs::write(&file, r#"{"do_sample": 1}"#).unwrap();
    budget("inference", &[])
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("generation_config.json"))
        .stderr(contains("`do_sample` must be true or false"));
    // The model's num_beams searches unless the flag says otherwise.
    std::fs::write(&file, r#"{"num_beams": 4}"#).unwrap();
    budget("inference", &[])
        .assert()
        .success()
        .stdout(contains("beam search over 4 beams"))
        .stdout(contains("× 4 beams"));
    // Three end-of-sequence tokens: four candidates for each beam rather than two.
    std::fs::write(&file, r#"{"num_beams": 4, "eos_token_id": [1, 2, 3]}"#).unwrap();
    budget("inference", &[])
        .assert()
        .success()
        .stdout(contains("3 end-of-sequence tokens"))
        .stdout(contains("4 candidates for each beam"));
    let out = budget("inference", &["--num-beams", "1"])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(!text.contains("beam search"), "{text}");
    // Gemma 2's file names a static cache ("hybrid"): generate would compile its decoding step,
    // which is not emulated; refused, unless the flag names the cache the call makes.
    std::fs::write(&file, r#"{"cache_implementation": "hybrid"}"#).unwrap();
    budget("inference", &[])
        .assert()
        .code(USAGE)
        .stderr(contains(
            "the model's generation_config.json sets cache_implementation \"hybrid\"",
        ))
        .stderr(contains("torch.compile"))
        .stderr(contains("--cache-implementation dynamic"));
    for cache in ["dynamic", "offloaded"] {
        budget("inference", &["--cache-implementation", cache])
            .assert()
            .success();
    }
    budget("inference", &["--cache-implementation", "static"])
        .assert()
        .code(USAGE)
        .stderr(contains(
            "--cache-implementation static: generate allocates",
        ));
    std::fs::write(&file, r#"{"cache_implementation": "offloaded"}"#).unwrap();
    budget("inference", &[])
        .assert()
        .success()
        .stdout(contains("cache_implementation offloaded"));
}

/// `--padding-free`: TRL's collator flattens each batch into one row and the attention runs
/// under the packed sequences' block-diagonal mask (`[1, 1, tokens, tokens]` booleans, then each
/// layer's additive copy kept for the backward): the title says so, the peak holds at least the
/// mask more than the same batch padded; refused without --sft, with --padded, and for a model
/// with sliding-window layers, naming the flag.
#[test]
fn padding_free_batches_are_one_row_under_a_block_diagonal_mask() {
    let budget = |model: &str, more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--model", model, "--mode", "lora", "--sft"])
            .args(["--batch", "4", "--context", "1024"])
            .args(more);
        cmd
    };
    let peak = |more: &[&str]| {
        bytes(&json_of(budget("llama-3.2-1b", more).arg("--json"))["budget"]["peak_allocated"])
    };
    let tokens: u64 = 4 * 1024;
    let (rows, flat) = (peak(&[]), peak(&["--padding-free"]));
    assert!(flat >= rows + tokens * tokens, "{rows} then {flat}");
    budget("llama-3.2-1b", &["--padding-free"])
        .assert()
        .success()
        .stdout(contains("padding-free (one row of 4 096 tokens)"))
        .stdout(contains("block-diagonal causal mask"));
    for (mut cmd, says) in [
        (
            budget("gemma-2-2b", &["--padding-free"]),
            "--padding-free is replayed for models without",
        ),
        (
            budget("llama-3.2-1b", &["--padding-free", "--padded"]),
            "--padding-free pads nothing",
        ),
    ] {
        cmd.assert().code(USAGE).stderr(contains(says));
    }
    let mut trainer = mm();
    trainer
        .args([
            "budget",
            "--model",
            "llama-3.2-1b",
            "--mode",
            "lora",
            "--trainer",
        ])
        .args(["--context", "1024", "--padding-free"]);
    trainer.assert().code(USAGE).stderr(contains("--sft"));
}

/// `--sft`: TRL's fused head never makes the `[batch, sequence, vocabulary]` logits the Trainer's
/// loss makes (and converts to float32), said in the title and a note; refused where it is not
/// replayed, naming the flag.
#[test]
fn the_sft_trainer_makes_no_logits_and_says_so() {
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args([
            "budget",
            "--model",
            "llama-3.2-1b",
            "--context",
            "1024",
            "--batch",
            "4",
        ])
        .args(more);
        cmd
    };
    let peak =
        |more: &[&str]| bytes(&json_of(budget(more).arg("--json"))["budget"]["peak_allocated"]);
    for mode in ["lora", "full"] {
        let (trainer, sft) = (
            peak(&["--mode", mode, "--trainer"]),
            peak(&["--mode", mode, "--sft"]),
        );
        // At least one float32 copy of the logits: 4 × 1 024 × 128 256 × 4 B.
        let logits = 4 * 1024 * 128_256 * 4;
        assert!(
            sft + logits <= trainer,
            "{mode}: {sft} against the Trainer's {trainer}"
        );
    }
    let out = budget(&["--mode", "lora", "--sft"]).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains(", TRL SFTTrainer"), "{text}");
    assert!(text.contains("TRL's SFTTrainer (--sft"), "{text}");
    assert!(text.contains("TrainingArguments assumed"), "{text}");
    let sft = &json_of(budget(&["--mode", "lora", "--sft"]).arg("--json"))["budget"]["workload"];
    assert_eq!((&sft["sft"], &sft["trainer"]), (&true.into(), &true.into()));
    for (more, says) in [
        (
            &["--mode", "inference", "--sft"][..],
            "--sft applies to --mode lora or full",
        ),
        (
            &["--mode", "full", "--autocast", "bfloat16", "--sft"][..],
            "--sft over float32",
        ),
    ] {
        budget(more).assert().code(USAGE).stderr(contains(says));
    }
}

/// `--completion-tokens N` (TRL's completion-only loss): the SFTTrainer's fused head gathers
/// and scores batch × N labelled positions instead of every one: its tiles, of as many rows as
/// positions up to 4 096, shrink, and so does the peak where the head is the largest part.
#[test]
fn the_completion_alone_labelled_makes_the_sft_head_score_fewer_positions() {
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args([
            "budget",
            "--model",
            "qwen2.5-0.5b",
            "--mode",
            "lora",
            "--sft",
        ])
        .args(["--context", "2048", "--batch", "4"])
        .args(more);
        cmd
    };
    let doc = |more: &[&str]| json_of(budget(more).arg("--json"));
    let (every, completion) = (doc(&[]), doc(&["--completion-tokens", "256"]));
    let peak = |d: &serde_json::Value| bytes(&d["budget"]["peak_allocated"]);
    assert!(
        peak(&completion) < peak(&every),
        "{} then {}",
        peak(&every),
        peak(&completion)
    );
    assert_eq!(completion["budget"]["workload"]["completion_tokens"], 256);
    let out = budget(&["--completion-tokens", "256"]).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.contains("loss on the last 256 tokens of each row"),
        "{text}"
    );
    assert!(
        text.contains("1 024 positions labelled a batch (batch × 256)"),
        "{text}"
    );
    budget(&["--completion-tokens", "2048"])
        .assert()
        .code(USAGE)
        .stderr(contains(
            "--completion-tokens 2048: a completion of 1 to 2 047 tokens follows a prompt of at least one within --context 2 048",
        ));
}

/// `--lora-dropout`: each adapter's dropout mask (a byte an element of its input) kept for the
/// backward, said in the title and a note; refused outside LoRA and outside [0, 1).
#[test]
fn lora_dropout_keeps_its_masks_and_says_so() {
    let budget = |more: &[&str]| {
        let mut cmd = mm();
        cmd.args(["budget", "--model", "llama-3.2-1b", "--mode", "lora"])
            .args(["--context", "2048", "--batch", "4", "--targets", "q,k,v,o"])
            .args(more);
        cmd
    };
    let peak =
        |more: &[&str]| bytes(&json_of(budget(more).arg("--json"))["budget"]["peak_allocated"]);
    let (plain, dropped) = (peak(&[]), peak(&["--lora-dropout", "0.05"]));
    // The masks of the 61 adapted inputs that need a gradient (all but the first layer's q, k
    // and v; each adapter has its own), [4, 2048, 2048] booleans, 16 MiB each.
    assert!(dropped >= plain + 61 * (16 << 20), "{plain} then {dropped}");
    assert_eq!(
        peak(&["--lora-dropout", "0"]),
        plain,
        "a dropout of 0 is PEFT's nn.Identity"
    );
    budget(&["--lora-dropout", "0.050"])
        .assert()
        .success()
        .stdout(contains("LoRA rank 16 with dropout 0.05,"))
        .stdout(contains("LoRA dropout (--lora-dropout)"));
    let mut full = mm();
    full.args([
        "budget",
        "--model",
        "llama-3.2-1b",
        "--mode",
        "full",
        "--context",
        "2048",
    ]);
    full.args(["--lora-dropout", "0.1"]);
    for (mut cmd, says) in [
        (budget(&["--lora-dropout", "1"]), "--lora-dropout"),
        (budget(&["--lora-dropout", "-0.1"]), "--lora-dropout"),
        (full, "--lora-dropout applies to --mode lora"),
    ] {
        cmd.assert().code(USAGE).stderr(contains(says));
    }
}

/// SIGTERM ends a program with the documented 130, leaving no partial file.
#[test]
fn sigterm_ends_with_130_and_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b.json");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("mesure_memoire"))
        .args([
            "budget",
            "--model",
            "llama-3.1-70b",
            "--mode",
            "inference",
            "--context",
            "8192",
        ])
        .args(["--generated", "16384", "--fit", "--output"])
        .arg(&out)
        .current_dir(common::ROOT)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A config.json transformers cannot run is a data error naming the file and the key; a
/// checkpoint that is not a regular file is refused as such, never waited on.
#[test]
fn model_files_that_cannot_run_or_be_read_are_data_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    model_folder(dir.path(), false);
    let args = ["--mode", "inference", "--context", "64"];
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3"),
    )
    .unwrap();
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("config.json"))
        .stderr(contains("`num_key_value_heads` (3)"));
    std::fs::write(&config, text).unwrap();
    let st = dir.path().join("model.safetensors");
    std::fs::remove_file(&st).unwrap();
    common::mkfifo(&st);
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .timeout(common::PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("it is a named pipe, not a regular file"));
    std::fs::remove_file(&st).unwrap();
    std::fs::create_dir(&st).unwrap();
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("it is a folder, not a regular file"));
    std::fs::remove_dir(&st).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &st).unwrap();
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .timeout(common::PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("it is a device, not a regular file"));
    // DeepSeek-V3's router needs groups of equal size.
    let v3 = dir.path().join("v3.json");
    std::fs::write(
        &v3,
        serde_json::json!({
            "model_type": "deepseek_v3", "vocab_size": 256, "hidden_size": 64,
            "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "n_routed_experts": 6, "n_group": 4, "topk_group": 2,
            "num_experts_per_tok": 2, "q_lora_rank": 16, "kv_lora_rank": 16
        })
        .to_string(),
    )
    .unwrap();
    mm().args(["budget", "--config"])
        .arg(&v3)
        .args(args)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("`n_group` (4) must divide `n_routed_experts` (6)"));
}

#[test]
fn a_bad_budget_file_is_a_data_error_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.json");
    std::fs::write(
        &file,
        "{\"schema\": \"iteragpu-lab/budget/3\",\n \"workload\": 7}",
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
        .stdout(contains("deepseek-v2-lite"));
}

#[test]
fn a_presets_file_is_refused_naming_its_line() {
    let shipped = std::fs::read_to_string(format!("{}/data/modeles.csv", common::ROOT)).unwrap();
    let mut lines = shipped.lines();
    let (header, first, second) = (
        lines.next().unwrap(),
        lines.next().unwrap(),
        lines.next().unwrap(),
    );
    let renamed = |name: &str| first.replacen("llama-2-7b", name, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("presets.csv");
    for (text, said) in [
        (String::new(), "line 1: holds no preset"),
        (format!("{header}\n"), "line 1: holds no preset"),
        (
            format!("{header}\n{}\n", renamed(" llama-2-7b")),
            "line 2: preset name ` llama-2-7b`",
        ),
        (
            format!("{header}\n{}\n", renamed("Llama-2-7B")),
            "line 2: preset name `Llama-2-7B`",
        ),
        (
            format!("{header}\n{}\n", renamed("llama\u{1b}[31m")),
            "preset name `llama\\u{1b}[31m`",
        ),
        // A blank line does not shift the line named.
        (
            format!("{header}\n{first}\n\n{first}\n"),
            "line 4: preset \"llama-2-7b\" appears twice",
        ),
        (
            format!(
                "{header}\n{second}\n{}\n",
                first.replacen(",6738415616,", ",6738415617,", 1)
            ),
            "line 3: preset llama-2-7b: parameters 6738415617 differs",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        mm().args(["budget", "--list-models", "--models"])
            .arg(&file)
            .assert()
            .code(DATA_ERROR)
            .stdout("")
            .stderr(contains(said));
    }
}

/// Every block of docs/budget-vs-guide.md that starts with `$ mesure_memoire …` or
/// `$ calcul_forfaits …` is what that command prints: its lines, in order, among the output's
/// (a `| grep` or `| head` after the command only selects lines; `2>&1; echo "exit $?"` adds the
/// exit status).
#[test]
fn the_guide_page_and_the_readme_show_what_the_programs_print() {
    assert!(shown_commands("docs/budget-vs-guide.md") >= 10);
    assert_eq!(shown_commands("README.md"), 4);
}

/// Runs every `$ mesure_memoire …` or `$ calcul_forfaits …` that the page `doc` shows in a code
/// block and checks that each line shown after it was printed, in that order (`…` stands for
/// lines left out); returns how many commands were run.
fn shown_commands(doc: &str) -> usize {
    const STATUS: &str = "; echo \"exit $?\"";
    let page = std::fs::read_to_string(format!("{}/{doc}", common::ROOT)).expect("the page");
    let mut blocks = 0;
    let mut lines = page.lines().enumerate();
    while let Some((_, line)) = lines.next() {
        if !line.trim_start().starts_with("```") {
            continue;
        }
        let body: Vec<(usize, &str)> = lines
            .by_ref()
            .take_while(|(_, l)| !l.trim_start().starts_with("```"))
            .collect();
        // A block may show several commands, each followed by what it printed.
        let mut rest = body.as_slice();
        while let Some(((at, first), after)) = rest.split_first() {
            let next = after
                .iter()
                .position(|(_, l)| l.starts_with("$ "))
                .unwrap_or(after.len());
            let (shown, later) = after.split_at(next);
            rest = later;
            let Some(line) = first.strip_prefix("$ ") else {
                continue;
            };
            let (command, with_status) = match line.split_once(" 2>&1") {
                Some((c, tail)) => (c, tail == STATUS),
                None => (line.split(" | ").next().unwrap_or(line), false),
            };
            let mut words = command.split_whitespace();
            let mut cmd = match words.next() {
                Some("mesure_memoire") => mm(),
                Some("calcul_forfaits") => cf(),
                _ => continue,
            };
            assert!(
                !command.contains(['"', '\'', '\\', '>', ';']),
                "{doc}:{}: the check runs plain words only",
                at + 1
            );
            let out = cmd.args(words).output().expect("the program runs");
            let mut printed = String::from_utf8_lossy(&out.stdout).to_string();
            if with_status {
                printed += &String::from_utf8_lossy(&out.stderr);
                printed += &format!("exit {}\n", out.status.code().unwrap_or(-1));
            }
            let mut printed_lines = printed.lines();
            for (n, l) in shown
                .iter()
                .filter(|(_, l)| !l.trim().is_empty() && l.trim() != "…")
            {
                assert!(
                    printed_lines.any(|p| p.trim_end() == l.trim_end()),
                    "{doc}:{}: not printed (in this order) by `{command}`:\n{l}\n\
                     --- the program printed:\n{printed}",
                    n + 1
                );
            }
            blocks += 1;
        }
    }
    blocks
}

/// `--gpus N`: a training spread by FSDP2 over N GPUs, rank 0 and the last rank replayed (each
/// running the batch), in the JSON under `sharded`: each GPU's need is the busier rank's, what its
/// blocks held at its fullest sums to its peak of `reserved`'s allocated part, and the shards make
/// a rank hold less than the one-GPU budget. A run FSDP2 is not replayed for, or one GPU, refused.
#[test]
fn gpus_gives_a_rank_of_tensor_parallelism_serving_a_model() {
    // Llama 3.1 70B's 8 key-value heads split over 8 of 12 GPUs; rank 0 replayed, every rank
    // alike.
    let args = [
        "budget",
        "--model",
        "llama-3.1-70b",
        "--mode",
        "inference",
        "--batch",
        "4",
        "--context",
        "2048",
        "--generated",
        "64",
        "--gpus",
        "12",
    ];
    let v = json_of(mm().args(args).arg("--json"));
    let s = &v["sharded"];
    let ranks = one_rank_replayed(s, 12, 8, "tensor_parallel");
    assert_eq!(bytes(&ranks[0]["need_per_gpu"]), bytes(&s["need_per_gpu"]));
    // A rank holds an eighth of the layers' weights and of the KV cache, the embeddings whole.
    assert!(bytes(&ranks[0]["peak_reserved"]) < bytes(&v["budget"]["peak_reserved"]) / 6);
    mm().args(args)
        .assert()
        .success()
        .stdout(contains("Tensor parallelism over 8 of 12 GPUs"));
    // Named, the way must be the one replayed for the run.
    mm().args(args)
        .args(["--parallel", "tp"])
        .assert()
        .success();
    for (way, says) in [
        ("fsdp", "--parallel fsdp: FSDP2 is replayed for a training"),
        ("ddp", "--parallel ddp: DDP is replayed for a full training"),
        ("layers", "--parallel layers: not yet replayed"),
    ] {
        mm().args(args)
            .args(["--parallel", way])
            .assert()
            .code(USAGE)
            .stderr(contains(says));
    }
    // Several counts: each count's need beside the split rule's estimate.
    let mut several = args.to_vec();
    *several.last_mut().unwrap() = "2,4,8";
    let v = json_of(mm().args(&several).arg("--json"));
    let rows = v["spread"]["rows"].as_array().unwrap();
    let gpus: Vec<u64> = rows.iter().map(|r| r["gpus"].as_u64().unwrap()).collect();
    assert_eq!(gpus, [2, 4, 8]);
    let replayed: Vec<u64> = (rows.iter())
        .map(|r| r["replayed"]["bytes"].as_u64().unwrap())
        .collect();
    assert!(replayed.windows(2).all(|w| w[1] < w[0]), "{replayed:?}");
    assert!(v.get("sharded").is_none());
    *several.last_mut().unwrap() = "2,5000";
    mm().args(&several)
        .assert()
        .code(USAGE)
        .stderr(contains("--gpus: 5000 is not a count of 2 to 4096 GPUs"));
}

#[test]
fn gradient_accumulation_runs_every_batch_of_a_step_through_the_trainer() {
    let args = [
        "budget",
        "--model",
        "llama-3.2-1b",
        "--mode",
        "full",
        "--context",
        "1024",
        "--batch",
        "2",
        "--trainer",
        "--json",
    ];
    let needed = |v: &serde_json::Value| v["budget"]["needed"]["bytes"].as_u64().unwrap();
    let one = json_of(mm().args(args));
    let four = json_of(mm().args(args).args(["--gradient-accumulation", "4"]));
    assert_eq!(four["budget"]["workload"]["accumulation"], 4);
    // From the second batch of a step on, the forward runs beside the gradients of the first.
    assert!(
        needed(&four) > needed(&one),
        "{} against {}",
        needed(&four),
        needed(&one)
    );
    mm().args(&args[..args.len() - 1])
        .args(["--gradient-accumulation", "4"])
        .assert()
        .success()
        .stdout(contains(
            "transformers Trainer, gradients accumulated over 4 batches",
        ))
        .stdout(contains(
            "TrainingArguments assumed: per_device_train_batch_size=2, bf16=True, \
             optim=\"adamw_torch_fused\", max_grad_norm=1.0 (0 allocates the same: the \
             Trainer still computes the gradients' norm for its logs), \
             gradient_accumulation_steps=4, gradient_checkpointing=False, one process",
        ));
    mm().args(&args[..args.len() - 2])
        .args(["--gradient-accumulation", "4"])
        .assert()
        .code(USAGE)
        .stderr(contains("--trainer"));
    mm().args(args)
        .args(["--gradient-accumulation", "5000"])
        .assert()
        .code(USAGE)
        .stderr(contains(
            "--gradient-accumulation must be between 1 and 4096, not 5000",
        ));
}

#[test]
fn the_trainer_under_fp16_scales_its_loss_and_refuses_float16_gradients() {
    let args = [
        "budget",
        "--model",
        "llama-3.2-1b",
        "--batch",
        "1",
        "--context",
        "1024",
        "--trainer",
    ];
    mm().args(args)
        .args([
            "--mode",
            "full",
            "--dtype",
            "float32",
            "--autocast",
            "float16",
        ])
        .assert()
        .success()
        .stdout(contains("float32 weights under float16 autocast"))
        .stdout(contains(
            "fp16=True (autocast to float16, its gradient scaler)",
        ));
    mm().args(args)
        .args(["--mode", "lora", "--dtype", "float16"])
        .assert()
        .success();
    mm().args(args)
        .args(["--mode", "full", "--dtype", "float16"])
        .assert()
        .code(USAGE)
        .stderr(contains(
            "the gradient scaler refuses to unscale float16 gradients",
        ));
}

/// The exact bytes of a figure of the JSON (`{"bytes": …, "gib": …, "gb": …}`).
/// The KV cache's term of a `budget --json` document.
fn kv_term(doc: &serde_json::Value) -> &serde_json::Value {
    let terms = doc["budget"]["terms"].as_array().unwrap();
    terms.iter().find(|t| t["key"] == "kv_cache").unwrap()
}

fn bytes(figure: &serde_json::Value) -> u64 {
    figure["bytes"].as_u64().unwrap()
}

/// The ranks of `budget --gpus --json`'s `sharded`, checked to be rank 0 alone of `gpus` GPUs
/// spread over `world` ranks by `strategy` (every rank allocating alike).
fn one_rank_replayed<'a>(
    s: &'a serde_json::Value,
    gpus: u64,
    world: u64,
    strategy: &str,
) -> &'a Vec<serde_json::Value> {
    assert_eq!(
        (
            s["gpus"].as_u64(),
            s["world"].as_u64(),
            s["strategy"].as_str()
        ),
        (Some(gpus), Some(world), Some(strategy))
    );
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 1);
    assert_eq!(ranks[0]["rank"], 0);
    ranks
}

#[test]
fn gpus_with_parallel_ddp_gives_rank_0_of_a_replicated_training() {
    let args = [
        "budget",
        "--model",
        "llama-3.2-1b",
        "--mode",
        "full",
        "--batch",
        "2",
        "--context",
        "512",
        "--gpus",
        "4",
        "--parallel",
        "ddp",
    ];
    let v = json_of(mm().args(args).arg("--json"));
    let s = &v["sharded"];
    let ranks = one_rank_replayed(s, 4, 4, "ddp");
    // Every rank holds the whole model, and its gradients' buckets besides what one GPU holds.
    let (one_gpu, rank) = (
        bytes(&v["budget"]["peak_allocated"]),
        bytes(&ranks[0]["peak_allocated"]),
    );
    let weights = bytes(&v["budget"]["terms"][0]["bytes"]);
    assert!(rank >= one_gpu + weights / 2, "{rank} against {one_gpu}");
    assert!(s["rule"]
        .as_str()
        .unwrap()
        .contains("data/hf-proof-ddp-h200.json"));
    mm().args(args).assert().success().stdout(contains(
        "DDP over 4 GPUs, every rank holding the whole model",
    ));
    let mut several = args.to_vec();
    several[10] = "4,8";
    mm().args(&several)
        .assert()
        .code(USAGE)
        .stderr(contains("--parallel ddp: every GPU holds the whole model"));
    let mut qlora = args.to_vec();
    (qlora[4], qlora[8]) = ("qlora", "2048");
    mm().args(&qlora).assert().code(USAGE).stderr(contains(
        "--parallel ddp: DDP is replayed for a full training",
    ));
}

#[test]
fn gpus_gives_each_rank_of_an_fsdp2_training() {
    let args = [
        "budget",
        "--model",
        "llama-3.1-8b",
        "--mode",
        "full",
        "--checkpointing",
        "--batch",
        "1",
        "--context",
        "512",
        "--json",
        "--gpus",
        "8",
    ];
    let v = json_of(mm().args(args));
    let s = &v["sharded"];
    assert_eq!(
        (s["gpus"].as_u64(), s["strategy"].as_str()),
        (Some(8), Some("fsdp2"))
    );
    // Over 8, every first dimension of Llama 3.1 8B is a multiple of the world: every rank holds
    // as many rows, alike, and rank 0 stands for all; over 6 the last rank holds fewer.
    let ranks = s["ranks"].as_array().unwrap();
    let numbers = |ranks: &[serde_json::Value]| -> Vec<u64> {
        ranks.iter().map(|r| r["rank"].as_u64().unwrap()).collect()
    };
    assert_eq!(numbers(ranks), [0]);
    let mut over_six = args.to_vec();
    over_six[12] = "6";
    let six = json_of(mm().args(&over_six));
    let six_ranks = six["sharded"]["ranks"].as_array().unwrap();
    assert_eq!(numbers(six_ranks), [0, 5]);
    let busiest = ranks.iter().map(|r| bytes(&r["need_per_gpu"])).max();
    assert_eq!(busiest, Some(bytes(&s["need_per_gpu"])));
    for r in ranks.iter().chain(six_ranks) {
        let held: u64 = r["at_peak"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| bytes(&h["bytes"]))
            .sum();
        assert!(held > 0 && held <= bytes(&r["peak_reserved"]));
        assert!(bytes(&r["peak_reserved"]) < bytes(&v["budget"]["peak_reserved"]) / 4);
    }
    mm().args(&args[..args.len() - 3])
        .args(["--gpus", "8"])
        .assert()
        .success()
        .stdout(contains(
            "FSDP2 over 8 GPUs, each rank running the batch (every rank holding as many rows \
             of each shard, alike: rank 0 replayed)",
        ));
    mm().args(&args[..args.len() - 1])
        .arg("1")
        .assert()
        .code(USAGE)
        .stderr(contains("--gpus: 1 is not a count of 2 to 4096 GPUs"));
    mm().args([
        "budget",
        "--model",
        "llama-3.1-8b",
        "--mode",
        "qlora",
        "--context",
        "2048",
    ])
    .args(["--gpus", "2"])
    .assert()
    .code(USAGE)
    .stderr(contains("--gpus: FSDP2 is replayed for a full training"));
}

/// `mesure_memoire budget --config DIR ARGS`, `config` written as DIR's `config.json`.
fn budget_of_config(config: &serde_json::Value, args: &[&str]) -> assert_cmd::assert::Assert {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    mm().args(["budget", "--config"])
        .arg(dir.path())
        .args(args)
        .assert()
}

/// The budget of `config` with `args`, in JSON (the run succeeds).
fn budget_json_of_config(config: &serde_json::Value, args: &[&str]) -> serde_json::Value {
    let args = [args, &["--json"]].concat();
    let out = budget_of_config(config, &args).success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

/// A GLM-4 `config.json` as transformers 5 saves it (its partial rotary factor among the rope
/// parameters) is read as `Glm4Config` reads it: its defaults (two key-value heads, heads of 128,
/// biased q, k and v), the rotary over half of each head; the budget says what its replay was
/// derived from and the runs held out that prove it.
#[test]
fn a_glm4_config_is_replayed_and_says_its_replay_is_proven() {
    let config = serde_json::json!({
        "model_type": "glm4", "vocab_size": 151552, "hidden_size": 4096,
        "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5},
        "max_position_embeddings": 32768, "pad_token_id": 151329, "tie_word_embeddings": false
    });
    let args = ["--mode", "inference", "--context", "1024"];
    let budget = budget_json_of_config(&config, &args);
    let model = &budget["budget"]["workload"]["model"];
    assert_eq!(
        (model["kv_heads"].as_u64(), model["head_dim"].as_u64()),
        (Some(2), Some(128))
    );
    assert_eq!(model["rotary_dim"], 64);
    assert_eq!(model["attention"]["q_bias"], true);
    assert_eq!(model["attention"]["o_bias"], false);
    // 9.4 billion parameters: GLM-4-9B-0414's.
    assert_eq!(budget["budget"]["parameters"], 9_400_279_040_u64);
    budget_of_config(&config, &args).success().stdout(contains(
        "every verdict on two cards right, peaks of reserved to the byte \
         (data/hf-proof-glm4-h100.json)",
    ));
}

/// A Cohere `config.json` (Aya Expanse 8B's fields) is read as `CohereConfig` reads it (tied
/// embeddings by default, one norm a layer) and replayed, saying it is proven held out;
/// Command R+'s per-head norms, and a null `logit_scale`, are refused naming the field.
#[test]
fn a_cohere_config_is_replayed_and_its_unreplayed_variants_refused() {
    let aya = serde_json::json!({
        "model_type": "cohere", "vocab_size": 256000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "logit_scale": 0.125, "max_position_embeddings": 8192
    });
    let args = ["--mode", "inference", "--context", "1024"];
    budget_of_config(&aya, &args).success().stdout(contains(
        "every verdict on two cards right, peaks of reserved within 0.076 % \
         (data/hf-proof-cohere-h100.json)",
    ));
    for (field, value) in [
        ("use_qk_norm", serde_json::json!(true)),
        ("logit_scale", serde_json::Value::Null),
    ] {
        let mut config = aya.clone();
        config[field] = value;
        budget_of_config(&config, &args)
            .code(65)
            .stderr(contains(field));
    }
}

/// A StarCoder2 `config.json` (StarCoder2 3B's fields) is read as `Starcoder2Config` reads it:
/// layer norms with biases, `c_fc` and `c_proj` biased by `use_bias`, tied embeddings; its
/// parameters are the checkpoint's 3 030 371 328, and the budget says the runs held out that
/// prove it.
#[test]
fn a_starcoder2_config_is_replayed_and_says_its_replay_is_proven() {
    let config = serde_json::json!({
        "model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 3072,
        "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24,
        "num_key_value_heads": 2, "max_position_embeddings": 16384, "sliding_window": 4096,
        "use_bias": true
    });
    let args = ["--mode", "lora", "--context", "2048", "--checkpointing"];
    let budget = budget_json_of_config(&config, &args);
    assert_eq!(budget["budget"]["parameters"], 3_030_371_328_u64);
    budget_of_config(&config, &args).success().stdout(contains(
        "proven on 9 runs held out at public widths \
         (scripts/gpu/hf-proof-plan-starcoder2.json, written before any run), every verdict on \
         two cards right, peaks of reserved within 0.018 % (data/hf-proof-starcoder2-h100.json)",
    ));
}

/// `budget --help` ends with the runs people launch; each run from a preset works as written
/// (the Hub id's needs the Hub).
#[test]
fn the_examples_of_budget_help_run_as_written() {
    let out = mm().args(["budget", "--help"]).assert().success();
    let help = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let examples: Vec<Vec<&str>> = (help.lines())
        .filter_map(|l| l.trim().strip_prefix("mesure_memoire "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(examples.len() >= 4, "{help}");
    let mut ran = 0;
    for args in &examples {
        let model = args.iter().skip_while(|a| **a != "--model").nth(1).unwrap();
        if model.contains('/') {
            continue;
        }
        mm().args(args).assert().success();
        ran += 1;
    }
    assert!(ran >= 3);
}
