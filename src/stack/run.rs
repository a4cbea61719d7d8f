//! One Hugging Face workload run from start to end, stage by stage, as the GPU proof script
//! (`scripts/gpu/hf-run.py`) runs it: the model's weights loaded, its adapters, its inputs,
//! then `generate` (prefill, decode) or training steps (forward, backward, optimizer). The
//! result is a program: every allocation and free, and where each stage begins and ends.

use super::decoder::{Adapter, Decoder, Weights};
use super::generate::{self, Stages};
use super::ops::{Kernels, Process};
use super::optimizer::{Optimizer, OptimizerImpl, OptimizerState};
use super::tensor::{Chunk, Elem, Event, Role, Tensor};
use crate::allocator::{AllocatorConfig, OutOfMemory};
use crate::dtype::Dtype;
use crate::model::{Model, Parameter, TensorRole};
use crate::reading::Figures;
use rustc_hash::FxHashMap;

/// How the weights reach the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loading {
    /// `from_pretrained(..., device_map=...)`: transformers' allocator warm-up (one block of
    /// the weights' total size, freed), then each tensor in the checkpoint's (sorted) order.
    Pretrained,
    /// `from_config` built on the device: each tensor in the order the modules make them.
    FromConfig,
    /// `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
    /// bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True), device_map=...)` (QLoRA):
    /// the warm-up counts each quantized weight at half a byte per element, then each tensor in
    /// the checkpoint's order, every linear layer's weight but the head's quantized as it comes.
    PretrainedNf4,
}

/// What the run does after loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// `generate` of `generated` tokens after a prompt of `context`.
    Generate { generated: u64 },
    /// `steps` training steps on sequences of `context`.
    Train {
        lora: Option<Lora>,
        optimizer: Optimizer,
        checkpointing: bool,
        steps: u64,
    },
}

impl Work {
    /// Whether the run trains (forward, backward and optimizer) rather than generates.
    pub fn trains(&self) -> bool {
        matches!(self, Work::Train { .. })
    }
}

/// PEFT LoRA on the modules named `targets` (`q_proj`, `v_proj`…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lora {
    pub rank: u64,
    pub targets: Vec<String>,
}

/// One workload.
#[derive(Debug, Clone)]
pub struct Run {
    pub model: Model,
    /// The weights' dtype.
    pub dtype: Dtype,
    /// Training's forward under `torch.autocast(dtype)` (the Trainer's mixed precision: float32
    /// weights).
    pub autocast: Option<Dtype>,
    pub batch: u64,
    pub context: u64,
    pub work: Work,
    pub loading: Loading,
    pub kernels: Kernels,
    /// The order the process's string hashing gives a vision model's masks.
    pub mask_order: super::masks::MaskOrder,
}

/// A stage of the program: its name and the events it spans.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stage {
    pub name: String,
    pub begin: usize,
    pub end: usize,
}

/// Every allocation and free of a run, and its stages.
#[derive(Debug, Clone)]
pub struct Program {
    /// What the tape wrote, in order: the events in its chunks (never copied into one), and
    /// where each stage begins and ends.
    chunks: Vec<Chunk>,
    /// Decoder layers written again from another's record rather than run.
    written_again: u64,
}

/// Where the stages begin and end, marked on the tape.
struct Marks {
    open: bool,
}

impl Marks {
    fn begin(&mut self, p: &Process, name: &str) {
        p.tape.mark(Chunk::Begin(name.to_string()));
        self.open = true;
    }
    fn end(&mut self, p: &Process) {
        if std::mem::take(&mut self.open) {
            p.tape.mark(Chunk::End);
        }
    }
}

impl Stages for Marks {
    fn prefill_done(&mut self, d: &mut Decoder) {
        self.end(d.process);
        self.begin(d.process, "decode");
    }
}

/// The elements of a parameter's type.
fn elem(dtype: Dtype) -> Elem {
    Elem::of(dtype)
}

/// What `caching_allocator_warmup` finds unused in the cache before loading: the 2 MiB segment
/// `torch.zeros(1)` made when CUDA started, its block freed.
const UNUSED_AT_WARMUP: u64 = 2 << 20;

/// The bytes `caching_allocator_warmup` asks for when the weights take `total`: less what the
/// cache holds unused when that leaves more than it; else nothing (its middle rule, for more than
/// 1.5 GiB left beside the unused bytes, cannot apply with 2 MiB unused). Its cap at the device's
/// memory less 1.2 GiB is not applied: the program does not depend on the card.
fn warmup_bytes(total: u64) -> u64 {
    let unused = UNUSED_AT_WARMUP;
    if total.saturating_sub(unused) > unused {
        total - unused
    } else {
        0
    }
}

