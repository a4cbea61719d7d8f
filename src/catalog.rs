//! The package catalog (`data/tarifs-forfaits.csv`): strict loading, one row per (model, duration),
//! every error naming the file, line and column, and the file's identity (path, SHA-256,
//! illustrative or published) carried into every quote made from it.

use crate::decimal::{DecimalError, PlainDecimal};
use crate::files::{read_capped, Input, ReadError};
use crate::money::Cents;
use crate::sha256_hex;
use crate::text::{first_unsafe, printable};
use rust_decimal::Decimal;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// Rental durations offered, in days: no other duration, no conversion, no proration.
pub const DURATIONS_DAYS: [u32; 3] = [3, 7, 30];
/// Where the catalog is looked for when no `--catalog` is given.
pub const DEFAULT_PATH: &str = "data/tarifs-forfaits.csv";
/// The catalog shipped with this build, used when `data/tarifs-forfaits.csv` is not in the
/// current directory.
pub const BUILTIN_CSV: &[u8] = include_bytes!("../data/tarifs-forfaits.csv");
/// The most lots a plan prices one offer at (`--max-gpus` at most this many GPUs).
pub const MAX_LOTS: u64 = 4096;
/// The largest lot price a catalog may hold: any number of lots up to [`MAX_LOTS`] priced in
/// whole cents without overflow.
pub const MAX_LOT_PRICE_CENTS: u64 = u64::MAX / MAX_LOTS;
/// The columns, in order.
pub const COLUMNS: [&str; 8] = [
    "model",
    "display_name",
    "gpus_per_lot",
    "memory_per_gpu_gib",
    "duration_days",
    "lot_price_usd_cents",
    "snapshot_date",
    "price_status",
];

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The file could not be read, is not a regular file, or is larger than a catalog may be.
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{file}, line {line}, column `{column}`: {message}")]
    Invalid {
        file: String,
        line: u64,
        column: String,
        message: String,
    },
    #[error("{file}: {message}")]
    Structure { file: String, message: String },
    #[error("unknown model `{requested}`; the catalog's models: {}", known.join(", "))]
    UnknownModel {
        requested: String,
        known: Vec<String>,
    },
    #[error("a duration is 3, 7 or 30 days (no conversion, no proration), got {0}")]
    UnknownDuration(u32),
}

impl crate::status::Classify for CatalogError {
    fn status(&self) -> crate::status::Status {
        use crate::status::Status;
        match self {
            CatalogError::Read(e) => crate::status::Classify::status(e),
            CatalogError::Invalid { .. } | CatalogError::Structure { .. } => Status::DataError,
            CatalogError::UnknownModel { .. } | CatalogError::UnknownDuration(_) => Status::Usage,
        }
    }
}

/// Whether a row's price is a real snapshot or a stand-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PriceStatus {
    /// Plausible stand-in prices: never a basis for a purchase decision.
    Illustrative,
    /// Prices copied from a provider's published offer on `snapshot_date`.
    Published,
}

/// One (model, duration) offer.
#[derive(Debug, Clone, Serialize)]
pub struct CatalogRow {
    pub model: String,
    pub display_name: String,
    pub gpus_per_lot: u32,
    pub memory_per_gpu_gib: Decimal,
    pub duration_days: u32,
    pub lot_price_usd_cents: Cents,
    pub snapshot_date: String,
    pub price_status: PriceStatus,
}

/// Which file a catalog came from, so that every quote can be traced and checked.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CatalogSource {
    /// The path read, or `built-in copy of data/tarifs-forfaits.csv`.
    pub file: String,
    /// SHA-256 of the exact bytes read, lowercase hex.
    pub sha256: String,
    /// True when any row's prices are illustrative.
    pub illustrative: bool,
}

impl fmt::Display for CatalogSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.illustrative {
            "ILLUSTRATIVE prices, not a real offer"
        } else {
            "published prices; check the live offer before buying"
        };
        write!(f, "{} (sha256 {}; {status})", self.file, self.sha256)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Catalog {
    pub source: CatalogSource,
    pub rows: Vec<CatalogRow>,
}

