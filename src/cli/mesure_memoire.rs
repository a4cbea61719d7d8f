//! `mesure_memoire estimate|environment|measure`.
//!
//! `environment` and `measure` run in the companion program `mesure_memoire_torch`, installed
//! beside this one: that program links libtorch (crate `iteragpu-torch`), and this one never does.
//! So when libtorch cannot be loaded this program still says so clearly (exit code 2 for
//! `measure`, a report saying so for `environment`) instead of dying in the system's loader.

use super::{say, values, Context, Outcome};
use crate::allocator::{predict, ComputeCapability, WorkspaceSettings, Workspaces};
use crate::device::CudaDevice;
use crate::environment::{EnvironmentReport, LibtorchInfo};
use crate::estimate::estimate;
use crate::files;
use crate::measure::{Dtype, Gpu, MeasureConfig, MeasureError, Measurement};
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
pub enum Command {
    /// Estimate weight memory from a parameter count and a storage width (no GPU needed).
    Estimate(EstimateArgs),
    /// Report libtorch, CUDA, the GPU and the driver (valid even without a GPU).
    Environment(EnvironmentArgs),
    /// Measure the CUDA caching allocator phase by phase on a synthetic Linear -> GELU -> Linear.
    Measure(MeasureArgs),
    /// Predict every figure of `measure` with the allocator model, every block named (no GPU needed).
    Predict(PredictArgs),
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

/// The synthetic network and the passes of a measurement (shared by `measure` and `predict`).
#[derive(Debug, clap::Args)]
pub struct ShapeArgs {
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
        MeasureConfig {
            device,
            batch: self.batch,
            context: self.context,
            width: self.width,
            hidden: self.hidden,
            dtype: self.dtype,
            warmup: self.warmup,
            repeats: self.repeats,
        }
        .validated()
        .context("invalid --batch, --context, --width, --hidden, --warmup or --repeats")
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
pub const ENGINE: &str = "mesure_memoire_torch";

pub fn main(mode: Mode) -> ExitCode {
    super::run_main("mesure_memoire", |args: Args| run(&args, mode))
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
                    Err(why) => EnvironmentReport::without_libtorch(
                        Some(a.device),
                        LibtorchInfo {
                            built_with: why.companion_found,
                            load_error: Some(why.message),
                            ..Default::default()
                        },
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
                Mode::Front => {
                    return run_engine().map_err(|why| {
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
            }
        }
        Command::Predict(a) => {
            let config = a.shape.config(CudaDevice { index: 0 })?;
            let settings = workspace_settings()?;
            let workspaces = Workspaces::for_gpu(a.compute_capability, &settings)?;
            let prediction = predict(&config, a.compute_capability, workspaces)?;
            super::print(&prediction, a.json)?;
        }
        Command::Plot {
            measurement,
            output,
        } => {
            let m = Measurement::load(measurement)?;
            m.chart().write_new(output)?;
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
                    row.peak_allocated_bytes,
                    row.peak_reserved_bytes,
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

/// Why the companion could not do the work.
struct EngineRefusal {
    /// The companion exists (then the loader or a signal stopped it).
    companion_found: bool,
    message: String,
}

fn engine_path() -> Option<PathBuf> {
    Some(std::env::current_exe().ok()?.with_file_name(ENGINE))
}

/// Runs this same command line in `mesure_memoire_torch`, passing its exit code through. `Err`
/// says why libtorch could not be used: the program is missing or the loader refused it.
fn run_engine() -> Result<ExitCode, EngineRefusal> {
    let missing = |message: String| EngineRefusal {
        companion_found: false,
        message,
    };
    let engine = engine_path().ok_or_else(|| missing("cannot locate this program".into()))?;
    if !engine.exists() {
        // The file name alone: a report never carries a path of this machine.
        return Err(missing(format!(
            "the GPU companion {ENGINE} is not installed beside this program"
        )));
    }
    let refused = |message: String| EngineRefusal {
        companion_found: true,
        message,
    };
    let status = std::process::Command::new(&engine)
        .args(std::env::args_os().skip(1))
        .status()
        .map_err(|e| refused(format!("cannot start {ENGINE}: {e}")))?;
    match status.code() {
        // 127: the system loader could not load a library (it printed which one above).
        Some(127) => Err(refused(format!(
            "the system loader could not start {ENGINE} (message above); make libtorch \
             reachable, e.g. LD_LIBRARY_PATH=<site-packages>/torch/lib:<site-packages>/nvidia/cu13/lib"
        ))),
        Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
        None => Err(refused(format!("{ENGINE} was killed by a signal"))),
    }
}
