//! The fit planner: for every GPU model and duration of the catalog, the fewest lots whose GPUs
//! hold the workload, the headroom left and the exact price, cheapest first. On one GPU the
//! verdict is the replay's: the run replayed on an allocator limited to the card's memory (less
//! what lives outside the allocator and the reserve) either completes or runs out of memory, as
//! on the card; a fit closer than the proof's margin is flagged. Over several GPUs it is the
//! split rule's estimate, said so.

use super::terms::{allocator_config, Budget, Place, Split};
use super::workload::{AllocatorSetting, Workload};
use crate::catalog::{Catalog, CatalogRow, CatalogSource};
use crate::money::Cents;
use crate::stack::ops::Kernels;
use crate::stack::run::{program, program_replayed, Program};
use crate::units::{Bytes, GIB};
use rust_decimal::prelude::ToPrimitive;
use serde::Serialize;
use std::collections::HashMap;

/// The split rule over several GPUs, stated with every plan.
pub const SPLIT_RULE: &str = "over several GPUs (an estimate, not replayed): weights, adapters, \
gradients and optimizer states sharded evenly (ZeRO-3 / FSDP); the KV cache split by KV heads \
(each GPU holds ⌈kv_heads / GPUs⌉ heads); activations, workspaces, the allocator's free blocks, \
the CUDA context and the reserve whole on every GPU: on the high side where the free blocks and \
temporaries come from sharded tensors (AdamW's, autocast's copies), which a sharded run holds in \
part. On one GPU the verdict is the replay's on an allocator limited to the card.";

/// How a verdict was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The whole run's peak of `reserved` fits: nothing to replay.
    PeakFits,
    /// The run replayed on an allocator limited to the card (its cache freed and retried when
    /// full, as PyTorch does): it completed.
    ReplayCompleted,
    /// It fits, but with less headroom than the proof's margin: the verdict is within the
    /// replays' measured error.
    WithinMargin,
    /// The run replayed on the card ran out of memory (or even its `allocated` exceeds it).
    ReplayOutOfMemory,
    /// Several GPUs: the split rule's estimate.
    SplitEstimate,
}

/// One GPU model over one duration.
#[derive(Debug, Clone, Serialize)]
pub struct FitRow {
    pub model: String,
    pub display_name: String,
    pub duration_days: u32,
    pub memory_per_gpu: Bytes,
    /// What the allocator may use: the card less what lives outside the allocator and the
    /// reserve.
    pub usable_per_gpu: Bytes,
    /// `None` when no number of lots up to the limit holds the workload.
    pub fit: Option<Fit>,
    /// The one-GPU verdict's basis.
    pub basis: Basis,
    /// On one GPU, the other allocator setting and its verdict, where the verdict differs.
    pub other_setting: Option<OtherSetting>,
    /// With the most GPUs tried, what one GPU lacks (when nothing fits).
    pub shortfall: Option<Bytes>,
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
    /// What each GPU's allocator must hold (for one GPU: the replay's peak reserved, at most
    /// the usable memory when the allocator freed its cache and retried).
    pub need_per_gpu: Bytes,
    /// The usable memory less that need.
    pub headroom_per_gpu: Bytes,
    pub lot_price_usd_cents: Cents,
    pub total_usd_cents: Cents,
    pub basis: Basis,
}

/// Every catalog offer against one budget.
#[derive(Debug, Clone, Serialize)]
pub struct FitPlan {
    pub workload: String,
    /// What one GPU's allocator must hold (the `need / GPU` of a one-GPU row).
    pub allocator_need: Bytes,
    pub budget_needed: Bytes,
    pub split_rule: String,
    pub margin_rule: String,
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

/// The most GPUs the planner tries per offer.
pub const MAX_GPUS: u64 = 4096;

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

/// What one GPU of `gpus` must hold in its allocator (neither what lives outside it nor the
/// reserve, both taken off the card's usable memory).
pub fn need_per_gpu(budget: &Budget, gpus: u64) -> u64 {
    budget
        .terms
        .iter()
        .zip(shares(budget, gpus))
        .filter(|(t, _)| t.place == Place::Allocator)
        .fold(0u64, |s, (_, b)| s.saturating_add(b))
}

/// The catalog memory of a GPU in bytes (GiB × 2^30, rounded down; beyond 2^64 − 1, that).
pub fn memory_bytes(row: &CatalogRow) -> u64 {
    row.memory_per_gpu_gib
        .checked_mul(rust_decimal::Decimal::from(GIB))
        .and_then(|bytes| bytes.floor().to_u64())
        .unwrap_or(u64::MAX)
}

/// The one-GPU verdicts of one workload, replayed once per card size and allocator setting.
pub struct OneGpu<'a> {
    budget: &'a Budget,
    program: Option<std::sync::Arc<Program>>,
    verdicts: HashMap<(u64, AllocatorSetting), bool>,
}

