//! One row of the grid: its columns (defined once, by `grid_columns!`), the kind of cell each
//! holds, and the one validation, [`check_row`], that `append` applies to the row it is about to
//! write and `check` applies to every row it reads. A row `append` writes is therefore always a
//! row `check` accepts.
//!
//! Also here: how free text is neutralised against spreadsheet formulas ([`neutralise`]), and a
//! measurement's identity ([`measurement_identity`]): its content, not its bytes.

use crate::catalog::{is_iso_date, DURATIONS_DAYS};
use crate::device::CudaDevice;
use crate::measure::Measurement;
use crate::money::Cents;
use crate::quote::{unit_cost, Quote};

/// Defines the row struct, the column list and each column's kind of cell from one list of
/// fields, so that the header, the written cells and the checks can never disagree on names,
/// order or rules.
macro_rules! grid_columns {
    ($($(#[doc = $doc:literal])* $field:ident: $cell:ident,)*) => {
        /// One row of the grid, every cell as the text written in the file (a grid edited by hand
        /// is read without losing a cell, then checked field by field). `data/protocole-qualite.md`
        /// documents the columns for the people who fill them.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct GridRow {
            $($(#[doc = $doc])* pub $field: String,)*
        }

        /// The grid's columns, in order: the header line, derived from [`GridRow`].
        pub const COLUMNS: &[&str] = &[$(stringify!($field)),*];

        /// The kind of cell of each column, in column order.
        pub const CELLS: &[Cell] = &[$(Cell::$cell),*];

        impl GridRow {
            /// The cells in column order.
            pub fn cells(&self) -> Vec<&str> {
                vec![$(self.$field.as_str()),*]
            }

            /// The cells in column order, to change in place.
            fn cells_mut(&mut self) -> Vec<&mut String> {
                vec![$(&mut self.$field),*]
            }
        }
    };
}

grid_columns! {
    /// When the measurement finished (RFC 3339, UTC), from the measurement file.
    measured_at_utc: UtcTime,
    /// Catalog key of the rented package, e.g. `b200`.
    gpu_model: Text,
    /// The package's display name in the catalog.
    package_display_name: Text,
    /// Package duration: 3, 7 or 30.
    duration_days: Duration,
    /// Lots rented.
    lots: Positive,
    /// lots × GPUs per lot.
    total_gpus: Positive,
    /// The measured device, `cuda:N`.
    device: Device,
    /// The measured GPU's name, from the measurement's environment.
    gpu_name: Text,
    /// float32, float16 or bfloat16.
    dtype: Dtype,
    /// Input batch of the measurement.
    batch: Positive,
    /// Input context of the measurement.
    context: Positive,
    /// Network width of the measurement.
    width: Positive,
    /// Hidden features of the measurement.
    hidden: Positive,
    /// The measurement file as given.
    measurement_file: Text,
    /// The measurement's identity: SHA-256 of its content (see [`measurement_identity`]), so
    /// that a measurement is tied to one row whatever the formatting of its file.
    measurement_sha256: Sha256,
    /// Largest allocated peak over the phases.
    max_peak_allocated_bytes: Bytes,
    /// Largest reserved peak over the phases.
    max_peak_reserved_bytes: Bytes,
    /// The useful work unit, fixed before the run.
    useful_work_unit: Text,
    /// The acceptance threshold, fixed before the run.
    acceptance_threshold: Text,
    /// Distinct useful results accepted under that threshold.
    accepted_results: Positive,
    /// Package price: lot price × lots, whole cents.
    total_price_usd_cents: Positive,
    /// total / accepted results, exact, rounded half away from zero to 6 decimals.
    unit_cost_usd: UnitCost,
    /// The catalog read.
    catalog_file: Text,
    /// SHA-256 of the catalog's bytes.
    catalog_sha256: Sha256,
    /// true when the catalog's prices are illustrative.
    catalog_illustrative: Bool,
    /// Free text, one line.
    notes: OptionalText,
}

/// The kind of cell of `column`, if the grid has that column.
pub fn cell_of(column: &str) -> Option<Cell> {
    COLUMNS.iter().position(|c| *c == column).map(|i| CELLS[i])
}

/// What a cell holds, and so the rule it is checked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// An RFC 3339 time in UTC (`Z`, no offset) on a real calendar date.
    UtcTime,
    /// One line of free text, not blank, neutralised against spreadsheet formulas.
    Text,
    /// One line of free text, possibly empty, neutralised against spreadsheet formulas.
    OptionalText,
    /// 3, 7 or 30, in plain digits.
    Duration,
    /// A positive integer in plain digits (no sign, no leading zero).
    Positive,
    /// A byte count: a non-negative integer in plain digits.
    Bytes,
    /// `cuda:N`, as the program writes it.
    Device,
    /// `float32`, `float16` or `bfloat16`.
    Dtype,
    /// A SHA-256 in lowercase hexadecimal.
    Sha256,
    /// USD as a plain decimal number; checked against the total and the accepted results.
    UnitCost,
    /// `true` or `false`.
    Bool,
}

impl Cell {
    /// Whether the cell holds free text (neutralised by [`neutralise`] when written).
    pub fn is_text(self) -> bool {
        matches!(self, Cell::Text | Cell::OptionalText)
    }

    /// Checks one cell on its own; the message says what is wrong with `value`.
    pub fn check(self, value: &str) -> Result<(), String> {
        if let Some(c) = value.chars().find(|c| is_forbidden(*c)) {
            return Err(format!(
                "contains the control character U+{:04X}: a cell is one line of plain text",
                c as u32
            ));
        }
        let plain = |what: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(format!("`{value}` is not {what}"))
            }
        };
        match self {
            Cell::Text | Cell::OptionalText => {
                if self == Cell::Text && value.trim().is_empty() {
                    return Err("must not be empty".into());
                }
                match runs_as_formula(value) {
                    Some(first) => Err(format!(
                        "starts with {first:?}, which a spreadsheet runs as a formula: write it \
                         with a leading apostrophe, '{}",
                        value.escape_debug()
                    )),
                    None => Ok(()),
                }
            }
            Cell::UtcTime => plain(
                "an RFC 3339 UTC time",
                humantime::parse_rfc3339(value).is_ok()
                    && is_iso_date(value.get(..10).unwrap_or("")),
            ),
            Cell::Duration => plain(
                "3, 7 or 30",
                DURATIONS_DAYS
                    .iter()
                    .any(|d| integer(value) == Some(u64::from(*d))),
            ),
            Cell::Positive => plain("a positive integer", integer(value).is_some_and(|n| n > 0)),
            Cell::Bytes => plain("a byte count", integer(value).is_some()),
            Cell::Device => plain(
                "cuda:N",
                value
                    .parse::<CudaDevice>()
                    .is_ok_and(|d| d.to_string() == value),
            ),
            Cell::Dtype => plain(
                "float32, float16 or bfloat16",
                ["float32", "float16", "bfloat16"].contains(&value),
            ),
            Cell::Sha256 => plain("a lowercase SHA-256", crate::is_sha256_hex(value)),
            Cell::UnitCost => plain("a decimal number", {
                let (whole, fraction) = value.split_once('.').unwrap_or((value, "0"));
                [whole, fraction]
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            }),
            Cell::Bool => plain("true or false", ["true", "false"].contains(&value)),
        }
    }
}

