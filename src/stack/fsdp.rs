//! FSDP2 (`torch.distributed.fsdp.fully_shard`, PyTorch 2.11) as one rank of a world runs it,
//! for memory: the model built on `meta`, `fully_shard` on every decoder layer then on the root,
//! `reshard_after_forward=True`, `to_empty` on the GPU; with `MixedPrecisionPolicy(param_dtype,
//! reduce_dtype=float32)` the model built in float32, without a policy in the run's type. Read
//! from `_fsdp_param_group.py`, `_fsdp_collectives.py`, `_fsdp_param.py` and `_fsdp_state.py`,
//! and checked against the H200's records of `scripts/gpu/hf_loops.py`'s FSDP2 runs through the
//! fake process group.
//!
//! - Each parameter's shard: its first dimension cut in `world` chunks of `ceil(rows / world)`
//!   rows; `to_empty` makes the rows the rank holds (the last ranks may hold fewer, or none),
//!   then each group re-pads its shards to whole chunks; the optimizer's states follow the rows.
//! - A group's unshard: on the all-gather copy-in stream, the shards cast into one flat input
//!   (under a policy; else the shards are the input), the all-gather's output (the input times
//!   the world), the input let go; then on the default stream each parameter's padded unsharded
//!   storage and the copy-out's launch metadata. In forward the output is freed after the next
//!   group's copy-out (and the last one after the root's forward), in backward at once.
//! - Reshard: the unsharded storages freed (`resize_(0)`), after each layer's forward and
//!   backward, and after the root's forward.
//! - Backward: a hook on each group's outputs unshards it and prefetches the group that ran
//!   before it in forward; a node on each group's inputs (`RegisterPostBackwardFunction`) runs its
//!   post-backward once its inputs' gradients are made: reshard, then the reduce-scatter's input
//!   on the default stream (the previous one freed first), the gradients copied into it and let
//!   go, and its output on the reduce-scatter stream, whose views are the sharded gradients until
//!   `zero_grad`. Groups whose inputs need no gradient (the root) run theirs in the engine's
//!   final callback, which then frees the last reduce-scatter input.

use super::decoder::{Adapter, Weights};
use super::loading::Lora;
use super::process::{Process, ShardedModel};
use super::tensor::{Hook, Leaf, Tensor};
use crate::dtype::Dtype;
use crate::model::{Model, Parameter, TensorRole};
use crate::replay::program::Role;
use rustc_hash::FxHashMap;
use std::rc::Rc;

/// The all-gather copy-in stream, which FSDP2's all-gather inputs and outputs are allocated on.
pub const ALL_GATHER_STREAM: u8 = 1;
/// The reduce-scatter stream, which the reduce-scatter's outputs are allocated on.
pub const REDUCE_SCATTER_STREAM: u8 = 2;

/// Which rank of how many, and whether the model is built in float32 and gathered in the run's
/// type (`MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)`), or built, gathered and
/// reduced in the run's type (no policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub world: u64,
    pub rank: u64,
    pub mixed_precision: bool,
}

impl Sharding {
    /// The rows of each rank's padded chunk of a first dimension of `rows`.
    pub fn padded_rows(&self, rows: u64) -> u64 {
        rows.div_ceil(self.world)
    }

