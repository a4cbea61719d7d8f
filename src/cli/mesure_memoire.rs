//! `mesure_memoire estimate|environment|measure`.
//!
//! `environment` and `measure` run in the companion program `mesure_memoire_torch` when it is
//! installed beside this one: that program links libtorch, and this one, built without the
//! `torch` feature (as `scripts/build` does), does not. So when libtorch cannot be loaded this
//! program still says so clearly (exit code 2 for `measure`, a report saying so for
//! `environment`) instead of dying in the system's loader. Without a companion, the work runs in
//! this process (through libtorch if this build has it, else exit code 2).

use super::values;
use crate::device::CudaDevice;
use crate::environment::{EnvironmentReport, LibtorchInfo};
use crate::estimate::estimate;
use crate::files;
use crate::measure::{self, Dtype, MeasureConfig, MeasureError, Measurement};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rust_decimal::Decimal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Weight-memory estimate, environment report and bounded GPU memory measurement.
#[derive(Debug, Parser)]
#[command(name = "mesure_memoire", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Estimate weight memory from a parameter count and a storage width (no GPU needed).
    Estimate(EstimateArgs),
    /// Report libtorch, CUDA, the GPU and the driver (valid even without a GPU).
    Environment(EnvironmentArgs),
    /// Measure the CUDA caching allocator phase by phase on a synthetic Linear -> GELU -> Linear.
    Measure(MeasureArgs),
    /// Draw the per-phase chart (SVG) of a measurement file (no GPU needed).
    Plot {
        /// Measurement JSON written by `measure`.
        #[arg(long)]
        measurement: PathBuf,
        /// New SVG file; an existing file is never overwritten.
        #[arg(long)]
        output: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct EstimateArgs {
    /// Number of parameters, a positive integer.
    #[arg(long, value_parser = values::positive_u64)]
    pub parameters: u64,
    /// Storage width per parameter in bits (1 to 64), rounded up to whole bytes.
    #[arg(long, value_parser = values::bits)]
    pub bits: u32,
    /// A reserve in GiB added as a hypothesis (not a measurement).
    #[arg(long, value_parser = values::gib, default_value = "0")]
    pub reserve_gib: Decimal,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct EnvironmentArgs {
    /// The GPU to describe, cuda:N.
    #[arg(long, default_value = "cuda:0")]
    pub device: CudaDevice,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct MeasureArgs {
    /// The GPU to measure, cuda:N (there is no CPU fallback).
    #[arg(long)]
    pub device: CudaDevice,
    /// Input batch size.
    #[arg(long, value_parser = values::positive_u64)]
    pub batch: u64,
    /// Positions per sample in the input [batch, context, width] (no attention, no KV cache).
    #[arg(long, value_parser = values::positive_u64)]
    pub context: u64,
    /// Input and output features.
    #[arg(long, value_parser = values::positive_u64)]
    pub width: u64,
    /// Hidden features [default: 4 × width].
    #[arg(long, value_parser = values::positive_u64)]
    pub hidden: Option<u64>,
    /// Element type of weights and inputs.
    #[arg(long, value_enum)]
    pub dtype: Dtype,
    /// Warm-up passes, measured together in one row (0 allowed).
    #[arg(long, value_parser = values::count_u32)]
    pub warmup: u32,
    /// Warm passes measured one row each.
    #[arg(long, value_parser = values::positive_u32)]
    pub repeats: u32,
    /// New JSON result file; an existing file is never overwritten.
    #[arg(long)]
    pub output: PathBuf,
    /// Also draw the per-phase chart into this new SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Do not print a line per phase on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl MeasureArgs {
    pub fn config(&self) -> Result<MeasureConfig, MeasureError> {
        Ok(MeasureConfig::new(
            self.device,
            self.batch,
            self.context,
            self.width,
            self.hidden,
            self.dtype,
            self.warmup,
            self.repeats,
        )?)
    }
}

/// Where `environment` and `measure` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Hands GPU work to `mesure_memoire_torch` when it is installed beside this program.
    Front,
    /// This process links libtorch and does the work itself.
    Engine,
}

/// The companion program's file name.
pub const ENGINE: &str = "mesure_memoire_torch";

pub fn main(mode: Mode) -> ExitCode {
    super::run_main("mesure_memoire", |args: Args| run(&args, mode))
}

pub fn run(args: &Args, mode: Mode) -> Result<ExitCode> {
    let delegate = mode == Mode::Front && engine_path().is_some_and(|p| p.exists());
    match &args.command {
        Command::Estimate(a) => {
            super::print(&estimate(a.parameters, a.bits, a.reserve_gib)?, a.json)?;
        }
        Command::Environment(a) => {
            let report = if delegate {
                match run_engine() {
                    Ok(code) => return Ok(code),
                    Err(why) => EnvironmentReport::without_libtorch(
                        Some(a.device),
                        LibtorchInfo {
                            built_with: true,
                            load_error: Some(why),
                            ..Default::default()
                        },
                    ),
                }
            } else {
                EnvironmentReport::collect(Some(a.device))
            };
            super::print(&report, a.json)?;
        }
        Command::Measure(a) => {
            // Flags and the output path are checked before any GPU work, in both processes.
            let config = a.config()?;
            files::check_new_file(&a.output)?;
            if let Some(plot) = &a.plot {
                files::check_new_file(plot)?;
            }
            if delegate {
                return run_engine().map_err(|why| MeasureError::LibtorchNotLoadable(why).into());
            }
            run_measure(a, &config)?;
        }
        Command::Plot {
            measurement,
            output,
        } => {
            let m = Measurement::load(measurement)?;
            m.chart().write_new(output)?;
            println!("Written to {}", output.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_measure(a: &MeasureArgs, config: &MeasureConfig) -> Result<()> {
    let model = config.model()?;
    let sizes = format!(
        "measuring [batch {}, context {}, width {}], hidden {}, {} on {} (parameters {} bytes, \
         input {} bytes, one hidden activation {} bytes)",
        config.batch,
        config.context,
        config.width,
        config.hidden,
        config.dtype.name(),
        config.device,
        model.parameter_bytes,
        model.input_bytes,
        model.hidden_activation_bytes
    );
    let quiet = a.quiet;
    let result = measure::measure(config, |row| {
        if !quiet {
            eprintln!(
                "{:<13} {:>3}  allocated peak {:>14}  reserved peak {:>14}  host {:>9.3} ms",
                row.phase.name(),
                row.repetition.map_or("".into(), |r| r.to_string()),
                row.peak_allocated_bytes,
                row.peak_reserved_bytes,
                row.host_wall_time_ms
            );
        }
    })
    .context(sizes)?;
    files::write_new_json(&a.output, &result)?;
    println!("{result}");
    println!("Written to {}", a.output.display());
    if let Some(plot) = &a.plot {
        result.chart().write_new(plot)?;
        println!("Chart written to {}", plot.display());
    }
    Ok(())
}

fn engine_path() -> Option<PathBuf> {
    Some(std::env::current_exe().ok()?.with_file_name(ENGINE))
}

/// Runs this same command line in `mesure_memoire_torch`, passing its exit code through. `Err`
/// says why libtorch could not be used: the program is missing or the loader refused it.
fn run_engine() -> Result<ExitCode, String> {
    let engine = engine_path().ok_or("cannot locate this program")?;
    let status = std::process::Command::new(&engine)
        .args(std::env::args_os().skip(1))
        .status()
        .map_err(|e| format!("cannot start {}: {e}", engine.display()))?;
    match status.code() {
        // 127: the system loader could not load a library (it printed which one above).
        Some(127) => Err(format!(
            "the system loader could not start {} (message above); make libtorch reachable, \
             e.g. LD_LIBRARY_PATH=<site-packages>/torch/lib:<site-packages>/nvidia/cu13/lib",
            engine.display()
        )),
        Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
        None => Err(format!("{} was killed by a signal", engine.display())),
    }
}
