//! The protocol of `measure` replayed on the allocator model: the exact sequence of allocations
//! and frees that libtorch makes for the synthetic `Linear -> GELU -> Linear` network, phase by
//! phase, and the six figures the allocator then reports, with every live block named.
//!
//! The sequence (PyTorch 2.11.0, read from its source and proven on an H200, see
//! `docs/allocator-model.md`):
//! - `model_load`: `linear1.weight` [hidden, width], `linear1.bias` [hidden],
//!   `linear2.weight` [width, hidden], `linear2.bias` [width], each one allocation in the final
//!   dtype (the conversion runs on the CPU before the copy);
//! - `inputs`: `input` [batch, context, width];
//! - each pass: `hidden` (the first Linear's output), then, on the first pass of the process, the
//!   cuBLAS workspace and, when the Linear takes the cuBLASLt path (width > 1 and hidden > 1, as
//!   `addmm` requires), the cuBLASLt workspace; `gelu`; free `hidden`; `output`; free `gelu`.
//!   The output is alive at the end reading and freed right after it.

use super::table::{PHASE_COLUMNS, PHASE_WIDTHS};
use super::MeasureConfig;
use crate::allocator::workspace::WorkspaceError;
use crate::allocator::{AddressOrder, AllocatorConfig, ComputeCapability, SegmentView, Workspaces};
use crate::markup::Table;
use crate::reading::{DeviceStats, Figures, Phase};
use crate::replay::{LiveBlock, NamedReplay};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One predicted phase row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhasePrediction {
    pub phase: Phase,
    pub repetition: Option<u32>,
    pub figures: Figures,
    /// Live tensors at the end reading, in allocation order.
    pub live_at_end: Vec<LiveBlock>,
    /// Live tensors at the moment `allocated` peaked (the first moment it reached the peak).
    pub live_at_peak: Vec<LiveBlock>,
    /// The allocator's segments at the end reading, in address order.
    pub segments_at_end: Vec<SegmentView>,
    /// The allocator's other statistics at the end reading (no retry and no out-of-memory: the
    /// model has no device capacity).
    pub stats_at_end: DeviceStats,
}

/// What the model predicts for one configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    /// What is modelled: the allocator, its version and configuration.
    pub model: String,
    /// The configuration predicted (validated: `hidden` holds its number).
    pub configuration: MeasureConfig,
    pub compute_capability: ComputeCapability,
    pub workspaces: Workspaces,
    /// Whether the Linear layers take the cuBLASLt path (then the cuBLASLt workspace is allocated).
    pub cublaslt_path: bool,
    pub phases: Vec<PhasePrediction>,
}

impl Prediction {
    /// The largest predicted `peak_allocated_bytes` over all phases.
    pub fn max_peak_allocated(&self) -> u64 {
        self.max_of(|f| f.peak_allocated_bytes)
    }

    /// The largest predicted `peak_reserved_bytes` over all phases.
    pub fn max_peak_reserved(&self) -> u64 {
        self.max_of(|f| f.peak_reserved_bytes)
    }

    fn max_of(&self, figure: impl Fn(&Figures) -> u64) -> u64 {
        self.phases
            .iter()
            .map(|r| figure(&r.figures))
            .max()
            .unwrap_or(0)
    }
}