impl<'a> OneGpu<'a> {
    pub fn new(budget: &'a Budget) -> OneGpu<'a> {
        OneGpu {
            budget,
            program: budget.program.clone(),
            verdicts: HashMap::new(),
        }
    }

    /// What the allocator may use on a card of `memory` bytes: the card less what lives outside
    /// the allocator and the reserve.
    pub fn usable(&self, memory: u64) -> u64 {
        let b = self.budget;
        usable(
            memory,
            b.outside_allocator.0,
            b.held_at_peak(Place::Reserve),
        )
    }

    /// Whether the run holds on a card of `memory` bytes, and on what basis.
    pub fn verdict(&mut self, memory: u64, setting: AllocatorSetting) -> (bool, Basis) {
        let usable = self.usable(memory);
        let b = self.budget;
        // The budget's peak of `reserved` is its own setting's; allocated is every setting's.
        let peak_reserved = (setting == b.workload.allocator).then_some(b.peak_reserved.0);
        let (verdicts, slot) = (&mut self.verdicts, &mut self.program);
        one_gpu_verdict(b.peak_allocated.0, peak_reserved, usable, || {
            *verdicts.entry((usable, setting)).or_insert_with(|| {
                slot.get_or_insert_with(|| std::sync::Arc::new(program(&b.workload.run(b.kernels))))
                    .replay(allocator_config(setting), Some(usable))
                    .out_of_memory
                    .is_none()
            })
        })
    }
}

/// What the allocator may use on a card of `memory` bytes: the card less what lives outside
/// the allocator and the reserve.
pub fn usable(memory: u64, outside: u64, reserve: u64) -> u64 {
    memory.saturating_sub(outside).saturating_sub(reserve)
}

/// The one-GPU rule: a run whose peak of `reserved` (when known for the setting) is within the
/// usable memory fits; one whose peak of `allocated` is beyond it does not; between the two, the
/// replay on an allocator limited to the usable memory decides (`replay_fits`).
fn one_gpu_verdict(
    peak_allocated: u64,
    peak_reserved: Option<u64>,
    usable: u64,
    replay_fits: impl FnOnce() -> bool,
) -> (bool, Basis) {
    if peak_reserved.is_some_and(|r| r <= usable) {
        return (true, Basis::PeakFits);
    }
    if peak_allocated > usable {
        return (false, Basis::ReplayOutOfMemory);
    }
    let fits = replay_fits();
    let basis = if fits {
        Basis::ReplayCompleted
    } else {
        Basis::ReplayOutOfMemory
    };
    (fits, basis)
}

fn other(setting: AllocatorSetting) -> AllocatorSetting {
    match setting {
        AllocatorSetting::Default => AllocatorSetting::ExpandableSegments,
        AllocatorSetting::ExpandableSegments => AllocatorSetting::Default,
    }
}

/// Plans `budget` over every offer of `catalog`, trying up to `max_gpus` GPUs per offer (the
/// number of lots searched by halving, not one by one).
pub fn plan(budget: &Budget, catalog: &Catalog, max_gpus: u64) -> Result<FitPlan, FitError> {
    if max_gpus == 0 || max_gpus > MAX_GPUS {
        return Err(FitError::NoGpus);
    }
    let mut one = OneGpu::new(budget);
    let setting = budget.workload.allocator;
    let mut rows = Vec::new();
    for row in &catalog.rows {
        let memory = memory_bytes(row);
        let usable = one.usable(memory);
        let per_lot = u64::from(row.gpus_per_lot).max(1);
        let max_lots = max_gpus / per_lot;
        let (one_fits, basis) = if per_lot == 1 {
            one.verdict(memory, setting)
        } else {
            (false, Basis::SplitEstimate)
        };
        let other_setting = (per_lot == 1 && basis != Basis::PeakFits)
            .then(|| OtherSetting {
                allocator: other(setting),
                fits: one.verdict(memory, other(setting)).0,
            })
            .filter(|o| o.fits != one_fits);
        // The fewest lots: one GPU by replay; more by the split rule, whose need only falls as
        // GPUs are added, so the smallest fitting count is found by halving.
        let fits_with = |lots: u64| need_per_gpu(budget, lots * per_lot) <= usable;
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
                    let need = budget.peak_reserved.0.min(usable);
                    let tight = budget.needed.0 > memory;
                    (need, if tight { Basis::WithinMargin } else { basis })
                } else {
                    (need_per_gpu(budget, gpus), Basis::SplitEstimate)
                };
                Some(Fit {
                    lots,
                    gpus,
                    need_per_gpu: Bytes(need),
                    headroom_per_gpu: Bytes(usable.saturating_sub(need)),
                    lot_price_usd_cents: row.lot_price_usd_cents,
                    total_usd_cents: total,
                    basis: fit_basis,
                })
            }
            None => None,
        };
        let shortfall = fit.is_none().then(|| {
            let gpus = max_lots.max(1) * per_lot;
            Bytes(need_per_gpu(budget, gpus).saturating_sub(usable))
        });
        rows.push(FitRow {
            model: row.model.clone(),
            display_name: row.display_name.clone(),
            duration_days: row.duration_days,
            memory_per_gpu: Bytes(memory),
            usable_per_gpu: Bytes(usable),
            fit,
            basis,
            other_setting,
            shortfall,
        });
    }
    rows.sort_by_key(|r| match &r.fit {
        Some(f) => (0, f.total_usd_cents.0, r.duration_days),
        None => (1, r.shortfall.map_or(u64::MAX, |s| s.0), r.duration_days),
    });
    Ok(FitPlan {
        workload: budget.title(),
        allocator_need: Bytes(need_per_gpu(budget, 1)),
        budget_needed: budget.needed,
        split_rule: SPLIT_RULE.into(),
        margin_rule: format!(
            "usable = card − {} B outside the allocator (measured on {}) − the reserve; a fit \
             with less headroom than {} B = {} (the margin: {}) is marked within the margin",
            crate::units::grouped(budget.outside_allocator.0),
            budget.outside.measured_on,
            crate::units::grouped(budget.margin.0),
            budget.margin.gib_text(),
            budget.margin_source
        ),
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
/// several GPU sizes and allocator settings. Each size is replayed once per setting whatever the
/// card (its peaks decide most cards at once); only a card between a size's peak of `allocated`
/// and its peak of `reserved` needs a replay limited to it, kept for the other searches.
pub struct SizeSearch<'a> {
    workload: &'a Workload,
    settings: &'a super::BudgetSettings,
    size: Size,
    limit: u64,
    /// Per (size, setting): the unlimited replay's peaks of allocated and reserved.
    peaks: HashMap<(u64, AllocatorSetting), (u64, u64)>,
    /// Per (size, setting, usable bytes): whether the limited replay completed.
    limited: HashMap<(u64, AllocatorSetting, u64), bool>,
    /// The last size's program (one at a time: a program holds every event of its run).
    program: Option<(u64, Program)>,
}

impl<'a> SizeSearch<'a> {
    /// A search over `size` from 1 to `limit`.
    pub fn new(
        workload: &'a Workload,
        settings: &'a super::BudgetSettings,
        size: Size,
        limit: u64,
    ) -> SizeSearch<'a> {
        SizeSearch {
            workload,
            settings,
            size,
            limit,
            peaks: HashMap::new(),
            limited: HashMap::new(),
            program: None,
        }
    }

    /// The workload at size `n`, if valid.
    fn at(&self, n: u64) -> Option<Workload> {
        let mut w = self.workload.clone();
        match self.size {
            Size::Batch => w.batch = n,
            Size::Context => w.context = n,
        }
        w.validated().ok()
    }

    /// The program of size `n` in `slot` (built again unless it was the last one).
    fn program<'s>(
        slot: &'s mut Option<(u64, Program)>,
        n: u64,
        w: &Workload,
        kernels: Kernels,
    ) -> &'s Program {
        if slot.as_ref().is_none_or(|(m, _)| *m != n) {
            *slot = Some((n, program(&w.run(kernels))));
        }
        &slot.as_ref().expect("just built").1
    }

    /// Whether size `n` holds on a card of `memory` bytes under `setting`: the same verdict as
    /// [`OneGpu::verdict`] on that size's budget.
    pub fn fits(&mut self, n: u64, memory: u64, setting: AllocatorSetting) -> bool {
        let Some(w) = self.at(n) else {
            return false;
        };
        let usable = usable(
            memory,
            self.settings.outside.for_mode(w.mode.trains()),
            self.settings.reserve_bytes,
        );
        let kernels = self.settings.kernels;
        let slot = &mut self.program;
        let &mut (peak_allocated, peak_reserved) =
            self.peaks.entry((n, setting)).or_insert_with(|| {
                let config = allocator_config(setting);
                let r = match slot {
                    Some((m, program)) if *m == n => program.replay(config, None),
                    _ => {
                        let (program, r) = program_replayed(&w.run(kernels), config);
                        *slot = Some((n, program));
                        r
                    }
                };
                (r.peak_allocated, r.peak_reserved)
            });
        let limited = &mut self.limited;
        one_gpu_verdict(peak_allocated, Some(peak_reserved), usable, || {
            *limited.entry((n, setting, usable)).or_insert_with(|| {
                Self::program(slot, n, &w, kernels)
                    .replay(allocator_config(setting), Some(usable))
                    .out_of_memory
                    .is_none()
            })
        })
        .0
    }

    /// The largest size that holds on one GPU of `memory` bytes under `setting`; `None` when
    /// even 1 does not. Doubles to a failing size, then halves.
    pub fn largest(&mut self, memory: u64, setting: AllocatorSetting) -> Option<u64> {
        if !self.fits(1, memory, setting) {
            return None;
        }
        let (mut good, mut bad) = (1u64, None);
        while bad.is_none() {
            let next = good.saturating_mul(2).min(self.limit);
            if next == good {
                break;
            }
            if self.fits(next, memory, setting) {
                good = next;
            } else {
                bad = Some(next);
            }
        }
        if let Some(mut bad) = bad {
            while bad - good > 1 {
                let mid = good + (bad - good) / 2;
                if self.fits(mid, memory, setting) {
                    good = mid;
                } else {
                    bad = mid;
                }
            }
        }
        Some(good)
    }
}

/// The size `--max-batch` or `--max-context` searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    Batch,
    Context,
}
