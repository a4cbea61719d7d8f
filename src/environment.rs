//! The environment report: tool, Rust, libtorch and its CUDA build, cuDNN, the chosen GPU and the
//! runtime's free/total memory, the driver. It collects no environment variable, host or user name.
//! Without a GPU (or without libtorch) it is still a valid report that says so.

use crate::device::CudaDevice;
use crate::markup::{rows_text, Rows};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LibtorchInfo {
    /// Whether the program that wrote this report links libtorch (the companion
    /// `mesure_memoire_torch` and the notebooks' backend do; `mesure_memoire` itself does not).
    pub built_with: bool,
    /// Why libtorch could not be loaded, when it could not.
    pub load_error: Option<String>,
    /// libtorch version from the headers this program was compiled against.
    pub version: Option<String>,
    /// CUDA version libtorch was compiled with (`torch.version.cuda`).
    pub cuda_build: Option<String>,
    /// HIP version for a ROCm build; this program supports CUDA builds only.
    pub hip_build: Option<String>,
    /// Version of the CUDA runtime library loaded in this process.
    pub cuda_runtime: Option<String>,
    /// cuDNN version libtorch was compiled with, and the one loaded.
    pub cudnn_build: Option<String>,
    pub cudnn_runtime: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    /// "major.minor", e.g. "9.0" for Hopper.
    pub compute_capability: String,
    pub multiprocessors: u32,
    /// Total memory from the device properties.
    pub total_memory: Bytes,
    /// Free and total memory as `cudaMemGetInfo` reports them at the time of the report.
    pub runtime_free: Bytes,
    pub runtime_total: Bytes,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DriverInfo {
    /// Highest CUDA version the installed driver supports (`cudaDriverGetVersion`).
    pub cuda_driver_api_version: Option<String>,
    /// Kernel driver version from `/proc/driver/nvidia/version`, where the system exposes it.
    pub kernel_module_version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EnvironmentReport {
    pub tool: String,
    /// The Rust compiler this program was built with.
    pub rust_version: String,
    pub os: String,
    pub arch: String,
    pub libtorch: LibtorchInfo,
    pub cuda_available: bool,
    pub device_count: u32,
    /// The device asked for, `cuda:N`.
    pub requested_device: Option<CudaDevice>,
    /// The requested GPU, when it exists and CUDA works.
    pub device: Option<GpuInfo>,
    pub driver: DriverInfo,
    /// Why no GPU is reported, when none is.
    pub unavailable: Option<String>,
    pub notes: Vec<String>,
}

const NOTE_RUNTIME: &str = "The CUDA runtime embedded in libtorch is not the driver: the driver \
version is reported separately (kernel module and driver API).";
const NOTE_PRIVACY: &str =
    "No environment variable, host name or user name is collected in this report.";

impl EnvironmentReport {
    /// The report of a program whose GPU companion could not report: not found beside it
    /// (`companion_found` false), or found but unable to load libtorch or to run, for `why`.
    pub fn companion_unreachable(
        requested: CudaDevice,
        companion_found: bool,
        why: String,
    ) -> Self {
        EnvironmentReport::without_libtorch(
            Some(requested),
            LibtorchInfo {
                built_with: companion_found,
                load_error: Some(why),
                ..Default::default()
            },
        )
    }

    /// A report with the build facts only: no libtorch call is made.
    pub fn without_libtorch(requested: Option<CudaDevice>, libtorch: LibtorchInfo) -> Self {
        let unavailable = if !libtorch.built_with {
            "this program does not link libtorch and no GPU companion was found beside it"
                .to_string()
        } else {
            format!(
                "libtorch could not be loaded: {}",
                libtorch.load_error.as_deref().unwrap_or("unknown reason")
            )
        };
        EnvironmentReport {
            tool: format!("iteragpu-lab {}", env!("CARGO_PKG_VERSION")),
            rust_version: env!("IGL_RUSTC_VERSION").to_string(),
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            libtorch,
            cuda_available: false,
            device_count: 0,
            requested_device: requested,
            device: None,
            driver: DriverInfo {
                cuda_driver_api_version: None,
                kernel_module_version: kernel_module_version(),
            },
            unavailable: Some(unavailable),
            notes: vec![NOTE_RUNTIME.into(), NOTE_PRIVACY.into()],
        }
    }
}

/// "13.0" from 13000; "12.8" from 12080.
pub fn cuda_version_text(v: i64) -> Option<String> {
    (v > 0).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// "9.10.2" from 91002 (cuDNN 9 numbering).
pub fn cudnn_version_text(v: i64) -> Option<String> {
    (v > 0).then(|| format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

/// The NVIDIA kernel module version, e.g. "580.159.04", where `/proc` exposes it.
pub fn kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_kernel_module_version(&text)
}

fn parse_kernel_module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    let after = &line[line.find("Module")?..];
    after
        .split_whitespace()
        .find(|t| t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_string)
}

/// What names a GPU that a report does not name.
pub const UNKNOWN_GPU: &str = "unknown GPU";

impl EnvironmentReport {
    /// The GPU's name, or [`UNKNOWN_GPU`] when the report names none.
    pub fn gpu_name(&self) -> &str {
        self.device
            .as_ref()
            .map_or(UNKNOWN_GPU, |d| d.name.as_str())
    }

    /// The report as label/value rows: its text and HTML forms are both drawn from them.
    pub fn rows(&self) -> Rows {
        let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let t = &self.libtorch;
        let libtorch = if !t.built_with {
            "not linked by this program".to_string()
        } else if let Some(e) = &t.load_error {
            format!("NOT LOADABLE: {e}")
        } else {
            or(&t.version)
        };
        let mut rows: Rows = vec![
            ("tool", self.tool.clone()),
            ("built with", self.rust_version.clone()),
            ("system", format!("{} {}", self.os, self.arch)),
            ("libtorch", libtorch),
            ("CUDA build of libtorch", or(&t.cuda_build)),
            ("CUDA runtime loaded", or(&t.cuda_runtime)),
            (
                "cuDNN build / loaded",
                format!("{} / {}", or(&t.cudnn_build), or(&t.cudnn_runtime)),
            ),
            ("CUDA available", self.cuda_available.to_string()),
            ("CUDA devices", self.device_count.to_string()),
        ];
        if let Some(d) = &self.device {
            rows.push(("device", format!("cuda:{} {}", d.index, d.name)));
            rows.push((
                "compute capability",
                format!(
                    "{} ({} multiprocessors)",
                    d.compute_capability, d.multiprocessors
                ),
            ));
            rows.push(("total memory", d.total_memory.to_string()));
            rows.push((
                "runtime free / total",
                format!(
                    "{} / {}",
                    d.runtime_free.gib_text(),
                    d.runtime_total.gib_text()
                ),
            ));
        }
        if let Some(why) = &self.unavailable {
            rows.push(("GPU", format!("unavailable: {why}")));
        }
        rows.push((
            "driver (CUDA API)",
            or(&self.driver.cuda_driver_api_version),
        ));
        rows.push((
            "driver (kernel module)",
            or(&self.driver.kernel_module_version),
        ));
        rows
    }
}

impl fmt::Display for EnvironmentReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        rows_text(f, "Environment", &self.rows(), 22)?;
        write!(f, "{}", self.notes.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_spelled_as_vendors_do() {
        assert_eq!(cuda_version_text(13000).unwrap(), "13.0");
        assert_eq!(cuda_version_text(12080).unwrap(), "12.8");
        assert_eq!(cuda_version_text(0), None);
        assert_eq!(cudnn_version_text(91002).unwrap(), "9.10.2");
    }

    #[test]
    fn kernel_module_line_is_parsed() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 2 2025\nGCC version: gcc 12";
        assert_eq!(
            parse_kernel_module_version(proprietary).unwrap(),
            "580.159.04"
        );
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  610.62  Release Build";
        assert_eq!(parse_kernel_module_version(open).unwrap(), "610.62");
        assert_eq!(parse_kernel_module_version("nothing"), None);
    }

    #[test]
    fn a_report_without_libtorch_is_valid_and_says_why() {
        let r = EnvironmentReport::without_libtorch(None, LibtorchInfo::default());
        assert!(!r.cuda_available);
        assert!(r
            .unavailable
            .as_deref()
            .unwrap()
            .contains("does not link libtorch"));
        let text = r.to_string();
        assert!(
            text.contains("  libtorch               not linked by this program"),
            "{text}"
        );
        assert!(text.contains("  system                 "), "{text}");
    }
}
