//! A sweep's files: `sweep.csv`, one row per point rewritten atomically after each point (it reads
//! cleanly in pandas), the measurements beside it, and `sweep.json`, the summary with the
//! environment once. An existing folder with results is continued only on request (`resume`).

use super::{Dimension, PointOutcome, PointRunner, PointStatus};
use crate::allocator::{ComputeCapability, Workspaces};
use crate::environment::EnvironmentReport;
use crate::files::{self, WriteError};
use crate::measure::predict;
use crate::measure::{MeasureConfig, Measurement};
use crate::reading::Figures;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The rows, one per point.
pub const CSV_FILE: &str = "sweep.csv";
/// The summary.
pub const SUMMARY_FILE: &str = "sweep.json";

/// One point of a sweep, as a CSV row (columns in field order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// The varied dimension and its value at this point.
    pub dimension: Dimension,
    pub value: u64,
    /// `ok`, `oom` or `error`.
    pub status: PointStatus,
    /// The phase that ran out of memory (status `oom`), when known.
    pub oom_phase: String,
    /// The failure's message (status `oom` or `error`).
    pub message: String,
    pub batch: u64,
    pub context: u64,
    pub width: u64,
    pub hidden: u64,
    pub dtype: String,
    /// The phase whose allocated peak is the highest, and its six figures (status `ok`).
    pub peak_phase: String,
    pub allocated_baseline_bytes: Option<u64>,
    pub allocated_end_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    pub reserved_baseline_bytes: Option<u64>,
    pub reserved_end_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// The model's highest allocated and reserved peaks over the phases (any status).
    pub predicted_peak_allocated_bytes: Option<u64>,
    pub predicted_peak_reserved_bytes: Option<u64>,
    /// Free device memory the runtime reported when the point's process had started CUDA.
    pub runtime_free_at_start_bytes: Option<u64>,
    /// Device memory the point's process took outside the allocator after its CUDA context
    /// started (cuBLAS and the other libraries): runtime used at its end − used at its start −
    /// its allocator's reserved bytes at its end.
    pub libraries_outside_allocator_bytes: Option<u64>,
    /// Seconds from handing the point to its process (started ahead, its libraries loaded while
    /// the point before ran) to that process's exit; about 0 for a point recorded on resume from
    /// the measurement file its process had written.
    pub seconds: f64,
    /// The measurement file, relative to the sweep's folder (status `ok`).
    pub measurement_file: String,
}

/// What `sweep.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub schema: String,
    pub dimension: Dimension,
    pub from: u64,
    pub to: u64,
    /// The fixed dimensions (the varied one at `from`).
    pub configuration: MeasureConfig,
    /// The environment of the first measured point.
    pub environment: Option<EnvironmentReport>,
    /// Points measured, out of memory, failed.
    pub points: usize,
    pub out_of_memory: usize,
    pub failed: usize,
    /// The limit search, when asked for.
    pub limit: Option<super::LimitSearch>,
    pub notes: Vec<String>,
}

/// Identifies the summary layout.
pub const SCHEMA: &str = "iteragpu-lab/sweep/v1";

