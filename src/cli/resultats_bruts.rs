//! `resultats_bruts append|check`: fill and check the results grid.

use super::{say, values, Failure, Outcome};
use crate::grid::{self, AppendRequest, GridError, TextField};
use crate::status::Status;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Append a run to the results grid (measurement + package quote + protocol fields), or check a grid.
#[derive(Debug, Parser)]
#[command(name = "resultats_bruts", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Append one row, atomically and under a lock; existing rows are never rewritten.
    Append(AppendArgs),
    /// Check a grid (also one edited by hand) and report each bad row by line and column.
    Check {
        /// The grid file.
        #[arg(long, default_value = "data/resultats-bruts.csv")]
        grid: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct AppendArgs {
    /// The grid file (start from the blank data/resultats-bruts.csv).
    #[arg(long, default_value = "data/resultats-bruts.csv")]
    pub grid: PathBuf,
    /// Measurement JSON written by `mesure_memoire measure`.
    #[arg(long)]
    pub measurement: PathBuf,
    /// Catalog model key of the rented package, e.g. b200.
    #[arg(long)]
    pub gpu: String,
    /// Package duration: 3, 7 or 30 days.
    #[arg(long, value_parser = values::days)]
    pub days: u32,
    /// Number of lots rented.
    #[arg(long, value_parser = values::positive_u64)]
    pub lots: u64,
    /// The useful work unit, fixed before the run (see data/protocole-qualite.md).
    #[arg(long)]
    pub useful_work_unit: String,
    /// The acceptance threshold, fixed before the run.
    #[arg(long)]
    pub threshold: String,
    /// Distinct useful results accepted under that threshold.
    #[arg(long, value_parser = values::positive_u64)]
    pub accepted_results: u64,
    /// Catalog CSV [default: data/tarifs-forfaits.csv if present, else the built-in copy].
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// Free text, one line.
    #[arg(long, default_value = "")]
    pub notes: String,
}

pub fn run(args: &Args) -> Outcome {
    match &args.command {
        Command::Append(a) => {
            let row = grid::append(
                &a.grid,
                &AppendRequest {
                    measurement: a.measurement.clone(),
                    gpu: a.gpu.clone(),
                    days: a.days,
                    lots: a.lots,
                    useful_work_unit: a.useful_work_unit.clone(),
                    acceptance_threshold: a.threshold.clone(),
                    accepted_results: a.accepted_results,
                    catalog: a.catalog.clone(),
                    notes: a.notes.clone(),
                },
            )
            .map_err(with_flag)?;
            for (column, value) in row.named_cells() {
                say(format_args!("{column:<26} {value}"))?;
            }
            say(format_args!("Appended to {}", a.grid.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { grid, json } => {
            let report = grid::check(grid)?;
            super::print(&report, *json)?;
            Ok(if report.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                Status::DataError.into()
            })
        }
    }
}

/// Names the flag behind a refused text field.
fn with_flag(e: GridError) -> Failure {
    let flag = match &e {
        GridError::Text { field, .. } => Some(match field {
            TextField::UsefulWorkUnit => "--useful-work-unit",
            TextField::AcceptanceThreshold => "--threshold",
            TextField::Notes => "--notes",
            TextField::MeasurementFile => "--measurement",
            TextField::CatalogFile => "--catalog",
        }),
        _ => None,
    };
    let failure = Failure::from(e);
    match flag {
        Some(flag) => failure.context(format!("invalid {flag}")),
        None => failure,
    }
}

pub fn main() -> ExitCode {
    super::run_main("resultats_bruts", |args: Args| run(&args))
}
