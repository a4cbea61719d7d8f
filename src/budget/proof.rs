//! The GPU proof of the budget, read back: the reports `data/hf-proof-*.json` of real Hugging
//! Face workloads recorded by `scripts/gpu/hf-proof.py` and `scripts/gpu/hf-record.py` (on the
//! H200, and runs held out from the rules on an H100), each run replayed here as the budget
//! replays it and compared stage by stage (peaks of `allocated` and `reserved`), and the emulated
//! cards' outcomes against the replay on an allocator limited to the card.

use crate::allocator::size::LARGE_BUFFER;
use crate::files::{Input, JsonError};
use crate::replay::{Device, Loaded, Outside, OutsideBytes};
use crate::stack::run::{program, Run};
use serde::{Deserialize, Serialize};

/// The tag of a proof report.
pub const SCHEMA: &str = "iteragpu-lab/hf-proof/1";
/// The report recorded on the H200, shipped with the program.
pub const RECORDED: &str = include_str!("../../data/hf-proof-h200.json");
/// The runs of bitsandbytes' QLoRA and 8-bit AdamW recorded on the H200.
pub const RECORDED_BITSANDBYTES: &str = include_str!("../../data/hf-proof-bitsandbytes-h200.json");
/// The runs at a card's edge where the verdicts alternate, recorded on the H200.
pub const RECORDED_EDGE: &str = include_str!("../../data/hf-proof-edge-h200.json");
/// The runs at the planner's largest batch and one more on cards where the allocator frees its
/// cache and retries.
pub const RECORDED_RETRY: &str = include_str!("../../data/hf-proof-retry-h200.json");
/// The runs none of the replay's rules were derived from (`scripts/hf-proof-plan --held-out`).
pub const RECORDED_HELD_OUT: &str = include_str!("../../data/hf-proof-held-out-h200.json");
/// A blind round: models and configurations planned and recorded with the same code, no rule
/// changed after (`scripts/hf-proof-plan --blind`).
pub const RECORDED_BLIND: &str = include_str!("../../data/hf-proof-blind-h200.json");
/// A second blind round, planned and recorded with the code that places new segments as the
/// driver places them (`scripts/hf-proof-plan --second-blind`).
pub const RECORDED_SECOND_BLIND: &str = include_str!("../../data/hf-proof-second-blind-h200.json");
/// Runs through `transformers.Trainer`: the two its replay was derived from, then workloads and
/// cards none of its rules came from (`scripts/hf-proof-plan --trainer`).
pub const RECORDED_TRAINER: &str = include_str!("../../data/hf-proof-trainer-h200.json");
/// Gemma (1), Granite 3 and OLMo 2 at public widths (`scripts/hf-proof-plan --architectures`).
pub const RECORDED_ARCHITECTURES: &str =
    include_str!("../../data/hf-proof-architectures-h200.json");
/// QLoRA of checkpoints saved in NF4, on emulated cards
/// (`scripts/gpu/hf-proof-plan-prequantized.json`).
pub const RECORDED_PREQUANTIZED: &str = include_str!("../../data/hf-proof-prequantized-h200.json");
/// FSDP2 full training, rank by rank through PyTorch's fake process group (worlds of 2 to 64).
pub const RECORDED_FSDP: &str = include_str!("../../data/hf-proof-fsdp-h200.json");
/// FSDP2 full trainings held out from the derivation, and a rank alone on an emulated L4
/// (`scripts/gpu/hf-proof-plan-fsdp-held-out.json`).
pub const RECORDED_FSDP_HELD_OUT: &str =
    include_str!("../../data/hf-proof-fsdp-held-out-h200.json");
/// FSDP2 full trainings without a mixed-precision policy, and two ranks alone on emulated cards
/// (`scripts/gpu/hf-proof-plan-fsdp-pure.json`).
pub const RECORDED_FSDP_PURE: &str = include_str!("../../data/hf-proof-fsdp-pure-h200.json");
/// FSDP2 with PEFT LoRA: the derivation's ranks (`hf-record.py --sets distributed`), then ranks
/// held out and on an emulated card (`scripts/gpu/hf-proof-plan-fsdp-lora.json`).
pub const RECORDED_FSDP_LORA: &str = include_str!("../../data/hf-proof-fsdp-lora-h200.json");
pub const RECORDED_FSDP_LORA_HELD_OUT: &str =
    include_str!("../../data/hf-proof-fsdp-lora-held-out-h200.json");
