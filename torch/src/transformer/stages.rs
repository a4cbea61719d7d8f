//! The stage protocol: synchronise, read `allocated`, reset the peaks, run the stage, synchronise,
//! read the end and the stage's own peaks. A failure inside a stage is named after it.

use crate::{torch_err, Allocator};
use iteragpu_lab::budget::{BenchMode, StageReading};
use iteragpu_lab::measure::MeasureError;
use std::collections::HashMap;
use std::time::Instant;
use tch::{TchError, Tensor};

/// The readings of the stages run so far.
pub struct Stages<'a> {
    allocator: &'a Allocator,
    readings: Vec<StageReading>,
    /// With block maps: the names of the tensors made so far, by address.
    names: Option<HashMap<u64, String>>,
}

impl<'a> Stages<'a> {
    /// Stages read from `allocator`; with `blocks`, the stages that only make named tensors
    /// (weights, KV cache, adapters, optimizer states) also read the block map at their end.
    pub fn new(allocator: &'a Allocator, blocks: bool) -> Stages<'a> {
        Stages {
            allocator,
            readings: Vec::new(),
            names: blocks.then(HashMap::new),
        }
    }

    /// Names the block that holds `tensor` in the maps (when maps are recorded).
    pub fn name(&mut self, tensor: &Tensor, name: String) {
        if let Some(names) = &mut self.names {
            names.insert(tensor.data_ptr() as u64, name);
        }
    }

    /// Reads the block map into the last stage's reading, once the tensors it made are named (a
    /// host-side read: nothing is allocated on the device between the stage's end and this).
    pub fn map_last(&mut self) -> Result<(), MeasureError> {
        let Some(names) = &self.names else {
            return Ok(());
        };
        let (map, _) = crate::blocks::read_map(self.allocator.index(), names)?;
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
