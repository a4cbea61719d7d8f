//! The GPU a command targets: written `cuda:N` as in PyTorch. There is no CPU device: a
//! measurement without a GPU is refused, never simulated.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CudaDevice {
    pub index: u32,
}

impl FromStr for CudaDevice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let index = match s.strip_prefix("cuda") {
            Some("") => Some(0),
            Some(rest) => rest.strip_prefix(':').and_then(|n| {
                (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| n.parse::<u32>().ok())
                    .flatten()
            }),
            None => None,
        };
        match index {
            Some(index) => Ok(CudaDevice { index }),
            None if s == "cpu" => Err(
                "`cpu` is not measured: this tool measures the CUDA caching allocator of a GPU and \
                 never falls back to the CPU; give cuda:N"
                    .into(),
            ),
            None => Err(format!("`{s}` is not a device; write cuda:N, e.g. cuda:0")),
        }
    }
}

impl fmt::Display for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda:{}", self.index)
    }
}

impl TryFrom<String> for CudaDevice {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<CudaDevice> for String {
    fn from(d: CudaDevice) -> String {
        d.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cuda_devices_only() {
        assert_eq!("cuda:0".parse::<CudaDevice>().unwrap().index, 0);
        assert_eq!("cuda:3".parse::<CudaDevice>().unwrap().index, 3);
        assert_eq!("cuda".parse::<CudaDevice>().unwrap().index, 0);
        assert!("cpu"
            .parse::<CudaDevice>()
            .unwrap_err()
            .contains("never falls back"));
        for bad in ["cuda:", "cuda:-1", "cuda:x", "gpu0", "cuda:0:1", ""] {
            assert!(bad.parse::<CudaDevice>().is_err(), "{bad}");
        }
    }
}
