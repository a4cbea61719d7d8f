//! `mesure_memoire estimate|environment|measure`.
//!
//! `environment` and `measure` run in the companion program `mesure_memoire_torch`, installed
//! beside this one: that program links libtorch (crate `iteragpu-torch`), and this one never does.
//! So when libtorch cannot be loaded this program still says so clearly (exit code 2 for
//! `measure`, a report saying so for `environment`) instead of dying in the system's loader.

use super::shape::ShapeArgs;
pub use super::Mode;
use super::{say, values, Context, Outcome};
use crate::allocator::{ComputeCapability, WorkspaceSettings, Workspaces};
use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
use crate::estimate::WeightQuestion;
use crate::files;
use crate::gpu::Gpu;
use crate::measure::predict;
use crate::measure::{MeasureConfig, Measurement};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The runs people launch, as `budget --help` shows them.
const BUDGET_EXAMPLES: &str = "Examples:
  mesure_memoire budget --model Qwen/Qwen3-8B --mode inference --context 4096 --generated 512 --fit
  # TRL's SFTTrainer, LoRA with recomputation (--trainer: transformers' Trainer)
  mesure_memoire budget --model llama-3.1-8b --mode lora --sft --checkpointing --batch 4 --context 2048 --fit
  # generate sampling with top_p over 16 left-padded rows
  mesure_memoire budget --model llama-3.1-8b --mode inference --batch 16 --context 2048 --generated 256 --padded --sample --top-p 0.9 --fit
  # a 70B full fine-tuning over 8 to 64 GPUs, FSDP2's ranks replayed
  mesure_memoire budget --model llama-3.1-70b --mode full --checkpointing --context 1024 --gpus 8,16,32,64";

