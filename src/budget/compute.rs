//! The budget of a workload on one GPU: the Hugging Face run replayed through the allocator
//! model (every allocation and free in the real stack's order) gives the peaks of `allocated`
//! and `reserved`, and the moment the card is fullest (`reserved` and what lives outside the
//! allocator by then); its terms ([`super::terms`]) say what each part of the run holds then. The
//! card needs that, the reserve, and the margin the proof measured.

use super::settings::{BudgetSettings, MARGIN_PPM, MARGIN_SOURCE};
use super::terms::{self, Place, Term};
use super::workload::{AllocatorSetting, Workload};
use crate::allocator::AllocatorConfig;
use crate::replay::{Outside, Plan, Program, Replayed, Watched};
use crate::stack::process::Kernels;
use crate::stack::run::replays;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// One stage of the replayed run and its peaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagePeak {
    pub stage: String,
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    /// What lives outside the allocator during the stage.
    pub outside: Bytes,
}

/// The tag of a budget file.
pub const SCHEMA: &str = "iteragpu-lab/budget/3";

/// The budget of a workload on one GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Budget {
    pub schema: String,
    pub workload: Workload,
    pub parameters: u64,
    /// The parameters training updates: those that get a gradient (not a vision tower's).
    pub trainable_parameters: u64,
    /// What each part of the run holds when the card is fullest, then what is outside the
    /// allocator and the reserve; the `at_peak` column sums to `total`.
    pub terms: Vec<Term>,
    /// The replayed run's stages.
    pub stages: Vec<StagePeak>,
    /// The stage where the card is fullest.
    pub peak_stage: String,
    /// The allocator's own peaks.
    pub peak_allocated: Bytes,
    pub peak_reserved: Bytes,
    /// The most the card held in use: `allocated` and what lived outside the allocator then.
    pub peak_in_use: Bytes,
    /// What lived outside the allocator when the card was fullest.
    pub outside_allocator: Bytes,
    /// The proof's worst error on `reserved`, in bytes of this budget.
    pub margin: Bytes,
    pub margin_source: String,
    /// The card at its fullest (`reserved` and what lives outside the allocator) and the
    /// reserve: what the card must have, before the margin.
    pub total: Bytes,
    /// `total` + the margin: what the planner asks of a GPU.
    pub needed: Bytes,
    pub outside: Outside,
    pub kernels: Kernels,
    /// The checkpoint's headers, when the model was read from its folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::model::folder::Checkpoint>,
    /// The programs of the workload's runs (one per order its masks may take), kept for the
    /// planner's replays on a card (not in the file: read back, they are emulated again when
    /// needed).
    #[serde(skip)]
    pub programs: Vec<std::sync::Arc<Program>>,
    /// The replays limited to a card that the budget's own replay showed needed and ran beside
    /// it (not in the file).
    #[serde(skip)]
    pub replayed_on_cards: Vec<CardReplay>,
}

/// Whether one of a budget's programs completed on a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardReplay {
    /// Its index in [`Budget::programs`].
    pub program: usize,
    /// The card's room: its memory less the reserve.
    pub room: u64,
    pub allocator: AllocatorSetting,
    pub completed: bool,
}

/// The allocator configuration of a workload's setting, new segments placed as the CUDA driver
/// placed them in a transformers process (where equal free blocks tie, the allocator picks the
/// lowest address: docs/allocator-model.md).
pub fn allocator_config(setting: AllocatorSetting) -> AllocatorConfig {
    AllocatorConfig {
        expandable_segments: setting == AllocatorSetting::ExpandableSegments,
        address_order: crate::allocator::AddressOrder::Driver,
    }
}

/// The budget of a validated workload, with the programs of its runs (for the verdicts on
/// cards).
pub fn budget(w: &Workload, settings: &BudgetSettings) -> Budget {
    budget_on_cards(w, settings, &[])
}

/// The plan of a budget's replay that keeps its program and watches `rooms` under both
/// allocator settings (`configs`: the workload's first), at most `at_most` limited replays at once.
pub(crate) fn watching_plan<'a>(
    configs: &'a [AllocatorConfig; 2],
    rooms: &'a [u64],
    settings: &BudgetSettings,
    at_most: usize,
) -> Plan<'a> {
    let outside = settings.outside.bytes;
    Plan {
        keep: true,
        under: &configs[..1],
        outside,
        watch: Some(Watched {
            rooms,
            configs,
            outside,
            at_most,
        }),
    }
}

