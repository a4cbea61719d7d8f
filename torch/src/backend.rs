//! The protocol's backend on a CUDA device: the synthetic `Linear -> GELU -> Linear` network built
//! as PyTorch's `nn.Linear` builds it, its input, and one forward pass at a time.

use crate::blocks::BlockRecorder;
use crate::{ffi, shim_err, torch_err, Allocator};
use iteragpu_lab::measure::{Backend, Dtype, MeasureConfig, MeasureError, PhaseBlocks};
use iteragpu_lab::reading::AllocatorReading;
use tch::{Device, Kind, Tensor};

/// The libtorch element type of `d`.
pub(crate) fn kind(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 => Kind::Float,
        Dtype::Float16 => Kind::Half,
        Dtype::Bfloat16 => Kind::BFloat16,
        Dtype::Int64 => Kind::Int64,
        Dtype::Int32 => Kind::Int,
        Dtype::Bool => Kind::Bool,
        Dtype::Uint8 => Kind::Uint8,
    }
}

struct Weights {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

/// The protocol's backend on a CUDA device through libtorch.
pub struct TorchBackend {
    allocator: Allocator,
    config: MeasureConfig,
    weights: Option<Weights>,
    inputs: Option<Tensor>,
    output: Option<Tensor>,
    start: ffi::CudaEvent,
    end: ffi::CudaEvent,
    /// Names blocks and reads the allocator's map (`measure --blocks`).
    recorder: Option<BlockRecorder>,
}

impl TorchBackend {
    /// Opens the GPU of `config`; with `blocks`, the allocator's map is recorded too.
    pub fn open(config: &MeasureConfig, blocks: bool) -> Result<TorchBackend, MeasureError> {
        let allocator = Allocator::open(config.device)?;
        tch::manual_seed(0);
        Ok(TorchBackend {
            allocator,
            config: config.clone(),
            weights: None,
            inputs: None,
            output: None,
            start: ffi::CudaEvent::new().map_err(shim_err)?,
            end: ffi::CudaEvent::new().map_err(shim_err)?,
            recorder: blocks.then(|| BlockRecorder::new(config.device.index)),
        })
    }

    fn gpu(&self) -> Device {
        self.allocator.device()
    }

    /// The runtime's free and total memory of the device now (`cudaMemGetInfo`).
    pub fn runtime_free_total(
        &self,
    ) -> Result<(iteragpu_lab::units::Bytes, iteragpu_lab::units::Bytes), MeasureError> {
        self.allocator.runtime_free_total()
    }
}

/// A `Linear(fan_in -> fan_out)` layer initialised on the CPU in float32 as PyTorch does
/// (uniform in ±1/sqrt(fan_in) for weight and bias), then moved to `device` in `kind`.
fn linear_on(
    fan_in: u64,
    fan_out: u64,
    device: Device,
    kind: Kind,
) -> Result<(Tensor, Tensor), tch::TchError> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let cpu = (Kind::Float, Device::Cpu);
    let w = Tensor::f_empty([fan_out as i64, fan_in as i64], cpu)?.f_uniform_(-bound, bound)?;
    let b = Tensor::f_empty([fan_out as i64], cpu)?.f_uniform_(-bound, bound)?;
    let w = w.f_to_device_(device, kind, false, false)?;
    let b = b.f_to_device_(device, kind, false, false)?;
    Ok((w, b))
}

impl Backend for TorchBackend {
    fn synchronize(&mut self) -> Result<(), MeasureError> {
        self.allocator.synchronize()
    }
    fn read_allocator(&mut self) -> Result<AllocatorReading, MeasureError> {
        self.allocator.reading()
    }
    fn reset_peaks(&mut self) -> Result<(), MeasureError> {
        self.allocator.reset_peaks()?;
        match &mut self.recorder {
            Some(r) => r.reset(),
            None => Ok(()),
        }
    }
    fn blocks(&mut self) -> Result<Option<PhaseBlocks>, MeasureError> {
        self.recorder.as_mut().map(BlockRecorder::phase).transpose()
    }
    fn start_gpu_timer(&mut self) -> Result<(), MeasureError> {
        self.start
            .record(self.config.device.index)
            .map_err(shim_err)
    }
    fn stop_gpu_timer(&mut self) -> Result<f64, MeasureError> {
        self.end
            .record(self.config.device.index)
            .map_err(shim_err)?;
        self.start.elapsed_ms(&self.end).map_err(shim_err)
    }
    fn load_model(&mut self) -> Result<(), MeasureError> {
        let (c, gpu, k) = (&self.config, self.gpu(), kind(self.config.dtype));
        let (w1, b1) = linear_on(c.width, c.hidden(), gpu, k).map_err(torch_err)?;
        let (w2, b2) = linear_on(c.hidden(), c.width, gpu, k).map_err(torch_err)?;
        if let Some(r) = self.recorder.as_mut() {
            // All four exist once both layers are built: name them, then read the map.
            for (t, name) in [
                (&w1, "linear1.weight"),
                (&b1, "linear1.bias"),
                (&w2, "linear2.weight"),
                (&b2, "linear2.bias"),
            ] {
                r.name(t, name);
            }
            r.observe()?;
        }
        self.weights = Some(Weights { w1, b1, w2, b2 });
        Ok(())
    }
    fn create_inputs(&mut self) -> Result<(), MeasureError> {
        let c = &self.config;
        let shape = [c.batch as i64, c.context as i64, c.width as i64];
        let x = Tensor::f_randn(shape, (kind(c.dtype), self.gpu())).map_err(torch_err)?;
        if let Some(r) = self.recorder.as_mut() {
            r.name(&x, "input");
            r.observe()?;
        }
        self.inputs = Some(x);
        Ok(())
    }
    fn forward(&mut self) -> Result<(), MeasureError> {
        let _no_grad = tch::no_grad_guard();
        let TorchBackend {
            weights: Some(w),
            inputs: Some(x),
            recorder,
            ..
        } = self
        else {
            return Err(MeasureError::from_torch_message(
                "forward pass before the model and inputs exist",
            ));
        };
        // As nn.Sequential does: each intermediate is freed as soon as the next layer returns.
        // With --blocks, each new tensor is named and the map read right after its operation.
        let h = x.f_linear(&w.w1, Some(&w.b1)).map_err(torch_err)?;
        if let Some(r) = recorder.as_mut() {
            r.name(&h, "hidden");
            r.name_workspaces()?;
            r.observe()?;
        }
        let g = h.f_gelu("none").map_err(torch_err)?;
        if let Some(r) = recorder.as_mut() {
            r.name(&g, "gelu");
            r.observe()?;
            r.forget(&h);
        }
        drop(h);
        let y = g.f_linear(&w.w2, Some(&w.b2)).map_err(torch_err)?;
        if let Some(r) = recorder.as_mut() {
            r.name(&y, "output");
            r.observe()?;
            r.forget(&g);
        }
        drop(g);
        self.output = Some(y);
        Ok(())
    }
    fn release_output(&mut self) {
        if let (Some(r), Some(y)) = (self.recorder.as_mut(), &self.output) {
            r.forget(y);
        }
        self.output = None;
    }
}
