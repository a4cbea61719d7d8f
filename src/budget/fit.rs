//! The fit planner: for every GPU model and duration of the catalog, the fewest lots whose GPUs
//! hold the workload, the headroom left and the exact price, cheapest first. On one GPU the
//! verdict is the replay's: the run replayed on a card of the offer's memory less the reserve
//! (the allocator given that room less what the process holds outside it as it goes) either
//! completes or runs out of memory, as on the card; a fit closer than the proof's margin is
//! flagged. A budget made for the planner starts those replays beside its own, as soon as its
//! replay shows one needed ([`crate::replay::Watched`]); the planner runs the others. Over
//! several GPUs it is the split rule's estimate, said so. [`SizeSearch`] finds the largest batch
//! or context that holds on each card.

use super::compute::{allocator_config, Budget, CardReplay};
use super::settings::BudgetSettings;
use super::terms::{Place, Split};
use super::workload::{AllocatorSetting, Workload, WorkloadError};
use crate::catalog::{Catalog, CatalogRow, CatalogSource};
use crate::money::Cents;
use crate::replay::{Device, Nccl, Outside, OutsideBytes, Plan, Program};
use crate::stack::process::Kernels;
use crate::stack::run::{program, replays};
use crate::stack::tensor_parallel::TensorParallel;
use crate::units::{Bytes, GIB};
use rust_decimal::prelude::ToPrimitive;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The split rule over several GPUs, stated with every plan.
pub const SPLIT_RULE: &str = "over several GPUs (an estimate, not replayed): weights, adapters, \
gradients and optimizer states sharded evenly (ZeRO-3 / FSDP); the KV cache split by KV heads \
(each GPU holds ⌈kv_heads / GPUs⌉ heads); activations, workspaces, the allocator's free blocks, \
what lives outside the allocator and the reserve whole on every GPU, with NCCL's communicator \
(as follows): on the high side where the free blocks and temporaries come from sharded tensors \
(AdamW's, autocast's copies), which a sharded run holds in part. On one GPU the verdict is the \
replay's on the card.";

/// How a full training's rows over several GPUs are reached, stated with the plan.
pub const FSDP_RULE: &str = "over several GPUs, a full or LoRA training: FSDP2 as torchtitan and \
accelerate apply it (fully_shard on every decoder layer then the root, AdamW on the shards; the \
model built, gathered and reduced in its weights' type, or for float32 weights under autocast, \
built in float32, gathered in the autocast's type and reduced in float32), each rank processing \
the batch; replayed rank by rank on the allocator model, the busier of rank 0 and the last rank \
(rank 0 alone where every parameter's first dimension is a multiple of the world: every rank then \
holds as many rows and allocates alike), proven against the H200 through PyTorch's fake process \
group (data/hf-proof-fsdp*-h200.json); what lives outside the allocator as on one GPU with \
FSDP2's kernels, and NCCL's communicator (as follows); a fit with less headroom than 0.9 % of a \
rank's need (the worst error of a rank's peak reserved against the H200, on a full card) is \
marked within the margin. Other workloads: the split rule's estimate.";

/// How a served model's rows over several GPUs are reached, stated with the plan.
pub const TP_RULE: &str = "over several GPUs, serving: transformers' tensor parallelism \
(from_pretrained with tp_plan=\"auto\": the heads, the MLP's width and the head's rows split over \
the ranks, the embeddings and norms whole, the logits gathered), over the most GPUs of the \
package that split the model evenly (whole heads, as transformers requires; the others idle); \
rank 0 replayed on the allocator model (every rank allocates alike), proven against the H200 \
through PyTorch's fake process group (data/hf-proof-tp-h200.json); what lives outside the \
allocator as on one GPU, and NCCL's communicator (as follows). Other workloads: the split \
rule's estimate.";

/// How a training's rows are reached under DDP (`budget --gpus N --parallel ddp`).
pub const DDP_RULE: &str = "over several GPUs by DDP: DistributedDataParallel with its defaults \
(every rank holding the whole model, its gradients copied into flat buckets, one a dtype until \
the first backward, then rebuilt in the order they became ready, a first of 1 MiB then 25 MiB \
or more each; the parameters and buffers broadcast at its construction, the buffers before \
every forward), each rank processing the batch; rank 0 replayed on the allocator model (every \
rank allocates alike), proven against the H200 through PyTorch's fake process group \
(data/hf-proof-ddp-h200.json); what lives outside the allocator as on one GPU, and NCCL's \
communicator (as follows); a fit with less headroom than 0.65 % of a rank's need (the one-GPU \
margin, which the rank's errors against the H200 are within) is marked within the margin.";

/// How a verdict was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The card at its fullest in the unlimited replay (`reserved` and what lives outside the
    /// allocator) fits: nothing to replay.
    PeakFits,
    /// The run replayed on the card (its cache freed and retried when full, as PyTorch does):
    /// it completed.
    ReplayCompleted,
    /// It fits, but with less headroom than the proof's margin: the verdict is within the
    /// replays' measured error.
    WithinMargin,
    /// The run replayed on the card ran out of memory (or even its `allocated` with what lives
    /// outside the allocator exceeds it).
    ReplayOutOfMemory,
    /// Several GPUs: the split rule's estimate.
    SplitEstimate,
    /// Several GPUs: FSDP2's busiest rank replayed (a full training sharded as
    /// [`crate::stack::fsdp`] says), with NCCL's communicator beside it.
    RankReplay,
    /// The same, with less headroom than the proof's margin.
    RankReplayWithinMargin,
    /// Several GPUs: a rank of tensor parallelism serving the model replayed (as
    /// [`crate::stack::tensor_parallel`] says), with NCCL's communicator beside it.
    TensorParallelReplay,
    /// The same, with less headroom than the proof's margin.
    TensorParallelWithinMargin,
    /// Several GPUs: a rank of DDP replayed (as [`crate::stack::ddp`] says), with NCCL's
    /// communicator beside it.
    DdpReplay,
    /// The same, with less headroom than the proof's margin.
    DdpWithinMargin,
}

/// One GPU model over one duration.
#[derive(Debug, Clone, Serialize)]
pub struct FitRow {
    pub model: String,
    pub display_name: String,
    pub duration_days: u32,
    pub memory_per_gpu: Bytes,
    /// What the run may use of each GPU: its memory less the reserve.
    pub room_per_gpu: Bytes,
    /// `None` when no number of lots up to the limit holds the workload.
    pub fit: Option<Fit>,
    /// The one-GPU verdict's basis.
    pub basis: Basis,
    /// On one GPU, the other allocator setting and its verdict, where the verdict differs.
    pub other_setting: Option<OtherSetting>,
    /// With the most GPUs tried, what one GPU lacks (when nothing fits).
    pub shortfall: Option<Bytes>,
    /// A lot of this offer holds more GPUs than the most tried (`--max-gpus`): not tried.
    pub lot_above_max_gpus: bool,
}