impl files::Tagged for SweepSummary {
    const SCHEMA: &'static str = SCHEMA;
    const KIND: files::Input = files::Input::Sweep;
    fn schema(&self) -> &str {
        &self.schema
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(
        "{0} already holds sweep results: they are never overwritten; continue them with \
         --resume or choose a new folder"
    )]
    Exists(PathBuf),
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error("cannot read {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Read(#[from] files::ReadError),
    #[error(transparent)]
    Json(#[from] files::JsonError),
    #[error("interrupted: {done} point(s) kept in {folder}; continue with --resume")]
    Interrupted { done: usize, folder: PathBuf },
    #[error(transparent)]
    Plan(#[from] super::PlanError),
    /// A point's process found no usable GPU or libtorch: nothing measured, no row written.
    #[error("{0} — nothing was measured, no row written, no CPU fallback")]
    Unavailable(String),
}

impl crate::status::Classify for SweepError {
    fn status(&self) -> crate::status::Status {
        use crate::status::Status;
        match self {
            SweepError::Exists(_) => Status::OutputExists,
            SweepError::Invalid { .. } => Status::DataError,
            SweepError::Io { .. } => Status::Failure,
            SweepError::Write(e) => e.status(),
            SweepError::Read(e) => e.status(),
            SweepError::Json(e) => e.status(),
            SweepError::Interrupted { .. } => Status::Interrupted,
            SweepError::Plan(e) => e.status(),
            SweepError::Unavailable(_) => Status::Unavailable,
        }
    }
}

/// A sweep in progress: its folder, its rows so far, and what predicts its points.
pub struct Sweep {
    pub folder: PathBuf,
    pub dimension: Dimension,
    pub base: MeasureConfig,
    pub rows: Vec<SweepRow>,
    pub summary: SweepSummary,
    /// The architecture and workspaces the predictions use, once known (from the first point's
    /// environment, or given).
    pub model: Option<(ComputeCapability, Workspaces)>,
    /// Whether this sweep made its folder.
    created: bool,
}

impl Sweep {
    /// Opens `folder` for a sweep of `dimension` from `from` to `to` over `base`: creates it, or
    /// with `resume` reads the rows already there (refusing a folder of another sweep).
    pub fn open(
        folder: &Path,
        dimension: Dimension,
        from: u64,
        to: u64,
        base: &MeasureConfig,
        resume: bool,
    ) -> Result<Sweep, SweepError> {
        let csv_path = folder.join(CSV_FILE);
        let summary = SweepSummary {
            schema: SCHEMA.into(),
            dimension,
            from,
            to,
            configuration: dimension.apply(base, from),
            environment: None,
            points: 0,
            out_of_memory: 0,
            failed: 0,
            limit: None,
            notes: vec![
                "Each point ran in its own process: no cache or allocator state crossed points."
                    .into(),
                "Figures are the caching allocator's own, of the phase with the highest allocated \
                 peak; predicted figures come from the allocator model (docs/allocator-model.md)."
                    .into(),
            ],
        };
        let mut sweep = Sweep {
            folder: folder.to_path_buf(),
            dimension,
            base: base.clone(),
            rows: Vec::new(),
            summary,
            model: None,
            created: false,
        };
        let io = |source| SweepError::Io {
            file: folder.display().to_string(),
            source,
        };
        if !folder.exists() {
            std::fs::create_dir(folder).map_err(io)?;
            sweep.created = true;
            return Ok(sweep);
        }
        let has_results = csv_path.exists() || folder.join(SUMMARY_FILE).exists();
        if !has_results {
            return Ok(sweep);
        }
        if !resume {
            return Err(SweepError::Exists(folder.to_path_buf()));
        }
        let invalid = |path: &Path, message: String| SweepError::Invalid {
            file: path.display().to_string(),
            message,
        };
        // The sweep's files are read and rewritten in its folder only: never through a link.
        for name in [CSV_FILE, SUMMARY_FILE] {
            let path = folder.join(name);
            if path
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
            {
                return Err(invalid(
                    &path,
                    "is a symbolic link: a sweep's files are read and rewritten only inside its \
                     folder"
                        .into(),
                ));
            }
        }
        // Continued only with the fixed sizes and passes it was made with.
        let summary_path = folder.join(SUMMARY_FILE);
        if summary_path.exists() {
            let made: SweepSummary = files::load_tagged(&summary_path)?;
            let (was, now) = (
                dimension.apply(&made.configuration, from),
                dimension.apply(base, from),
            );
            if made.dimension != dimension || !same_measurement(&was, &now) {
                return Err(invalid(
                    &summary_path,
                    format!(
                        "the sweep was made over {} with batch {}, context {}, width {}, hidden \
                         {}, {}, warm-up {}, repeats {}; this one differs",
                        made.dimension,
                        was.batch,
                        was.context,
                        was.width,
                        was.hidden(),
                        was.dtype,
                        was.warmup,
                        was.repeats
                    ),
                ));
            }
        }
        let bytes = files::read_capped(&csv_path, files::Input::Sweep)?;
        let mut reader = csv::Reader::from_reader(bytes.as_slice());
        for row in reader.deserialize::<SweepRow>() {
            let row = row.map_err(|e| invalid(&csv_path, e.to_string()))?;
            if let Some(problem) = row.problem() {
                return Err(invalid(
                    &csv_path,
                    format!("its row for {} = {}: {problem}", row.dimension, row.value),
                ));
            }
            if sweep.rows.iter().any(|r| r.value == row.value) {
                return Err(invalid(
                    &csv_path,
                    format!("two rows for {} = {}", row.dimension, row.value),
                ));
            }
            let expected = dimension.apply(base, row.value);
            if row.dimension != dimension
                || row.batch != expected.batch
                || row.context != expected.context
                || row.width != expected.width
                || row.hidden != expected.hidden()
                || row.dtype != expected.dtype.name()
            {
                return Err(invalid(
                    &csv_path,
                    format!(
                        "its row for {} = {} is of another sweep (dimension or fixed sizes differ)",
                        row.dimension, row.value
                    ),
                ));
            }
            sweep.rows.push(row);
        }
        sweep.recount();
        Ok(sweep)
    }

    /// Reads a finished or interrupted sweep from its folder (for charts and reports).
    pub fn load(folder: &Path) -> Result<Sweep, SweepError> {
        let summary: SweepSummary = files::load_tagged(&folder.join(SUMMARY_FILE))?;
        let mut sweep = Sweep::open(
            folder,
            summary.dimension,
            summary.from,
            summary.to,
            &summary.configuration,
            true,
        )?;
        sweep.summary = summary;
        Ok(sweep)
    }

    /// The measured GPU's name, as the sweep's environment recorded it.
    pub fn gpu_name(&self) -> &str {
        self.summary
            .environment
            .as_ref()
            .map_or(crate::environment::UNKNOWN_GPU, EnvironmentReport::gpu_name)
    }

    /// The row already measured for `value`, if any.
    pub fn row(&self, value: u64) -> Option<&SweepRow> {
        self.rows.iter().find(|r| r.value == value)
    }

    fn recount(&mut self) {
        let count = |s: PointStatus| self.rows.iter().filter(|r| r.status == s).count();
        self.summary.points = self.rows.len();
        self.summary.out_of_memory = count(PointStatus::Oom);
        self.summary.failed = count(PointStatus::Error);
    }

    /// The model's peaks for `config`, when the architecture is known.
    fn predicted(&self, config: &MeasureConfig) -> Option<(u64, u64)> {
        let (cc, ws) = self.model?;
        let p = predict(config, cc, ws).ok()?;
        Some((p.max_peak_allocated(), p.max_peak_reserved()))
    }

    /// What measuring `value` needs: its configuration, and its measurement file's name in the
    /// sweep's folder.
    pub fn point(&self, value: u64) -> (MeasureConfig, String) {
        (
            self.dimension.apply(&self.base, value),
            format!("point-{}-{value}.json", self.dimension),
        )
    }

    /// Measures `value` through `runner` (or returns the row already there), records the row and
    /// rewrites `sweep.csv` and `sweep.json` atomically. `None`: interrupted, nothing recorded.
    pub fn measure(
        &mut self,
        runner: &mut dyn PointRunner,
        value: u64,
    ) -> Result<Option<SweepRow>, SweepError> {
        if let Some(row) = self.row(value) {
            return Ok(Some(row.clone()));
        }
        if let Some(outcome) = self.written_earlier(value) {
            return self.record(value, outcome, 0.0);
        }
        let (config, file) = self.point(value);
        let started = Instant::now();
        let outcome = runner.run(&config, &self.folder.join(&file));
        self.record(value, outcome, started.elapsed().as_secs_f64())
    }

    /// The measurement of `value` already in the folder without its row: its process completed
    /// and wrote it, but the sweep stopped (killed) before recording it. Resuming records it
    /// rather than measuring again; a file of another configuration is left for the companion
    /// to refuse.
    pub fn written_earlier(&self, value: u64) -> Option<PointOutcome> {
        let (config, file) = self.point(value);
        let m = Measurement::load(&self.folder.join(file)).ok()?;
        let same = MeasureConfig {
            device: m.configuration.device,
            ..config
        } == m.configuration;
        same.then(|| PointOutcome::Measured(Box::new(m)))
    }

    /// Records how the point `value` ended (see [`Sweep::point`]), and rewrites the files.
    /// `None`: interrupted, nothing recorded. A point that found no GPU stops the sweep
    /// ([`SweepError::Unavailable`]), recording nothing; a folder this sweep made, still empty, is
    /// removed.
    pub fn record(
        &mut self,
        value: u64,
        outcome: PointOutcome,
        seconds: f64,
    ) -> Result<Option<SweepRow>, SweepError> {
        if let PointOutcome::Unavailable(why) = outcome {
            if self.created && self.rows.is_empty() {
                let _ = std::fs::remove_dir(&self.folder);
            }
            return Err(SweepError::Unavailable(why));
        }
        let (config, file) = self.point(value);
        let Some(row) = self.row_of(&config, value, outcome, seconds, file) else {
            return Ok(None);
        };
        self.rows.push(row.clone());
        self.rows.sort_by_key(|r| r.value);
        self.recount();
        self.save()?;
        Ok(Some(row))
    }

    fn row_of(
        &mut self,
        config: &MeasureConfig,
        value: u64,
        outcome: PointOutcome,
        seconds: f64,
        file: String,
    ) -> Option<SweepRow> {
        if let PointOutcome::Measured(m) = &outcome {
            self.learn(m);
        }
        let predicted = self.predicted(config);
        let mut row = SweepRow::blank(self.dimension, value, config);
        row.predicted_peak_allocated_bytes = predicted.map(|p| p.0);
        row.predicted_peak_reserved_bytes = predicted.map(|p| p.1);
        row.seconds = seconds;
        match outcome {
            PointOutcome::Interrupted | PointOutcome::Unavailable(_) => return None,
            PointOutcome::OutOfMemory { phase, message } => {
                row.status = PointStatus::Oom;
                row.oom_phase = phase.unwrap_or_default();
                row.message = message;
            }
            PointOutcome::Failed(message) => {
                row.status = PointStatus::Error;
                row.message = message;
            }
            PointOutcome::Measured(m) => {
                row.status = PointStatus::Ok;
                row.measurement_file = file;
                if let Some(p) = m
                    .phases
                    .iter()
                    .max_by_key(|p| p.figures.peak_allocated_bytes)
                {
                    let f: Figures = p.figures;
                    row.peak_phase = p.phase.name().into();
                    row.allocated_baseline_bytes = Some(f.allocated_baseline_bytes);
                    row.allocated_end_bytes = Some(f.allocated_end_bytes);
                    row.peak_allocated_bytes = Some(f.peak_allocated_bytes);
                    row.reserved_baseline_bytes = Some(f.reserved_baseline_bytes);
                    row.reserved_end_bytes = Some(f.reserved_end_bytes);
                    row.peak_reserved_bytes = Some(f.peak_reserved_bytes);
                }
                row.runtime_free_at_start_bytes = m.runtime_free_at_start_bytes;
                row.libraries_outside_allocator_bytes = libraries_outside_allocator(&m);
            }
        }
        Some(row)
    }

    /// Takes the environment and the model's inputs from the first measured point.
    fn learn(&mut self, m: &Measurement) {
        if self.summary.environment.is_none() {
            self.summary.environment = Some(m.environment.clone());
        }
        if self.model.is_none() {
            if let Some(model) = &m.model {
                if let (Some(cc), Some(ws)) = (&model.compute_capability, model.workspaces) {
                    if let Ok(cc) = cc.parse() {
                        self.model = Some((cc, ws));
                    }
                }
            }
        }
    }

    /// Writes `sweep.csv` and `sweep.json` whole, each by an atomic replace.
    pub fn save(&self) -> Result<(), SweepError> {
        let mut w = csv::WriterBuilder::new()
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(Vec::new());
        if self.rows.is_empty() {
            w.write_record(csv_header()).expect("writing to memory");
        }
        for row in &self.rows {
            w.serialize(row).expect("writing to memory");
        }
        let bytes = w.into_inner().expect("writing to memory");
        write_whole(&self.folder.join(CSV_FILE), &bytes)?;
        let mut json = serde_json::to_vec_pretty(&self.summary).expect("summary serializes");
        json.push(b'\n');
        write_whole(&self.folder.join(SUMMARY_FILE), &json)?;
        Ok(())
    }
}

/// Writes `path` whole and atomically: created the first time, replaced afterwards.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    if path.exists() {
        files::replace_file(path, bytes)
    } else {
        files::write_new_file(path, bytes)
    }
}

/// Whether two configurations measure the same network the same way (the device aside).
fn same_measurement(a: &MeasureConfig, b: &MeasureConfig) -> bool {
    (
        a.batch,
        a.context,
        a.width,
        a.hidden(),
        a.dtype,
        a.warmup,
        a.repeats,
    ) == (
        b.batch,
        b.context,
        b.width,
        b.hidden(),
        b.dtype,
        b.warmup,
        b.repeats,
    )
}

impl SweepRow {
    /// The six figures, when the row holds them all.
    pub fn figures(&self) -> Option<Figures> {
        Some(Figures {
            allocated_baseline_bytes: self.allocated_baseline_bytes?,
            allocated_end_bytes: self.allocated_end_bytes?,
            peak_allocated_bytes: self.peak_allocated_bytes?,
            reserved_baseline_bytes: self.reserved_baseline_bytes?,
            reserved_end_bytes: self.reserved_end_bytes?,
            peak_reserved_bytes: self.peak_reserved_bytes?,
        })
    }

