//! The results grid `data/resultats-bruts.csv` (columns documented in `data/protocole-qualite.md`):
//! one row per actual run, tying a measurement file
//! and a package quote to the protocol's useful work, threshold and accepted results. Rows are
//! appended under a lock and atomically, existing rows are never rewritten, and a grid (also one
//! edited by hand) can be checked row by row.

use crate::catalog::{is_iso_date, Catalog, CatalogError, DURATIONS_DAYS};
use crate::device::CudaDevice;
use crate::files::{self, WriteError};
use crate::measure::{report::LoadError, Measurement};
use crate::quote::{quote, unit_cost, QuoteError};
use crate::sha256_hex;
use crate::status::{Classify, Status};
use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// Defines the row struct and the column list from one list of fields, so that the header, the
/// written cells and the checks can never disagree on names or order.
macro_rules! grid_columns {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// One row of the grid, every cell as the text written in the file (a grid edited by hand
        /// is read without losing a cell, then checked field by field). `data/protocole-qualite.md`
        /// documents the columns for the people who fill them.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct GridRow {
            $($(#[doc = $doc])* pub $field: String,)*
        }

        /// The grid's columns, in order: the header line, derived from [`GridRow`].
        pub const COLUMNS: &[&str] = &[$(stringify!($field)),*];

        impl GridRow {
            /// The cells in column order.
            pub fn cells(&self) -> Vec<&str> {
                vec![$(self.$field.as_str()),*]
            }
        }
    };
}

grid_columns! {
    /// When the measurement finished (RFC 3339, UTC), from the measurement file.
    measured_at_utc,
    /// Catalog key of the rented package, e.g. `b200`.
    gpu_model,
    /// The package's display name in the catalog.
    package_display_name,
    /// Package duration: 3, 7 or 30.
    duration_days,
    /// Lots rented.
    lots,
    /// lots × GPUs per lot.
    total_gpus,
    /// The measured device, `cuda:N`.
    device,
    /// The measured GPU's name, from the measurement's environment.
    gpu_name,
    /// float32, float16 or bfloat16.
    dtype,
    /// Input batch of the measurement.
    batch,
    /// Input context of the measurement.
    context,
    /// Network width of the measurement.
    width,
    /// Hidden features of the measurement.
    hidden,
    /// The measurement file as given.
    measurement_file,
    /// SHA-256 of the measurement file's bytes: a measurement is tied to one row.
    measurement_sha256,
    /// Largest allocated peak over the phases.
    max_peak_allocated_bytes,
    /// Largest reserved peak over the phases.
    max_peak_reserved_bytes,
    /// The useful work unit, fixed before the run.
    useful_work_unit,
    /// The acceptance threshold, fixed before the run.
    acceptance_threshold,
    /// Distinct useful results accepted under that threshold.
    accepted_results,
    /// Package price: lot price × lots, whole cents.
    total_price_usd_cents,
    /// total / accepted results, exact, rounded half away from zero to 6 decimals.
    unit_cost_usd,
    /// The catalog read.
    catalog_file,
    /// SHA-256 of the catalog's bytes.
    catalog_sha256,
    /// true when the catalog's prices are illustrative.
    catalog_illustrative,
    /// Free text, one line.
    notes,
}

impl GridRow {
    /// (column, cell) pairs in column order.
    pub fn named_cells(&self) -> Vec<(&'static str, String)> {
        COLUMNS
            .iter()
            .copied()
            .zip(self.cells().into_iter().map(String::from))
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GridError {
    #[error("cannot read {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Read(#[from] files::ReadError),
    #[error(transparent)]
    Measurement(#[from] LoadError),
    #[error(transparent)]
    Quote(#[from] QuoteError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("the {} must be {} on one line, got {value:?}", field.name(), if *field == TextField::Notes { "text" } else { "non-empty text" })]
    Text { field: TextField, value: String },
    #[error("{file} has problems; nothing was appended:\n{report}")]
    BrokenGrid { file: String, report: GridReport },
    #[error(
        "{file} already has a row for measurement {sha256} (line {line}): a measurement is tied \
         to one row; nothing was appended"
    )]
    Duplicate {
        file: String,
        sha256: String,
        line: u64,
    },
}

impl Classify for GridError {
    fn status(&self) -> Status {
        match self {
            GridError::Io { .. } => Status::Failure,
            GridError::Read(e) => e.status(),
            GridError::Measurement(e) => e.status(),
            GridError::Quote(e) => e.status(),
            GridError::Catalog(e) => e.status(),
            GridError::Write(e) => e.status(),
            GridError::Text { .. } => Status::Usage,
            GridError::BrokenGrid { .. } | GridError::Duplicate { .. } => Status::DataError,
        }
    }
}

/// The free-text fields a user supplies to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextField {
    UsefulWorkUnit,
    AcceptanceThreshold,
    Notes,
}

impl TextField {
    pub fn name(self) -> &'static str {
        match self {
            TextField::UsefulWorkUnit => "useful work unit",
            TextField::AcceptanceThreshold => "acceptance threshold",
            TextField::Notes => "notes",
        }
    }
}