/// Loads the weights (and buffers) in the order `loading` gives.
fn load(p: &mut Process, model: &Model, dtype: Dtype, loading: Loading) -> Weights {
    let params = model.parameters();
    let e = elem(dtype);
    let mut by_name = FxHashMap::default();
    let mut quantized = FxHashMap::default();
    let mut quantizer = super::bitsandbytes::Quantizer::default();
    p.in_role(Role::Weights, |p| {
        let mut put = |p: &mut Process, t: &Parameter| {
            by_name.insert(t.name.clone(), p.empty(&t.shape, e));
        };
        match loading {
            Loading::FromConfig => {
                let (head, body): (Vec<&Parameter>, Vec<&Parameter>) =
                    params.iter().partition(|t| t.role == TensorRole::LmHead);
                for t in body {
                    put(p, t);
                }
                for b in model.buffers() {
                    let buffer = p.empty(&b.shape, Elem::of_buffer(&b));
                    by_name.insert(b.name.clone(), buffer);
                }
                for t in head {
                    by_name.insert(t.name.clone(), p.empty(&t.shape, e));
                }
                // A tied head is first made as a layer of its own, then tied (and freed).
                if model.tied_embeddings {
                    drop(p.empty(&[model.vocab, model.hidden], e));
                }
            }
            Loading::Pretrained | Loading::PretrainedNf4 => {
                let quantizes = |t: &Parameter| {
                    loading == Loading::PretrainedNf4 && super::bitsandbytes::quantizes(t)
                };
                // `get_total_byte_count`: each tensor's bytes, half a byte per element of a
                // weight the quantizer packs (counted here in halves); then
                // `torch.empty(byte_count // 2, dtype=float16)`.
                let halves: u64 = params
                    .iter()
                    .map(|t| match quantizes(t) {
                        true => t.elements(),
                        false => 2 * t.elements() * e.size(),
                    })
                    .sum();
                drop(p.empty(&[warmup_bytes(halves / 2) / 2], Elem::F16));
                let mut sorted: Vec<&Parameter> = params.iter().collect();
                sorted.sort_by(|a, b| a.name.cmp(&b.name));
                for t in sorted {
                    let staged = p.empty(&t.shape, e);
                    if quantizes(t) {
                        let prefix = t.name.trim_end_matches(".weight").to_string();
                        quantized.insert(prefix, quantizer.quantize(p, staged));
                    } else {
                        by_name.insert(t.name.clone(), staged);
                    }
                }
                for b in model.buffers() {
                    let buffer = p.empty(&b.shape, Elem::of_buffer(&b));
                    by_name.insert(b.name.clone(), buffer);
                }
            }
        }
    });
    if model.tied_embeddings {
        let embed = by_name[&format!("{}embed_tokens.weight", model.text_prefix())].clone();
        by_name.insert("lm_head.weight".into(), embed);
    }
    Weights {
        by_name,
        adapters: FxHashMap::default(),
        quantized,
        quantization_map: quantizer.into_map(),
    }
}

/// PEFT's adapters: per targeted module, `A` then `B` made in the base's dtype on the device,
/// then every adapter cast to float32 (each cast freeing its 16-bit original).
fn adapters(
    p: &mut Process,
    model: &Model,
    lora: &Lora,
    dtype: Dtype,
) -> FxHashMap<String, Adapter> {
    let e = elem(dtype);
    let targets: Vec<Parameter> = model
        .parameters()
        .into_iter()
        .filter(|t| {
            t.role == TensorRole::Linear
                && !t.is_bias()
                && lora.targets.iter().any(|m| m == t.module())
        })
        .collect();
    p.in_role(Role::Adapters, |p| {
        let first: Vec<(String, Tensor, Tensor)> = targets
            .iter()
            .map(|t| {
                let (out, inp) = (t.shape[0], t.shape[1]);
                let a = p.empty(&[lora.rank, inp], e);
                let b = p.empty(&[out, lora.rank], e);
                (t.name.trim_end_matches(".weight").to_string(), a, b)
            })
            .collect();
        let mut out = FxHashMap::default();
        for (name, a, b) in first {
            let a32 = if e == Elem::F32 { a } else { cast(p, a) };
            let b32 = if e == Elem::F32 { b } else { cast(p, b) };
            out.insert(name, Adapter { a: a32, b: b32 });
        }
        out
    })
}

fn cast(p: &mut Process, t: Tensor) -> Tensor {
    let c = p.empty(&t.shape, Elem::F32);
    drop(t);
    c
}