/// The one-GPU verdict under the other allocator setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OtherSetting {
    pub allocator: AllocatorSetting,
    pub fits: bool,
}

/// The fewest lots that hold the workload.
#[derive(Debug, Clone, Serialize)]
pub struct Fit {
    pub lots: u64,
    pub gpus: u64,
    /// What the run uses of each GPU at its fullest (for one GPU: the replay's peak of
    /// `reserved` with what lives outside the allocator then, at most the room where the
    /// allocator freed its cache and retried).
    pub need_per_gpu: Bytes,
    /// The room less that need.
    pub headroom_per_gpu: Bytes,
    pub lot_price_usd_cents: Cents,
    pub total_usd_cents: Cents,
    pub basis: Basis,
}

/// Every catalog offer against one budget.
#[derive(Debug, Clone, Serialize)]
pub struct FitPlan {
    pub workload: String,
    /// What the run uses of one GPU at its fullest (the `need / GPU` of a one-GPU row).
    pub need_on_one_gpu: Bytes,
    pub budget_needed: Bytes,
    pub split_rule: String,
    /// NCCL's communicator counted on each GPU of a row over several.
    pub nccl: Nccl,
    pub margin_rule: String,
    /// Why the verdicts are not replayed ones, where they are not ([`Budget::not_replayed`]).
    pub not_replayed: Option<String>,
    pub max_gpus: u64,
    pub catalog: CatalogSource,
    /// Offers that fit, cheapest first, then those that do not.
    pub rows: Vec<FitRow>,
}

#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("--max-gpus must be between 1 and {MAX_GPUS}")]
    NoGpus,
    #[error("the price of {lots} lots of {model} overflows")]
    Overflow { model: String, lots: u64 },
}

/// The most GPUs the planner tries per offer (so at most as many lots as a catalog's prices are
/// bounded for).
pub const MAX_GPUS: u64 = crate::catalog::MAX_LOTS;

impl crate::status::Classify for FitError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// What one GPU of `gpus` holds of each term at the budget's peak under the split rule (the
/// terms in the budget's order).
pub fn shares(budget: &Budget, gpus: u64) -> Vec<u64> {
    let kv_heads = budget.workload.model.kv_heads.max(1);
    budget
        .terms
        .iter()
        .map(|t| {
            let b = t.at_peak.0;
            match t.split {
                Split::Sharded => b.div_ceil(gpus),
                Split::KvHeads => (b / kv_heads).saturating_mul(kv_heads.div_ceil(gpus)),
                Split::PerGpu => b,
            }
        })
        .collect()
}

/// What the run uses of each of `gpus` GPUs at its fullest under the split rule: its share of
/// the allocator's terms and what lives outside the allocator, with NCCL's communicator where
/// there are several (the reserve is taken off the card's room).
pub fn need_per_gpu(budget: &Budget, gpus: u64) -> u64 {
    let nccl = if gpus > 1 {
        Nccl::h200_nvlink().bytes
    } else {
        0
    };
    budget
        .terms
        .iter()
        .zip(shares(budget, gpus))
        .filter(|(t, _)| t.place != Place::Reserve)
        .fold(nccl, |s, (_, b)| s.saturating_add(b))
}

/// The catalog memory of a GPU in bytes (GiB × 2^30, rounded down; beyond 2^64 − 1, that).
pub fn memory_bytes(row: &CatalogRow) -> u64 {
    row.memory_per_gpu_gib
        .checked_mul(rust_decimal::Decimal::from(GIB))
        .and_then(|bytes| bytes.floor().to_u64())
        .unwrap_or(u64::MAX)
}

/// A card a run is replayed on: the allocator setting, and the card's room (its memory less
/// the reserve).
pub type Card = (AllocatorSetting, u64);

/// What a run's peaks decide alone on a card of `room` bytes: it holds when the card at its
/// fullest (`peak_device`: `reserved` and what lives outside the allocator, when known for the
/// setting) is within the room, not when its peak of `allocated` with what lives outside is
/// beyond it; `None` between the two, where a replay on the card decides.
fn by_peaks(peak_in_use: u64, peak_device: Option<u64>, room: u64) -> Option<bool> {
    if peak_device.is_some_and(|r| r <= room) {
        Some(true)
    } else if peak_in_use > room {
        Some(false)
    } else {
        None
    }
}

/// Whether every one of `programs` completes on each of `cards`, the process holding `outside`
/// beside the allocator: as `beside` says where it has the program and the card (the replays a
/// budget made beside its own), else by the replays, side by side on every core.
fn complete_on_cards(
    programs: &[Arc<Program>],
    cards: &[Card],
    outside: OutsideBytes,
    beside: &[CardReplay],
) -> Vec<bool> {
    use rayon::prelude::*;
    cards
        .par_iter()
        .map(|&(setting, room)| {
            programs.par_iter().enumerate().all(|(index, program)| {
                beside
                    .iter()
                    .find(|r| (r.program, r.room, r.allocator) == (index, room, setting))
                    .map(|r| r.completed)
                    .unwrap_or_else(|| {
                        let card = Device::Card { room };
                        let replayed = program.replay(allocator_config(setting), card, outside);
                        replayed.out_of_memory.is_none()
                    })
            })
        })
        .collect()
}

/// The one-GPU verdicts of one workload, replayed once per card.
pub struct OneGpu<'a> {
    budget: &'a Budget,
    programs: Vec<Arc<Program>>,
    verdicts: HashMap<Card, bool>,
}

