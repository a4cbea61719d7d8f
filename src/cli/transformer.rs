//! `mesure_memoire transformer`: a synthetic decoder-only transformer measured stage by stage on
//! the GPU (`budget::bench`). As for `measure`, the flags and the output path are checked in both
//! processes before any GPU work, and the work itself runs in the companion that links libtorch.

use super::handover::hand_over;
use super::Mode;
use super::{say, values, Context, Failure, Outcome};
use crate::budget::{BenchMode, BenchRun, LinearTarget};
use crate::device::CudaDevice;
use crate::files;
use crate::measure::{Dtype, MeasureError};
use std::path::PathBuf;
use std::process::ExitCode;

/// The LoRA rank when `--lora-rank` is not given.
pub const DEFAULT_LORA_RANK: u64 = 16;
/// The adapted modules when `--lora-targets` is not given.
pub const DEFAULT_LORA_TARGETS: [LinearTarget; 2] = [LinearTarget::Q, LinearTarget::V];

#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct TransformerArgs {
    /// The model: a preset, or its shape flag by flag (dense, full attention only).
    #[command(flatten)]
    pub model: super::budget::ModelArgs,
    /// Element type of weights and activations: float32, float16 or bfloat16.
    #[arg(long, value_parser = values::dtype)]
    pub dtype: Dtype,
    /// inference (prefill and decode), full (every weight trained) or lora (adapters trained).
    #[arg(long)]
    pub mode: BenchMode,
    /// Sequences per batch.
    #[arg(long, value_parser = values::positive_u64)]
    pub batch: u64,
    /// Prompt length (inference) or sequence length (training).
    #[arg(long, value_parser = values::positive_u64)]
    pub context: u64,
    /// Tokens decoded after the prompt, one step each (inference only) [default: 0].
    #[arg(long, value_parser = values::count_u64)]
    pub generated: Option<u64>,
    /// Rank of the LoRA adapters (lora only) [default: 16].
    #[arg(long, value_parser = values::positive_u64)]
    pub lora_rank: Option<u64>,
    /// Adapted modules, comma-separated among q,k,v,o,gate,up,down (lora only) [default: q,v].
    #[arg(long, value_delimiter = ',')]
    pub lora_targets: Option<Vec<LinearTarget>>,
    /// Full-layer recomputation: the forward pass keeps only each layer's input (training only).
    #[arg(long)]
    pub checkpointing: bool,
    /// Fused attention (scaled_dot_product_attention) instead of the explicit scores.
    #[arg(long)]
    pub flash_attention: bool,
    /// The GPU, cuda:N (there is no CPU fallback).
    #[arg(long, default_value = "cuda:0")]
    pub device: CudaDevice,
    /// New JSON result file; an existing file is never overwritten.
    #[arg(long)]
    pub output: PathBuf,
    /// Do not print the stage table.
    #[arg(long)]
    pub quiet: bool,
    /// Also record the allocator's block map at the end of the weights, KV cache, adapters and
    /// optimizer states stages, each block named after its tensor (`budget --against` compares
    /// them with the allocator model's).
    #[arg(long)]
    pub blocks: bool,
}

impl TransformerArgs {
    /// The validated run; a refusal names its flag.
    pub fn bench_run(&self) -> Result<BenchRun, Failure> {
        let lora = self.mode == BenchMode::Lora;
        let (_, shape) = self.model.shape()?;
        let run = BenchRun {
            shape,
            dtype: self.dtype,
            mode: self.mode,
            batch: self.batch,
            context: self.context,
            generated: self.generated.unwrap_or(0),
            lora_rank: self
                .lora_rank
                .unwrap_or(if lora { DEFAULT_LORA_RANK } else { 0 }),
            lora_targets: match &self.lora_targets {
                Some(targets) => targets.clone(),
                None if lora => DEFAULT_LORA_TARGETS.to_vec(),
                None => Vec::new(),
            },
            checkpointing: self.checkpointing,
            flash_attention: self.flash_attention,
            device: self.device,
            blocks: self.blocks,
        };
        run.validated().map_err(|e| {
            let flags = e.field().map_or_else(
                || "--batch, --context, --generated or the shape's flags".to_string(),
                |field| format!("--{}", field.replace('_', "-")),
            );
            Failure::from(e).context(format!("invalid {flags}"))
        })
    }
}

pub fn run(a: &TransformerArgs, mode: Mode) -> Outcome {
    let bench_run = a.bench_run()?;
    files::check_new_file(&a.output)?;
    let gpu = match mode {
        Mode::Front => return hand_over(&[]),
        Mode::Companion(gpu) => gpu,
    };
    let bench = gpu.transformer().ok_or_else(|| MeasureError::Torch {
        phase: None,
        message: "this GPU backend does not run the transformer bench".into(),
    })?;
    let report = bench
        .run(&bench_run)
        .context(format!("benching {}", bench_run.summary()))?;
    files::write_new_json(&a.output, &report)?;
    if !a.quiet {
        say(&report)?;
    }
    say(format_args!("Written to {}", a.output.display()))?;
    Ok(ExitCode::SUCCESS)
}
