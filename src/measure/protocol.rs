//! The phase protocol, independent of libtorch: for each phase, synchronise, read the baselines,
//! reset the peaks, run, synchronise, read the ends and the peaks; free the phase's output after
//! the end reading. Any [`Backend`] can run it; the libtorch one is in the crate
//! `iteragpu-torch`.

use super::MeasureError;
use crate::allocator::SegmentView;
use crate::reading::{AllocatorReading, DeviceStats, Figures, Phase, Residual};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What the protocol needs from a device. Every call is synchronous with respect to the host
/// except the model operations, which may queue work until `synchronize`.
pub trait Backend {
    fn synchronize(&mut self) -> Result<(), MeasureError>;
    fn read_allocator(&mut self) -> Result<AllocatorReading, MeasureError>;
    fn reset_peaks(&mut self) -> Result<(), MeasureError>;
    /// Records the GPU-side start of a phase (a CUDA event on the current stream).
    fn start_gpu_timer(&mut self) -> Result<(), MeasureError>;
    /// Records the GPU-side end and returns the elapsed GPU time in milliseconds.
    fn stop_gpu_timer(&mut self) -> Result<f64, MeasureError>;
    /// Builds and initialises the network on the CPU, then moves it to the GPU.
    fn load_model(&mut self) -> Result<(), MeasureError>;
    /// Creates the synthetic input on the GPU.
    fn create_inputs(&mut self) -> Result<(), MeasureError>;
    /// One forward pass; its output stays alive until `release_output`.
    fn forward(&mut self) -> Result<(), MeasureError>;
    fn release_output(&mut self);
    /// The block map of the phase that just ended, when this backend records one (read after
    /// the end reading, outside the measured span). The peak map starts over at `reset_peaks`.
    fn blocks(&mut self) -> Result<Option<PhaseBlocks>, MeasureError> {
        Ok(None)
    }
}

/// One row of the result: a phase's readings. Baselines, ends and peaks are distinct figures:
/// `allocated` is part of `reserved` (never add them) and the two peaks are separate maxima
/// (never subtract them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    pub phase: Phase,
    /// 1-based repetition number for `warm_forward`, null for the other phases.
    pub repetition: Option<u32>,
    /// Forward passes run in this row (0 for `model_load` and `inputs`).
    pub passes: u32,
    /// The six figures, flat in the JSON (`allocated_baseline_bytes` ... `peak_reserved_bytes`).
    #[serde(flatten)]
    pub figures: Figures,
    /// Host wall time from after the baseline reading to after the final synchronisation, in ms:
    /// includes launch overhead, host work and synchronisation, as the original protocol does.
    pub host_wall_time_ms: f64,
    /// GPU time of the same span from CUDA events on the current stream, in ms (host-only work,
    /// such as the CPU part of `model_load`, shows as GPU idle time between the events).
    pub gpu_event_time_ms: f64,
    /// The allocator model's figures for this row and the residual (measured − predicted);
    /// absent when no prediction was made (see `Measurement::model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<RowPrediction>,
    /// The allocator's block map at the end reading and at the peak (`measure --blocks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<PhaseBlocks>,
}

/// The model's figures for one measured row, and how far the measurement is from them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowPrediction {
    pub figures: Figures,
    /// measured − predicted, per figure, in bytes.
    pub residual: Residual,
}

impl RowPrediction {
    /// The row's `predicted` and `residual` figures as table cells, in the phase table's order.
    pub fn cells(&self) -> [(&'static str, [String; 6]); 2] {
        [
            (
                "predicted",
                self.figures.named().map(|(_, v)| v.to_string()),
            ),
            ("residual", self.residual.values().map(|v| v.to_string())),
        ]
    }
}

/// The allocator's own map (its snapshot) of one phase, every allocated block named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseBlocks {
    /// At the end reading (the phase's output alive).
    pub at_end: Vec<SegmentView>,
    /// When `allocated` peaked during the phase (read after each operation of a pass).
    pub at_peak: Vec<SegmentView>,
    /// The allocator's own statistics at the end reading (absent from files written before it
    /// existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_at_end: Option<DeviceStats>,
}