/// Weight-memory estimate, environment report and bounded GPU memory measurement.
#[derive(Debug, Parser)]
#[command(name = "mesure_memoire", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once per run: the size of the largest variant (the budget's flags) costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Estimate weight memory from a parameter count and a storage width (no GPU needed).
    Estimate(EstimateArgs),
    /// Report libtorch, CUDA, the GPU and the driver (valid even without a GPU).
    Environment(EnvironmentArgs),
    /// Measure the CUDA caching allocator phase by phase on a synthetic Linear -> GELU -> Linear.
    Measure(MeasureArgs),
    /// Run the allocated-vs-reserved lesson on a GPU in a fresh process and record every step.
    Lesson(super::lesson::LessonArgs),
    /// Predict every figure of `measure` with the allocator model, every block named (no GPU needed).
    Predict(PredictArgs),
    /// The GPU memory budget of a real model, term by term; with --fit, the packages that hold it.
    #[command(after_help = BUDGET_EXAMPLES)]
    Budget(super::budget::BudgetArgs),
    /// Vary one dimension over a range, each point measured in a fresh process; find the limit.
    Sweep(super::sweep::SweepArgs),
    /// Draw the per-phase chart of a measurement, or the chart of a sweep (SVG, no GPU needed).
    Plot {
        /// Measurement JSON written by `measure`.
        #[arg(long, required_unless_present = "sweep", conflicts_with = "sweep")]
        measurement: Option<PathBuf>,
        /// A sweep's folder (sweep.csv and sweep.json).
        #[arg(long)]
        sweep: Option<PathBuf>,
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
    /// A reserve in GiB added as a hypothesis (not a measurement): a plain decimal such as 4 or
    /// 1.5, kept exactly (at most 28 digits) and rounded up to a whole byte.
    #[arg(long, value_parser = values::gib, default_value = "0")]
    pub reserve_gib: crate::decimal::PlainDecimal,
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
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// New JSON result file; an existing file is never overwritten.
    #[arg(long)]
    pub output: PathBuf,
    /// Also draw the per-phase chart into this new SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Also record the allocator's block map at each phase's end and peak, every block named.
    #[arg(long)]
    pub blocks: bool,
    /// Do not print a line per phase on stderr.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct PredictArgs {
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// The GPU architecture, major.minor (9.0: H100, H200).
    #[arg(long, default_value = "9.0", value_parser = values::compute_capability)]
    pub compute_capability: ComputeCapability,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn main(mode: Mode) -> ExitCode {
    main_from(mode, std::env::args_os())
}

/// [`main`] of the command line `args` (the program's name first).
pub fn main_from(mode: Mode, args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    super::run_main_from("mesure_memoire", args, |args: Args| run(&args, mode))
}

pub fn run(args: &Args, mode: Mode) -> Outcome {
    match &args.command {
        Command::Estimate(a) => {
            let e = WeightQuestion {
                parameters: a.parameters,
                bits: a.bits,
                reserve_gib: a.reserve_gib,
            }
            .estimate()
            .context("invalid --parameters, --bits or --reserve-gib")?;
            super::print(&e, a.json)?;
        }
        Command::Environment(a) => {
            let report = match mode {
                Mode::Companion(gpu) => gpu.environment(Some(a.device)),
                Mode::Front => match super::handover::run_companion(&[]) {
                    Ok(code) => return Ok(code),
                    Err(why) => EnvironmentReport::companion_unreachable(
                        a.device,
                        why.companion_found,
                        why.message,
                    ),
                },
            };
            super::print(&report, a.json)?;
        }
        Command::Measure(a) => {
            // Flags and the output path are checked before any GPU work, in both processes.
            let config = a.shape.config(a.device)?;
            files::check_new_file(&a.output)?;
            if let Some(plot) = &a.plot {
                files::check_new_file(plot)?;
            }
            match mode {
                Mode::Companion(gpu) => run_measure(gpu, a, &config)?,
                Mode::Front => return super::handover::hand_over(&[]),
            }
        }
        Command::Lesson(a) => return super::lesson::run(a, mode),
        Command::Predict(a) => {
            let config = a.shape.config(CudaDevice { index: 0 })?;
            let settings = workspace_settings()?;
            let workspaces = Workspaces::for_gpu(a.compute_capability, &settings)?;
            let prediction = predict(&config, a.compute_capability, workspaces)?;
            super::print(&prediction, a.json)?;
        }
        Command::Budget(a) => return super::budget::run(a),
        Command::Sweep(a) => return super::sweep::run(a),
        Command::Plot {
            measurement,
            sweep,
            output,
        } => {
            let chart = match (measurement, sweep) {
                (Some(m), _) => Measurement::load(m)?.chart(),
                (None, Some(folder)) => crate::sweep::Sweep::load(folder)?.chart(),
                (None, None) => unreachable!("clap requires --measurement or --sweep"),
            };
            chart.write_new(output)?;
            say(format_args!("Written to {}", output.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_measure(
    gpu: &dyn Gpu,
    a: &MeasureArgs,
    config: &MeasureConfig,
) -> Result<(), super::Failure> {
    let model = config.model()?;
    let sizes = format!(
        "measuring [batch {}, context {}, width {}], hidden {}, {} on {} (parameters {} bytes, \
         input {} bytes, one hidden activation {} bytes)",
        config.batch,
        config.context,
        config.width,
        config.hidden(),
        config.dtype.name(),
        config.device,
        model.parameter_bytes,
        model.input_bytes,
        model.hidden_activation_bytes
    );
    let quiet = a.quiet;
    let mut result = gpu
        .measure(config, a.blocks, &mut |row| {
            if !quiet {
                eprintln!(
                    "{:<13} {:>3}  allocated peak {:>14}  reserved peak {:>14}  host {:>9.3} ms",
                    row.phase.name(),
                    row.repetition.map_or("".into(), |r| r.to_string()),
                    row.figures.peak_allocated_bytes,
                    row.figures.peak_reserved_bytes,
                    row.host_wall_time_ms
                );
            }
        })
        .context(sizes)?;
    // This process is the one that measured: the settings it reads are the ones libtorch used.
    result.attach_prediction(workspace_settings());
    files::write_new_json(&a.output, &result)?;
    say(&result)?;
    say(format_args!("Written to {}", a.output.display()))?;
    if let Some(plot) = &a.plot {
        result.chart().write_new(plot)?;
        say(format_args!("Chart written to {}", plot.display()))?;
    }
    Ok(())
}

/// The workspace settings of this process's environment (only the variables the model names).
fn workspace_settings() -> Result<WorkspaceSettings, crate::allocator::workspace::WorkspaceError> {
    WorkspaceSettings::from_lookup(|name| std::env::var(name).ok())
}
