//! The allocator's block map during a measurement (`measure --blocks`): every tensor the protocol
//! makes is named by its address when it is made, the workspaces by the blocks that appear inside
//! the first Linear of the process, and the map is read through the shim's `snapshot()` at the
//! end reading and after each operation of a pass, keeping the one where `allocated` was highest.
//! Reading the map is host-side bookkeeping: it allocates nothing on the device (the GPU proof
//! compares the figures with and without `--blocks`), but it adds host time to the spans.

use crate::{ffi, shim_err};
use iteragpu_lab::allocator::snapshot::{self, UNKNOWN};
use iteragpu_lab::allocator::SegmentView;
use iteragpu_lab::measure::{MeasureError, PhaseBlocks};
use std::collections::HashMap;
use tch::Tensor;

/// The allocator's block map now, each block whose address `names` knows named after it, and
/// whether any segment is an expandable one.
pub fn read_map(
    device: u32,
    names: &HashMap<u64, String>,
) -> Result<(Vec<SegmentView>, bool), MeasureError> {
    let text = ffi::snapshot(device).map_err(shim_err)?;
    snapshot::parse(&text, names).map_err(|e| MeasureError::from_torch_message(&e))
}

pub struct BlockRecorder {
    device: u32,
    names: HashMap<u64, String>,
    /// The map where `allocated` was highest since the last reset, with that figure.
    peak: Option<(u64, Vec<SegmentView>)>,
    workspaces_named: bool,
}

impl BlockRecorder {
    pub fn new(device: u32) -> BlockRecorder {
        BlockRecorder {
            device,
            names: HashMap::new(),
            peak: None,
            workspaces_named: false,
        }
    }

    /// Names the block that holds `tensor`.
    pub fn name(&mut self, tensor: &Tensor, name: &str) {
        self.names.insert(tensor.data_ptr() as u64, name.into());
    }

    /// Forgets the name of `tensor`'s block, before the tensor is freed.
    pub fn forget(&mut self, tensor: &Tensor) {
        self.names.remove(&(tensor.data_ptr() as u64));
    }

    /// The allocator's block map now, each block this recorder knows named.
    pub fn map(&self) -> Result<Vec<SegmentView>, MeasureError> {
        read_map(self.device, &self.names).map(|(map, _)| map)
    }

    /// Reads the map and keeps it if `allocated` is higher than at any reading since the reset.
    pub fn observe(&mut self) -> Result<(), MeasureError> {
        let map = self.map()?;
        let allocated = snapshot::allocated_bytes(&map);
        if self.peak.as_ref().is_none_or(|(top, _)| allocated > *top) {
            self.peak = Some((allocated, map));
        }
        Ok(())
    }

    /// Starts a new phase: the peak map starts from the map as it stands.
    pub fn reset(&mut self) -> Result<(), MeasureError> {
        self.peak = None;
        self.observe()
    }

    /// Right after the first Linear of the process: the allocated blocks no tensor accounts for
    /// are the workspaces it made, the cuBLAS one first by size (PyTorch caps the cuBLASLt
    /// workspace at the cuBLAS one's size), then the cuBLASLt one. Anything else stays `unknown`.
    pub fn name_workspaces(&mut self) -> Result<(), MeasureError> {
        if self.workspaces_named {
            return Ok(());
        }
        self.workspaces_named = true;
        let mut unknown: Vec<(u64, u64)> = self
            .map()?
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.label.as_deref() == Some(UNKNOWN))
            .map(|b| (b.size, b.address))
            .collect();
        unknown.sort_by(|a, b| b.cmp(a));
        for ((_, address), name) in unknown
            .into_iter()
            .zip(["cublas_workspace", "cublaslt_workspace"])
        {
            self.names.insert(address, name.into());
        }
        Ok(())
    }

    /// The phase's maps: at the end reading, and where `allocated` peaked; and the allocator's
    /// statistics at the end.
    pub fn phase(&mut self) -> Result<PhaseBlocks, MeasureError> {
        self.observe()?;
        let at_end = self.map()?;
        let at_peak = self.peak.take().map_or_else(|| at_end.clone(), |(_, m)| m);
        let s = ffi::memory_stats(self.device).map_err(shim_err)?;
        Ok(PhaseBlocks {
            at_end,
            at_peak,
            stats_at_end: Some(s.device_stats()),
        })
    }
}
