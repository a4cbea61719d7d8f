//! What a budget is made with besides the workload: the kernels' workspaces of the GPU's
//! architecture, what lives outside the allocator as measured, the user's reserve; and the
//! margin the proofs measured.

use crate::replay::Outside;
use crate::stack::process::Kernels;

/// The margin added to a budget: the worst error of the replays' peak `reserved` against the
/// H200 in the proofs (−0.601 %, Phi-3 mini's full training with recomputation, its peak of
/// `allocated` exact: a tie between equal free blocks broken otherwise than the driver's addresses
/// broke it), rounded up to the next 0.05 %, in millionths (`docs/benchmarks.md`, "Fit verdicts
/// on the real card").
pub const MARGIN_PPM: u64 = 6_500;
/// The margin of a rank of FSDP2 over several GPUs: the worst error of a rank's peak `reserved`
/// against the H200 (−0.853 %, Qwen2.5 7B's widths, rank 7 of 8, alone on an emulated RTX 4090
/// where the allocator freed its cache of three streams and retried:
/// `data/hf-proof-fsdp-pure-h200.json`), rounded up to the next 0.05 %, in millionths.
pub const FSDP_MARGIN_PPM: u64 = 9_000;
/// The margin of a rank of tensor parallelism serving a model over several GPUs: the worst error
/// of a rank's peak `reserved` against the H200 (−3.858 %, Llama 3.1 8B's widths at 4 layers,
/// rank 1 of 2: transformers loads the weights on four threads, in an order that varies from run
/// to run, and which of the last tensors spills out of its allocator warm-up's block decides how
/// the prefill's blocks fit; `data/hf-proof-tp-h200.json`), rounded up to the next 0.05 %, in
/// millionths.
pub const TP_MARGIN_PPM: u64 = 39_000;
/// The margin of a rank of DDP over several GPUs: a rank is the run on one GPU and DDP's own
/// buffers, each replayed allocation by allocation, so the one-GPU margin; the worst error of a
/// rank's peak `reserved` against the H200 is within it (+0.489 %, Llama 3.2 1B's float32
/// weights under autocast, in AdamW's step: `data/hf-proof-ddp-h200.json`).
pub const DDP_MARGIN_PPM: u64 = MARGIN_PPM;
/// Where the margin comes from, said in every budget.
pub const MARGIN_SOURCE: &str = "the worst error of a replay's peak reserved against the H200 in \
scripts/gpu/hf-proof.py and hf-record.py (docs/benchmarks.md, Fit verdicts on the real card)";

/// The largest reserve `--reserve-gib` takes: 2^50 bytes (1 PiB), more than any GPU.
pub const MAX_RESERVE_BYTES: u64 = 1 << 50;

/// The inputs of a budget besides the workload.
#[derive(Debug, Clone)]
pub struct BudgetSettings {
    /// Workspace sizes of the GPU's architecture.
    pub kernels: Kernels,
    pub outside: Outside,
    /// A reserve chosen by the user.
    pub reserve_bytes: u64,
}

impl BudgetSettings {
    /// PyTorch's defaults for the architecture `cc`, the outside memory measured on the H200,
    /// and a reserve.
    pub fn for_gpu(cc: crate::allocator::ComputeCapability, reserve_bytes: u64) -> BudgetSettings {
        BudgetSettings {
            kernels: Kernels::for_gpu(cc),
            outside: Outside::h200(),
            reserve_bytes,
        }
    }

    /// The H200's architecture (9.0), no reserve.
    pub fn h200() -> BudgetSettings {
        BudgetSettings::for_gpu(crate::allocator::ComputeCapability::new(9, 0), 0)
    }

    /// A card of `memory` bytes less the reserve: what the run and what lives outside the
    /// allocator may use.
    pub fn room(&self, memory: u64) -> u64 {
        memory.saturating_sub(self.reserve_bytes)
    }
}