    /// The rows this rank holds (`torch.chunk`: whole chunks first, the rest on the next rank,
    /// none after).
    pub fn local_rows(&self, rows: u64) -> u64 {
        let chunk = self.padded_rows(rows);
        rows.saturating_sub(chunk * self.rank).min(chunk)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Idle,
    Forward,
    PreBackward,
    PostBackward,
}

/// One parameter under FSDP2.
struct Param {
    /// The unsharded parameter as gathered, viewing its padded storage (released while
    /// sharded).
    unsharded: Tensor,
    /// Where its gradient accumulates, when it is trained.
    leaf: Option<Rc<Leaf>>,
    /// The rank's rows of its shard (a view of the padded shard).
    local: Tensor,
    /// Elements of one rank's padded shard.
    padded_shard: u64,
    /// The bytes of one element gathered (and of its shard, without a policy).
    gathered_bytes: u64,
    /// The sharded gradient: a view of the reduce-scatter's output.
    grad: Option<Tensor>,
}

/// One `fully_shard` group: the root's own parameters, or a decoder layer's.
struct Group {
    params: Vec<Param>,
    state: State,
    /// The all-gather's output until its copy-out.
    all_gather: Option<Tensor>,
    unsharded: bool,
    /// Its places in the forward's post-forward order.
    post_forward_indices: Vec<usize>,
}

/// FSDP2's state in the emulated process.
pub struct Fsdp {
    sharding: Sharding,
    /// The type gradients are reduced in.
    reduce_dtype: Dtype,
    /// The all-gather's input is a cast copy of the shards (else the shards themselves).
    casts: bool,
    /// The root (0), then each decoder layer.
    groups: Vec<Group>,
    /// `model.parameters()` order: (group, place in it).
    order: Vec<(usize, usize)>,
    /// The last forward all-gather's output, freed after the next copy-out.
    all_gather_state: Option<Tensor>,
    /// The last reduce-scatter's input, freed at the next one or at the end of backward.
    reduce_scatter_state: Option<Tensor>,
    post_forward_order: Vec<usize>,
    callback_queued: bool,
}

/// What `to_empty` makes, in the modules' order.
enum Item {
    /// A parameter of the model: its name and shape.
    Param(String, Vec<u64>),
    /// A buffer, whole.
    Buffer(Parameter),
    /// PEFT's adapter of the linear layer named: its shape, and whether it is B (else A).
    Adapter(String, Vec<u64>, bool),
}

impl Item {
    /// The module it belongs to (a parameter's or buffer's name without its last part; an
    /// adapter's linear layer).
    fn module(&self) -> &str {
        match self {
            Item::Param(name, _) | Item::Buffer(Parameter { name, .. }) => {
                name.rsplit_once('.').map_or("", |(m, _)| m)
            }
            Item::Adapter(module, ..) => module,
        }
    }