impl Catalog {
    /// Loads `path`, or the default: `data/tarifs-forfaits.csv` in the current directory if present,
    /// else the copy built into this program.
    pub fn load(path: Option<&Path>) -> Result<Catalog, CatalogError> {
        let default = Path::new(DEFAULT_PATH);
        match path {
            Some(p) => Self::load_file(p),
            None if default.exists() => Self::load_file(default),
            None => Self::parse(BUILTIN_CSV, "built-in copy of data/tarifs-forfaits.csv"),
        }
    }

    /// Loads the catalog file at `path`: a regular file of at most [`Input::Catalog`]'s limit.
    pub fn load_file(path: &Path) -> Result<Catalog, CatalogError> {
        let bytes = read_capped(path, Input::Catalog)?;
        Self::parse(&bytes, &path.display().to_string())
    }

    /// Parses and validates catalog bytes; `file` names them in errors and in the source.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Catalog, CatalogError> {
        let rows = parse_rows(bytes, file)?;
        check_complete(&rows, file)?;
        let illustrative = rows
            .iter()
            .any(|(_, r)| r.price_status == PriceStatus::Illustrative);
        Ok(Catalog {
            source: CatalogSource {
                file: file.to_string(),
                sha256: sha256_hex(bytes),
                illustrative,
            },
            rows: rows.into_iter().map(|(_, r)| r).collect(),
        })
    }

    /// Model keys in catalog order, each once.
    pub fn models(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.rows
            .iter()
            .filter(|r| seen.insert(r.model.clone()))
            .map(|r| r.model.clone())
            .collect()
    }

    /// The offer for `model` over `days`; an unknown model lists the known keys.
    pub fn offer(&self, model: &str, days: u32) -> Result<&CatalogRow, CatalogError> {
        if !DURATIONS_DAYS.contains(&days) {
            return Err(CatalogError::UnknownDuration(days));
        }
        self.rows
            .iter()
            .find(|r| r.model == model && r.duration_days == days)
            .ok_or_else(|| CatalogError::UnknownModel {
                requested: model.to_string(),
                known: self.models(),
            })
    }
}

/// Column titles of a catalog table (text and HTML).
pub const CATALOG_COLUMNS: [&str; 7] = [
    "model",
    "display name",
    "GPUs/lot",
    "GiB per GPU",
    "days",
    "lot price",
    "snapshot",
];

impl CatalogRow {
    /// The row as table cells, in the order of [`CATALOG_COLUMNS`].
    pub fn cells(&self) -> [String; 7] {
        [
            self.model.clone(),
            self.display_name.clone(),
            self.gpus_per_lot.to_string(),
            self.memory_per_gpu_gib.to_string(),
            self.duration_days.to_string(),
            self.lot_price_usd_cents.to_string(),
            self.snapshot_date.clone(),
        ]
    }
}

impl fmt::Display for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Catalog: {}", self.source)?;
        let rows = self.rows.iter().map(|r| r.cells().to_vec()).collect();
        let table = crate::markup::Table::new(&CATALOG_COLUMNS, rows)
            .with_min_widths(&[14, 36, 8, 12, 5, 14, 10])
            .with_left(&[0, 1, 6]);
        write!(f, "{table}")?;
        write!(
            f,
            "Lot prices include all the lot's GPUs; durations 3, 7 or 30 days only."
        )
    }
}

/// One row as `csv` reads it, every value still text: each is then checked with the catalog's
/// own rules and messages.
#[derive(serde::Deserialize)]
struct RawRow {
    model: String,
    display_name: String,
    gpus_per_lot: String,
    memory_per_gpu_gib: String,
    duration_days: String,
    lot_price_usd_cents: String,
    snapshot_date: String,
    price_status: String,
}

