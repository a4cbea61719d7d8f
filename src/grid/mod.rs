//! The results grid `data/resultats-bruts.csv` (columns documented in `data/protocole-qualite.md`):
//! one row per actual run, tying a measurement file and a package quote to the protocol's useful
//! work, threshold and accepted results. Rows are appended under a lock and atomically, existing
//! rows are never rewritten, and a grid (also one edited by hand) can be checked row by row.
//!
//! - [`row`]: the columns, each cell's rule and the one validation `append` and `check` share;
//!   free text neutralised against spreadsheet formulas; a measurement's identity;
//! - [`report`]: checking a whole grid, each problem by line and column;
//! - [`storage`]: the file, its lock and the atomic replace.

pub mod report;
pub mod row;
pub mod storage;

pub use report::{check_bytes, GridReport, Problem};
pub use row::{header_line, measurement_identity, neutralise, Cell, GridRow, CELLS, COLUMNS};

use crate::catalog::{Catalog, CatalogError};
use crate::files::JsonError;
use crate::files::{self, WriteError};
use crate::measure::Measurement;
use crate::quote::{Order, QuoteError};
use crate::status::{Classify, Status};
use row::{build_row, check_row, user_text, RowInputs};
use std::fmt;
use std::path::{Path, PathBuf};

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

/// Why a row was not appended, or a grid not read.
#[derive(Debug, thiserror::Error)]
pub enum GridError {
    /// A file could not be read.
    #[error("cannot read {file}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    /// An input file was refused (not a regular file, or larger than its limit).
    #[error(transparent)]
    Read(#[from] files::ReadError),
    /// The measurement file is not a measurement.
    #[error(transparent)]
    Measurement(#[from] JsonError),
    /// The package could not be quoted.
    #[error(transparent)]
    Quote(#[from] QuoteError),
    /// The catalog could not be loaded.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The grid could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A text the user gave cannot be a cell.
    #[error("the {}: {problem}; got {value:?}", field.name())]
    Text {
        field: TextField,
        value: String,
        problem: String,
    },
    /// A value read from the measurement or the catalog cannot be a cell.
    #[error(
        "the row would not pass the grid's check; nothing was appended:\n{}",
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    )]
    InvalidSource { problems: Vec<SourceProblem> },
    /// The grid already has problems.
    #[error(
        "{file} is broken; fix it (see `resultats_bruts check`), nothing was appended:\n{report}"
    )]
    BrokenGrid { file: String, report: GridReport },
    /// The measurement is already tied to a row.
    #[error(
        "{file} already has a row for this measurement (line {line}, measurement_sha256 \
         {sha256}): a measurement is tied to one row, whatever the formatting of its file; \
         nothing was appended"
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
            GridError::InvalidSource { .. }
            | GridError::BrokenGrid { .. }
            | GridError::Duplicate { .. } => Status::DataError,
        }
    }
}

/// A value from the measurement or the catalog that cannot be a cell: the file, the field there,
/// the grid's column and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceProblem {
    /// The file the value comes from.
    pub file: String,
    /// The field in that file.
    pub field: String,
    /// The grid's column it would fill.
    pub column: &'static str,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for SourceProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, field `{}` (column `{}`): {}",
            self.file, self.field, self.column, self.message
        )
    }
}

/// The texts a user supplies to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextField {
    UsefulWorkUnit,
    AcceptanceThreshold,
    Notes,
    /// The measurement file's path, written in the row as given.
    MeasurementFile,
    /// The catalog file's path, written in the row as given.
    CatalogFile,
}

impl TextField {
    /// The field's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            TextField::UsefulWorkUnit => "useful work unit",
            TextField::AcceptanceThreshold => "acceptance threshold",
            TextField::Notes => "notes",
            TextField::MeasurementFile => "measurement file name",
            TextField::CatalogFile => "catalog file name",
        }
    }

    /// The kind of cell the text becomes.
    pub fn cell(self) -> Cell {
        row::cell_of(self.column()).expect("a text field fills a column")
    }

    /// The grid's column the text fills.
    pub fn column(self) -> &'static str {
        match self {
            TextField::UsefulWorkUnit => "useful_work_unit",
            TextField::AcceptanceThreshold => "acceptance_threshold",
            TextField::Notes => "notes",
            TextField::MeasurementFile => "measurement_file",
            TextField::CatalogFile => "catalog_file",
        }
    }
}

/// What the user supplies to append a row.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    /// The measurement file written by `mesure_memoire measure`.
    pub measurement: PathBuf,
    /// Catalog key of the rented package.
    pub gpu: String,
    /// Package duration in days.
    pub days: u32,
    /// Lots rented.
    pub lots: u64,
    /// The useful work unit, fixed before the run.
    pub useful_work_unit: String,
    /// The acceptance threshold, fixed before the run.
    pub acceptance_threshold: String,
    /// Distinct useful results accepted under that threshold.
    pub accepted_results: u64,
    /// The catalog file; `None` reads the default one.
    pub catalog: Option<PathBuf>,
    /// Free text, one line.
    pub notes: String,
}