    fn name(&self) -> String {
        match self {
            Item::Param(name, _) | Item::Buffer(Parameter { name, .. }) => name.clone(),
            Item::Adapter(module, _, b) => {
                format!(
                    "{module}.lora_{}.default.weight",
                    if *b { "B" } else { "A" }
                )
            }
        }
    }
}

/// Whether every rank of `world` holds as many rows of each parameter of `model` (and of
/// `lora`'s adapters): every first dimension a multiple of the world, so that no rank's shard
/// is short or padded and every rank allocates alike (else the last ranks hold fewer rows, or
/// none).
pub fn ranks_alike(model: &Model, lora: Option<&Lora>, world: u64) -> bool {
    items(model, lora).iter().all(|item| match item {
        Item::Buffer(_) => true,
        Item::Param(_, shape) | Item::Adapter(_, shape, _) => {
            shape.first().copied().unwrap_or(1) % world == 0
        }
    })
}

/// Parameters, adapters and buffers in the modules' order: an adapter's A and B after its
/// linear layer's parameters, a buffer after its module's, a module's without any (the rotary
/// embedding) before the output head.
fn items(model: &Model, lora: Option<&Lora>) -> Vec<Item> {
    let params = model.parameters();
    let (head, body): (Vec<_>, Vec<_>) = params.iter().partition(|t| t.role == TensorRole::LmHead);
    let adapted = |t: &Parameter| {
        lora.filter(|l| t.role == TensorRole::Linear && l.targets.iter().any(|m| m == t.module()))
    };
    let mut items: Vec<Item> = Vec::new();
    for (i, &t) in body.iter().enumerate() {
        items.push(Item::Param(t.name.clone(), t.shape.clone()));
        let module = t.name.rsplit_once('.').map_or("", |(m, _)| m);
        let last_of_module = (body.get(i + 1))
            .is_none_or(|n| n.name.rsplit_once('.').map_or("", |(m, _)| m) != module);
        if let Some(l) = adapted(t).filter(|_| last_of_module) {
            let weight = (body.iter())
                .find(|w| w.name == format!("{module}.weight"))
                .expect("an adapted layer's weight");
            let (out, inp) = (weight.shape[0], weight.shape[1]);
            items.push(Item::Adapter(module.to_string(), vec![l.rank, inp], false));
            items.push(Item::Adapter(module.to_string(), vec![out, l.rank], true));
        }
    }
    for b in model.buffers() {
        let module = b.name.rsplit_once('.').map_or("", |(m, _)| m);
        let at = (items.iter())
            .rposition(|item| item.module() == module)
            .map_or(items.len(), |i| i + 1);
        items.insert(at, Item::Buffer(b));
    }
    items.extend(
        head.iter()
            .map(|t| Item::Param(t.name.clone(), t.shape.clone())),
    );
    items
}

/// The group of what belongs to `module`: its decoder layer's (1 + layer, the number after
/// `layers`, the layers' prefix), else the root's.
fn group_of(layers: &str, module: &str) -> usize {
    (module.strip_prefix(layers))
        .map(|rest| rest.split_once('.').map_or(rest, |(layer, _)| layer))
        .and_then(|layer| layer.parse::<usize>().ok())
        .map_or(0, |l| l + 1)
}

/// The bytes of the launch metadata `torch.split_with_sizes_copy` (dim 1) copies to the device
/// for a group's copy-out (`TensorShape.cu`, `split_with_sizes_copy_out_cuda_contiguous_no_cast`,
/// packed by `pack_vecs`: int64s): per chunk its destination, source and size, one block index
/// per block of 128 threads × 16 bytes, and the blocks' running sums. `chunks` are the bytes of
/// each parameter's shard; the blocks are capped at twice the GPU's resident blocks, a block then
/// covering several iterations.
fn copy_out_metadata(world: u64, chunks: &[u64], grid: super::reduce::ReductionGrid) -> u64 {
    const BLOCK_BYTES: u64 = 128 * 16;
    let max_blocks = grid.multiprocessors * grid.threads_per_multiprocessor / 128 * 2;
    let blocks: u64 = chunks.iter().map(|c| c.div_ceil(BLOCK_BYTES)).sum();
    let iter_factor = (blocks * world).div_ceil(max_blocks);
    // ⌈√iter_factor⌉ chunks a block, at most the world's.
    let root = iter_factor.isqrt();
    let chunks_per_block = (root + u64::from(root * root < iter_factor)).clamp(1, world);
    let iters_per_chunk = iter_factor.div_ceil(chunks_per_block).max(1);
    let blocks: u64 = (chunks.iter())
        .map(|c| c.div_ceil(BLOCK_BYTES * iters_per_chunk))
        .sum();
    8 * (4 * chunks.len() as u64 + 1 + blocks)
}

/// The bytes of the launch metadata `torch._chunk_cat` copies to the device for a group's
/// reduce-scatter copy-in (`TensorShape.cu`, `get_chunk_cat_metadata`, packed as int64s): per
/// gradient six entries, two more, and one per block of 2 048 bytes of each padded chunk of the
/// output (`out_chunks`, in the reduction's type).
fn copy_in_metadata(out_chunks: &[u64]) -> u64 {
    let blocks: u64 = out_chunks.iter().map(|c| c.div_ceil(128 * 16)).sum();
    8 * (6 * out_chunks.len() as u64 + 2 + blocks)
}

impl Fsdp {
    /// `fully_shard` of every decoder layer then the root, and `to_empty` on the GPU, in the
    /// modules' order: each parameter's rows on this rank (PEFT's adapters, with `lora`, after
    /// their linear layer's own) and each buffer whole; at the end of each group's modules (a
    /// layer's, then the root's at the very end), each shard that is not a whole padded chunk
    /// copied into one (`reset_sharded_param`) and the first let go. Gives the unsharded
    /// parameters by name and the adapters, for the model; the trained ones (the adapters with
    /// `lora`, else every parameter) with their gradient's leaf.
    pub fn shard(
        p: &mut Process,
        model: &Model,
        sharding: Sharding,
        param_dtype: Dtype,
        lora: Option<&Lora>,
    ) -> (Fsdp, Weights) {
        // Under a policy everything is built in float32 and gathered in `param_dtype`; without,
        // built and gathered in the run's type, but PEFT keeps a half-precision model's adapters
        // in float32 (`autocast_adapter_dtype`): a group then gathers bytes. Gradients are
        // reduced in float32 under the policy, else in the trained parameters' type.
        let (built, reduce_dtype) = match (sharding.mixed_precision, lora) {
            (true, _) => (Dtype::Float32, Dtype::Float32),
            (false, None) => (param_dtype, param_dtype),
            (false, Some(_)) => (param_dtype, Dtype::Float32),
        };
        let mut groups: Vec<Group> = (0..=model.layers.len())
            .map(|_| Group {
                params: Vec::new(),
                state: State::Idle,
                all_gather: None,
                unsharded: false,
                post_forward_indices: Vec::new(),
            })
            .collect();
        let mut by_name = FxHashMap::default();
        let mut adapters: FxHashMap<String, Adapter> = FxHashMap::default();
        let mut order = Vec::new();
        let layers = format!("{}layers.", model.text_prefix());
        let items = items(model, lora);
        // Each shard as `to_empty` left it (the rank's rows), until its group re-pads it.
        let mut unpadded: Vec<Vec<Option<Tensor>>> = vec![Vec::new(); groups.len()];
        let repad = |p: &mut Process, group: &mut Group, unpadded: &mut Vec<Option<Tensor>>| {
            for (x, local) in group.params.iter_mut().zip(unpadded.drain(..)) {
                if let Some(local) = local {
                    let rest: u64 = local.shape[1];
                    let padded = p.empty(&[x.padded_shard / rest.max(1), rest], local.elem);
                    x.local = padded.restrided(local.shape.clone(), local.strides.clone());
                    drop(local);
                }
            }
        };
        let mut a_of: FxHashMap<String, Tensor> = FxHashMap::default();
        p.in_role(Role::Weights, |p| {
            // DTensor's sharding propagation, the first time: two scalars made and freed.
            for _ in 0..2 {
                drop(p.empty(&[1], Dtype::Float32));
            }
            for (i, item) in items.iter().enumerate() {
                let g = group_of(&layers, item.module());
                let (shape, trained) = match item {
                    Item::Buffer(b) => {
                        let buffer = p.empty(&b.shape, b.buffer_dtype_in(built));
                        by_name.insert(b.name.clone(), buffer);
                        (None, false)
                    }
                    Item::Param(_, shape) => (Some(shape), lora.is_none()),
                    Item::Adapter(_, shape, _) => (Some(shape), true),
                };
                // The shard's type and the gathered one.
                let (shard_dtype, elem) = match (item, sharding.mixed_precision) {
                    (Item::Adapter(..), true) => (Dtype::Float32, param_dtype),
                    (Item::Adapter(..), false) => (Dtype::Float32, Dtype::Float32),
                    (_, _) => (built, param_dtype),
                };
                if let Some(shape) = shape {
                    let rows = shape.first().copied().unwrap_or(1);
                    let rest: u64 = shape.iter().skip(1).product();
                    let (padded_rows, local_rows) =
                        (sharding.padded_rows(rows), sharding.local_rows(rows));
                    let local = p.empty(&[local_rows, rest], shard_dtype);
                    let padded_bytes = padded_rows * sharding.world * rest * elem.bytes();
                    let mut unsharded = Tensor::over(p.tape.unallocated(padded_bytes), shape, elem);
                    let leaf = trained.then(|| {
                        let (param, leaf) = Process::parameter(&unsharded);
                        unsharded = param;
                        leaf
                    });
                    match item {
                        Item::Adapter(module, _, false) => {
                            a_of.insert(module.clone(), unsharded.clone());
                        }
                        Item::Adapter(module, _, true) => {
                            let a = a_of.remove(module).expect("A before B");
                            adapters.insert(
                                module.clone(),
                                Adapter {
                                    a,
                                    b: unsharded.clone(),
                                    dropout: lora.is_some_and(|l| l.dropout),
                                },
                            );
                        }
                        _ => {
                            by_name.insert(item.name(), unsharded.clone());
                        }
                    }
                    order.push((g, groups[g].params.len()));
                    unpadded[g].push((local_rows != padded_rows).then(|| local.clone()));
                    groups[g].params.push(Param {
                        unsharded,
                        leaf,
                        local,
                        padded_shard: padded_rows * rest,
                        gathered_bytes: elem.bytes(),
                        grad: None,
                    });
                }
                let next = items.get(i + 1).map(|n| group_of(&layers, n.module()));
                if g > 0 && next != Some(g) {
                    repad(p, &mut groups[g], &mut unpadded[g]);
                }
            }
            repad(p, &mut groups[0], &mut unpadded[0]);
        });
        if model.tied_embeddings {
            let embed = by_name[&format!("{}embed_tokens.weight", model.text_prefix())].clone();
            by_name.insert("lm_head.weight".into(), embed);
        }
        let fsdp = Fsdp {
            sharding,
            reduce_dtype,
            casts: sharding.mixed_precision,
            groups,
            order,
            all_gather_state: None,
            reduce_scatter_state: None,
            post_forward_order: Vec::new(),
            callback_queued: false,
        };
        let weights = Weights {
            by_name,
            adapters,
            quantized: FxHashMap::default(),
            quantization_map: None,
            stored: Vec::new(),
        };
        (fsdp, weights)
    }