/// The stack the emulation runs on. Autograd's graph is a chain of reference-counted nodes as
/// long as the model is deep, dropped recursively as PyTorch's own graph is freed; 256 MiB holds
/// the deepest model a configuration may describe (`model::config::MAX_LAYERS` layers) in a
/// debug build, and is only reserved, not used, by shallower ones.
const EMULATION_STACK: usize = 256 << 20;

/// The program of `run`, emulated on a thread of its own with [`EMULATION_STACK`] (streaming
/// its events to `sink` if given), and what `read` returns, run meanwhile on this thread.
fn emulated<R>(
    run: &Run,
    sink: Option<std::sync::mpsc::SyncSender<Chunk>>,
    read: impl FnOnce() -> R,
) -> (Program, R) {
    emulated_with(run, sink, LayerRepeats::Written, read)
}

/// Whether alike decoder layers of a decode step are written again or each run
/// ([`super::repeat`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LayerRepeats {
    Written,
    /// Every layer run: what the tests compare the written program with.
    #[cfg_attr(not(test), allow(dead_code))]
    Run,
}

fn emulated_with<R>(
    run: &Run,
    sink: Option<std::sync::mpsc::SyncSender<Chunk>>,
    repeats: LayerRepeats,
    read: impl FnOnce() -> R,
) -> (Program, R) {
    std::thread::scope(|s| {
        let emulation = std::thread::Builder::new()
            .name("emulation".into())
            .stack_size(EMULATION_STACK)
            .spawn_scoped(s, move || emulate(run, sink, repeats))
            .expect("a thread for the emulation");
        let read = read();
        let program = emulation
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        (program, read)
    })
}

/// The program of `run`.
pub fn program(run: &Run) -> Program {
    emulated(run, None, || ()).0
}

/// The program of `run` with every layer run, none written again from another's record.
#[cfg(test)]
pub(super) fn program_running_every_layer(run: &Run) -> Program {
    emulated_with(run, None, LayerRepeats::Run, || ()).0
}

/// Chunks of events in flight between the emulation and its replays.
const CHUNKS_IN_FLIGHT: usize = 4;

/// The program of `run` and its replays under each of `configs` on an unlimited device, each
/// replay reading the events as the emulation writes them, on a thread of its own.
pub fn program_replayed_under(run: &Run, configs: &[AllocatorConfig]) -> (Program, Vec<Replayed>) {
    let (program, replayed, _) = replayed_under(run, configs, true, None);
    (program, replayed)
}

/// The replay of `run` under `config` on an unlimited device, reading the events as the
/// emulation writes them; the program is not kept.
pub fn replayed(run: &Run, config: AllocatorConfig) -> Replayed {
    replayed_under(run, &[config], false, None).1.remove(0)
}

/// The program of `run`, its replay under `config` on an unlimited device (reading the events
/// as the emulation writes them), and the replays limited to the `watched` cards that it showed
/// needed, started as it ran ([`cards`]).
pub fn program_replayed_watching(
    run: &Run,
    config: AllocatorConfig,
    watched: &Watched,
) -> (Program, Replayed, Vec<Limited>) {
    let (program, mut replayed, limited) = replayed_under(run, &[config], true, Some(watched));
    (program, replayed.remove(0), limited)
}

/// The replays of `run` under each of `configs`, and its program if `keep` (else a program of
/// no events); the first replay watching the `watched` cards, if any.
fn replayed_under(
    run: &Run,
    configs: &[AllocatorConfig],
    keep: bool,
    watched: Option<&Watched>,
) -> (Program, Vec<Replayed>, Vec<Limited>) {
    let (sink, chunks) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
    let (mut program, (written, replayed, limited)) = emulated(run, Some(sink), || {
        std::thread::scope(|s| {
            let (mut watcher, mut limited) = watched.map(cards::watch).unzip();
            let (feeds, replays): (Vec<_>, Vec<_>) = configs
                .iter()
                .map(|&config| {
                    let (feed, marks) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
                    let mut watcher = watcher.take();
                    let replay = s.spawn(move || {
                        let mut replay = Replaying::new(config, None);
                        for chunk in marks {
                            replay.read(&chunk);
                            if let Some(w) = &mut watcher {
                                w.saw(&replay);
                            }
                        }
                        replay.finish()
                    });
                    (feed, replay)
                })
                .unzip();
            let mut written = Vec::new();
            for chunk in chunks {
                if let Some(l) = &mut limited {
                    l.start_asked(s, &written);
                }
                if keep || limited.is_some() {
                    written.push(chunk.clone());
                }
                for feed in &feeds {
                    feed.send(chunk.clone()).expect("a replay reads to the end");
                }
                if let Some(l) = &mut limited {
                    l.feed(&chunk);
                }
            }
            drop(feeds);
            let limited = limited.map_or_else(Vec::new, |l| l.finish(s, &written));
            let replayed: Vec<Replayed> = replays.into_iter().map(joined).collect();
            (written, replayed, limited)
        })
    });
    debug_assert!(
        program.chunks.is_empty(),
        "a streaming tape sends every event"
    );
    if keep {
        program.chunks = written;
    }
    (program, replayed, limited)
}