/// The model's name and scope, recorded with every prediction.
pub const MODEL: &str = "PyTorch 2.11.0 CUDA caching allocator, default configuration, one stream";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PredictError {
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    Config(#[from] super::ConfigError),
}

impl crate::status::Classify for PredictError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// Runs one phase under the protocol: baseline, peak reset, work, end reading, output freed.
fn phase(
    r: &mut NamedReplay,
    phase: Phase,
    repetition: Option<u32>,
    work: impl FnOnce(&mut NamedReplay),
) -> PhasePrediction {
    r.begin_span();
    work(r);
    let prediction = PhasePrediction {
        phase,
        repetition,
        figures: r.span_figures(),
        live_at_end: r.live(),
        live_at_peak: r.live_at_peak().to_vec(),
        segments_at_end: r.snapshot(),
        stats_at_end: r.device_stats(),
    };
    r.free_named("output");
    prediction
}

/// Allocates `name`: the model has no device capacity, so only a zero-byte tensor allocates
/// nothing.
fn alloc(r: &mut NamedReplay, name: &str, bytes: u64) {
    r.alloc(name, bytes)
        .expect("the model of a measurement has no device capacity");
}

/// Predicts every phase row of `measure` for `config` on a GPU of compute capability `cc` with
/// these workspaces. Pure arithmetic: no GPU, no libtorch.
pub fn predict(
    config: &MeasureConfig,
    cc: ComputeCapability,
    workspaces: Workspaces,
) -> Result<Prediction, PredictError> {
    let config = config.clone().validated()?;
    let model = config.model()?;
    let e = config.dtype.bytes();
    let (width, hidden) = (config.width, config.hidden());
    // validated() bounds every product below 2^62.
    let rows = config.batch * config.context;
    // addmm takes cuBLASLt when both sizes of the transposed weight exceed 1.
    let cublaslt_path = workspaces.addmm_cublaslt && width > 1 && hidden > 1;
    let mut first_pass = true;
    let mut forward = move |r: &mut NamedReplay| {
        r.free_named("output");
        alloc(r, "hidden", rows * hidden * e);
        if first_pass {
            alloc(r, "cublas_workspace", workspaces.cublas_bytes);
            if cublaslt_path {
                if let Some(lt) = workspaces.cublaslt_bytes {
                    alloc(r, "cublaslt_workspace", lt);
                }
            }
            first_pass = false;
        }
        alloc(r, "gelu", rows * hidden * e);
        r.free_named("hidden");
        alloc(r, "output", rows * width * e);
        r.free_named("gelu");
    };
    let mut r = NamedReplay::new(AllocatorConfig {
        address_order: AddressOrder::Descending,
        ..Default::default()
    })
    .tracking_peak_tensors();
    let mut phases = Vec::with_capacity(4 + config.repeats as usize);
    phases.push(phase(&mut r, Phase::ModelLoad, None, |r| {
        alloc(r, "linear1.weight", width * hidden * e);
        alloc(r, "linear1.bias", hidden * e);
        alloc(r, "linear2.weight", hidden * width * e);
        alloc(r, "linear2.bias", width * e);
    }));
    debug_assert_eq!(
        r.live().iter().map(|t| t.requested_bytes).sum::<u64>(),
        model.parameter_bytes
    );
    phases.push(phase(&mut r, Phase::Inputs, None, |r| {
        alloc(r, "input", model.input_bytes)
    }));
    phases.push(phase(&mut r, Phase::ColdForward, None, |r| forward(r)));
    phases.push(phase(&mut r, Phase::Warmup, None, |r| {
        for _ in 0..config.warmup {
            forward(r);
        }
    }));
    for repetition in 1..=config.repeats {
        phases.push(phase(&mut r, Phase::WarmForward, Some(repetition), |r| {
            forward(r)
        }));
    }
    Ok(Prediction {
        model: MODEL.into(),
        configuration: config.clone(),
        compute_capability: cc,
        workspaces,
        cublaslt_path,
        phases,
    })
}

fn tensor_list(tensors: &[LiveBlock]) -> String {
    tensors
        .iter()
        .map(|t| format!("{} {}", t.name, Bytes(t.block_bytes).grouped()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Prediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.configuration;
        writeln!(
            f,
            "Prediction for [batch {}, context {}, width {}], hidden {}, {}, warm-up {}, repeats {} \
             on compute capability {}",
            c.batch,
            c.context,
            c.width,
            c.hidden(),
            c.dtype,
            c.warmup,
            c.repeats,
            self.compute_capability
        )?;
        writeln!(f, "  model       {}", self.model)?;
        let w = &self.workspaces;
        writeln!(
            f,
            "  workspaces  cuBLAS {} ({}); cuBLASLt {}",
            Bytes(w.cublas_bytes).grouped(),
            Bytes(w.cublas_bytes).mib_text(),
            match (self.cublaslt_path, w.cublaslt_bytes) {
                (false, _) => "not used (the Linear layers take the plain cuBLAS path)".into(),
                (true, None) => "shares the cuBLAS workspace (unified)".into(),
                (true, Some(b)) => format!("{} ({})", Bytes(b).grouped(), Bytes(b).mib_text()),
            }
        )?;
        // The figure columns of a measurement's table, without the times; bytes grouped.
        let rows = self
            .phases
            .iter()
            .map(|p| {
                let mut cells = vec![
                    p.phase.name().to_string(),
                    p.repetition.map_or("-".into(), |r| r.to_string()),
                ];
                cells.extend(p.figures.values().map(crate::units::grouped));
                cells
            })
            .collect();
        write!(
            f,
            "{}",
            Table::new(&PHASE_COLUMNS[..8], rows).with_min_widths(&PHASE_WIDTHS)
        )?;
        writeln!(f, "Live blocks (name, block size):")?;
        for p in &self.phases {
            let rep = p.repetition.map_or(String::new(), |r| format!(" {r}"));
            writeln!(
                f,
                "  {}{rep} at peak: {}",
                p.phase.name(),
                tensor_list(&p.live_at_peak)
            )?;
            writeln!(
                f,
                "  {}{rep} at end:  {}",
                p.phase.name(),
                tensor_list(&p.live_at_end)
            )?;
        }
        if let Some(last) = self.phases.last() {
            writeln!(f, "Segments at the end (address order):")?;
            for s in &last.segments_at_end {
                let blocks: Vec<String> = s
                    .blocks
                    .iter()
                    .map(|b| match &b.label {
                        Some(name) => format!("{name} {}", Bytes(b.size).grouped()),
                        None => format!("free {}", Bytes(b.size).grouped()),
                    })
                    .collect();
                writeln!(
                    f,
                    "  {:?} {} ({}): {}",
                    s.pool,
                    Bytes(s.size).grouped(),
                    Bytes(s.size).mib_text(),
                    blocks.join(" | ")
                )?;
            }
        }
        write!(
            f,
            "Bytes as the caching allocator counts them: `allocated` is part of `reserved`, never \
             add them."
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::WorkspaceSettings;
    use crate::measure::Measurement;

    fn h200() -> (ComputeCapability, Workspaces) {
        let cc = ComputeCapability::new(9, 0);
        (
            cc,
            Workspaces::for_gpu(cc, &WorkspaceSettings::default()).unwrap(),
        )
    }

    #[test]
    fn the_seed_small_run_is_predicted_to_the_byte_and_named() {
        let (cc, ws) = h200();
        let p = predict(&MeasureConfig::default(), cc, ws).unwrap();
        let cold = &p.phases[2];
        assert_eq!(cold.figures.allocated_baseline_bytes, 136_704);
        assert_eq!(cold.figures.allocated_end_bytes, 34_743_808);
        assert_eq!(cold.figures.peak_allocated_bytes, 34_772_480);
        assert_eq!(cold.figures.reserved_end_bytes, 35_651_584);
        let names: Vec<_> = cold.live_at_end.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "linear1.weight",
                "linear1.bias",
                "linear2.weight",
                "linear2.bias",
                "input",
                "cublas_workspace",
                "cublaslt_workspace",
                "output"
            ]
        );
        let at_peak: Vec<_> = cold.live_at_peak.iter().map(|t| t.name.as_str()).collect();
        assert!(
            at_peak.contains(&"hidden") && at_peak.contains(&"gelu"),
            "{at_peak:?}"
        );
    }

    /// Every measurement recorded on the H200 in `data/` replays with zero residual.
    #[test]
    fn the_recorded_h200_measurement_replays_with_zero_residual() {
        let m = Measurement::from_bytes(
            include_bytes!("../../data/exemple-mesure-h200-petit-essai.json"),
            "example",
        )
        .unwrap();
        let (cc, ws) = h200();
        let p = predict(&m.configuration, cc, ws).unwrap();
        assert_eq!(p.phases.len(), m.phases.len());
        for (measured, predicted) in m.phases.iter().zip(&p.phases) {
            let r = measured.figures.residual(&predicted.figures);
            assert!(r.is_zero(), "{:?}: {r:?}", measured.phase);
        }
    }

    #[test]
    fn a_tiny_network_takes_the_plain_cublas_path() {
        let (cc, ws) = h200();
        let config = MeasureConfig {
            width: 1,
            hidden: Some(1),
            ..Default::default()
        };
        let p = predict(&config, cc, ws).unwrap();
        assert!(!p.cublaslt_path);
        let names: Vec<_> = p.phases[2]
            .live_at_end
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert!(!names.contains(&"cublaslt_workspace"));
        // Four 512-byte parameter blocks, the input and the output (512 each), the workspace.
        assert_eq!(
            p.phases[2].figures.allocated_end_bytes,
            6 * 512 + 33_554_432
        );
    }

    #[test]
    fn other_architectures_get_their_own_workspace() {
        let cc = ComputeCapability::new(8, 0);
        let ws = Workspaces::for_gpu(cc, &WorkspaceSettings::default()).unwrap();
        let p = predict(&MeasureConfig::default(), cc, ws).unwrap();
        let cold = &p.phases[2].figures;
        assert_eq!(
            cold.allocated_end_bytes - cold.allocated_baseline_bytes,
            8_519_680 + 1_048_576 + 4096
        );
        // 8 519 680 B is under 10 MiB: a 20 MiB segment.
        assert_eq!(cold.reserved_end_bytes, 2 * 1_048_576 + 20_971_520);
    }
}
