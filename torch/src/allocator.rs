//! Direct access to the CUDA caching allocator of one GPU: its counters, peaks, cache and the
//! runtime's view of the device, through the shim.

use crate::{ffi, shim_err};
use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::measure::MeasureError;
use iteragpu_lab::reading::AllocatorReading;
use iteragpu_lab::units::Bytes;
use tch::Device;

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
    /// The GPU's index, `N` of `cuda:N`.
    pub fn index(&self) -> u32 {
        self.device.index
    }
    pub fn device(&self) -> Device {
        Device::Cuda(self.device.index as usize)
    }
    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<(), MeasureError> {
        ffi::synchronize(self.device.index).map_err(shim_err)
    }
    /// All counters as they stand (call `synchronize` first to include queued work).
    pub fn stats(&self) -> Result<ffi::MemoryStats, MeasureError> {
        ffi::memory_stats(self.device.index).map_err(shim_err)
    }
    /// The four counters the protocol reads.
    pub fn reading(&self) -> Result<AllocatorReading, MeasureError> {
        let s = self.stats()?;
        Ok(AllocatorReading {
            allocated: s.allocated_current,
            reserved: s.reserved_current,
            peak_allocated: s.allocated_peak,
            peak_reserved: s.reserved_peak,
        })
    }
    pub fn reset_peaks(&self) -> Result<(), MeasureError> {
        ffi::reset_peak_stats(self.device.index).map_err(shim_err)
    }
    /// Returns cached, unused blocks to the driver (`torch.cuda.empty_cache`).
    pub fn empty_cache(&self) -> Result<(), MeasureError> {
        ffi::empty_cache().map_err(shim_err)
    }
    /// The settings the allocator reports it runs with (whichever variable set them).
    pub fn settings(&self) -> Result<iteragpu_lab::lesson::AllocatorSettings, MeasureError> {
        let (s, parsed) = ffi::allocator_settings().map_err(shim_err)?;
        Ok(iteragpu_lab::lesson::AllocatorSettings {
            expandable_segments: s.expandable_segments != 0,
            large_segment_size: s.large_segment_size,
            max_split_size: (s.max_split_size != u64::MAX).then_some(s.max_split_size),
            parsed,
        })
    }
    /// (free, total) as the CUDA runtime reports them for the whole device.
    pub fn runtime_free_total(&self) -> Result<(Bytes, Bytes), MeasureError> {
        let (free, total) = ffi::mem_get_info(self.device.index).map_err(shim_err)?;
        Ok((Bytes(free), Bytes(total)))
    }
}

impl ffi::MemoryStats {
    /// The statistics a measurement records beside its four figures.
    pub fn device_stats(&self) -> iteragpu_lab::reading::DeviceStats {
        iteragpu_lab::reading::DeviceStats {
            requested_bytes: self.requested_current,
            inactive_split_bytes: self.inactive_split_bytes_current,
            inactive_split_blocks: self.inactive_split_current,
            segments: self.segments_current,
            alloc_retries: self.alloc_retries,
            ooms: self.ooms,
        }
    }
}

#[cfg(test)]
mod tests {
    /// Where the test below asks its child process to print what the allocator reports.
    const CHILD: &str = "IGL_SETTINGS_CHILD";

    /// The child half of the next test (does nothing on its own): the settings as this process's
    /// allocator reports them, without a GPU (the configuration is read without one).
    #[test]
    fn settings_child_process() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let (s, parsed) = crate::ffi::allocator_settings().unwrap();
        println!(
            "SETTINGS {} {} {} [{parsed}]",
            s.expandable_segments, s.large_segment_size, s.max_split_size
        );
    }

    /// `PYTORCH_CUDA_ALLOC_CONF` reaches the allocator's configuration (the variable
    /// `mesure_memoire lesson --expandable-segments` sets), and without it the defaults hold.
    #[test]
    fn the_allocator_reports_the_configuration_it_was_given() {
        let report = |conf: Option<&str>| {
            let mut c = std::process::Command::new(std::env::current_exe().unwrap());
            c.args([
                "--exact",
                "allocator::tests::settings_child_process",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env_remove("PYTORCH_ALLOC_CONF")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF");
            if let Some(v) = conf {
                c.env("PYTORCH_CUDA_ALLOC_CONF", v);
            }
            let out = String::from_utf8(c.output().unwrap().stdout).unwrap();
            out.lines()
                .find_map(|l| l.strip_prefix("SETTINGS ").map(str::to_string))
                .unwrap_or_else(|| panic!("no report in {out}"))
        };
        assert_eq!(
            report(None),
            format!("0 20971520 {} []", u64::MAX),
            "PyTorch's defaults"
        );
        assert_eq!(
            report(Some("expandable_segments:True")),
            format!("1 20971520 {} [expandable_segments:True]", u64::MAX)
        );
    }
}
