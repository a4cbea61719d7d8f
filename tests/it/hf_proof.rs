//! The budget against the GPU: every run of `data/hf-proof-h200.json`,
//! `data/hf-proof-bitsandbytes-h200.json`, `data/hf-proof-edge-h200.json`,
//! `data/hf-proof-held-out-h200.json`, `data/hf-proof-blind-h200.json`,
//! `data/hf-proof-second-blind-h200.json` and `data/hf-proof-trainer-h200.json` (real transformers
//! workloads measured on the H200 by `scripts/gpu/hf-proof.py`, some alone on a card emulated by
//! taking the memory beyond it with one `cudaMalloc` outside PyTorch's allocator) replayed as the
//! budget replays it. Each stage's peaks agree within the budget's margin, and on every emulated
//! card the replay runs out of memory exactly where the GPU did.

use iteragpu_lab::budget::proof::{check, Report, RunCheck, StageCheck};
use iteragpu_lab::budget::settings::{DDP_MARGIN_PPM, FSDP_MARGIN_PPM, MARGIN_PPM, TP_MARGIN_PPM};
use iteragpu_lab::replay::{Outside, OutsideBytes};
use iteragpu_lab::units::Bytes;

#[test]
fn every_recorded_run_is_predicted_within_the_margin() {
    let report = Report::recorded();
    assert!(
        report.records.len() >= 20,
        "the proof holds {} runs",
        report.records.len()
    );
    check_report(&report);
}

/// What the budget counts outside the allocator at each step of a process's loading is the most
/// any process of the shipped reports that ran alone on an emulated card held at the end of a
/// stage of that step: no card run held more, and each figure was held by one.
#[test]
fn what_lives_outside_the_allocator_is_the_most_the_card_runs_held() {
    let mut most = OutsideBytes::NONE;
    let mut runs = 0;
    for report in Report::all_recorded() {
        // One process on one GPU (a rank of FSDP2 holds its collectives' kernels besides:
        // `replay::outside::FSDP2_KERNELS`).
        for rec in report
            .records
            .iter()
            .filter(|r| r.spec.get("distributed").is_none())
        {
            let c = check(rec).unwrap_or_else(|e| panic!("{}: {e}", rec.name));
            if let Some(o) = c.outside {
                runs += 1;
                most.context = most.context.max(o.context);
                most.forward = most.forward.max(o.forward);
                most.backward = most.backward.max(o.backward);
                most.decode = most.decode.max(o.decode);
            }
        }
    }
    assert_eq!(runs, 74);
    assert_eq!(most, Outside::h200().bytes);
    println!("outside the allocator, the most held: {most:?}");
}

#[test]
fn every_recorded_run_of_bitsandbytes_is_predicted_within_the_margin() {
    let report = Report::recorded_bitsandbytes();
    let count = |f: &dyn Fn(&serde_json::Value) -> bool| {
        report.records.iter().filter(|r| f(&r.spec)).count()
    };
    assert_eq!(count(&|s| s["optimizer"] == "adamw-8bit"), 6);
    assert_eq!(count(&|s| s["mode"] == "qlora"), 10);
    assert_eq!(card_runs(&report), 4);
    check_report(&report);
}

#[test]
fn at_the_edge_of_a_card_the_verdicts_alternate_as_predicted() {
    let report = Report::recorded_edge();
    let outcomes: Vec<&str> = report.records.iter().map(|r| r.outcome.as_str()).collect();
    // Contexts of 3 681 to 3 686 tokens on an emulated RTX 4090, expandable segments: a larger
    // context may hold where a smaller one did not.
    assert_eq!(outcomes, ["ok", "oom", "ok", "oom", "ok", "oom"]);
    check_report(&report);
}

/// Where the run's unlimited peak of `reserved` is above the card, the allocator frees its cache
/// and retries: on six cards (serving and training, both allocator settings, two of them held
/// out) the planner's largest batch ran and the next ran out of memory, as replayed.
#[test]
fn where_the_allocator_retries_the_largest_batch_is_the_real_one() {
    let report = Report::recorded_retry();
    assert_eq!(card_runs(&report), 12);
    let fits: Vec<(&str, &str)> = (report.records.iter())
        .map(|r| (r.expect.as_deref().unwrap_or(""), r.outcome.as_str()))
        .collect();
    assert!(
        fits.iter()
            .all(|&(expect, outcome)| (expect == "fits") == (outcome == "ok")),
        "{fits:?}"
    );
    assert_eq!(fits.iter().filter(|(e, _)| *e == "fits").count(), 6);
    check_report(&report);
}

#[test]
fn every_held_out_run_is_predicted_within_the_margin() {
    let report = Report::recorded_held_out();
    let gemma3 = |r: &&iteragpu_lab::budget::proof::Record| r.spec["model_type"] == "gemma3";
    // Gemma 3 (4B and 27B) with its vision tower, each run under both orders of its masks.
    assert_eq!(report.records.iter().filter(gemma3).count(), 16);
    assert!(report
        .records
        .iter()
        .filter(gemma3)
        .all(|r| r.spec.get("mask_order").is_some()));
    assert!(report.records.len() >= 28, "{} runs", report.records.len());
    check_report(&report);
}

#[test]
fn every_run_of_the_blind_round_is_predicted_within_the_margin() {
    let report = Report::recorded_blind();
    assert_eq!(report.records.len(), 20);
    assert_eq!(card_runs(&report), 6);
    // One card run failed in cuDNN's attention rather than in the allocator, the device full.
    let failed: Vec<_> = report
        .records
        .iter()
        .filter(|r| r.outcome == "error")
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].expect.as_deref(), Some("oom"));
    println!(
        "{}: {} in {} ({} B left free on the device)",
        failed[0].name,
        failed[0].message.as_deref().unwrap_or(""),
        failed[0].failed_stage.as_deref().unwrap_or(""),
        failed[0].free_at_end.unwrap_or(0)
    );
    check_report(&report);
}

#[test]
fn every_run_of_the_second_blind_round_is_predicted_within_the_margin() {
    // Planned and recorded with the code that places new segments as the driver places them.
    let report = Report::recorded_second_blind();
    assert_eq!(report.records.len(), 18);
    assert_eq!(card_runs(&report), 6);
    assert!(report.records.iter().all(|r| r.outcome != "error"));
    check_report(&report);
}

/// `transformers.Trainer` as users launch it: the two runs its replay came from, six workloads
/// and two cards none of its rules came from, and the Phi-3 mini LoRA on an L4 that a hand-written
/// loop's budget put one batch too high; on each card the planner's largest batch ran and the
/// next ran out of memory.
#[test]
fn every_run_through_the_trainer_is_predicted_within_the_margin() {
    check_trainer_report(&Report::recorded_trainer(), 14, 3, |_| true);
}

/// `transformers.Trainer` accumulating gradients over several batches: the two runs the replay was
/// derived from (a 2-layer Llama over 2 batches, fully, and over 3 with LoRA), then runs held out
/// (Qwen2.5 0.5B over 4, Llama 3.2 1B's float32 weights under bf16 with the foreach AdamW, Gemma 2
/// 2B LoRA, Mistral 7B LoRA with recomputation over 3, Qwen3 4B with recomputation) and cards at the
/// planner's largest batch and one more (Llama 3.2 1B over 4 batches on an RTX 4090: 3, where one
/// batch a step holds 4; Qwen2.5 7B LoRA on an L4).
#[test]
fn every_run_of_the_trainer_accumulating_gradients_is_predicted_within_the_margin() {
    check_trainer_report(&Report::recorded_trainer_accumulation(), 11, 2, |args| {
        args["gradient_accumulation_steps"].as_u64() > Some(1)
    });
}

/// `transformers.Trainer` under `fp16=True` (autocast to float16 and `torch.amp.GradScaler`): the
/// two runs the replay was derived from (a 2-layer Llama trained fully in float32 and with LoRA of
/// float16 weights), then runs held out (Qwen2.5 0.5B and Qwen3 4B trained fully in float32, the
/// latter with the foreach AdamW; LoRA of Llama 3.2 1B and of Mistral 7B with recomputation in
/// float16) and cards at the planner's largest batch and one more (Llama 3.2 1B full on an RTX
/// 4090, Qwen2.5 7B LoRA on an L4).
#[test]
fn every_run_of_the_trainer_under_fp16_is_predicted_within_the_margin() {
    check_trainer_report(&Report::recorded_trainer_fp16(), 10, 2, |args| {
        args["fp16"] == true
    });
}

