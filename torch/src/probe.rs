//! A live look at the caching allocator: allocate and free tensors on a GPU step by step and
//! record, after each step, what the allocator and the CUDA runtime report, into a
//! [`StepLog`] that the library draws. Every step also runs on the allocator model
//! ([`LessonModel`]): on a GPU its prediction is shown beside the measurement; without a GPU it is
//! shown alone, labelled as a prediction, and no figure is ever presented as measured.

use crate::{torch_err, Allocator};
use iteragpu_lab::allocator::lesson::{LessonModel, PREDICTED};
use iteragpu_lab::allocator::simulator::SegmentView;
use iteragpu_lab::allocator::snapshot::{self, UNKNOWN};
use iteragpu_lab::allocator::ComputeCapability;
use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::markup::Html;
use iteragpu_lab::measure::{MeasureError, StepLog, StepReading};
use std::collections::{BTreeMap, HashMap};
use tch::{Kind, Tensor};

pub struct Probe {
    gpu: Option<Allocator>,
    tensors: BTreeMap<String, Tensor>,
    /// Blocks no tensor of the probe holds, named when they appear (cuBLAS's workspace).
    others: HashMap<u64, String>,
    /// Every reading so far, or why there is none.
    pub log: StepLog,
    /// The same steps on the allocator model.
    pub model: LessonModel,
}