/// What a scoped thread returned, its panic carried on.
fn joined<T>(thread: std::thread::ScopedJoinHandle<'_, T>) -> T {
    thread
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn emulate(
    run: &Run,
    sink: Option<std::sync::mpsc::SyncSender<Chunk>>,
    repeats: LayerRepeats,
) -> Program {
    let mut p = Process::new(run.kernels);
    p.mask_order = run.mask_order;
    if let Some(sink) = sink {
        p.tape.stream_to(sink);
    }
    let mut marks = Marks { open: false };
    // `torch.zeros(1)` started CUDA: one small block, freed.
    drop(p.empty(&[1], Elem::F32));
    marks.begin(&p, "weights");
    let mut weights = load(&mut p, &run.model, run.dtype, run.loading);
    marks.end(&p);
    let (b, t) = (run.batch, run.context);
    match &run.work {
        Work::Generate { generated } => {
            p.autograd.enabled = false;
            marks.begin(&p, "inputs");
            let (ids, mask) = p.in_role(Role::Inputs, |p| {
                (p.empty(&[b, t], Elem::I64), p.empty(&[b, t], Elem::I64))
            });
            marks.end(&p);
            marks.begin(&p, "prefill");
            let mut d = Decoder {
                model: &run.model,
                weights: &weights,
                process: &mut p,
                checkpointing: false,
                experts_path: super::decoder::ExpertsPath::Grouped,
                layer_kinds: (repeats == LayerRepeats::Written).then(|| {
                    super::repeat::LayerKinds::of(
                        &run.model,
                        weights.by_name.iter(),
                        weights.adapters.keys().chain(weights.quantized.keys()),
                    )
                }),
            };
            generate::generate(&mut d, &ids, &mask, *generated, &mut marks);
            marks.end(&p);
            drop(ids);
            drop(mask);
        }
        Work::Train {
            lora,
            optimizer,
            checkpointing,
            steps,
        } => {
            let mut adapters = FxHashMap::default();
            if let Some(lora) = lora {
                marks.begin(&p, "adapters");
                adapters = self::adapters(&mut p, &run.model, lora, run.dtype);
                marks.end(&p);
            }
            // The trained parameters, in `model.parameters()` order.
            let mut trained: Vec<Tensor> = Vec::new();
            let mut leaves = Vec::new();
            if lora.is_none() {
                for t in run.model.parameters() {
                    let (param, leaf) = Process::parameter(&weights.by_name[&t.name]);
                    weights.by_name.insert(t.name.clone(), param.clone());
                    if t.role == TensorRole::Embedding && run.model.tied_embeddings {
                        weights
                            .by_name
                            .insert("lm_head.weight".into(), param.clone());
                    }
                    trained.push(param);
                    leaves.push(leaf);
                }
            } else {
                let mut names: Vec<String> = adapters.keys().cloned().collect();
                let order: Vec<String> = run
                    .model
                    .parameters()
                    .into_iter()
                    .map(|t| t.name.trim_end_matches(".weight").to_string())
                    .collect();
                names.sort_by_key(|n| order.iter().position(|o| o == n));
                for name in names {
                    let ad = adapters.get_mut(&name).expect("an adapter");
                    let (a, la) = Process::parameter(&ad.a);
                    let (bb, lb) = Process::parameter(&ad.b);
                    ad.a = a.clone();
                    ad.b = bb.clone();
                    trained.push(a);
                    trained.push(bb);
                    leaves.push(la);
                    leaves.push(lb);
                }
            }
            weights.adapters = adapters;
            let weights = std::rc::Rc::new(weights);
            if *checkpointing {
                let model = std::rc::Rc::new(run.model.clone());
                let w = weights.clone();
                p.recompute_layer = Some(Box::new(
                    move |p: &mut Process, layer, inputs: &[Tensor]| {
                        let mut d = Decoder {
                            model: &model,
                            weights: &w,
                            process: p,
                            checkpointing: false,
                            experts_path: super::decoder::ExpertsPath::Grouped,
                            layer_kinds: None,
                        };
                        d.recompute(layer, inputs);
                    },
                ));
            }
            let mut optimizer = OptimizerState::new(*optimizer);
            marks.begin(&p, "inputs");
            let ids = p.in_role(Role::Inputs, |p| p.empty(&[b, t], Elem::I64));
            marks.end(&p);
            for step in 1..=*steps {
                marks.begin(&p, &format!("step{step}.forward"));
                let loss = {
                    let mut d = Decoder {
                        model: &run.model,
                        weights: &weights,
                        process: &mut p,
                        checkpointing: *checkpointing,
                        experts_path: super::decoder::ExpertsPath::Grouped,
                        layer_kinds: None,
                    };
                    // The model builds a DynamicCache in training too, unless checkpointing
                    // turns `use_cache` off.
                    let mut cache = (!*checkpointing).then(|| {
                        super::cache::Cache::new(
                            &run.model
                                .layers
                                .iter()
                                .map(|l| l.window)
                                .collect::<Vec<_>>(),
                        )
                    });
                    d.process.autocast = run.autocast.map(Elem::of);
                    let out = d.forward(&ids, None, None, cache.as_mut(), false, Some(&ids));
                    d.process.end_autocast();
                    let loss = out.loss.expect("labels give a loss");
                    drop(out.logits);
                    drop(cache);
                    loss
                };
                marks.end(&p);
                marks.begin(&p, &format!("step{step}.backward"));
                p.backward(&loss);
                drop(loss);
                marks.end(&p);
                marks.begin(&p, &format!("step{step}.optimizer"));
                // The group's parameters whose gradient exists (a vision tower's gets none).
                let stepped: Vec<Tensor> = trained
                    .iter()
                    .zip(&leaves)
                    .filter(|(_, leaf)| leaf.grad.borrow().is_some())
                    .map(|(t, _)| t.clone())
                    .collect();
                optimizer.step(&mut p, &stepped);
                // zero_grad(set_to_none=True), in the group's order.
                for leaf in &leaves {
                    leaf.grad.borrow_mut().take();
                }
                marks.end(&p);
            }
            drop(ids);
            drop(optimizer);
        }
    }
    p.tape.close();
    Program {
        written_again: p.tape.written_again(),
        chunks: p.tape.take(),
    }
}

/// Bytes of the allocator's blocks held by each role at one moment (indexed like
/// [`Role::ALL`]).
pub type RoleBytes = [u64; Role::ALL.len()];

/// What a replay of a program gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// Each stage's figures, as the GPU script reads them (peaks reset at the stage's start).
    pub stages: Vec<(String, Figures)>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// When `reserved` first reached its peak: the stage, `allocated` then, and each role's
    /// blocks.
    pub peak_stage: String,
    pub allocated_at_peak: u64,
    pub roles_at_peak: RoleBytes,
    /// The allocation the device had no room for, and its stage.
    pub out_of_memory: Option<(String, OutOfMemory)>,
}