/// Reads every row, checking the header and each field; returns rows with their line numbers.
///
/// The file is UTF-8 text (a leading byte-order mark is allowed), one record per line (`\n` or
/// `\r\n`), no empty line. `csv` splits and unquotes the records; what it is lenient about is
/// refused here ([`strict_quoting`]): a value is plain (no quote inside) or enclosed in double
/// quotes with `""` standing for one quote, nothing after its closing quote, closed on its line.
fn parse_rows(bytes: &[u8], file: &str) -> Result<Vec<(u64, CatalogRow)>, CatalogError> {
    let invalid = |line: u64, column: &str, message: String| CatalogError::Invalid {
        file: file.to_string(),
        line,
        column: column.to_string(),
        message,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        invalid(line as u64, "(row)", "not UTF-8 text".into())
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // `csv` skips empty lines; a catalog has none (a final line break ends the last row).
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut lines = (1u64..).zip(body.split('\n'));
    if let Some((line, _)) = lines.find(|(_, l)| l.trim_end_matches('\r').is_empty()) {
        return Err(match line {
            1 => invalid(
                1,
                "(header)",
                check_header(&csv::StringRecord::new()).unwrap_err(),
            ),
            _ => invalid(line, "(row)", "empty line".into()),
        });
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut header = None;
    let mut rows = Vec::new();
    let mut seen = BTreeMap::new();
    let mut record = csv::StringRecord::new();
    let (mut line, mut counted) = (1u64, 0usize);
    loop {
        let read =
            (reader.read_record(&mut record)).map_err(|e| invalid(line, "(row)", e.to_string()))?;
        if !read {
            break;
        }
        // The record's own text and line: after a `\r\n`, `csv` starts the next record at the
        // `\n` and counts its line late.
        let start = record.position().expect("a record read has its position");
        let span = &text[start.byte() as usize..reader.position().byte() as usize];
        let raw = span.trim_start_matches('\n').trim_end_matches(['\r', '\n']);
        let begins = start.byte() as usize + (span.len() - span.trim_start_matches('\n').len());
        line += text[counted..begins].matches('\n').count() as u64;
        counted = begins;
        let Some(names) = &header else {
            let column = |_| "(header)";
            strict_quoting(raw, &record).map_err(|(i, m)| invalid(line, column(i), m))?;
            check_header(&record).map_err(|m| invalid(line, "(header)", m))?;
            header = Some(record.clone());
            continue;
        };
        let column = |i: usize| COLUMNS.get(i).copied().unwrap_or("(row)");
        strict_quoting(raw, &record).map_err(|(i, m)| invalid(line, column(i), m))?;
        plain_values(&record).map_err(|(i, m)| invalid(line, column(i), m))?;
        let raw: RawRow = record
            .deserialize(Some(names))
            .map_err(|e| invalid(line, "(row)", e.to_string()))?;
        let row = checked_row(raw).map_err(|(i, m)| invalid(line, COLUMNS[i], m))?;
        if let Some(first) = seen.insert((row.model.clone(), row.duration_days), line) {
            let message = format!(
                "duplicate row for ({}, {} days), first on line {first}",
                row.model, row.duration_days
            );
            return Err(invalid(line, "duration_days", message));
        }
        rows.push((line, row));
    }
    if rows.is_empty() {
        return Err(CatalogError::Structure {
            file: file.into(),
            message: "no rows".into(),
        });
    }
    Ok(rows)
}

/// The header: exactly [`COLUMNS`], in order.
fn check_header(names: &csv::StringRecord) -> Result<(), String> {
    if names.iter().eq(COLUMNS) {
        return Ok(());
    }
    let missing: Vec<&str> = (COLUMNS.iter().copied())
        .filter(|c| !names.iter().any(|n| n == *c))
        .collect();
    let unknown: Vec<String> = (names.iter())
        .filter(|n| !COLUMNS.contains(n))
        .map(|n| printable(n).into_owned())
        .collect();
    Err(format!(
        "expected columns {} in that order; missing: [{}], unknown: [{}]",
        COLUMNS.join(","),
        missing.join(", "),
        unknown.join(", ")
    ))
}

/// Each value of a row: exactly eight, none empty, with spaces at either end, or with a character
/// a terminal would obey (escape, NUL, other controls, bidirectional overrides). `Err((index,
/// message))` names the value at fault (past the last column: the row as a whole).
fn plain_values(values: &csv::StringRecord) -> Result<(), (usize, String)> {
    if values.len() != COLUMNS.len() {
        let message = format!("expected {} values, found {}", COLUMNS.len(), values.len());
        return Err((COLUMNS.len(), message));
    }
    for (i, value) in values.iter().enumerate() {
        let problem = if value.is_empty() {
            "empty value".to_string()
        } else if let Some(c) = first_unsafe(value) {
            format!(
                "`{}` contains the control character {}: catalog values are plain text",
                printable(value),
                printable(&c.to_string())
            )
        } else if value.trim() != value {
            format!("`{value}` has spaces at its start or end")
        } else {
            continue;
        };
        return Err((i, problem));
    }
    Ok(())
}

/// The quoting `csv` accepts leniently, refused: `raw` (a record's line) must be each of
/// `values` written plain (no quote inside) or enclosed in double quotes (`""` for a quote),
/// separated by commas, nothing after a closing quote, no value spanning lines.
fn strict_quoting(raw: &str, values: &csv::StringRecord) -> Result<(), (usize, String)> {
    let mut rest = raw;
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
        let field = match rest.strip_prefix('"') {
            Some(quoted) => {
                // The closing quote: the first quote not doubled.
                let mut chars = quoted.char_indices().peekable();
                let close = loop {
                    match chars.next() {
                        Some((_, '"')) if chars.next_if(|&(_, c)| c == '"').is_some() => {}
                        Some((j, '"')) => break Some(j),
                        Some((_, '\n')) | None => break None,
                        Some(_) => {}
                    }
                };
                let Some(close) = close else {
                    let message = "a quote opens on this line and is not closed on it (a value \
                                   cannot span lines)";
                    return Err((i, message.into()));
                };
                let after = &quoted[close + 1..];
                let next = after.find(',').unwrap_or(after.len());
                if next > 0 {
                    let message = format!(
                        "`{}` follows a closing quote; a quoted value ends at the quote",
                        printable(&after[..next])
                    );
                    return Err((i, message));
                }
                1 + close + 1
            }
            None if value.contains('"') => {
                let message = format!(
                    "`{}` has a quote inside; quote a whole value: \"...\"",
                    printable(value)
                );
                return Err((i, message));
            }
            None => value.len(),
        };
        rest = &rest[field.min(rest.len())..];
    }
    Ok(())
}

/// A row's values checked and typed; `Err((index, message))` names the column at fault.
fn checked_row(raw: RawRow) -> Result<CatalogRow, (usize, String)> {
    let model = raw.model;
    if !model
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        let message = format!("`{model}` must use lowercase letters, digits and '-' only");
        return Err((0, message));
    }
    let gpus_per_lot = positive_integer(&raw.gpus_per_lot, u32::MAX.into()).map_err(|m| (2, m))?;
    let memory_per_gpu_gib = positive_gib(&raw.memory_per_gpu_gib).map_err(|m| (3, m))?;
    let days = raw.duration_days;
    let duration_days = (DURATIONS_DAYS.into_iter())
        .find(|d| d.to_string() == days)
        .ok_or_else(|| (4, format!("`{days}` is not one of 3, 7, 30")))?;
    let lot_price_usd_cents = positive_integer(&raw.lot_price_usd_cents, MAX_LOT_PRICE_CENTS)
        .map_err(|m| {
            (
                5,
                format!("{m}: a plan multiplies it by up to {MAX_LOTS} lots"),
            )
        })?;
    let snapshot_date = raw.snapshot_date;
    if !is_iso_date(&snapshot_date) {
        return Err((6, format!("`{snapshot_date}` is not a date YYYY-MM-DD")));
    }
    let price_status = match raw.price_status.as_str() {
        "illustrative" => PriceStatus::Illustrative,
        "published" => PriceStatus::Published,
        other => {
            let message = format!("`{other}` must be `illustrative` or `published`");
            return Err((7, message));
        }
    };
    Ok(CatalogRow {
        model,
        display_name: raw.display_name,
        gpus_per_lot: u32::try_from(gpus_per_lot).expect("at most u32::MAX"),
        memory_per_gpu_gib,
        duration_days,
        lot_price_usd_cents: Cents(lot_price_usd_cents),
        snapshot_date,
        price_status,
    })
}

