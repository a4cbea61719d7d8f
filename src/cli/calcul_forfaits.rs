//! `calcul_forfaits`: the price of a package of GPU lots and, when given, the cost per accepted
//! result.

use super::{values, Context, Outcome};
use crate::budget::Budget;
use crate::catalog::Catalog;
use crate::quote::Order;
use std::path::PathBuf;
use std::process::ExitCode;

/// Price a rented GPU package from the catalog: total = lot price × lots, in exact cents.
#[derive(Debug, clap::Parser)]
#[command(name = "calcul_forfaits", version, allow_negative_numbers = true)]
pub struct Args {
    /// Model key from the catalog, e.g. b200 (see --list).
    #[arg(long, required_unless_present_any = ["list", "fit"])]
    pub gpu: Option<String>,
    /// Package duration: 3, 7 or 30 days.
    #[arg(long, value_parser = values::days, required_unless_present_any = ["list", "fit"])]
    pub days: Option<u32>,
    /// Number of lots; a lot's price already includes all its GPUs.
    #[arg(long, value_parser = values::positive_u64, required_unless_present_any = ["list", "fit"])]
    pub lots: Option<u64>,
    /// Distinct useful results actually accepted (no default): gives the cost per result.
    #[arg(long, value_parser = values::positive_u64)]
    pub accepted_results: Option<u64>,
    /// Catalog CSV [default: data/tarifs-forfaits.csv if present, else the built-in copy].
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// List the catalog instead of pricing a package.
    #[arg(long, conflicts_with_all = ["gpu", "days", "lots", "accepted_results"])]
    pub list: bool,
    /// Every package that holds this budget (written by `mesure_memoire budget --output`),
    /// cheapest first.
    #[arg(long, conflicts_with_all = ["gpu", "days", "lots", "accepted_results", "list"])]
    pub fit: Option<PathBuf>,
    /// The most GPUs tried per offer (with --fit).
    #[arg(long, value_parser = values::positive_u64, default_value = "64", requires = "fit")]
    pub max_gpus: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Outcome {
    if let Some(path) = &args.fit {
        let budget = Budget::load(path)?;
        let catalog = Catalog::load(args.catalog.as_deref())?;
        super::budget::plan_and_print(&budget, &catalog, args.max_gpus, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let catalog = Catalog::load(args.catalog.as_deref())?;
    if args.list {
        super::print(&catalog, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(gpu), Some(days), Some(lots)) = (&args.gpu, args.days, args.lots) else {
        unreachable!("clap requires --gpu, --days and --lots without --list");
    };
    let order = Order {
        gpu,
        days,
        lots,
        accepted_results: args.accepted_results,
    };
    let q = catalog.quote(&order).context(format!(
        "cannot price --gpu {gpu} --days {days} --lots {lots}"
    ))?;
    super::print(&q, args.json)?;
    Ok(ExitCode::SUCCESS)
}

pub fn main() -> ExitCode {
    super::run_main("calcul_forfaits", |args: Args| run(&args))
}