    /// What no sweep writes: figures the caching allocator cannot give (a peak below the
    /// phase's start or end, reserved below allocated), or a measurement file outside the folder.
    fn problem(&self) -> Option<String> {
        match self.figures() {
            Some(f) if !f.is_consistent() => return Some(Figures::INCONSISTENT.into()),
            None if self.status == PointStatus::Ok => {
                return Some("a measured point without its six figures".into())
            }
            _ => {}
        }
        let m = &self.measurement_file;
        if m.contains(['/', '\\']) || m.starts_with('.') {
            return Some(format!(
                "measurement file `{}` is not a file of the folder",
                crate::text::printable(m)
            ));
        }
        None
    }

    /// The row of `value` for `config`, with no outcome, figure or time yet.
    pub fn blank(dimension: Dimension, value: u64, config: &MeasureConfig) -> SweepRow {
        SweepRow {
            dimension,
            value,
            status: PointStatus::Ok,
            oom_phase: String::new(),
            message: String::new(),
            batch: config.batch,
            context: config.context,
            width: config.width,
            hidden: config.hidden(),
            dtype: config.dtype.name().into(),
            peak_phase: String::new(),
            allocated_baseline_bytes: None,
            allocated_end_bytes: None,
            peak_allocated_bytes: None,
            reserved_baseline_bytes: None,
            reserved_end_bytes: None,
            peak_reserved_bytes: None,
            predicted_peak_allocated_bytes: None,
            predicted_peak_reserved_bytes: None,
            runtime_free_at_start_bytes: None,
            libraries_outside_allocator_bytes: None,
            seconds: 0.0,
            measurement_file: String::new(),
        }
    }
}

/// The CSV header, derived from [`SweepRow`]'s fields.
pub fn csv_header() -> Vec<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(SweepRow::blank(
        Dimension::Batch,
        0,
        &MeasureConfig::default(),
    ))
    .expect("writing to memory");
    let bytes = w.into_inner().expect("writing to memory");
    let mut r = csv::Reader::from_reader(bytes.as_slice());
    r.headers()
        .expect("a header")
        .iter()
        .map(String::from)
        .collect()
}