/// An allocation's block, the index of its role and the block's size.
type LiveBlock = (crate::allocator::BlockId, usize, u64);

/// Allocations by number (in the order they were made) while they live, in pages of
/// [`LiveBlocks::PAGE`] numbers: a page whose allocations are all freed is given back, so that a
/// replay holds memory for what is live rather than for every allocation of the run.
#[derive(Default)]
struct LiveBlocks {
    /// Per page: its allocations (`None` once freed) and how many still live.
    pages: Vec<Option<(Vec<Option<LiveBlock>>, usize)>>,
}

impl LiveBlocks {
    const PAGE: usize = 2048;

    /// The next allocation's block.
    fn push(&mut self, block: LiveBlock) {
        let (entries, live) = self
            .page_being_filled()
            .as_mut()
            .expect("a page being filled");
        *live += 1;
        entries.push(Some(block));
    }

    /// Numbers the next `count` allocations, freed already (a page filled with allocations all
    /// freed is given back at once).
    fn push_freed(&mut self, mut count: usize) {
        while count > 0 {
            let page = self.page_being_filled();
            let (entries, live) = page.as_mut().expect("a page being filled");
            let numbered = count.min(Self::PAGE - entries.len());
            entries.resize(entries.len() + numbered, None);
            count -= numbered;
            if *live == 0 && entries.len() == Self::PAGE {
                *page = None;
            }
        }
    }

