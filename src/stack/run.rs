//! One Hugging Face workload run from start to end, stage by stage, as the GPU proof script
//! (`scripts/gpu/hf-run.py`) runs it: the model's weights loaded, its adapters, its inputs,
//! then `generate` (prefill, decode) or training steps (forward, backward, optimizer). The
//! result is a program ([`crate::replay::program`]): every allocation and free, and where each
//! stage begins and ends, made on a thread of its own and replayed as it is written
//! ([`replays`]).

use super::ddp::{Ddp, Reducer};
use super::decoder::{Decoder, Inputs};
use super::fsdp::{Fsdp, Sharding};
use super::generate::{self, Stages};
use super::loading::{self, Loading, Lora};
use super::optimizer::{Optimizer, OptimizerState};
use super::process::{Kernels, Process};
use super::sft;
use super::tensor::Tensor;
use super::tensor_parallel::TensorParallel;
use super::trainer::{self, Batch, BatchShape, Batches, GradScaler, TrainerArgs};
use crate::dtype::Dtype;
use crate::model::{Model, TensorRole};
use crate::replay::program::{Chunk, Loaded, Program, Role, StageMark};
use crate::replay::stream::{self, Plan, Replays};

/// What the run does after loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// `generate` of `generated` tokens after a prompt of `context`, with `repetition_penalty`
    /// (its logits processor) or without, greedy or `sampling`, over `beams` (1: no beam
    /// search).
    Generate {
        generated: u64,
        repetition_penalty: bool,
        sampling: Option<super::sampling::Sampling>,
        beams: u64,
        /// The end-of-sequence tokens `generate` checks each new token against (its generation
        /// config's `eos_token_id`: one id, a list, or none).
        eos_tokens: u64,
        /// `cache_implementation="offloaded"`.
        offloaded_cache: bool,
    },
    /// `steps` training steps on sequences of `context`.
    Train {
        lora: Option<Lora>,
        optimizer: Optimizer,
        checkpointing: bool,
        steps: u64,
        /// Through `transformers.Trainer` (else the step written by hand: forward, backward,
        /// optimizer).
        trainer: Option<TrainerArgs>,
    },
}

impl Work {
    /// Whether the run trains (forward, backward and optimizer) rather than generates.
    pub fn trains(&self) -> bool {
        matches!(self, Work::Train { .. })
    }
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
    pub mask_order: super::process::MaskOrder,
    /// Some rows of the batch are padded (their attention mask starts with zeros): the
    /// attention runs under a mask built for them.
    pub padded: bool,
    /// One rank of an FSDP2 training ([`super::fsdp`]): the model built on `meta`, its
    /// parameters sharded and gathered in `dtype` (built in float32 under mixed precision).
    pub sharding: Option<Sharding>,
    /// One rank of a tensor-parallel run serving the model ([`super::tensor_parallel`]).
    pub tensor_parallel: Option<TensorParallel>,
    /// One rank of a DDP training, the model whole on every rank ([`super::ddp`]).
    pub ddp: Option<Ddp>,
    /// For TRL's SFTTrainer, which projects only the positions whose next token has a label:
    /// how many each batch has, in the order the Trainer draws them (beyond them: every position
    /// but each row's last).
    pub labelled: Vec<u64>,
    /// For TRL's padding-free batches: the tokens of each, in the order the Trainer draws them
    /// (beyond them: the last; none given, `batch × context`).
    pub flat_tokens: Vec<u64>,
}

/// Where the stages begin and end, marked on the tape.
struct Marks {
    open: bool,
}

impl Marks {
    fn begin(&mut self, p: &Process, name: &str, loaded: Loaded) {
        p.tape.mark(Chunk::Begin(StageMark {
            name: name.to_string(),
            loaded,
        }));
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
        self.begin(d.process, "decode", Loaded::Decode);
    }
}

/// The stack the emulation runs on. Autograd's graph is a chain of reference-counted nodes as
/// long as the model is deep, dropped recursively as PyTorch's own graph is freed; 256 MiB holds
/// the deepest model a configuration may describe (`model::config::MAX_LAYERS` layers) in a
/// debug build, and is only reserved, not used, by shallower ones.
const EMULATION_STACK: usize = 256 << 20;

/// Whether alike decoder layers of a decode step are written again or each run
/// ([`super::repeat`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LayerRepeats {
    Written,
    /// Every layer run: what the tests compare the written program with.
    #[cfg_attr(not(test), allow(dead_code))]
    Run,
}