impl<'a> OneGpu<'a> {
    pub fn new(budget: &'a Budget) -> OneGpu<'a> {
        OneGpu {
            budget,
            programs: budget.programs.clone(),
            verdicts: HashMap::new(),
        }
    }

    /// What the run may use of a card of `memory` bytes: the card less the reserve.
    pub fn room(&self, memory: u64) -> u64 {
        memory.saturating_sub(self.budget.held_at_peak(Place::Reserve))
    }

    /// The programs of the workload's runs (the budget's, or emulated again for a budget read
    /// from a file).
    fn programs(&mut self) -> Vec<Arc<Program>> {
        let b = self.budget;
        if self.programs.is_empty() {
            self.programs = b
                .workload
                .runs(b.kernels)
                .iter()
                .map(|run| Arc::new(program(run)))
                .collect();
        }
        self.programs.clone()
    }

    /// What the budget's peaks decide alone on a card (the card at its fullest is known for
    /// the budget's own setting; its peak of `allocated` is every setting's).
    fn decided_by_peaks(&self, (setting, room): Card) -> Option<bool> {
        let b = self.budget;
        let peak_device = (setting == b.workload.allocator).then(|| b.peak_use());
        by_peaks(b.peak_in_use.0, peak_device, room)
    }

    /// Whether the run holds on a card of `memory` bytes, and on what basis.
    pub fn verdict(&mut self, memory: u64, setting: AllocatorSetting) -> (bool, Basis) {
        let card = (setting, self.room(memory));
        match self.decided_by_peaks(card) {
            Some(true) => return (true, Basis::PeakFits),
            Some(false) => return (false, Basis::ReplayOutOfMemory),
            None => {}
        }
        self.replay_open(&[(memory, setting)]);
        match self.verdicts[&card] {
            true => (true, Basis::ReplayCompleted),
            false => (false, Basis::ReplayOutOfMemory),
        }
    }

    /// Replays side by side, on every core, the verdicts on `cards` (their memory and the
    /// setting) that the peaks leave open and no replay gave yet.
    pub fn replay_open(&mut self, cards: &[(u64, AllocatorSetting)]) {
        let mut open: Vec<Card> = Vec::new();
        for &(memory, setting) in cards {
            let card = (setting, self.room(memory));
            if self.decided_by_peaks(card).is_none()
                && !self.verdicts.contains_key(&card)
                && !open.contains(&card)
            {
                open.push(card);
            }
        }
        if open.is_empty() {
            return;
        }
        let (programs, b) = (self.programs(), self.budget);
        let fits = complete_on_cards(&programs, &open, b.outside.bytes, &b.replayed_on_cards);
        self.verdicts.extend(open.into_iter().zip(fits));
    }
}

/// A workload spread over several GPUs rank by rank, each count of GPUs replayed once, with what
/// lives outside the allocator and NCCL's communicator: a full or LoRA training sharded by
/// FSDP2 (rank 0, whole chunks of every shard, and the last rank, the remainder re-padded as it
/// loads), or a model served by tensor parallelism (rank 0 of the most GPUs that split it
/// evenly: every rank alike). A card holds the run when its ranks complete on it: at their
/// fullest without limit, or replayed on the card (the cache freed and retried when full, as on
/// one GPU). Only for the runs these are emulated for.
pub struct Sharded<'a> {
    workload: &'a Workload,
    /// Its budget on one GPU, for the split rule's estimate beside the replays ([`Sharded::spread`]);
    /// none where the spread alone is asked (a size search).
    budget: Option<&'a Budget>,
    kernels: Kernels,
    pub strategy: Strategy,
    /// What a rank holds outside the allocator as it goes: a process's (with FSDP2's kernels
    /// under FSDP2).
    outside: crate::replay::OutsideBytes,
    ranks: std::cell::RefCell<HashMap<u64, std::rc::Rc<Ranks>>>,
    verdicts: std::cell::RefCell<HashMap<(u64, u64), bool>>,
}

/// How a workload is spread over several GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// FSDP2 (`fully_shard` per decoder layer then the root), each rank training on the batch.
    Fsdp2,
    /// transformers' tensor parallelism (`tp_plan="auto"`), every rank serving the batch.
    TensorParallel,
    /// `DistributedDataParallel`, every rank training the whole model on the batch.
    Ddp,
}

impl Strategy {
    /// Its name in the text.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Fsdp2 => "FSDP2",
            Strategy::TensorParallel => "tensor parallelism",
            Strategy::Ddp => "DDP",
        }
    }

    /// The rule the rows over several GPUs follow.
    pub fn rule(self) -> &'static str {
        match self {
            Strategy::Fsdp2 => FSDP_RULE,
            Strategy::TensorParallel => TP_RULE,
            Strategy::Ddp => DDP_RULE,
        }
    }

    /// The worst error of a rank's peak `reserved` against the H200, in millionths.
    fn margin_ppm(self) -> u64 {
        match self {
            Strategy::Fsdp2 => super::settings::FSDP_MARGIN_PPM,
            Strategy::TensorParallel => super::settings::TP_MARGIN_PPM,
            Strategy::Ddp => super::settings::DDP_MARGIN_PPM,
        }
    }

    /// A fit of its ranks' replay, closer than the margin or not.
    fn basis(self, within_margin: bool) -> Basis {
        match (self, within_margin) {
            (Strategy::Fsdp2, false) => Basis::RankReplay,
            (Strategy::Fsdp2, true) => Basis::RankReplayWithinMargin,
            (Strategy::TensorParallel, false) => Basis::TensorParallelReplay,
            (Strategy::TensorParallel, true) => Basis::TensorParallelWithinMargin,
            (Strategy::Ddp, false) => Basis::DdpReplay,
            (Strategy::Ddp, true) => Basis::DdpWithinMargin,
        }
    }
}

/// Whether `budget`'s workload is a full training with AdamW or a LoRA of unquantized weights,
/// written by hand (no Trainer), of a model without a vision tower: what FSDP2 and DDP are
/// replayed for.
fn trained_by_hand(w: &Workload) -> bool {
    matches!(
        w.mode,
        super::workload::Mode::Full {
            optimizer: super::workload::Optimizer::Adamw
        } | super::workload::Mode::Lora { .. }
    ) && w.weights == super::workload::WeightFormat::Dense
        && !w.trainer
        && w.model.vision.is_none()
}

/// The ranks replayed of one count of GPUs: their programs and figures.
struct Ranks {
    programs: Vec<Program>,
    figures: Vec<RankFigures>,
}

impl Ranks {
    /// The busier rank's use at its fullest (with NCCL's communicator).
    fn need(&self) -> u64 {
        (self.figures.iter())
            .map(|f| f.need_per_gpu.0)
            .max()
            .unwrap_or(Nccl::h200_nvlink().bytes)
    }
}

/// One rank of FSDP2 replayed without limit.
#[derive(Debug, Clone, Serialize)]
pub struct RankFigures {
    pub rank: u64,
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    /// `reserved` and what lives outside the allocator at its fullest, with NCCL's communicator.
    pub need_per_gpu: Bytes,
    /// The stage of that fullest moment, and what the blocks held then, role by role.
    pub peak_stage: String,
    pub at_peak: Vec<RoleBytes>,
}

/// What a role's blocks held.
#[derive(Debug, Clone, Serialize)]
pub struct RoleBytes {
    pub role: &'static str,
    pub bytes: Bytes,
}

/// What each GPU uses at its fullest over several counts of GPUs: the ranks replayed, beside the
/// split rule's estimate.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub workload: String,
    pub strategy: Strategy,
    pub rows: Vec<SpreadRow>,
    pub rule: String,
}

/// One count of GPUs of a [`Spread`].
#[derive(Debug, Clone, Serialize)]
pub struct SpreadRow {
    pub gpus: u64,
    /// The ranks the work is spread over (tensor parallelism: the most of `gpus` that split the
    /// model evenly).
    pub world: u64,
    pub replayed: Bytes,
    pub split_estimate: Bytes,
}

