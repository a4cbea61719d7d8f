//! A budget checked against a run of the synthetic transformer on a GPU
//! (`mesure_memoire transformer`): each term the run isolates in a stage, its formula, the same
//! tensors replayed through the allocator model (its 512-byte rounding and its segments), and the
//! allocator's figure; then the run's peak of `allocated` against the budget's.

use super::bench::{stage, BenchMode, BenchReport, BenchRun};
use super::synthetic::terms::{budget_and_activations, Budget, BudgetSettings};
use super::synthetic::workload::{KvFormat, Mode, Optimizer, WeightFormat, Workload};
use crate::allocator::{AddressOrder, AllocatorConfig, Replay, SegmentView};
use crate::units::Bytes;
use serde::Serialize;

/// One term the run isolates.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub term: String,
    /// The stage whose `allocated` change measures it.
    pub stage: String,
    /// The budget's formula.
    pub formula: Bytes,
    /// The same tensors through the allocator model, where the term is a list of tensors.
    pub allocator_model: Option<Bytes>,
    pub measured: Bytes,
    /// measured − (allocator model, else formula).
    pub residual: i128,
}

/// A run of the synthetic transformer against its budget.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub run: String,
    pub gpu: String,
    pub checks: Vec<Check>,
    /// The block maps recorded at the end of the stages that only make named tensors, against
    /// the allocator model's replay (runs with `--blocks`).
    pub maps: Vec<MapCheck>,
    /// The budget's peak of `allocated`, its exact terms taken as the allocator model rounds them.
    pub predicted_peak: Bytes,
    /// The largest peak of `allocated` over the run's stages.
    pub measured_peak: Bytes,
    /// (measured − predicted) / measured, in percent.
    pub peak_error_percent: f64,
    pub budget: Budget,
}

/// Several runs checked, shown one after the other (a JSON array).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct Verifications(pub Vec<Verification>);

impl std::fmt::Display for Verifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, v) in self.0.iter().enumerate() {
            if n > 0 {
                writeln!(f, "\n")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "the report has no stage {0:?}: it is not a complete run of `mesure_memoire transformer`"
    )]
    MissingStage(&'static str),
    #[error("the report's run is refused by the budget: {0}")]
    Workload(#[from] super::synthetic::workload::WorkloadError),
}

impl crate::status::Classify for VerifyError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::DataError
    }
}

/// The budget's workload of a bench run: the same shape, mode, sizes and attention.
pub fn workload_of(run: &BenchRun) -> Workload {
    let mode = match run.mode {
        BenchMode::Inference => Mode::Inference {
            generated: run.generated,
            kv_cache: KvFormat::of(run.dtype),
        },
        BenchMode::Full => Mode::Full {
            optimizer: Optimizer::AdamwMixed,
        },
        BenchMode::Lora => Mode::Lora {
            rank: run.lora_rank,
            targets: run.ordered_targets(),
        },
    };
    Workload {
        preset: None,
        shape: run.shape.clone(),
        mode,
        dtype: run.dtype,
        weights: WeightFormat::Dense,
        batch: run.batch,
        context: run.context,
        checkpointing: run.checkpointing,
        flash_attention: run.flash_attention,
    }
}

/// Allocates the bench's persistent tensors in the order it allocates them; the `allocated`
/// they add.
fn add(replay: &mut Replay, tensors: impl IntoIterator<Item = (String, u64)>) -> u64 {
    let before = replay.stats().allocated.current;
    for (name, size) in tensors {
        replay
            .alloc(&name, size)
            .expect("the model has no capacity limit");
    }
    replay.stats().allocated.current - before
}

/// A block map without addresses, segments in a fixed order: (pool, size, each block's
/// (allocated, name, size)). Two maps with the same shape compare equal.
type MapShape = Vec<(String, u64, Vec<(bool, String, u64)>)>;

fn map_shape(map: &[SegmentView]) -> MapShape {
    let mut shape: MapShape = map
        .iter()
        .map(|seg| {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| (b.allocated, b.label.clone().unwrap_or_default(), b.size))
                .collect();
            (format!("{:?}", seg.pool), seg.size, blocks)
        })
        .collect();
    shape.sort();
    shape
}

/// A stage's measured block map against the allocator model's replay of the same tensors.
#[derive(Debug, Clone, Serialize)]
pub struct MapCheck {
    pub stage: String,
    pub segments: usize,
    pub blocks: usize,
    /// Every segment and block, size and name, as the model has it.
    pub equal: bool,
    /// The first segment that differs, measured then modelled, when they differ.
    pub difference: Option<String>,
}