/// What `_sync_module_states` broadcasts: every parameter of the module in
/// `named_parameters()` order (PEFT's adapters after their layer's own), then its buffers; and
/// how many buffers.
fn module_states(
    model: &crate::model::Model,
    weights: &super::decoder::Weights,
) -> (Vec<super::ddp::TensorBytes>, usize) {
    let parameters = model.parameters();
    let module = |name: &str| name.rsplit_once('.').map_or(name, |(m, _)| m).to_string();
    let mut states = Vec::new();
    for (i, t) in parameters.iter().enumerate() {
        states.push(super::ddp::TensorBytes::of(&weights.by_name[&t.name]));
        let module = module(&t.name);
        let last_of_module =
            (parameters.get(i + 1)).is_none_or(|n| !n.name.starts_with(&format!("{module}.")));
        if let Some(adapter) = weights.adapters.get(&module).filter(|_| last_of_module) {
            states.push(super::ddp::TensorBytes::of(&adapter.a));
            states.push(super::ddp::TensorBytes::of(&adapter.b));
        }
    }
    let buffers = model.buffers();
    states.extend(
        buffers
            .iter()
            .map(|b| super::ddp::TensorBytes::of(&weights.by_name[&b.name])),
    );
    (states, buffers.len())
}

/// The replays of `run` that `plan` asks for, made as its program is written on a thread of its
/// own ([`crate::replay::stream`]).
pub fn replays(run: &Run, plan: &Plan) -> Replays {
    stream::replays(
        |sink| emulate(run, sink, LayerRepeats::Written),
        EMULATION_STACK,
        plan,
    )
}

/// The program of `run`.
pub fn program(run: &Run) -> Program {
    replays(run, &Plan::PROGRAM).program
}

/// The program of `run` with every layer run, none written again from another's record.
#[cfg(test)]
pub(crate) fn program_running_every_layer(run: &Run) -> Program {
    stream::replays(
        |sink| emulate(run, sink, LayerRepeats::Run),
        EMULATION_STACK,
        &Plan::PROGRAM,
    )
    .program
}