/// A positive whole number up to `max`, written with digits only: no sign, space, leading zero,
/// decimal point or exponent.
fn positive_integer(value: &str, max: u64) -> Result<u64, String> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "`{value}` is not a positive integer written with digits only (no sign, space, \
             decimal point or exponent)"
        ));
    }
    if value.bytes().all(|b| b == b'0') {
        return Err(format!("`{value}` is not a positive integer"));
    }
    if value.starts_with('0') {
        return Err(format!(
            "`{value}` is not a positive integer as written: no leading zero"
        ));
    }
    match value.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("`{value}` is too large (at most {max})")),
    }
}

/// A positive amount of GiB written as a plain decimal number, such as `80` or `23.99`.
fn positive_gib(value: &str) -> Result<Decimal, String> {
    let refused = |why: String| {
        format!("`{value}` is not a positive plain decimal number such as 80 or 23.99: {why}")
    };
    let d: PlainDecimal = value
        .parse()
        .map_err(|e: DecimalError| refused(e.to_string()))?;
    if d.is_zero() {
        return Err(refused("it is zero".into()));
    }
    d.to_decimal()
        .ok_or_else(|| refused("more than 28 decimal places".into()))
}

/// Every model offers all three durations, with the same name, lot size and memory throughout.
fn check_complete(rows: &[(u64, CatalogRow)], file: &str) -> Result<(), CatalogError> {
    let mut by_model: BTreeMap<&str, Vec<&(u64, CatalogRow)>> = BTreeMap::new();
    for row in rows {
        by_model.entry(&row.1.model).or_default().push(row);
    }
    for (model, offers) in by_model {
        let missing: Vec<String> = DURATIONS_DAYS
            .iter()
            .filter(|d| !offers.iter().any(|(_, r)| r.duration_days == **d))
            .map(|d| d.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(CatalogError::Structure {
                file: file.into(),
                message: format!(
                    "model `{model}` lacks duration(s) {} days (first row on line {})",
                    missing.join(", "),
                    offers[0].0
                ),
            });
        }
        let (_, first) = offers[0];
        for (line, r) in &offers[1..] {
            for (column, same) in [
                ("display_name", r.display_name == first.display_name),
                ("gpus_per_lot", r.gpus_per_lot == first.gpus_per_lot),
                (
                    "memory_per_gpu_gib",
                    r.memory_per_gpu_gib == first.memory_per_gpu_gib,
                ),
            ] {
                if !same {
                    return Err(CatalogError::Invalid {
                        file: file.into(),
                        line: *line,
                        column: column.into(),
                        message: format!("differs from line {} for model `{model}`", offers[0].0),
                    });
                }
            }
        }
    }
    Ok(())
}

