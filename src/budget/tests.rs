//! Budgets of shipped presets against figures worked out by hand from the models' configurations
//! (the KV cache of full, sliding and latent attention, LoRA's and AdamW's tensors), the budget
//! file's invariants, and the fit planner on a small catalog.

use super::compute::allocator_config;
use super::fit::{self, Basis, Size};
use super::*;
use crate::catalog::Catalog;
use crate::dtype::Dtype;

fn preset(name: &str, mode: Mode, batch: u64, context: u64) -> Workload {
    Workload {
        mode,
        batch,
        context,
        ..Workload::preset(name).unwrap()
    }
    .validated()
    .unwrap()
}

fn generate(tokens: u64) -> Mode {
    Mode::Inference { generated: tokens }
}

fn term<'a>(b: &'a Budget, key: &str) -> &'a Term {
    b.terms
        .iter()
        .find(|t| t.key == key)
        .unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn the_kv_cache_counts_grouped_heads_and_every_token_fed() {
    // Llama-3.1 8B: 32 layers, 8 KV heads of 128; the cache holds the prompt and every new
    // token but the last: 8192 + 511 positions, K and V, 2 B each.
    let b = budget(
        &preset("llama-3.1-8b", generate(512), 4, 8192),
        &BudgetSettings::h200(),
    );
    assert_eq!(
        term(&b, "kv_cache").bytes.0,
        32 * 4 * 8703 * (2 * 8 * 128) * 2
    );
    assert_eq!(term(&b, "weights").status, TermStatus::Exact);
}

#[test]
fn sliding_layers_keep_their_window_and_latent_layers_their_latent() {
    // Mistral 7B v0.1: every layer slides over 4096 positions.
    let b = budget(
        &preset("mistral-7b-v0.1", generate(1), 1, 8192),
        &BudgetSettings::h200(),
    );
    assert_eq!(term(&b, "kv_cache").bytes.0, 32 * 4096 * (2 * 8 * 128) * 2);
    // Gemma 2 2B: 26 layers alternating a 4096 window and full attention; 4 KV heads of 256.
    let b = budget(
        &preset("gemma-2-2b", generate(1), 1, 8000),
        &BudgetSettings::h200(),
    );
    assert_eq!(
        term(&b, "kv_cache").bytes.0,
        (13 * 4096 + 13 * 8000) * (2 * 4 * 256) * 2
    );
    // DeepSeek-V2-Lite: 27 layers caching a 512-wide latent and a 64-wide rotary key.
    let b = budget(
        &preset("deepseek-v2-lite", generate(1), 2, 2048),
        &BudgetSettings::h200(),
    );
    assert_eq!(term(&b, "kv_cache").bytes.0, 27 * 2 * 2048 * (512 + 64) * 2);
}

#[test]
fn lora_and_adamw_tensors_are_counted_as_peft_and_torch_make_them() {
    // PEFT's count for Llama-3 8B, rank 16 on q_proj and v_proj: 16 × (4096 + 4096) +
    // 16 × (4096 + 1024) per layer, 32 layers = 6 815 744, in float32 with float32 moments.
    let lora = Mode::Lora {
        rank: 16,
        targets: vec!["q_proj".into(), "v_proj".into()],
    };
    let b = budget(
        &preset("llama-3.1-8b", lora, 1, 512),
        &BudgetSettings::h200(),
    );
    assert_eq!(b.trainable_parameters, 6_815_744);
    assert_eq!(term(&b, "lora_adapters").bytes.0, 6_815_744 * 4);
    assert_eq!(term(&b, "optimizer_states").bytes.0, 6_815_744 * 8);
    // Full training of Llama-3.2 1B in bfloat16: a gradient and two moments per parameter in
    // the parameter's dtype; at the peak each is held whole, in the allocator's blocks (a
    // remainder under 1 MiB is not split off, so a block may exceed its tensor).
    let full = Mode::Full {
        optimizer: Optimizer::Adamw,
    };
    let b = budget(
        &preset("llama-3.2-1b", full, 1, 512),
        &BudgetSettings::h200(),
    );
    let n = b.parameters;
    assert_eq!(n, 1_235_814_400);
    assert_eq!(term(&b, "gradients").bytes.0, n * 2);
    assert_eq!(term(&b, "optimizer_states").bytes.0, n * 4);
    let states = term(&b, "optimizer_states");
    let slack = states.at_peak.0 - states.bytes.0;
    assert!(
        slack < states.bytes.0 / 1000,
        "{slack} B beyond the states at the peak"
    );
}

#[test]
fn a_budget_adds_up_and_its_file_refuses_edits() {
    let b = budget(
        &preset("qwen2.5-0.5b", generate(16), 2, 1024),
        &BudgetSettings::h200(),
    );
    let at_peak: u64 = b.terms.iter().map(|t| t.at_peak.0).sum();
    assert_eq!(at_peak, b.total.0);
    assert_eq!(b.total.0, b.peak_reserved.0 + b.outside_allocator.0);
    assert_eq!(b.needed.0, b.total.0 + b.margin.0);
    assert!(b
        .stages
        .iter()
        .any(|s| s.stage == b.peak_stage && s.peak_reserved == b.peak_reserved));
    let text = serde_json::to_string(&b).unwrap();
    let read =
        |text: &str| BudgetFile::parse(text.as_bytes(), "b.json").and_then(BudgetFile::verify);
    let back = read(&text).unwrap();
    assert_eq!(back.terms, b.terms);
    let edit = |from: &str, to: &str| {
        let edited = text.replacen(from, to, 1);
        assert_ne!(edited, text, "{from}");
        read(&edited).unwrap_err().to_string()
    };
    let total = format!("\"total\":{{\"bytes\":{}", b.total.0);
    let e = edit(&total, &format!("\"total\":{{\"bytes\":{}", b.total.0 - 1));
    assert!(
        e.contains("`/total/bytes` is not what this version computes"),
        "{e}"
    );
    let e = edit("\"batch\":2", "\"batch\":0");
    assert!(e.contains("workload: batch must be between 1 and"), "{e}");
}