/// A workload spread over `gpus` GPUs, rank by rank (`budget --gpus`).
#[derive(Debug, Clone, Serialize)]
pub struct RankBudget {
    pub gpus: u64,
    pub strategy: Strategy,
    /// The ranks the work is spread over: `gpus`, or for tensor parallelism the most of them
    /// that split the model evenly.
    pub world: u64,
    /// What each GPU uses at its fullest: the busiest rank's need.
    pub need_per_gpu: Bytes,
    /// Rank 0 and the last rank.
    pub ranks: Vec<RankFigures>,
    pub rule: String,
}

impl<'a> Sharded<'a> {
    /// For `budget`'s workload if its spread is emulated: FSDP2 for a full training with AdamW
    /// or a LoRA of unquantized weights, written by hand, computed in half precision (its
    /// weights', or its autocast's), no vision tower, embeddings not tied; tensor parallelism
    /// for serving unquantized weights of a model it splits over two GPUs
    /// ([`TensorParallel::refusal`]).
    pub fn of(budget: &'a Budget) -> Option<Sharded<'a>> {
        let sharded = Sharded::of_workload(&budget.workload, budget.kernels, &budget.outside);
        sharded.map(|s| Sharded {
            budget: Some(budget),
            ..s
        })
    }

    /// As [`Sharded::of`], for a workload not budgeted on one GPU (its spread alone is asked).
    fn of_workload(w: &'a Workload, kernels: Kernels, outside: &Outside) -> Option<Sharded<'a>> {
        let served = matches!(w.mode, super::workload::Mode::Inference { .. })
            && w.weights == super::workload::WeightFormat::Dense
            && TensorParallel { world: 2, rank: 0 }
                .refusal(&w.model)
                .is_none();
        if served {
            return Some(Sharded::new(w, kernels, outside, Strategy::TensorParallel));
        }
        let eligible = trained_by_hand(w)
            && matches!(
                w.autocast.unwrap_or(w.dtype),
                crate::dtype::Dtype::Bfloat16 | crate::dtype::Dtype::Float16
            )
            && !w.model.tied_embeddings;
        eligible.then(|| Sharded::new(w, kernels, outside, Strategy::Fsdp2))
    }

    /// DDP of `budget`'s workload, if emulated for it: a full training with AdamW or a LoRA of
    /// unquantized weights, written by hand (no Trainer), of a model without a vision tower.
    pub fn ddp(budget: &'a Budget) -> Option<Sharded<'a>> {
        let (w, kernels) = (&budget.workload, budget.kernels);
        trained_by_hand(w).then(|| Sharded {
            budget: Some(budget),
            ..Sharded::new(w, kernels, &budget.outside, Strategy::Ddp)
        })
    }

    fn new(
        workload: &'a Workload,
        kernels: Kernels,
        outside: &Outside,
        strategy: Strategy,
    ) -> Sharded<'a> {
        let outside = match strategy {
            Strategy::Fsdp2 => outside.bytes.with_fsdp2_kernels(),
            Strategy::TensorParallel | Strategy::Ddp => outside.bytes,
        };
        Sharded {
            workload,
            budget: None,
            kernels,
            strategy,
            outside,
            ranks: Default::default(),
            verdicts: Default::default(),
        }
    }

    /// The runs of the ranks of `world` that are replayed: rank 0 and the last rank, or rank 0
    /// alone where every rank allocates alike.
    fn rank_runs(&self, world: u64) -> Vec<crate::stack::run::Run> {
        let mut runs = Vec::new();
        let replayed_ranks = match self.strategy {
            Strategy::Fsdp2 if !self.fsdp_ranks_alike(world) => vec![0, world - 1],
            // Every rank allocates alike.
            Strategy::Fsdp2 | Strategy::TensorParallel | Strategy::Ddp => vec![0],
        };
        for rank in replayed_ranks {
            for mut run in self.workload.runs(self.kernels) {
                match self.strategy {
                    Strategy::TensorParallel => {
                        run.tensor_parallel = Some(TensorParallel { world, rank });
                        runs.push(run);
                        continue;
                    }
                    Strategy::Ddp => {
                        run.ddp = Some(crate::stack::ddp::Ddp {
                            world,
                            rank,
                            gradient_as_bucket_view: false,
                            bucket_cap: None,
                        });
                        runs.push(run);
                        continue;
                    }
                    Strategy::Fsdp2 => {}
                }
                // Float32 weights under autocast: built in float32, gathered in the autocast's
                // type, reduced in float32; else built, gathered and reduced in their type.
                let mixed_precision = run.autocast.is_some();
                if let Some(half) = run.autocast.take() {
                    run.dtype = half;
                }
                run.sharding = Some(crate::stack::fsdp::Sharding {
                    world,
                    rank,
                    mixed_precision,
                });
                runs.push(run);
            }
        }
        runs
    }

    fn ranks(&self, gpus: u64) -> std::rc::Rc<Ranks> {
        let world = self.world(gpus);
        if let Some(r) = self.ranks.borrow().get(&world) {
            return r.clone();
        }
        let config = [allocator_config(self.workload.allocator)];
        let plan = Plan {
            keep: true,
            under: &config,
            outside: self.outside,
            watch: None,
        };
        let runs = self.rank_runs(world);
        // The ranks side by side, one a core.
        let replayed: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (runs.iter())
                .map(|run| s.spawn(|| replays(run, &plan)))
                .collect();
            (handles.into_iter())
                .map(|h| h.join().expect("a rank's replay"))
                .collect()
        });
        let nccl = Nccl::h200_nvlink().bytes;
        let figures: Vec<RankFigures> = (runs.iter().zip(&replayed))
            .map(|(run, r)| {
                let u = &r.unlimited[0];
                RankFigures {
                    rank: (run.sharding.map(|s| s.rank))
                        .or(run.tensor_parallel.map(|t| t.rank))
                        .or(run.ddp.map(|d| d.rank))
                        .unwrap_or(0),
                    peak_allocated: Bytes(u.peak_allocated),
                    peak_reserved: Bytes(u.peak_reserved),
                    need_per_gpu: Bytes(u.peak_device.saturating_add(nccl)),
                    peak_stage: u.peak_stage.clone(),
                    at_peak: (crate::replay::Role::ALL.iter())
                        .map(|&role| RoleBytes {
                            role: role.name(),
                            bytes: Bytes(u.tags_at_peak.get(role.index()).copied().unwrap_or(0)),
                        })
                        .filter(|r| r.bytes.0 > 0)
                        .collect(),
                }
            })
            .collect();
        let programs = replayed.into_iter().map(|r| r.program).collect();
        let ranks = std::rc::Rc::new(Ranks { programs, figures });
        self.ranks.borrow_mut().insert(world, ranks.clone());
        ranks
    }