/// Ranks of transformers' tensor parallelism serving a model, through PyTorch's fake process
/// group, and two alone on emulated cards (`scripts/gpu/hf-proof-plan-tp.json`).
pub const RECORDED_TP: &str = include_str!("../../data/hf-proof-tp-h200.json");
/// Ranks of DDP: the derivation's five again, ranks held out, and two alone on emulated cards
/// (`scripts/gpu/hf-proof-plan-ddp.json`, written by `scripts/ddp-proof-plan`).
pub const RECORDED_DDP: &str = include_str!("../../data/hf-proof-ddp-h200.json");
/// `transformers.Trainer` accumulating gradients: the two derivation runs, then runs held out and
/// on emulated cards (`scripts/gpu/hf-proof-plan-accumulation.json`).
pub const RECORDED_TRAINER_ACCUMULATION: &str =
    include_str!("../../data/hf-proof-trainer-accumulation-h200.json");
/// `transformers.Trainer` under fp16 with its gradient scaler: the two derivation runs, then runs
/// held out and on emulated cards (`scripts/gpu/hf-proof-plan-fp16.json`).
pub const RECORDED_TRAINER_FP16: &str = include_str!("../../data/hf-proof-trainer-fp16-h200.json");
/// Runs held out from the rules they prove, recorded on an H100 (`scripts/gpu/run-plans.sh`):
/// padded batches, the Trainer's options and TRL's SFTTrainer, left-padded `generate`
/// (`scripts/gpu/hf-proof-plan-padded.json`); beam search (`…-beams.json`); TRL's padding-free and
/// packed batches (`…-padding-free.json`); sampling (`…-sampling.json`).
pub const RECORDED_PADDED: &str = include_str!("../../data/hf-proof-padded-h100.json");
pub const RECORDED_BEAMS: &str = include_str!("../../data/hf-proof-beams-h100.json");
pub const RECORDED_PADDING_FREE: &str = include_str!("../../data/hf-proof-padding-free-h100.json");
pub const RECORDED_SAMPLING: &str = include_str!("../../data/hf-proof-sampling-h100.json");
pub const RECORDED_COMPLETION: &str = include_str!("../../data/hf-proof-completion-h100.json");
pub const RECORDED_NF4: &str = include_str!("../../data/hf-proof-nf4-h100.json");
/// The rest of the NF4 plan (`…-nf4-rest.json`): QLoRA from a checkpoint saved in NF4, and the
/// decodes of Mistral 7B and Gemma 2 2B.
pub const RECORDED_NF4_REST: &str = include_str!("../../data/hf-proof-nf4-rest-h100.json");
/// Cohere, GLM-4 and StarCoder2 at public widths, held out from the traces their rules were
/// derived from (`scripts/gpu/hf-proof-plan-cohere.json`, `…-glm4.json`, `…-starcoder2.json`).
pub const RECORDED_COHERE: &str = include_str!("../../data/hf-proof-cohere-h100.json");
pub const RECORDED_GLM4: &str = include_str!("../../data/hf-proof-glm4-h100.json");
pub const RECORDED_STARCODER2: &str = include_str!("../../data/hf-proof-starcoder2-h100.json");

/// One stage of a recorded run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedStage {
    pub stage: String,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub reserved_after: u64,
    /// `total − free − reserved` after the stage (the emulated card's memory included).
    pub outside_after: u64,
}

/// The memory an emulated card's process took beyond the card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Card {
    pub card_bytes: u64,
    pub taken_bytes: u64,
}

/// One recorded run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    /// `grid` (run with others) or `card` (alone, on an emulated card).
    pub kind: String,
    /// For a card: `fits` or `oom`, the planner's verdict.
    pub expect: Option<String>,
    pub spec: serde_json::Value,
    /// `ok`, `oom`, or for a card run `error`: it failed otherwise, a library's own error on a
    /// full device (cuDNN's attention, say).
    pub outcome: String,
    /// The stage that ran out of memory.
    #[serde(default)]
    pub oom_stage: Option<String>,
    /// The stage a run failed in otherwise than out of memory, and what the library said.
    #[serde(default)]
    pub failed_stage: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// For such a failure: the allocator's retries (it released its cache because the device was
    /// full) and the device memory left free at the end (less than a large segment: the device
    /// full to all but small tensors).
    #[serde(default)]
    pub alloc_retries: Option<u64>,
    #[serde(default)]
    pub free_at_end: Option<u64>,
    pub card: Option<Card>,
    pub stages: Vec<RecordedStage>,
}