    /// `FSDPParamGroup.unshard`: the all-gather's input and output on the copy-in stream.
    fn unshard(&mut self, p: &mut Process, g: usize) {
        let group = &mut self.groups[g];
        if group.all_gather.is_some() || group.unsharded || group.params.is_empty() {
            return;
        }
        // In bytes: a group of several types gathers them as bytes.
        let input_bytes: u64 = (group.params.iter())
            .map(|x| x.padded_shard * x.gathered_bytes)
            .sum();
        let world = self.sharding.world;
        let casts = self.casts;
        let output = p.tape.on_stream(ALL_GATHER_STREAM, || {
            p.tape.with_role(Role::Weights, || {
                let input = casts.then(|| p.tape.empty(&[input_bytes], Dtype::Uint8));
                let output = p.tape.empty(&[input_bytes * world], Dtype::Uint8);
                drop(input);
                output
            })
        });
        group.all_gather = Some(output);
    }

    /// `FSDPParamGroup.wait_for_unshard`: the copy-out into each parameter's storage.
    fn wait_for_unshard(&mut self, p: &mut Process, g: usize) {
        let Some(output) = self.groups[g].all_gather.take() else {
            return;
        };
        let forward = self.groups[g].state == State::Forward;
        // The previous forward all-gather's output goes when this call returns.
        let previous = if forward {
            self.all_gather_state.take()
        } else {
            None
        };
        let world = self.sharding.world;
        let group = &mut self.groups[g];
        p.tape.with_role(Role::Weights, || {
            for x in &group.params {
                x.unsharded.storage.allocate();
            }
        });
        let chunks: Vec<u64> = (group.params.iter())
            .map(|x| x.padded_shard * x.gathered_bytes)
            .collect();
        let bytes = copy_out_metadata(world, &chunks, p.kernels.reduction_grid);
        p.in_role(Role::Workspaces, |p| drop(p.empty(&[bytes], Dtype::Uint8)));
        group.unsharded = true;
        if forward {
            self.all_gather_state = Some(output);
        } else {
            drop(output);
        }
        drop(previous);
    }

