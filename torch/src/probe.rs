//! The live lesson on a GPU, in this process: each step of a [`LessonScript`] run through
//! libtorch, and after it the caching allocator's counters, its statistics and its map (its own
//! snapshot, every live block named after the lesson's tensor it holds), recorded into a
//! [`LessonRecord`]. The companion program runs it (`mesure_memoire lesson`), one fresh process per
//! lesson, so that no other allocator state reaches the figures; the notebook shows the record.

use crate::{torch_err, Allocator};
use iteragpu_lab::allocator::snapshot::UNKNOWN;
use iteragpu_lab::allocator::SegmentView;
use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::lesson::{LessonRecord, LessonScript, Resolved, Step, StepRecord};
use iteragpu_lab::measure::MeasureError;
use iteragpu_lab::reading::StepReading;
use std::collections::{BTreeMap, HashMap};
use tch::{Kind, Tensor};

/// The lesson's tensors on one GPU, and the allocator they come from.
pub struct Probe {
    gpu: Allocator,
    tensors: BTreeMap<String, Tensor>,
    /// Blocks no tensor of the probe holds, named when they appear (cuBLAS's workspace).
    others: HashMap<u64, String>,
    /// Whether any map so far held an expandable segment (the snapshot says so per segment).
    expandable_seen: bool,
}

impl Probe {
    /// Opens `device` (CUDA starts in this process); no GPU is an error (exit 2).
    pub fn open(device: CudaDevice) -> Result<Probe, MeasureError> {
        Ok(Probe {
            gpu: Allocator::open(device)?,
            tensors: BTreeMap::new(),
            others: HashMap::new(),
            expandable_seen: false,
        })
    }

    /// A new uninitialised uint8 tensor of `bytes` bytes (`torch.empty`).
    fn empty(&self, bytes: u64) -> Result<Tensor, MeasureError> {
        let n = i64::try_from(bytes).map_err(|_| MeasureError::Torch {
            phase: None,
            message: format!("{bytes} bytes is more than a tensor can hold"),
        })?;
        Tensor::f_empty([n], (Kind::Uint8, self.gpu.device())).map_err(torch_err)
    }

    /// Runs `step`; returns what a step sized from the free memory asked for.
    pub fn run(&mut self, step: &Step) -> Result<Option<Resolved>, MeasureError> {
        let resolved = if step.is_relative() {
            self.gpu.synchronize()?;
            let s = self.gpu.stats()?;
            let (free, _) = self.gpu.runtime_free_total()?;
            let releasable = s
                .reserved_current
                .saturating_sub(s.allocated_current)
                .saturating_sub(s.inactive_split_bytes_current);
            step.resolve(free.0, releasable)
        } else {
            None
        };
        let sized = resolved.map_or(0, |r| r.bytes);
        match step {
            Step::Allocate { name, bytes } => {
                let t = self.empty(*bytes)?;
                self.tensors.insert(name.clone(), t);
            }
            Step::Free { name } => {
                self.tensors.remove(name);
            }
            Step::Matmul { name, n } => {
                let n = i64::try_from(*n).map_err(|_| MeasureError::Torch {
                    phase: None,
                    message: format!("{n}×{n} is too large"),
                })?;
                let a =
                    Tensor::f_ones([n, n], (Kind::Float, self.gpu.device())).map_err(torch_err)?;
                let c = a.f_matmul(&a).map_err(torch_err)?;
                drop(a);
                self.tensors.insert(name.clone(), c);
                // What the product left that no tensor holds: cuBLAS's workspace, kept for the
                // life of the process (made by the first product only).
                for b in self.segments()?.0.iter().flat_map(|s| &s.blocks) {
                    if b.label.as_deref() == Some(UNKNOWN) {
                        self.others.insert(b.address, "cublas_workspace".into());
                    }
                }
            }
            Step::ResetPeaks => self.gpu.reset_peaks()?,
            Step::EmptyCache => self.gpu.empty_cache()?,
            Step::FillCache { .. } => drop(self.empty(sized)?),
            Step::BeyondFree { name } => {
                let t = self.empty(sized)?;
                self.tensors.insert(name.clone(), t);
            }
        }
        Ok(resolved)
    }

    /// The allocator's own map now, each live block named after the probe's tensor it holds, and
    /// whether it holds an expandable segment.
    fn segments(&self) -> Result<(Vec<SegmentView>, bool), MeasureError> {
        let mut names = self.others.clone();
        for (name, t) in &self.tensors {
            names.insert(t.data_ptr() as u64, name.clone());
        }
        crate::blocks::read_map(self.gpu.index(), &names)
    }

    /// The figures now (after the queued work), recorded for `step` under `label`.
    pub fn observe(
        &mut self,
        step: Option<Step>,
        resolved: Option<Resolved>,
        label: String,
    ) -> Result<StepRecord, MeasureError> {
        self.gpu.synchronize()?;
        let s = self.gpu.stats()?;
        let (free, total) = self.gpu.runtime_free_total()?;
        let (map, expandable) = self.segments()?;
        self.expandable_seen |= expandable;
        Ok(StepRecord {
            step,
            resolved,
            reading: StepReading {
                step: label,
                allocated: s.allocated_current,
                reserved: s.reserved_current,
                peak_allocated: s.allocated_peak,
                peak_reserved: s.reserved_peak,
                requested: s.requested_current,
                segments: s.segments_current,
                runtime_used: Some(total.0.saturating_sub(free.0)),
            },
            stats: s.device_stats(),
            map,
        })
    }
}

/// Names the step in a libtorch error, keeping its kind (out of memory: exit 3).
fn in_step(e: MeasureError, label: &str) -> MeasureError {
    match e {
        MeasureError::OutOfMemory { phase, message } => MeasureError::OutOfMemory {
            phase,
            message: format!("step `{label}`: {message}"),
        },
        MeasureError::Torch { phase, message } => MeasureError::Torch {
            phase,
            message: format!("step `{label}`: {message}"),
        },
        other => other,
    }
}

/// Runs `script` on `device` in this process and records the starting point and every step, with
/// the environment (reported before the first step), `configuration` (`PYTORCH_CUDA_ALLOC_CONF` as
/// this process saw it) and the settings the allocator reports (after the last step, checked
/// against the expandable segments its maps held).
pub fn lesson(
    device: CudaDevice,
    script: &LessonScript,
    configuration: Option<String>,
) -> Result<LessonRecord, MeasureError> {
    let mut probe = Probe::open(device)?;
    let environment = crate::environment(Some(device));
    let mut steps = vec![probe.observe(None, None, "start".into())?];
    for step in &script.steps {
        let resolved = probe.run(step).map_err(|e| in_step(e, &step.title()))?;
        let label = step.label(resolved.as_ref());
        steps.push(
            probe
                .observe(Some(step.clone()), resolved, label.clone())
                .map_err(|e| in_step(e, &label))?,
        );
    }
    // Read once every step has run (the allocator is configured by then), and checked against
    // what it did: a record never claims a setting its segments contradict.
    let settings = probe.gpu.settings()?;
    if probe.expandable_seen != settings.expandable_segments {
        return Err(MeasureError::Torch {
            phase: None,
            message: format!(
                "the allocator reports expandable segments {} but its map {} expandable segments: \
                 no record",
                if settings.expandable_segments {
                    "on"
                } else {
                    "off"
                },
                if probe.expandable_seen {
                    "holds"
                } else {
                    "holds no"
                }
            ),
        });
    }
    Ok(LessonRecord::new(
        environment,
        configuration,
        settings,
        steps,
    ))
}
