//! What one run of the lesson recorded (`mesure_memoire lesson --output FILE.json`): the
//! environment, the allocator settings the process ran under, and after every step the four
//! counters and `requested` ([`StepReading`]), the allocator's statistics ([`DeviceStats`]) and its
//! map (segments and blocks, from its own snapshot). The program that measured also records the
//! allocator model's figures for every step, so that a reader without the model (the GPU proof
//! script) can compare them; a notebook replays the model itself.

use super::script::{LessonScript, Resolved, Step};
use super::LessonModel;
use crate::allocator::ComputeCapability;
use crate::allocator::{size::LARGE_BUFFER, SegmentView};
use crate::environment::EnvironmentReport;
use crate::files::JsonError;
use crate::reading::{DeviceStats, StepReading};
use crate::status::{Classify, Status};
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::path::Path;

/// The schema tag of a lesson record.
pub const LESSON_SCHEMA: &str = "iteragpu-lab/lesson/v1";
/// The file name of the lesson recorded on an H200 with PyTorch's default settings (in `data/`).
pub const RECORDED_DEFAULT: &str = "exemple-lecon-h200.json";
/// The file name of the same lesson recorded with `expandable_segments:True` (in `data/`).
pub const RECORDED_EXPANDABLE: &str = "exemple-lecon-h200-expandable.json";
/// The variable through which the allocator's configuration reaches the GPU process (the only
/// variable a lesson record reads from the environment).
pub const ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
/// Its value for expandable segments.
pub const EXPANDABLE_SEGMENTS: &str = "expandable_segments:True";

/// The settings the caching allocator itself reports it runs with (read from the allocator, not
/// from the environment: whichever variable set them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatorSettings {
    /// `expandable_segments` as the allocator uses it.
    pub expandable_segments: bool,
    /// The size of a large-pool segment for requests between 1 and 10 MiB (and of a large-pool
    /// page with expandable segments): 20 MiB by default.
    pub large_segment_size: u64,
    /// The largest block that may be split; `None`: unlimited (the default).
    pub max_split_size: Option<u64>,
    /// The configuration text the allocator parsed, empty when it parsed none.
    pub parsed: String,
}

impl AllocatorSettings {
    /// PyTorch's defaults, the only settings the allocator model covers.
    pub fn is_default(&self) -> bool {
        !self.expandable_segments
            && self.large_segment_size == LARGE_BUFFER
            && self.max_split_size.is_none()
            && self.parsed.is_empty()
    }
}

/// The figures after one step (or at the start, before any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRecord {
    /// The step; `None` for the starting point.
    pub step: Option<Step>,
    /// What a step sized from the free memory asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<Resolved>,
    /// The counters after the step; `reading.step` is its label.
    pub reading: StepReading,
    /// The allocator's statistics after the step.
    pub stats: DeviceStats,
    /// The allocator's map after the step, every live block named after the lesson's tensor it
    /// holds (`cublas_workspace` for the workspace of the first product).
    pub map: Vec<SegmentView>,
}

/// The model's figures for one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictedStep {
    pub reading: StepReading,
    pub stats: DeviceStats,
}

/// The allocator model's figures for every step of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LessonPrediction {
    /// Which model and under which assumptions (the architecture, PyTorch's default settings).
    pub source: String,
    pub steps: Vec<PredictedStep>,
}

/// One run of the lesson on a GPU, in one fresh process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LessonRecord {
    pub schema: String,
    pub recorded_at: String,
    /// The environment, reported when the lesson started.
    pub environment: EnvironmentReport,
    /// `PYTORCH_CUDA_ALLOC_CONF` as the GPU process saw it; `None`: unset.
    pub allocator_configuration: Option<String>,
    /// What the allocator itself reported it runs with.
    pub allocator_settings: AllocatorSettings,
    /// The starting point, then one record per step of the script.
    pub steps: Vec<StepRecord>,
    /// The model's figures for every step, when the model covers this run.
    #[serde(default)]
    pub prediction: Option<LessonPrediction>,
    /// Why there is no prediction.
    #[serde(default)]
    pub not_predicted: Option<String>,
}

impl crate::files::Tagged for LessonRecord {
    const SCHEMA: &'static str = LESSON_SCHEMA;
    const KIND: crate::files::Input = crate::files::Input::Lesson;
    fn schema(&self) -> &str {
        &self.schema
    }
}

/// `PYTORCH_CUDA_ALLOC_CONF` set to something other than what `--expandable-segments` needs.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ALLOC_CONF} is already set to `{0}`: --expandable-segments needs `{EXPANDABLE_SEGMENTS}` \
     and does not merge settings; unset it or set it to `{EXPANDABLE_SEGMENTS}`"
)]
pub struct AllocConfConflict(pub String);