    /// `FSDPParamGroup.reshard`: the unsharded storages freed.
    fn reshard(&mut self, g: usize) {
        let group = &mut self.groups[g];
        if !group.unsharded {
            return;
        }
        for x in &group.params {
            x.unsharded.storage.release();
        }
        group.unsharded = false;
    }

    fn record_post_forward(&mut self, g: usize) {
        self.reshard(g);
        let index = self.post_forward_order.len();
        self.post_forward_order.push(g);
        let group = &mut self.groups[g];
        group.post_forward_indices.push(index);
        group.state = State::Idle;
    }

    fn pre_backward(&mut self, p: &mut Process, g: usize) {
        self.callback_queued = true;
        if self.groups[g].state == State::PreBackward {
            return;
        }
        self.groups[g].state = State::PreBackward;
        self.unshard(p, g);
        self.wait_for_unshard(p, g);
        // Prefetch the group whose forward ended before this one's.
        if let Some(index) = self.groups[g].post_forward_indices.pop() {
            if let Some(&target) = index
                .checked_sub(1)
                .and_then(|i| self.post_forward_order.get(i))
            {
                self.unshard(p, target);
            }
        }
    }

    fn post_backward(&mut self, p: &mut Process, g: usize) {
        let group = &mut self.groups[g];
        group.state = State::PostBackward;
        let mut grads = Vec::new();
        let mut shards = Vec::new();
        for (i, x) in group.params.iter().enumerate() {
            if let Some(grad) = x.leaf.as_ref().and_then(|l| l.grad.borrow_mut().take()) {
                grads.push(grad);
                shards.push(i);
            }
        }
        self.reshard(g);
        if grads.is_empty() {
            return;
        }
        drop(self.reduce_scatter_state.take());
        let world = self.sharding.world;
        let group = &mut self.groups[g];
        let input_numel: u64 = shards
            .iter()
            .map(|&i| group.params[i].padded_shard * world)
            .sum();
        let reduce_dtype = self.reduce_dtype;
        let input = p.in_role(Role::Gradients, |p| p.empty(&[input_numel], reduce_dtype));
        let out_chunks: Vec<u64> = (shards.iter())
            .map(|&i| group.params[i].padded_shard * reduce_dtype.bytes())
            .collect();
        p.in_role(Role::Workspaces, |p| {
            drop(p.empty(&[copy_in_metadata(&out_chunks)], Dtype::Uint8))
        });
        // `unsharded_grads.clear()`: CPython lets a list's items go from the last.
        for grad in grads.into_iter().rev() {
            drop(grad);
        }
        let output = p.tape.on_stream(REDUCE_SCATTER_STREAM, || {
            (p.tape).with_role(Role::Gradients, || {
                p.tape.empty(&[input_numel / world], reduce_dtype)
            })
        });
        for &i in &shards {
            let x = &mut group.params[i];
            x.grad = Some(output.restrided(x.local.shape.clone(), x.local.strides.clone()));
        }
        drop(output);
        self.reduce_scatter_state = Some(input);
    }
}

impl ShardedModel for Fsdp {
    /// The group unsharded (the root's before the model's forward, a layer's as its call
    /// begins); a layer's input given `RegisterPostBackwardFunction`'s node.
    fn pre_forward(&mut self, p: &mut Process, g: usize, input: Option<&Tensor>) -> Option<Tensor> {
        self.groups[g].state = State::Forward;
        self.unshard(p, g);
        self.wait_for_unshard(p, g);
        input.and_then(|t| hooked(p, Hook::PostBackward(g), t))
    }