/// Runs one phase under the protocol.
fn run_phase<B: Backend>(
    backend: &mut B,
    phase: Phase,
    repetition: Option<u32>,
    passes: u32,
    work: impl FnOnce(&mut B) -> Result<(), MeasureError>,
) -> Result<PhaseRecord, MeasureError> {
    backend.synchronize()?;
    let baseline = backend.read_allocator()?;
    backend.reset_peaks()?;
    let started = Instant::now();
    backend.start_gpu_timer()?;
    work(backend).map_err(|e| e.in_phase(phase))?;
    let gpu_ms = backend.stop_gpu_timer()?;
    backend.synchronize().map_err(|e| e.in_phase(phase))?;
    let host_ms = started.elapsed().as_secs_f64() * 1e3;
    let end = backend.read_allocator()?;
    let blocks = backend.blocks()?;
    backend.release_output();
    Ok(PhaseRecord {
        phase,
        repetition,
        passes,
        figures: Figures {
            allocated_baseline_bytes: baseline.allocated,
            allocated_end_bytes: end.allocated,
            peak_allocated_bytes: end.peak_allocated,
            reserved_baseline_bytes: baseline.reserved,
            reserved_end_bytes: end.reserved,
            peak_reserved_bytes: end.peak_reserved,
        },
        host_wall_time_ms: host_ms,
        gpu_event_time_ms: gpu_ms,
        prediction: None,
        blocks,
    })
}

