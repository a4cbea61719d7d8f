//! A budget checked against a run of the synthetic transformer on a GPU
//! (`mesure_memoire transformer`): each term the run isolates in a stage, its formula, the same
//! tensors replayed through the allocator model (its 512-byte rounding and its segments), and the
//! allocator's figure; then the run's peak of `allocated` against the budget's.

use super::activations;
use super::bench::{stage, BenchMode, BenchReport, BenchRun};
use super::terms::{budget, Budget, BudgetSettings, Place};
use super::workload::{KvFormat, Mode, Optimizer, WeightFormat, Workload};
use crate::allocator::simulator::CachingAllocator;
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
    Workload(#[from] super::WorkloadError),
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

/// The bench's persistent tensors, in the order it allocates them, through the allocator model:
/// the `allocated` each group adds.
struct Replay {
    allocator: CachingAllocator,
}

impl Replay {
    fn add(&mut self, sizes: impl IntoIterator<Item = u64>) -> u64 {
        let before = self.allocator.stats().allocated.current;
        for size in sizes {
            self.allocator
                .malloc(size, 0, "tensor")
                .expect("the model has no capacity limit");
        }
        self.allocator.stats().allocated.current - before
    }
}

/// Checks the budget of `report`'s run against its figures.
pub fn verify(report: &BenchReport, settings: BudgetSettings) -> Result<Verification, VerifyError> {
    let run = &report.run;
    let w = workload_of(run).validated()?;
    let b = budget(&w, settings);
    let acts = activations::estimate(&w);
    let reading = |name: &'static str| {
        report
            .stages
            .iter()
            .find(|s| s.stage == name)
            .ok_or(VerifyError::MissingStage(name))
    };
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
    let mut replay = Replay {
        allocator: CachingAllocator::new(),
    };
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

    let weights = replay.add(tensors.iter().map(|t| t.elements * e));
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
            let kv = replay.add((0..2 * s.layers).map(|_| one));
            check(
                "kv_cache",
                stage::KV_CACHE,
                term("kv_cache"),
                Some(kv),
                delta(stage::KV_CACHE)?,
            );
            // The prefill leaves the workspace and the next tokens' ids ([batch, 1] int64).
            let ids = crate::allocator::simulator::round_size(8 * b_);
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
            let mut trained: Vec<u64> = Vec::new();
            if run.mode == BenchMode::Lora {
                let mut sizes = Vec::new();
                for _ in 0..run.shape.layers {
                    for target in run.ordered_targets() {
                        let (out, inp) = super::linear_features(&run.shape, target);
                        sizes.push(run.lora_rank * inp * 4);
                        sizes.push(out * run.lora_rank * 4);
                    }
                }
                let adapters = replay.add(sizes.iter().copied());
                check(
                    "lora_adapters",
                    stage::ADAPTERS,
                    term("lora_adapters"),
                    Some(adapters),
                    delta(stage::ADAPTERS)?,
                );
                // float32 adapters are their own master: two moments each.
                trained = sizes.iter().flat_map(|&s| [s, s]).collect();
            } else {
                // A 16-bit parameter gets a float32 master copy; a float32 one is its own.
                let per_tensor = if e < 4 { 3 } else { 2 };
                for t in &tensors {
                    trained.extend(std::iter::repeat_n(t.elements * 4, per_tensor));
                }
            }
            let states = replay.add(trained);
            check(
                "optimizer_states",
                stage::OPTIMIZER_STATES,
                term("optimizer_states") + term("master_weights"),
                Some(states),
                delta(stage::OPTIMIZER_STATES)?,
            );
            // The first iteration leaves the workspaces and the batch's ids and targets.
            let ids = 2 * crate::allocator::simulator::round_size(8 * b_ * t_);
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
    debug_assert!(b.terms.iter().any(|t| t.place == Place::Allocator));
    Ok(Verification {
        run: run.summary(),
        gpu: report
            .environment
            .device
            .as_ref()
            .map_or("unknown GPU".into(), |d| d.name.clone()),
        checks,
        predicted_peak: Bytes(predicted_peak),
        measured_peak: Bytes(measured_peak),
        peak_error_percent: error,
        budget: b,
    })
}
