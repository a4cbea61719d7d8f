//! Budgets of the shipped presets against figures worked out by hand, and the fit planner on a
//! small catalog.

use super::*;
use crate::catalog::Catalog;
use crate::measure::Dtype;

fn settings() -> BudgetSettings {
    BudgetSettings::h200()
}

fn workload(preset: &str, mode: Mode) -> Workload {
    Workload {
        preset: Some(preset.into()),
        shape: Presets::builtin().get(preset).unwrap().shape(),
        mode,
        dtype: Dtype::Bfloat16,
        weights: WeightFormat::Dense,
        batch: 1,
        context: 4096,
        checkpointing: false,
        flash_attention: true,
    }
}

fn term(b: &Budget, key: &str) -> u64 {
    b.terms
        .iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no {key}"))
        .bytes
        .0
}

fn inference() -> Mode {
    Mode::Inference {
        generated: 0,
        kv_cache: KvFormat::Bfloat16,
    }
}

#[test]
fn kv_cache_counts_grouped_query_heads() {
    // Llama-3.1 8B: 8 KV heads of 128 for 32 query heads; 2 × 32 × 4096 × 8 × 128 × 2 B
    // = 536 870 912 B (the guide's formula without grouping says 4 times more).
    let b = budget(
        &workload("llama-3.1-8b", inference()).validated().unwrap(),
        settings(),
    );
    assert_eq!(term(&b, "kv_cache"), 536_870_912);
    assert_eq!(term(&b, "weights"), 8_030_261_248 * 2);
    assert_eq!(b.trainable_parameters, 0);
}

#[test]
fn mixed_precision_adamw_is_sixteen_bytes_per_parameter() {
    let w = workload(
        "llama-2-70b",
        Mode::Full {
            optimizer: Optimizer::AdamwMixed,
        },
    );
    let b = budget(&w.clone().validated().unwrap(), settings());
    let p = 68_976_648_192u64;
    let states: u64 = ["weights", "gradients", "master_weights", "optimizer_states"]
        .iter()
        .map(|k| term(&b, k))
        .sum();
    assert_eq!(states, 16 * p);
    // 8-bit AdamW: two one-byte moments and a float32 absmax per 256 elements of each tensor.
    let w8 = Workload {
        mode: Mode::Full {
            optimizer: Optimizer::Adamw8bit,
        },
        ..w
    };
    let b8 = budget(&w8.validated().unwrap(), settings());
    assert_eq!(term(&b8, "optimizer_states"), 2 * p);
    assert!(b8.terms.iter().all(|t| t.key != "master_weights"));
    let blocks: u64 = Presets::builtin()
        .get("llama-2-70b")
        .unwrap()
        .shape()
        .tensors()
        .iter()
        .map(|t| t.elements.div_ceil(256))
        .sum();
    assert_eq!(term(&b8, "optimizer_metadata"), 8 * blocks);
}

#[test]
fn quantized_weights_carry_their_metadata() {
    let shape = ModelShape {
        layers: 1,
        hidden: 256,
        heads: 2,
        kv_heads: 2,
        head_dim: 128,
        intermediate: 512,
        vocab: 1000,
        tied_embeddings: true,
        attention_bias: false,
        experts: 1,
        experts_per_token: 1,
        attention: AttentionKind::Full,
    };
    let base = Workload {
        preset: None,
        shape,
        mode: inference(),
        dtype: Dtype::Float16,
        weights: WeightFormat::Int4 { group_size: 128 },
        batch: 1,
        context: 8,
        checkpointing: false,
        flash_attention: true,
    };
    // Linear matrices: q, k, v, o 256×256 each; gate, up 512×256; down 256×512: 655 360 weights.
    let linear = 4 * 256 * 256 + 3 * 512 * 256;
    let other = 1000 * 256 + 3 * 256; // embedding (tied), two layer norms, final norm
    let b = budget(&base.clone().validated().unwrap(), settings());
    assert_eq!(term(&b, "weights"), linear / 2 + other * 2);
    // Per linear, groups = in / 128; scales 2 B and zeros 0.5 B per group and output column;
    // g_idx 4 B per input row. q,k,v,o,gate,up: in 256; down: in 512.
    let meta = |out: u64, inp: u64| (inp / 128) * out * 5 / 2 + inp * 4;
    let expected = 4 * meta(256, 256) + 2 * meta(512, 256) + meta(256, 512);
    assert_eq!(term(&b, "quantization_metadata"), expected);
    let int8 = Workload {
        weights: WeightFormat::Int8,
        ..base.clone()
    };
    let b = budget(&int8.validated().unwrap(), settings());
    assert_eq!(term(&b, "weights"), linear + other * 2);
    assert_eq!(
        term(&b, "quantization_metadata"),
        (4 * 256 + 2 * 512 + 256) * 4
    );
    let odd_group = Workload {
        weights: WeightFormat::Int4 { group_size: 96 },
        ..base
    };
    assert_eq!(
        odd_group.validated().unwrap_err().to_string(),
        "int4 group size 96 must divide every linear layer's input width (256)"
    );
}

