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

use super::simulator::{BlockId, CachingAllocator, Pool, SegmentView};
use super::workspace::{ComputeCapability, WorkspaceError, Workspaces};
use crate::measure::report::phase_line;
use crate::measure::{MeasureConfig, Phase, PHASE_COLUMNS};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The six figures of a phase row, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    pub allocated_baseline_bytes: u64,
    pub allocated_end_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub reserved_baseline_bytes: u64,
    pub reserved_end_bytes: u64,
    pub peak_reserved_bytes: u64,
}

impl Figures {
    /// Names and values, in the order of the phase tables.
    pub fn named(&self) -> [(&'static str, u64); 6] {
        [
            ("allocated_baseline_bytes", self.allocated_baseline_bytes),
            ("allocated_end_bytes", self.allocated_end_bytes),
            ("peak_allocated_bytes", self.peak_allocated_bytes),
            ("reserved_baseline_bytes", self.reserved_baseline_bytes),
            ("reserved_end_bytes", self.reserved_end_bytes),
            ("peak_reserved_bytes", self.peak_reserved_bytes),
        ]
    }

    /// `measured − predicted` for each figure (`self` is the measurement).
    pub fn residual(&self, predicted: &Figures) -> Residual {
        let d = |m: u64, p: u64| {
            (m as i128 - p as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
        };
        Residual {
            allocated_baseline_bytes: d(
                self.allocated_baseline_bytes,
                predicted.allocated_baseline_bytes,
            ),
            allocated_end_bytes: d(self.allocated_end_bytes, predicted.allocated_end_bytes),
            peak_allocated_bytes: d(self.peak_allocated_bytes, predicted.peak_allocated_bytes),
            reserved_baseline_bytes: d(
                self.reserved_baseline_bytes,
                predicted.reserved_baseline_bytes,
            ),
            reserved_end_bytes: d(self.reserved_end_bytes, predicted.reserved_end_bytes),
            peak_reserved_bytes: d(self.peak_reserved_bytes, predicted.peak_reserved_bytes),
        }
    }
}

/// `measured − predicted` for each of the six figures, in bytes (0 everywhere when the model is
/// exact).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residual {
    pub allocated_baseline_bytes: i64,
    pub allocated_end_bytes: i64,
    pub peak_allocated_bytes: i64,
    pub reserved_baseline_bytes: i64,
    pub reserved_end_bytes: i64,
    pub peak_reserved_bytes: i64,
}

impl Residual {
    pub fn values(&self) -> [i64; 6] {
        [
            self.allocated_baseline_bytes,
            self.allocated_end_bytes,
            self.peak_allocated_bytes,
            self.reserved_baseline_bytes,
            self.reserved_end_bytes,
            self.peak_reserved_bytes,
        ]
    }
    pub fn is_zero(&self) -> bool {
        self.values().iter().all(|v| *v == 0)
    }
}

/// A live tensor (or workspace) and the block that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tensor {
    /// `linear1.weight`, `linear1.bias`, `linear2.weight`, `linear2.bias`, `input`, `hidden`,
    /// `gelu`, `output`, `cublas_workspace` or `cublaslt_workspace`.
    pub name: String,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// Bytes of the block handed out (rounded to 512, or a whole cached block).
    pub block_bytes: u64,
    /// `small` or `large`.
    pub pool: String,
}

/// One predicted phase row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhasePrediction {
    pub phase: Phase,
    pub repetition: Option<u32>,
    pub figures: Figures,
    /// Live tensors at the end reading, in allocation order.
    pub live_at_end: Vec<Tensor>,
    /// Live tensors at the moment `allocated` peaked (the first moment it reached the peak).
    pub live_at_peak: Vec<Tensor>,
    /// The allocator's segments at the end reading, in address order.
    pub segments_at_end: Vec<SegmentView>,
    /// The allocator's other statistics at the end reading (no retry and no out-of-memory: the
    /// model has no device capacity).
    pub stats_at_end: crate::measure::DeviceStats,
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
    Config(#[from] crate::measure::ConfigError),
}

impl crate::status::Classify for PredictError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// The allocator model running the protocol, with the live blocks by name.
struct Replay {
    allocator: CachingAllocator,
    live: Vec<(String, u64, BlockId)>,
    peak_allocated: u64,
    live_at_peak: Vec<Tensor>,
}

impl Replay {
    fn malloc(&mut self, name: &str, bytes: u64) {
        // A tensor of zero bytes allocates nothing (PyTorch returns a null pointer).
        if let Some(id) = self.allocator.malloc(bytes, 0, name) {
            self.live.push((name.to_string(), bytes, id));
            let now = self.allocator.stats().allocated.current;
            if now > self.peak_allocated {
                self.peak_allocated = now;
                self.live_at_peak = self.tensors();
            }
        }
    }