/// A budget file is untrusted: sums kept consistent around absurd terms (every term of the
/// allocator emptied, the weights made 2^63 B), a model whose sizes overflow its count, a head
/// of width 0 or a router that transformers cannot run are refused, never planned or panicked on.
#[test]
fn a_budget_file_of_consistent_but_false_figures_is_refused() {
    let b = budget(
        &preset(
            "qwen2.5-0.5b",
            Mode::Full {
                optimizer: Optimizer::Adamw,
            },
            1,
            64,
        ),
        &BudgetSettings::h200(),
    );
    let refused = |value: &serde_json::Value| {
        let text = serde_json::to_vec(value).unwrap();
        BudgetFile::parse(&text, "b.json")
            .and_then(BudgetFile::verify)
            .unwrap_err()
            .to_string()
    };
    let good = serde_json::to_value(&b).unwrap();
    // Every allocator term 0, and the peaks and totals made to agree with that.
    let mut emptied = good.clone();
    for t in emptied["terms"].as_array_mut().unwrap() {
        if t["place"] == "allocator" {
            t["bytes"]["bytes"] = 0.into();
            t["at_peak"]["bytes"] = 0.into();
        }
    }
    for key in ["peak_allocated", "peak_reserved"] {
        emptied[key]["bytes"] = 0.into();
    }
    let e = refused(&emptied);
    assert!(e.contains("is not what this version computes"), "{e}");
    // Weights of 2^63 B.
    let mut heavy = good.clone();
    heavy["terms"][0]["bytes"]["bytes"] = (1u64 << 63).into();
    assert!(
        refused(&heavy).contains("`/terms/0/bytes"),
        "{}",
        refused(&heavy)
    );
    // Sizes whose parameters overflow, a head of width 0.
    let mut huge = good.clone();
    for key in ["vocab", "hidden", "intermediate"] {
        huge["workload"]["model"][key] = (1u64 << 24).into();
    }
    huge["workload"]["model"]["layers"] =
        serde_json::Value::Array(vec![huge["workload"]["model"]["layers"][0].clone(); 4096]);
    let e = refused(&huge);
    assert!(e.contains("workload:"), "{e}");
    let mut flat = good.clone();
    flat["workload"]["model"]["head_dim"] = 0.into();
    let e = refused(&flat);
    assert!(e.contains("`head_dim` = 0 is out of range"), "{e}");
}

#[test]
fn a_model_as_deep_as_a_config_may_describe_trains() {
    // Autograd's graph as deep as 4 096 layers is built and freed without exhausting the stack.
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64,
        "num_hidden_layers": crate::model::config::MAX_LAYERS, "num_attention_heads": 1,
        "num_key_value_heads": 1, "max_position_embeddings": 64, "tie_word_embeddings": false
    });
    let w = Workload {
        model: crate::model::config::from_value(&config).unwrap(),
        mode: Mode::Full {
            optimizer: Optimizer::Adamw,
        },
        context: 1,
        ..Workload::preset("llama-3.2-1b").unwrap()
    }
    .validated()
    .unwrap();
    let b = budget(&w, &BudgetSettings::h200());
    assert!(b.peak_reserved.0 > 0 && b.stages.iter().any(|s| s.stage == "step2.optimizer"));
}

