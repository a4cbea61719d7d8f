//! The live lesson (`notebooks/allocated-vs-reserved.ipynb`, `mesure_memoire lesson`): its steps as
//! data ([`script`]), what one run recorded on a GPU ([`record`]: the readings, the allocator's
//! statistics and its map after every step, in a fresh process of the GPU companion), the same
//! steps replayed on the allocator model ([`LessonModel`]), and how a notebook shows them
//! ([`view`]: a measurement beside its prediction, or a recording made elsewhere, labelled so).
//!
//! The model covers PyTorch's default allocator settings and `expandable_segments:True`: a lesson
//! run with any other allocator setting is shown without a prediction, and says why.

pub mod record;
pub mod script;
pub mod view;

pub use record::{AllocatorSettings, LessonPrediction, LessonRecord, StepRecord, LESSON_SCHEMA};
pub use script::{LessonScript, Resolved, Step};
pub use view::{LessonView, Lessons};

use crate::allocator::workspace::{
    ComputeCapability, WorkspaceError, WorkspaceSettings, Workspaces, KNOWN_ARCHITECTURES,
};
use crate::allocator::{AddressOrder, AllocatorConfig, SegmentView};
use crate::reading::{DeviceStats, StepLog, StepReading};
use crate::replay::{NamedReplay, TensorId};
use std::collections::BTreeMap;

/// What heads a predicted log.
pub const PREDICTED: &str = "PREDICTED by the allocator model";

/// The lesson's allocator, simulated: after every step, the readings, statistics and map the
/// caching allocator would report in a fresh process under PyTorch's default settings.
#[derive(Debug)]
pub struct LessonModel {
    replay: NamedReplay,
    tensors: BTreeMap<String, TensorId>,
    workspace_bytes: u64,
    products: usize,
    /// Every predicted reading so far (the first one at the start).
    pub log: StepLog,
    /// The predicted statistics after each reading.
    pub stats: Vec<DeviceStats>,
    /// The predicted map after each reading.
    pub maps: Vec<Vec<SegmentView>>,
}

impl LessonModel {
    /// A fresh process on a GPU of compute capability `cc`, with PyTorch's default workspaces and
    /// allocator settings; an architecture the model does not know is refused.
    pub fn new(cc: ComputeCapability) -> Result<LessonModel, WorkspaceError> {
        Self::with_expandable_segments(cc, false)
    }

    /// [`new`](Self::new), with `expandable_segments:True` when `expandable`.
    pub fn with_expandable_segments(
        cc: ComputeCapability,
        expandable: bool,
    ) -> Result<LessonModel, WorkspaceError> {
        if !KNOWN_ARCHITECTURES.contains(&cc) {
            return Err(WorkspaceError::UnknownArchitecture(cc.to_string()));
        }
        let workspace_bytes = Workspaces::for_gpu(cc, &WorkspaceSettings::default())?.cublas_bytes;
        let settings = if expandable {
            "expandable segments"
        } else {
            "PyTorch's default settings"
        };
        let mut m = LessonModel {
            replay: NamedReplay::new(AllocatorConfig {
                expandable_segments: expandable,
                address_order: AddressOrder::Descending,
            }),
            tensors: BTreeMap::new(),
            workspace_bytes,
            products: 0,
            log: StepLog {
                source: Some(format!("{PREDICTED} (compute capability {cc}, {settings})")),
                steps: Vec::new(),
            },
            stats: Vec::new(),
            maps: Vec::new(),
        };
        m.record("start");
        Ok(m)
    }

    /// Records the figures after `step`.
    pub fn record(&mut self, step: &str) {
        let s = self.replay.stats();
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
        self.stats.push(self.replay.device_stats());
        self.maps.push(self.segments());
    }

    /// Allocates `bytes` for `name`; the lesson's sizes fit its GPU (a refusal allocates
    /// nothing, as in the real process, whose step would then have failed).
    fn alloc(&mut self, name: &str, bytes: u64) -> Option<TensorId> {
        self.replay.alloc(name, bytes).ok().flatten()
    }

    fn keep(&mut self, name: &str, id: Option<TensorId>) {
        if let Some(old) = self.tensors.remove(name) {
            self.replay.free(old);
        }
        if let Some(id) = id {
            self.tensors.insert(name.into(), id);
        }
    }

    /// A tensor of `bytes` bytes kept under `name` (a tensor of that name is dropped after the new
    /// one is made, as an assignment in Python or Rust does).
    pub fn allocate(&mut self, name: &str, bytes: u64) {
        let id = self.alloc(name, bytes);
        self.keep(name, id);
    }

    /// The tensor `name` dropped.
    pub fn free(&mut self, name: &str) {
        if let Some(id) = self.tensors.remove(name) {
            self.replay.free(id);
        }
    }

    /// `name = A·A` for a new n×n float32 matrix A: A, then the product's output, then (on the
    /// process's first product) cuBLAS's workspace, kept; A dropped.
    pub fn matmul(&mut self, name: &str, n: u64) {
        let bytes = n.saturating_mul(n).saturating_mul(4);
        let a = self.alloc("A", bytes);
        let c = self.alloc(name, bytes);
        if self.products == 0 {
            self.alloc("cublas_workspace", self.workspace_bytes);
        }
        self.products += 1;
        if let Some(a) = a {
            self.replay.free(a);
        }
        self.keep(name, c);
    }

