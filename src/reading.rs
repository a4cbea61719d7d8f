//! What is read from the caching allocator, measured or predicted: the protocol's phases, the
//! four counters at an instant, the six figures of a phase row and the residual between two such
//! rows, the allocator's other statistics, and the readings after each named step of a lesson.
//! A leaf: the measurement, the allocator model, the sweep and the lesson all read and write
//! these records, and this module imports none of them.

use serde::{Deserialize, Serialize};

/// The phases of the measurement protocol, in order.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Phase {
    ModelLoad,
    Inputs,
    ColdForward,
    Warmup,
    WarmForward,
}

impl Phase {
    /// The phase's name in files and tables (`cold_forward`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The caching allocator's counters at one instant, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AllocatorReading {
    /// Bytes held by live tensors (`torch.cuda.memory_allocated`).
    pub allocated: u64,
    /// Bytes held from the driver by the allocator, used or cached (`memory_reserved`).
    pub reserved: u64,
    /// Maximum of `allocated` since the last peak reset (`max_memory_allocated`).
    pub peak_allocated: u64,
    /// Maximum of `reserved` since the last peak reset (`max_memory_reserved`).
    pub peak_reserved: u64,
}

/// The six figures of a phase row: baseline, end and peak of `allocated` and of `reserved`.
/// `Six<u64>` holds bytes ([`Figures`]); `Six<i64>` a difference in bytes ([`Residual`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Six<T> {
    pub allocated_baseline_bytes: T,
    pub allocated_end_bytes: T,
    pub peak_allocated_bytes: T,
    pub reserved_baseline_bytes: T,
    pub reserved_end_bytes: T,
    pub peak_reserved_bytes: T,
}

/// The six figures of a phase row, in bytes. `allocated` is part of `reserved` (never add them)
/// and the two peaks are separate maxima (never subtract them).
pub type Figures = Six<u64>;

/// `measured − predicted` for each of the six figures, in bytes (0 everywhere when the model is
/// exact).
pub type Residual = Six<i64>;

/// The figures' names, in the order of the phase tables.
pub const FIGURE_NAMES: [&str; 6] = [
    "allocated_baseline_bytes",
    "allocated_end_bytes",
    "peak_allocated_bytes",
    "reserved_baseline_bytes",
    "reserved_end_bytes",
    "peak_reserved_bytes",
];

impl<T: Copy> Six<T> {
    /// The values, in the order of [`FIGURE_NAMES`].
    pub fn values(&self) -> [T; 6] {
        [
            self.allocated_baseline_bytes,
            self.allocated_end_bytes,
            self.peak_allocated_bytes,
            self.reserved_baseline_bytes,
            self.reserved_end_bytes,
            self.peak_reserved_bytes,
        ]
    }

    /// Names and values, in the order of the phase tables.
    pub fn named(&self) -> [(&'static str, T); 6] {
        let v = self.values();
        std::array::from_fn(|i| (FIGURE_NAMES[i], v[i]))
    }

    fn from_values(v: [T; 6]) -> Six<T> {
        Six {
            allocated_baseline_bytes: v[0],
            allocated_end_bytes: v[1],
            peak_allocated_bytes: v[2],
            reserved_baseline_bytes: v[3],
            reserved_end_bytes: v[4],
            peak_reserved_bytes: v[5],
        }
    }
}

impl Figures {
    /// `measured − predicted` for each figure (`self` is the measurement).
    pub fn residual(&self, predicted: &Figures) -> Residual {
        let (m, p) = (self.values(), predicted.values());
        Six::from_values(std::array::from_fn(|i| {
            (i128::from(m[i]) - i128::from(p[i])).clamp(i64::MIN.into(), i64::MAX.into()) as i64
        }))
    }

    /// Whether these are figures the caching allocator can give: every peak at least its end
    /// and its baseline, `reserved` at least `allocated` at each reading.
    pub fn is_consistent(&self) -> bool {
        self.peak_allocated_bytes >= self.allocated_end_bytes
            && self.peak_allocated_bytes >= self.allocated_baseline_bytes
            && self.peak_reserved_bytes >= self.reserved_end_bytes
            && self.peak_reserved_bytes >= self.reserved_baseline_bytes
            && self.reserved_baseline_bytes >= self.allocated_baseline_bytes
            && self.reserved_end_bytes >= self.allocated_end_bytes
            && self.peak_reserved_bytes >= self.peak_allocated_bytes
    }

    /// What a file that holds these figures is told when they are not consistent.
    pub const INCONSISTENT: &'static str =
        "figures the caching allocator cannot give (a peak below its start or end, or reserved \
         below allocated)";
}

impl Residual {
    pub fn is_zero(&self) -> bool {
        self.values().iter().all(|v| *v == 0)
    }
}

/// Statistics of the caching allocator beyond the four figures (`torch.cuda.memory_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Bytes asked for by live tensors, before rounding (`requested_bytes.all.current`).
    pub requested_bytes: u64,
    /// Free bytes in segments that also hold live blocks (`inactive_split_bytes.all.current`).
    pub inactive_split_bytes: u64,
    /// Free blocks in such segments (`inactive_split.all.current`).
    pub inactive_split_blocks: u64,
    /// Segments held from the driver (`segment.all.current`).
    pub segments: u64,
    /// Times `cudaMalloc` failed and the allocator released its cache to try again
    /// (`num_alloc_retries`).
    pub alloc_retries: u64,
    /// Out-of-memory errors raised (`num_ooms`).
    pub ooms: u64,
}

/// Readings after one named step (allocate, free, a matrix product, `empty_cache`...), in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReading {
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
    /// `nvidia-smi` shows, all processes included; `None` in a prediction (the model sees only
    /// the allocator).
    pub runtime_used: Option<u64>,
}

/// The readings of a sequence of steps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLog {
    pub steps: Vec<StepReading>,
    /// Where the figures come from (measured here, recorded elsewhere, predicted), said above
    /// them.
    #[serde(default)]
    pub source: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_residual_is_measured_minus_predicted_and_saturates() {
        let m = Figures {
            peak_reserved_bytes: 10,
            allocated_end_bytes: u64::MAX,
            ..Default::default()
        };
        let p = Figures {
            peak_reserved_bytes: 12,
            ..Default::default()
        };
        let r = m.residual(&p);
        assert_eq!(r.peak_reserved_bytes, -2);
        assert_eq!(r.allocated_end_bytes, i64::MAX);
        assert!(!r.is_zero());
        assert!(m.residual(&m).is_zero());
        assert_eq!(m.named()[5], ("peak_reserved_bytes", 10));
    }

    #[test]
    fn phases_are_named_as_in_files() {
        assert_eq!(Phase::ColdForward.name(), "cold_forward");
        assert_eq!("warm_forward".parse::<Phase>().unwrap(), Phase::WarmForward);
        assert_eq!(
            serde_json::to_string(&Phase::ModelLoad).unwrap(),
            "\"model_load\""
        );
    }
}