impl Classify for AllocConfConflict {
    fn status(&self) -> Status {
        Status::Usage
    }
}

/// What to set `PYTORCH_CUDA_ALLOC_CONF` to in the GPU process's environment for a lesson with
/// (`expandable`) or without expandable segments, given its value here (`current`): `Some` value
/// to set, `None` to leave the environment as it is; refused when the variable already holds
/// something else than what `--expandable-segments` needs.
pub fn alloc_conf_for(
    expandable: bool,
    current: Option<&OsStr>,
) -> Result<Option<&'static str>, AllocConfConflict> {
    match (expandable, current) {
        (false, _) => Ok(None),
        (true, None) => Ok(Some(EXPANDABLE_SEGMENTS)),
        (true, Some(v)) if v == EXPANDABLE_SEGMENTS => Ok(None),
        (true, Some(v)) => Err(AllocConfConflict(v.to_string_lossy().into_owned())),
    }
}

impl LessonRecord {
    /// A record made now from its parts, with the model's figures when it covers the run.
    pub fn new(
        environment: EnvironmentReport,
        allocator_configuration: Option<String>,
        allocator_settings: AllocatorSettings,
        steps: Vec<StepRecord>,
    ) -> LessonRecord {
        let mut r = LessonRecord {
            schema: LESSON_SCHEMA.into(),
            recorded_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string(),
            environment,
            allocator_configuration,
            allocator_settings,
            steps,
            prediction: None,
            not_predicted: None,
        };
        match r.model() {
            Ok(m) => {
                r.prediction = Some(LessonPrediction {
                    source: m.log.source.clone().unwrap_or_default(),
                    steps: m
                        .log
                        .steps
                        .into_iter()
                        .zip(m.stats)
                        .map(|(reading, stats)| PredictedStep { reading, stats })
                        .collect(),
                })
            }
            Err(why) => r.not_predicted = Some(why),
        }
        r
    }

    /// Reads a lesson file written by `mesure_memoire lesson` (a regular file within a
    /// measurement's size limit) and checks its schema tag.
    pub fn load(path: &Path) -> Result<LessonRecord, JsonError> {
        let bytes = crate::files::read_capped(path, crate::files::Input::Lesson)?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// Reads a lesson recorded on another machine for a notebook to show: a missing file is said
    /// to be missing, not recorded yet.
    pub fn load_recording(path: &Path) -> Result<LessonRecord, String> {
        use crate::files::ReadError;
        Self::load(path).map_err(|e| match e {
            JsonError::Read(ReadError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                "it is missing, not recorded yet (scripts/gpu/lesson-proof.py records it on a GPU \
                 machine)"
                    .to_string()
            }
            e => e.to_string(),
        })
    }

    /// Parses lesson bytes read from `file`.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<LessonRecord, JsonError> {
        let invalid =
            |message: String| JsonError::invalid(file, crate::files::Input::Lesson, message);
        let r: LessonRecord = crate::files::parse_tagged(bytes, file)?;
        if r.steps.first().is_none_or(|s| s.step.is_some()) {
            return Err(invalid("it does not start with the starting point".into()));
        }
        if let Some(i) = r.steps.iter().skip(1).position(|s| s.step.is_none()) {
            return Err(invalid(format!("step {} has no operation", i + 2)));
        }
        Ok(r)
    }

    /// `PYTORCH_CUDA_ALLOC_CONF` as the run had it: `unset`, or its value in backquotes.
    pub fn configuration_shown(&self) -> String {
        self.allocator_configuration
            .as_deref()
            .map_or("unset".to_string(), |c| format!("`{c}`"))
    }

    /// The measured GPU's name, as the environment recorded it.
    pub fn gpu_name(&self) -> &str {
        self.environment.gpu_name()
    }

    /// The script this record ran.
    pub fn script(&self) -> LessonScript {
        LessonScript {
            steps: self.steps.iter().filter_map(|s| s.step.clone()).collect(),
        }
    }

    /// The readings as a log headed by `source`.
    pub fn log(&self, source: &str) -> crate::reading::StepLog {
        crate::reading::StepLog {
            steps: self.steps.iter().map(|s| s.reading.clone()).collect(),
            source: Some(source.to_string()),
        }
    }

    /// Why the allocator model does not cover this run, if it does not: it covers PyTorch's
    /// default settings and `expandable_segments:True`, nothing else.
    pub fn why_not_predicted(&self) -> Option<String> {
        let s = &self.allocator_settings;
        let expandable_only = self.allocator_configuration.as_deref() == Some(EXPANDABLE_SEGMENTS)
            && s.expandable_segments
            && s.large_segment_size == LARGE_BUFFER
            && s.max_split_size.is_none();
        if expandable_only || (self.allocator_configuration.is_none() && s.is_default()) {
            return None;
        }
        Some(format!(
            "the allocator model covers PyTorch's default settings and `{EXPANDABLE_SEGMENTS}` \
             only, and this run had {ALLOC_CONF} {} (the allocator reported settings `{}`, \
             expandable segments {}, max_split_size {:?}, large segment {} bytes): no prediction",
            self.configuration_shown(),
            s.parsed,
            s.expandable_segments,
            s.max_split_size,
            s.large_segment_size
        ))
    }