/// A calendar date written YYYY-MM-DD (Gregorian, leap years included).
pub fn is_iso_date(s: &str) -> bool {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    s.len() == 10 && time::Date::parse(s, format).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_has_15_models_by_3_durations() {
        let c = Catalog::parse(BUILTIN_CSV, "builtin").unwrap();
        assert_eq!(c.rows.len(), 45);
        assert_eq!(c.models().len(), 15);
        assert!(c.source.illustrative);
        let b200 = c.offer("b200", 7).unwrap();
        assert_eq!(b200.gpus_per_lot, 2);
        assert_eq!(c.source.sha256.len(), 64);
    }

    #[test]
    fn dates_are_checked() {
        assert!(is_iso_date("2026-09-24"));
        assert!(is_iso_date("2024-02-29"));
        assert!(!is_iso_date("2026-02-29"));
        assert!(!is_iso_date("2026-13-01"));
        assert!(!is_iso_date("26-09-24"));
        assert!(!is_iso_date("2026-9-245"));
    }

    #[test]
    fn unknown_model_lists_known_keys() {
        let c = Catalog::parse(BUILTIN_CSV, "builtin").unwrap();
        let e = c.offer("tpu", 7).unwrap_err().to_string();
        assert!(
            e.contains("unknown model `tpu`") && e.contains("b200") && e.contains("h200"),
            "{e}"
        );
        assert!(matches!(
            c.offer("b200", 5),
            Err(CatalogError::UnknownDuration(5))
        ));
    }

    /// The built-in catalog with the value of `column` on `line` (2: the first row) replaced.
    fn with_value(line: usize, column: usize, value: &str) -> String {
        let text = std::str::from_utf8(BUILTIN_CSV).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        let mut values: Vec<&str> = lines[line - 1].split(',').collect();
        values[column] = value;
        lines[line - 1] = values.join(",");
        lines.join("\n") + "\n"
    }

    fn error_of(text: &str) -> String {
        let e = Catalog::parse(text.as_bytes(), "c.csv").unwrap_err();
        assert!(matches!(e, CatalogError::Invalid { .. }), "{e}");
        e.to_string()
    }

    #[test]
    fn every_number_is_strict() {
        for (column, value, expected) in [
            (
                5,
                "+2900",
                "not a positive integer written with digits only",
            ),
            (5, " 2900 ", "has spaces at its start or end"),
            (5, "2900 ", "has spaces at its start or end"),
            (5, "002900", "no leading zero"),
            (5, "2.9e3", "digits only"),
            (5, "2900.00", "digits only"),
            (5, "2_900", "digits only"),
            (5, "0", "`0` is not a positive integer"),
            (
                5,
                "18446744073709551616",
                "too large (at most 4503599627370495)",
            ),
            (2, "+1", "digits only"),
            (2, "01", "no leading zero"),
            (2, "4294967296", "too large (at most 4294967295)"),
            (4, "03", "is not one of 3, 7, 30"),
            (4, "+3", "is not one of 3, 7, 30"),
            (4, "3.0", "is not one of 3, 7, 30"),
            (3, "2.399e1", "not a positive plain decimal number"),
            (3, "+23.99", "not a positive plain decimal number"),
            (3, "023.99", "leading zero"),
            (3, "23.", "not a positive plain decimal number"),
            (3, ".5", "not a positive plain decimal number"),
            (3, "0", "it is zero"),
            (3, "0.000", "it is zero"),
            (3, "23.9900000000000000000000000001", "at most 28"),
            (
                3,
                "0.00000000000000000000000000001",
                "more than 28 decimal places",
            ),
        ] {
            let e = error_of(&with_value(2, column, value));
            let at = format!("c.csv, line 2, column `{}`: ", COLUMNS[column]);
            assert!(e.starts_with(&at), "{value:?}: {e}");
            assert!(e.contains(expected), "{value:?}: {e}");
        }
    }

    #[test]
    fn plain_values_still_load() {
        let text = with_value(2, 3, "23.990")
            .replace(",23.99,", ",23.990,")
            .replace(
                "NVIDIA GeForce RTX 4090",
                "\"NVIDIA GeForce RTX 4090, \"\"24 GB\"\"\"",
            );
        let c = Catalog::parse(text.as_bytes(), "c.csv").unwrap();
        let row = c.offer("rtx4090", 3).unwrap();
        assert_eq!(row.display_name, "NVIDIA GeForce RTX 4090, \"24 GB\"");
        assert_eq!(row.memory_per_gpu_gib, Decimal::new(2399, 2));
        let crlf = std::str::from_utf8(BUILTIN_CSV)
            .unwrap()
            .replace('\n', "\r\n");
        assert_eq!(
            Catalog::parse(crlf.as_bytes(), "c.csv").unwrap().rows.len(),
            45
        );
        let bom = [b"\xef\xbb\xbf".as_slice(), BUILTIN_CSV].concat();
        assert_eq!(Catalog::parse(&bom, "c.csv").unwrap().rows.len(), 45);
    }

    #[test]
    fn an_unclosed_quote_is_reported_on_its_own_line() {
        let text = with_value(4, 1, "\"NVIDIA GeForce RTX 4090");
        let e = error_of(&text);
        assert!(
            e.starts_with("c.csv, line 4, column `display_name`: a quote opens"),
            "{e}"
        );
        let e = error_of(&text.replace('\n', "\r\n"));
        assert!(e.starts_with("c.csv, line 4, column `display_name`"), "{e}");
        let e = error_of(&with_value(46, 7, "\"illustrative"));
        assert!(
            e.starts_with("c.csv, line 46, column `price_status`"),
            "{e}"
        );
        let e = error_of(&with_value(3, 1, "\"RTX\"x"));
        assert!(
            e.contains("line 3, column `display_name`: `x` follows a closing quote"),
            "{e}"
        );
        let e = error_of(&with_value(3, 1, "RTX \"4090\""));
        assert!(
            e.contains("line 3, column `display_name`: `RTX \"4090\"` has a quote inside"),
            "{e}"
        );
    }

    #[test]
    fn a_price_a_plan_cannot_multiply_is_refused_at_its_line() {
        let most = MAX_LOT_PRICE_CENTS.to_string();
        assert!(Catalog::parse(with_value(3, 5, &most).as_bytes(), "c.csv").is_ok());
        let e = error_of(&with_value(3, 5, &(MAX_LOT_PRICE_CENTS + 1).to_string()));
        assert!(
            e.starts_with("c.csv, line 3, column `lot_price_usd_cents`") && e.contains("4096 lots"),
            "{e}"
        );
    }

    #[test]
    fn line_numbers_are_right_with_crlf() {
        let text = with_value(3, 5, "0").replace('\n', "\r\n");
        assert!(error_of(&text).starts_with("c.csv, line 3, column `lot_price_usd_cents`"));
    }

    #[test]
    fn empty_lines_wrong_counts_and_bad_bytes_name_their_line() {
        let text = std::str::from_utf8(BUILTIN_CSV).unwrap();
        let blank = text.replacen("illustrative\n", "illustrative\n\n", 1);
        assert_eq!(
            error_of(&blank),
            "c.csv, line 3, column `(row)`: empty line"
        );
        let trailing = format!("{text}\n");
        assert_eq!(
            error_of(&trailing),
            "c.csv, line 47, column `(row)`: empty line"
        );
        let short = with_value(5, 7, "illustrative,extra");
        assert_eq!(
            error_of(&short),
            "c.csv, line 5, column `(row)`: expected 8 values, found 9"
        );
        let mut bytes = with_value(6, 1, "MARK").into_bytes();
        let at = bytes.windows(4).position(|w| w == b"MARK").unwrap();
        bytes[at] = 0xff;
        let e = Catalog::parse(&bytes, "c.csv").unwrap_err().to_string();
        assert_eq!(e, "c.csv, line 6, column `(row)`: not UTF-8 text");
    }

    #[test]
    fn terminal_controls_in_text_are_refused_and_never_echoed_raw() {
        for (column, value) in [
            (1, "NVIDIA \u{1b}[31mH200"),
            (1, "NVIDIA\0H200"),
            (1, "NVIDIA \u{202e}002H"),
            (1, "NVIDIA\tH200"),
            (1, "NVIDIA \u{9b}2J"),
            (7, "illustrative\u{1b}[2J"),
            (6, "2026-11-30\u{7}"),
            (0, "rtx4090\u{8}"),
        ] {
            let e = error_of(&with_value(2, column, value));
            assert!(e.contains("contains the control character"), "{e}");
            assert!(e.contains(&format!("column `{}`", COLUMNS[column])), "{e}");
            assert_eq!(crate::text::first_unsafe(&e), None, "{e:?}");
        }
        let header = std::str::from_utf8(BUILTIN_CSV).unwrap().replacen(
            "price_status",
            "price_status\u{1b}[2J",
            1,
        );
        let e = error_of(&header);
        assert!(e.contains("unknown: [price_status\\u{1b}[2J]"), "{e}");
    }
}
