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
        let m: Measurement = serde_json::from_slice(&bytes).map_err(|e| LoadError::Invalid {
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
            self.environment
                .device
                .as_ref()
                .map_or("unknown GPU", |d| d.name.as_str()),
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
        writeln!(
            f,
            "{:<13} {:>4} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>10} {:>10}",
            "phase",
            "rep",
            "alloc base",
            "alloc end",
            "alloc peak",
            "resv base",
            "resv end",
            "resv peak",
            "host ms",
            "gpu ms"
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<13} {:>4} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>10.3} {:>10.3}",
                p.phase.name(),
                p.repetition.map_or("-".into(), |r| r.to_string()),
                p.allocated_baseline_bytes,
                p.allocated_end_bytes,
                p.peak_allocated_bytes,
                p.reserved_baseline_bytes,
                p.reserved_end_bytes,
                p.peak_reserved_bytes,
                p.host_wall_time_ms,
                p.gpu_event_time_ms
            )?;
        }
        write!(
            f,
            "Bytes are the caching allocator's own counters; see `notes` in the JSON for their scope."
        )
    }
}