/// One problem found in a grid.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    pub line: u64,
    pub column: String,
    pub message: String,
}

/// The result of checking a grid.
#[derive(Debug, Clone, Serialize)]
pub struct GridReport {
    pub file: String,
    pub rows: usize,
    pub problems: Vec<Problem>,
}

impl fmt::Display for GridReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.problems.is_empty() {
            return write!(f, "{}: {} row(s), no problem found", self.file, self.rows);
        }
        for p in &self.problems {
            writeln!(
                f,
                "{}, line {}, column `{}`: {}",
                self.file, p.line, p.column, p.message
            )?;
        }
        write!(
            f,
            "{} problem(s) in {} row(s)",
            self.problems.len(),
            self.rows
        )
    }
}

/// What the user supplies to append a row.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub measurement: PathBuf,
    pub gpu: String,
    pub days: u32,
    pub lots: u64,
    pub useful_work_unit: String,
    pub acceptance_threshold: String,
    pub accepted_results: u64,
    pub catalog: Option<PathBuf>,
    pub notes: String,
}

/// Appends one row built from `request` to the grid at `grid`: validated, refused if the grid is
/// broken or already holds this measurement, written under a lock and atomically. Returns the row.
pub fn append(grid: &Path, request: &AppendRequest) -> Result<GridRow, GridError> {
    for (field, value, required) in [
        (TextField::UsefulWorkUnit, &request.useful_work_unit, true),
        (
            TextField::AcceptanceThreshold,
            &request.acceptance_threshold,
            true,
        ),
        (TextField::Notes, &request.notes, false),
    ] {
        if (required && value.trim().is_empty()) || value.chars().any(char::is_control) {
            return Err(GridError::Text {
                field,
                value: value.clone(),
            });
        }
    }
    let bytes = files::read_capped(&request.measurement, files::Input::Measurement)?;
    let measurement = Measurement::from_bytes(&bytes, &request.measurement.display().to_string())?;
    let catalog = Catalog::load(request.catalog.as_deref())?;
    let q = quote(
        &catalog,
        &request.gpu,
        request.days,
        request.lots,
        Some(request.accepted_results),
    )?;
    let c = &measurement.configuration;
    let unit = q.unit_cost.as_ref().expect("accepted results were given");
    let row = GridRow {
        measured_at_utc: measurement.measured_at.clone(),
        gpu_model: q.model.clone(),
        package_display_name: q.display_name.clone(),
        duration_days: q.duration_days.to_string(),
        lots: q.lots.to_string(),
        total_gpus: q.total_gpus.to_string(),
        device: c.device.to_string(),
        gpu_name: measurement.gpu_name().to_string(),
        dtype: c.dtype.name().to_string(),
        batch: c.batch.to_string(),
        context: c.context.to_string(),
        width: c.width.to_string(),
        hidden: c.hidden().to_string(),
        measurement_file: request.measurement.display().to_string(),
        measurement_sha256: sha256_hex(&bytes),
        max_peak_allocated_bytes: measurement.max_peak_allocated().0.to_string(),
        max_peak_reserved_bytes: measurement.max_peak_reserved().0.to_string(),
        useful_work_unit: request.useful_work_unit.trim().to_string(),
        acceptance_threshold: request.acceptance_threshold.trim().to_string(),
        accepted_results: request.accepted_results.to_string(),
        total_price_usd_cents: q.total_usd_cents.0.to_string(),
        unit_cost_usd: unit.usd.to_string(),
        catalog_file: q.catalog.file.clone(),
        catalog_sha256: q.catalog.sha256.clone(),
        catalog_illustrative: q.catalog.illustrative.to_string(),
        notes: request.notes.trim().to_string(),
    };

    let _lock = lock(grid)?;
    files::remove_leftovers(grid);
    let current = files::read_capped(grid, files::Input::Grid)?;
    let file = grid.display().to_string();
    let report = check_bytes(&current, &file);
    if !report.problems.is_empty() {
        return Err(GridError::BrokenGrid { file, report });
    }
    if let Some(line) = find_measurement(&current, &row.measurement_sha256) {
        return Err(GridError::Duplicate {
            file,
            sha256: row.measurement_sha256.clone(),
            line,
        });
    }
    let mut next = current;
    if !next.is_empty() && !next.ends_with(b"\n") {
        next.push(b'\n');
    }
    next.extend_from_slice(&csv_line(&row.cells()));
    files::replace_file(grid, &next)?;
    Ok(row)
}

