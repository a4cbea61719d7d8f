//! Prediction speed: predicts 10 000 configurations (sizes spread over six orders of magnitude,
//! the three dtypes, 0 to 9 warm-up passes and 1 to 8 repetitions) and prints the time per
//! configuration. `cargo run --release --example predict-speed` (recorded in docs/benchmarks.md).

use iteragpu_lab::allocator::{ComputeCapability, WorkspaceSettings, Workspaces};
use iteragpu_lab::measure::{predict, Dtype, MeasureConfig};
use std::time::Instant;

fn main() {
    let cc = ComputeCapability::new(9, 0);
    let workspaces = Workspaces::for_gpu(cc, &WorkspaceSettings::default()).expect("defaults");
    // A fixed pseudo-random sequence (xorshift), so that every run predicts the same configurations.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |range: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        1 + state % range
    };
    let configs: Vec<MeasureConfig> = (0..10_000)
        .map(|_| MeasureConfig {
            batch: next(16),
            context: next(4096),
            width: next(8192),
            hidden: Some(next(32768)),
            dtype: Dtype::FLOATS[(next(3) - 1) as usize],
            warmup: (next(10) - 1) as u32,
            repeats: next(8) as u32,
            ..Default::default()
        })
        .collect();
    let started = Instant::now();
    let mut rows = 0;
    for c in &configs {
        rows += predict(c, cc, workspaces).expect("valid").phases.len();
    }
    let elapsed = started.elapsed();
    println!(
        "{} configurations ({rows} phase rows) predicted in {:.3} s: {:.1} µs per configuration",
        configs.len(),
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / configs.len() as f64
    );
}
