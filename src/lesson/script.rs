//! The lesson's steps as data: what `mesure_memoire lesson` runs on the GPU (in the companion, one
//! fresh process per lesson) and the allocator model replays. Two steps are sized from the free
//! memory the CUDA runtime reports when they start, so that the allocator's own release of its
//! cache before out-of-memory can be shown on any GPU: [`Step::FillCache`] and
//! [`Step::BeyondFree`].

use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;
/// Relative sizes are rounded down to whole large-pool segments (`kRoundLarge`, 2 MiB).
const ROUND: u64 = 2 * MIB;

/// One step of the lesson.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// A new, uninitialised uint8 tensor of `bytes` bytes kept under `name` (`torch.empty`).
    Allocate { name: String, bytes: u64 },
    /// The tensor `name` dropped: its block goes back to the allocator's cache.
    Free { name: String },
    /// `name = A·A` for a new n×n float32 matrix A of ones, A dropped after the product; the
    /// process's first product also makes cuBLAS allocate its workspace through the allocator.
    Matmul { name: String, n: u64 },
    /// `torch.cuda.reset_peak_stats`: every peak becomes the current value.
    ResetPeaks,
    /// `torch.cuda.empty_cache`: cached segments that hold no live block go back to the driver.
    EmptyCache,
    /// A tensor `name` of `per_mille` thousandths of the free memory the runtime reports
    /// (`cudaMemGetInfo`), rounded down to 2 MiB, allocated and dropped at once: its segment
    /// stays in the allocator's cache, and the driver's free memory shrinks by its size.
    FillCache { name: String, per_mille: u32 },
    /// A tensor `name` of the runtime's free memory plus half of what the allocator could give
    /// back (cached bytes outside split segments: reserved − allocated − inactive split), rounded
    /// down to 2 MiB. It is more than the driver has free, so the allocator's first `cudaMalloc`
    /// fails; it is less than the driver has once the cache is released, so the allocator's
    /// retry succeeds.
    BeyondFree { name: String },
}

/// What a step sized from the runtime's free memory asked for, and what it was computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resolved {
    /// Free memory the runtime reported when the step started.
    pub runtime_free: u64,
    /// Bytes the allocator could have given back then (reserved − allocated − inactive split).
    pub releasable: u64,
    /// The bytes asked for.
    pub bytes: u64,
}

impl Step {
    /// The tensor the step names, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Step::Allocate { name, .. }
            | Step::Free { name }
            | Step::Matmul { name, .. }
            | Step::FillCache { name, .. }
            | Step::BeyondFree { name } => Some(name),
            Step::ResetPeaks | Step::EmptyCache => None,
        }
    }

    /// Whether the step's size depends on the runtime's free memory when it starts.
    pub fn is_relative(&self) -> bool {
        matches!(self, Step::FillCache { .. } | Step::BeyondFree { .. })
    }

    /// The bytes a step sized from the runtime's free memory asks for, given the free memory and
    /// what the allocator could give back; `None` for a step of fixed size.
    pub fn resolve(&self, runtime_free: u64, releasable: u64) -> Option<Resolved> {
        let bytes = match self {
            Step::FillCache { per_mille, .. } => {
                (u128::from(runtime_free) * u128::from(*per_mille) / 1000) as u64
            }
            Step::BeyondFree { .. } => runtime_free.saturating_add(releasable / 2),
            _ => return None,
        };
        Some(Resolved {
            runtime_free,
            releasable,
            bytes: bytes / ROUND * ROUND,
        })
    }

    /// The step in words, with the size it ran with (`resolved`, for a relative step).
    pub fn label(&self, resolved: Option<&Resolved>) -> String {
        let sized = |name: &str, what: String| match resolved {
            Some(r) => format!("{name}: {} B ({what})", r.bytes),
            None => format!("{name}: {what}"),
        };
        match self {
            Step::Allocate { name, bytes } => format!("allocate {name} ({bytes} B)"),
            Step::Free { name } => format!("free {name}"),
            Step::Matmul { name, n } => format!("{name} = A·A, {n}×{n} float32"),
            Step::ResetPeaks => "reset peaks".into(),
            Step::EmptyCache => "empty cache".into(),
            Step::FillCache { name, per_mille } => sized(
                &format!("fill the cache with {name}"),
                format!(
                    "{}.{}% of the free memory, allocated and freed",
                    per_mille / 10,
                    per_mille % 10
                ),
            ),
            Step::BeyondFree { name } => sized(
                &format!("allocate {name}"),
                "free memory + half the releasable cache".into(),
            ),
        }
    }

    /// The step in words without its resolved size (the same for every run).
    pub fn title(&self) -> String {
        self.label(None)
    }
}

/// A sequence of steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LessonScript {
    pub steps: Vec<Step>,
}

impl LessonScript {
    /// The lesson of `notebooks/allocated-vs-reserved.ipynb`: 1 B, 1000 B, 1.5 MiB and 100 MiB
    /// allocated; the 100 MiB freed; 60 MiB reusing it; 101 MiB + 1 B; peaks reset; a 256 MiB
    /// burst allocated and freed; two 1024×1024 float32 products (the first one's output freed);
    /// `empty_cache`; then the allocator's own release of its cache before out-of-memory: 60 % of
    /// the free memory cached, then more than the driver has free.
    pub fn standard() -> LessonScript {
        let allocate = |name: &str, bytes: u64| Step::Allocate {
            name: name.into(),
            bytes,
        };
        let free = |name: &str| Step::Free { name: name.into() };
        let matmul = |name: &str| Step::Matmul {
            name: name.into(),
            n: 1024,
        };
        LessonScript {
            steps: vec![
                allocate("a", 1),
                allocate("b", 1000),
                allocate("c", 1_572_864),
                allocate("big", 100 * MIB),
                free("big"),
                allocate("reuse", 60 * MIB),
                allocate("odd", 101 * MIB + 1),
                Step::ResetPeaks,
                allocate("burst", 256 * MIB),
                free("burst"),
                matmul("C"),
                free("C"),
                matmul("C2"),
                Step::EmptyCache,
                Step::FillCache {
                    name: "huge".into(),
                    per_mille: 600,
                },
                Step::BeyondFree {
                    name: "more".into(),
                },
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_sizes_are_rounded_down_to_2_mib() {
        let fill = Step::FillCache {
            name: "h".into(),
            per_mille: 600,
        };
        let r = fill.resolve(10 * 1000 * MIB + 7, 0).unwrap();
        assert_eq!(r.bytes, 6000 * MIB);
        let beyond = Step::BeyondFree { name: "m".into() };
        let r = beyond
            .resolve(4000 * MIB + 3, 6000 * MIB + 5 * MIB)
            .unwrap();
        assert_eq!(r.bytes, 7002 * MIB);
        assert!(r.bytes > r.runtime_free && r.bytes < r.runtime_free + r.releasable);
        assert_eq!(Step::EmptyCache.resolve(1, 1), None);
        assert_eq!(beyond.resolve(u64::MAX, u64::MAX).unwrap().bytes % ROUND, 0);
    }
}
