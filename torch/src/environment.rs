//! The environment report through libtorch and the shim: versions, the GPU, the runtime's memory.

use crate::{ffi, shim_err, Allocator};
use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::environment::{
    cuda_version_text, cudnn_version_text, DriverInfo, EnvironmentReport, GpuInfo, LibtorchInfo,
};
use iteragpu_lab::measure::MeasureError;
use iteragpu_lab::units::Bytes;

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
