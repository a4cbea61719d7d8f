//! The largest batch of a proof run's specification (`scripts/gpu/hf-proof.py`) whose replay
//! completes on its emulated card (`card_bytes`), the process holding outside the allocator what
//! a process on the H200 holds as it loads its work: what a card run of the proof is planned at
//! where the planner does not plan the run itself (a rank of DDP). Batches are tried from 1 up.
//!
//!     cargo run --release --example largest-on-card -- SPEC.json [MOST]

use iteragpu_lab::budget::compute::allocator_config;
use iteragpu_lab::replay::{Device, Outside};
use iteragpu_lab::stack::run::{program, Run};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: largest-on-card SPEC.json [MOST]");
    let most: u64 = args
        .get(2)
        .map_or(256, |m| m.parse().expect("MOST, a whole number"));
    let mut spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the spec")).expect("JSON");
    let room = spec["card_bytes"].as_u64().expect("the spec's card_bytes");
    let config = allocator_config(Default::default());
    let mut largest = 0;
    for batch in 1..=most {
        spec["batch"] = batch.into();
        let run = Run::from_spec(&spec).expect("a spec the emulation runs");
        let replayed = program(&run).replay(config, Device::Card { room }, Outside::h200().bytes);
        if replayed.out_of_memory.is_some() {
            break;
        }
        largest = batch;
    }
    println!("{largest}");
}