/// Device memory a measurement's process took outside its allocator after its CUDA context
/// started: the runtime's used memory at the end − at the start − the allocator's reserved bytes
/// at the end (`None` when the figures are missing or another process freed memory meanwhile).
pub fn libraries_outside_allocator(m: &Measurement) -> Option<u64> {
    let d = m.environment.device.as_ref()?;
    let free_start = m.runtime_free_at_start_bytes?;
    let reserved = m.phases.last()?.figures.reserved_end_bytes;
    free_start
        .checked_sub(d.runtime_free.0)?
        .checked_sub(reserved)
}

impl std::fmt::Display for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::units::Bytes;
        let c = &self.summary.configuration;
        writeln!(
            f,
            "Sweep of {} from {} to {}: batch {}, context {}, width {}, hidden {}, {}, warm-up {}, \
             repeats {}",
            self.dimension,
            self.summary.from,
            self.summary.to,
            c.batch,
            c.context,
            c.width,
            c.hidden(),
            c.dtype,
            c.warmup,
            c.repeats
        )?;
        let cell = |v: Option<u64>| v.map_or("-".to_string(), |b| Bytes(b).grouped());
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let status = match r.status {
                    PointStatus::Oom if !r.oom_phase.is_empty() => {
                        format!("oom ({})", r.oom_phase)
                    }
                    s => s.to_string(),
                };
                vec![
                    r.value.to_string(),
                    status,
                    cell(r.peak_allocated_bytes),
                    cell(r.peak_reserved_bytes),
                    cell(r.predicted_peak_reserved_bytes),
                    format!("{:.2}", r.seconds),
                ]
            })
            .collect();
        let header = [
            self.dimension.name(),
            "status",
            "peak allocated",
            "peak reserved",
            "predicted reserved",
            "seconds",
        ];
        let table = crate::markup::Table::new(&header, rows)
            .with_min_widths(&[12, 6, 18, 18, 18, 8])
            .with_left(&[1]);
        write!(f, "{table}")?;
        write!(
            f,
            "{} point(s): {} out of memory, {} failed; each in its own process.",
            self.summary.points, self.summary.out_of_memory, self.summary.failed
        )
    }
}
