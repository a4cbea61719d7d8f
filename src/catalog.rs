//! The package catalog (`data/tarifs-forfaits.csv`): strict loading, one row per (model, duration),
//! every error naming the file, line and column, and the file's identity (path, SHA-256,
//! illustrative or published) carried into every quote made from it.

use crate::money::Cents;
use crate::sha256_hex;
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
    #[error("cannot read catalog {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
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
            CatalogError::Io { .. } => Status::Failure,
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

    pub fn load_file(path: &Path) -> Result<Catalog, CatalogError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| CatalogError::Io {
            file: file.clone(),
            source,
        })?;
        Self::parse(&bytes, &file)
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
        let line = |f: &mut fmt::Formatter<'_>, c: &[&str]| {
            writeln!(
                f,
                "{:<14} {:<36} {:>8} {:>12} {:>5} {:>14} {:<10}",
                c[0], c[1], c[2], c[3], c[4], c[5], c[6]
            )
        };
        line(f, &CATALOG_COLUMNS)?;
        for r in &self.rows {
            let cells = r.cells();
            line(f, &cells.each_ref().map(String::as_str))?;
        }
        write!(
            f,
            "Lot prices include all the lot's GPUs; durations 3, 7 or 30 days only."
        )
    }
}

/// Reads every row, checking the header and each field; returns rows with their line numbers.
fn parse_rows(bytes: &[u8], file: &str) -> Result<Vec<(u64, CatalogRow)>, CatalogError> {
    let invalid = |line: u64, column: &str, message: String| CatalogError::Invalid {
        file: file.to_string(),
        line,
        column: column.to_string(),
        message,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(bytes);
    let header = reader
        .headers()
        .map_err(|e| invalid(1, "(header)", e.to_string()))?
        .clone();
    let names: Vec<&str> = header.iter().collect();
    if names != COLUMNS {
        let missing: Vec<&str> = COLUMNS
            .iter()
            .filter(|c| !names.contains(c))
            .copied()
            .collect();
        let unknown: Vec<&str> = names
            .iter()
            .filter(|c| !COLUMNS.contains(c))
            .copied()
            .collect();
        return Err(invalid(
            1,
            "(header)",
            format!(
                "expected columns {} in that order; missing: [{}], unknown: [{}]",
                COLUMNS.join(","),
                missing.join(", "),
                unknown.join(", ")
            ),
        ));
    }

    let mut rows = Vec::new();
    let mut seen = BTreeMap::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            invalid(line, "(row)", e.to_string())
        })?;
        let line = record.position().map_or(0, |p| p.line());
        let field = |i: usize| record.get(i).unwrap_or("").trim();
        let text = |i: usize| -> Result<String, CatalogError> {
            let v = field(i);
            if v.is_empty() {
                Err(invalid(line, COLUMNS[i], "empty value".into()))
            } else {
                Ok(v.to_string())
            }
        };
        let positive = |i: usize| -> Result<u64, CatalogError> {
            match field(i).parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(invalid(
                    line,
                    COLUMNS[i],
                    format!("`{}` is not a positive integer", field(i)),
                )),
            }
        };
        let model = text(0)?;
        if !model
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(invalid(
                line,
                "model",
                format!("`{model}` must use lowercase letters, digits and '-' only"),
            ));
        }
        let gpus_per_lot = u32::try_from(positive(2)?)
            .map_err(|_| invalid(line, "gpus_per_lot", "too large".into()))?;
        let memory_per_gpu_gib = match field(3).parse::<Decimal>() {
            Ok(d) if d > Decimal::ZERO => d,
            _ => {
                return Err(invalid(
                    line,
                    "memory_per_gpu_gib",
                    format!("`{}` is not a positive decimal number", field(3)),
                ))
            }
        };
        let duration_days = match field(4).parse::<u32>() {
            Ok(d) if DURATIONS_DAYS.contains(&d) => d,
            _ => {
                return Err(invalid(
                    line,
                    "duration_days",
                    format!("`{}` is not one of 3, 7, 30", field(4)),
                ))
            }
        };
        let lot_price_usd_cents = Cents(positive(5)?);
        let snapshot_date = text(6)?;
        if !is_iso_date(&snapshot_date) {
            return Err(invalid(
                line,
                "snapshot_date",
                format!("`{snapshot_date}` is not a date YYYY-MM-DD"),
            ));
        }
        let price_status = match field(7) {
            "illustrative" => PriceStatus::Illustrative,
            "published" => PriceStatus::Published,
            other => {
                return Err(invalid(
                    line,
                    "price_status",
                    format!("`{other}` must be `illustrative` or `published`"),
                ))
            }
        };
        if let Some(first) = seen.insert((model.clone(), duration_days), line) {
            return Err(invalid(
                line,
                "duration_days",
                format!("duplicate row for ({model}, {duration_days} days), first on line {first}"),
            ));
        }
        rows.push((
            line,
            CatalogRow {
                model,
                display_name: text(1)?,
                gpus_per_lot,
                memory_per_gpu_gib,
                duration_days,
                lot_price_usd_cents,
                snapshot_date,
                price_status,
            },
        ));
    }
    if rows.is_empty() {
        return Err(CatalogError::Structure {
            file: file.into(),
            message: "no rows".into(),
        });
    }
    Ok(rows)
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
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| {
        s.get(r)
            .filter(|p| p.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
    };
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
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
}