    /// The lesson replayed on the allocator model, on the recorded GPU's architecture, every step
    /// sized as it ran; or why there is none.
    pub fn model(&self) -> Result<LessonModel, String> {
        if let Some(why) = self.why_not_predicted() {
            return Err(why);
        }
        let cc: ComputeCapability = self
            .environment
            .device
            .as_ref()
            .ok_or("the GPU's architecture is not in the environment: no prediction")?
            .compute_capability
            .parse()
            .map_err(|e: crate::allocator::workspace::WorkspaceError| e.to_string())?;
        let mut m =
            LessonModel::with_expandable_segments(cc, self.allocator_settings.expandable_segments)
                .map_err(|e| e.to_string())?;
        for s in self.steps.iter().skip(1) {
            let Some(step) = &s.step else {
                return Err("a step without its operation".into());
            };
            m.run(step, s.resolved.as_ref(), &s.reading.step)?;
        }
        Ok(m)
    }

    /// The steps whose measured counters, `requested`, segments and statistics all equal the
    /// model's (of those predicted), as (equal, predicted); `None` without a prediction.
    pub fn exact_steps(&self) -> Option<(usize, usize)> {
        let m = self.model().ok()?;
        let equal = self
            .steps
            .iter()
            .zip(m.log.steps.iter().zip(&m.stats))
            .filter(|(s, (p, stats))| same_figures(&s.reading, p) && s.stats == **stats)
            .count();
        Some((equal, m.log.steps.len()))
    }
}

impl std::fmt::Display for LessonRecord {
    /// One line per step: its figures after it, and whether the model predicted them exactly.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Lesson on {} ({ALLOC_CONF} {}), bytes:",
            self.gpu_name(),
            self.configuration_shown()
        )?;
        let predicted = self.prediction.as_ref().map(|p| &p.steps);
        let rows = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let r = &s.reading;
                let model = match predicted.and_then(|p| p.get(i)) {
                    Some(p) if same_figures(r, &p.reading) && s.stats == p.stats => "equal",
                    Some(_) => "DIFFERS",
                    None => "-",
                };
                let mut row = vec![format!("  {}. {}", i + 1, r.step)];
                row.extend(
                    [
                        r.allocated,
                        r.reserved,
                        r.peak_allocated,
                        r.peak_reserved,
                        s.stats.segments,
                        s.stats.alloc_retries,
                    ]
                    .map(|v| v.to_string()),
                );
                row.push(model.to_string());
                row
            })
            .collect();
        let header = [
            "  step",
            "allocated",
            "reserved",
            "peak alloc.",
            "peak reserved",
            "segments",
            "retries",
            "model",
        ];
        let table = crate::markup::Table::new(&header, rows)
            .with_min_widths(&[62, 14, 14, 14, 14, 8, 7, 5])
            .with_left(&[0, 7]);
        write!(f, "{table}")?;
        if let Some(why) = &self.not_predicted {
            writeln!(f, "  {why}")?;
        }
        Ok(())
    }
}

/// Whether two readings agree on every figure the model predicts (not the runtime's view).
pub fn same_figures(a: &StepReading, b: &StepReading) -> bool {
    (
        a.allocated,
        a.reserved,
        a.peak_allocated,
        a.peak_reserved,
        a.requested,
        a.segments,
    ) == (
        b.allocated,
        b.reserved,
        b.peak_allocated,
        b.peak_reserved,
        b.requested,
        b.segments,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_are_set_only_where_nothing_else_is() {
        assert_eq!(alloc_conf_for(false, None).unwrap(), None);
        assert_eq!(
            alloc_conf_for(false, Some(OsStr::new("max_split_size_mb:64"))).unwrap(),
            None
        );
        assert_eq!(
            alloc_conf_for(true, None).unwrap(),
            Some(EXPANDABLE_SEGMENTS)
        );
        assert_eq!(
            alloc_conf_for(true, Some(OsStr::new(EXPANDABLE_SEGMENTS))).unwrap(),
            None
        );
        let e = alloc_conf_for(true, Some(OsStr::new("expandable_segments:False"))).unwrap_err();
        assert!(e.to_string().contains("`expandable_segments:False`"));
        assert_eq!(e.status(), Status::Usage);
    }
}
