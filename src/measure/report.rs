//! The measurement result file: environment, configuration, synthetic model and phase rows, with a
//! schema tag; written once, atomically, never over an existing file.

use super::{ConfigError, MeasureConfig, PhaseRecord, SyntheticModel};
use crate::environment::EnvironmentReport;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// Identifies the JSON layout documented in `docs/measurement-schema.md`.
pub const SCHEMA: &str = "iteragpu-lab/measurement/v1";

/// What every result says about its own scope.
pub const SCOPE_NOTES: [&str; 4] = [
    "Counters cover only the PyTorch caching allocator of this process on the measured GPU: not \
     the CUDA context, the driver, other processes or other GPUs.",
    "allocated is part of reserved: never add them. peak_allocated_bytes and peak_reserved_bytes \
     are two distinct maxima: never subtract them to infer a cache size.",
    "host_wall_time_ms includes launch overhead and synchronisation; gpu_event_time_ms is the \
     GPU-side span between two CUDA events. Neither is an isolated kernel time.",
    "The synthetic Linear -> GELU -> Linear network is not an LLM, not training and not a \
     benchmark of the GPUs offered for rent.",
];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    pub schema: String,
    /// UTC time the measurement finished, RFC 3339.
    pub measured_at: String,
    pub environment: EnvironmentReport,
    pub configuration: MeasureConfig,
    pub synthetic_model: SyntheticModel,
    pub phases: Vec<PhaseRecord>,
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read measurement {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file} is not a measurement file: {message}")]
    Invalid { file: String, message: String },
}

impl Measurement {
    pub fn new(
        environment: EnvironmentReport,
        configuration: MeasureConfig,
        phases: Vec<PhaseRecord>,
    ) -> Result<Measurement, ConfigError> {
        Ok(Measurement {
            schema: SCHEMA.into(),
            measured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string(),
            synthetic_model: configuration.model()?,
            environment,
            configuration,
            phases,
            notes: SCOPE_NOTES.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Reads a measurement file written by `measure` and checks its schema tag.
    pub fn load(path: &Path) -> Result<Measurement, LoadError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Io {
            file: file.clone(),
            source,
        })?;
        Self::from_bytes(&bytes, &file)
    }

    /// Parses measurement bytes read from `file` and checks the schema tag.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Measurement, LoadError> {
        let file = file.to_string();
        let m: Measurement = serde_json::from_slice(bytes).map_err(|e| LoadError::Invalid {
            file: file.clone(),
            message: e.to_string(),
        })?;
        if m.schema != SCHEMA {
            return Err(LoadError::Invalid {
                file,
                message: format!("schema `{}`, expected `{SCHEMA}`", m.schema),
            });
        }
        Ok(m)
    }

    /// The measured GPU's name, as the environment recorded it.
    pub fn gpu_name(&self) -> &str {
        self.environment
            .device
            .as_ref()
            .map_or("unknown GPU", |d| d.name.as_str())
    }

    /// The largest `peak_allocated_bytes` over all phases.
    pub fn max_peak_allocated(&self) -> Bytes {
        Bytes(
            self.phases
                .iter()
                .map(|p| p.peak_allocated_bytes)
                .max()
                .unwrap_or(0),
        )
    }

    /// The largest `peak_reserved_bytes` over all phases.
    pub fn max_peak_reserved(&self) -> Bytes {
        Bytes(
            self.phases
                .iter()
                .map(|p| p.peak_reserved_bytes)
                .max()
                .unwrap_or(0),
        )
    }
}

impl fmt::Display for Measurement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.configuration;
        let m = &self.synthetic_model;
        writeln!(
            f,
            "Measurement on {} ({}), {}",
            c.device,
            self.gpu_name(),
            self.measured_at
        )?;
        writeln!(
            f,
            "  input [batch {}, context {}, width {}], hidden {}, {}; {} parameters = {}",
            c.batch,
            c.context,
            c.width,
            c.hidden,
            c.dtype.name(),
            m.parameters,
            m.parameter_size()
        )?;
        // The phase name is left-aligned, the figures right-aligned.
        let line = |f: &mut fmt::Formatter<'_>, cells: &[&str]| {
            write!(f, "{:<w$}", cells[0], w = COLUMN_WIDTHS[0])?;
            for (cell, width) in cells[1..].iter().zip(&COLUMN_WIDTHS[1..]) {
                write!(f, " {cell:>width$}")?;
            }
            writeln!(f)
        };
        line(f, &PHASE_COLUMNS)?;
        for p in &self.phases {
            let cells = phase_cells(p);
            line(f, &cells.each_ref().map(String::as_str))?;
        }
        write!(
            f,
            "Bytes are the caching allocator's own counters; see `notes` in the JSON for their scope."
        )
    }
}

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
const COLUMN_WIDTHS: [usize; 10] = [13, 4, 14, 14, 14, 14, 14, 14, 10, 10];

/// One phase row as table cells, in the order of [`PHASE_COLUMNS`].
pub fn phase_cells(p: &PhaseRecord) -> [String; 10] {
    [
        p.phase.name().to_string(),
        p.repetition.map_or("-".into(), |r| r.to_string()),
        p.allocated_baseline_bytes.to_string(),
        p.allocated_end_bytes.to_string(),
        p.peak_allocated_bytes.to_string(),
        p.reserved_baseline_bytes.to_string(),
        p.reserved_end_bytes.to_string(),
        p.peak_reserved_bytes.to_string(),
        format!("{:.3}", p.host_wall_time_ms),
        format!("{:.3}", p.gpu_event_time_ms),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_measurement_reads_back_and_prints_every_phase() {
        let bytes = include_bytes!("../../data/exemple-mesure-h200-petit-essai.json");
        let m = Measurement::from_bytes(bytes, "example").unwrap();
        assert_eq!(m.gpu_name(), "NVIDIA H200");
        assert_eq!(m.max_peak_reserved().0, 35_651_584);
        let text = m.to_string();
        assert!(text.contains("phase          rep"), "{text}");
        assert!(
            text.contains("cold_forward     -         136704       34743808"),
            "{text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("warm_forward"))
                .count(),
            2
        );
        let err = Measurement::from_bytes(b"{}", "x.json").unwrap_err();
        assert!(err.to_string().contains("x.json is not a measurement file"));
    }
}
