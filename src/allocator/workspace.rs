//! The cuBLAS and cuBLASLt workspaces that PyTorch 2.11.0 allocates through the caching allocator
//! on the first matrix product of a (thread, stream) and keeps for the life of the process
//! (`aten/src/ATen/cuda/CublasHandlePool.cpp`: `parseChosenWorkspaceSize`,
//! `parseCUDABlasLtWorkspaceSize`, `getCUDABlasLtWorkspaceSize`, `getCUDABlasLtWorkspace`), and
//! when `Linear` takes the cuBLASLt path that needs the second one
//! (`aten/src/ATen/native/cuda/Blas.cpp`, `addmm_out_cuda_impl`).
//!
//! The settings come from the same environment variables PyTorch reads; a setting this model
//! does not cover (another allocator configuration, cuBLASLt preferred for every product) is
//! refused with its name, never guessed.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A GPU architecture, `major.minor` (e.g. 9.0 for the H100 and H200).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

/// The architectures this model knows: NVIDIA's compute capabilities that CUDA 13 builds of
/// PyTorch 2.11 run on (Turing to Blackwell). Others are refused.
pub const KNOWN_ARCHITECTURES: [ComputeCapability; 11] = [
    ComputeCapability::new(7, 5),
    ComputeCapability::new(8, 0),
    ComputeCapability::new(8, 6),
    ComputeCapability::new(8, 7),
    ComputeCapability::new(8, 9),
    ComputeCapability::new(9, 0),
    ComputeCapability::new(10, 0),
    ComputeCapability::new(10, 3),
    ComputeCapability::new(11, 0),
    ComputeCapability::new(12, 0),
    ComputeCapability::new(12, 1),
];

impl ComputeCapability {
    pub const fn new(major: u32, minor: u32) -> ComputeCapability {
        ComputeCapability { major, minor }
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for ComputeCapability {
    type Err = WorkspaceError;
    fn from_str(s: &str) -> Result<ComputeCapability, WorkspaceError> {
        let unknown = || WorkspaceError::UnknownArchitecture(s.to_string());
        let (major, minor) = s.split_once('.').ok_or_else(unknown)?;
        let digits =
            |t: &str| !t.is_empty() && t.len() <= 3 && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(unknown());
        }
        let cc = ComputeCapability::new(
            major.parse().map_err(|_| unknown())?,
            minor.parse().map_err(|_| unknown())?,
        );
        if KNOWN_ARCHITECTURES.contains(&cc) {
            Ok(cc)
        } else {
            Err(unknown())
        }
    }
}

impl From<ComputeCapability> for String {
    fn from(c: ComputeCapability) -> String {
        c.to_string()
    }
}

impl TryFrom<String> for ComputeCapability {
    type Error = WorkspaceError;
    fn try_from(s: String) -> Result<Self, WorkspaceError> {
        s.parse()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "compute capability `{given}` is not one this model knows (known: {known})",
        given = .0,
        known = KNOWN_ARCHITECTURES.map(|c| c.to_string()).join(", ")
    )]
    UnknownArchitecture(String),
    #[error("{name}=`{value}` is not a whole number of KiB")]
    BadSize { name: &'static str, value: String },
    #[error("{name}=`{value}` would make a workspace larger than 2^62 bytes")]
    TooLarge { name: &'static str, value: String },
    #[error(
        "{name} is set: {why}; the model covers PyTorch's default here and does not guess \
         (unset it to predict)"
    )]
    NotModelled {
        name: &'static str,
        why: &'static str,
    },
}

impl crate::status::Classify for WorkspaceError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
}

/// The environment variables PyTorch 2.11 reads that change what the synthetic network
/// allocates, as given to the model (`None`: unset).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceSettings {
    /// `CUBLAS_WORKSPACE_CONFIG`, e.g. `:4096:8` (pairs `:SIZE_KiB:COUNT`, summed).
    pub cublas_workspace_config: Option<String>,
    /// `CUBLASLT_WORKSPACE_SIZE`, KiB.
    pub cublaslt_workspace_size: Option<String>,
    /// `TORCH_CUBLASLT_UNIFIED_WORKSPACE`: when true, cuBLASLt borrows the cuBLAS workspace.
    pub cublaslt_unified_workspace: Option<String>,
    /// `DISABLE_ADDMM_CUDA_LT`: `1` keeps `Linear` off the cuBLASLt path.
    pub disable_addmm_cuda_lt: Option<String>,
}

/// Variables that would change the allocator or the product path in ways the model does not
/// cover: their presence refuses a prediction.
pub const UNMODELLED_VARIABLES: [(&str, &str); 3] = [
    (
        "PYTORCH_CUDA_ALLOC_CONF",
        "it changes the caching allocator's configuration",
    ),
    (
        "PYTORCH_ALLOC_CONF",
        "it changes the caching allocator's configuration",
    ),
    (
        "TORCH_BLAS_PREFER_CUBLASLT",
        "it sends every matrix product through cuBLASLt",
    ),
];

