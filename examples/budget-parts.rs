//! Where a budget's time goes: the emulation of the run (its program: every allocation and free)
//! and its replays through the allocator model under each setting, timed apart, then the
//! emulation and the default replay side by side as a budget runs them; each the best of three.
//! `generate` of a preset:
//!
//!     cargo run --release --example budget-parts -- MODEL BATCH CONTEXT GENERATED
//!
//! (recorded in docs/benchmarks.md).

// The programs' allocator (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use iteragpu_lab::budget::compute::allocator_config;
use iteragpu_lab::budget::workload::{AllocatorSetting, Mode, Workload};
use iteragpu_lab::budget::BudgetSettings;
use iteragpu_lab::replay::{Device, OutsideBytes, Plan};
use iteragpu_lab::stack::run::{program, replays};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: budget-parts MODEL BATCH CONTEXT GENERATED";
    let [model, batch, context, generated] = &args[..] else {
        panic!("{usage}");
    };
    let number = |s: &String| -> u64 { s.parse().expect(usage) };
    let w = Workload {
        mode: Mode::Inference {
            generated: number(generated),
        },
        batch: number(batch),
        context: number(context),
        ..Workload::preset(model).expect("a preset of data/modeles.csv")
    }
    .validated()
    .expect("a valid workload");
    let run = w.runs(BudgetSettings::h200().kernels).remove(0);
    let settings = [
        AllocatorSetting::Default,
        AllocatorSetting::ExpandableSegments,
    ];
    let (mut emulation, mut replay_times) = (Duration::MAX, [Duration::MAX; 2]);
    let mut events = 0;
    for _ in 0..3 {
        let started = Instant::now();
        let p = program(&run);
        emulation = emulation.min(started.elapsed());
        for (replay, setting) in replay_times.iter_mut().zip(settings) {
            let started = Instant::now();
            p.replay(
                allocator_config(setting),
                Device::Unlimited,
                OutsideBytes::NONE,
            );
            *replay = (*replay).min(started.elapsed());
        }
        events = p.len();
    }
    // As the budget runs them: the replay reading the events as the emulation writes them.
    let mut side_by_side = Duration::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        let plan = Plan {
            keep: false,
            under: &[allocator_config(settings[0])],
            outside: OutsideBytes::NONE,
            watch: None,
        };
        replays(&run, &plan);
        side_by_side = side_by_side.min(started.elapsed());
    }
    let per_event = |d: Duration| d.as_nanos() as f64 / events as f64;
    println!("{events} events");
    println!(
        "emulation {emulation:.1?} ({:.0} ns an event)",
        per_event(emulation)
    );
    for (replay, setting) in replay_times.iter().zip(settings) {
        println!(
            "replay    {replay:.1?} ({:.0} ns an event), {setting:?}",
            per_event(*replay)
        );
    }
    println!(
        "emulation and default replay side by side, as the budget runs them: {side_by_side:.1?}"
    );
}
