//! `mesure_memoire sweep`: one dimension varied over a range, each point in a fresh GPU process,
//! optionally the limit found (predicted, then verified), on one GPU or several in parallel.

use super::shape::ShapeArgs;
use super::{progress, say, signals, values, Context, Failure, Outcome};
use crate::companion::{Companion, CompanionRunner};
use crate::device::CudaDevice;
use crate::sweep::{
    self, Dimension, PointOutcome, PointRunner, PointStatus, Spacing, StopRule, Sweep,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct SweepArgs {
    /// The GPU, cuda:N.
    #[arg(long, default_value = "cuda:0", conflicts_with = "devices")]
    pub device: CudaDevice,
    /// Several GPUs, e.g. cuda:0,cuda:1: points run in parallel, one process per GPU.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<CudaDevice>,
    /// The dimension varied: batch, context, width or hidden.
    #[arg(long, value_parser = values::dimension)]
    pub vary: Dimension,
    /// First value.
    #[arg(long, value_parser = values::positive_u64)]
    pub from: u64,
    /// Last value.
    #[arg(long, value_parser = values::positive_u64)]
    pub to: u64,
    /// Evenly spaced values, both ends included [default: 10].
    #[arg(long, value_parser = values::steps, conflicts_with_all = ["step", "geometric"])]
    pub steps: Option<u32>,
    /// Values from --from by this step.
    #[arg(long, value_parser = values::positive_u64, conflicts_with = "geometric")]
    pub step: Option<u64>,
    /// Values doubling from --from, and --to.
    #[arg(long)]
    pub geometric: bool,
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// The folder of the results: sweep.csv, sweep.json and one measurement per point.
    #[arg(long)]
    pub output: PathBuf,
    /// Find the largest value that fits: predicted by the allocator model, verified on both sides.
    #[arg(long)]
    pub find_limit: bool,
    /// Continue the sweep in --output, skipping the points already there.
    #[arg(long)]
    pub resume: bool,
    /// Measure every value even after two points in a row ran out of memory.
    #[arg(long)]
    pub keep_going: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(a: &SweepArgs) -> Outcome {
    let base = a
        .shape
        .config_varying(a.vary, a.from, CudaDevice { index: 0 })?;
    let spacing = match (a.steps, a.step, a.geometric) {
        (_, Some(s), _) => Spacing::Step(s),
        (_, _, true) => Spacing::Geometric,
        (k, _, _) => Spacing::Steps(k.unwrap_or(10)),
    };
    let planned =
        sweep::values(a.from, a.to, spacing).context("invalid --from, --to or spacing")?;
    for v in [a.from, a.to] {
        a.vary
            .apply(&base, v)
            .validated()
            .context(format!("invalid --{} {v}", a.vary))?;
    }
    let devices = if a.devices.is_empty() {
        vec![a.device]
    } else {
        a.devices.clone()
    };
    let companion = Companion::locate()?;
    signals::stop_companions_on_interrupt();
    let mut sweep = Sweep::open(&a.output, a.vary, a.from, a.to, &base, a.resume)?;
    let started = Instant::now();
    if a.find_limit {
        // Verification points run alone on the first GPU.
        let mut runner = Reporting::new(
            CompanionRunner::new(companion, devices[0]),
            progress::bar(log2_span(a.from, a.to) + 3, a.quiet),
            a.vary,
        );
        let search = sweep::find_limit(&mut sweep, &mut runner, a.from, a.to)?;
        runner.bar.finish_and_clear();
        say(&sweep)?;
        say(format_args!(
            "Limit of {}: predicted {}, found {} ({}), {} point(s), {:.1} s",
            a.vary,
            search.predicted.map_or("-".into(), |v| v.to_string()),
            search.found.map_or("none".into(), |v| v.to_string()),
            search.how,
            search.points,
            started.elapsed().as_secs_f64()
        ))?;
    } else {
        run_points(&mut sweep, &companion, &devices, &planned, a)?;
        say(&sweep)?;
        say(format_args!(
            "{} point(s) in {:.1} s, results in {}",
            sweep.rows.len(),
            started.elapsed().as_secs_f64(),
            a.output.display()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn log2_span(from: u64, to: u64) -> u64 {
    u64::from(64 - (to - from).leading_zeros())
}

/// Runs the planned points, one fresh process each, over `devices` in parallel, with a progress
/// bar; stops after two out-of-memory points in a row (in value order) unless --keep-going.
fn run_points(
    sweep: &mut Sweep,
    companion: &Companion,
    devices: &[CudaDevice],
    planned: &[u64],
    a: &SweepArgs,
) -> Result<(), Failure> {
    let done = planned.iter().filter(|v| sweep.row(**v).is_some()).count();
    let bar = progress::bar(planned.len() as u64, a.quiet);
    bar.set_position(done as u64);
    let runners = devices
        .iter()
        .map(|d| {
            Box::new(CompanionRunner::new(companion.clone(), *d)) as Box<dyn PointRunner + Send>
        })
        .collect();
    let stop = if a.keep_going {
        StopRule::Never
    } else {
        StopRule::TwoOutOfMemoryInARow
    };
    let result = sweep::run(sweep, planned, runners, stop, &|s: &Sweep, row| {
        let ooms = s
            .rows
            .iter()
            .filter(|r| r.status == PointStatus::Oom)
            .count();
        bar.inc(1);
        bar.set_message(progress(a.vary, row.value, ooms));
    });
    bar.finish_and_clear();
    Ok(result?)
}

/// The progress bar's message: the current value and the out-of-memory count.
fn progress(dimension: Dimension, value: u64, ooms: usize) -> String {
    format!("{dimension} = {value}, out of memory: {ooms}")
}

/// A runner that moves the progress bar (for the limit search, whose length is not known).
struct Reporting {
    inner: CompanionRunner,
    bar: indicatif::ProgressBar,
    dimension: Dimension,
    ooms: usize,
}

impl Reporting {
    fn new(inner: CompanionRunner, bar: indicatif::ProgressBar, dimension: Dimension) -> Self {
        Reporting {
            inner,
            bar,
            dimension,
            ooms: 0,
        }
    }
}

impl PointRunner for Reporting {
    fn run(
        &mut self,
        config: &crate::measure::MeasureConfig,
        output: &std::path::Path,
    ) -> PointOutcome {
        let value = self.dimension.value_of(config);
        self.bar
            .set_message(progress(self.dimension, value, self.ooms));
        let outcome = self.inner.run(config, output);
        if let PointOutcome::OutOfMemory { .. } = outcome {
            self.ooms += 1;
        }
        if self.bar.position() + 1 >= self.bar.length().unwrap_or(0) {
            self.bar.inc_length(1);
        }
        self.bar.inc(1);
        outcome
    }
}