    /// Whether every rank of `world` holds as many rows of each shard under FSDP2, so that they
    /// allocate alike and rank 0 stands for all ([`crate::stack::fsdp::ranks_alike`]).
    fn fsdp_ranks_alike(&self, world: u64) -> bool {
        (self.workload.runs(self.kernels).iter()).all(|run| {
            let lora = match &run.work {
                crate::stack::run::Work::Train { lora, .. } => lora.as_ref(),
                _ => None,
            };
            crate::stack::fsdp::ranks_alike(&run.model, lora, world)
        })
    }

    /// The ranks the work of `gpus` GPUs is spread over: all of them under FSDP2; under tensor
    /// parallelism the most of them that split the model evenly (at least 2, as `of` checked).
    pub fn world(&self, gpus: u64) -> u64 {
        match self.strategy {
            Strategy::Fsdp2 | Strategy::Ddp => gpus,
            Strategy::TensorParallel => {
                crate::stack::tensor_parallel::most_ranks(&self.workload.model, gpus).max(2)
            }
        }
    }

    /// The ranks of `gpus` (2 or more) replayed, as `budget --gpus` shows them.
    pub fn rank_budget(&self, gpus: u64) -> RankBudget {
        let ranks = self.ranks(gpus);
        RankBudget {
            gpus,
            strategy: self.strategy,
            world: self.world(gpus),
            need_per_gpu: Bytes(ranks.need()),
            ranks: ranks.figures.clone(),
            rule: format!("{} {}.", self.strategy.rule(), Nccl::h200_nvlink().rule()),
        }
    }

    /// For each count of GPUs (2 or more), what each GPU uses at its fullest by the ranks'
    /// replay, beside the split rule's estimate of it.
    pub fn spread(&self, counts: &[u64]) -> Spread {
        let budget = (self.budget).expect("a spread made by `of` or `ddp`, with its budget");
        Spread {
            workload: budget.title(),
            strategy: self.strategy,
            rows: (counts.iter())
                .map(|&gpus| SpreadRow {
                    gpus,
                    world: self.world(gpus),
                    replayed: Bytes(self.need(gpus)),
                    split_estimate: Bytes(need_per_gpu(budget, gpus)),
                })
                .collect(),
            rule: format!("{} {}.", self.strategy.rule(), Nccl::h200_nvlink().rule()),
        }
    }

    /// The busiest rank's use of each of `gpus` GPUs (2 or more) at its fullest.
    pub fn need(&self, gpus: u64) -> u64 {
        self.ranks(gpus).need()
    }

    /// Whether every rank completes on GPUs whose room is `room`.
    pub fn fits(&self, gpus: u64, room: u64) -> bool {
        if let Some(&v) = self.verdicts.borrow().get(&(gpus, room)) {
            return v;
        }
        let ranks = self.ranks(gpus);
        let fits = ranks.need() <= room || self.complete_on_card(&ranks.programs, room);
        self.verdicts.borrow_mut().insert((gpus, room), fits);
        fits
    }

    /// The programs of the ranks [`Sharded::rank_runs`] gives for `world`, emulated side by side
    /// (not yet replayed).
    fn emulated_ranks(&self, world: u64) -> Vec<Program> {
        use rayon::prelude::*;
        self.rank_runs(world).par_iter().map(program).collect()
    }

    /// Whether every program completes on a GPU whose room is `room` (NCCL's communicator held
    /// outside the allocator beside it), replayed side by side.
    fn complete_on_card(&self, programs: &[Program], room: u64) -> bool {
        use rayon::prelude::*;
        let card = Device::Card {
            room: room.saturating_sub(Nccl::h200_nvlink().bytes),
        };
        let config = allocator_config(self.workload.allocator);
        let outside = self.outside;
        (programs.par_iter()).all(|p| p.replay(config, card, outside).out_of_memory.is_none())
    }
}

/// The memory of one GPU of each offer sold by the GPU: the cards whose verdicts a replay on
/// the card may decide.
pub fn one_gpu_memories(catalog: &Catalog) -> Vec<u64> {
    let one_gpu = catalog.rows.iter().filter(|r| r.gpus_per_lot <= 1);
    one_gpu.map(memory_bytes).collect()
}

/// The budget of `w` to plan over `catalog`: with the replays on one GPU of each offer that its
/// own replay shows needed, made beside it.
pub fn budget_for_catalog(w: &Workload, settings: &BudgetSettings, catalog: &Catalog) -> Budget {
    let rooms: Vec<u64> = one_gpu_memories(catalog)
        .into_iter()
        .map(|memory| settings.room(memory))
        .collect();
    super::compute::budget_on_cards(w, settings, &rooms)
}