    /// The page the next number falls in (a new one where the last is full).
    fn page_being_filled(&mut self) -> &mut Option<(Vec<Option<LiveBlock>>, usize)> {
        if !matches!(self.pages.last(), Some(Some((entries, _))) if entries.len() < Self::PAGE) {
            self.pages.push(Some((Vec::with_capacity(Self::PAGE), 0)));
        }
        self.pages.last_mut().expect("a page being filled")
    }

    /// The number the next allocation gets.
    fn next_number(&self) -> u32 {
        let filled = match self.pages.last() {
            None => return 0,
            Some(Some((entries, _))) => entries.len(),
            // A page given back was full.
            Some(None) => Self::PAGE,
        };
        u32::try_from(self.pages.len().saturating_sub(1) * Self::PAGE + filled)
            .expect("allocations are numbered in 32 bits")
    }

    /// Allocation `alloc`'s block, if it lives.
    fn get(&self, alloc: u32) -> Option<&LiveBlock> {
        let (page, at) = (alloc as usize / Self::PAGE, alloc as usize % Self::PAGE);
        self.pages.get(page)?.as_ref()?.0.get(at)?.as_ref()
    }

    /// Gives live allocation `alloc` its block.
    fn set_block(&mut self, alloc: u32, block: crate::allocator::BlockId) {
        let (page, at) = (alloc as usize / Self::PAGE, alloc as usize % Self::PAGE);
        if let Some(Some((entries, _))) = self.pages.get_mut(page) {
            if let Some(Some(entry)) = entries.get_mut(at) {
                entry.0 = block;
            }
        }
    }

    /// Allocation `alloc`'s block, taken out (`None`: freed already, or never made).
    fn take(&mut self, alloc: u32) -> Option<LiveBlock> {
        let (page, at) = (alloc as usize / Self::PAGE, alloc as usize % Self::PAGE);
        let slot = self.pages.get_mut(page)?;
        let (entries, live) = slot.as_mut()?;
        let block = entries.get_mut(at)?.take()?;
        *live -= 1;
        if *live == 0 && entries.len() == Self::PAGE {
            *slot = None;
        }
        Some(block)
    }
}

mod cards;
mod windows;

pub use cards::{Limited, Watched};

/// A replay in progress: events and stage marks in, figures out.
struct Replaying {
    allocator: crate::allocator::CachingAllocator,
    label: crate::allocator::Label,
    /// The live allocations' blocks.
    blocks: LiveBlocks,
    roles: RoleBytes,
    out: Replayed,
    /// The stage open, and `allocated` and `reserved` at its start.
    open: Option<(String, (u64, u64))>,
    /// The layers written again: their windows recorded, and the one being read.
    windows: windows::Windows,
}

impl Replaying {
    fn new(config: AllocatorConfig, capacity: Option<u64>) -> Replaying {
        let mut allocator = crate::allocator::CachingAllocator::with_config(config);
        allocator.set_capacity(capacity);
        let label = allocator.label("tensor");
        Replaying {
            allocator,
            label,
            blocks: LiveBlocks::default(),
            roles: [0; Role::ALL.len()],
            out: Replayed {
                stages: Vec::new(),
                peak_allocated: 0,
                peak_reserved: 0,
                peak_stage: String::new(),
                allocated_at_peak: 0,
                roles_at_peak: [0; Role::ALL.len()],
                out_of_memory: None,
            },
            open: None,
            windows: windows::Windows::default(),
        }
    }

    fn begin(&mut self, name: String) {
        let st = self.allocator.stats();
        self.open = Some((name, (st.allocated.current, st.reserved.current)));
        self.allocator.reset_peaks();
    }

    fn end(&mut self) {
        if let Some((name, baseline)) = self.open.take() {
            let st = self.allocator.stats();
            self.out.stages.push((
                name,
                Figures {
                    allocated_baseline_bytes: baseline.0,
                    allocated_end_bytes: st.allocated.current,
                    peak_allocated_bytes: st.allocated.peak,
                    reserved_baseline_bytes: baseline.1,
                    reserved_end_bytes: st.reserved.current,
                    peak_reserved_bytes: st.reserved.peak,
                },
            ));
        }
    }

    /// Replays what a tape wrote next; `false` once the device had no room (the replay then
    /// stops).
    fn read(&mut self, chunk: &Chunk) -> bool {
        match chunk {
            Chunk::Events(events) => events.iter().all(|&e| match e {
                Event::Written { at } => self.written_layer(events.written(at)),
                e => self.event(e),
            }),
            Chunk::Begin(name) => {
                self.begin(name.clone());
                true
            }
            Chunk::End => {
                self.end();
                true
            }
        }
    }

