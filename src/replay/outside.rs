//! What a Hugging Face process holds on the GPU outside PyTorch's caching allocator: the CUDA
//! context, then what each kind of work loads the first time it runs (CUDA loads a kernel's code
//! at its first launch; cuBLAS makes its handle and cuDNN its own at their first call; autograd's
//! thread makes its handles at the first backward). So it grows by steps as the process goes from
//! loading its weights to its first forward pass, its first backward pass, its decoding.
//! Measured (`torch.cuda.mem_get_info` − `memory_reserved`, one process alone on the GPU, at the
//! end of each stage) in the kinds of process the budget describes, on a named GPU and software:
//! not a formula. A replay on a card gives the allocator the card's room less the step the
//! process has reached ([`super::driver::Driver`]). Over several GPUs, NCCL's communicator
//! ([`Nccl`]) is held beside it on each.

use super::program::Loaded;
use serde::{Deserialize, Serialize};

/// The bytes outside the allocator once the process has loaded each kind of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OutsideBytes {
    /// CUDA started, the weights and inputs copied.
    pub context: u64,
    /// After a first forward pass (a training step's, or `generate`'s prefill).
    pub forward: u64,
    /// After a first backward pass.
    pub backward: u64,
    /// While `generate` decodes.
    pub decode: u64,
}

impl OutsideBytes {
    /// Nothing outside the allocator: a replay's figures are the allocator's alone.
    pub const NONE: OutsideBytes = OutsideBytes {
        context: 0,
        forward: 0,
        backward: 0,
        decode: 0,
    };

    /// What the process holds outside the allocator once it has loaded `loaded`.
    pub fn at(self, loaded: Loaded) -> u64 {
        match loaded {
            Loaded::Context => self.context,
            Loaded::Forward => self.forward,
            Loaded::Backward => self.backward,
            Loaded::Decode => self.decode,
        }
    }

    /// What a run that trains (or generates) holds outside the allocator at its end, the most.
    pub fn at_end(self, trains: bool) -> u64 {
        match trains {
            true => self.backward,
            false => self.decode,
        }
    }
}

/// What a rank of FSDP2 holds outside the allocator beyond a process on one GPU from its first
/// forward on: the kernels of its collectives' copies, loaded as they first run. Measured on the
/// H200 (`data/hf-proof-fsdp-held-out-h200.json`'s card runs: 802 784 542 B after the forward
/// and 878 282 014 B after the backward, each 72 309 801 B above the most any process on one GPU
/// held).
pub const FSDP2_KERNELS: u64 = 72_309_801;

impl OutsideBytes {
    /// These figures with a rank of FSDP2's kernels from the first forward on.
    pub fn with_fsdp2_kernels(self) -> OutsideBytes {
        OutsideBytes {
            forward: self.forward + FSDP2_KERNELS,
            backward: self.backward + FSDP2_KERNELS,
            ..self
        }
    }
}

/// The memory outside the allocator as measured, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outside {
    pub bytes: OutsideBytes,
    pub measured_on: String,
    pub software: String,
    pub source: String,
}

impl Outside {
    /// Recorded on the H200 by `scripts/gpu/hf-proof.py` and `hf-record.py`'s card runs
    /// (`docs/benchmarks.md`, "What lives outside the allocator"): for each step, the most any of
    /// the 38 processes that ran alone on an emulated card held at the end of a stage of that step
    /// (from one process to the next the driver's own part moves by about 1.4 MB).
    pub fn h200() -> Outside {
        Outside {
            bytes: OutsideBytes {
                context: 650_782_965,
                forward: 730_474_741,
                backward: 805_972_213,
                decode: 780_806_389,
            },
            measured_on: "NVIDIA H200".into(),
            software: "PyTorch 2.11.0+cu130, transformers 5.17.0, driver 580.159.04".into(),
            source: "docs/benchmarks.md, What lives outside the allocator".into(),
        }
    }
}

/// NCCL's communicator and its buffers on each GPU of a run over several GPUs, outside the
/// allocator: made with the process group (`init_process_group("nccl", device_id=...)`, or at
/// the first collective without `device_id`), not growing with the collectives' sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nccl {
    pub bytes: u64,
    /// The GPUs of the run it was measured with.
    pub measured_gpus: u64,
    pub measured_on: &'static str,
    pub source: &'static str,
}

impl Nccl {
    /// Measured by `scripts/gpu/nccl-memory.py` on 2 H200 of one host joined by NVLink (NV18),
    /// NCCL 2.28.9 under PyTorch 2.11.0+cu130, NVLink multicast off: 880 803 840 B on each rank
    /// once the process group was made, nothing more after an all-reduce, an all-gather, a
    /// reduce-scatter of 64 MiB and an all-reduce of 256 MiB (`data/nccl-memory-h200x2.json`).
    pub fn h200_nvlink() -> Nccl {
        Nccl {
            bytes: 880_803_840,
            measured_gpus: 2,
            measured_on: "2 NVIDIA H200 joined by NVLink, NCCL 2.28.9, NVLink multicast off",
            source: "data/nccl-memory-h200x2.json (scripts/gpu/nccl-memory.py)",
        }
    }

    /// Whether the figure was measured with `gpus` GPUs (`measured`), or is carried to another
    /// number of them (`hypothesis`: more peers, other links or NVLink multicast may take more).
    pub fn status(&self, gpus: u64) -> &'static str {
        if gpus == self.measured_gpus {
            "measured"
        } else {
            "hypothesis"
        }
    }

    /// The sentence a plan over several GPUs states.
    pub fn rule(&self) -> String {
        format!(
            "NCCL's communicator and buffers: {} B on each GPU of a run over several, outside \
             the allocator; measured with {} GPUs on {} ({}); with more GPUs a hypothesis (more \
             peers, other links or NVLink multicast may take more)",
            crate::units::grouped(self.bytes),
            self.measured_gpus,
            self.measured_on,
            self.source
        )
    }
}
