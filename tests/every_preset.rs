//! Every shipped preset, trained and served, searched for its largest batch and context on every
//! GPU of the shipped catalog under both allocator settings (`budget --fit --max-batch`,
//! `--max-context`): each search ends with a table, and on the H200 each largest batch holds
//! while the next one does not, as the budgets of those two batches say. Heavy: it runs in
//! release builds (`scripts/test` runs it so), and says it is skipped in debug ones.

use iteragpu_lab::budget::fit::{memory_bytes, OneGpu, Size, SizeSearch};
use iteragpu_lab::budget::{budget, AllocatorSetting, BudgetSettings, Mode, Optimizer, Presets};
use iteragpu_lab::budget::{workload::MAX_TOKENS, Workload};
use iteragpu_lab::catalog::Catalog;

/// The modes a preset is searched in: served, LoRA on its attention's first two projections (or
/// the first two linear modules it has), full training with AdamW.
fn modes(w: &Workload) -> Vec<Mode> {
    let mut linears: Vec<String> = Vec::new();
    for p in w.model.parameters() {
        if p.is_linear_weight() && p.used_by_text() && !linears.iter().any(|m| m == p.module()) {
            linears.push(p.module().to_string());
        }
    }
    linears.truncate(2);
    vec![
        Mode::Inference { generated: 16 },
        Mode::Lora {
            rank: 8,
            targets: linears,
        },
        Mode::Full {
            optimizer: Optimizer::Adamw,
        },
    ]
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "heavy: runs in release builds (scripts/test runs it with --release)"
)]
fn every_preset_finds_its_largest_sizes_and_each_batch_is_the_edge_on_the_h200() {
    let catalog = Catalog::load(None).expect("the shipped catalog");
    let h200 = catalog
        .rows
        .iter()
        .find(|r| r.model == "h200")
        .map(memory_bytes)
        .expect("the catalog sells the H200");
    let settings = BudgetSettings::h200();
    let both = [
        AllocatorSetting::Default,
        AllocatorSetting::ExpandableSegments,
    ];
    let mut checked = 0;
    for preset in &Presets::builtin().rows {
        let name = preset.preset.as_str();
        let base = Workload::preset(name).expect("a shipped preset");
        for mode in modes(&base) {
            let w = Workload {
                mode: mode.clone(),
                batch: 1,
                context: 512,
                ..base.clone()
            }
            .validated()
            .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
            for size in [Size::Batch, Size::Context] {
                // Through the command line: a table, no panic.
                let mut cmd =
                    assert_cmd::Command::cargo_bin("mesure_memoire").expect("the program is built");
                cmd.args(["budget", "--model", name, "--context", "512", "--fit"]);
                cmd.arg(match size {
                    Size::Batch => "--max-batch",
                    Size::Context => "--max-context",
                });
                match &mode {
                    Mode::Inference { .. } => {
                        cmd.args(["--mode", "inference", "--generated", "16"])
                    }
                    Mode::Lora { targets, .. } => {
                        cmd.args(["--mode", "lora", "--targets", &targets.join(",")])
                    }
                    Mode::Full { .. } => cmd.args(["--mode", "full"]),
                };
                let out = cmd.output().expect("mesure_memoire runs");
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && text.contains("h200"),
                    "{name} {mode:?} {size:?}: {}\n{text}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            // On the H200, under both settings: the largest batch holds and the next does not.
            let mut search =
                SizeSearch::new(&w, &settings, Size::Batch, MAX_TOKENS, &[h200], &both).unwrap();
            let found = search.largest_of_each(&both.map(|s| (h200, s)));
            for (setting, n) in both.into_iter().zip(found) {
                let holds = |batch: u64| {
                    let w = Workload {
                        batch,
                        allocator: setting,
                        ..w.clone()
                    };
                    let b = budget(&w.validated().expect("a size searched"), &settings);
                    OneGpu::new(&b).verdict(h200, setting).0
                };
                match n {
                    Some(n) => {
                        assert!(holds(n), "{name} {mode:?} {setting:?}: batch {n} holds");
                        if n < search.limit() {
                            assert!(!holds(n + 1), "{name} {mode:?} {setting:?}: {n} + 1");
                        }
                    }
                    None => assert!(!holds(1), "{name} {mode:?} {setting:?}: batch 1"),
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 100, "{checked} edges checked");
}