    /// Replays one allocation or free outside a layer written again (no window is open);
    /// `false` once the device had no room (the replay then stops).
    fn event(&mut self, e: Event) -> bool {
        self.out.out_of_memory.is_none() && self.plain_event(e)
    }

    /// Replays one allocation or free through the block structure.
    fn plain_event(&mut self, e: Event) -> bool {
        match e {
            Event::Alloc { bytes, role } => match self.allocator.malloc(bytes, 0, self.label) {
                Some(block) => {
                    let size = self.allocator.block_size(block).unwrap_or(0);
                    let r = role.index();
                    self.roles[r] += size;
                    self.blocks.push((block, r, size));
                    let allocated = self.allocator.allocated_now();
                    let reserved = self.allocator.reserved_now();
                    self.out.peak_allocated = self.out.peak_allocated.max(allocated);
                    if reserved > self.out.peak_reserved {
                        self.out.peak_reserved = reserved;
                        self.out.allocated_at_peak = allocated;
                        self.out.roles_at_peak = self.roles;
                        self.out.peak_stage = self
                            .open
                            .as_ref()
                            .map_or_else(String::new, |(n, _)| n.clone());
                    }
                }
                None => {
                    let stage = self
                        .open
                        .as_ref()
                        .map_or_else(|| "setup".to_string(), |(n, _)| n.clone());
                    self.out.out_of_memory = Some((stage, OutOfMemory { bytes }));
                    return false;
                }
            },
            Event::Free { alloc } => {
                if let Some((block, r, size)) = self.blocks.take(alloc) {
                    self.roles[r] -= size;
                    self.allocator.free(block);
                }
            }
            Event::Written { .. } => unreachable!("a layer written again is read as its events"),
        }
        true
    }

    /// The figures: the stage still open closed, unless the device ran out of memory.
    fn finish(mut self) -> Replayed {
        if self.out.out_of_memory.is_none() {
            self.end();
        }
        self.out
    }
}