/// An integer written in plain digits, as the program writes it: no sign, no space, no leading
/// zero (so `+5`, ` 5` and `05` are refused).
fn integer(value: &str) -> Option<u64> {
    let n = value.parse::<u64>().ok()?;
    (n.to_string() == value).then_some(n)
}

/// Characters no cell may hold: control characters (tab, line breaks, escape, NUL...), the
/// Unicode line and paragraph separators, and the bidirectional controls that reorder how text
/// is displayed.
pub fn is_forbidden(c: char) -> bool {
    c.is_control() || crate::text::is_bidi_control(c) || matches!(c, '\u{2028}' | '\u{2029}')
}

/// The characters that make a spreadsheet read a cell as a formula when they lead it (after any
/// spaces): `=`, `+`, `-`, `@` and their full-width forms; a cell led by a tab or a carriage
/// return is treated the same way.
const FORMULA_LEADS: [char; 8] = ['=', '+', '-', '@', '＝', '＋', '－', '＠'];

/// The character by which a spreadsheet would run `text` as a formula, if any.
fn runs_as_formula(text: &str) -> Option<char> {
    let first = text.chars().next()?;
    if first == '\t' || first == '\r' {
        return Some(first);
    }
    text.trim_start()
        .chars()
        .next()
        .filter(|c| FORMULA_LEADS.contains(c))
}