    /// Resharded while the call still holds its input, the pre-backward hook on the output (for
    /// the root, after the model's forward returns, the loss); after the root's, the last
    /// all-gather's output freed.
    fn post_forward(&mut self, p: &mut Process, g: usize, output: &Tensor) -> Option<Tensor> {
        self.record_post_forward(g);
        let output = hooked(p, Hook::PreBackward(g), output);
        if g == 0 {
            drop(self.all_gather_state.take());
        }
        output
    }

    fn run_hook(&mut self, p: &mut Process, hook: Hook) {
        match hook {
            Hook::PreBackward(g) => self.pre_backward(p, g),
            Hook::PostBackward(g) => self.post_backward(p, g),
        }
    }

    /// Queued by the first pre-backward: the post-backward of each group that did not run its
    /// own (the root first), then the last reduce-scatter's input freed.
    fn final_callback(&mut self, p: &mut Process) {
        if !std::mem::take(&mut self.callback_queued) {
            return;
        }
        for g in 0..self.groups.len() {
            if self.groups[g].state != State::PostBackward {
                self.post_backward(p, g);
            }
            let group = &mut self.groups[g];
            group.state = State::Idle;
            // A prefetch no group waited for.
            drop(group.all_gather.take());
            group.post_forward_indices.clear();
        }
        self.post_forward_order.clear();
        drop(self.reduce_scatter_state.take());
    }

    /// The rank's shards whose gradient exists, in `model.parameters()` order.
    fn stepped(&self) -> Vec<Tensor> {
        (self.order.iter())
            .map(|&(g, i)| &self.groups[g].params[i])
            .filter(|x| x.grad.is_some())
            .map(|x| x.local.clone())
            .collect()
    }

    /// The sharded gradients let go in `model.parameters()` order.
    fn zero_grad(&mut self) {
        for &(g, i) in &self.order {
            drop(self.groups[g].params[i].grad.take());
        }
    }
}

/// `t` through an identity node running `hook` on the way back, when it needs a gradient.
fn hooked(p: &mut Process, hook: Hook, t: &Tensor) -> Option<Tensor> {
    if !p.needs_grad(&[t]) {
        return None;
    }
    let mut out = t.restrided(t.shape.clone(), t.strides.clone());
    p.autograd.record(
        super::tensor::Rule::Hook(hook),
        &[t],
        Vec::new(),
        &mut [&mut out],
    );
    Some(out)
}