#[test]
fn every_mode_adds_up_and_reads_back() {
    // With and without recomputation (training without it keeps the forward's cache).
    let lora = Mode::Lora {
        rank: 8,
        targets: vec!["q_proj".into(), "v_proj".into()],
    };
    let full = Mode::Full {
        optimizer: Optimizer::Adamw,
    };
    for (mode, checkpointing) in [
        (generate(4), false),
        (lora.clone(), false),
        (lora, true),
        (full.clone(), false),
        (full, true),
    ] {
        let w = Workload {
            checkpointing,
            ..preset("qwen2.5-0.5b", mode, 1, 128)
        }
        .validated()
        .unwrap();
        let b = budget(&w, &BudgetSettings::h200());
        let at_peak: u64 = b.terms.iter().map(|t| t.at_peak.0).sum();
        assert_eq!(at_peak, b.total.0, "{}", b.title());
        let text = serde_json::to_string(&b).unwrap();
        BudgetFile::parse(text.as_bytes(), "b.json")
            .and_then(BudgetFile::verify)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn catalog() -> Catalog {
    let csv = "model,display_name,gpus_per_lot,memory_per_gpu_gib,duration_days,lot_price_usd_cents,snapshot_date,price_status
small,Small,1,24,3,1000,2026-11-30,illustrative
small,Small,1,24,7,2000,2026-11-30,illustrative
small,Small,1,24,30,7000,2026-11-30,illustrative
large,Large,1,80,3,5000,2026-11-30,illustrative
large,Large,1,80,7,9000,2026-11-30,illustrative
large,Large,1,80,30,30000,2026-11-30,illustrative
";
    Catalog::parse(csv.as_bytes(), "test.csv").unwrap()
}

#[test]
fn the_planner_replays_one_gpu_and_splits_over_more() {
    // Llama-3.1 8B, batch 4, 8192 + 512: 24.9 GB reserved at the peak; 24 GiB cards fail by
    // replay and hold it served over two; 80 GiB cards hold it whole. The split rule's estimate
    // (for the runs no spread is replayed for) over two.
    let b = budget(
        &preset("llama-3.1-8b", generate(512), 4, 8192),
        &BudgetSettings::h200(),
    );
    // One GPU holds the card at its fullest: the allocator's peak and what lives outside it
    // then; the reserve is taken off the card, not counted again.
    assert_eq!(fit::need_per_gpu(&b, 1), b.peak_use());
    assert_eq!(b.peak_use(), b.peak_reserved.0 + b.outside_allocator.0);
    let with_reserve = budget(
        &preset("llama-3.1-8b", generate(512), 4, 8192),
        &BudgetSettings {
            reserve_bytes: 1 << 30,
            ..BudgetSettings::h200()
        },
    );
    assert_eq!(
        fit::need_per_gpu(&with_reserve, 2),
        fit::need_per_gpu(&b, 2)
    );
    // Over two GPUs each holds its share of the terms and NCCL's communicator beside them; one
    // GPU holds no communicator.
    let shares: u64 = (b.terms.iter().zip(fit::shares(&b, 2)))
        .filter(|(t, _)| t.place != crate::budget::terms::Place::Reserve)
        .map(|(_, s)| s)
        .sum();
    let nccl = crate::replay::Nccl::h200_nvlink();
    assert_eq!(fit::need_per_gpu(&b, 2), shares + nccl.bytes);
    assert_eq!((nccl.status(2), nccl.status(8)), ("measured", "hypothesis"));
    let plan = fit::plan(&b, &catalog(), 8).unwrap();
    for row in &plan.rows {
        let f = row.fit.as_ref().expect("fits within 8 GPUs");
        assert_eq!(f.total_usd_cents.0, f.lots * f.lot_price_usd_cents.0);
        // Need and headroom share the room (the card less the reserve).
        assert_eq!(f.need_per_gpu.0 + f.headroom_per_gpu.0, row.room_per_gpu.0);
        match row.model.as_str() {
            "small" => {
                // Served over two by tensor parallelism, its rank replayed.
                assert_eq!(row.basis, Basis::ReplayOutOfMemory);
                assert_eq!((f.gpus, f.basis), (2, Basis::TensorParallelReplay));
                let sharded = fit::Sharded::of(&b).expect("tensor parallelism serves it");
                assert_eq!(f.need_per_gpu.0, sharded.need(2));
            }
            _ => assert_eq!((f.gpus, f.basis), (1, Basis::PeakFits)),
        }
    }
    let prices: Vec<u64> = plan
        .rows
        .iter()
        .map(|r| r.fit.as_ref().unwrap().total_usd_cents.0)
        .collect();
    assert!(prices.windows(2).all(|p| p[0] <= p[1]), "{prices:?}");
    assert_eq!(plan.cheapest().unwrap().model, "small");
    // One GPU allowed: only `large` holds it; `small` misses by what the split rule says.
    let plan = fit::plan(&b, &catalog(), 1).unwrap();
    assert_eq!(plan.cheapest().unwrap().model, "large");
    let short = plan.rows.iter().find(|r| r.model == "small").unwrap();
    assert_eq!(
        short.shortfall.unwrap().0,
        fit::need_per_gpu(&b, 1) - short.room_per_gpu.0
    );
    assert!(matches!(
        fit::plan(&b, &catalog(), 0),
        Err(fit::FitError::NoGpus)
    ));
}

#[test]
fn a_catalog_gpu_of_absurd_memory_is_planned_without_overflow() {
    let b = budget(
        &preset("qwen2.5-0.5b", generate(4), 1, 64),
        &BudgetSettings::h200(),
    );
    let huge = "99999999999999999999999999";
    let csv = format!(
        "model,display_name,gpus_per_lot,memory_per_gpu_gib,duration_days,lot_price_usd_cents,snapshot_date,price_status
huge,Huge,1,{huge},3,1000,2026-11-30,illustrative
huge,Huge,1,{huge},7,2000,2026-11-30,illustrative
huge,Huge,1,{huge},30,7000,2026-11-30,illustrative
"
    );
    let catalog = Catalog::parse(csv.as_bytes(), "huge.csv").unwrap();
    assert_eq!(fit::memory_bytes(&catalog.rows[0]), u64::MAX);
    let plan = fit::plan(&b, &catalog, 8).unwrap();
    assert_eq!(plan.cheapest().unwrap().model, "huge");
}

/// Whether `w` at `batch` holds on one GPU of `memory` bytes under `setting`, as its budget's
/// planner says.
fn holds_on_one_gpu(w: &Workload, batch: u64, memory: u64, setting: AllocatorSetting) -> bool {
    let w = Workload {
        batch,
        allocator: setting,
        ..w.clone()
    };
    fit::OneGpu::new(&budget(&w, &BudgetSettings::h200()))
        .verdict(memory, setting)
        .0
}

#[test]
fn the_largest_batch_fits_and_one_more_does_not() {
    let w = preset("llama-3.2-1b", generate(64), 1, 4096);
    let settings = BudgetSettings::h200();
    let memory = 24 << 30;
    let cards = [memory, 12 << 30];
    let allocators = [AllocatorSetting::Default];
    let mut search =
        fit::SizeSearch::new(&w, &settings, Size::Batch, 1 << 12, &cards, &allocators).unwrap();
    // One search serves several cards: its replays kept between them decide as a budget does.
    for memory in [memory, 12 << 30, memory] {
        let n = search.largest(memory, AllocatorSetting::Default).unwrap();
        let fits = |batch| holds_on_one_gpu(&w, batch, memory, AllocatorSetting::Default);
        assert!(n > 1 && fits(n) && !fits(n + 1), "{n}");
    }
}

/// Several cards under both settings searched together, in rounds: each largest batch holds on
/// its card and the next one does not, as budgets of those batches say.
#[test]
fn cards_searched_together_each_find_their_edge() {
    let w = preset("llama-3.2-1b", generate(64), 1, 4096);
    let settings = BudgetSettings::h200();
    let memories = [24 << 30, 16 << 30, 12 << 30];
    let allocators = [
        AllocatorSetting::Default,
        AllocatorSetting::ExpandableSegments,
    ];
    let mut search =
        fit::SizeSearch::new(&w, &settings, Size::Batch, 1 << 12, &memories, &allocators).unwrap();
    let cards: Vec<(u64, AllocatorSetting)> = memories
        .iter()
        .flat_map(|&m| allocators.map(|a| (m, a)))
        .collect();
    let found = search.largest_of_each(&cards);
    for (&(memory, setting), n) in cards.iter().zip(found) {
        let n = n.expect("batch 1 holds");
        let fits = |batch| holds_on_one_gpu(&w, batch, memory, setting);
        assert!(
            n > 1 && fits(n) && !fits(n + 1),
            "{n} on {memory} B, {setting:?}"
        );
    }
}

#[test]
fn float16_weights_and_autocast_are_the_dtype_they_say() {
    let full = Mode::Full {
        optimizer: Optimizer::Adamw,
    };
    let w = Workload {
        dtype: Dtype::Float32,
        autocast: Some(Dtype::Bfloat16),
        ..preset("llama-3.2-1b", full, 1, 256)
    }
    .validated()
    .unwrap();
    let b = budget(&w, &BudgetSettings::h200());
    // Float32 weights, gradients and moments under bfloat16 autocast.
    assert_eq!(term(&b, "gradients").bytes.0, b.parameters * 4);
    assert_eq!(term(&b, "optimizer_states").bytes.0, b.parameters * 8);
    assert!(b
        .title()
        .contains("float32 weights under bfloat16 autocast"));
}

#[test]
fn random_workloads_are_refused_or_add_up() {
    // Sizes drawn from 0 to 2^64 − 1 on a log scale (a seeded generator: the same run each
    // time), through the arithmetic of a small model's workload: each is refused, or its budget's
    // terms add up to its total without wrapping.
    let mut state: u64 = 0x2026_1201;
    let mut draw = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let bits = (state >> 58) as u32; // 0..=63
        (state >> 1) & (u64::MAX >> (63 - bits))
    };
    let (mut refused, mut budgeted) = (0, 0);
    for _ in 0..300 {
        let mode = match draw() % 3 {
            0 => Mode::Inference {
                generated: draw() % 64,
            },
            1 => Mode::Lora {
                rank: draw(),
                targets: vec!["q_proj".into()],
            },
            _ => Mode::Full {
                optimizer: Optimizer::Adamw,
            },
        };
        let w = Workload {
            mode,
            batch: draw(),
            context: draw(),
            ..Workload::preset("qwen2.5-0.5b").unwrap()
        };
        let Ok(w) = w.validated() else {
            refused += 1;
            continue;
        };
        let settings = BudgetSettings {
            reserve_bytes: draw() >> 8,
            ..BudgetSettings::h200()
        };
        let b = budget(&w, &settings);
        let sum = b
            .terms
            .iter()
            .try_fold(0u64, |s, t| s.checked_add(t.at_peak.0))
            .expect("the terms add up without wrapping");
        assert_eq!(sum, b.total.0, "{}", b.title());
        assert!(b.terms.iter().all(|t| t.at_peak.0 <= b.total.0));
        assert!(b.needed.0 >= b.total.0 && b.peak_reserved.0 >= b.peak_allocated.0);
        budgeted += 1;
    }
    assert!(
        refused > 0 && budgeted > 0,
        "{refused} refused, {budgeted} budgeted"
    );
}

#[test]
fn qlora_and_8_bit_adamw_count_what_the_replay_holds() {
    // QLoRA of Qwen2.5 0.5B (its projections' input widths are multiples of 64) on 2 048 tokens
    // a step: the weights' own bytes are what the loading keeps, tensor by tensor.
    let w = Workload {
        weights: WeightFormat::Nf4,
        ..preset(
            "qwen2.5-0.5b",
            Mode::Lora {
                rank: 8,
                targets: vec!["q_proj".into(), "v_proj".into()],
            },
            2,
            1024,
        )
    }
    .validated()
    .unwrap();
    let b = budget(&w, &BudgetSettings::h200());
    let program = crate::stack::run::program(&w.runs(BudgetSettings::h200().kernels)[0]);
    let stages = program.stages();
    let loading = &stages[0];
    assert_eq!(loading.name, "weights");
    let mut kept = std::collections::HashMap::new();
    let mut n = 0u32;
    for e in program.events().take(loading.end) {
        match e {
            crate::replay::Event::Alloc { bytes, role, .. } => {
                if role == crate::replay::Role::Weights {
                    kept.insert(n, bytes);
                }
                n += 1;
            }
            crate::replay::Event::Free { alloc } => {
                kept.remove(&alloc);
            }
            _ => {}
        }
    }
    assert_eq!(term(&b, "weights").bytes.0, kept.values().sum::<u64>());
    // 32 tokens a step: on the H200, bitsandbytes runs its own kernel for the attention's small
    // weights (under a quarter wave of the 132 multiprocessors), whose product makes only its
    // output; with 40 multiprocessors it dequantizes them, and the forward holds more at its peak.
    let few = Workload {
        batch: 1,
        context: 32,
        ..w.clone()
    }
    .validated()
    .unwrap();
    let forward_peak = |settings: &BudgetSettings| {
        let b = budget(&few, settings);
        (b.stages
            .iter()
            .find(|s| s.stage == "step1.forward")
            .unwrap())
        .peak_allocated
        .0
    };
    let fewer_multiprocessors = BudgetSettings {
        kernels: BudgetSettings::h200().kernels.with_multiprocessors(40),
        ..BudgetSettings::h200()
    };
    assert!(forward_peak(&BudgetSettings::h200()) < forward_peak(&fewer_multiprocessors));
    // 8-bit AdamW: what the optimizer stage makes is the term's size.
    let w = preset(
        "qwen2.5-0.5b",
        Mode::Full {
            optimizer: Optimizer::Adamw8bit,
        },
        1,
        128,
    );
    let b = budget(&w, &BudgetSettings::h200());
    let states = crate::stack::optimizer::adamw_8bit_state_bytes(
        w.model.parameters().iter().map(|t| (t.elements(), false)),
    );
    assert_eq!(term(&b, "optimizer_states").bytes.0, states);
    assert!(term(&b, "optimizer_states").at_peak.0 >= states);
    // Through the Trainer, the embeddings' weight (tied: the LM head's too) keeps float32 moments.
    let trained = Workload {
        trainer: true,
        optimizer_impl: crate::stack::optimizer::OptimizerImpl::Fused,
        ..w.clone()
    };
    let b = budget(&trained.validated().unwrap(), &BudgetSettings::h200());
    let embedding = w.model.vocab * w.model.hidden;
    let states_32 = crate::stack::optimizer::adamw_8bit_state_bytes(
        w.model
            .parameters()
            .iter()
            .map(|t| (t.elements(), t.elements() == embedding)),
    );
    assert_eq!(
        states_32 - states,
        2 * 4 * embedding - (2 * embedding + 2 * 4 * embedding.div_ceil(256))
    );
    assert_eq!(term(&b, "optimizer_states").bytes.0, states_32);
    assert!(term(&b, "optimizer_states").at_peak.0 >= states_32);
}

#[test]
fn replays_made_as_the_emulation_writes_equal_replays_of_the_kept_program() {
    use crate::replay::{Device, Plan};
    let w = preset("qwen2.5-0.5b", generate(8), 2, 512);
    let configs = [
        allocator_config(AllocatorSetting::Default),
        allocator_config(AllocatorSetting::ExpandableSegments),
    ];
    let outside = BudgetSettings::h200().outside.bytes;
    let plan = Plan {
        keep: true,
        under: &configs,
        outside,
        watch: None,
    };
    let r = crate::stack::run::replays(&w.runs(BudgetSettings::h200().kernels)[0], &plan);
    let (program, streamed) = (r.program, r.unlimited);
    for (config, streamed) in configs.iter().zip(&streamed) {
        let kept = program.replay(*config, Device::Unlimited, outside);
        assert_eq!(streamed, &kept);
    }
    // The two settings do differ, so the comparison can fail.
    assert_ne!(streamed[0].peak_reserved, streamed[1].peak_reserved);
}

/// A small Gemma 3 as its multimodal `config.json` describes it (SigLIP's vision tower beside
/// the text model, sliding and global layers).
fn gemma3_with_vision(mode: Mode) -> Workload {
    let config = serde_json::json!({
        "model_type": "gemma3",
        "text_config": {
            "vocab_size": 1160, "hidden_size": 320, "intermediate_size": 448,
            "num_hidden_layers": 3, "num_attention_heads": 5, "num_key_value_heads": 1,
            "head_dim": 72, "sliding_window": 24, "query_pre_attn_scalar": 72,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]
        },
        "vision_config": {
            "hidden_size": 176, "intermediate_size": 232, "num_attention_heads": 4,
            "num_hidden_layers": 2, "image_size": 56, "patch_size": 14, "vision_use_head": false
        }
    });
    Workload {
        model: crate::model::config::from_value(&config).unwrap(),
        mode,
        batch: 2,
        context: 40,
        ..Workload::preset("llama-3.2-1b").unwrap()
    }
}