/// A proof report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub source: String,
    pub records: Vec<Record>,
}

impl crate::files::Tagged for Report {
    const SCHEMA: &'static str = SCHEMA;
    const KIND: Input = Input::ProofReport;
    fn schema(&self) -> &str {
        &self.schema
    }
}

/// One stage compared.
#[derive(Debug, Clone, Serialize)]
pub struct StageCheck {
    pub stage: String,
    pub measured_allocated: u64,
    pub predicted_allocated: u64,
    pub measured_reserved: u64,
    pub predicted_reserved: u64,
}

impl StageCheck {
    /// The relative errors (predicted − measured) / measured, in percent.
    pub fn errors(&self) -> (f64, f64) {
        let e = |p: u64, m: u64| (p as f64 - m as f64) / (m.max(1) as f64) * 100.0;
        (
            e(self.predicted_allocated, self.measured_allocated),
            e(self.predicted_reserved, self.measured_reserved),
        )
    }
}

/// One run compared.
#[derive(Debug, Clone, Serialize)]
pub struct RunCheck {
    pub name: String,
    pub kind: String,
    pub stages: Vec<StageCheck>,
    /// The whole run's peaks: measured, predicted.
    pub peak_allocated: (u64, u64),
    pub peak_reserved: (u64, u64),
    /// What the process held outside the allocator at the end of its stages, the most at each
    /// step of its loading (card runs: alone on the GPU).
    pub outside: Option<OutsideBytes>,
    /// For a card: the outcome measured and the replay's on the card (`ok`, `oom in STAGE`, or
    /// measured `error in STAGE`), and how many stages each completed.
    pub card_outcome: Option<(String, String)>,
    pub stages_completed: Option<(usize, usize)>,
}

/// Why a report was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    #[error(transparent)]
    File(#[from] JsonError),
    #[error("{file}: record {record}: {message}")]
    Record {
        file: String,
        record: String,
        message: String,
    },
}