/// Gemma (1), Granite 3 and OLMo 2 at their public widths, none a run their replay came from.
#[test]
fn every_run_of_the_architectures_read_since_is_predicted_within_the_margin() {
    let report = Report::recorded_architectures();
    assert_eq!(report.records.len(), 15);
    let types: std::collections::BTreeSet<&str> = (report.records.iter())
        .filter_map(|r| r.spec["model_type"].as_str())
        .collect();
    assert_eq!(types, ["gemma", "granite", "olmo2"].into());
    assert_eq!(card_runs(&report), 6);
    check_report(&report);
}

/// QLoRA of a checkpoint saved in NF4 (loaded as saved, no 16-bit copy) at public widths of
/// four architectures, and on emulated cards at the planner's largest batch and one more.
#[test]
fn every_qlora_run_of_a_checkpoint_saved_in_nf4_is_predicted_within_the_margin() {
    let report = Report::recorded_prequantized();
    assert_eq!(report.records.len(), 8);
    assert!(
        report
            .records
            .iter()
            .all(|r| r.spec["loading"] == "prequantized"
                && r.spec["quantization"]["method"] == "bnb4")
    );
    assert_eq!(card_runs(&report), 4);
    check_report(&report);
}

/// FSDP2 full trainings, each recorded rank replayed alone: worlds of 2 to 64, the first rank,
/// the last and ranks holding a remainder (Llama 3.1 70B's rows over 12), with and without
/// recomputation, foreach and fused AdamW, Llama, Qwen2, Gemma 2 and Mixtral.
#[test]
fn every_recorded_rank_of_an_fsdp2_training_is_predicted_within_the_margin() {
    let report = Report::recorded_fsdp();
    let ranks: Vec<(u64, u64)> = (report.records.iter())
        .map(|r| {
            let d = &r.spec["distributed"];
            assert_eq!(d["strategy"], "fsdp", "{}", r.name);
            (
                d["world_size"].as_u64().unwrap(),
                d["rank"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ranks.len(), 14);
    assert!(ranks.contains(&(64, 63)) && ranks.contains(&(12, 11)) && ranks.contains(&(2, 1)));
    check_report(&report);
}

/// FSDP2 full trainings not used to derive the replay: Qwen2.5 7B's widths over 24 ranks (the
/// first, the last and one between), Mistral 7B's over 5 and 16 (fused AdamW), a small Llama
/// over 32 (ranks past its narrowest rows hold none of them), Phi-3 (a Gemma 2 with tied
/// embeddings, refused); and rank 0 of 8 of Llama 3.1 8B's widths alone on an emulated L4 at the
/// largest batch the replay holds there (8) and one more, which ran out of memory.
#[test]
fn every_held_out_rank_of_an_fsdp2_training_is_predicted_within_the_margin() {
    let report = Report::recorded_fsdp_held_out();
    assert_eq!(report.records.len(), 11);
    check_fsdp_report(&report, Some("tie_word_embeddings"), 2);
}

/// FSDP2 full trainings without a mixed-precision policy (the model built, gathered and reduced
/// in bfloat16): a small Llama over 3 and 4 ranks, Phi-3 over 6, Qwen2.5 7B's widths over 8 and
/// 24, Mistral 7B's over 16 (fused AdamW), Llama 3.1 70B's over 64 (a float32 one, refused); and
/// two ranks alone on emulated cards (Llama 3.1 8B's rank 0 of 8 on an L4, Qwen2.5 7B's rank 7 of
/// 8 on an RTX 4090) at the largest batch the replay holds and one more.
#[test]
fn every_rank_of_an_fsdp2_training_without_mixed_precision_is_predicted_within_the_margin() {
    let report = Report::recorded_fsdp_pure();
    assert_eq!(report.records.len(), 13);
    assert!(report
        .records
        .iter()
        .all(|r| r.spec["distributed"]["mixed_precision"] == false));
    check_fsdp_report(&report, Some("float32"), 4);
}

/// FSDP2 with PEFT LoRA (the adapters gathered in bfloat16 with their layer, only their
/// gradients reduced): the derivation's three ranks (Llama at 320 wide over 2 and 4, with and
/// without recomputation, Llama 3.1 8B's widths over 8), then ranks held out (Qwen2.5 7B's widths
/// over 8 with every projection adapted, Mistral 7B's over 4 and Phi-3's fused projections over
/// 3 without mixed precision, Llama 3.1 70B's over 16, a small Llama over 32 whose adapters' rows
/// the last ranks hold none of) and Llama 3.1 8B's ranks 0 and 7 of 8 alone on an emulated L4 at
/// the largest batch the replay holds (4) and one more.
#[test]
fn every_rank_of_an_fsdp2_lora_training_is_predicted_within_the_margin() {
    let derived = Report::recorded_fsdp_lora();
    assert_eq!(derived.records.len(), 3);
    check_report(&derived);
    let report = Report::recorded_fsdp_lora_held_out();
    assert_eq!(report.records.len(), 8);
    assert!(report.records.iter().all(|r| r.spec["mode"] == "lora"));
    check_fsdp_report(&report, None, 3);
}

/// Ranks of transformers' tensor parallelism serving a model (`tp_plan="auto"`), none used to
/// derive the replay: Llama 3.1 8B's widths over 2 and 4, Qwen2.5 7B's over 4, Mistral 7B's over
/// 8, Qwen3 8B's over 2 with a batch of one (the logits gathered as a view), Llama 3.1 70B's over
/// 8 and Mistral NeMo 12B's over 4; and two full-depth ranks (Llama 3.1 8B's rank 1 of 2 on an
/// emulated RTX 4090, Qwen2.5 7B's rank 3 of 4 on an L4) at the largest batch the replay holds
/// there and one more. `allocated` exact to 0.5 % at every stage; `reserved` within a rank's
/// margin: transformers loads the tensors on four threads, in an order that varies from run to
/// run, and the last to come may not fit in its allocator warm-up's block (a segment more, of
/// their size); the replay loads them in the checkpoint's order. A rank holds no more outside the
/// allocator than a process on one GPU.
#[test]
fn every_rank_of_tensor_parallelism_is_predicted_within_the_margin() {
    check_rank_report(
        &Report::recorded_tp(),
        "tp",
        11,
        TP_MARGIN_PPM,
        |name, c| {
            let held = c.outside.expect("a card run measures what lives outside");
            let one_gpu = Outside::h200().bytes;
            assert!(
                held.context <= one_gpu.context
                    && held.forward <= one_gpu.forward
                    && held.decode <= one_gpu.decode,
                "{name}: {held:?}"
            );
        },
    );
}

/// Checks a report of `runs` ranks spread by `strategy` (4 of them alone on emulated cards, whose
/// verdicts hold and which `on_card` checks besides), every stage within `margin_ppm`; prints the
/// worst error on a rank's peak of `reserved`.
fn check_rank_report(
    report: &Report,
    strategy: &str,
    runs: usize,
    margin_ppm: u64,
    on_card: impl Fn(&str, &RunCheck),
) {
    assert_eq!(report.records.len(), runs);
    assert_eq!(card_runs(report), 4);
    let margin = margin_ppm as f64 / 10_000.0;
    let mut worst: f64 = 0.0;
    for rec in &report.records {
        assert_eq!(
            rec.spec["distributed"]["strategy"], strategy,
            "{}",
            rec.name
        );
        let c = check(rec).unwrap_or_else(|e| panic!("{}: {e}", rec.name));
        if rec.kind == "card" {
            assert_card_verdict_holds(&rec.name, &c);
            on_card(&rec.name, &c);
        }
        let r = checked_peak(&rec.name, &c, margin);
        worst = worst.max(r.abs());
    }
    println!("worst error on a rank's peak reserved: {worst:.3} %");
}

/// Ranks of DDP with its defaults or as set (`bucket_cap_mb`, `gradient_as_bucket_view`): the five
/// the replay was derived from again, then ranks held out (Qwen2.5 7B's widths over 8, Mistral 7B
/// LoRA over 4, Llama 3.2 1B's float32 weights under autocast with tied embeddings, Gemma 2 2B with
/// recomputation and gradients as bucket views, Phi-3 mini LoRA of its fused projections, Qwen3 8B
/// with fused AdamW); and two full-depth ranks alone on emulated cards (Llama 3.2 1B full training on
/// an RTX 4090, Qwen2.5 7B LoRA with recomputation on an L4) at the largest batch the replay holds
/// there and one more. Every stage within a rank's margin; every card verdict as replayed.
#[test]
fn every_rank_of_ddp_is_predicted_within_the_margin() {
    check_rank_report(
        &Report::recorded_ddp(),
        "ddp",
        15,
        DDP_MARGIN_PPM,
        |_, _| {},
    );
}

/// Llama 3.1 8B's widths (2 layers, batch 1 × 1 024) trained under DDP on two real H200 with NCCL,
/// both ranks (`data/real-ranks-ddp-h200x2.json`): every stage's peaks of each real rank are its
/// replay's, to the byte. Outside the allocator a real rank held up to 2 283 275 B more than a
/// process on one GPU and NCCL's communicator as measured alone (its buckets' collectives'
/// kernels): within a rank's margin of what it needs.
#[test]
fn real_nccl_ranks_of_ddp_allocate_as_replayed() {
    use iteragpu_lab::replay::{Device, Nccl};
    let real: serde_json::Value =
        serde_json::from_str(include_str!("../../data/real-ranks-ddp-h200x2.json")).unwrap();
    let recorded = (Report::recorded_ddp().records.into_iter())
        .find(|r| r.name == "ddp-medium-llama-3.1-8b-full-ws4-r0")
        .expect("the derivation's rank at Llama 3.1 8B's widths");
    let runs = real["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    let config = iteragpu_lab::budget::compute::allocator_config(Default::default());
    for run in runs {
        let name = run["name"].as_str().unwrap();
        let mut spec = recorded.spec.clone();
        spec["distributed"]["world_size"] = run["world_size"].clone();
        spec["distributed"]["rank"] = run["rank"].clone();
        let program = iteragpu_lab::stack::run::program(
            &iteragpu_lab::stack::run::Run::from_spec(&spec).unwrap(),
        );
        let replayed = program.replay(config, Device::Unlimited, OutsideBytes::NONE);
        let stages = run["stages"].as_array().unwrap();
        assert_eq!(stages.len(), replayed.stages.len(), "{name}");
        let most_outside = Outside::h200().bytes.backward + Nccl::h200_nvlink().bytes;
        let margin = (replayed.peak_reserved + most_outside) / 1_000_000 * DDP_MARGIN_PPM;
        let mut beyond = 0;
        for (m, (stage, p, _)) in stages.iter().zip(&replayed.stages) {
            let field = |k: &str| m[k].as_u64().unwrap();
            assert_eq!(m["stage"], stage.as_str(), "{name}");
            assert_eq!(
                (field("peak_allocated"), field("peak_reserved")),
                (p.peak_allocated_bytes, p.peak_reserved_bytes),
                "{name} {stage}"
            );
            beyond = beyond.max(field("outside_after").saturating_sub(most_outside));
        }
        println!("{name}: every stage's peaks as replayed; outside the allocator {beyond} B more");
        assert!(
            beyond <= margin,
            "{name}: {beyond} B more outside the allocator"
        );
    }
}

/// Two of those runs again on two real H200 with NCCL, both ranks (`data/real-ranks-tp-h200x2.json`):
/// `allocated` as replayed at every stage of every rank (within 512 B: Qwen3's prefill at a batch
/// of one, whose first small tensors differ); `reserved` within a rank's margin (the
/// real ranks differ from each other and from the fake one by their loading order alone); what
/// lives outside the allocator within a process's on one GPU and NCCL's communicator.
#[test]
fn real_nccl_ranks_of_tensor_parallelism_allocate_as_replayed() {
    use iteragpu_lab::replay::{Device, Nccl};
    let real: serde_json::Value =
        serde_json::from_str(include_str!("../../data/real-ranks-tp-h200x2.json")).unwrap();
    let report = Report::recorded_tp();
    let runs = real["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let margin = TP_MARGIN_PPM as f64 / 10_000.0;
    let config = iteragpu_lab::budget::compute::allocator_config(Default::default());
    for run in runs {
        let name = run["name"].as_str().unwrap();
        let (workload, rank) = name.split_once("-nccl-r").unwrap();
        let recorded = (report.records.iter())
            .find(|r| r.name.starts_with(workload))
            .unwrap_or_else(|| panic!("{name}: no recorded rank of its workload"));
        let mut spec = recorded.spec.clone();
        spec["distributed"]["rank"] = rank.parse::<u64>().unwrap().into();
        let program = iteragpu_lab::stack::run::program(
            &iteragpu_lab::stack::run::Run::from_spec(&spec).unwrap(),
        );
        let replayed = program.replay(config, Device::Unlimited, OutsideBytes::NONE);
        let stages = run["stages"].as_array().unwrap();
        assert_eq!(stages.len(), replayed.stages.len(), "{name}");
        let one_gpu = Outside::h200().bytes;
        let nccl = Nccl::h200_nvlink().bytes;
        for (m, (stage, p, _)) in stages.iter().zip(&replayed.stages) {
            let field = |k: &str| m[k].as_u64().unwrap();
            assert_eq!(m["stage"], stage.as_str(), "{name}");
            let error =
                |k: &str, predicted: u64| (predicted as f64 / field(k) as f64 - 1.0) * 100.0;
            let a = error("peak_allocated", p.peak_allocated_bytes);
            let r = error("peak_reserved", p.peak_reserved_bytes);
            println!("{name:<45} {stage:<8} allocated {a:+.5} % reserved {r:+.3} %");
            assert!(a.abs() < 0.5, "{name} {stage}: allocated off by {a:.3} %");
            assert!(r.abs() < margin, "{name} {stage}: reserved off by {r:.3} %");
            let loaded = match stage.as_str() {
                "weights" | "inputs" => one_gpu.context,
                "prefill" => one_gpu.forward,
                _ => one_gpu.decode,
            };
            assert!(field("outside_after") <= loaded + nccl, "{name} {stage}");
        }
    }
}

/// Checks a report of FSDP2 ranks: the one run whose spec names `refused`, if any (in its config
/// or type), refused, the other runs of the grid as [`check_report`] does, and the `cards` runs on
/// emulated cards: the verdicts hold and every stage's `allocated` is exact, but where the full
/// card made the allocator free its cache and retry, a stage's `reserved` after it is off by up
/// to 22.6 %, the replay holding less than the GPU did (the cache of three streams released and
/// grown again: not yet followed exactly).
fn check_fsdp_report(report: &Report, refused: Option<&str>, cards: usize) {
    assert!(report
        .records
        .iter()
        .all(|r| r.spec["distributed"]["strategy"] == "fsdp"));
    let (out, records): (Vec<_>, Vec<_>) = (report.records.iter().cloned()).partition(|r| {
        refused.is_some_and(|f| r.spec["config"][f] == true || r.spec["dtype"] == f)
    });
    assert_eq!(out.len(), usize::from(refused.is_some()));
    for r in &out {
        assert!(iteragpu_lab::stack::run::Run::from_spec(&r.spec).is_err());
    }
    let (on_cards, grid): (Vec<_>, Vec<_>) = records.into_iter().partition(|r| r.kind == "card");
    check_report(&Report {
        records: grid,
        ..report.clone()
    });
    assert_eq!(on_cards.len(), cards);
    for rec in &on_cards {
        let c = check(rec).unwrap_or_else(|e| panic!("{}: {e}", rec.name));
        assert_card_verdict_holds(&rec.name, &c);
        // The run's peak, the figure a verdict rests on, within a rank's margin.
        let r = checked_peak(&rec.name, &c, 23.0);
        let margin = FSDP_MARGIN_PPM as f64 / 10_000.0;
        assert!(
            r.abs() < margin,
            "{}: peak reserved off by {r:.3} %",
            rec.name
        );
    }
}

/// Prints each stage's errors and checks them: `allocated` (what the software asks for,
/// predicted tensor by tensor) within 0.5 %, `reserved` within `reserved_within` %.
fn check_stages(name: &str, stages: &[StageCheck], reserved_within: f64) {
    for s in stages {
        let (a, r) = s.errors();
        println!(
            "{name:<60} {:<16} allocated {a:+.3} % reserved {r:+.3} %",
            s.stage
        );
        assert!(
            a.abs() < 0.5,
            "{name} {}: allocated off by {a:.3} %",
            s.stage
        );
        // Or one small segment (2 MiB, the allocator's unit): in a run of a few tens of MiB, a
        // tie between equal free blocks broken as the driver's addresses broke it (the trace
        // replayed with the first segment at its real address gives every block's address).
        let segment = s.measured_reserved.abs_diff(s.predicted_reserved) <= 2 << 20;
        assert!(
            r.abs() < reserved_within || segment,
            "{name} {}: reserved off by {r:.3} %",
            s.stage
        );
    }
}

/// Checks a run's stages as [`check_stages`] does and prints the errors on its peaks; returns the
/// error on its peak of `reserved`, in %.
fn checked_peak(name: &str, c: &RunCheck, reserved_within: f64) -> f64 {
    check_stages(name, &c.stages, reserved_within);
    let (a, r) = c.peak_errors();
    println!("{name:<60} peak       allocated {a:+.3} % reserved {r:+.3} %");
    r
}

/// The run alone on an emulated card ran out of memory or completed as its replay on the card.
fn assert_card_verdict_holds(name: &str, c: &RunCheck) {
    assert_eq!(
        c.card_outcome_holds(),
        Some(true),
        "{name}: {:?}",
        c.card_outcome
    );
}

/// Checks a report of `runs` runs through `transformers.Trainer`, each with `TrainingArguments`
/// that `arguments` accepts, `cards` of its cards at the planner's largest batch and one more, as
/// [`check_report`] does.
fn check_trainer_report(
    report: &Report,
    runs: usize,
    cards: usize,
    arguments: impl Fn(&serde_json::Value) -> bool,
) {
    check_runs_of(report, runs, cards, |spec| {
        spec["loop"] == "trainer" && arguments(&spec["trainer_args"])
    });
}

/// Checks a report of `runs` runs, each of a spec `each` accepts, `cards` of its cards at the
/// planner's largest batch and one more, as [`check_report`] does.
fn check_runs_of(
    report: &Report,
    runs: usize,
    cards: usize,
    each: impl Fn(&serde_json::Value) -> bool,
) {
    assert_eq!(report.records.len(), runs);
    assert!(report.records.iter().all(|r| each(&r.spec)));
    assert_largest_ran_and_next_did_not(report, cards);
    check_report(report);
}

/// `report` holds `cards` cards, each run at the planner's largest batch (which ran) and one more
/// (which ran out of memory), in that order.
fn assert_largest_ran_and_next_did_not(report: &Report, cards: usize) {
    assert_eq!(card_runs(report), 2 * cards);
    let verdicts: Vec<(&str, &str)> = (report.records.iter())
        .filter_map(|r| Some((r.expect.as_deref()?, r.outcome.as_str())))
        .collect();
    assert_eq!(verdicts, [("fits", "ok"), ("oom", "oom")].repeat(cards));
}

/// How many runs of `report` ran alone on an emulated card.
fn card_runs(report: &Report) -> usize {
    report.records.iter().filter(|r| r.kind == "card").count()
}

/// Replays every record of `report`, prints each stage's errors and the table of peaks, and
/// checks them. A card run under one of several orders of a model's masks (named
/// `…-hashN`, after the process's `PYTHONHASHSEED`) is one run of its card and size: the planner's
/// "fits" must hold under every order, its "does not fit" under at least one.
fn check_report(report: &Report) {
    let margin = MARGIN_PPM as f64 / 10_000.0;
    let mut worst_reserved: f64 = 0.0;
    // Each card and size: the planner's verdict, and whether a run of it ran out of memory.
    let mut planned: std::collections::BTreeMap<String, (Option<String>, bool)> =
        Default::default();
    let mut summary = vec![
        "| run | peak reserved, measured | predicted | error | on the card |".to_string(),
        "|---|---:|---:|---:|---|".to_string(),
    ];
    for rec in &report.records {
        let c = check(rec).unwrap_or_else(|e| panic!("{}: {e}", rec.name));
        // Every stage compared, or on a card where the run got further than the replay (see
        // `RunCheck::card_outcome_holds`), the stages the replay completed.
        let compared = c
            .stages_completed
            .map_or(rec.stages.len(), |(m, p)| m.min(p));
        assert_eq!(c.stages.len(), compared, "{}: stages", rec.name);
        // Reserved within a stage, within the margin (the worst, −0.601 %: Phi-3 mini's full
        // training with recomputation, where two equal free blocks tie as the driver's addresses
        // decide), and so the run's peak, the figure a verdict rests on.
        let r = checked_peak(&rec.name, &c, margin);
        worst_reserved = worst_reserved.max(r.abs());
        let (measured_reserved, predicted_reserved) = c.peak_reserved;
        let card = match &c.card_outcome {
            Some((measured, predicted)) => format!("{measured} (predicted {predicted})"),
            None => String::new(),
        };
        summary.push(format!(
            "| {} | {} ({}) | {} | {r:+.3} % | {card} |",
            rec.name,
            Bytes(measured_reserved).grouped(),
            Bytes(measured_reserved).gib_text(),
            Bytes(predicted_reserved).grouped(),
        ));
        assert!(
            r.abs() < margin,
            "{}: peak reserved off by {r:.3} %",
            rec.name
        );
        if let Some((measured, predicted)) = &c.card_outcome {
            assert_eq!(
                c.card_outcome_holds(),
                Some(true),
                "{}: outcome on the card {measured}, predicted {predicted}",
                rec.name
            );
            let run = rec
                .name
                .rsplit_once("-hash")
                .map_or(&*rec.name, |(run, _)| run);
            let ran = planned
                .entry(run.to_string())
                .or_insert((rec.expect.clone(), false));
            ran.1 |= measured != "ok";
        }
    }
    for (run, (expect, ran_out)) in &planned {
        assert_eq!(
            expect.as_deref() == Some("fits"),
            !ran_out,
            "{run}: the planner's verdict held"
        );
    }
    println!("{}", summary.join("\n"));
    println!("worst error on a run's peak reserved: {worst_reserved:.3} %");
}

/// Padded batches as derived: nine runs recorded on the H200 with every allocation
/// (`docs/gpu-runs/2026-12-04-h200-records`): a left-padded `generate`, and eight runs through the
/// Trainer whose collator padded rows of 29 and 33 tokens to 40 (LoRA with and without
/// recomputation, full training with AdamW foreach and with bitsandbytes' 8-bit AdamW, float32
/// weights under bf16 and under fp16 with its scaler, gradient accumulation, Qwen2's biased
/// projections), each replayed as the
/// budget replays it: every stage's peak of `reserved` to the byte, and of `allocated` to the
/// byte but in the run with recomputation (one small block, 512 B, held longer by the GPU). And
/// the prefill of three more.
#[test]
fn padded_batches_replay_the_runs_they_were_derived_from_to_the_byte() {
    let names = [
        "generate-small-llama-greedy-padded",
        "trainer-small-llama-lora-bf16",
        "trainer-small-llama-lora-bf16-checkpointing",
        "trainer-small-llama-full-adamw-torch",
        "trainer-small-llama-full-fp32-bf16",
        "trainer-small-llama-full-fp32-fp16",
        "trainer-small-llama-full-bf16-accumulation",
        "trainer-small-qwen2-lora",
        "trainer-small-llama-full-adamw-8bit",
    ];
    // And the prefill of three sampled `generate` runs (their sampling, in the decode, is not
    // replayed): at Llama 3.1 8B's widths, left-padded by 0, 100, 300 and 0 tokens; a 2-layer
    // Gemma 2 whose sliding window (24) the prompt passes; a 2-layer Llama.
    let prefills = [
        "generate-medium-llama-3.1-8b-sample-padded",
        "generate-small-gemma2-sample-padded",
        "generate-small-llama-sample-padded",
    ];
    for name in names.into_iter().chain(prefills) {
        let raw = recorded(name, prefills.contains(&name));
        assert!(
            raw["spec"]["left_padding"].is_array()
                || raw["spec"]["lengths"] == serde_json::json!([40, 29, 33]),
            "{name}: a padded batch"
        );
        // With recomputation, one block of 512 B (at most) is held across a forward and its
        // backward that the replay lets go earlier.
        let slack = if name.ends_with("checkpointing") {
            512
        } else {
            0
        };
        replays_to_the_byte(name, &raw, slack);
    }
}

/// A run recorded on the H200 on 2026-12-04 (`docs/gpu-runs/2026-12-04-h200-records`), a
/// sampled `generate` cut to its prefill (the sampling, in the decode, is not replayed).
fn recorded(name: &str, prefill_only: bool) -> serde_json::Value {
    let mut raw = recorded_in("2026-12-04-h200-records", name);
    if prefill_only {
        raw["spec"].as_object_mut().unwrap().remove("generate");
        let stages = raw["stages"].as_array_mut().unwrap();
        stages.retain(|s| s["stage"] != "decode");
    }
    raw
}

/// The raw record `name` kept in `docs/gpu-runs/{folder}`.
fn recorded_in(folder: &str, name: &str) -> serde_json::Value {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/gpu-runs")
        .join(folder);
    let file = std::fs::File::open(dir.join(format!("{name}.json.gz"))).unwrap();
    serde_json::from_reader(flate2::read::GzDecoder::new(file)).unwrap()
}

/// GLM-4 (four norms a layer, a fused `gate_up_proj`, biased q, k and v, the rotary over half of
/// each head with its pairs interleaved) and Cohere (one layer norm a layer in float32, the
/// attention and the MLP side by side, its rotary in float32 over each head's interleaved pairs,
/// the logits scaled, tied embeddings) and StarCoder2 (layer norms with biases, a plain MLP with
/// tanh GELU, every projection biased, a sliding window), each recorded on an H100 at 2 layers of
/// 320 wide: served,
/// trained fully, with LoRA, with LoRA and recomputation. Every stage's peak of `reserved` to the
/// byte, of `allocated` too but with recomputation: one 512-byte block apart (SDPA's 8-byte seed
/// and offset freed in the other order), as in the other models' replays.
#[test]
fn glm4_cohere_and_starcoder2_replay_the_runs_they_were_derived_from_to_the_byte() {
    for model_type in ["glm4", "cohere", "starcoder2"] {
        for (mode, allocated_slack) in [
            ("inference", 0),
            ("full", 0),
            ("lora", 0),
            ("lora-checkpointing", 512),
        ] {
            let name = format!("arch-small-{model_type}-{mode}");
            let raw = recorded_in("2026-12-05-h100-records", &name);
            assert_eq!(raw["spec"]["model_type"], model_type);
            replays_to_the_byte(&name, &raw, allocated_slack);
        }
    }
}

/// PEFT's `enable_input_require_grads` (LoRA with recomputation): the embeddings' output is a
/// leaf that requires grad, so the first layer's backward makes the gradients of its input too
/// (its keys' and values' among them); the leaf's own gradient goes with the graph, before the
/// Trainer's clip (it keeps `loss.detach()`). Every backward and clip stage of these recorded
/// runs allocates the sizes recorded, in their order: Gemma's leaf the scaled output of its
/// embedding module, Granite's multiplied after it, the others' the embedding itself; OLMo 2's
/// queries, keys and values projected and normed before any is viewed as heads (their views'
/// backward, a copy of the queries' gradient, comes before the values' projection's), Phi-3's
/// sliced from the fused projection before any is viewed, and its queries and keys both sliced
/// for the rotary before either is rotated (the issue's Phi-3 mini Trainer LoRA at 4 × 4 096).
#[test]
fn a_lora_with_recomputation_backward_allocates_what_the_run_allocated() {
    use iteragpu_lab::replay::trace::{Trace, TraceEvent};
    use iteragpu_lab::replay::Event;
    for (folder, name) in [
        (
            "2026-12-05-h100-records",
            "arch-small-glm4-lora-checkpointing",
        ),
        (
            "2026-12-05-h100-records",
            "arch-small-cohere-lora-checkpointing",
        ),
        (
            "2026-12-05-h100-records",
            "arch-small-starcoder2-lora-checkpointing",
        ),
        (
            "2026-12-04-h200-records",
            "arch-small-gemma-lora-checkpointing",
        ),
        (
            "2026-12-04-h200-records",
            "arch-small-granite-lora-checkpointing",
        ),
        (
            "2026-12-04-h200-records",
            "arch-small-olmo2-lora-checkpointing",
        ),
        (
            "2026-12-04-h200-records",
            "trainer-medium-phi-3-mini-lora-checkpointing-4096",
        ),
        (
            "2026-12-04-h200-records",
            "trainer-small-llama-lora-bf16-checkpointing",
        ),
    ] {
        let raw = recorded_in(folder, name);
        let trace = Trace::from_record(&raw).unwrap();
        let run = iteragpu_lab::stack::run::Run::from_spec(&raw["spec"]).unwrap();
        let program = iteragpu_lab::stack::run::program(&run);
        let events: Vec<Event> = program.events().collect();
        let stages = program.stages();
        let mut compared = 0;
        for (i, s) in trace.stages.iter().enumerate() {
            if !(s.name.ends_with(".backward") || s.name.ends_with(".clip")) {
                continue;
            }
            let recorded: Vec<u64> = (trace.events[s.begin..s.end].iter())
                .filter_map(|e| match *e {
                    TraceEvent::Alloc { bytes, .. } => Some(bytes),
                    _ => None,
                })
                .collect();
            let e = &stages[i];
            let emulated: Vec<u64> = (events[e.begin..e.end].iter())
                .filter_map(|e| match *e {
                    Event::Alloc { bytes, .. } => Some(bytes),
                    _ => None,
                })
                .collect();
            assert!(!recorded.is_empty(), "{name} {}", s.name);
            assert_eq!(emulated, recorded, "{name} {}", s.name);
            compared += 1;
        }
        assert!(compared >= 2, "{name}");
    }
}

/// Checks that the replay of a recorded run gives every stage's peak of `reserved` to the byte
/// and of `allocated` within `slack` bytes.
fn replays_to_the_byte(name: &str, raw: &serde_json::Value, slack: u64) {
    replays_within(name, raw, slack, 0);
}

/// Checks that the replay of a recorded run gives every stage's peak of `allocated` within
/// `allocated_slack` bytes and of `reserved` within `reserved_slack`.
fn replays_within(name: &str, raw: &serde_json::Value, allocated_slack: u64, reserved_slack: u64) {
    let rec: iteragpu_lab::budget::proof::Record = serde_json::from_value(serde_json::json!({
        "name": name,
        "kind": "grid",
        "expect": null,
        "spec": raw["spec"],
        "outcome": raw["outcome"],
        "card": null,
        "stages": raw["stages"],
    }))
    .unwrap();
    let c = check(&rec).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(c.stages.len(), rec.stages.len(), "{name}");
    for s in &c.stages {
        assert!(
            s.predicted_reserved.abs_diff(s.measured_reserved) <= reserved_slack,
            "{name} {}: reserved {} against {}",
            s.stage,
            s.predicted_reserved,
            s.measured_reserved
        );
        assert!(
            s.predicted_allocated.abs_diff(s.measured_allocated) <= allocated_slack,
            "{name} {}: allocated {} against {}",
            s.stage,
            s.predicted_allocated,
            s.measured_allocated
        );
    }
}

/// `generate` with `repetition_penalty` (its logits processor on every token's logits) and with
/// `max_length` for `max_new_tokens`.
#[test]
fn generate_with_a_repetition_penalty_or_a_max_length_replays_the_runs_it_was_derived_from() {
    for (name, kwarg) in [
        ("generate-small-llama-repetition", "repetition_penalty"),
        ("generate-small-llama-max-length", "max_length"),
    ] {
        let raw = recorded(name, false);
        assert!(raw["spec"]["generate"][kwarg].is_number(), "{name}");
        replays_to_the_byte(name, &raw, 0);
    }
}

/// The Trainer with `optim="adafactor"` (full training of bfloat16 weights, padded batches): each
/// parameter's float32 copies of its gradient and itself, its factored second moments and RMS,
/// the update's temporaries, in the Python loop's order; with `optim="paged_adamw_8bit"`: the
/// 8-bit states with the moments of the large parameters outside the allocator.
#[test]
fn the_trainers_adafactor_and_paged_adamw_replay_the_runs_they_were_derived_from() {
    for (name, optim) in [
        ("trainer-small-llama-full-adafactor", "adafactor"),
        (
            "trainer-small-llama-full-paged-adamw-8bit",
            "paged_adamw_8bit",
        ),
    ] {
        let raw = recorded(name, false);
        assert_eq!(raw["spec"]["trainer_args"]["optim"], optim);
        replays_to_the_byte(name, &raw, 0);
    }
}

/// `generate(do_sample=True, temperature=0.7, top_k=50, top_p=0.9)`: the warpers, the softmax and
/// multinomial's draw at every new token, with the sort's and top-k's temporaries at Llama 3's
/// vocabulary of 128 256 (the multi-block radix select, cub's radix sorts of 4 rows) and at
/// 1 160 (the in-place paths), on equal and left-padded rows.
#[test]
fn sampling_replays_the_runs_it_was_derived_from() {
    for name in [
        "generate-small-llama-sample",
        "generate-small-llama-sample-padded",
        "generate-small-gemma2-sample-padded",
        "generate-medium-llama-3.1-8b-sample-padded",
    ] {
        let raw = recorded(name, false);
        assert_eq!(raw["spec"]["generate"]["do_sample"], true, "{name}");
        replays_to_the_byte(name, &raw, 0);
    }
}

/// Beam search (`num_beams` 2 to 4, greedy and sampled, at the widths of a small Llama and of
/// Llama 3.1 8B over 1 024 tokens).
#[test]
fn beam_search_replays_the_runs_it_was_derived_from() {
    for name in [
        "generate-small-llama-beams",
        "generate-small-llama-beams-sample",
        "generate-medium-llama-3.1-8b-beams",
    ] {
        let raw = recorded(name, false);
        assert!(
            raw["spec"]["generate"]["num_beams"].as_u64() > Some(1),
            "{name}"
        );
        replays_to_the_byte(name, &raw, 0);
    }
}

/// `generate(cache_implementation="offloaded")`: every full layer's cache on the CPU between its
/// updates, the next brought back on the prefetch stream.
#[test]
fn the_offloaded_cache_replays_the_run_it_was_derived_from() {
    let name = "generate-small-llama-offloaded";
    let raw = recorded(name, false);
    assert_eq!(raw["spec"]["generate"]["cache_implementation"], "offloaded");
    replays_to_the_byte(name, &raw, 0);
}

/// TRL's SFTTrainer with its defaults (full training and LoRA of a small Llama, LoRA at Llama 3.1
/// 8B's widths): its fused LM head and logged metrics, each batch's labelled positions (which
/// the Trainer's sampler chose) read from the trace.
#[test]
fn the_sft_trainer_replays_the_runs_it_was_derived_from_to_the_byte() {
    for name in [
        "sft-small-llama-full",
        "sft-small-llama-lora",
        "sft-medium-llama-3.1-8b-lora",
    ] {
        let mut raw = recorded(name, false);
        assert_eq!(raw["spec"]["loop"], "sft", "{name}");
        let labelled = labelled_positions(&raw);
        assert_eq!(labelled.len(), 2, "{name}: one count for each step's batch");
        raw["spec"]["labelled"] = labelled.into();
        replays_to_the_byte(name, &raw, 0);
    }
}

/// A proof run's loss on the completion alone (`completion_tokens` N, as `scripts/hf-proof-plan
/// --completion` writes it): every batch drawn has batch × N labelled positions; the field is
/// refused beside `labelled`, outside the SFTTrainer and at a row's whole length.
#[test]
fn a_proof_spec_s_completion_labels_batch_times_its_tokens_in_every_batch() {
    use iteragpu_lab::stack::run::Run;
    let mut spec = recorded("sft-small-llama-full", false)["spec"].clone();
    assert!(spec.get("labelled").is_none());
    spec["completion_tokens"] = 7.into();
    let run = Run::from_spec(&spec).unwrap();
    let (batch, steps) = (
        spec["batch"].as_u64().unwrap(),
        spec["steps"].as_u64().unwrap(),
    );
    assert_eq!(
        run.labelled,
        vec![batch * 7; usize::try_from(steps).unwrap()]
    );
    let context = spec["context"].clone();
    for (field, value) in [
        ("completion_tokens", context),
        ("completion_tokens", 0.into()),
        ("labelled", serde_json::json!([batch, batch])),
        ("loop", "trainer".into()),
    ] {
        let mut bad = spec.clone();
        bad[field] = value;
        let e = Run::from_spec(&bad).unwrap_err().to_string();
        assert!(e.contains("completion_tokens"), "{field}: {e}");
    }
}

/// A proof run's `eos_token_id` (one id, or a list as a model's generation config names them)
/// gives `generate` its count of end-of-sequence tokens; anything else is refused naming it.
#[test]
fn a_proof_spec_s_end_of_sequence_ids_are_counted() {
    use iteragpu_lab::stack::run::{Run, Work};
    let spec = recorded_in("2026-12-04-h200-records", "generate-small-llama-beams")["spec"].clone();
    let eos_of = |ids: serde_json::Value| {
        let mut s = spec.clone();
        s["generate"]["eos_token_id"] = ids;
        Run::from_spec(&s).map(|run| match run.work {
            Work::Generate { eos_tokens, .. } => eos_tokens,
            Work::Train { .. } => unreachable!("a generate spec"),
        })
    };
    assert_eq!(eos_of(serde_json::Value::Null).unwrap(), 0);
    assert_eq!(eos_of(1159.into()).unwrap(), 1);
    assert_eq!(
        eos_of(serde_json::json!([128001, 128008, 128009])).unwrap(),
        3
    );
    let e = eos_of("</s>".into()).unwrap_err().to_string();
    assert!(e.contains("eos_token_id"), "{e}");
}

/// TRL's padding-free batches (`padding_free=True`, and `packing=True`, whose strategy implies
/// it; the dataset prepared already): each batch's sequences flattened into one row, the
/// attention under the mask of the packed sequences. Every allocation as recorded; the peaks of
/// `allocated` to the byte, of `reserved` within one 2 MiB segment of the small pool: the
/// recorded trace itself, replayed through the allocator model with segments placed as the
/// budget places them, needs one such segment less in the second backward (the driver placed
/// this run's first segment above the others, which changes a tie between free blocks).
#[test]
fn the_sft_trainers_padding_free_batches_replay_the_runs_they_were_derived_from() {
    for name in [
        "sft-small-llama-full-padding-free",
        "sft-small-llama-full-packing",
    ] {
        let mut raw = recorded(name, false);
        let args = &raw["spec"]["trainer_args"];
        assert!(
            args["padding_free"] == true || args["packing"] == true,
            "{name}"
        );
        let labelled = labelled_positions(&raw);
        let tokens = flattened_tokens(&raw);
        assert_eq!(tokens.len(), 2, "{name}: one row for each step's batch");
        assert_eq!(labelled.len(), 2, "{name}");
        raw["spec"]["labelled"] = labelled.into();
        raw["spec"]["tokens"] = tokens.into();
        replays_within(name, &raw, 0, 2 << 20);
    }
}

/// The tokens of each padding-free batch of a recorded SFTTrainer run: its ids, labels and
/// positions (`[1, tokens]` int64) copied to the device in a row, then the cumulative lengths
/// twice (int32, one more than the batch's sequences) and the sequence indices (int32).
fn flattened_tokens(raw: &serde_json::Value) -> Vec<u64> {
    let lengths = 4 * (raw["spec"]["batch"].as_u64().unwrap() + 1);
    let sizes: Vec<u64> = (raw["trace"]["events"].as_array().unwrap().iter())
        .filter(|e| e[0] == "alloc")
        .map(|e| e[2].as_u64().unwrap())
        .collect();
    (sizes.windows(6))
        .filter(|w| w[0] == w[1] && w[1] == w[2] && w[3] == lengths && w[4] == lengths)
        .filter(|w| w[0] % 8 == 0 && w[5] * 2 == w[0])
        .map(|w| w[0] / 8)
        .collect()
}

/// The positions TRL's fused head scored in each batch of a recorded SFTTrainer run: the length
/// of its seven float32 statistics, allocated in a row just before its tile buffer (that many
/// positions, at most 4 096, by 32 768 bfloat16 entries).
fn labelled_positions(raw: &serde_json::Value) -> Vec<u64> {
    let sizes: Vec<u64> = (raw["trace"]["events"].as_array().unwrap().iter())
        .filter(|e| e[0] == "alloc")
        .map(|e| e[2].as_u64().unwrap())
        .collect();
    (sizes.windows(8))
        .filter(|w| w[..7].iter().all(|&s| s == w[0]) && w[0] % 4 == 0)
        .filter(|w| w[7] == (w[0] / 4).min(4096) * 32_768 * 2)
        .map(|w| w[0] / 4)
        .collect()
}

/// `max_grad_norm=0` through the Trainer: the gradients' norm still computed by
/// `clip_grad_norm_` for the logs, at the end of the backward (no `clip` stage). Every stage's
/// peak of `allocated` to the byte; of `reserved`, to the byte but in the second step's backward
/// and optimizer, where the process took one more small segment (2 MiB) than the allocator model
/// gives even when it replays the run's own recorded trace (`examples/compare-trace.rs`): a placement
/// of small blocks the model does not reproduce in this run, in the margin of
/// `hf_traces::at_the_drivers_synthetic_addresses_every_stage_is_within_the_margin`.
#[test]
fn a_trainer_that_does_not_clip_replays_the_run_it_was_derived_from() {
    let name = "trainer-small-llama-full-no-clip";
    let raw = recorded(name, false);
    assert_eq!(raw["spec"]["trainer_args"]["max_grad_norm"], 0.0, "{name}");
    assert!(
        (raw["stages"].as_array().unwrap().iter())
            .all(|s| !s["stage"].as_str().unwrap().ends_with("clip")),
        "{name}"
    );
    replays_within(name, &raw, 0, 2 << 20);
}

/// PEFT's `lora_dropout` (0.1, through the Trainer): each adapter's dropout mask, kept for the
/// backward where the adapter's input needs a gradient, and its output, cast for the product.
#[test]
fn lora_dropout_replays_the_run_it_was_derived_from_to_the_byte() {
    let name = "trainer-small-llama-lora-dropout";
    let raw = recorded(name, false);
    assert_eq!(raw["spec"]["lora"]["dropout"], 0.1, "{name}");
    replays_to_the_byte(name, &raw, 0);
}

/// Serving a checkpoint saved in NF4 (bitsandbytes 4-bit with double quantization, loaded by
/// `from_pretrained`), greedy `generate`: a 2-layer Llama of 320 wide whose prefill (120 rows)
/// dequantizes every weight and whose decode (3 rows) runs bitsandbytes' own kernel, and two
/// layers at Llama 3.1 8B's widths (2 048 rows dequantized, then 2 by the kernel): every stage's
/// peaks to the byte. (In the 8B's decode, cuDNN's attention over 1 025 keys with no mask takes a
/// workspace for an instant, 266 368 B, that the replay does not make; it is not at a peak.)
#[test]
fn serving_a_checkpoint_saved_in_nf4_replays_the_runs_it_was_derived_from() {
    for name in [
        "prequantized-small-llama-bnb4-inference",
        "prequantized-medium-llama-3.1-8b-bnb4-inference",
    ] {
        let raw = recorded(name, false);
        assert_eq!(raw["spec"]["loading"], "prequantized", "{name}");
        assert_eq!(raw["spec"]["mode"], "inference", "{name}");
        replays_to_the_byte(name, &raw, 0);
    }
}

/// Held out from the rules they prove, recorded on an H100 (`data/hf-proof-padded-h100.json`): the
/// Trainer's padded batches (LoRA, full training, float32 weights under bf16 with `adamw_torch`,
/// Mistral 7B with recomputation, Gemma 2 below its window, `adamw_8bit`, `paged_adamw_8bit`),
/// LoRA dropout, `max_grad_norm=0`, Adafactor, TRL's SFTTrainer, left-padded `generate`, a
/// repetition penalty, `max_length`; and five cards at the planner's largest batch and one more.
#[test]
fn every_held_out_run_of_padded_batches_the_trainer_and_the_sft_trainer_is_predicted_within_the_margin(
) {
    let report = Report::recorded_padded();
    assert!(report.source.contains("H100"));
    let loops: std::collections::BTreeSet<&str> = (report.records.iter())
        .map(|r| r.spec["loop"].as_str().unwrap_or("generate"))
        .collect();
    assert_eq!(loops, ["generate", "sft", "trainer"].into());
    check_runs_of(&report, 30, 5, |_| true);
}

/// Beam search held out (`data/hf-proof-beams-h100.json`): 4 beams of Llama 3.1 8B's widths, 5
/// of one row of Qwen2.5 0.5B, Gemma 2's sliding layers, left-padded rows with a repetition
/// penalty, beams drawn with temperature and top-p; an L4 and an RTX 4090 at the planner's
/// largest batch and one more.
#[test]
fn every_held_out_run_of_beam_search_is_predicted_within_the_margin() {
    check_runs_of(&Report::recorded_beams(), 9, 2, |spec| {
        spec["generate"]["num_beams"].as_u64() > Some(1)
    });
}

/// TRL's padding-free and packed batches held out (`data/hf-proof-padding-free-h100.json`): full
/// training of Qwen2.5 0.5B, LoRA of Llama 3.2 1B packed, LoRA of Granite 3.1 8B cut to 8 layers
/// with recomputation; an RTX 4090 at the planner's largest batch and one more.
#[test]
fn every_held_out_run_of_padding_free_batches_is_predicted_within_the_margin() {
    check_runs_of(&Report::recorded_padding_free(), 5, 1, |spec| {
        let args = &spec["trainer_args"];
        spec["loop"] == "sft" && (args["padding_free"] == true || args["packing"] == true)
    });
}

/// TRL's loss on the completion alone held out (`data/hf-proof-completion-h100.json`): full
/// training of Qwen2.5 0.5B, LoRA of Llama 3.2 1B, of Gemma 2 2B and of Mistral 7B v0.3 cut to 8
/// layers with recomputation, each row's last 64 to 512 tokens labelled; Qwen2.5 1.5B's LoRA on an
/// L4 at the planner's largest batch and one more; and the issue's Phi-3 mini, LoRA of every
/// projection with recomputation at 4 096 tokens through the Trainer, on an L4 planned again
/// (4 ran, 5 ran out of memory).
#[test]
fn every_held_out_run_of_the_completion_alone_is_predicted_within_the_margin() {
    let report = Report::recorded_completion();
    check_runs_of(&report, 8, 2, |spec| {
        spec["completion_tokens"].as_u64() > Some(0) || spec["model_type"] == "phi3"
    });
    let phi3 = (report.records.iter())
        .filter(|r| r.spec["model_type"] == "phi3")
        .map(|r| {
            (
                r.spec["loop"].as_str(),
                r.spec["batch"].as_u64(),
                r.outcome.as_str(),
            )
        })
        .collect::<Vec<_>>();
    assert_eq!(
        phi3,
        [
            (Some("trainer"), Some(4), "ok"),
            (Some("trainer"), Some(5), "oom")
        ]
    );
}

/// Checkpoints saved in NF4 held out (`data/hf-proof-nf4-h100.json`): 8 and 1 rows decoded
/// from Llama 3.1 8B's and Qwen2.5 7B's widths cut to 8 layers, and two cards at the planner's
/// largest batch and one more (Llama 3.1 8B whole on an L4, Mistral 7B on an RTX 4090).
#[test]
fn every_held_out_run_of_a_checkpoint_saved_in_nf4_is_predicted_within_the_margin() {
    check_runs_of(&Report::recorded_nf4(), 6, 2, |spec| {
        spec["loading"] == "prequantized" && spec["quantization"]["method"] == "bnb4"
    });
}

/// Cohere held out (`data/hf-proof-cohere-h100.json`, its plan written before any run): Aya
/// Expanse 8B served, trained with LoRA (with and without recomputation) and fully, Command R's
/// widths served, and two cards at the planner's largest batch and one more (an L40S serving 22
/// and 23 rows, an RTX 4090 LoRA of 3 and 4).
#[test]
fn every_held_out_run_of_cohere_is_predicted_within_the_margin() {
    check_runs_of(&Report::recorded_cohere(), 9, 2, |spec| {
        spec["model_type"] == "cohere"
    });
}

/// GLM-4 held out (`data/hf-proof-glm4-h100.json`, its plan written before any run): GLM-4 9B
/// served, trained with LoRA (with and without recomputation) and fully, GLM-4 32B's widths
/// served, and two cards at the planner's largest batch and one more (an L40S serving 30 and 31
/// rows, an RTX 4090 LoRA of 2 and 3).
#[test]
fn every_held_out_run_of_glm4_is_predicted_within_the_margin() {
    check_runs_of(&Report::recorded_glm4(), 9, 2, |spec| {
        spec["model_type"] == "glm4"
    });
}

/// StarCoder2 held out (`data/hf-proof-starcoder2-h100.json`, its plan written before any run):
/// StarCoder2 7B served and trained with LoRA (with and without recomputation), 3B trained fully
/// and served 8 rows of 8 192 tokens (past its sliding window), and two cards at the planner's
/// largest batch and one more (an L4 serving 10 and 11 rows of 7B, an RTX 4090 LoRA of 3B of 9
/// and 10).
#[test]
fn every_held_out_run_of_starcoder2_is_predicted_within_the_margin() {
    check_runs_of(&Report::recorded_starcoder2(), 9, 2, |spec| {
        spec["model_type"] == "starcoder2"
    });
}

/// The rest of the NF4 plan held out (`data/hf-proof-nf4-rest-h100.json`): checkpoints saved in
/// NF4 decoded (Mistral 7B's widths cut to 8 layers, 16 rows; Gemma 2 2B whole, its sliding
/// window), and QLoRA of weights quantized as they load (Llama 3.2 1B; Qwen2.5 7B's widths cut to
/// 4 layers, with recomputation). Within the margin but for what is not yet followed: Gemma 2
/// 2B's 4 rows of 2 048 tokens, `allocated` exact at every stage, `reserved` 3.72 % below the run
/// from the prefill on: the run made one more segment of an MLP intermediate (4 · 2 048 · 9 216
/// bf16, 144 MiB) where the replay found room in its cache, as the sampled Qwen2.5 7B prefill did
/// the other way (the placement of segments by the driver, not the workload).
#[test]
fn the_rest_of_the_nf4_plan_is_predicted_within_the_margin_but_one() {
    let report = Report::recorded_nf4_rest();
    assert_eq!(report.records.len(), 4);
    assert!(report.records.iter().all(|r| {
        let spec = &r.spec;
        let saved = spec["loading"] == "prequantized" && spec["quantization"]["method"] == "bnb4";
        saved || spec["mode"] == "qlora"
    }));
    let beyond = "nf4-gemma-2-2b-b4-2048-64";
    let (apart, within): (Vec<_>, Vec<_>) =
        (report.records.iter().cloned()).partition(|r| r.name == beyond);
    check_report(&Report {
        records: within,
        ..report.clone()
    });
    let gemma = check(&apart[0]).unwrap();
    let mlp_intermediate = 4 * 2048 * 9216 * 2;
    for s in &gemma.stages {
        assert!(s.errors().0.abs() < 0.001, "{}: allocated", s.stage);
        let short = s.measured_reserved - s.predicted_reserved;
        let from_prefill = !matches!(s.stage.as_str(), "weights" | "inputs");
        assert_eq!(
            short,
            if from_prefill { mlp_intermediate } else { 0 },
            "{}",
            s.stage
        );
    }
}

/// Sampling held out (`data/hf-proof-sampling-h100.json`): one row, 2 to 40 rows, 130 rows (each
/// path of PyTorch's sort and top-k), vocabularies of 32 000 to 256 000, and two L4 cards at the
/// planner's largest batch and one more. Within the margin but for what is not yet followed:
/// - Qwen2.5 7B's widths cut to 8 layers, 16 rows of 1 024 tokens: `allocated` exact, `reserved`
///   7.04 % above the run from the prefill on: the replay makes one more segment of an MLP
///   intermediate (592 MiB) where the GPU found room in its cache. The run traced again, sampled
///   and greedy (`docs/gpu-runs/2026-12-05-h100-records/trace-generate-*`), gives the replay's
///   allocations (the prefill's 385 in the same order); its own trace replayed with the driver's
///   addresses gives the measured peaks, with the addresses the model gives new segments the
///   replay's: the placement of segments (here 1.8 GB above the first, and the 224 MiB ones
///   below), not the workload;
/// - Llama 3.2 1B on an L4 at 166 rows, one above the planner's largest: the replay runs out of
///   memory; the run failed in its decode too, in cuDNN's attention with under 20 MiB of the
///   device left (the verdict holds);
/// - Qwen2.5 7B on an L4 at 17 rows, one above the planner's largest: it ran. The replay is exact
///   to its prefill, and with what this process held outside the allocator while decoding
///   (743 MB) it holds on the card; the budget counts the most any H200 run held while decoding
///   (`Outside::h200`, 781 MB): the verdict is one batch short, on the safe side.
#[test]
fn every_held_out_run_of_sampling_is_predicted_within_the_margin_but_two() {
    use iteragpu_lab::replay::Device;
    let report = Report::recorded_sampling();
    assert_eq!(report.records.len(), 10);
    assert!(report
        .records
        .iter()
        .all(|r| r.spec["generate"]["do_sample"] == true));
    let beyond = [
        "generate-sample-qwen2.5-7b-8layers-b16-1024-16",
        "card-generate-sample-qwen2.5-7b-2048-128-l4-b17",
    ];
    let (apart, within): (Vec<_>, Vec<_>) =
        (report.records.iter().cloned()).partition(|r| beyond.contains(&r.name.as_str()));
    check_report(&Report {
        records: within,
        ..report.clone()
    });
    let failed = report
        .records
        .iter()
        .find(|r| r.outcome == "error")
        .unwrap();
    assert!(failed.name.ends_with("-b166") && failed.alloc_retries == Some(0));
    assert!(failed.free_at_end < Some(20 << 20));
    let [grid, card] =
        beyond.map(|name| check(apart.iter().find(|r| r.name == name).unwrap()).unwrap());
    let (a, r) = grid.peak_errors();
    assert!(a.abs() < 0.001 && (7.0..7.1).contains(&r), "{a} {r}");
    assert!(grid.stages.iter().all(|s| s.errors().0.abs() < 0.01));
    // The card at 17 rows: exact to the prefill, run out of memory in the replay's decode...
    assert_eq!(
        card.card_outcome,
        Some(("ok".into(), "oom in decode".into()))
    );
    assert!(card
        .stages
        .iter()
        .all(|s| s.errors().0.abs() < 0.001 && s.errors().1.abs() < 0.001));
    // ...for the budget's figure outside the allocator while decoding, above this run's.
    let held = card.outside.unwrap();
    assert!(held.decode < Outside::h200().bytes.decode);
    let rec = apart.iter().find(|r| r.name == beyond[1]).unwrap();
    let program = iteragpu_lab::stack::run::program(
        &iteragpu_lab::stack::run::Run::from_spec(&rec.spec).unwrap(),
    );
    let config = iteragpu_lab::budget::compute::allocator_config(Default::default());
    let room = rec.card.as_ref().unwrap().card_bytes;
    let with_its_own = program.replay(config, Device::Card { room }, held);
    assert!(
        with_its_own.out_of_memory.is_none(),
        "{:?}",
        with_its_own.out_of_memory
    );
}

/// A run that failed otherwise than out of memory counts on a card only with the device full.
#[test]
fn a_failure_counts_on_a_card_only_with_the_device_full() {
    let mut report: serde_json::Value =
        serde_json::from_str(iteragpu_lab::budget::proof::RECORDED_SAMPLING).unwrap();
    let failed = (report["records"].as_array_mut().unwrap().iter_mut())
        .find(|r| r["outcome"] == "error")
        .unwrap();
    failed["free_at_end"] = (20u64 << 20).into();
    let text = serde_json::to_string(&report).unwrap();
    let err = Report::parse(text.as_bytes(), "r.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("the device full"), "{err}");
}