/// The whole protocol: model_load, inputs, cold_forward, warmup (all passes in one row), then one
/// warm_forward row per repetition. `on_phase` is told after each row (for progress display).
pub fn run_protocol<B: Backend>(
    backend: &mut B,
    warmup: u32,
    repeats: u32,
    mut on_phase: impl FnMut(&PhaseRecord),
) -> Result<Vec<PhaseRecord>, MeasureError> {
    let mut rows = Vec::with_capacity(4 + repeats as usize);
    let mut push = |row: PhaseRecord, rows: &mut Vec<PhaseRecord>| {
        on_phase(&row);
        rows.push(row);
    };
    let r = run_phase(backend, Phase::ModelLoad, None, 0, B::load_model)?;
    push(r, &mut rows);
    let r = run_phase(backend, Phase::Inputs, None, 0, B::create_inputs)?;
    push(r, &mut rows);
    let r = run_phase(backend, Phase::ColdForward, None, 1, B::forward)?;
    push(r, &mut rows);
    let r = run_phase(backend, Phase::Warmup, None, warmup, |b| {
        for _ in 0..warmup {
            b.release_output();
            b.forward()?;
        }
        Ok(())
    })?;
    push(r, &mut rows);
    for repetition in 1..=repeats {
        let r = run_phase(backend, Phase::WarmForward, Some(repetition), 1, B::forward)?;
        push(r, &mut rows);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated allocator: it counts live bytes and a never-shrinking cache, and logs every
    /// call, so the protocol's order and bookkeeping can be checked without a GPU.
    #[derive(Default)]
    struct Simulated {
        live: u64,
        reserved: u64,
        peak_live: u64,
        peak_reserved: u64,
        output: u64,
        log: Vec<&'static str>,
        fail_forward_after: Option<usize>,
        forwards: usize,
        /// The device's memory: a request that would make `reserved` exceed it fails as CUDA's
        /// allocator does, with the sizes in the message and nothing allocated.
        capacity: Option<u64>,
    }

    impl Simulated {
        fn alloc(&mut self, n: u64) -> Result<(), MeasureError> {
            let reserved = self.reserved.max((self.live + n).next_multiple_of(1 << 21));
            if let Some(capacity) = self.capacity.filter(|c| reserved > *c) {
                return Err(MeasureError::from_torch_message(&format!(
                    "CUDA out of memory. Tried to allocate {n} bytes; {} bytes reserved of {capacity}\n\
                     (a second line of details)",
                    self.reserved
                )));
            }
            self.live += n;
            self.reserved = reserved;
            self.peak_live = self.peak_live.max(self.live);
            self.peak_reserved = self.peak_reserved.max(self.reserved);
            Ok(())
        }
    }

    impl Backend for Simulated {
        fn synchronize(&mut self) -> Result<(), MeasureError> {
            self.log.push("sync");
            Ok(())
        }
        fn read_allocator(&mut self) -> Result<AllocatorReading, MeasureError> {
            self.log.push("read");
            Ok(AllocatorReading {
                allocated: self.live,
                reserved: self.reserved,
                peak_allocated: self.peak_live,
                peak_reserved: self.peak_reserved,
            })
        }
        fn reset_peaks(&mut self) -> Result<(), MeasureError> {
            self.log.push("reset");
            self.peak_live = self.live;
            self.peak_reserved = self.reserved;
            Ok(())
        }
        fn start_gpu_timer(&mut self) -> Result<(), MeasureError> {
            Ok(())
        }
        fn stop_gpu_timer(&mut self) -> Result<f64, MeasureError> {
            Ok(0.5)
        }
        fn load_model(&mut self) -> Result<(), MeasureError> {
            self.log.push("load");
            self.alloc(1000)
        }
        fn create_inputs(&mut self) -> Result<(), MeasureError> {
            self.log.push("inputs");
            self.alloc(100)
        }
        fn forward(&mut self) -> Result<(), MeasureError> {
            self.log.push("forward");
            self.forwards += 1;
            if self.fail_forward_after.is_some_and(|n| self.forwards > n) {
                return Err(MeasureError::OutOfMemory {
                    phase: None,
                    message: "CUDA out of memory".into(),
                });
            }
            self.alloc(400)?; // hidden activation, freed inside the pass
            self.live -= 400;
            self.alloc(100)?;
            self.output = 100;
            Ok(())
        }
        fn release_output(&mut self) {
            self.live -= self.output;
            self.output = 0;
        }
    }

    #[test]
    fn rows_follow_the_protocol() {
        let mut sim = Simulated::default();
        let mut seen = 0;
        let rows = run_protocol(&mut sim, 3, 2, |_| seen += 1).unwrap();
        let names: Vec<_> = rows
            .iter()
            .map(|r| (r.phase.name(), r.repetition, r.passes))
            .collect();
        assert_eq!(
            names,
            [
                ("model_load", None, 0),
                ("inputs", None, 0),
                ("cold_forward", None, 1),
                ("warmup", None, 3),
                ("warm_forward", Some(1), 1),
                ("warm_forward", Some(2), 1)
            ]
        );
        assert_eq!(seen, 6);
        assert_eq!(&sim.log[..5], ["sync", "read", "reset", "load", "sync"]);
        // Weights and inputs persist; each output is alive at the end reading and freed after it.
        let cold = &rows[2];
        assert_eq!(cold.figures.allocated_baseline_bytes, 1100);
        assert_eq!(cold.figures.allocated_end_bytes, 1200);
        assert_eq!(cold.figures.peak_allocated_bytes, 1500);
        assert_eq!(rows[3].figures.allocated_baseline_bytes, 1100);
        assert_eq!(rows[4].figures.allocated_baseline_bytes, 1100);
        assert!(rows
            .iter()
            .all(|r| r.figures.peak_reserved_bytes >= r.figures.reserved_end_bytes));
        assert!(rows
            .iter()
            .all(|r| r.figures.peak_allocated_bytes >= r.figures.allocated_end_bytes));
    }

    #[test]
    fn warmup_frees_each_output_before_the_next_pass() {
        let mut sim = Simulated::default();
        let rows = run_protocol(&mut sim, 5, 1, |_| {}).unwrap();
        // Two outputs alive at once would make the peak 1600.
        assert_eq!(rows[3].figures.peak_allocated_bytes, 1500);
    }

    #[test]
    fn running_out_of_device_memory_is_exit_3_naming_the_phase() {
        use crate::status::{Classify, Status};
        // Weights and inputs fit in one 2 MiB segment; the first pass's activation does not.
        let mut sim = Simulated {
            capacity: Some(2 << 20),
            ..Default::default()
        };
        sim.live = (2 << 20) - 1300; // memory already held before the measurement starts
        sim.reserved = 2 << 20;
        let mut rows = Vec::new();
        let err = run_protocol(&mut sim, 1, 1, |r| rows.push(r.phase)).unwrap_err();
        assert_eq!(rows, [Phase::ModelLoad, Phase::Inputs]);
        assert!(
            matches!(
                err,
                MeasureError::OutOfMemory {
                    phase: Some(Phase::ColdForward),
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.status(), Status::OutOfMemory);
        assert_eq!(err.status().code(), 3);
        let message = err.to_string();
        assert!(
            message.contains("during phase `cold_forward`")
                && message.contains("Tried to allocate 400 bytes")
                && !message.contains("second line"),
            "{message}"
        );
        // Another libtorch failure is not an out-of-memory one.
        let other = MeasureError::from_torch_message("CUDA error: an illegal memory access");
        assert_eq!(other.in_phase(Phase::Warmup).status(), Status::Failure);
    }

    #[test]
    fn an_error_names_its_phase() {
        let mut sim = Simulated {
            fail_forward_after: Some(2),
            ..Default::default()
        };
        let err = run_protocol(&mut sim, 3, 1, |_| {}).unwrap_err();
        assert!(err.to_string().contains("warmup"), "{err}");
    }
}
