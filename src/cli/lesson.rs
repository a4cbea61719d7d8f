//! `mesure_memoire lesson`: the live lesson of `notebooks/allocated-vs-reserved.ipynb` run on a
//! GPU in the companion program (one fresh process), every step's figures, the allocator's
//! statistics and its map written to a new JSON file. The front program hands it over exactly as
//! it does `measure`; with `--expandable-segments` it also sets
//! `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the companion's environment.

use super::handover::hand_over;
use super::Mode;
use super::{say, Context, Failure, Outcome};
use crate::device::CudaDevice;
use crate::files;
use crate::lesson::record::{alloc_conf_for, ALLOC_CONF, EXPANDABLE_SEGMENTS};
use crate::lesson::LessonScript;
use crate::measure::MeasureError;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct LessonArgs {
    /// The GPU to run the lesson on, cuda:N (there is no CPU fallback).
    #[arg(long)]
    pub device: CudaDevice,
    /// New JSON file for the record; an existing file is never overwritten.
    #[arg(long)]
    pub output: PathBuf,
    /// Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set for the GPU process unless it
    /// is already exactly that; any other value is refused, never merged).
    #[arg(long)]
    pub expandable_segments: bool,
    /// Do not print the steps.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(a: &LessonArgs, mode: Mode) -> Outcome {
    // Checked before any GPU work, in both processes.
    let current = std::env::var_os(ALLOC_CONF);
    let set = alloc_conf_for(a.expandable_segments, current.as_deref())?;
    files::check_new_file(&a.output)?;
    let gpu = match mode {
        Mode::Companion(gpu) => gpu,
        Mode::Front => {
            let env: Vec<(&str, &std::ffi::OsStr)> = set
                .map(|v| (ALLOC_CONF, std::ffi::OsStr::new(v)))
                .into_iter()
                .collect();
            return hand_over(&env);
        }
    };
    if set.is_some() {
        return Err(Failure::usage(
            "--expandable-segments needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the \
             GPU process's environment: run it through mesure_memoire, which sets it",
        ));
    }
    let configuration = current.map(|v| v.to_string_lossy().into_owned());
    let record = gpu
        .lesson(a.device, &LessonScript::standard(), configuration)
        .context(format!("running the lesson on {}", a.device))?;
    if a.expandable_segments && !record.allocator_settings.expandable_segments {
        return Err(MeasureError::Torch {
            phase: None,
            message: format!(
                "{ALLOC_CONF}={EXPANDABLE_SEGMENTS} was set, but the allocator reports expandable \
                 segments off (settings it parsed: `{}`; another variable such as \
                 PYTORCH_ALLOC_CONF takes precedence, or this platform lacks them): no file \
                 written",
                record.allocator_settings.parsed
            ),
        }
        .into());
    }
    files::write_new_json(&a.output, &record)?;
    if !a.quiet {
        say(&record)?;
    }
    say(format_args!("Written to {}", a.output.display()))?;
    Ok(ExitCode::SUCCESS)
}