/// `text` made inert for spreadsheets the way their own exports do it: a text a spreadsheet would
/// run as a formula gets a leading apostrophe (`=1+1` is written `'=1+1`); any other text is
/// unchanged.
pub fn neutralise(text: &str) -> String {
    match runs_as_formula(text) {
        Some(_) => format!("'{text}"),
        None => text.to_string(),
    }
}

/// A measurement's identity: the SHA-256 of its content as this program reads it, written back
/// as compact JSON. The same measurement reformatted, re-indented or with a trailing newline has
/// the same identity; any change to a value gives another.
pub fn measurement_identity(measurement: &Measurement) -> String {
    let canonical = serde_json::to_vec(measurement).expect("a measurement serializes");
    crate::sha256_hex(&canonical)
}

/// The text a user gave, as a row holds it: trimmed, then neutralised.
pub fn user_text(text: &str) -> String {
    neutralise(text.trim())
}

/// The inputs of a row that the user gives by hand (the rest comes from files).
pub struct RowInputs<'a> {
    /// The measurement file as given.
    pub measurement_file: &'a str,
    /// The useful work unit, as given.
    pub useful_work_unit: &'a str,
    /// The acceptance threshold, as given.
    pub acceptance_threshold: &'a str,
    /// The notes, as given.
    pub notes: &'a str,
}

/// The row for a measurement and its package quote (which holds the accepted results): texts
/// trimmed where the user typed them, and every text cell neutralised.
pub fn build_row(inputs: &RowInputs<'_>, measurement: &Measurement, q: &Quote) -> GridRow {
    let c = &measurement.configuration;
    let mut row = GridRow {
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
        measurement_file: inputs.measurement_file.to_string(),
        measurement_sha256: measurement_identity(measurement),
        max_peak_allocated_bytes: measurement.max_peak_allocated().0.to_string(),
        max_peak_reserved_bytes: measurement.max_peak_reserved().0.to_string(),
        useful_work_unit: inputs.useful_work_unit.trim().to_string(),
        acceptance_threshold: inputs.acceptance_threshold.trim().to_string(),
        accepted_results: q.accepted_results.unwrap_or(0).to_string(),
        total_price_usd_cents: q.total_usd_cents.0.to_string(),
        unit_cost_usd: q
            .unit_cost
            .as_ref()
            .map_or(String::new(), |u| u.usd.to_string()),
        catalog_file: q.catalog.file.clone(),
        catalog_sha256: q.catalog.sha256.clone(),
        catalog_illustrative: q.catalog.illustrative.to_string(),
        notes: inputs.notes.trim().to_string(),
    };
    for (cell, value) in CELLS.iter().zip(row.cells_mut()) {
        if cell.is_text() {
            *value = neutralise(value);
        }
    }
    row
}