impl Probe {
    /// Opens `device` and records the starting point.
    pub fn open(device: CudaDevice) -> Probe {
        let (gpu, unavailable) = match Allocator::open(device) {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(e.to_string())),
        };
        // The model takes the GPU's architecture, or the H200's where there is no GPU.
        let cc = gpu
            .as_ref()
            .and_then(|g| crate::ffi::device_properties(g.index()).ok())
            .map_or(ComputeCapability::new(9, 0), |p| {
                ComputeCapability::new(p.major as u32, p.minor as u32)
            });
        let mut p = Probe {
            gpu,
            tensors: BTreeMap::new(),
            others: HashMap::new(),
            log: StepLog {
                unavailable,
                ..Default::default()
            },
            model: LessonModel::new(cc),
        };
        p.record("start");
        p
    }

    /// Records the current readings under `step`.
    pub fn record(&mut self, step: &str) -> &mut Self {
        let Some(gpu) = &self.gpu else { return self };
        let reading = gpu
            .synchronize()
            .and_then(|()| Ok((gpu.stats()?, gpu.runtime_free_total()?)));
        match reading {
            Ok((s, (free, total))) => self.log.steps.push(StepReading {
                step: step.into(),
                allocated: s.allocated_current,
                reserved: s.reserved_current,
                peak_allocated: s.allocated_peak,
                peak_reserved: s.reserved_peak,
                requested: s.requested_current,
                segments: s.segments_current,
                runtime_used: Some(total.0.saturating_sub(free.0)),
            }),
            Err(e) => self.log.error = Some(e.to_string()),
        }
        self
    }

    /// Runs one step on the model (always) and on the GPU (when there is one), recording both.
    fn step(
        &mut self,
        label: String,
        model: impl FnOnce(&mut LessonModel),
        work: impl FnOnce(&mut Self) -> Result<(), MeasureError>,
    ) -> &mut Self {
        model(&mut self.model);
        self.model.record(&label);
        if self.gpu.is_none() {
            return self;
        }
        match work(self) {
            Ok(()) => self.record(&label),
            Err(e) => {
                self.log.error = Some(format!("{label}: {e}"));
                self
            }
        }
    }

    fn device(&self) -> tch::Device {
        self.gpu
            .as_ref()
            .expect("steps run only with a GPU")
            .device()
    }

    /// Keeps a new tensor of `bytes` bytes (uninitialised uint8) on the GPU under `name`.
    pub fn allocate(&mut self, name: &str, bytes: u64) -> &mut Self {
        self.step(
            format!("allocate {name} ({bytes} B)"),
            |m| m.allocate(name, bytes),
            |p| {
                let t = Tensor::f_empty([bytes as i64], (Kind::Uint8, p.device()))
                    .map_err(torch_err)?;
                p.tensors.insert(name.into(), t);
                Ok(())
            },
        )
    }

    /// Drops the tensor `name`: its block goes back to the allocator's cache, not to the driver.
    pub fn free(&mut self, name: &str) -> &mut Self {
        self.step(
            format!("free {name}"),
            |m| m.free(name),
            |p| {
                p.tensors.remove(name);
                Ok(())
            },
        )
    }

    /// Squares a new n×n float32 matrix A (A·A), keeping the product as `name`; the first matrix
    /// product of a process also makes cuBLAS allocate its workspace through the allocator.
    pub fn matmul(&mut self, name: &str, n: i64) -> &mut Self {
        self.step(
            format!("{name} = A·A, {n}×{n} float32"),
            |m| m.matmul(name, n as u64),
            |p| {
                let a = Tensor::f_ones([n, n], (Kind::Float, p.device())).map_err(torch_err)?;
                let c = a.f_matmul(&a).map_err(torch_err)?;
                drop(a);
                p.tensors.insert(name.into(), c);
                // What the product left that no tensor holds: cuBLAS's workspace, kept for the life
                // of the process (on the first product only).
                for b in p.segments()?.iter().flat_map(|s| &s.blocks) {
                    if b.label.as_deref() == Some(UNKNOWN) {
                        p.others.insert(b.address, "cublas_workspace".into());
                    }
                }
                Ok(())
            },
        )
    }

    pub fn reset_peaks(&mut self) -> &mut Self {
        self.step("reset peaks".into(), LessonModel::reset_peaks, |p| {
            p.gpu.as_ref().expect("live").reset_peaks()
        })
    }

    /// Returns cached blocks that hold no tensor to the driver (`torch.cuda.empty_cache`).
    pub fn empty_cache(&mut self) -> &mut Self {
        self.step("empty cache".into(), LessonModel::empty_cache, |p| {
            p.gpu.as_ref().expect("live").empty_cache()
        })
    }

    /// The allocator's own map now, each block named after the probe's tensor it holds.
    fn segments(&self) -> Result<Vec<SegmentView>, MeasureError> {
        let gpu = self.gpu.as_ref().expect("steps run only with a GPU");
        let mut names = self.others.clone();
        for (name, t) in &self.tensors {
            names.insert(t.data_ptr() as u64, name.clone());
        }
        let text = crate::ffi::snapshot(gpu.index()).map_err(crate::shim_err)?;
        snapshot::parse(&text, &names).map_err(|e| MeasureError::from_torch_message(&e))
    }

    /// The allocator's map after the last step, drawn: one bar per segment, its blocks named
    /// (live, cached, or free inside a split segment), with the inactive-split bytes and the
    /// segments the allocator counts. Without a GPU, why there is none.
    pub fn map(&self) -> Html {
        let step = self.log.steps.last().map_or("start", |s| s.step.as_str());
        let predicted = iteragpu_lab::plot::segment_map(
            &format!("{PREDICTED}: the map after the same step"),
            &self.model.segments(),
        )
        .html();
        if self.gpu.is_none() {
            return self.log.last(0).then(predicted);
        }
        match self.segments() {
            Ok(segments) => {
                let split: u64 = segments
                    .iter()
                    .flat_map(|s| &s.blocks)
                    .filter(|b| b.inactive_split)
                    .map(|b| b.size)
                    .sum();
                iteragpu_lab::plot::segment_map(
                    &format!("The allocator's map after: {step}"),
                    &segments,
                )
                .with_caption(&format!(
                    "{} segment(s); {} bytes free inside segments that also hold live blocks \
                         (inactive split: empty_cache cannot return them)",
                    segments.len(),
                    split
                ))
                .then(predicted)
            }
            Err(e) => Html::note(&format!(
                "{} {e}",
                iteragpu_lab::markup::labels::LAST_STEP_FAILED
            )),
        }
    }

    /// The last `n` steps, measured (or why not), then predicted.
    pub fn last(&self, n: usize) -> Html {
        self.log.last(n).then(self.model.log.last(n))
    }

    pub fn html(&self) -> Html {
        self.last(self.model.log.steps.len())
    }

    pub fn evcxr_display(&self) {
        self.html().evcxr_display()
    }

    /// The chart of every step: measured on a GPU, else predicted (each says which).
    pub fn chart(&self) -> Html {
        if self.gpu.is_some() {
            self.log.chart()
        } else {
            self.log.last(0).then(self.model.log.chart())
        }
    }
}
