//! The fit planner: for every GPU model and duration of the catalog, the fewest lots whose GPUs
//! hold the budget under a stated split rule, the headroom left on each GPU and the exact price,
//! cheapest first.

use super::terms::{Budget, Place, Split};
use crate::catalog::{Catalog, CatalogRow, CatalogSource};
use crate::money::Cents;
use crate::units::{Bytes, GIB};
use rust_decimal::prelude::ToPrimitive;
use serde::Serialize;

/// The split rule, stated with every plan.
pub const SPLIT_RULE: &str = "weights, quantization metadata, gradients, master weights and \
optimizer states sharded evenly over the GPUs (ZeRO-3 / FSDP); the KV cache split by KV heads \
(each GPU holds ⌈kv_heads / GPUs⌉ heads); activations, logits, cuBLAS workspaces, the CUDA \
context and the reserve whole on every GPU (each GPU runs the whole batch). All GPUs of the \
rented lots are used. Usable memory per GPU = catalog memory − the CUDA context and libraries.";

/// One GPU model over one duration.
#[derive(Debug, Clone, Serialize)]
pub struct FitRow {
    pub model: String,
    pub display_name: String,
    pub duration_days: u32,
    pub memory_per_gpu: Bytes,
    /// Catalog memory less the per-GPU constants outside the allocator.
    pub usable_per_gpu: Bytes,
    /// `None` when no number of lots up to the limit holds the budget.
    pub fit: Option<Fit>,
    /// With the most GPUs tried, what one GPU lacks (when nothing fits).
    pub shortfall: Option<Bytes>,
}

/// The fewest lots that hold the budget.
#[derive(Debug, Clone, Serialize)]
pub struct Fit {
    pub lots: u64,
    pub gpus: u64,
    /// What each GPU holds (allocator terms and the reserve).
    pub need_per_gpu: Bytes,
    pub headroom_per_gpu: Bytes,
    pub lot_price_usd_cents: Cents,
    pub total_usd_cents: Cents,
}

/// Every catalog offer against one budget.
#[derive(Debug, Clone, Serialize)]
pub struct FitPlan {
    pub workload: String,
    pub budget_total: Bytes,
    pub split_rule: String,
    pub max_gpus: u64,
    pub catalog: CatalogSource,
    /// Offers that fit, cheapest first, then those that do not.
    pub rows: Vec<FitRow>,
}

#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("--max-gpus must be at least 1")]
    NoGpus,
    #[error("the price of {lots} lots of {model} overflows")]
    Overflow { model: String, lots: u64 },
}

impl crate::status::Classify for FitError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// What one GPU of `gpus` holds of each term, at the largest of the budget's moments for that
/// number of GPUs (sharding shrinks the states, not the activations, so the peak moment may
/// change with the number of GPUs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerGpu {
    pub moment: String,
    /// Bytes of each term of the budget, in its order (the terms outside the allocator whole).
    pub bytes: Vec<u64>,
    /// Σ of the allocator's terms and the reserve: what must fit in the usable memory.
    pub need: u64,
}

pub fn per_gpu(budget: &Budget, gpus: u64) -> PerGpu {
    let kv_heads = budget.workload.shape.kv_heads;
    let share = |t: &super::Term, b: u64| match t.split {
        Split::Sharded => b.div_ceil(gpus),
        // The cache is a whole number of heads' worth: exact division.
        Split::KvHeads => b / kv_heads * kv_heads.div_ceil(gpus),
        Split::PerGpu => b,
    };
    budget
        .moments
        .iter()
        .map(|m| {
            let bytes: Vec<u64> = budget.terms.iter().map(|t| share(t, m.held(t))).collect();
            let need = budget
                .terms
                .iter()
                .zip(&bytes)
                .filter(|(t, _)| t.place != Place::OutsideAllocator)
                .map(|(_, b)| *b)
                .sum();
            PerGpu {
                moment: m.name.clone(),
                bytes,
                need,
            }
        })
        .max_by_key(|p| p.need)
        .expect("a budget has at least one moment")
}

/// Bytes one GPU of `gpus` must hold (see [`per_gpu`]).
pub fn need_per_gpu(budget: &Budget, gpus: u64) -> u64 {
    per_gpu(budget, gpus).need
}

fn outside_allocator(budget: &Budget) -> u64 {
    budget
        .terms
        .iter()
        .filter(|t| t.place == Place::OutsideAllocator)
        .map(|t| t.at_peak.0)
        .sum()
}

fn memory_bytes(row: &CatalogRow) -> u64 {
    (row.memory_per_gpu_gib * rust_decimal::Decimal::from(GIB))
        .floor()
        .to_u64()
        .unwrap_or(u64::MAX)
}

/// Plans `budget` over every offer of `catalog`, trying up to `max_gpus` GPUs per offer.
pub fn plan(budget: &Budget, catalog: &Catalog, max_gpus: u64) -> Result<FitPlan, FitError> {
    if max_gpus == 0 {
        return Err(FitError::NoGpus);
    }
    let outside = outside_allocator(budget);
    let mut rows = Vec::new();
    for row in &catalog.rows {
        let memory = memory_bytes(row);
        let usable = memory.saturating_sub(outside);
        let per_lot = u64::from(row.gpus_per_lot);
        let mut fit = None;
        let mut shortfall = None;
        for lots in 1..=max_gpus / per_lot {
            let gpus = lots * per_lot;
            let need = need_per_gpu(budget, gpus);
            if need <= usable {
                let total = row.lot_price_usd_cents.checked_mul(lots).ok_or_else(|| {
                    FitError::Overflow {
                        model: row.model.clone(),
                        lots,
                    }
                })?;
                fit = Some(Fit {
                    lots,
                    gpus,
                    need_per_gpu: Bytes(need),
                    headroom_per_gpu: Bytes(usable - need),
                    lot_price_usd_cents: row.lot_price_usd_cents,
                    total_usd_cents: total,
                });
                break;
            }
            shortfall = Some(Bytes(need - usable));
        }
        rows.push(FitRow {
            model: row.model.clone(),
            display_name: row.display_name.clone(),
            duration_days: row.duration_days,
            memory_per_gpu: Bytes(memory),
            usable_per_gpu: Bytes(usable),
            shortfall: if fit.is_some() { None } else { shortfall },
            fit,
        });
    }
    rows.sort_by_key(|r| match &r.fit {
        Some(f) => (0, f.total_usd_cents.0, r.duration_days),
        None => (1, r.shortfall.map_or(u64::MAX, |s| s.0), r.duration_days),
    });
    Ok(FitPlan {
        workload: budget.title(),
        budget_total: budget.total,
        split_rule: format!(
            "{SPLIT_RULE} The CUDA context and libraries were measured on {} ({}); other GPUs and \
             drivers differ.",
            budget.constants.recorded_on, budget.constants.software
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