fn emulate(
    run: &Run,
    sink: Option<std::sync::mpsc::SyncSender<Chunk>>,
    repeats: LayerRepeats,
) -> Program {
    let mut p = Process::new(run.kernels);
    p.mask_order = run.mask_order;
    p.padded = run.padded;
    p.packed = matches!(&run.work, Work::Train { trainer: Some(t), .. } if t.padding_free);
    p.tensor_parallel = run.tensor_parallel;
    let rank_model = run.tensor_parallel.map(|tp| tp.rank_model(&run.model));
    let model = rank_model.as_ref().unwrap_or(&run.model);
    if let Some(sink) = sink {
        p.tape.stream_to(sink);
    }
    let mut marks = Marks { open: false };
    // `torch.zeros(1)` started CUDA: one small block, freed.
    drop(p.empty(&[1], Dtype::Float32));
    marks.begin(&p, "weights", Loaded::Context);
    let mut weights = match run.sharding {
        None => loading::load(&mut p, model, run.dtype, run.loading),
        Some(sharding) => {
            let lora = match &run.work {
                Work::Train { lora, .. } => lora.as_ref(),
                Work::Generate { .. } => None,
            };
            let (fsdp, weights) = Fsdp::shard(&mut p, &run.model, sharding, run.dtype, lora);
            p.fsdp = Some(Box::new(fsdp));
            weights
        }
    };
    marks.end(&p);
    let (b, t) = (run.batch, run.context);
    match &run.work {
        Work::Generate {
            generated,
            repetition_penalty,
            sampling,
            beams,
            eos_tokens,
            offloaded_cache,
        } => {
            p.autograd.enabled = false;
            marks.begin(&p, "inputs", Loaded::Context);
            let (ids, mask) = p.in_role(Role::Inputs, |p| {
                (
                    p.empty(&[b, t], Dtype::Int64),
                    p.empty(&[b, t], Dtype::Int64),
                )
            });
            marks.end(&p);
            marks.begin(&p, "prefill", Loaded::Forward);
            let mut d = Decoder {
                model,
                weights: &weights,
                process: &mut p,
                checkpointing: false,
                experts_path: super::decoder::ExpertsPath::Grouped,
                // An offloaded cache moves a different layer at each update: every layer run.
                layer_kinds: (repeats == LayerRepeats::Written && !*offloaded_cache).then(|| {
                    super::repeat::LayerKinds::of(
                        model,
                        weights.by_name.iter(),
                        weights.adapters.keys().chain(weights.quantized.keys()),
                    )
                }),
            };
            let options = generate::Options {
                new_tokens: *generated,
                repetition_penalty: *repetition_penalty,
                sampling: *sampling,
                beams: *beams,
                eos_tokens: *eos_tokens,
                offloaded_cache: *offloaded_cache,
            };
            generate::generate(&mut d, &ids, &mask, options, &mut marks);
            marks.end(&p);
            drop(ids);
            drop(mask);
        }
        Work::Train {
            lora,
            optimizer,
            checkpointing,
            steps,
            trainer,
        } => {
            // PEFT's adapters (FSDP2 makes them with the model's parameters).
            let mut adapters = std::mem::take(&mut weights.adapters);
            if let Some(lora) = lora.as_ref().filter(|_| run.sharding.is_none()) {
                marks.begin(&p, "adapters", Loaded::Context);
                adapters = loading::adapters(&mut p, &run.model, lora, run.dtype);
                marks.end(&p);
            }
            // The trained parameters, in `model.parameters()` order.
            let mut trained: Vec<Tensor> = Vec::new();
            let mut names: Vec<String> = Vec::new();
            let mut leaves = Vec::new();
            // Those the Trainer has bitsandbytes optimize in 32 bits.
            let mut kept_32bit = Vec::new();
            if run.sharding.is_some() {
                // FSDP2's unsharded parameters carry their leaves; the optimizer steps the shards.
            } else if lora.is_none() {
                for t in run.model.parameters() {
                    let (param, leaf) = Process::parameter(&weights.by_name[&t.name]);
                    weights.by_name.insert(t.name.clone(), param.clone());
                    if t.role == TensorRole::Embedding && run.model.tied_embeddings {
                        weights
                            .by_name
                            .insert("lm_head.weight".into(), param.clone());
                    }
                    if trainer.is_some() && trainer::optimized_in_32_bits(t.role) {
                        kept_32bit.push(param.clone());
                    }
                    trained.push(param);
                    names.push(t.name.clone());
                    leaves.push(leaf);
                }
            } else {
                let mut modules: Vec<String> = adapters.keys().cloned().collect();
                let order: Vec<String> = run
                    .model
                    .parameters()
                    .into_iter()
                    .map(|t| t.name.trim_end_matches(".weight").to_string())
                    .collect();
                modules.sort_by_key(|n| order.iter().position(|o| o == n));
                for name in modules {
                    let ad = adapters.get_mut(&name).expect("an adapter");
                    let (a, la) = Process::parameter(&ad.a);
                    let (bb, lb) = Process::parameter(&ad.b);
                    ad.a = a.clone();
                    ad.b = bb.clone();
                    trained.push(a);
                    trained.push(bb);
                    names.push(format!("{name}.lora_A.default.weight"));
                    names.push(format!("{name}.lora_B.default.weight"));
                    leaves.push(la);
                    leaves.push(lb);
                }
            }
            weights.adapters = adapters;
            if let Some(ddp) = run.ddp {
                marks.begin(&p, "ddp", Loaded::Context);
                let states = module_states(&run.model, &weights);
                let reducer = Reducer::new(&mut p, ddp, &leaves, &states.0, states.1);
                p.ddp = Some(Box::new(reducer));
                marks.end(&p);
            }
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
            // Under fp16 the optimizer steps through the gradient scaler (a fused one is handed
            // its `found_inf`).
            let fused = *optimizer == Optimizer::AdamW(super::optimizer::OptimizerImpl::Fused);
            let mut optimizer = OptimizerState::new(*optimizer);
            optimizer.keep_32bit(kept_32bit);
            let steps = *steps;
            // The model's forward of `batch` and its loss (the Trainer's: summed over its count,
            // under its mixed precision, the outputs converted to float32).
            let forward = |p: &mut Process,
                           batch: &Batch,
                           items: &Tensor,
                           trainer: Option<&TrainerArgs>,
                           labelled: u64| {
                let mut d = Decoder {
                    model: &run.model,
                    weights: &weights,
                    process: p,
                    checkpointing: *checkpointing,
                    experts_path: super::decoder::ExpertsPath::Grouped,
                    layer_kinds: None,
                };
                // The model builds a DynamicCache in training too, unless checkpointing turns
                // `use_cache` off (the Trainer turns it off).
                let mut cache = (!*checkpointing && trainer.is_none()).then(|| {
                    let windows: Vec<_> = run.model.layers.iter().map(|l| l.window).collect();
                    super::cache::Cache::new(&windows)
                });
                // The Trainer's mixed precision: autocast around the forward (it casts float32
                // weights, and adapters, which peft keeps in float32 under a half-precision model).
                let mixed = trainer.and_then(|t| t.mixed);
                d.process.autocast = run.autocast.or(mixed);
                d.process.with_fsdp(|fsdp, p| fsdp.pre_forward(p, 0, None));
                if let Some(mut reducer) = d.process.ddp.take() {
                    reducer.pre_forward(d.process);
                    d.process.ddp = Some(reducer);
                }
                if trainer.is_some_and(|t| t.sft) {
                    // TRL's fused head in the model's forward, then its `compute_loss`.
                    let hidden = d.backbone(
                        &batch.ids,
                        batch.mask.as_ref(),
                        batch.positions.as_ref(),
                        None,
                    );
                    let weight = d.head_weight();
                    let fused =
                        sft::fused_forward(d.process, hidden, &weight, &batch.labels, labelled);
                    d.process.end_autocast();
                    return sft::compute_loss(d.process, fused, batch.mask.as_ref());
                }
                let mut out = d.forward(Inputs {
                    ids: &batch.ids,
                    mask: batch.mask.as_ref().filter(|_| trainer.is_some()),
                    positions: batch.positions.as_ref(),
                    cache: cache.as_mut(),
                    keep_last: false,
                    labels: Some(&batch.labels),
                    items: trainer.map(|_| items),
                });
                d.process.end_autocast();
                if let Some(loss) = out.loss.take() {
                    let sharded = d
                        .process
                        .with_fsdp(|fsdp, p| fsdp.post_forward(p, 0, &loss));
                    out.loss = Some(sharded.flatten().unwrap_or(loss));
                }
                let loss = out.loss.expect("labels give a loss");
                // accelerate's `convert_outputs_to_fp32` around the model's forward.
                let converted = trainer
                    .is_some_and(|t| t.mixed.is_some())
                    .then(|| d.process.to(&out.logits, Dtype::Float32));
                drop(out.logits);
                drop(converted);
                drop(cache);
                loss
            };
            // The optimizer's parameter groups: one, or the Trainer's two (the parameters with
            // weight decay, then the others).
            let groups: Vec<Vec<usize>> = match trainer {
                None => vec![(0..trained.len()).collect()],
                Some(_) => {
                    let (decay, rest) =
                        (0..trained.len()).partition(|&i| trainer::decays(&names[i]));
                    vec![decay, rest]
                }
            };
            // `zero_grad(set_to_none=True)` after the optimizer's step on the parameters whose
            // gradient exists (a vision tower's gets none).
            let mut step_optimizer = |p: &mut Process, scaler: Option<&mut GradScaler>| {
                if let Some(fsdp) = p.fsdp.take() {
                    optimizer.step(p, &[fsdp.stepped()]);
                    p.fsdp = Some(fsdp);
                    p.with_fsdp(|fsdp, _| fsdp.zero_grad());
                    return;
                }
                let stepped: Vec<Vec<Tensor>> = (groups.iter())
                    .map(|group| {
                        (group.iter())
                            .filter(|&&i| leaves[i].grad.borrow().is_some())
                            .map(|&i| trained[i].clone())
                            .collect()
                    })
                    .collect();
                match scaler {
                    Some(scaler) => scaler.step(p, fused, |p| optimizer.step(p, &stepped)),
                    None => optimizer.step(p, &stepped),
                }
                for leaf in &leaves {
                    leaf.grad.borrow_mut().take();
                }
            };
            let gradients = |leaves: &[std::rc::Rc<super::tensor::Leaf>]| -> Vec<Tensor> {
                (leaves.iter())
                    .filter_map(|leaf| leaf.grad.borrow().clone())
                    .collect()
            };
            match trainer {
                None => {
                    marks.begin(&p, "inputs", Loaded::Context);
                    let ids = p.in_role(Role::Inputs, |p| p.empty(&[b, t], Dtype::Int64));
                    let batch = Batch {
                        mask: Some(ids.clone()),
                        labels: ids.clone(),
                        ids,
                        positions: None,
                        lengths: Vec::new(),
                    };
                    marks.end(&p);
                    for step in 1..=steps {
                        marks.begin(&p, &format!("step{step}.forward"), Loaded::Forward);
                        let loss = forward(&mut p, &batch, &batch.ids, None, 0);
                        marks.end(&p);
                        marks.begin(&p, &format!("step{step}.backward"), Loaded::Backward);
                        p.backward(&loss);
                        drop(loss);
                        marks.end(&p);
                        marks.begin(&p, &format!("step{step}.optimizer"), Loaded::Backward);
                        step_optimizer(&mut p, None);
                        marks.end(&p);
                    }
                    drop(batch);
                }
                Some(args) => {
                    marks.begin(&p, "setup", Loaded::Context);
                    let running = trainer::running_loss(&mut p);
                    let shape = match args.padding_free {
                        false => BatchShape::Rows { rows: b, tokens: t },
                        true => BatchShape::Flattened {
                            sequences: b,
                            tokens: match run.flat_tokens.is_empty() {
                                true => vec![b * t],
                                false => run.flat_tokens.clone(),
                            },
                        },
                    };
                    let mut loaded = 0;
                    let mut batches = Batches::load(&mut p, args.accumulation, &shape, &mut loaded);
                    marks.end(&p);
                    let (mut last_loss, mut last_norm) = (None, None);
                    // The batches drawn so far (each one's labelled positions, for TRL's head).
                    let mut drawn = 0;
                    let mut scaler = (args.mixed == Some(Dtype::Float16)).then(GradScaler::default);
                    for step in 1..=steps {
                        // Stages named as `hf_loops.py` marks them: `step1.micro2.backward` when
                        // the step accumulates over several batches.
                        let mut stage = String::new();
                        for (micro, batch) in (1..).zip(&batches.batches) {
                            stage = match args.accumulation {
                                1 => format!("step{step}"),
                                _ => format!("step{step}.micro{micro}"),
                            };
                            marks.begin(&p, &format!("{stage}.forward"), Loaded::Forward);
                            // Every position but each sequence's last.
                            let (rows, tokens) = (batch.ids.shape[0], batch.ids.shape[1]);
                            let labelled = (run.labelled.get(drawn).copied()).unwrap_or(match args
                                .padding_free
                            {
                                true => tokens - b,
                                false => rows * (tokens - 1),
                            });
                            drawn += 1;
                            let loss = forward(&mut p, batch, &batches.items, Some(args), labelled);
                            // `loss *= num_processes` (average_tokens_across_devices), in
                            // the Trainer's `compute_loss` (the SFTTrainer's multiplies in its own).
                            let loss = if args.sft { loss } else { p.scale_(&loss) };
                            marks.end(&p);
                            marks.begin(&p, &format!("{stage}.backward"), Loaded::Backward);
                            // accelerate's `loss / gradient_accumulation_steps`, then under fp16
                            // the gradient scaler's product.
                            let divided = p.scale(&loss);
                            let scaled = scaler.as_mut().map(|s| s.scale(&mut p, &divided));
                            p.backward(scaled.as_ref().unwrap_or(&divided));
                            drop(scaled);
                            drop(divided);
                            trainer::check_loss(&mut p, &loss);
                            // `tr_loss_step` (`training_step`'s `loss.detach()`), held until
                            // the next batch's; the graph goes with `loss`.
                            drop(last_loss.replace(loss.detach()));
                            drop(loss);
                            // The last step's total norm, let go once the step's batches ran.
                            if micro == args.accumulation {
                                drop(last_norm.take());
                                if !args.clip {
                                    // `_get_grad_norm`: the norm logged, its stage the backward's.
                                    last_norm =
                                        trainer::clip_grad_norm(&mut p, &gradients(&leaves));
                                }
                            }
                            marks.end(&p);
                        }
                        if args.clip {
                            marks.begin(&p, &format!("{stage}.clip"), Loaded::Backward);
                            if let Some(scaler) = scaler.as_mut() {
                                scaler.unscale(&mut p);
                            }
                            last_norm = trainer::clip_grad_norm(&mut p, &gradients(&leaves));
                            marks.end(&p);
                        }
                        marks.begin(&p, &format!("{stage}.optimizer"), Loaded::Backward);
                        step_optimizer(&mut p, scaler.as_mut());
                        marks.end(&p);
                        if step < steps {
                            // The next step's batches, then the last ones let go.
                            let next =
                                Batches::load(&mut p, args.accumulation, &shape, &mut loaded);
                            std::mem::replace(&mut batches, next).release();
                        }
                    }
                    batches.release();
                    drop(last_loss);
                    drop(last_norm);
                    drop(running);
                }
            }
            drop(optimizer);
        }
    }
    p.tape.close();
    Program::new(p.tape.take(), p.tape.written_again())
}