impl WorkspaceSettings {
    /// Reads the variables through `lookup` (the process environment: `|n| std::env::var(n).ok()`);
    /// refuses when one of [`UNMODELLED_VARIABLES`] is set. Only these variables are read, and
    /// only their values' effect on sizes is kept.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<WorkspaceSettings, WorkspaceError> {
        for (name, why) in UNMODELLED_VARIABLES {
            if lookup(name).is_some() {
                return Err(WorkspaceError::NotModelled { name, why });
            }
        }
        Ok(WorkspaceSettings {
            cublas_workspace_config: lookup("CUBLAS_WORKSPACE_CONFIG"),
            cublaslt_workspace_size: lookup("CUBLASLT_WORKSPACE_SIZE"),
            cublaslt_unified_workspace: lookup("TORCH_CUBLASLT_UNIFIED_WORKSPACE"),
            disable_addmm_cuda_lt: lookup("DISABLE_ADDMM_CUDA_LT"),
        })
    }
}

/// What the first matrix products of a process allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspaces {
    /// The cuBLAS workspace, allocated with the handle on the first product.
    pub cublas_bytes: u64,
    /// The separate cuBLASLt workspace, allocated on the first cuBLASLt product; `None` when
    /// cuBLASLt borrows the cuBLAS workspace (unified).
    pub cublaslt_bytes: Option<u64>,
    /// Whether `Linear` with a bias may take the cuBLASLt path (`DISABLE_ADDMM_CUDA_LT` unset).
    pub addmm_cublaslt: bool,
}

const LIMIT: u64 = 1 << 62;

/// `parseChosenWorkspaceSize`: the sum of `SIZE_KiB × 1024 × COUNT` over the `:SIZE:COUNT` pairs
/// of `CUBLAS_WORKSPACE_CONFIG`; unset or without a pair, 32 MiB on compute capability 9.0 and
/// 4096 KiB × 2 + 16 KiB × 8 = 8 519 680 bytes elsewhere.
fn cublas_size(cc: ComputeCapability, config: Option<&str>) -> Result<u64, WorkspaceError> {
    let default = if cc == ComputeCapability::new(9, 0) {
        4096 * 8 * 1024
    } else {
        4096 * 1024 * 2 + 16 * 1024 * 8
    };
    let Some(config) = config else {
        return Ok(default);
    };
    let too_large = || WorkspaceError::TooLarge {
        name: "CUBLAS_WORKSPACE_CONFIG",
        value: config.to_string(),
    };
    let pairs = pairs(config);
    if pairs.is_empty() {
        return Ok(default); // PyTorch warns and keeps the default.
    }
    let mut total: u64 = 0;
    for (size, count) in pairs {
        let (size, count) = (
            size.parse::<u64>().map_err(|_| too_large())?,
            count.parse::<u64>().map_err(|_| too_large())?,
        );
        total = size
            .checked_mul(1024)
            .and_then(|b| b.checked_mul(count))
            .and_then(|b| b.checked_add(total))
            .filter(|t| *t <= LIMIT)
            .ok_or_else(too_large)?;
    }
    Ok(total)
}