    fn free(&mut self, name: &str) {
        if let Some(i) = self.live.iter().position(|(n, _, _)| n == name) {
            let (_, _, id) = self.live.remove(i);
            self.allocator.free(id);
        }
    }

    fn tensors(&self) -> Vec<Tensor> {
        self.live
            .iter()
            .map(|(name, bytes, id)| {
                let block = self.allocator.block_size(*id).unwrap_or(0);
                Tensor {
                    name: name.clone(),
                    requested_bytes: *bytes,
                    block_bytes: block,
                    pool: match super::simulator::pool_of(super::simulator::round_size(*bytes)) {
                        Pool::Small => "small".into(),
                        Pool::Large => "large".into(),
                    },
                }
            })
            .collect()
    }

    /// Runs one phase under the protocol: baseline, peak reset, work, end reading, output freed.
    fn phase(
        &mut self,
        phase: Phase,
        repetition: Option<u32>,
        work: impl FnOnce(&mut Replay),
    ) -> PhasePrediction {
        let before = self.allocator.stats();
        self.allocator.reset_peaks();
        self.peak_allocated = before.allocated.current;
        self.live_at_peak = self.tensors();
        work(self);
        let end = self.allocator.stats();
        let prediction = PhasePrediction {
            phase,
            repetition,
            figures: Figures {
                allocated_baseline_bytes: before.allocated.current,
                allocated_end_bytes: end.allocated.current,
                peak_allocated_bytes: end.allocated.peak,
                reserved_baseline_bytes: before.reserved.current,
                reserved_end_bytes: end.reserved.current,
                peak_reserved_bytes: end.reserved.peak,
            },
            live_at_end: self.tensors(),
            live_at_peak: std::mem::take(&mut self.live_at_peak),
            segments_at_end: self.allocator.snapshot(),
            stats_at_end: self.allocator.device_stats(),
        };
        self.free("output");
        prediction
    }
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
    let mut forward = move |r: &mut Replay| {
        r.free("output");
        r.malloc("hidden", rows * hidden * e);
        if first_pass {
            r.malloc("cublas_workspace", workspaces.cublas_bytes);
            if cublaslt_path {
                if let Some(lt) = workspaces.cublaslt_bytes {
                    r.malloc("cublaslt_workspace", lt);
                }
            }
            first_pass = false;
        }
        r.malloc("gelu", rows * hidden * e);
        r.free("hidden");
        r.malloc("output", rows * width * e);
        r.free("gelu");
    };
    let mut r = Replay {
        allocator: CachingAllocator::with_address_order(super::simulator::AddressOrder::Descending),
        live: Vec::new(),
        peak_allocated: 0,
        live_at_peak: Vec::new(),
    };
    let mut phases = Vec::with_capacity(4 + config.repeats as usize);
    phases.push(r.phase(Phase::ModelLoad, None, |r| {
        r.malloc("linear1.weight", width * hidden * e);
        r.malloc("linear1.bias", hidden * e);
        r.malloc("linear2.weight", hidden * width * e);
        r.malloc("linear2.bias", width * e);
    }));
    debug_assert_eq!(
        r.live.iter().map(|(_, b, _)| b).sum::<u64>(),
        model.parameter_bytes
    );
    phases.push(r.phase(Phase::Inputs, None, |r| {
        r.malloc("input", model.input_bytes)
    }));
    phases.push(r.phase(Phase::ColdForward, None, |r| forward(r)));
    phases.push(r.phase(Phase::Warmup, None, |r| {
        for _ in 0..config.warmup {
            forward(r);
        }
    }));
    for repetition in 1..=config.repeats {
        phases.push(r.phase(Phase::WarmForward, Some(repetition), |r| forward(r)));
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

fn tensor_list(tensors: &[Tensor]) -> String {
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
        // The figure columns of a measurement's table, without the times.
        phase_line(f, &PHASE_COLUMNS[..8])?;
        for p in &self.phases {
            let mut cells = vec![
                p.phase.name().to_string(),
                p.repetition.map_or("-".into(), |r| r.to_string()),
            ];
            cells.extend(p.figures.named().map(|(_, v)| v.to_string()));
            phase_line(f, &cells.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
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
            "Bytes as the caching allocator counts them: `allocated` is part of `reserved`, never add them."
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
            let r = measured.figures().residual(&predicted.figures);
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