#[test]
fn a_vision_tower_is_loaded_never_trained_and_both_mask_orders_replayed() {
    let lora = Mode::Lora {
        rank: 8,
        targets: vec!["q_proj".into(), "v_proj".into()],
    };
    let w = gemma3_with_vision(lora).validated().unwrap();
    let vision: u64 = w
        .model
        .parameters()
        .iter()
        .filter(|p| !p.used_by_text())
        .map(|p| p.elements())
        .sum();
    assert!(vision > 0);
    // Two runs, one per order the process may make the masks in (with `generate`'s 2-D mask,
    // different programs), and the budget is the one that needs more.
    let inference = gemma3_with_vision(generate(4)).validated().unwrap();
    let runs = inference.runs(BudgetSettings::h200().kernels);
    assert_eq!(runs.len(), 2);
    let replays: Vec<u64> = runs
        .iter()
        .map(|r| {
            let p = crate::stack::run::program(r);
            let config = allocator_config(w.allocator);
            p.replay(config, crate::replay::Device::Unlimited, Default::default())
                .peak_reserved
        })
        .collect();
    let b = budget(&inference, &BudgetSettings::h200());
    assert_eq!(b.peak_reserved.0, *replays.iter().max().unwrap());
    assert_eq!(b.programs.len(), 2);
    assert_ne!(
        crate::stack::run::program(&runs[0])
            .events()
            .collect::<Vec<_>>(),
        crate::stack::run::program(&runs[1])
            .events()
            .collect::<Vec<_>>()
    );
    let b = budget(&w, &BudgetSettings::h200());
    // PEFT's targets reach the tower's q_proj and v_proj (its adapters made, never trained).
    let trained = |p: &crate::model::Parameter| {
        p.role == crate::model::TensorRole::Linear
            && !p.is_bias()
            && (p.module() == "q_proj" || p.module() == "v_proj")
    };
    let adapters = |text_only: bool| -> u64 {
        w.model
            .parameters()
            .iter()
            .filter(|p| trained(p) && (!text_only || p.used_by_text()))
            .map(|p| 8 * (p.shape[0] + p.shape[1]))
            .sum()
    };
    assert_eq!(term(&b, "lora_adapters").bytes.0, adapters(false) * 4);
    assert_eq!(term(&b, "gradients").bytes.0, adapters(true) * 4);
    assert_eq!(b.trainable_parameters, adapters(true));
    // Targets only the tower has would train nothing: refused; QLoRA of it is not replayed.
    let tower_only = Mode::Lora {
        rank: 8,
        targets: vec!["fc1".into()],
    };
    let e = gemma3_with_vision(tower_only).validated().unwrap_err();
    assert!(e.to_string().contains("vision tower"), "{e}");
    // A text-only Gemma 3 makes one run.
    let text = Workload {
        model: crate::model::config::from_value(&serde_json::json!({
            "model_type": "gemma3_text", "vocab_size": 1160, "hidden_size": 320,
            "intermediate_size": 448, "num_hidden_layers": 3, "num_attention_heads": 5,
            "num_key_value_heads": 1, "head_dim": 72, "sliding_window": 24
        }))
        .unwrap(),
        ..w.clone()
    };
    assert_eq!(text.runs(BudgetSettings::h200().kernels).len(), 1);
}

