//! `mesure_memoire estimate|environment|measure`.
//!
//! `environment` and `measure` run in the companion program `mesure_memoire_torch`, installed
//! beside this one: that program links libtorch (crate `iteragpu-torch`), and this one never does.
//! So when libtorch cannot be loaded this program still says so clearly (exit code 2 for
//! `measure`, a report saying so for `environment`) instead of dying in the system's loader.

use super::{say, signals, values, Context, Outcome};
use crate::allocator::{ComputeCapability, WorkspaceSettings, Workspaces};
use crate::companion::{Companion, Ended};
use crate::device::CudaDevice;
use crate::environment::EnvironmentReport;
use crate::estimate::estimate;
use crate::files;
use crate::gpu::Gpu;
use crate::measure::predict;
use crate::measure::{Dtype, MeasureConfig, MeasureError, Measurement};
use crate::status::Status;
use crate::sweep::Dimension;
use clap::{Parser, Subcommand};
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
    Budget(super::budget::BudgetArgs),
    /// Vary one dimension over a range, each point measured in a fresh process; find the limit.
    Sweep(super::sweep::SweepArgs),
    /// Measure a synthetic decoder-only transformer stage by stage (inference or training).
    Transformer(super::transformer::TransformerArgs),
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

/// The synthetic network and the passes of a measurement (shared by `measure`, `predict` and
/// `sweep`). Batch, context and width are required, except the one a sweep varies.
#[derive(Debug, clap::Args)]
pub struct ShapeArgs {
    /// Input batch size.
    #[arg(long, value_parser = values::positive_u64)]
    pub batch: Option<u64>,
    /// Positions per sample in the input [batch, context, width] (no attention, no KV cache).
    #[arg(long, value_parser = values::positive_u64)]
    pub context: Option<u64>,
    /// Input and output features.
    #[arg(long, value_parser = values::positive_u64)]
    pub width: Option<u64>,
    /// Hidden features [default: 4 × width].
    #[arg(long, value_parser = values::positive_u64)]
    pub hidden: Option<u64>,
    /// Element type of weights and inputs: float32, float16 or bfloat16.
    #[arg(long, value_parser = values::dtype)]
    pub dtype: Dtype,
    /// Warm-up passes, measured together in one row (0 to 10000).
    #[arg(long, value_parser = values::warmup)]
    pub warmup: u32,
    /// Warm passes measured one row each (1 to 10000).
    #[arg(long, value_parser = values::repeats)]
    pub repeats: u32,
}

impl ShapeArgs {
    /// The validated configuration on `device`; an invalid value is reported with its flag.
    pub fn config(&self, device: CudaDevice) -> Result<MeasureConfig, super::Failure> {
        self.build(None, device)
    }

    /// The configuration of a sweep over `dimension` starting at `from`: the varied dimension's
    /// own flag is refused (except `--hidden`, which the width follows when absent).
    pub fn config_varying(
        &self,
        dimension: Dimension,
        from: u64,
        device: CudaDevice,
    ) -> Result<MeasureConfig, super::Failure> {
        self.build(Some((dimension, from)), device)
    }

    fn build(
        &self,
        varying: Option<(Dimension, u64)>,
        device: CudaDevice,
    ) -> Result<MeasureConfig, super::Failure> {
        let pick = |dimension: Dimension, given: Option<u64>| -> Result<u64, super::Failure> {
            match (varying, given) {
                (Some((d, _)), Some(_)) if d == dimension => Err(FlagError(format!(
                    "--{dimension} is the dimension --vary sweeps: remove --{dimension}"
                ))
                .into()),
                (Some((d, from)), None) if d == dimension => Ok(from),
                (_, Some(v)) => Ok(v),
                (_, None) => Err(FlagError(format!("--{dimension} is required")).into()),
            }
        };
        let mut config = MeasureConfig {
            device,
            batch: pick(Dimension::Batch, self.batch)?,
            context: pick(Dimension::Context, self.context)?,
            width: pick(Dimension::Width, self.width)?,
            hidden: self.hidden,
            dtype: self.dtype,
            warmup: self.warmup,
            repeats: self.repeats,
        };
        if let Some((Dimension::Hidden, from)) = varying {
            if self.hidden.is_some() {
                return Err(FlagError(
                    "--hidden is the dimension --vary sweeps: remove --hidden".into(),
                )
                .into());
            }
            config.hidden = Some(from);
        }
        config
            .validated()
            .context("invalid --batch, --context, --width, --hidden, --warmup or --repeats")
    }
}