/// Plans `budget` over every offer of `catalog`, trying up to `max_gpus` GPUs per offer (the
/// number of lots searched by halving, not one by one).
pub fn plan(budget: &Budget, catalog: &Catalog, max_gpus: u64) -> Result<FitPlan, FitError> {
    if max_gpus == 0 || max_gpus > MAX_GPUS {
        return Err(FitError::NoGpus);
    }
    let mut one = OneGpu::new(budget);
    let sharded = Sharded::of(budget);
    let setting = budget.workload.allocator;
    // The replays the peaks leave open, side by side: under the budget's setting on every offer
    // of one GPU, and under the other setting where the card at its fullest does not fit (the
    // offers whose verdict it is asked).
    let mut cards = Vec::new();
    for memory in one_gpu_memories(catalog) {
        cards.push((memory, setting));
        if one.decided_by_peaks((setting, one.room(memory))) != Some(true) {
            cards.push((memory, setting.other()));
        }
    }
    one.replay_open(&cards);
    // Over several GPUs: what each GPU uses (at most the room where FSDP2's ranks complete on
    // it), whether it fits, and on what basis.
    let several = |gpus: u64, room: u64| match &sharded {
        Some(s) if gpus > 1 => {
            let need = s.need(gpus);
            let fits = s.fits(gpus, room);
            // As on one GPU, a fit closer than the proof's margin (a rank's) is flagged.
            let margin = need / 1_000_000 * s.strategy.margin_ppm();
            let basis = s.strategy.basis(fits && need.saturating_add(margin) > room);
            (if fits { need.min(room) } else { need }, fits, basis)
        }
        _ => {
            let need = need_per_gpu(budget, gpus);
            (need, need <= room, Basis::SplitEstimate)
        }
    };
    let mut rows = Vec::new();
    for row in &catalog.rows {
        let memory = memory_bytes(row);
        let room = one.room(memory);
        let per_lot = u64::from(row.gpus_per_lot).max(1);
        let max_lots = max_gpus / per_lot;
        let (one_fits, basis) = if per_lot == 1 {
            one.verdict(memory, setting)
        } else {
            (false, several(per_lot, room).2)
        };
        let other_setting = (per_lot == 1 && basis != Basis::PeakFits)
            .then(|| OtherSetting {
                allocator: setting.other(),
                fits: one.verdict(memory, setting.other()).0,
            })
            .filter(|o| o.fits != one_fits);
        // The fewest lots: one GPU by replay; more by FSDP2's replayed ranks or by the split
        // rule, whose need only falls as GPUs are added, so the smallest fitting count is found
        // by halving.
        let fits_with = |lots: u64| several(lots * per_lot, room).1;
        let lots = if one_fits {
            Some(1)
        } else if max_lots >= 2 && fits_with(max_lots) {
            let (mut lo, mut hi) = (if per_lot == 1 { 2 } else { 1 }, max_lots);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if fits_with(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            Some(lo)
        } else if per_lot > 1 && max_lots >= 1 && fits_with(1) {
            Some(1)
        } else {
            None
        };
        let fit = match lots {
            Some(lots) => {
                let gpus = lots * per_lot;
                let total = row.lot_price_usd_cents.checked_mul(lots).ok_or_else(|| {
                    FitError::Overflow {
                        model: row.model.clone(),
                        lots,
                    }
                })?;
                let (need, fit_basis) = if gpus == 1 {
                    // A replay that completes above its unlimited peak freed its cache and retried.
                    let need = budget.peak_use().min(room);
                    let tight = budget.needed.0 > memory;
                    (need, if tight { Basis::WithinMargin } else { basis })
                } else {
                    let (need, _, basis) = several(gpus, room);
                    (need, basis)
                };
                Some(Fit {
                    lots,
                    gpus,
                    need_per_gpu: Bytes(need),
                    headroom_per_gpu: Bytes(room.saturating_sub(need)),
                    lot_price_usd_cents: row.lot_price_usd_cents,
                    total_usd_cents: total,
                    basis: fit_basis,
                })
            }
            None => None,
        };
        let lot_above_max_gpus = max_lots == 0;
        let shortfall = (fit.is_none() && !lot_above_max_gpus)
            .then(|| Bytes(several(max_lots * per_lot, room).0.saturating_sub(room)));
        rows.push(FitRow {
            model: row.model.clone(),
            display_name: row.display_name.clone(),
            duration_days: row.duration_days,
            memory_per_gpu: Bytes(memory),
            room_per_gpu: Bytes(room),
            fit,
            basis,
            other_setting,
            shortfall,
            lot_above_max_gpus,
        });
    }
    rows.sort_by_key(|r| match &r.fit {
        Some(f) => (0, f.total_usd_cents.0, r.duration_days),
        None => (1, r.shortfall.map_or(u64::MAX, |s| s.0), r.duration_days),
    });
    let o = &budget.outside;
    let nccl = Nccl::h200_nvlink();
    Ok(FitPlan {
        workload: budget.title(),
        need_on_one_gpu: Bytes(budget.peak_use()),
        budget_needed: budget.needed,
        split_rule: match &sharded {
            Some(s) => format!("{} {}.", s.strategy.rule(), nccl.rule()),
            None => format!("{SPLIT_RULE} {}.", nccl.rule()),
        },
        nccl,
        margin_rule: format!(
            "room = card − the reserve; the run uses it for the allocator and what lives outside \
             it, which grows as the process loads its work ({} B with CUDA's context, {} B after \
             a forward pass, {} B after a backward pass, {} B decoding; measured on {}); a fit \
             with less headroom than {} B = {} (the margin: {}) is marked within the margin",
            crate::units::grouped(o.bytes.context),
            crate::units::grouped(o.bytes.forward),
            crate::units::grouped(o.bytes.backward),
            crate::units::grouped(o.bytes.decode),
            o.measured_on,
            crate::units::grouped(budget.margin.0),
            budget.margin.gib_text(),
            budget.margin_source
        ),
        not_replayed: budget.not_replayed().map(String::from),
        max_gpus,
        catalog: catalog.source.clone(),
        rows,
    })
}

impl FitPlan {
    /// The cheapest offer that fits, if any.
    pub fn cheapest(&self) -> Option<&FitRow> {
        self.rows.first().filter(|r| r.fit.is_some())
    }
    /// The offer that misses by the least, when nothing fits.
    pub fn smallest_shortfall(&self) -> Option<&FitRow> {
        if self.cheapest().is_some() {
            return None;
        }
        self.rows
            .iter()
            .filter(|r| r.shortfall.is_some())
            .min_by_key(|r| r.shortfall)
    }
}

/// The largest values of a workload's size (`batch` or `context`) that hold on one GPU, for
/// cards all given at the start, searched together in rounds ([`SizeSearch::largest_of_each`]).
/// A size is emulated and replayed under the settings of the cards that ask for it, as the
/// emulation writes it; its peaks decide every card of those settings they can, and each card
/// between its peak of `allocated` and the card at its fullest (both with what lives outside the
/// allocator) that asks for the size or whose search is open at it (the size lies between the
/// largest that holds on the card and the smallest that does not, of those tried on it) is then
/// replayed on the card, while the program is at hand (it holds every event of its run, so it
/// is let go once its cards are replayed). A card's search reads only verdicts within its
/// bounds, which close in on its edge; a verdict it lacks (a size tried before it needed it, or
/// under the other setting only) is replayed when it asks for it.
pub struct SizeSearch<'a> {
    workload: &'a Workload,
    settings: &'a BudgetSettings,
    size: Size,
    /// The sizes the workload allows, up to the limit asked: from `first` to `limit`.
    first: u64,
    limit: u64,
    allocators: Vec<AllocatorSetting>,
    /// The room of each card searched.
    rooms: Vec<u64>,
    /// What the replays of each size tried gave.
    tried: HashMap<u64, Tried>,
}

/// Sizes replayed side by side at most (each holds its program while its cards are replayed).
const SIZES_AT_ONCE: usize = 8;

/// Where one card's search stands: the width of its bounds before its last try, the step past
/// the largest size holding that it takes while no size failed (doubled at each try), and what
/// it found once done.
struct Search {
    last_width: u64,
    step: u64,
    found: Option<Option<u64>>,
}

impl Default for Search {
    fn default() -> Search {
        Search {
            last_width: u64::MAX,
            step: 0,
            found: None,
        }
    }
}

/// What the replays of one size gave.
struct Tried {
    /// The verdict on each card searched, where the peaks decided it or the search of that card
    /// was open at this size.
    verdicts: HashMap<Card, bool>,
    /// Under each setting it was replayed under, the most the card held in use (`allocated` and
    /// what lived outside the allocator) and at its fullest (`reserved` and that).
    peaks: HashMap<AllocatorSetting, (u64, u64)>,
}