impl Program {
    /// The chunks of events, in order.
    fn event_chunks(&self) -> impl Iterator<Item = &super::tensor::Events> + '_ {
        self.chunks.iter().filter_map(|c| match c {
            Chunk::Events(events) => Some(&**events),
            _ => None,
        })
    }

    /// The stages, with the events each spans.
    pub fn stages(&self) -> Vec<Stage> {
        let (mut stages, mut at) = (Vec::new(), 0);
        for chunk in &self.chunks {
            match chunk {
                Chunk::Events(events) => at += events.plain_len(),
                Chunk::Begin(name) => stages.push(Stage {
                    name: name.clone(),
                    begin: at,
                    end: at,
                }),
                Chunk::End => stages.last_mut().expect("a stage ends once begun").end = at,
            }
        }
        stages
    }

    /// Every allocation and free, in order (a layer written again as its events).
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.event_chunks().flat_map(|c| c.plain())
    }

    /// How many decoder layers were written again from another layer's record.
    pub fn layers_written_again(&self) -> u64 {
        self.written_again
    }

    /// How many allocations and frees there are.
    pub fn len(&self) -> usize {
        self.event_chunks().map(|c| c.plain_len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replays the program through the allocator under `config`, on a device with `capacity`
    /// bytes for the allocator (`None`: unlimited).
    pub fn replay(&self, config: AllocatorConfig, capacity: Option<u64>) -> Replayed {
        let mut replay = Replaying::new(config, capacity);
        for chunk in &self.chunks {
            if !replay.read(chunk) {
                break;
            }
        }
        replay.finish()
    }
}

/// Why a workload specification was refused: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("config: {0}")]
    Config(#[from] crate::model::ConfigError),
    #[error("`{field}`: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
}

/// The order of a vision model's masks in the recorded process (`mask_order`: the kinds as its
/// `set(layer_types)` iterated them, recorded by `scripts/gpu/hf-run.py`); full first when absent.
fn mask_order(spec: &serde_json::Value) -> Result<super::masks::MaskOrder, SpecError> {
    use super::masks::MaskOrder;
    match spec.get("mask_order") {
        None => Ok(MaskOrder::FullFirst),
        Some(order) => match order.get(0).and_then(|k| k.as_str()) {
            Some("sliding_attention") => Ok(MaskOrder::SlidingFirst),
            Some("full_attention") => Ok(MaskOrder::FullFirst),
            _ => Err(SpecError::Field {
                field: "mask_order",
                message: "not a list of layer kinds beginning with sliding_attention or \
                          full_attention"
                    .into(),
            }),
        },
    }
}

impl Run {
    /// The workload a GPU proof script ran (`scripts/gpu/hf-run.py`'s specification: model_type,
    /// config, mode, dtype, batch, context, generated, lora, optimizer, optimizer_impl,
    /// checkpointing, steps, loading, mask_order), with the H200's kernels.
    pub fn from_spec(spec: &serde_json::Value) -> Result<Run, SpecError> {
        let field = |field: &'static str, message: &str| SpecError::Field {
            field,
            message: message.to_string(),
        };
        let mut config = spec
            .get("config")
            .and_then(|c| c.as_object())
            .cloned()
            .ok_or_else(|| field("config", "missing, or not an object"))?;
        let model_type = spec
            .get("model_type")
            .and_then(|m| m.as_str())
            .ok_or_else(|| field("model_type", "missing, or not a string"))?;
        config.insert("model_type".into(), model_type.into());
        let model = crate::model::config::from_value(&serde_json::Value::Object(config))?;
        model.check_runnable()?;
        let size = |name: &'static str, default: Option<u64>| -> Result<u64, SpecError> {
            match spec.get(name) {
                None => default.ok_or_else(|| field(name, "missing")),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| field(name, "not a whole number above 0")),
            }
        };
        let text = |name: &'static str, default: &'static str| -> Result<String, SpecError> {
            match spec.get(name) {
                None | Some(serde_json::Value::Null) => Ok(default.to_string()),
                Some(v) => v
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| field(name, "not a string")),
            }
        };
        let dtype: Dtype = text("dtype", "bfloat16")?
            .parse()
            .map_err(|e: String| field("dtype", &e))?;
        let autocast = match spec.get("autocast") {
            None | Some(serde_json::Value::Null) => None,
            Some(a) => Some(
                a.as_str()
                    .and_then(|a| a.parse::<Dtype>().ok())
                    .filter(|d| *d != Dtype::Float32)
                    .ok_or_else(|| field("autocast", "bfloat16 or float16"))?,
            ),
        };
        // Under autocast the weights are float32.
        let dtype = if autocast.is_some() {
            Dtype::Float32
        } else {
            dtype
        };
        let implementation: OptimizerImpl = text("optimizer_impl", "foreach")?
            .parse()
            .map_err(|_| field("optimizer_impl", "foreach, fused or for-loop"))?;
        let optimizer = match text("optimizer", "adamw")?.as_str() {
            "adamw" => Optimizer::AdamW(implementation),
            "adamw-8bit" => Optimizer::AdamW8bit,
            _ => return Err(field("optimizer", "adamw or adamw-8bit")),
        };
        let checkpointing = spec
            .get("checkpointing")
            .and_then(|c| c.as_bool())
            .unwrap_or(false);
        let lora = |spec: &serde_json::Value| -> Result<Lora, SpecError> {
            let l = spec.get("lora").ok_or_else(|| field("lora", "missing"))?;
            let rank = l
                .get("rank")
                .and_then(|r| r.as_u64())
                .filter(|&r| r > 0)
                .ok_or_else(|| field("lora", "rank: not a whole number above 0"))?;
            let targets = l
                .get("targets")
                .and_then(|t| t.as_array())
                .and_then(|t| {
                    t.iter()
                        .map(|m| m.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| field("lora", "targets: not a list of module names"))?;
            Ok(Lora { rank, targets })
        };
        let steps = size("steps", Some(3))?;
        let work = match text("mode", "")?.as_str() {
            "inference" => Work::Generate {
                generated: size("generated", None)?,
            },
            "full" => Work::Train {
                lora: None,
                optimizer,
                checkpointing,
                steps,
            },
            "lora" | "qlora" => Work::Train {
                lora: Some(lora(spec)?),
                optimizer,
                checkpointing,
                steps,
            },
            _ => return Err(field("mode", "inference, full, lora or qlora")),
        };
        // QLoRA's script saves a checkpoint and loads it quantized.
        let loading = match (spec.get("mode"), text("loading", "from_config")?.as_str()) {
            (Some(m), _) if m == "qlora" => Loading::PretrainedNf4,
            (_, "from_config") => Loading::FromConfig,
            (_, "pretrained") => Loading::Pretrained,
            _ => return Err(field("loading", "from_config or pretrained")),
        };
        Ok(Run {
            model,
            dtype,
            autocast,
            batch: size("batch", None)?,
            context: size("context", None)?,
            work,
            loading,
            kernels: Kernels::for_gpu(crate::allocator::ComputeCapability::new(9, 0)),
            mask_order: mask_order(spec)?,
        })
    }
}