/// Appends one row built from `request` to the grid at `grid` and returns it. The row is checked
/// by the same validation as [`check`] before anything is written; the append is refused if the
/// grid is broken or already holds this measurement (same content, whatever its formatting).
/// Free text is neutralised against spreadsheet formulas. The row is written under the lock
/// `.NAME.lock` beside the grid's real file (a symbolic link is followed) by an atomic replace
/// that keeps the file's permissions; a read-only grid is refused. When another writer holds the
/// lock, one line on stderr says so before waiting.
pub fn append(grid: &Path, request: &AppendRequest) -> Result<GridRow, GridError> {
    let measurement_file = request.measurement.display().to_string();
    let catalog_file = request.catalog.as_ref().map(|c| c.display().to_string());
    // The texts the user gave, each with the cell it becomes, checked by the cell's own rule
    // before any file is read (a bad flag is a usage error, whatever the files hold).
    let mut given = vec![
        (
            TextField::UsefulWorkUnit,
            request.useful_work_unit.as_str(),
            user_text(&request.useful_work_unit),
        ),
        (
            TextField::AcceptanceThreshold,
            request.acceptance_threshold.as_str(),
            user_text(&request.acceptance_threshold),
        ),
        (
            TextField::Notes,
            request.notes.as_str(),
            user_text(&request.notes),
        ),
        (
            TextField::MeasurementFile,
            measurement_file.as_str(),
            neutralise(&measurement_file),
        ),
    ];
    if let Some(file) = &catalog_file {
        given.push((TextField::CatalogFile, file, neutralise(file)));
    }
    for (field, value, cell) in given {
        if let Err(problem) = field.cell().check(&cell) {
            return Err(GridError::Text {
                field,
                value: value.to_string(),
                problem,
            });
        }
    }
    let measurement = Measurement::load(&request.measurement)?;
    let catalog = Catalog::load(request.catalog.as_deref())?;
    let q = catalog.quote(&Order {
        gpu: &request.gpu,
        days: request.days,
        lots: request.lots,
        accepted_results: Some(request.accepted_results),
    })?;
    let row = build_row(
        &RowInputs {
            measurement_file: &measurement_file,
            useful_work_unit: &request.useful_work_unit,
            acceptance_threshold: &request.acceptance_threshold,
            notes: &request.notes,
        },
        &measurement,
        &q,
    );
    let problems = check_row(&row);
    if !problems.is_empty() {
        let problems = problems
            .into_iter()
            .map(|(column, message)| {
                let (file, field) = source_of(column, &measurement_file, &q.catalog.file);
                SourceProblem {
                    file,
                    field: field.to_string(),
                    column,
                    message,
                }
            })
            .collect();
        return Err(GridError::InvalidSource { problems });
    }
    storage::append_row(grid, &row)?;
    Ok(row)
}

/// Where the value of `column` comes from when `append` builds a row: a file and its field. The
/// values the request gives (duration, lots, accepted results, texts) were checked before.
fn source_of(column: &'static str, measurement: &str, catalog: &str) -> (String, &'static str) {
    let from_measurement = |field| (measurement.to_string(), field);
    let from_catalog = |field| (catalog.to_string(), field);
    match column {
        "measured_at_utc" => from_measurement("measured_at"),
        "device" => from_measurement("configuration.device"),
        "gpu_name" => from_measurement("environment.device.name"),
        "dtype" => from_measurement("configuration.dtype"),
        "batch" => from_measurement("configuration.batch"),
        "context" => from_measurement("configuration.context"),
        "width" => from_measurement("configuration.width"),
        "hidden" => from_measurement("configuration.hidden"),
        "max_peak_allocated_bytes" => from_measurement("phases[].peak_allocated_bytes"),
        "max_peak_reserved_bytes" => from_measurement("phases[].peak_reserved_bytes"),
        "gpu_model" => from_catalog("model"),
        "package_display_name" => from_catalog("display_name"),
        "total_gpus" => from_catalog("gpus_per_lot"),
        "total_price_usd_cents" | "unit_cost_usd" => from_catalog("lot_price_usd_cents"),
        "catalog_illustrative" => from_catalog("price_status"),
        other => ("the request".to_string(), other),
    }
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

/// Checks the grid file at `path` with the validation `append` applies to each row it writes.
pub fn check(path: &Path) -> Result<GridReport, GridError> {
    let bytes = files::read_capped(path, files::Input::Grid)?;
    Ok(check_bytes(&bytes, &path.display().to_string()))
}