impl<'a> SizeSearch<'a> {
    /// A search over `size` from the smallest the workload allows (QLoRA's kernels want enough
    /// tokens a step) to `limit` or the largest it allows ([`SizeSearch::limit`]), on cards of
    /// `memories` bytes under each of `allocators`; when no size up to `limit` is allowed, why
    /// the smallest is not.
    pub fn new(
        workload: &'a Workload,
        settings: &'a BudgetSettings,
        size: Size,
        limit: u64,
        memories: &[u64],
        allocators: &[AllocatorSetting],
    ) -> Result<SizeSearch<'a>, WorkloadError> {
        let mut rooms: Vec<u64> = memories.iter().map(|&m| settings.room(m)).collect();
        rooms.sort_unstable();
        rooms.dedup();
        let mut search = SizeSearch {
            workload,
            settings,
            size,
            first: 1,
            limit: 1,
            allocators: allocators.to_vec(),
            rooms,
            tried: HashMap::new(),
        };
        // A workload's bounds refuse sizes below some (too few tokens a step) and above some:
        // the allowed ones run from the first, found by doubling then halving, to the last.
        let mut valid = 1;
        while search.at(valid).is_none() {
            if valid >= limit {
                return Err(search.refusal(1));
            }
            valid = valid.saturating_mul(2).min(limit);
        }
        let mut invalid = valid / 2;
        let mut first = valid;
        while first - invalid > 1 {
            let mid = invalid + (first - invalid) / 2;
            match search.at(mid) {
                Some(_) => first = mid,
                None => invalid = mid,
            }
        }
        let (mut last, mut beyond) = (first, limit.saturating_add(1));
        while beyond - last > 1 {
            let mid = last + (beyond - last) / 2;
            match search.at(mid) {
                Some(_) => last = mid,
                None => beyond = mid,
            }
        }
        (search.first, search.limit) = (first, last);
        Ok(search)
    }

    /// Why the workload at size `n` is refused.
    fn refusal(&self, n: u64) -> WorkloadError {
        self.with_size(n).validated().expect_err("a size refused")
    }

    /// The smallest size searched: 1, or the smallest the workload allows.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The largest size searched: the limit asked, or the largest the workload allows.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The workload at size `n`, not validated.
    fn with_size(&self, n: u64) -> Workload {
        let mut w = self.workload.clone();
        match self.size {
            Size::Batch => w.batch = n,
            Size::Context => w.context = n,
        }
        w
    }

    /// The workload at size `n`, if valid.
    fn at(&self, n: u64) -> Option<Workload> {
        self.with_size(n).validated().ok()
    }

    /// The verdicts of size `n` (the workload `w`) that the search needs: the same as
    /// [`OneGpu::verdict`]'s on its budget, on the cards whose search is open at `n` or that
    /// ask for it. The size is replayed under the settings of those cards only; its peaks
    /// under each then decide every card of that setting they can.
    fn replayed(&self, w: &Workload, n: u64, asking: &[Card]) -> Tried {
        let needs = |card: Card| asking.contains(&card) || self.open_at(n, card);
        let settings: Vec<AllocatorSetting> = (self.allocators.iter().copied())
            .filter(|&s| asking.iter().any(|c| c.0 == s))
            .collect();
        let configs: Vec<_> = settings.iter().map(|&s| allocator_config(s)).collect();
        let outside = self.settings.outside.bytes;
        let plan = Plan {
            keep: true,
            under: &configs,
            outside,
            watch: None,
        };
        let mut programs = Vec::new();
        let mut peaks: HashMap<AllocatorSetting, (u64, u64)> = HashMap::new();
        for run in w.runs(self.settings.kernels) {
            let r = replays(&run, &plan);
            programs.push(Arc::new(r.program));
            // Each setting's peaks: the largest of the runs'.
            for (&setting, r) in settings.iter().zip(&r.unlimited) {
                let p = peaks.entry(setting).or_default();
                *p = (p.0.max(r.peak_device_allocated), p.1.max(r.peak_device));
            }
        }
        let mut verdicts = HashMap::new();
        let mut open = Vec::new();
        for (&setting, &(in_use, device)) in &peaks {
            for &room in &self.rooms {
                let card = (setting, room);
                match by_peaks(in_use, Some(device), room) {
                    Some(fits) => {
                        verdicts.insert(card, fits);
                    }
                    None if needs(card) => open.push(card),
                    None => {}
                }
            }
        }
        let fits = complete_on_cards(&programs, &open, outside, &[]);
        verdicts.extend(open.into_iter().zip(fits));
        Tried { verdicts, peaks }
    }

    /// The sizes each asked for by some cards, replayed side by side (at most
    /// [`SIZES_AT_ONCE`] at a time), each with its verdict on the cards asking for it (a size
    /// tried before without it is emulated and replayed again).
    fn try_sizes(&mut self, asked: &BTreeMap<u64, Vec<Card>>) {
        use rayon::prelude::*;
        let asked: Vec<(u64, &Vec<Card>)> = asked.iter().map(|(&n, c)| (n, c)).collect();
        for group in asked.chunks(SIZES_AT_ONCE) {
            let replayed: Vec<(u64, Tried)> = group
                .par_iter()
                .map(|&(n, asking)| {
                    let w = self.at(n).expect("sizes up to the limit are valid");
                    (n, self.replayed(&w, n, asking))
                })
                .collect();
            for (n, again) in replayed {
                match self.tried.get_mut(&n) {
                    Some(t) => {
                        t.verdicts.extend(again.verdicts);
                        t.peaks.extend(again.peaks);
                    }
                    None => {
                        self.tried.insert(n, again);
                    }
                }
            }
        }
    }

    /// The verdict of size `n` on `card`, if it was tried on it.
    fn verdict(&self, n: u64, card: Card) -> Option<bool> {
        self.tried.get(&n)?.verdicts.get(&card).copied()
    }

    /// The largest size that holds on one GPU of `memory` bytes under `setting`, with the next
    /// size not holding (or the limit); `None` when even the first does not
    /// ([`SizeSearch::largest_of_each`] for one card).
    pub fn largest(&mut self, memory: u64, setting: AllocatorSetting) -> Option<u64> {
        self.largest_of_each(&[(memory, setting)])[0]
    }

    /// For each card (its memory and the allocator setting), the largest size that holds on
    /// one GPU of it, with the next size not holding (or the limit); `None` when even the first
    /// ([`SizeSearch::first`]) does not. The cards are searched together, in rounds: in each, every search not done names
    /// the size it tries next, and those sizes are replayed side by side. Every size tried
    /// bounds every card it has a verdict on. A card whose bounds are open above tries where its
    /// peaks, drawn as a line through the sizes tried, meet its room, or further by a step that
    /// doubles at each try; once bounded, where the line meets the room between the bounds, or
    /// the middle when its last try did not halve them: a search takes a number of rounds
    /// logarithmic in the size it finds.
    pub fn largest_of_each(&mut self, cards: &[(u64, AllocatorSetting)]) -> Vec<Option<u64>> {
        let mut searches: Vec<(Card, Search)> = cards
            .iter()
            .map(|&(memory, setting)| ((setting, self.settings.room(memory)), Search::default()))
            .collect();
        loop {
            let mut asked: BTreeMap<u64, Vec<Card>> = BTreeMap::new();
            for (card, search) in &mut searches {
                if search.found.is_none() {
                    match self.next_size(*card, search) {
                        Ok(n) => asked.entry(n).or_default().push(*card),
                        Err(found) => search.found = Some(found),
                    }
                }
            }
            if asked.is_empty() {
                return searches
                    .into_iter()
                    .map(|(_, s)| s.found.flatten())
                    .collect();
            }
            self.try_sizes(&asked);
        }
    }

    /// The size `card`'s search tries next, or what it found.
    fn next_size(&self, card: Card, search: &mut Search) -> Result<u64, Option<u64>> {
        match self.verdict(self.first, card) {
            None => return Ok(self.first),
            Some(false) => return Err(None),
            Some(true) => {}
        }
        let (good, bad) = self.bounds(card);
        let next = match bad {
            Some(b) if b - good == 1 => return Err(Some(good)),
            None if good == self.limit => return Err(Some(good)),
            // The last try did not halve the bounds: the middle.
            Some(b) if b - good > search.last_width / 2 => good + (b - good) / 2,
            Some(b) => self.estimate(good, Some(b), card),
            None => {
                search.step = search.step.saturating_mul(2).max(1);
                let estimate = self.estimate(good, None, card);
                estimate.max(good.saturating_add(search.step))
            }
        };
        search.last_width = bad.map_or(u64::MAX, |b| b - good);
        Ok(next.min(self.limit))
    }

    /// The bounds the sizes tried give a card: the smallest that does not hold on it (if any),
    /// and the largest below that which holds (the size before the first, if none); sizes without
    /// a verdict on the card bound nothing.
    fn bounds(&self, card: Card) -> (u64, Option<u64>) {
        let sizes = |fits: bool| {
            self.tried
                .keys()
                .copied()
                .filter(move |&n| self.verdict(n, card) == Some(fits))
        };
        let bad = sizes(false).min();
        let good = sizes(true)
            .filter(|&n| bad.is_none_or(|b| n < b))
            .max()
            .unwrap_or(self.first - 1);
        (good, bad)
    }

    /// Whether `card`'s search is open at size `n`: `n` lies between its bounds.
    fn open_at(&self, n: u64, card: Card) -> bool {
        let (good, bad) = self.bounds(card);
        good < n && bad.is_none_or(|b| n < b)
    }

    /// The next size to try between `good` (holds) and `bad` (does not, or no such size tried):
    /// where the line through the peaks at `good` and at `bad`, else at the smallest size tried
    /// (the average slope: peaks grow in steps of whole segments), reaches the card's room
    /// (without `bad`, possibly `good` or below); without two such peaks, twice `good`. The
    /// peaks are the card at its fullest under the default setting, where a segment with any
    /// block in use cannot be given back, so that a run holds on a card little beyond where its
    /// peak of `reserved` fills it; and its most in use with expandable segments, whose pages
    /// not in use are given back when the card is full, so that a run holds nearly until its
    /// peak of `allocated` fills the card.
    fn estimate(&self, good: u64, bad: Option<u64>, (setting, room): Card) -> u64 {
        let by_in_use = setting == AllocatorSetting::ExpandableSegments;
        let peak = |n: u64| {
            let (in_use, device) = *self.tried.get(&n)?.peaks.get(&setting)?;
            Some(if by_in_use { in_use } else { device })
        };
        let other = bad.or_else(|| {
            (self.tried.keys())
                .filter(|&&n| n < good && peak(n).is_some())
                .min()
                .copied()
        });
        let line = other.and_then(|o| Some((o, peak(o)?, peak(good)?)));
        match line {
            Some((o, at_other, at_good)) if at_other != at_good => {
                // n = good + (room - peak(good)) * (o - good) / (peak(o) - peak(good)).
                let rise = i128::from(at_other) - i128::from(at_good);
                let run = i128::from(o) - i128::from(good);
                let step = (i128::from(room) - i128::from(at_good)) * run / rise;
                let n = u64::try_from((i128::from(good) + step).max(0)).unwrap_or(u64::MAX);
                match bad {
                    Some(b) => n.clamp(good + 1, b - 1),
                    None => n.min(self.limit),
                }
            }
            _ => good
                .saturating_mul(2)
                .min(bad.map_or(self.limit, |b| b - 1))
                .max(good + 1),
        }
    }
}

