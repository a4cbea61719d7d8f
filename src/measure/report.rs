//! The measurement result file: environment, configuration, synthetic model and phase rows, with a
//! schema tag; written once, atomically, never over an existing file.

use super::table::{phase_cells, PHASE_COLUMNS, PHASE_WIDTHS};
use super::{ConfigError, MeasureConfig, PhaseRecord, RowPrediction, SyntheticModel};
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
    /// Free device memory the runtime reported once this process had started CUDA, before the
    /// first phase (absent from files written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_free_at_start_bytes: Option<u64>,
    /// The allocator model the phases' `prediction` blocks come from, or why none was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelComparison>,
}

/// Which model predicted the figures recorded beside the measurement, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelComparison {
    /// The model and its scope (`allocator::predict::MODEL`).
    pub model: String,
    /// The architecture the prediction used, from the measured GPU.
    pub compute_capability: Option<String>,
    /// The workspaces the prediction used.
    pub workspaces: Option<crate::allocator::Workspaces>,
    /// Why no prediction was made (unknown architecture, a setting the model does not cover).
    pub not_predicted: Option<String>,
    /// Phase rows whose six figures all match the prediction to the byte.
    pub exact_rows: usize,
    /// Phase rows in all.
    pub rows: usize,
}

impl crate::files::Tagged for Measurement {
    const SCHEMA: &'static str = SCHEMA;
    const KIND: crate::files::Input = crate::files::Input::Measurement;
    fn schema(&self) -> &str {
        &self.schema
    }
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
            runtime_free_at_start_bytes: None,
            model: None,
        })
    }

    /// Predicts every row with the allocator model for the measured GPU's architecture and
    /// `settings` (those of the process that measured), and records, per row, the prediction and
    /// the residual. Without a prediction it records why: a residual is never hidden or invented.
    pub fn attach_prediction(
        &mut self,
        settings: Result<
            crate::allocator::WorkspaceSettings,
            crate::allocator::workspace::WorkspaceError,
        >,
    ) {
        let cc = self
            .environment
            .device
            .as_ref()
            .map(|d| d.compute_capability.clone());
        let outcome = settings
            .map_err(|e| e.to_string())
            .and_then(|settings| self.model_prediction(&settings));
        let rows = self.phases.len();
        self.model = Some(match outcome {
            Ok(p) => {
                for (row, predicted) in self.phases.iter_mut().zip(&p.phases) {
                    row.prediction = Some(RowPrediction {
                        figures: predicted.figures,
                        residual: row.figures.residual(&predicted.figures),
                    });
                }
                ModelComparison {
                    model: p.model,
                    compute_capability: cc,
                    workspaces: Some(p.workspaces),
                    not_predicted: None,
                    exact_rows: self
                        .phases
                        .iter()
                        .filter(|r| r.prediction.as_ref().is_some_and(|p| p.residual.is_zero()))
                        .count(),
                    rows,
                }
            }
            Err(why) => ModelComparison {
                model: super::predict::MODEL.into(),
                compute_capability: cc,
                workspaces: None,
                not_predicted: Some(why),
                exact_rows: 0,
                rows,
            },
        });
    }

    /// The allocator model's prediction for this measurement's configuration on its GPU's
    /// architecture, under `settings`; or why there is none.
    pub fn model_prediction(
        &self,
        settings: &crate::allocator::WorkspaceSettings,
    ) -> Result<super::Prediction, String> {
        use crate::allocator::{ComputeCapability, Workspaces};
        let cc: ComputeCapability = self
            .environment
            .device
            .as_ref()
            .ok_or("the measured GPU's architecture is not in the environment")?
            .compute_capability
            .parse()
            .map_err(|e: crate::allocator::workspace::WorkspaceError| e.to_string())?;
        let workspaces = Workspaces::for_gpu(cc, settings).map_err(|e| e.to_string())?;
        super::predict(&self.configuration, cc, workspaces).map_err(|e| e.to_string())
    }

    /// Reads a measurement file written by `measure` (a regular file of at most
    /// [`crate::files::Input::Measurement`]'s limit) and checks its schema tag.
    pub fn load(path: &Path) -> Result<Measurement, crate::files::JsonError> {
        let m: Measurement = crate::files::load_tagged(path)?;
        m.checked(&path.display().to_string())
    }

    /// Parses measurement bytes read from `file` and checks the schema tag.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Measurement, crate::files::JsonError> {
        let m: Measurement = crate::files::parse_tagged(bytes, file)?;
        m.checked(file)
    }

    /// The measurement, if it is one `measure` can write: at least one phase, each with figures
    /// the caching allocator can give and times that are durations.
    fn checked(self, file: &str) -> Result<Measurement, crate::files::JsonError> {
        let invalid = |message: String| {
            crate::files::JsonError::invalid(file, crate::files::Input::Measurement, message)
        };
        if self.phases.is_empty() {
            return Err(invalid("`phases`: none".into()));
        }
        for (i, p) in self.phases.iter().enumerate() {
            if !p.figures.is_consistent() {
                return Err(invalid(format!(
                    "`phases[{i}]` ({}): {}",
                    p.phase.name(),
                    crate::reading::Figures::INCONSISTENT
                )));
            }
            for (field, ms) in [
                ("host_wall_time_ms", p.host_wall_time_ms),
                ("gpu_event_time_ms", p.gpu_event_time_ms),
            ] {
                if !(ms.is_finite() && ms >= 0.0) {
                    return Err(invalid(format!(
                        "`phases[{i}].{field}` = {ms}: not a duration"
                    )));
                }
            }
        }
        Ok(self)
    }

    /// The measured GPU's name, as the environment recorded it.
    pub fn gpu_name(&self) -> &str {
        self.environment.gpu_name()
    }

    /// The largest `peak_allocated_bytes` over all phases.
    pub fn max_peak_allocated(&self) -> Bytes {
        Bytes(
            self.phases
                .iter()
                .map(|p| p.figures.peak_allocated_bytes)
                .max()
                .unwrap_or(0),
        )
    }

    /// The largest `peak_reserved_bytes` over all phases.
    pub fn max_peak_reserved(&self) -> Bytes {
        Bytes(
            self.phases
                .iter()
                .map(|p| p.figures.peak_reserved_bytes)
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
            c.hidden(),
            c.dtype.name(),
            m.parameters,
            m.parameter_size()
        )?;
        let mut rows = Vec::new();
        for p in &self.phases {
            rows.push(phase_cells(p).to_vec());
            if let Some(pred) = &p.prediction {
                for (what, values) in pred.cells() {
                    let mut cells = vec![format!("  {what}"), String::new()];
                    cells.extend(values);
                    rows.push(cells);
                }
            }
        }
        let table = crate::markup::Table::new(&PHASE_COLUMNS, rows).with_min_widths(&PHASE_WIDTHS);
        write!(f, "{table}")?;
        if let Some(m) = &self.model {
            match &m.not_predicted {
                None => writeln!(
                    f,
                    "Model ({}): {} of {} rows exact to the byte; residual = measured − predicted.",
                    m.model, m.exact_rows, m.rows
                )?,
                Some(why) => writeln!(f, "Model ({}): no prediction: {why}", m.model)?,
            }
        }
        write!(
            f,
            "Bytes are the caching allocator's own counters; see `notes` in the JSON for their scope."
        )
    }
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
