//! libtorch (tch) behind the measurement protocol: the synthetic network on a CUDA device, the
//! allocator readings through the shim, and the environment probe.

mod ffi;
mod probe;

use crate::device::CudaDevice;
use crate::environment::{
    cuda_version_text, cudnn_version_text, DriverInfo, EnvironmentReport, GpuInfo, LibtorchInfo,
};
use crate::measure::{AllocatorReading, Backend, Dtype, MeasureConfig, MeasureError};
use crate::units::Bytes;
pub use ffi::MemoryStats;
pub use probe::{Probe, Snapshot};
use tch::{Device, Kind, Tensor};

/// Re-exported so that notebooks can make tensors with the same libtorch.
pub use tch;

fn torch_err(e: tch::TchError) -> MeasureError {
    MeasureError::from_torch_message(&e.to_string())
}

fn shim_err(message: String) -> MeasureError {
    MeasureError::from_torch_message(&message)
}

/// Checks that CUDA works and `device` exists, then initialises CUDA in this process.
pub fn open_device(device: CudaDevice) -> Result<(), MeasureError> {
    if !tch::Cuda::is_available() {
        return Err(MeasureError::NoGpu(
            "libtorch reports CUDA unavailable (no NVIDIA driver or no visible GPU)".into(),
        ));
    }
    let count = u32::try_from(tch::Cuda::device_count()).unwrap_or(0);
    if device.index >= count {
        return Err(MeasureError::DeviceMissing {
            index: device.index,
            count,
        });
    }
    ffi::init_device(device.index).map_err(MeasureError::NoGpu)
}

/// Direct access to the caching allocator of one GPU, for notebooks and checks.
pub struct Allocator {
    device: CudaDevice,
}

impl Allocator {
    pub fn open(device: CudaDevice) -> Result<Allocator, MeasureError> {
        open_device(device)?;
        Ok(Allocator { device })
    }
    pub fn device(&self) -> Device {
        Device::Cuda(self.device.index as usize)
    }
    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<(), MeasureError> {
        ffi::synchronize(self.device.index).map_err(shim_err)
    }
    /// All counters as they stand (call `synchronize` first to include queued work).
    pub fn stats(&self) -> Result<MemoryStats, MeasureError> {
        ffi::memory_stats(self.device.index).map_err(shim_err)
    }
    /// The four counters the protocol reads.
    pub fn reading(&self) -> Result<AllocatorReading, MeasureError> {
        let s = self.stats()?;
        Ok(AllocatorReading {
            allocated: s.allocated_current as u64,
            reserved: s.reserved_current as u64,
            peak_allocated: s.allocated_peak as u64,
            peak_reserved: s.reserved_peak as u64,
        })
    }
    pub fn reset_peaks(&self) -> Result<(), MeasureError> {
        ffi::reset_peak_stats(self.device.index).map_err(shim_err)
    }
    /// Returns cached, unused blocks to the driver (`torch.cuda.empty_cache`).
    pub fn empty_cache(&self) -> Result<(), MeasureError> {
        ffi::empty_cache().map_err(shim_err)
    }
    /// (free, total) as the CUDA runtime reports them for the whole device.
    pub fn runtime_free_total(&self) -> Result<(Bytes, Bytes), MeasureError> {
        let (free, total) = ffi::mem_get_info(self.device.index).map_err(shim_err)?;
        Ok((Bytes(free), Bytes(total)))
    }
}

fn kind(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 => Kind::Float,
        Dtype::Float16 => Kind::Half,
        Dtype::Bfloat16 => Kind::BFloat16,
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
}

impl TorchBackend {
    pub fn open(config: &MeasureConfig) -> Result<TorchBackend, MeasureError> {
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
        })
    }

    fn gpu(&self) -> Device {
        self.allocator.device()
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
        self.allocator.reset_peaks()
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
        let (w1, b1) = linear_on(c.width, c.hidden, gpu, k).map_err(torch_err)?;
        let (w2, b2) = linear_on(c.hidden, c.width, gpu, k).map_err(torch_err)?;
        self.weights = Some(Weights { w1, b1, w2, b2 });
        Ok(())
    }
    fn create_inputs(&mut self) -> Result<(), MeasureError> {
        let c = &self.config;
        let shape = [c.batch as i64, c.context as i64, c.width as i64];
        self.inputs = Some(Tensor::f_randn(shape, (kind(c.dtype), self.gpu())).map_err(torch_err)?);
        Ok(())
    }
    fn forward(&mut self) -> Result<(), MeasureError> {
        let _no_grad = tch::no_grad_guard();
        let (Some(w), Some(x)) = (&self.weights, &self.inputs) else {
            return Err(MeasureError::from_torch_message(
                "forward pass before the model and inputs exist",
            ));
        };
        // As nn.Sequential does: each intermediate is freed as soon as the next layer returns.
        let h = x.f_linear(&w.w1, Some(&w.b1)).map_err(torch_err)?;
        let g = h.f_gelu("none").map_err(torch_err)?;
        drop(h);
        let y = g.f_linear(&w.w2, Some(&w.b2)).map_err(torch_err)?;
        drop(g);
        self.output = Some(y);
        Ok(())
    }
    fn release_output(&mut self) {
        self.output = None;
    }
}

/// The environment report through libtorch and the shim.
pub fn environment(requested: Option<CudaDevice>) -> EnvironmentReport {
    let mut libtorch = LibtorchInfo {
        built_with: true,
        ..Default::default()
    };
    let mut driver_api = None;
    match ffi::versions() {
        Ok((torch, v)) => {
            libtorch.version = Some(torch);
            libtorch.cuda_build = cuda_version_text(v.cuda_build);
            libtorch.cuda_runtime = cuda_version_text(v.cuda_runtime);
            libtorch.cudnn_build = cudnn_version_text(v.cudnn_build);
            libtorch.cudnn_runtime = cudnn_version_text(v.cudnn_runtime);
            driver_api = cuda_version_text(v.cuda_driver_api);
        }
        Err(e) => libtorch.load_error = Some(e),
    }
    let mut report = EnvironmentReport::without_libtorch(requested, libtorch);
    report.driver = DriverInfo {
        cuda_driver_api_version: driver_api,
        ..report.driver
    };
    report.cuda_available = tch::Cuda::is_available();
    report.device_count = if report.cuda_available {
        u32::try_from(tch::Cuda::device_count()).unwrap_or(0)
    } else {
        0
    };
    let device = requested.unwrap_or(CudaDevice { index: 0 });
    match gpu_info(device) {
        Ok(info) => {
            report.device = Some(info);
            report.unavailable = None;
        }
        Err(MeasureError::NoGpu(why)) => report.unavailable = Some(why),
        Err(MeasureError::DeviceMissing { index, count }) => {
            report.unavailable = Some(format!(
                "cuda:{index} does not exist ({count} CUDA device(s) visible)"
            ))
        }
        Err(e) => report.unavailable = Some(e.to_string()),
    }
    report
}

fn gpu_info(device: CudaDevice) -> Result<GpuInfo, MeasureError> {
    let allocator = Allocator::open(device)?;
    let p = ffi::device_properties(device.index).map_err(shim_err)?;
    let (free, total) = allocator.runtime_free_total()?;
    Ok(GpuInfo {
        index: device.index,
        name: p.name,
        compute_capability: format!("{}.{}", p.major, p.minor),
        multiprocessors: p.multiprocessors,
        total_memory: Bytes(p.total_memory),
        runtime_free: free,
        runtime_total: total,
    })
}