    pub fn reset_peaks(&mut self) {
        self.replay.reset_peaks();
    }

    pub fn empty_cache(&mut self) {
        self.replay.empty_cache();
    }

    /// A tensor of `bytes` bytes allocated and dropped at once: its memory stays cached.
    pub fn fill_cache(&mut self, name: &str, bytes: u64) {
        if let Some(id) = self.alloc(name, bytes) {
            self.replay.free(id);
        }
    }

    /// A tensor of `bytes` bytes kept under `name`, asked for when the driver had `runtime_free`
    /// bytes free: when the new memory is larger than that, the driver refuses it and the
    /// allocator releases its cache and tries again (the caller's sizes guarantee the retry
    /// fits).
    pub fn allocate_beyond_free(&mut self, name: &str, bytes: u64, runtime_free: u64) {
        let reserved = self.replay.stats().reserved.current;
        self.replay
            .set_capacity(Some(reserved.saturating_add(runtime_free)));
        let id = self.alloc(name, bytes);
        self.replay.set_capacity(None);
        self.keep(name, id);
    }

    /// Runs `step` (with the sizes it `resolved` to, for a step sized from the free memory) and
    /// records the figures after it under `label`.
    pub fn run(
        &mut self,
        step: &Step,
        resolved: Option<&Resolved>,
        label: &str,
    ) -> Result<(), String> {
        let sized = || {
            resolved.copied().ok_or_else(|| {
                format!(
                    "`{}` is sized from the free memory of the GPU it ran on: the model needs that \
                     run's figures",
                    step.title()
                )
            })
        };
        match step {
            Step::Allocate { name, bytes } => self.allocate(name, *bytes),
            Step::Free { name } => self.free(name),
            Step::Matmul { name, n } => self.matmul(name, *n),
            Step::ResetPeaks => self.reset_peaks(),
            Step::EmptyCache => self.empty_cache(),
            Step::FillCache { name, .. } => self.fill_cache(name, sized()?.bytes),
            Step::BeyondFree { name } => {
                let r = sized()?;
                self.allocate_beyond_free(name, r.bytes, r.runtime_free)
            }
        }
        self.record(label);
        Ok(())
    }

    /// The predicted map: segments and blocks, named.
    pub fn segments(&self) -> Vec<SegmentView> {
        self.replay.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lesson's first steps as the H200 recorded them (docs/gpu-runs, notebook
    /// allocated-vs-reserved): 1 byte takes 512 in a 2 MiB segment, 1000 bytes take 1024.
    #[test]
    fn the_lesson_is_predicted() {
        let mut m = LessonModel::new(ComputeCapability::new(9, 0)).unwrap();
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
        assert_eq!(m.stats.len(), m.log.steps.len());
        assert_eq!(m.maps.len(), m.log.steps.len());
    }

    /// The lesson recorded on the H200 with expandable segments (data/): the model predicts
    /// every step's counters, statistics and map (segments and blocks, sizes and states).
    #[test]
    fn the_expandable_lesson_recorded_on_the_h200_is_predicted_step_by_step() {
        let r = LessonRecord::from_bytes(
            include_bytes!("../../data/exemple-lecon-h200-expandable.json"),
            "exemple-lecon-h200-expandable.json",
        )
        .unwrap();
        assert!(r.allocator_settings.expandable_segments);
        let m = r.model().unwrap();
        let shape = |map: &[SegmentView]| {
            let mut s: Vec<_> = map
                .iter()
                .map(|g| {
                    let blocks: Vec<_> = g.blocks.iter().map(|b| (b.size, b.allocated)).collect();
                    (g.pool, g.size, blocks)
                })
                .collect();
            s.sort();
            s
        };
        assert_eq!(m.log.steps.len(), r.steps.len());
        for (i, s) in r.steps.iter().enumerate() {
            assert!(
                record::same_figures(&s.reading, &m.log.steps[i]),
                "step {i}: {:?} against {:?}",
                s.reading,
                m.log.steps[i]
            );
            assert_eq!(s.stats, m.stats[i], "step {i}");
            assert_eq!(shape(&s.map), shape(&m.maps[i]), "step {i}");
        }
        assert_eq!(r.exact_steps(), Some((r.steps.len(), r.steps.len())));
    }

    #[test]
    fn an_unknown_architecture_is_refused_not_guessed() {
        assert!(LessonModel::new(ComputeCapability::new(6, 1)).is_err());
    }

    #[test]
    fn a_relative_step_needs_its_resolved_size() {
        let mut m = LessonModel::new(ComputeCapability::new(9, 0)).unwrap();
        let step = Step::BeyondFree { name: "m".into() };
        assert!(m.run(&step, None, "m").is_err());
        assert_eq!(m.log.steps.len(), 1, "nothing recorded");
    }
}
