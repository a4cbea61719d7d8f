//! Checking a whole grid: the header, every row by [`check_row`] (the validation `append` applies
//! too), and measurements tied to more than one row; each problem with its line and column.

use super::row::{check_row, GridRow, COLUMNS};
use serde::Serialize;
use std::fmt;

/// One problem found in a grid.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// The line of the file (1 is the header).
    pub line: u64,
    /// The column, or `(header)` / `(row)` for a problem of the whole line.
    pub column: String,
    /// What is wrong.
    pub message: String,
}

/// The result of checking a grid.
#[derive(Debug, Clone, Serialize)]
pub struct GridReport {
    /// The grid file checked.
    pub file: String,
    /// Rows read after the header.
    pub rows: usize,
    /// Every problem found, in file order; none for a valid grid.
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

/// The line of the row tied to the measurement whose identity is `sha256`, if any.
pub fn find_measurement(bytes: &[u8], sha256: &str) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::row::header_line;

    #[test]
    fn the_shipped_grid_is_blank_and_valid() {
        let bytes = include_bytes!("../../data/resultats-bruts.csv");
        assert_eq!(bytes.as_slice(), header_line().as_slice());
        let r = check_bytes(bytes, "data/resultats-bruts.csv");
        assert_eq!((r.rows, r.problems.len()), (0, 0));
    }
}