impl Report {
    /// Parses a report and checks its records: a known kind and outcome, stages with peaks of
    /// `allocated` not above those of `reserved`, a card for every card run.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Report, ProofError> {
        let r: Report = crate::files::parse_tagged(bytes, file)?;
        for rec in &r.records {
            let bad = |message: &str| ProofError::Record {
                file: file.into(),
                record: crate::text::printable(&rec.name).into_owned(),
                message: message.into(),
            };
            if !matches!(rec.kind.as_str(), "grid" | "card") {
                return Err(bad("kind: not grid or card"));
            }
            if !matches!(rec.outcome.as_str(), "ok" | "oom" | "error") {
                return Err(bad("outcome: not ok, oom or error"));
            }
            // A failure other than out of memory says something of a card only: where it
            // failed, the device full (the allocator released its cache for want of memory, or
            // less than one of its large segments was left free).
            let full = rec.alloc_retries.is_some_and(|r| r > 0)
                || rec.free_at_end.is_some_and(|f| f < LARGE_BUFFER);
            if rec.outcome == "error" && (rec.kind != "card" || rec.failed_stage.is_none() || !full)
            {
                return Err(bad(
                    "outcome: an error counts only on a card, with the stage it failed in, the \
                     device full (alloc_retries above 0 or free_at_end below 20 MiB)",
                ));
            }
            if rec.kind == "card" && (rec.card.is_none() || rec.expect.is_none()) {
                return Err(bad(
                    "card: a card run names its card and the verdict expected",
                ));
            }
            if let Some(s) = rec
                .stages
                .iter()
                .find(|s| s.peak_allocated > s.peak_reserved)
            {
                return Err(bad(&format!(
                    "stages: {} peaks allocated above reserved",
                    s.stage
                )));
            }
        }
        Ok(r)
    }

    /// The shipped report.
    pub fn recorded() -> Report {
        Report::shipped(RECORDED, "data/hf-proof-h200.json")
    }

    /// The shipped runs of bitsandbytes' QLoRA and 8-bit AdamW.
    pub fn recorded_bitsandbytes() -> Report {
        Report::shipped(
            RECORDED_BITSANDBYTES,
            "data/hf-proof-bitsandbytes-h200.json",
        )
    }

    /// The shipped runs at the edge of an emulated RTX 4090 where the verdicts alternate.
    pub fn recorded_edge() -> Report {
        Report::shipped(RECORDED_EDGE, "data/hf-proof-edge-h200.json")
    }

    /// The shipped runs on emulated cards where the run's unlimited peak of `reserved` is above
    /// the card: the planner's largest batch, and one more.
    pub fn recorded_retry() -> Report {
        Report::shipped(RECORDED_RETRY, "data/hf-proof-retry-h200.json")
    }

    /// The shipped runs on configurations and models the replay was not derived from.
    pub fn recorded_held_out() -> Report {
        Report::shipped(RECORDED_HELD_OUT, "data/hf-proof-held-out-h200.json")
    }

    /// The shipped blind round.
    pub fn recorded_blind() -> Report {
        Report::shipped(RECORDED_BLIND, "data/hf-proof-blind-h200.json")
    }

    /// The shipped second blind round.
    pub fn recorded_second_blind() -> Report {
        Report::shipped(
            RECORDED_SECOND_BLIND,
            "data/hf-proof-second-blind-h200.json",
        )
    }

    /// The shipped runs through `transformers.Trainer`.
    pub fn recorded_trainer() -> Report {
        Report::shipped(RECORDED_TRAINER, "data/hf-proof-trainer-h200.json")
    }

    /// The shipped runs of QLoRA of checkpoints saved in NF4.
    pub fn recorded_prequantized() -> Report {
        Report::shipped(
            RECORDED_PREQUANTIZED,
            "data/hf-proof-prequantized-h200.json",
        )
    }

    /// The shipped runs of Gemma (1), Granite 3 and OLMo 2.
    pub fn recorded_architectures() -> Report {
        Report::shipped(
            RECORDED_ARCHITECTURES,
            "data/hf-proof-architectures-h200.json",
        )
    }

    /// The shipped ranks of FSDP2 trainings.
    pub fn recorded_fsdp() -> Report {
        Report::shipped(RECORDED_FSDP, "data/hf-proof-fsdp-h200.json")
    }

    /// The shipped ranks of FSDP2 trainings held out from the derivation.
    pub fn recorded_fsdp_held_out() -> Report {
        Report::shipped(
            RECORDED_FSDP_HELD_OUT,
            "data/hf-proof-fsdp-held-out-h200.json",
        )
    }

    /// The shipped ranks of FSDP2 trainings without a mixed-precision policy.
    pub fn recorded_fsdp_pure() -> Report {
        Report::shipped(RECORDED_FSDP_PURE, "data/hf-proof-fsdp-pure-h200.json")
    }

    /// The shipped ranks of FSDP2 with LoRA the replay was derived from.
    pub fn recorded_fsdp_lora() -> Report {
        Report::shipped(RECORDED_FSDP_LORA, "data/hf-proof-fsdp-lora-h200.json")
    }

    /// The shipped ranks of FSDP2 with LoRA held out from the derivation.
    pub fn recorded_fsdp_lora_held_out() -> Report {
        Report::shipped(
            RECORDED_FSDP_LORA_HELD_OUT,
            "data/hf-proof-fsdp-lora-held-out-h200.json",
        )
    }

    /// The shipped ranks of tensor parallelism serving a model.
    pub fn recorded_tp() -> Report {
        Report::shipped(RECORDED_TP, "data/hf-proof-tp-h200.json")
    }

    /// The shipped ranks of DDP.
    pub fn recorded_ddp() -> Report {
        Report::shipped(RECORDED_DDP, "data/hf-proof-ddp-h200.json")
    }

    /// The shipped runs of the Trainer accumulating gradients.
    pub fn recorded_trainer_accumulation() -> Report {
        Report::shipped(
            RECORDED_TRAINER_ACCUMULATION,
            "data/hf-proof-trainer-accumulation-h200.json",
        )
    }

    /// The shipped runs of the Trainer under fp16.
    pub fn recorded_trainer_fp16() -> Report {
        Report::shipped(
            RECORDED_TRAINER_FP16,
            "data/hf-proof-trainer-fp16-h200.json",
        )
    }

    /// The shipped held-out runs of padded batches, the Trainer's options and the SFTTrainer.
    pub fn recorded_padded() -> Report {
        Report::shipped(RECORDED_PADDED, "data/hf-proof-padded-h100.json")
    }

    /// The shipped held-out runs of beam search.
    pub fn recorded_beams() -> Report {
        Report::shipped(RECORDED_BEAMS, "data/hf-proof-beams-h100.json")
    }

    /// The shipped held-out runs of TRL's padding-free and packed batches.
    pub fn recorded_padding_free() -> Report {
        Report::shipped(
            RECORDED_PADDING_FREE,
            "data/hf-proof-padding-free-h100.json",
        )
    }

    /// The shipped held-out runs of sampling.
    pub fn recorded_sampling() -> Report {
        Report::shipped(RECORDED_SAMPLING, "data/hf-proof-sampling-h100.json")
    }

    /// The shipped held-out runs of TRL's loss on the completion alone, and Phi-3 mini's
    /// Trainer LoRA on an L4 planned again.
    pub fn recorded_completion() -> Report {
        Report::shipped(RECORDED_COMPLETION, "data/hf-proof-completion-h100.json")
    }

    /// The shipped held-out runs of checkpoints saved in NF4 served by `generate`.
    pub fn recorded_nf4() -> Report {
        Report::shipped(RECORDED_NF4, "data/hf-proof-nf4-h100.json")
    }

    /// The shipped held-out runs of the NF4 plan's last four runs.
    pub fn recorded_nf4_rest() -> Report {
        Report::shipped(RECORDED_NF4_REST, "data/hf-proof-nf4-rest-h100.json")
    }

    /// The shipped held-out runs of Cohere (Aya Expanse 8B, Command R).
    pub fn recorded_cohere() -> Report {
        Report::shipped(RECORDED_COHERE, "data/hf-proof-cohere-h100.json")
    }

    /// The shipped held-out runs of GLM-4 (9B, 32B's widths).
    pub fn recorded_glm4() -> Report {
        Report::shipped(RECORDED_GLM4, "data/hf-proof-glm4-h100.json")
    }

    /// The shipped held-out runs of StarCoder2 (3B, 7B).
    pub fn recorded_starcoder2() -> Report {
        Report::shipped(RECORDED_STARCODER2, "data/hf-proof-starcoder2-h100.json")
    }

    /// Every shipped report recorded on the H200 (what the rules were derived from and proven on
    /// first; the held-out runs recorded on an H100 apart).
    pub fn all_recorded() -> [Report; 19] {
        [
            Report::recorded(),
            Report::recorded_held_out(),
            Report::recorded_blind(),
            Report::recorded_second_blind(),
            Report::recorded_bitsandbytes(),
            Report::recorded_edge(),
            Report::recorded_retry(),
            Report::recorded_trainer(),
            Report::recorded_architectures(),
            Report::recorded_prequantized(),
            Report::recorded_fsdp(),
            Report::recorded_fsdp_held_out(),
            Report::recorded_fsdp_pure(),
            Report::recorded_fsdp_lora(),
            Report::recorded_fsdp_lora_held_out(),
            Report::recorded_tp(),
            Report::recorded_ddp(),
            Report::recorded_trainer_accumulation(),
            Report::recorded_trainer_fp16(),
        ]
    }

    fn shipped(text: &str, file: &str) -> Report {
        Report::parse(text.as_bytes(), file).expect("the recorded proof is valid")
    }
}