#[test]
fn replays_on_cards_beside_the_budget_are_those_made_after_it() {
    use crate::replay::Device;
    let settings = BudgetSettings::h200();
    let lora = Mode::Lora {
        rank: 8,
        targets: vec!["q_proj".into(), "v_proj".into()],
    };
    let (mut completed, mut out_of_memory) = (0, 0);
    for w in [
        preset("qwen2.5-0.5b", generate(8), 2, 512),
        preset("qwen2.5-0.5b", lora, 2, 256),
        gemma3_with_vision(generate(4)).validated().unwrap(),
    ] {
        let alone = budget(&w, &settings);
        // 25 cards from 64 KiB below the most the run holds in use to 64 KiB above the card at
        // its fullest, in a catalog (GiB exact to the byte: a KiB is 2^-20 GiB).
        let kib = |bytes: u64| bytes >> 10;
        let (low, high) = (kib(alone.peak_in_use.0) - 64, kib(alone.peak_use()) + 64);
        let step = ((high - low) / 24).max(1);
        let mut csv = String::from(
            "model,display_name,gpus_per_lot,memory_per_gpu_gib,duration_days,\
             lot_price_usd_cents,snapshot_date,price_status\n",
        );
        for (i, m) in (low..=high).step_by(step as usize).enumerate() {
            let gib = rust_decimal::Decimal::from(m) / rust_decimal::Decimal::from(1 << 20);
            for days in [3, 7, 30] {
                csv += &format!(
                    "c{i},C{i},1,{gib},{days},{},2026-11-30,illustrative\n",
                    i + 1
                );
            }
        }
        let catalog = Catalog::parse(csv.as_bytes(), "cards.csv").unwrap();
        let memories = fit::one_gpu_memories(&catalog);
        let b = fit::budget_for_catalog(&w, &settings, &catalog);
        assert!(!b.replayed_on_cards.is_empty(), "{}", b.title());
        // Unbounded, a watching replay starts the limited replays of every card its own peaks
        // leave open under its setting, under both settings; and of no card the card at its
        // fullest holds (one its peak in use passed may have been, its replay ended before it
        // was stopped).
        let mut rooms: Vec<u64> = memories.iter().map(|&m| settings.room(m)).collect();
        rooms.dedup();
        let allocators = [w.allocator, w.allocator.other()];
        let configs = allocators.map(allocator_config);
        let plan = super::compute::watching_plan(&configs, &rooms, &settings, usize::MAX);
        let outside = settings.outside.bytes;
        for run in w.runs(settings.kernels) {
            let r = crate::stack::run::replays(&run, &plan);
            let own = &r.unlimited[0];
            for &room in &rooms {
                let open = own.peak_device_allocated <= room && room < own.peak_device;
                for config in 0..configs.len() {
                    let replayed =
                        (r.on_cards.iter()).any(|l| (l.room, l.config) == (room, config));
                    let crossed = room < own.peak_device;
                    assert!(
                        (!open || replayed) && (!replayed || crossed),
                        "{} on {room} B",
                        b.title()
                    );
                }
            }
            // Each as the kept program replayed on the card after it says.
            for l in &r.on_cards {
                let card = Device::Card { room: l.room };
                let after = r.program.replay(configs[l.config], card, outside);
                let after = after.out_of_memory.is_none();
                assert_eq!(l.completed, after, "{} on {} B", b.title(), l.room);
                *(if after {
                    &mut completed
                } else {
                    &mut out_of_memory
                }) += 1;
            }
        }
        // The replays a budget made beside its own (as many at once as the machine runs) say
        // what the replays made after it say.
        for r in &b.replayed_on_cards {
            let card = Device::Card { room: r.room };
            let after = b.programs[r.program]
                .replay(allocator_config(r.allocator), card, outside)
                .out_of_memory
                .is_none();
            assert_eq!(r.completed, after, "{} on {} B", b.title(), r.room);
        }
        let plan = |b: &Budget| serde_json::to_value(fit::plan(b, &catalog, 1).unwrap()).unwrap();
        assert_eq!(plan(&b), plan(&alone), "{}", b.title());
    }
    // Runs that completed on their card and runs that did not were compared.
    assert!(
        completed > 0 && out_of_memory > 0,
        "{completed} {out_of_memory}"
    );
}

