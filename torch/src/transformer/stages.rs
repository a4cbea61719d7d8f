//! The stage protocol: synchronise, read `allocated`, reset the peaks, run the stage, synchronise,
//! read the end and the stage's own peaks. A failure inside a stage is named after it.

use crate::blocks::BlockRecorder;
use crate::{torch_err, Allocator};
use iteragpu_lab::budget::{BenchMode, StageReading};
use iteragpu_lab::measure::MeasureError;
use std::time::Instant;
use tch::{TchError, Tensor};

/// The readings of the stages run so far.
pub struct Stages<'a> {
    allocator: &'a Allocator,
    readings: Vec<StageReading>,
    /// With block maps: names the tensors made so far and reads the map.
    recorder: Option<BlockRecorder>,
}

impl<'a> Stages<'a> {
    /// Stages read from `allocator`; with `blocks`, the stages that only make named tensors
    /// (weights, KV cache, adapters, optimizer states) also read the block map at their end.
    pub fn new(allocator: &'a Allocator, blocks: bool) -> Stages<'a> {
        Stages {
            allocator,
            readings: Vec::new(),
            recorder: blocks.then(|| BlockRecorder::new(allocator.index())),
        }
    }

    /// When maps are recorded: names the blocks of the tensors the last stage made, then reads
    /// the block map into its reading (a host-side read: nothing is allocated on the device
    /// between the stage's end and this). Without maps, `named` is never consumed.
    pub fn map_named<'t>(
        &mut self,
        named: impl IntoIterator<Item = (&'t Tensor, String)>,
    ) -> Result<(), MeasureError> {
        let Some(recorder) = &mut self.recorder else {
            return Ok(());
        };
        for (tensor, name) in named {
            recorder.name(tensor, &name);
        }
        let map = recorder.map()?;
        if let Some(last) = self.readings.last_mut() {
            last.blocks = Some(map);
        }
        Ok(())
    }

    /// Runs `body` as the stage `stage` and records its reading; what `body` returns stays alive
    /// at the end reading (it is the stage's result).
    pub fn measure<T>(
        &mut self,
        stage: &str,
        body: impl FnOnce() -> Result<T, TchError>,
    ) -> Result<T, MeasureError> {
        let named = |e: MeasureError| e.in_stage(stage);
        let allocator = self.allocator;
        allocator.synchronize().map_err(named)?;
        let before = allocator.reading().map_err(named)?;
        allocator.reset_peaks().map_err(named)?;
        let start = Instant::now();
        let value = body().map_err(|e| named(torch_err(e)))?;
        allocator.synchronize().map_err(named)?;
        let host_ms = start.elapsed().as_secs_f64() * 1e3;
        let after = allocator.reading().map_err(named)?;
        self.readings.push(StageReading {
            stage: stage.into(),
            allocated_before: before.allocated,
            allocated_after: after.allocated,
            reserved_after: after.reserved,
            peak_allocated: after.peak_allocated,
            peak_reserved: after.peak_reserved,
            host_ms,
            blocks: None,
        });
        Ok(value)
    }

    /// The readings, checked to be exactly the stages `mode` records, in order.
    pub fn finish(self, mode: BenchMode) -> Result<Vec<StageReading>, MeasureError> {
        let names: Vec<&str> = self.readings.iter().map(|r| r.stage.as_str()).collect();
        if names != mode.stages() {
            return Err(MeasureError::Torch {
                phase: None,
                message: format!(
                    "internal error: mode {mode} recorded the stages {names:?}, not {:?}",
                    mode.stages()
                ),
            });
        }
        Ok(self.readings)
    }
}
