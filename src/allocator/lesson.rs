//! The live lesson (`allocated-vs-reserved.ipynb`) replayed on the allocator model: the same steps
//! (allocate, free, a matrix product, reset the peaks, empty the cache) give the figures the
//! caching allocator would report, without a GPU. The notebook shows them beside the measured ones
//! on a GPU, and alone, labelled as a prediction, where there is none.

use super::simulator::{BlockId, CachingAllocator, SegmentView};
use super::workspace::{ComputeCapability, WorkspaceSettings, Workspaces};
use crate::measure::{StepLog, StepReading};
use std::collections::BTreeMap;

/// What heads a predicted log.
pub const PREDICTED: &str = "PREDICTED by the allocator model";

/// The lesson's allocator, simulated.
pub struct LessonModel {
    allocator: CachingAllocator,
    tensors: BTreeMap<String, BlockId>,
    workspace_bytes: u64,
    products: usize,
    /// Every predicted reading so far.
    pub log: StepLog,
}

impl LessonModel {
    /// A fresh process on a GPU of compute capability `cc`, with PyTorch's default workspaces.
    pub fn new(cc: ComputeCapability) -> LessonModel {
        let workspace_bytes =
            Workspaces::for_gpu(cc, &WorkspaceSettings::default()).map_or(0, |w| w.cublas_bytes);
        let mut m = LessonModel {
            allocator: CachingAllocator::with_address_order(
                super::simulator::AddressOrder::Descending,
            ),
            tensors: BTreeMap::new(),
            workspace_bytes,
            products: 0,
            log: StepLog {
                source: Some(format!("{PREDICTED} (compute capability {cc})")),
                ..Default::default()
            },
        };
        m.record("start");
        m
    }

    /// Records the figures after `step`.
    pub fn record(&mut self, step: &str) {
        let s = self.allocator.stats();
        self.log.steps.push(StepReading {
            step: step.into(),
            allocated: s.allocated.current,
            reserved: s.reserved.current,
            peak_allocated: s.allocated.peak,
            peak_reserved: s.reserved.peak,
            requested: s.requested.current,
            segments: s.segments.current,
            runtime_used: None,
        });
    }

    fn keep(&mut self, name: &str, bytes: u64) {
        if let Some(old) = self.tensors.remove(name) {
            self.allocator.free(old);
        }
        if let Some(id) = self.allocator.malloc(bytes, 0, name) {
            self.tensors.insert(name.into(), id);
        }
    }

    /// A tensor of `bytes` bytes kept under `name`.
    pub fn allocate(&mut self, name: &str, bytes: u64) {
        self.keep(name, bytes);
    }

    /// The tensor `name` dropped.
    pub fn free(&mut self, name: &str) {
        if let Some(id) = self.tensors.remove(name) {
            self.allocator.free(id);
        }
    }

    /// `name = A·A` for a new n×n float32 matrix A: A, then the product's output, then (on the
    /// process's first product) cuBLAS's workspace, kept; A dropped.
    pub fn matmul(&mut self, name: &str, n: u64) {
        let bytes = n.saturating_mul(n).saturating_mul(4);
        let a = self.allocator.malloc(bytes, 0, "A");
        let c = self.allocator.malloc(bytes, 0, name);
        if self.products == 0 {
            self.allocator
                .malloc(self.workspace_bytes, 0, "cublas_workspace");
        }
        self.products += 1;
        if let Some(a) = a {
            self.allocator.free(a);
        }
        if let Some(old) = self.tensors.remove(name) {
            self.allocator.free(old);
        }
        if let Some(c) = c {
            self.tensors.insert(name.into(), c);
        }
    }

    pub fn reset_peaks(&mut self) {
        self.allocator.reset_peaks();
    }

    pub fn empty_cache(&mut self) {
        self.allocator.empty_cache();
    }

    /// The predicted map: segments and blocks, named.
    pub fn segments(&self) -> Vec<SegmentView> {
        self.allocator.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lesson's first steps as the H200 recorded them (docs/gpu-runs, notebook
    /// allocated-vs-reserved): 1 byte takes 512 in a 2 MiB segment, 1000 bytes take 1024.
    #[test]
    fn the_lesson_is_predicted() {
        let mut m = LessonModel::new(ComputeCapability::new(9, 0));
        m.allocate("a", 1);
        m.record("a");
        m.allocate("b", 1000);
        m.record("b");
        let s = &m.log.steps;
        assert_eq!(
            (s[1].allocated, s[1].reserved, s[1].requested),
            (512, 2 << 20, 1)
        );
        assert_eq!(s[2].allocated, 512 + 1024);
        m.allocate("big", 100 << 20);
        m.free("big");
        m.allocate("reuse", 60 << 20);
        m.record("reuse");
        let last = m.log.steps.last().unwrap().clone();
        assert_eq!(
            last.reserved,
            (2 << 20) + (100 << 20),
            "the 60 MiB reuse the freed 100 MiB"
        );
        m.matmul("C", 1024);
        m.record("C");
        let c = m.log.steps.last().unwrap();
        assert_eq!(c.allocated - last.allocated, (4 << 20) + 33_554_432);
        assert!(m
            .segments()
            .iter()
            .flat_map(|s| &s.blocks)
            .any(|b| b.label.as_deref() == Some("cublas_workspace")));
    }
}