#[test]
fn the_planner_replays_each_rank_of_a_sharded_full_training() {
    // Llama-3.1 8B trained whole in bfloat16 (16 B a parameter with AdamW's moments): no 24 GiB
    // card holds it; FSDP2 over several does, each GPU holding what its busier rank (the first
    // or the last) holds at its fullest, with NCCL's communicator.
    let w = Workload {
        checkpointing: true,
        ..preset(
            "llama-3.1-8b",
            Mode::Full {
                optimizer: Optimizer::Adamw,
            },
            1,
            512,
        )
    };
    let b = budget(&w, &BudgetSettings::h200());
    let sharded = fit::Sharded::of(&b).expect("FSDP2 is emulated for a full training");
    let plan = fit::plan(&b, &catalog(), 16).unwrap();
    let small = (plan.rows.iter())
        .find(|r| r.model == "small")
        .expect("a small row");
    let f = small.fit.as_ref().expect("fits over several small GPUs");
    assert!(f.gpus > 1);
    assert!(matches!(
        f.basis,
        Basis::RankReplay | Basis::RankReplayWithinMargin
    ));
    // The fewest GPUs: one fewer does not hold it.
    let room = small.room_per_gpu.0;
    assert!(sharded.fits(f.gpus, room) && !sharded.fits(f.gpus - 1, room));
    // Each GPU's need: the busier of rank 0 and the last rank, replayed as one process of the
    // world, with FSDP2's kernels outside the allocator and NCCL's communicator.
    let peak = |rank: u64| {
        let mut run = w.runs(b.kernels).remove(0);
        run.sharding = Some(crate::stack::fsdp::Sharding {
            world: f.gpus,
            rank,
            mixed_precision: false,
        });
        let config = [allocator_config(w.allocator)];
        let p = crate::replay::Plan {
            keep: false,
            under: &config,
            outside: b.outside.bytes.with_fsdp2_kernels(),
            watch: None,
        };
        crate::stack::run::replays(&run, &p).unlimited[0].peak_device
    };
    let need = peak(0).max(peak(f.gpus - 1)) + crate::replay::Nccl::h200_nvlink().bytes;
    assert_eq!(sharded.need(f.gpus), need);
    assert_eq!(f.need_per_gpu.0, need.min(room));
    // Its spread over several counts, the ranks' replay beside the split rule's estimate.
    let spread = sharded.spread(&[f.gpus, 2 * f.gpus]);
    let rows: Vec<(u64, u64, u64, u64)> = (spread.rows.iter())
        .map(|r| (r.gpus, r.world, r.replayed.0, r.split_estimate.0))
        .collect();
    let count = |g: u64| (g, g, sharded.need(g), fit::need_per_gpu(&b, g));
    assert_eq!(rows, [count(f.gpus), count(2 * f.gpus)]);
    assert!(plan.split_rule.starts_with(fit::FSDP_RULE));
    // A LoRA training is sharded so too; a training with 8-bit AdamW is not: its rows over
    // several GPUs are the split estimate.
    let lora = Workload {
        mode: Mode::Lora {
            rank: 8,
            targets: vec!["q_proj".into()],
        },
        ..w.clone()
    };
    assert!(fit::Sharded::of(&budget(&lora, &BudgetSettings::h200())).is_some());
    let eight_bit = Workload {
        mode: Mode::Full {
            optimizer: Optimizer::Adamw8bit,
        },
        ..w
    };
    let b = budget(&eight_bit, &BudgetSettings::h200());
    assert!(fit::Sharded::of(&b).is_none());
    let plan = fit::plan(&b, &catalog(), 16).unwrap();
    assert!(plan.split_rule.starts_with(fit::SPLIT_RULE));
}