/// Replays one record as the budget does and compares it.
pub fn check(rec: &Record) -> Result<RunCheck, crate::stack::spec::SpecError> {
    let run = Run::from_spec(&rec.spec)?;
    let expandable = rec
        .spec
        .get("expandable")
        .and_then(|e| e.as_bool())
        .unwrap_or(false);
    let config = super::compute::allocator_config(if expandable {
        super::workload::AllocatorSetting::ExpandableSegments
    } else {
        super::workload::AllocatorSetting::Default
    });
    let prog = program(&run);
    let unlimited = prog.replay(config, Device::Unlimited, OutsideBytes::NONE);
    // What the process held outside the allocator at the end of each stage, the most of each
    // step of its loading (as the program's stages say where they are).
    let outside = rec.card.as_ref().map(|c| {
        let (mut most, mut loaded) = (OutsideBytes::NONE, Loaded::Context);
        for (m, stage) in rec.stages.iter().zip(prog.stages()) {
            let held = m.outside_after.saturating_sub(c.taken_bytes);
            // What a process has loaded stays loaded (a second step's forward after a backward).
            loaded = loaded.max(stage.loaded);
            let step = match loaded {
                Loaded::Context => &mut most.context,
                Loaded::Forward => &mut most.forward,
                Loaded::Backward => &mut most.backward,
                Loaded::Decode => &mut most.decode,
            };
            *step = (*step).max(held);
        }
        most
    });
    // On a card: the replay on the card, the process holding what it loads outside the
    // allocator as it goes.
    let on_card = rec.card.as_ref().map(|c| {
        let card = Device::Card { room: c.card_bytes };
        let outside = match run.sharding {
            Some(_) => Outside::h200().bytes.with_fsdp2_kernels(),
            None => Outside::h200().bytes,
        };
        prog.replay(config, card, outside)
    });
    let stages_completed = on_card.as_ref().map(|r| (rec.stages.len(), r.stages.len()));
    let figures = match &on_card {
        Some(r) => &r.stages,
        None => &unlimited.stages,
    };
    let stages: Vec<StageCheck> = rec
        .stages
        .iter()
        .zip(figures)
        .map(|(m, (_, p, _))| StageCheck {
            stage: m.stage.clone(),
            measured_allocated: m.peak_allocated,
            predicted_allocated: p.peak_allocated_bytes,
            measured_reserved: m.peak_reserved,
            predicted_reserved: p.peak_reserved_bytes,
        })
        .collect();
    let max = |f: &dyn Fn(&StageCheck) -> u64| stages.iter().map(f).max().unwrap_or(0);
    Ok(RunCheck {
        name: rec.name.clone(),
        kind: rec.kind.clone(),
        peak_allocated: (
            max(&|s| s.measured_allocated),
            max(&|s| s.predicted_allocated),
        ),
        peak_reserved: (
            max(&|s| s.measured_reserved),
            max(&|s| s.predicted_reserved),
        ),
        outside,
        stages_completed,
        card_outcome: on_card.map(|r| {
            let measured = match rec.oom_stage.as_ref().or(rec.failed_stage.as_ref()) {
                Some(stage) => format!("{} in {stage}", rec.outcome),
                None => rec.outcome.clone(),
            };
            let predicted = match &r.out_of_memory {
                Some((stage, _)) => format!("oom in {stage}"),
                None => "ok".to_string(),
            };
            (measured, predicted)
        }),
        stages,
    })
}

impl RunCheck {
    /// Whether the card held the run as the replay said (`None` for a run on no card): it ran
    /// where the replay ran; where the replay ran out of memory it failed too, out of memory or
    /// in a library's own error on the full device (an `error`, which [`Report::parse`] accepts
    /// only after the allocator released its cache for want of memory), no earlier than the
    /// replay. Not earlier, but maybe later: the replay counts from the start what a process
    /// holds outside the allocator at its end, and a real one holds less before its kernels are
    /// loaded.
    pub fn card_outcome_holds(&self) -> Option<bool> {
        let (measured, predicted) = self.card_outcome.as_ref()?;
        let (measured_stages, predicted_stages) = self.stages_completed?;
        Some(match (measured == "ok", predicted == "ok") {
            (true, true) => true,
            (false, false) => measured_stages >= predicted_stages,
            _ => false,
        })
    }

    /// The whole run's relative errors in percent: (allocated, reserved).
    pub fn peak_errors(&self) -> (f64, f64) {
        let e = |(m, p): (u64, u64)| (p as f64 - m as f64) / (m.max(1) as f64) * 100.0;
        (e(self.peak_allocated), e(self.peak_reserved))
    }
}