#[test]
fn qlora_counts_nf4_blocks_and_float32_adapters() {
    let w = Workload {
        weights: WeightFormat::Nf4,
        context: 2048,
        ..workload(
            "llama-2-7b",
            Mode::Lora {
                rank: 64,
                targets: vec![LinearTarget::Q, LinearTarget::V],
            },
        )
    };
    let b = budget(&w.validated().unwrap(), settings());
    // Rank 64 on q and v (4096 → 4096) of 32 layers: 32 × 2 × 64 × 8192 = 33 554 432 parameters.
    assert_eq!(b.trainable_parameters, 33_554_432);
    assert_eq!(term(&b, "lora_adapters"), 33_554_432 * 4);
    assert_eq!(term(&b, "optimizer_states"), 33_554_432 * 8);
    // 4096 × 4096 q: 8 388 608 bytes of codes, 262 144 blocks of 64, 1 024 float32 second-level.
    let q = 4096u64 * 4096;
    let nf4_meta = |n: u64| n.div_ceil(64) + n.div_ceil(64).div_ceil(256) * 4;
    let per_layer_meta = 4 * nf4_meta(q) + 3 * nf4_meta(4096 * 11008);
    assert_eq!(term(&b, "quantization_metadata"), 32 * per_layer_meta);
}

#[test]
fn attention_the_formulas_do_not_cover_is_refused_by_name() {
    for (preset, kind) in [
        ("mistral-7b-v0.1", "sliding-window"),
        ("deepseek-v2-lite", "multi-head latent"),
    ] {
        let e = workload(preset, inference())
            .validated()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("{preset} uses {kind} attention")),
            "{e}"
        );
    }
}

#[test]
fn training_peak_is_the_larger_moment() {
    let b = budget(
        &workload(
            "llama-3.2-1b",
            Mode::Full {
                optimizer: Optimizer::AdamwMixed,
            },
        )
        .validated()
        .unwrap(),
        settings(),
    );
    let persistent: u64 = [
        "weights",
        "master_weights",
        "optimizer_states",
        "cublas_workspace",
    ]
    .iter()
    .map(|k| term(&b, k))
    .sum();
    let at = |k: &str| b.terms.iter().find(|t| t.key == k).unwrap().at_peak.0;
    // 4096 tokens and a 128 256-word vocabulary: the loss's float32 tensors dominate, so the peak
    // is the loss's backward, before any gradient is made.
    assert_eq!(b.peak_moment, "loss backward");
    assert_eq!(at("gradients"), 0);
    assert_eq!(at("activations"), term(&b, "activations"));
    assert_eq!(
        b.peak_allocated.0,
        persistent + at("gradients") + term(&b, "activations") + term(&b, "logits")
    );
    assert_eq!(b.total.0, b.peak_allocated.0 + 718_077_952);
}

fn catalog() -> Catalog {
    let csv = "model,display_name,gpus_per_lot,memory_per_gpu_gib,duration_days,lot_price_usd_cents,snapshot_date,price_status
small,Small,1,24,3,1000,2026-11-30,illustrative
small,Small,1,24,7,2000,2026-11-30,illustrative
small,Small,1,24,30,7000,2026-11-30,illustrative
pair,Pair,2,80,3,9000,2026-11-30,illustrative
pair,Pair,2,80,7,19000,2026-11-30,illustrative
pair,Pair,2,80,30,70000,2026-11-30,illustrative
";
    Catalog::parse(csv.as_bytes(), "test.csv").unwrap()
}