#[test]
fn the_planner_replays_a_rank_of_tensor_parallelism_serving_a_model() {
    // Llama 3.1 70B served in bfloat16 (141 GB of weights): no 80 GiB card holds it alone;
    // tensor parallelism over several does, over the most GPUs of the package that split its 8
    // key-value heads evenly (8 of 12), each GPU holding rank 0's fullest with NCCL's
    // communicator.
    let w = preset("llama-3.1-70b", generate(64), 2, 1024);
    let b = budget(&w, &BudgetSettings::h200());
    let sharded = fit::Sharded::of(&b).expect("tensor parallelism serves it");
    assert_eq!(sharded.strategy, fit::Strategy::TensorParallel);
    assert_eq!(
        (sharded.world(2), sharded.world(12), sharded.world(64)),
        (2, 8, 8)
    );
    let plan = fit::plan(&b, &catalog(), 16).unwrap();
    assert!(plan.split_rule.starts_with(fit::TP_RULE));
    let large = (plan.rows.iter())
        .find(|r| r.model == "large")
        .expect("a large row");
    let f = large.fit.as_ref().expect("fits over several large GPUs");
    assert!(f.gpus > 1);
    assert!(matches!(
        f.basis,
        Basis::TensorParallelReplay | Basis::TensorParallelWithinMargin
    ));
    // Two GPUs hold it, one does not.
    let room = large.room_per_gpu.0;
    assert_eq!(f.gpus, 2);
    assert!(sharded.fits(2, room) && b.peak_use() > room);
    let mut run = w.runs(b.kernels).remove(0);
    run.tensor_parallel = Some(crate::stack::tensor_parallel::TensorParallel {
        world: sharded.world(f.gpus),
        rank: 0,
    });
    let config = [allocator_config(w.allocator)];
    let p = crate::replay::Plan {
        keep: false,
        under: &config,
        outside: b.outside.bytes,
        watch: None,
    };
    let peak = crate::stack::run::replays(&run, &p).unlimited[0].peak_device;
    let need = peak + crate::replay::Nccl::h200_nvlink().bytes;
    assert_eq!(sharded.need(f.gpus), need);
    assert_eq!(f.need_per_gpu.0, need.min(room));
    // Quantized weights are not spread so: their rows are the split estimate.
    let nf4 = Workload {
        weights: WeightFormat::Nf4,
        ..w
    };
    assert!(fit::Sharded::of(&budget(&nf4, &BudgetSettings::h200())).is_none());
}