/// The size `--max-batch` or `--max-context` searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    Batch,
    Context,
}

/// The largest values of a workload's size (`batch` or `context`) whose ranks, spread over
/// several GPUs as the planner spreads them ([`Sharded::of`]: FSDP2 for a training, tensor
/// parallelism for serving), each complete on their GPU: for each lot asked (its count of GPUs
/// and the room of each), from a size known to hold there (`start`) to `limit`. Each lot is
/// searched on its own, the lots side by side: its size doubles while it holds, then the bounds
/// are halved (a number of sizes logarithmic in the size found). A size asked is spread alone
/// (no budget on one GPU); its ranks' programs are emulated once for every lot of its count of
/// GPUs and replayed on each lot's card alone: a verdict needs no replay without limit (one that
/// completes on the card is that replay, one that does not stops where the card is full).
pub fn largest_spread(
    workload: &Workload,
    settings: &BudgetSettings,
    size: Size,
    start: u64,
    limit: u64,
    lots: &[(u64, u64)],
) -> Vec<u64> {
    use rayon::prelude::*;
    use std::sync::{Mutex, OnceLock};
    // The programs of each size's ranks over each world, emulated by the first lot asking them.
    type Emulated = Arc<OnceLock<Vec<Program>>>;
    let emulated: Mutex<HashMap<(u64, u64), Emulated>> = Mutex::default();
    let holds = |n: u64, gpus: u64, room: u64| -> bool {
        let mut w = workload.clone();
        match size {
            Size::Batch => w.batch = n,
            Size::Context => w.context = n,
        }
        let Ok(w) = w.validated() else {
            return false;
        };
        let Some(sharded) = Sharded::of_workload(&w, settings.kernels, &settings.outside) else {
            return false;
        };
        let world = sharded.world(gpus);
        let cell = (emulated.lock().expect("no search panicked"))
            .entry((n, world))
            .or_default()
            .clone();
        let programs = cell.get_or_init(|| sharded.emulated_ranks(world));
        sharded.complete_on_card(programs, room)
    };
    (lots.par_iter())
        .map(|&(gpus, room)| {
            // The largest size found to hold, and the smallest found not to.
            let (mut good, mut bad) = (start, None::<u64>);
            loop {
                let next = match bad {
                    Some(b) if b - good > 1 => good + (b - good) / 2,
                    None if good < limit => good.saturating_mul(2).min(limit),
                    _ => return good,
                };
                match holds(next, gpus, room) {
                    true => good = next,
                    false => bad = Some(next),
                }
            }
        })
        .collect()
}
