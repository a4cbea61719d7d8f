use iteragpu_lab::budget::terms::allocator_config;
use iteragpu_lab::budget::workload::{AllocatorSetting, Mode, Workload};
use iteragpu_lab::budget::BudgetSettings;
use iteragpu_lab::stack::run::program;
fn main() {
    for batch in [3u64, 12, 27, 53] {
        let w = Workload {
            mode: Mode::Inference { generated: 512 },
            batch,
            context: 8192,
            ..Workload::preset("llama-3.1-8b").unwrap()
        }
        .validated()
        .unwrap();
        let run = w.runs(BudgetSettings::h200().kernels).remove(0);
        let p = program(&run);
        for s in [
            AllocatorSetting::Default,
            AllocatorSetting::ExpandableSegments,
        ] {
            let r = p.replay(allocator_config(s), None);
            println!(
                "batch {batch} {s:?} peak alloc {} reserved {}",
                r.peak_allocated, r.peak_reserved
            );
            for (n, f) in &r.stages {
                println!(
                    "   {n}: reserved base {} peak {} end {}; alloc peak {}",
                    f.reserved_baseline_bytes,
                    f.peak_reserved_bytes,
                    f.reserved_end_bytes,
                    f.peak_allocated_bytes
                );
            }
        }
    }
}