#[test]
fn fsdp2_ranks_holding_as_many_rows_allocate_alike() {
    // Llama-3.1 8B's first dimensions (4 096, 14 336, 1 024, 128 256) are multiples of 8: every
    // rank of 8 holds as many rows, and rank 0's program is the last rank's, event for event (the
    // planner replays rank 0 alone). Over 3 ranks they are not (4 096 = 3 × 1 365 + 1): the last
    // rank holds fewer rows and allocates otherwise.
    let settings = BudgetSettings::h200();
    let full = preset(
        "llama-3.1-8b",
        Mode::Full {
            optimizer: Optimizer::Adamw,
        },
        1,
        256,
    );
    let lora = Workload {
        mode: Mode::Lora {
            rank: 8,
            targets: vec!["q_proj".into()],
        },
        ..full.clone()
    };
    let run_of = |w: &Workload, world: u64, rank: u64| {
        let mut run = w.runs(settings.kernels).remove(0);
        run.sharding = Some(crate::stack::fsdp::Sharding {
            world,
            rank,
            mixed_precision: false,
        });
        run
    };
    let alike = |w: &Workload, world: u64| {
        let run = run_of(w, world, 0);
        let lora = match &run.work {
            crate::stack::run::Work::Train { lora, .. } => lora.clone(),
            _ => None,
        };
        crate::stack::fsdp::ranks_alike(&run.model, lora.as_ref(), world)
    };
    let programs_equal = |w: &Workload, world: u64| {
        let program = |rank| crate::stack::run::program(&run_of(w, world, rank)).chunks;
        program(0) == program(world - 1)
    };
    for (w, world, expected) in [(&full, 8, true), (&full, 3, false), (&lora, 8, true)] {
        assert_eq!(alike(w, world), expected, "world {world}");
        assert_eq!(programs_equal(w, world), expected, "world {world}");
    }
    // LoRA's A matrices of rank 8 have 8 rows: over 16 ranks the last 8 hold none of them.
    assert!(alike(&full, 16) && !alike(&lora, 16));
    assert!(!programs_equal(&lora, 16));
}
