//! A live look at the caching allocator: allocate and free tensors on a GPU step by step and
//! record, after each step, what the allocator and the CUDA runtime report. Without a GPU every
//! step is skipped and the display says why: no figure is ever made up.

use super::{tch, torch_err, Allocator};
use crate::device::CudaDevice;
use crate::display::{table, Html, Svg};
use crate::measure::MeasureError;
use std::collections::BTreeMap;
use tch::{Kind, Tensor};

/// Readings after one step, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub step: String,
    pub allocated: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Bytes the code asked for, before the allocator's rounding.
    pub requested: u64,
    /// Device memory segments the allocator holds.
    pub segments: u64,
    /// Device memory in use on the whole GPU, from `cudaMemGetInfo` (total − free): what
    /// `nvidia-smi` shows, all processes included.
    pub runtime_used: u64,
}

pub struct Probe {
    gpu: Result<Allocator, MeasureError>,
    tensors: BTreeMap<String, Tensor>,
    pub snapshots: Vec<Snapshot>,
    /// The last step's error, if one failed.
    pub error: Option<String>,
}

impl Probe {
    /// Opens `device` and records the starting point.
    pub fn open(device: CudaDevice) -> Probe {
        let mut p = Probe {
            gpu: Allocator::open(device),
            tensors: BTreeMap::new(),
            snapshots: Vec::new(),
            error: None,
        };
        p.record("start");
        p
    }

    /// Records the current readings under `step`.
    pub fn record(&mut self, step: &str) -> &mut Self {
        let Ok(gpu) = &self.gpu else { return self };
        let reading = gpu
            .synchronize()
            .and_then(|()| Ok((gpu.stats()?, gpu.runtime_free_total()?)));
        match reading {
            Ok((s, (free, total))) => self.snapshots.push(Snapshot {
                step: step.into(),
                allocated: s.allocated_current as u64,
                reserved: s.reserved_current as u64,
                peak_allocated: s.allocated_peak as u64,
                peak_reserved: s.reserved_peak as u64,
                requested: s.requested_current as u64,
                segments: s.segments_current as u64,
                runtime_used: total.0 - free.0,
            }),
            Err(e) => self.error = Some(e.to_string()),
        }
        self
    }

    fn step(
        &mut self,
        label: String,
        work: impl FnOnce(&mut Self) -> Result<(), MeasureError>,
    ) -> &mut Self {
        if self.gpu.is_err() {
            return self;
        }
        match work(self) {
            Ok(()) => self.record(&label),
            Err(e) => {
                self.error = Some(format!("{label}: {e}"));
                self
            }
        }
    }

    /// Keeps a new tensor of `bytes` bytes (uninitialised uint8) on the GPU under `name`.
    pub fn allocate(&mut self, name: &str, bytes: u64) -> &mut Self {
        self.step(format!("allocate {name} ({bytes} B)"), |p| {
            let device = p.gpu.as_ref().expect("live").device();
            let t = Tensor::f_empty([bytes as i64], (Kind::Uint8, device)).map_err(torch_err)?;
            p.tensors.insert(name.into(), t);
            Ok(())
        })
    }

    /// Drops the tensor `name`: its block goes back to the allocator's cache, not to the driver.
    pub fn free(&mut self, name: &str) -> &mut Self {
        self.step(format!("free {name}"), |p| {
            p.tensors.remove(name);
            Ok(())
        })
    }

    /// Multiplies two new n×n float32 matrices, keeping the product as `name`; the first matrix
    /// product of a process also makes cuBLAS allocate its workspace through the allocator.
    pub fn matmul(&mut self, name: &str, n: i64) -> &mut Self {
        self.step(format!("{name} = A·B, {n}×{n} float32"), |p| {
            let device = p.gpu.as_ref().expect("live").device();
            let a = Tensor::f_ones([n, n], (Kind::Float, device)).map_err(torch_err)?;
            let c = a.f_matmul(&a).map_err(torch_err)?;
            drop(a);
            p.tensors.insert(name.into(), c);
            Ok(())
        })
    }

    pub fn reset_peaks(&mut self) -> &mut Self {
        self.step("reset peaks".into(), |p| {
            p.gpu.as_ref().expect("live").reset_peaks()
        })
    }

    /// Returns cached blocks that hold no tensor to the driver (`torch.cuda.empty_cache`).
    pub fn empty_cache(&mut self) -> &mut Self {
        self.step("empty cache".into(), |p| {
            p.gpu.as_ref().expect("live").empty_cache()
        })
    }

    fn unavailable(&self) -> Option<Html> {
        match &self.gpu {
            Err(e) => Some(Html(format!(
                "<p><b>No GPU: nothing measured.</b> {}</p>",
                html_escape::encode_text(&e.to_string())
            ))),
            Ok(_) => None,
        }
    }

    /// The last `n` steps, with changes from the step before each.
    pub fn last(&self, n: usize) -> Html {
        if let Some(h) = self.unavailable() {
            return h;
        }
        let start = self.snapshots.len().saturating_sub(n);
        let delta = |now: u64, before: Option<u64>| match before {
            Some(b) => format!("{:+}", now as i128 - b as i128),
            None => String::new(),
        };
        let rows: Vec<Vec<String>> = (start..self.snapshots.len())
            .map(|i| {
                let s = &self.snapshots[i];
                let prev = i.checked_sub(1).map(|j| &self.snapshots[j]);
                vec![
                    format!("{}. {}", i + 1, s.step),
                    s.requested.to_string(),
                    s.allocated.to_string(),
                    delta(s.allocated, prev.map(|p| p.allocated)),
                    s.reserved.to_string(),
                    delta(s.reserved, prev.map(|p| p.reserved)),
                    s.peak_allocated.to_string(),
                    s.peak_reserved.to_string(),
                    s.segments.to_string(),
                    s.runtime_used.to_string(),
                    (s.runtime_used as i128 - s.reserved as i128).to_string(),
                ]
            })
            .collect();
        let mut h = table(
            "Caching allocator, bytes",
            &[
                "step",
                "requested",
                "allocated",
                "Δ allocated",
                "reserved",
                "Δ reserved",
                "peak allocated",
                "peak reserved",
                "segments",
                "GPU used (runtime)",
                "GPU used − reserved",
            ],
            &rows,
        );
        if let Some(e) = &self.error {
            h.0 += &Html::note(&format!("Last step failed: {e}")).0;
        }
        h
    }

    pub fn html(&self) -> Html {
        self.last(self.snapshots.len())
    }

    pub fn evcxr_display(&self) {
        self.html().evcxr_display()
    }

    /// Allocated, reserved and GPU-used over the steps, as inline SVG (or the reason there is none).
    pub fn chart(&self) -> Html {
        if let Some(h) = self.unavailable() {
            return h;
        }
        let steps: Vec<String> = self.snapshots.iter().map(|s| s.step.clone()).collect();
        let series = |f: fn(&Snapshot) -> u64| self.snapshots.iter().map(f).collect::<Vec<u64>>();
        let Svg(svg) = crate::plot::timeline_chart(
            "Allocator and runtime over the steps (MiB)",
            &steps,
            &[
                ("allocated", series(|s| s.allocated)),
                ("reserved", series(|s| s.reserved)),
                ("GPU used (runtime)", series(|s| s.runtime_used)),
            ],
        );
        Html(svg)
    }
}