/// A flag missing or given where it must not be.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

impl crate::status::Classify for FlagError {
    fn status(&self) -> crate::status::Status {
        crate::status::Status::Usage
    }
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

/// Where `environment` and `measure` run.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// This program does not link libtorch: it hands GPU work to `mesure_memoire_torch`.
    Front,
    /// This program links libtorch: the GPU work runs here, through this backend.
    Engine(&'a dyn Gpu),
}

/// The companion program's file name.
pub const ENGINE: &str = crate::companion::PROGRAM;

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
            let e = estimate(a.parameters, a.bits, a.reserve_gib)
                .context("invalid --parameters, --bits or --reserve-gib")?;
            super::print(&e, a.json)?;
        }
        Command::Environment(a) => {
            let report = match mode {
                Mode::Engine(gpu) => gpu.environment(Some(a.device)),
                Mode::Front => match run_engine() {
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
                Mode::Engine(gpu) => run_measure(gpu, a, &config)?,
                Mode::Front => return hand_over_to_engine(),
            }
        }
        Command::Lesson(a) => return super::lesson::run(a, mode),
        Command::Transformer(a) => return super::transformer::run(a, mode),
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

/// Hands this command line over to the companion (see [`run_engine`]); a companion that is
/// missing or cannot be loaded is exit 2.
pub(super) fn hand_over_to_engine() -> Outcome {
    hand_over_to_engine_with(&[])
}

/// [`hand_over_to_engine`] with the variables `env` set in the companion's environment.
pub(super) fn hand_over_to_engine_with(env: &[(&str, &str)]) -> Outcome {
    run_engine_with(env).map_err(|why| {
        if why.companion_found {
            MeasureError::LibtorchNotLoadable(why.message)
        } else {
            MeasureError::NoCompanion {
                companion: ENGINE.into(),
            }
        }
        .into()
    })
}

/// Why the companion could not do the work.
struct EngineRefusal {
    /// The companion exists (then the loader or a signal stopped it).
    companion_found: bool,
    message: String,
}

/// Runs this same command line in the companion, passing its exit code through; Ctrl-C or
/// SIGTERM stops the companion (exit 130, no file). `Err` says why libtorch could not be used:
/// the companion is missing or the loader refused it.
fn run_engine() -> Result<ExitCode, EngineRefusal> {
    run_engine_with(&[])
}

/// [`run_engine`] with the variables `env` set in the companion's environment.
fn run_engine_with(env: &[(&str, &str)]) -> Result<ExitCode, EngineRefusal> {
    let companion = Companion::locate().map_err(|_| EngineRefusal {
        companion_found: false,
        message: format!("the GPU companion {ENGINE} is not installed beside this program"),
    })?;
    let refused = |message: String| EngineRefusal {
        companion_found: true,
        message,
    };
    signals::stop_companions_on_interrupt();
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // The file name alone in messages: a report never carries a path of this machine.
    match companion.run_with_env(&args, false, env) {
        Err(e) => Err(refused(format!("cannot start {ENGINE}: {e}"))),
        Ok(Ended::Interrupted) => Ok(Status::Interrupted.into()),
        Ok(Ended::Exited { status, .. }) => match status.code() {
            // The system loader could not load a library (it printed which one above).
            Some(crate::companion::LOADER_FAILED) => Err(refused(format!(
                "the system loader could not start {ENGINE} (message above); make libtorch \
                 reachable, e.g. LD_LIBRARY_PATH=<site-packages>/torch/lib:<site-packages>/nvidia/cu13/lib"
            ))),
            Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
            None => Err(refused(format!("{ENGINE} was killed by a signal"))),
        },
    }
}