#[test]
fn the_planner_shards_what_it_may_and_prices_in_cents() {
    let b = budget(
        &workload("llama-2-13b", inference()).validated().unwrap(),
        settings(),
    );
    let plan = fit::plan(&b, &catalog(), 8).unwrap();
    // Weights 26.03 GB shard; the KV cache splits by heads; per-GPU terms repeat.
    for row in &plan.rows {
        let f = row.fit.as_ref().expect("fits within 8 GPUs");
        assert_eq!(f.need_per_gpu.0, fit::need_per_gpu(&b, f.gpus));
        assert!(f.need_per_gpu.0 <= row.usable_per_gpu.0);
        if f.lots > 1 {
            let fewer = (f.lots - 1) * (f.gpus / f.lots);
            assert!(
                fit::need_per_gpu(&b, fewer) > row.usable_per_gpu.0,
                "{}",
                row.model
            );
        }
        assert_eq!(f.total_usd_cents.0, f.lots * f.lot_price_usd_cents.0);
    }
    let prices: Vec<u64> = plan
        .rows
        .iter()
        .map(|r| r.fit.as_ref().unwrap().total_usd_cents.0)
        .collect();
    assert!(prices.windows(2).all(|p| p[0] <= p[1]), "{prices:?}");
    // 24 GiB less the context cannot hold 26 GB: two lots of `small` for 3 days is cheapest.
    let first = plan.cheapest().unwrap();
    assert_eq!((first.model.as_str(), first.duration_days), ("small", 3));
    assert_eq!(first.fit.as_ref().unwrap().lots, 2);
    assert_eq!(first.usable_per_gpu.0, 24 * (1 << 30) - 718_077_952);
}

#[test]
fn the_planner_names_the_smallest_shortfall() {
    let b = budget(
        &workload("llama-2-70b", inference()).validated().unwrap(),
        settings(),
    );
    let plan = fit::plan(&b, &catalog(), 1).unwrap();
    assert!(plan.cheapest().is_none());
    let short = plan.smallest_shortfall().unwrap();
    // With one GPU allowed only `small` is tried (a `pair` lot holds two): 137.95 GB of weights.
    assert_eq!(short.model, "small");
    assert_eq!(
        short.shortfall.unwrap().0,
        fit::need_per_gpu(&b, 1) - short.usable_per_gpu.0
    );
    assert!(plan
        .to_string()
        .contains("Nothing in the catalog fits on up to 1 GPUs"));
    assert!(matches!(
        fit::plan(&b, &catalog(), 0),
        Err(FitError::NoGpus)
    ));
}

#[test]
fn a_budget_file_reads_back_and_refuses_what_the_planner_cannot_use() {
    let b = budget(
        &workload("qwen2.5-7b", inference()).validated().unwrap(),
        settings(),
    );
    let text = serde_json::to_vec(&b).unwrap();
    let back = Budget::from_bytes(&text, "b.json").unwrap();
    assert_eq!(back.terms, b.terms);
    let e = Budget::from_bytes(b"{\"schema\": 3}", "b.json").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("b.json is not a budget file: invalid type"),
        "{e}"
    );
    assert!(e.to_string().contains("line 1 column"), "{e}");
    let zero = String::from_utf8(text)
        .unwrap()
        .replacen("\"kv_heads\":4", "\"kv_heads\":0", 1);
    let e = Budget::from_bytes(zero.as_bytes(), "b.json")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "b.json is not a budget file: workload: kv_heads must be at least 1"
    );
}

#[test]
fn spread_over_gpus_the_peak_moment_may_change() {
    // 70B full training with recomputation: on one GPU every gradient at the optimizer step
    // outweighs the activations; sharded over 64 GPUs the states shrink and the recomputation of
    // the top layer, with every layer's input and one layer's activations, is the peak.
    let w = Workload {
        checkpointing: true,
        ..workload(
            "llama-2-70b",
            Mode::Full {
                optimizer: Optimizer::AdamwMixed,
            },
        )
    };
    let b = budget(&w.validated().unwrap(), settings());
    assert_eq!(b.peak_moment, "optimizer step");
    let one = fit::per_gpu(&b, 1);
    assert_eq!(one.moment, b.peak_moment);
    assert_eq!(one.need, b.peak_allocated.0);
    let many = fit::per_gpu(&b, 64);
    assert_eq!(many.moment, "recomputed top layer's MLP backward");
    let at_start = b.moments.iter().find(|m| m.name == many.moment).unwrap();
    let expected: u64 = b
        .terms
        .iter()
        .filter(|t| t.place == Place::Allocator)
        .map(|t| match t.split {
            Split::Sharded => at_start.held(t).div_ceil(64),
            _ => at_start.held(t),
        })
        .sum();
    assert_eq!(many.need, expected);
    // LoRA of a high rank over short sequences: the adapters' gradients make the end of backward
    // the peak.
    let lora = Workload {
        context: 128,
        ..workload(
            "llama-2-70b",
            Mode::Lora {
                rank: 512,
                targets: LinearTarget::ALL.to_vec(),
            },
        )
    };
    let b = budget(&lora.validated().unwrap(), settings());
    assert_eq!(b.peak_moment, "end of backward");
    let g = b.terms.iter().find(|t| t.key == "gradients").unwrap();
    assert_eq!(g.at_peak, g.bytes);
}