/// The budget of a validated workload, with the programs of its runs and, for cards of each of
/// `rooms` bytes (their memory less the reserve), the replays limited to the card under both
/// settings that its replay showed needed, run beside it ([`crate::replay::Watched`]).
pub fn budget_on_cards(w: &Workload, settings: &BudgetSettings, rooms: &[u64]) -> Budget {
    let mut rooms = rooms.to_vec();
    rooms.sort_unstable();
    rooms.dedup();
    let allocators = [w.allocator, w.allocator.other()];
    let configs = allocators.map(allocator_config);
    let plan = watching_plan(&configs, &rooms, settings, Watched::two_a_core());
    let mut replayed_on_cards = Vec::new();
    let mut programs = Vec::new();
    let mut unlimited = Vec::new();
    for (program, run) in w.runs(settings.kernels).iter().enumerate() {
        let mut r = replays(run, &plan);
        replayed_on_cards.extend(r.on_cards.into_iter().map(|l| CardReplay {
            program,
            room: l.room,
            allocator: allocators[l.config],
            completed: l.completed,
        }));
        programs.push(std::sync::Arc::new(r.program));
        unlimited.push(r.unlimited.remove(0));
    }
    Budget {
        programs,
        replayed_on_cards,
        ..of_replays(w, settings, &unlimited)
    }
}

/// The budget of a validated workload alone: the programs of its runs are not kept (verdicts
/// on cards emulate them again), so that a long run takes no memory for its events.
pub fn budget_alone(w: &Workload, settings: &BudgetSettings) -> Budget {
    let plan = Plan {
        keep: false,
        under: &[allocator_config(w.allocator)],
        outside: settings.outside.bytes,
        watch: None,
    };
    let unlimited: Vec<Replayed> = w
        .runs(settings.kernels)
        .iter()
        .map(|run| replays(run, &plan).unlimited.remove(0))
        .collect();
    of_replays(w, settings, &unlimited)
}

/// The budget from the replays of a workload's runs: of several possible runs, the one that
/// needs the most.
fn of_replays(w: &Workload, settings: &BudgetSettings, replays: &[Replayed]) -> Budget {
    let worst = replays
        .iter()
        .max_by_key(|r| (r.peak_device, r.peak_reserved, r.peak_allocated))
        .expect("a workload makes a run");
    of_replay(w, settings, worst)
}

/// The budget of `w` from a replay of its run.
pub fn of_replay(w: &Workload, settings: &BudgetSettings, r: &Replayed) -> Budget {
    // Bounded sizes keep these sums far below 2^64; saturating, an absurd reserve given to the
    // library fits no card rather than wrapping into a small total.
    let total = r.peak_device.saturating_add(settings.reserve_bytes);
    let margin = r
        .peak_reserved
        .div_ceil(1_000_000)
        .saturating_mul(MARGIN_PPM);
    Budget {
        schema: SCHEMA.into(),
        workload: w.clone(),
        parameters: w.model.parameter_count(),
        trainable_parameters: terms::trained_parameters(w).1,
        terms: terms::terms(w, settings, r),
        stages: r
            .stages
            .iter()
            .map(|(stage, f, outside)| StagePeak {
                stage: stage.clone(),
                peak_allocated: Bytes(f.peak_allocated_bytes),
                peak_reserved: Bytes(f.peak_reserved_bytes),
                outside: Bytes(*outside),
            })
            .collect(),
        peak_stage: r.peak_stage.clone(),
        peak_allocated: Bytes(r.peak_allocated),
        peak_reserved: Bytes(r.peak_reserved),
        peak_in_use: Bytes(r.peak_device_allocated),
        outside_allocator: Bytes(r.outside_at_peak),
        margin: Bytes(margin),
        margin_source: MARGIN_SOURCE.into(),
        total: Bytes(total),
        needed: Bytes(total.saturating_add(margin)),
        outside: settings.outside.clone(),
        kernels: settings.kernels,
        checkpoint: None,
        programs: Vec::new(),
        replayed_on_cards: Vec::new(),
    }
}

impl crate::files::Tagged for Budget {
    const SCHEMA: &'static str = SCHEMA;
    const KIND: crate::files::Input = crate::files::Input::Budget;
    fn schema(&self) -> &str {
        &self.schema
    }
}

impl Budget {
    /// What the terms of `place` hold at the peak.
    pub fn held_at_peak(&self, place: Place) -> u64 {
        self.terms
            .iter()
            .filter(|t| t.place == place)
            .fold(0u64, |s, t| s.saturating_add(t.at_peak.0))
    }

    /// The card at its fullest, the reserve left out: what the run needs of a card's room.
    pub fn peak_use(&self) -> u64 {
        self.total
            .0
            .saturating_sub(self.held_at_peak(Place::Reserve))
    }
}