/// Copies the blank grid `blank` into a new temporary folder and returns the copy's path: a
/// scratch grid for demonstrations, so that the shipped grid stays blank.
pub fn scratch_copy(blank: &Path) -> Result<PathBuf, GridError> {
    let io = |source| GridError::Io {
        file: blank.display().to_string(),
        source,
    };
    let folder = tempfile::Builder::new()
        .prefix("iteragpu-grid-")
        .tempdir()
        .map_err(io)?
        .keep();
    let copy = folder.join(blank.file_name().unwrap_or("resultats-bruts.csv".as_ref()));
    std::fs::copy(blank, &copy).map_err(io)?;
    Ok(copy)
}

/// Holds an exclusive lock on `.NAME.lock` beside the grid until dropped (the grid itself is
/// replaced by each append, so it cannot carry the lock).
fn lock(grid: &Path) -> Result<std::fs::File, GridError> {
    let name = grid
        .file_name()
        .map_or("grid".into(), |n| n.to_string_lossy());
    let path = grid.with_file_name(format!(".{name}.lock"));
    let io = |source| GridError::Io {
        file: path.display().to_string(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| match files::check_folder(grid) {
            Err(missing) => GridError::Write(missing),
            Ok(()) => io(source),
        })?;
    file.lock().map_err(io)?;
    Ok(file)
}

fn csv_line(fields: &[&str]) -> Vec<u8> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    w.write_record(fields).expect("writing to memory");
    w.into_inner().expect("writing to memory")
}

/// The blank grid: the header line alone.
pub fn header_line() -> Vec<u8> {
    csv_line(COLUMNS)
}

fn find_measurement(bytes: &[u8], sha256: &str) -> Option<u64> {
    let mut reader = csv::Reader::from_reader(bytes);
    let mut record = csv::StringRecord::new();
    while reader.read_record(&mut record).ok()? {
        let row: Option<GridRow> = record.deserialize(None).ok();
        if row.is_some_and(|r| r.measurement_sha256 == sha256) {
            return Some(record.position().map_or(0, |p| p.line()));
        }
    }
    None
}

/// Checks the grid file at `path`.
pub fn check(path: &Path) -> Result<GridReport, GridError> {
    let bytes = files::read_capped(path, files::Input::Grid)?;
    Ok(check_bytes(&bytes, &path.display().to_string()))
}

/// Checks every row of a grid and reports each problem with its line and column.
pub fn check_bytes(bytes: &[u8], file: &str) -> GridReport {
    let mut problems = Vec::new();
    let mut report = |line: u64, column: &str, message: String| {
        problems.push(Problem {
            line,
            column: column.into(),
            message,
        })
    };
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(bytes);
    match reader.headers() {
        Ok(h) if h.iter().eq(COLUMNS.iter().copied()) => {}
        Ok(h) => report(
            1,
            "(header)",
            format!(
                "expected the {} columns {}; found {}",
                COLUMNS.len(),
                COLUMNS.join(","),
                h.iter().collect::<Vec<_>>().join(",")
            ),
        ),
        Err(e) => report(1, "(header)", e.to_string()),
    }
    let mut rows = 0;
    let mut seen = std::collections::HashMap::new();
    for record in reader.records() {
        rows += 1;
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                report(line, "(row)", e.to_string());
                continue;
            }
        };
        let line = record.position().map_or(0, |p| p.line());
        if record.len() != COLUMNS.len() {
            report(
                line,
                "(row)",
                format!("{} fields, expected {}", record.len(), COLUMNS.len()),
            );
            continue;
        }
        let row: GridRow = match record.deserialize(None) {
            Ok(row) => row,
            Err(e) => {
                report(line, "(row)", e.to_string());
                continue;
            }
        };
        for (column, message) in check_row(&row) {
            report(line, column, message);
        }
        if let Some(first) = seen.insert(row.measurement_sha256.clone(), line) {
            report(
                line,
                "measurement_sha256",
                format!("the same measurement is already on line {first}"),
            );
        }
    }
    GridReport {
        file: file.into(),
        rows,
        problems,
    }
}