/// The `:DIGITS:DIGITS` matches of the regular expression `:([0-9]+):([0-9]+)`, left to right,
/// without overlap.
fn pairs(s: &str) -> Vec<(&str, &str)> {
    let b = s.as_bytes();
    let digits_from = |i: usize| {
        let end = (i..b.len())
            .find(|&j| !b[j].is_ascii_digit())
            .unwrap_or(b.len());
        (end > i).then_some(end)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b':' {
            if let Some(e1) = digits_from(i + 1) {
                if e1 < b.len() && b[e1] == b':' {
                    if let Some(e2) = digits_from(e1 + 1) {
                        out.push((&s[i + 1..e1], &s[e1 + 1..e2]));
                        i = e2;
                        continue;
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// `check_env`: true for `1`/`ON`/`YES`/`TRUE`/`Y`, false for `0`/`OFF`/`NO`/`FALSE`/`N`
/// (any case), unset for anything else (PyTorch warns and ignores it).
fn env_flag(v: Option<&str>) -> Option<bool> {
    let v = v?.to_ascii_uppercase();
    match v.as_str() {
        "1" | "ON" | "YES" | "TRUE" | "Y" => Some(true),
        "0" | "OFF" | "NO" | "FALSE" | "N" => Some(false),
        _ => None,
    }
}

impl Workspaces {
    /// The workspaces on `cc` under `settings`.
    pub fn for_gpu(
        cc: ComputeCapability,
        settings: &WorkspaceSettings,
    ) -> Result<Workspaces, WorkspaceError> {
        let cublas = cublas_size(cc, settings.cublas_workspace_config.as_deref())?;
        // parseCUDABlasLtWorkspaceSize: KiB, default 1024.
        let lt_kib = match settings.cublaslt_workspace_size.as_deref() {
            None => 1024,
            Some(v) => {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(WorkspaceError::BadSize {
                        name: "CUBLASLT_WORKSPACE_SIZE",
                        value: v.into(),
                    });
                }
                // std::stoi: an int; beyond it PyTorch warns and keeps the default.
                v.parse::<i32>().map_or(1024, |k| k as u64)
            }
        };
        let unified_flag = env_flag(settings.cublaslt_unified_workspace.as_deref());
        // getCUDABlasLtWorkspaceSize treats an unset flag as unified and clamps to the cuBLAS size;
        // getCUDABlasLtWorkspace treats it as separate unless it is set true.
        let mut lt = lt_kib * 1024;
        if unified_flag != Some(false) {
            lt = lt.min(cublas);
        }
        let cublaslt_bytes = (unified_flag != Some(true)).then_some(lt);
        let addmm_cublaslt = settings.disable_addmm_cuda_lt.as_deref() != Some("1");
        Ok(Workspaces {
            cublas_bytes: cublas,
            cublaslt_bytes,
            addmm_cublaslt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(cc: &str, f: impl Fn(&mut WorkspaceSettings)) -> Workspaces {
        let mut s = WorkspaceSettings::default();
        f(&mut s);
        Workspaces::for_gpu(cc.parse().unwrap(), &s).unwrap()
    }

    #[test]
    fn defaults_by_architecture() {
        let h200 = ws("9.0", |_| {});
        assert_eq!(h200.cublas_bytes, 33_554_432);
        assert_eq!(h200.cublaslt_bytes, Some(1_048_576));
        assert!(h200.addmm_cublaslt);
        for cc in ["8.0", "8.9", "10.0", "12.0"] {
            assert_eq!(ws(cc, |_| {}).cublas_bytes, 8_519_680, "{cc}");
        }
    }

    #[test]
    fn environment_settings_change_the_sizes() {
        let w = ws("9.0", |s| {
            s.cublas_workspace_config = Some(":4096:8".into())
        });
        assert_eq!(w.cublas_bytes, 33_554_432);
        let w = ws("8.0", |s| {
            s.cublas_workspace_config = Some(":4096:2:16:8".into())
        });
        assert_eq!(w.cublas_bytes, 8_519_680);
        let w = ws("9.0", |s| {
            s.cublas_workspace_config = Some("garbage".into())
        });
        assert_eq!(
            w.cublas_bytes, 33_554_432,
            "unparsable: PyTorch keeps the default"
        );
        let w = ws("9.0", |s| s.cublaslt_workspace_size = Some("2048".into()));
        assert_eq!(w.cublaslt_bytes, Some(2 << 20));
        // The cuBLASLt size is clamped to the cuBLAS one unless unified is explicitly off.
        let w = ws("9.0", |s| {
            s.cublas_workspace_config = Some(":16:8".into());
            s.cublaslt_workspace_size = Some("2048".into());
        });
        assert_eq!((w.cublas_bytes, w.cublaslt_bytes), (131_072, Some(131_072)));
        let w = ws("9.0", |s| s.cublaslt_unified_workspace = Some("1".into()));
        assert_eq!(w.cublaslt_bytes, None);
        let w = ws("9.0", |s| s.disable_addmm_cuda_lt = Some("1".into()));
        assert!(!w.addmm_cublaslt);
    }

    #[test]
    fn unknown_architectures_and_settings_are_refused() {
        assert!(matches!(
            "13.7".parse::<ComputeCapability>(),
            Err(WorkspaceError::UnknownArchitecture(_))
        ));
        assert!("9".parse::<ComputeCapability>().is_err());
        let e = WorkspaceSettings::from_lookup(|n| {
            (n == "PYTORCH_CUDA_ALLOC_CONF").then(|| "expandable_segments:True".into())
        })
        .unwrap_err();
        assert!(e.to_string().contains("PYTORCH_CUDA_ALLOC_CONF"), "{e}");
        let bad = WorkspaceSettings {
            cublaslt_workspace_size: Some("2 MiB".into()),
            ..Default::default()
        };
        assert!(Workspaces::for_gpu(ComputeCapability::new(9, 0), &bad).is_err());
        let huge = WorkspaceSettings {
            cublas_workspace_config: Some(":99999999999999:99999999".into()),
            ..Default::default()
        };
        assert!(matches!(
            Workspaces::for_gpu(ComputeCapability::new(9, 0), &huge),
            Err(WorkspaceError::TooLarge { .. })
        ));
    }

    #[test]
    fn pairs_follow_the_regular_expression() {
        assert_eq!(pairs(":4096:2:16:8"), [("4096", "2"), ("16", "8")]);
        assert_eq!(pairs("x:1:2y:3:4"), [("1", "2"), ("3", "4")]);
        assert!(pairs(":1:").is_empty());
    }
}
