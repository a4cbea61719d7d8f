//! A phase table's layout, text and HTML alike: its column titles, their minimum widths in text,
//! and one phase row as cells.

use super::PhaseRecord;

/// Column titles of a phase table (text and HTML).
pub const PHASE_COLUMNS: [&str; 10] = [
    "phase",
    "rep",
    "alloc base",
    "alloc end",
    "alloc peak",
    "resv base",
    "resv end",
    "resv peak",
    "host ms",
    "gpu ms",
];
/// The phase table's minimum column widths in text.
pub const PHASE_WIDTHS: [usize; 10] = [13, 4, 14, 14, 14, 14, 14, 14, 10, 10];

/// One phase row as table cells, in the order of [`PHASE_COLUMNS`].
pub fn phase_cells(p: &PhaseRecord) -> [String; 10] {
    [
        p.phase.name().to_string(),
        p.repetition.map_or("-".into(), |r| r.to_string()),
        p.figures.allocated_baseline_bytes.to_string(),
        p.figures.allocated_end_bytes.to_string(),
        p.figures.peak_allocated_bytes.to_string(),
        p.figures.reserved_baseline_bytes.to_string(),
        p.figures.reserved_end_bytes.to_string(),
        p.figures.peak_reserved_bytes.to_string(),
        format!("{:.3}", p.host_wall_time_ms),
        format!("{:.3}", p.gpu_event_time_ms),
    ]
}