/// The problems of one complete row, as (column, message).
fn check_row(r: &GridRow) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let named = r.named_cells();
    let field = |name: &str| -> &str {
        named
            .iter()
            .find(|(c, _)| *c == name)
            .map_or("", |(_, v)| v.as_str())
    };
    let positive = |name: &'static str, out: &mut Vec<(&'static str, String)>| -> Option<u64> {
        match field(name).parse::<u64>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                out.push((name, format!("`{}` is not a positive integer", field(name))));
                None
            }
        }
    };
    for (column, value) in &named {
        if value.chars().any(char::is_control) {
            out.push((*column, "contains a control character".into()));
        }
    }
    let at = field("measured_at_utc");
    if humantime::parse_rfc3339(at).is_err() || !is_iso_date(at.get(..10).unwrap_or("")) {
        out.push((
            "measured_at_utc",
            format!("`{at}` is not an RFC 3339 UTC time"),
        ));
    }
    for name in [
        "gpu_model",
        "package_display_name",
        "useful_work_unit",
        "acceptance_threshold",
        "measurement_file",
        "catalog_file",
    ] {
        if field(name).trim().is_empty() {
            out.push((name, "must not be empty".into()));
        }
    }
    match field("duration_days").parse::<u32>() {
        Ok(d) if DURATIONS_DAYS.contains(&d) => {}
        _ => out.push((
            "duration_days",
            format!("`{}` is not 3, 7 or 30", field("duration_days")),
        )),
    }
    let lots = positive("lots", &mut out);
    let gpus = positive("total_gpus", &mut out);
    if let (Some(l), Some(g)) = (lots, gpus) {
        if g % l != 0 {
            out.push((
                "total_gpus",
                format!("{g} is not a whole number of GPUs per lot for {l} lot(s)"),
            ));
        }
    }
    if field("device").parse::<CudaDevice>().is_err() {
        out.push(("device", format!("`{}` is not cuda:N", field("device"))));
    }
    if !["float32", "float16", "bfloat16"].contains(&field("dtype")) {
        out.push((
            "dtype",
            format!("`{}` is not float32, float16 or bfloat16", field("dtype")),
        ));
    }
    for name in ["batch", "context", "width", "hidden"] {
        positive(name, &mut out);
    }
    for name in ["measurement_sha256", "catalog_sha256"] {
        let v = field(name);
        if v.len() != 64
            || !v
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            out.push((name, format!("`{v}` is not a lowercase SHA-256")));
        }
    }
    let peak = |name: &'static str, out: &mut Vec<(&'static str, String)>| {
        field(name)
            .parse::<u64>()
            .map_err(|_| out.push((name, format!("`{}` is not a byte count", field(name)))))
            .ok()
    };
    if let (Some(a), Some(r)) = (
        peak("max_peak_allocated_bytes", &mut out),
        peak("max_peak_reserved_bytes", &mut out),
    ) {
        if a > r {
            out.push((
                "max_peak_allocated_bytes",
                format!("{a} exceeds the reserved peak {r}: allocated is part of reserved"),
            ));
        }
    }
    let accepted = positive("accepted_results", &mut out);
    let total = positive("total_price_usd_cents", &mut out);
    if let (Some(n), Some(t)) = (accepted, total) {
        let expected = unit_cost(crate::money::Cents(t), n).usd.to_string();
        if field("unit_cost_usd") != expected {
            out.push((
                "unit_cost_usd",
                format!(
                    "`{}` but {t} cents / {n} results gives {expected}",
                    field("unit_cost_usd")
                ),
            ));
        }
    }
    if !["true", "false"].contains(&field("catalog_illustrative")) {
        out.push((
            "catalog_illustrative",
            format!("`{}` is not true or false", field("catalog_illustrative")),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_grid_is_blank_and_valid() {
        let bytes = include_bytes!("../data/resultats-bruts.csv");
        assert_eq!(bytes.as_slice(), header_line().as_slice());
        let r = check_bytes(bytes, "data/resultats-bruts.csv");
        assert_eq!((r.rows, r.problems.len()), (0, 0));
    }
}