/// The problems of one complete row, as (column, message): each cell by its own rule, then the
/// rules between cells. `append` refuses a row with any problem; `check` reports them.
pub fn check_row(row: &GridRow) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = COLUMNS
        .iter()
        .zip(CELLS)
        .zip(row.cells())
        .filter_map(|((column, cell), value)| cell.check(value).err().map(|m| (*column, m)))
        .collect();
    let number = |value: &str| integer(value);
    if let (Some(lots), Some(gpus)) = (number(&row.lots), number(&row.total_gpus)) {
        if lots > 0 && gpus % lots != 0 {
            out.push((
                "total_gpus",
                format!("{gpus} is not a whole number of GPUs per lot for {lots} lot(s)"),
            ));
        }
    }
    if let (Some(allocated), Some(reserved)) = (
        number(&row.max_peak_allocated_bytes),
        number(&row.max_peak_reserved_bytes),
    ) {
        if allocated > reserved {
            out.push((
                "max_peak_allocated_bytes",
                format!(
                    "{allocated} exceeds the reserved peak {reserved}: allocated is part of reserved"
                ),
            ));
        }
    }
    if let (Some(n), Some(total)) = (
        number(&row.accepted_results).filter(|n| *n > 0),
        number(&row.total_price_usd_cents),
    ) {
        let expected = unit_cost(Cents(total), n).usd.to_string();
        if row.unit_cost_usd != expected {
            out.push((
                "unit_cost_usd",
                format!(
                    "`{}` but {total} cents / {n} results gives {expected}",
                    row.unit_cost_usd
                ),
            ));
        }
    }
    out
}

/// One CSV line (with its final newline) holding `fields`.
pub fn csv_line(fields: &[&str]) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_column_has_a_kind_of_cell() {
        assert_eq!(COLUMNS.len(), CELLS.len());
        assert_eq!(GridRow::default().cells().len(), COLUMNS.len());
    }

    #[test]
    fn neutralised_text_never_runs_as_a_formula() {
        for text in [
            "=1+1",
            "+33 6",
            "-5%",
            "@SUM(A1)",
            "  =HYPERLINK(\"x\")",
            "\t=1",
            "\rx",
            "＝1",
            "'=already",
            "plain",
            "",
        ] {
            let safe = neutralise(text);
            assert_eq!(runs_as_formula(&safe), None, "{text:?} -> {safe:?}");
            assert!(safe.ends_with(text));
        }
        assert_eq!(neutralise("=1+1"), "'=1+1");
        assert_eq!(neutralise("plain"), "plain");
        assert_eq!(neutralise("a-b"), "a-b");
    }

    #[test]
    fn text_cells_refuse_control_characters_formulas_and_blanks() {
        assert!(Cell::Text.check("").unwrap_err().contains("empty"));
        assert!(Cell::Text.check("  ").unwrap_err().contains("empty"));
        assert_eq!(Cell::OptionalText.check(""), Ok(()));
        for bad in [
            "a\tb",
            "a\nb",
            "x\u{1b}[31m",
            "nul\0",
            "a\u{2028}b",
            "\u{202E}abc",
        ] {
            let message = Cell::OptionalText.check(bad).unwrap_err();
            assert!(message.contains("control character"), "{bad:?}: {message}");
        }
        let message = Cell::Text.check("=cmd|' /C calc'!A0").unwrap_err();
        assert!(message.contains("formula"), "{message}");
        assert_eq!(Cell::Text.check("'=cmd|' /C calc'!A0"), Ok(()));
    }

    #[test]
    fn numbers_dates_and_devices_must_be_written_as_the_program_writes_them() {
        for (cell, good, bads) in [
            (
                Cell::Positive,
                "12",
                &["0", "+12", "012", " 12", "-1", "1e3"][..],
            ),
            (Cell::Bytes, "0", &["+0", "00", "-0"][..]),
            (Cell::Duration, "7", &["07", "+7", "5"][..]),
            (Cell::Device, "cuda:0", &["cuda", "cuda:00", "cpu"][..]),
            (
                Cell::UtcTime,
                "2026-11-30T05:29:56Z",
                &[
                    "2026-02-30T05:29:56Z",
                    "2026-11-30T05:29:56+02:00",
                    "2026-11-30T25:29:56Z",
                    "2026-11-30",
                ][..],
            ),
        ] {
            assert_eq!(cell.check(good), Ok(()), "{cell:?} {good}");
            for bad in bads {
                assert!(cell.check(bad).is_err(), "{cell:?} accepted {bad:?}");
            }
        }
    }
}