fn compare_maps(stage: &str, measured: &[SegmentView], model: &[SegmentView]) -> MapCheck {
    let (m, p) = (map_shape(measured), map_shape(model));
    let difference = (m != p).then(|| {
        let at = m
            .iter()
            .zip(&p)
            .position(|(a, b)| a != b)
            .unwrap_or(m.len().min(p.len()));
        format!(
            "{} segments measured, {} modelled; first difference: {:?} against {:?}",
            m.len(),
            p.len(),
            m.get(at),
            p.get(at)
        )
    });
    MapCheck {
        stage: stage.into(),
        segments: m.len(),
        blocks: m.iter().map(|s| s.2.len()).sum(),
        equal: difference.is_none(),
        difference,
    }
}

/// AdamW's state tensors of `trained` (name, float32 bytes), in the bench's order: for each, its
/// master copy (with `master`), `exp_avg`, `exp_avg_sq`.
fn moments(trained: &[(String, u64)], master: bool) -> Vec<(String, u64)> {
    trained
        .iter()
        .flat_map(|(name, size)| {
            super::optimizer_state_names(name, master)
                .into_iter()
                .map(|n| (n, *size))
        })
        .collect()
}

/// Checks the budget of `report`'s run against its figures.
pub fn verify(report: &BenchReport, settings: BudgetSettings) -> Result<Verification, VerifyError> {
    let run = &report.run;
    let w = workload_of(run).validated()?;
    let (b, acts) = budget_and_activations(&w, settings);
    let reading = |name: &'static str| report.stage(name).ok_or(VerifyError::MissingStage(name));
    let delta = |name: &'static str| -> Result<u64, VerifyError> {
        Ok(u64::try_from(reading(name)?.allocated_delta()).unwrap_or(0))
    };
    let term = |key: &str| {
        b.terms
            .iter()
            .find(|t| t.key == key)
            .map_or(0, |t| t.bytes.0)
    };
    let e = run.dtype.bytes();
    let tensors = run.shape.tensors();
    // New segments at decreasing addresses, as the H200's driver hands them out (the lesson's
    // maps showed it): where several free blocks fit equally, the allocator picks by address.
    let mut replay = Replay::new(AllocatorConfig {
        address_order: AddressOrder::Descending,
        ..Default::default()
    });
    let mut checks = Vec::new();
    let mut rounding: i128 = 0;
    let mut check = |term: &str, stage: &str, formula: u64, model: Option<u64>, measured: u64| {
        let expected = model.unwrap_or(formula);
        if model.is_some() {
            rounding += i128::from(expected) - i128::from(formula);
        }
        checks.push(Check {
            term: term.into(),
            stage: stage.into(),
            formula: Bytes(formula),
            allocator_model: model.map(Bytes),
            measured: Bytes(measured),
            residual: i128::from(measured) - i128::from(expected),
        });
    };

    let mut maps = Vec::new();
    let mut compare = |stage: &'static str, replay: &Replay| -> Result<(), VerifyError> {
        if let Some(measured) = &reading(stage)?.blocks {
            maps.push(compare_maps(stage, measured, &replay.snapshot()));
        }
        Ok(())
    };
    let weights = add(
        &mut replay,
        tensors.iter().map(|t| (t.name.clone(), t.elements * e)),
    );
    compare(stage::WEIGHTS, &replay)?;
    check(
        "weights",
        stage::WEIGHTS,
        term("weights"),
        Some(weights),
        delta(stage::WEIGHTS)?,
    );
    let (b_, t_) = (run.batch, run.context);
    match run.mode {
        BenchMode::Inference => {
            let s = &run.shape;
            let one = b_ * s.kv_heads * (t_ + run.generated) * s.head_dim * e;
            let kv = add(
                &mut replay,
                (0..s.layers).flat_map(|l| super::kv_cache_names(l).map(|n| (n, one))),
            );
            compare(stage::KV_CACHE, &replay)?;
            check(
                "kv_cache",
                stage::KV_CACHE,
                term("kv_cache"),
                Some(kv),
                delta(stage::KV_CACHE)?,
            );
            // The prefill leaves the workspace and the next tokens' ids ([batch, 1] int64).
            let ids = crate::allocator::size::round_size(8 * b_);
            let workspace = delta(stage::PREFILL)?.saturating_sub(ids);
            check(
                "cublas_workspace",
                stage::PREFILL,
                term("cublas_workspace"),
                None,
                workspace,
            );
        }
        BenchMode::Full | BenchMode::Lora => {
            // The trained tensors, named as the bench names them, and their sizes.
            let trained: Vec<(String, u64)>;
            let states: Vec<(String, u64)>;
            if run.mode == BenchMode::Lora {
                let mut adapters = Vec::new();
                let targets = run.ordered_targets();
                for l in 0..run.shape.layers {
                    for &target in &targets {
                        let (out, inp) = run.shape.linear_features(target);
                        let [a, b] = super::adapter_names(l, target);
                        adapters.push((a, run.lora_rank * inp * 4));
                        adapters.push((b, out * run.lora_rank * 4));
                    }
                }
                trained = adapters;
                let adapters = add(&mut replay, trained.iter().cloned());
                compare(stage::ADAPTERS, &replay)?;
                check(
                    "lora_adapters",
                    stage::ADAPTERS,
                    term("lora_adapters"),
                    Some(adapters),
                    delta(stage::ADAPTERS)?,
                );
                // float32 adapters are their own master: two moments each.
                states = moments(&trained, false);
            } else {
                // A 16-bit parameter gets a float32 master copy; a float32 one is its own.
                trained = tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.elements * 4))
                    .collect();
                states = moments(&trained, e < 4);
            }
            let states = add(&mut replay, states);
            compare(stage::OPTIMIZER_STATES, &replay)?;
            check(
                "optimizer_states",
                stage::OPTIMIZER_STATES,
                term("optimizer_states") + term("master_weights"),
                Some(states),
                delta(stage::OPTIMIZER_STATES)?,
            );
            // The first iteration leaves the workspaces and the batch's ids and targets.
            let ids = 2 * crate::allocator::size::round_size(8 * b_ * t_);
            let workspace = delta(stage::FIRST_STEP)?.saturating_sub(ids);
            check(
                "cublas_workspace",
                stage::FIRST_STEP,
                term("cublas_workspace"),
                None,
                workspace,
            );
            check(
                "activations kept for backward, and the loss's",
                stage::FORWARD,
                acts.bytes + acts.loss_kept,
                None,
                delta(stage::FORWARD)?,
            );
            let forward = reading(stage::FORWARD)?;
            let backward = reading(stage::BACKWARD)?;
            check(
                "gradients",
                stage::BACKWARD,
                term("gradients"),
                None,
                backward
                    .allocated_after
                    .saturating_sub(forward.allocated_before),
            );
        }
    }
    let predicted_peak = u64::try_from(i128::from(b.peak_allocated.0) + rounding).unwrap_or(0);
    let measured_peak = report
        .stages
        .iter()
        .map(|s| s.peak_allocated)
        .max()
        .unwrap_or(0);
    let error = if measured_peak == 0 {
        0.0
    } else {
        (measured_peak as f64 - predicted_peak as f64) / measured_peak as f64 * 100.0
    };
    Ok(Verification {
        run: run.summary(),
        gpu: crate::text::printable(report.environment.gpu_name()).to_string(),
        checks,
        maps,
        predicted_peak: Bytes(predicted_peak),
        measured_peak: Bytes(measured_peak),
        peak_error_percent: error,
        budget: b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replayed(sizes: &[u64]) -> Vec<SegmentView> {
        let mut r = Replay::new(AllocatorConfig::default());
        add(
            &mut r,
            sizes.iter().enumerate().map(|(n, s)| (format!("t{n}"), *s)),
        );
        r.snapshot()
    }

    #[test]
    fn maps_compare_by_segment_and_block_not_by_address() {
        let sizes = [1 << 20, 3 << 20, 512, 25 << 20];
        let mut measured = replayed(&sizes);
        for (n, seg) in (0u32..).zip(measured.iter_mut()) {
            seg.address += 1 << 40;
            seg.stream = n;
        }
        measured.reverse();
        let same = compare_maps("weights", &measured, &replayed(&sizes));
        assert!(same.equal, "{:?}", same.difference);
        assert_eq!(
            same.blocks,
            measured.iter().map(|s| s.blocks.len()).sum::<usize>()
        );
        let other = compare_maps(
            "weights",
            &measured,
            &replayed(&[1 << 20, 3 << 20, 512, 30 << 20]),
        );
        assert!(!other.equal);
        assert!(other.difference.unwrap().contains("first difference"));
        let mut renamed = measured.clone();
        renamed[0].blocks[0].label = Some("somebody else".into());
        assert!(!compare_maps("weights", &renamed, &replayed(&sizes)).equal);
    }
}
