//! FSDP2 (`torch.distributed.fsdp.fully_shard`, PyTorch 2.11) as one rank of a world runs it,
//! for memory: the model built on `meta` in float32, `fully_shard` on every decoder layer then on
//! the root, `MixedPrecisionPolicy(param_dtype, reduce_dtype)`, `reshard_after_forward=True`,
//! `to_empty` on the GPU. Read from `_fsdp_param_group.py`, `_fsdp_collectives.py`,
//! `_fsdp_param.py` and `_fsdp_state.py`, and checked against the H200's records of
//! `scripts/gpu/hf_loops.py`'s FSDP2 runs through the fake process group.
//!
//! - Each parameter's shard: its first dimension cut in `world` chunks of `ceil(rows / world)`
//!   rows, each rank's storage padded to a whole chunk (the last ranks may hold fewer rows, or
//!   none); the optimizer's states follow the rows the rank holds.
//! - A group's unshard: on the all-gather copy-in stream, the group's shards cast to
//!   `param_dtype` into one flat input, the all-gather's output (the input times the world), the
//!   input let go; then on the default stream each parameter's padded unsharded storage and the
//!   copy-out's metadata. In forward the output is freed after the next group's copy-out (and the
//!   last one after the root's forward), in backward at once.
//! - Reshard: the unsharded storages freed (`resize_(0)`), after each layer's forward and
//!   backward, and after the root's forward.
//! - Backward: a hook on each group's outputs unshards it and prefetches the group that ran
//!   before it in forward; a node on each group's inputs (`RegisterPostBackwardFunction`) runs its
//!   post-backward once its inputs' gradients are made: reshard, then the reduce-scatter's input
//!   in `reduce_dtype` on the default stream (the previous one freed first), the gradients copied
//!   into it and freed, and its output on the reduce-scatter stream, whose views are the sharded
//!   gradients until `zero_grad`. Groups whose inputs need no gradient (the root) run theirs in
//!   the engine's final callback, which then frees the last reduce-scatter input.

use super::process::{Process, ShardedModel};
use super::tensor::{Hook, Leaf, Tensor};
use crate::dtype::Dtype;
use crate::model::{Model, TensorRole};
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// The unsharded parameter in `param_dtype`, viewing its padded storage (released while
    /// sharded).
    unsharded: Tensor,
    /// Where its gradient accumulates, when it is trained.
    leaf: Option<Rc<Leaf>>,
    /// The rank's rows of its float32 shard (a view of the padded shard).
    local: Tensor,
    /// Elements of one rank's padded shard.
    padded_shard: u64,
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
    /// The type the parameters are gathered (and computed) in, and gradients reduced in.
    param_dtype: Dtype,
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

/// The group of parameter `name`: its decoder layer's (1 + layer), else the root's.
fn group_of(model: &Model, name: &str) -> usize {
    (0..model.layers.len())
        .find(|&l| {
            name.strip_prefix(&super::decoder::layer_prefix(model, l))
                .is_some_and(|rest| rest.starts_with('.'))
        })
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
    /// modules' order: each parameter's rows on this rank and each buffer whole; at the end of
    /// each group's modules (a layer's, then the root's at the very end), each shard that is not
    /// a whole padded chunk copied into one (`reset_sharded_param`) and the first let go. Gives
    /// the unsharded parameters (trained ones with their gradient's leaf), by name, for the model.
    pub fn shard(
        p: &mut Process,
        model: &Model,
        sharding: Sharding,
        param_dtype: Dtype,
        trained: bool,
    ) -> (Fsdp, FxHashMap<String, Tensor>) {
        let (built, reduce_dtype) = match sharding.mixed_precision {
            true => (Dtype::Float32, Dtype::Float32),
            false => (param_dtype, param_dtype),
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
        let mut order = Vec::new();
        // Parameters and buffers in the modules' order: a buffer after its module's parameters,
        // a module's without any (the rotary embedding) before the output head.
        let params = model.parameters();
        let (head, body): (Vec<_>, Vec<_>) =
            params.iter().partition(|t| t.role == TensorRole::LmHead);
        let mut items: Vec<(&crate::model::Parameter, bool)> =
            body.iter().map(|&t| (t, true)).collect();
        let buffers = model.buffers();
        for b in &buffers {
            let module = b.name.rsplit_once('.').map_or("", |(m, _)| m);
            let at = (items.iter())
                .rposition(|(t, _)| t.name.rsplit_once('.').is_some_and(|(m, _)| m == module))
                .map_or(items.len(), |i| i + 1);
            items.insert(at, (b, false));
        }
        items.extend(head.iter().map(|&t| (t, true)));
        // Each shard as `to_empty` left it (the rank's rows), until its group re-pads it.
        let mut unpadded: Vec<Vec<Option<Tensor>>> = vec![Vec::new(); groups.len()];
        let repad = |p: &mut Process, group: &mut Group, unpadded: &mut Vec<Option<Tensor>>| {
            for (x, local) in group.params.iter_mut().zip(unpadded.drain(..)) {
                if let Some(local) = local {
                    let rest: u64 = local.shape[1];
                    let padded = p.empty(&[x.padded_shard / rest.max(1), rest], built);
                    x.local = padded.restrided(local.shape.clone(), local.strides.clone());
                    drop(local);
                }
            }
        };
        p.in_role(Role::Weights, |p| {
            // DTensor's sharding propagation, the first time: two scalars made and freed.
            for _ in 0..2 {
                drop(p.empty(&[1], Dtype::Float32));
            }
            for (i, &(t, is_param)) in items.iter().enumerate() {
                let g = group_of(model, &t.name);
                if !is_param {
                    by_name.insert(t.name.clone(), p.empty(&t.shape, t.buffer_dtype_in(built)));
                } else {
                    let rows = t.shape.first().copied().unwrap_or(1);
                    let rest: u64 = t.shape.iter().skip(1).product();
                    let (padded_rows, local_rows) =
                        (sharding.padded_rows(rows), sharding.local_rows(rows));
                    let local = p.empty(&[local_rows, rest], built);
                    let padded_bytes = padded_rows * sharding.world * rest * param_dtype.bytes();
                    let mut unsharded =
                        Tensor::over(p.tape.unallocated(padded_bytes), &t.shape, param_dtype);
                    let leaf = trained.then(|| {
                        let (param, leaf) = Process::parameter(&unsharded);
                        unsharded = param;
                        leaf
                    });
                    by_name.insert(t.name.clone(), unsharded.clone());
                    order.push((g, groups[g].params.len()));
                    unpadded[g].push((local_rows != padded_rows).then(|| local.clone()));
                    groups[g].params.push(Param {
                        unsharded,
                        leaf,
                        local,
                        padded_shard: padded_rows * rest,
                        grad: None,
                    });
                }
                let next = items.get(i + 1).map(|(t, _)| group_of(model, &t.name));
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
            param_dtype,
            reduce_dtype,
            casts: built != param_dtype,
            groups,
            order,
            all_gather_state: None,
            reduce_scatter_state: None,
            post_forward_order: Vec::new(),
            callback_queued: false,
        };
        (fsdp, by_name)
    }

    /// `FSDPParamGroup.unshard`: the all-gather's input and output on the copy-in stream.
    fn unshard(&mut self, p: &mut Process, g: usize) {
        let group = &mut self.groups[g];
        if group.all_gather.is_some() || group.unsharded || group.params.is_empty() {
            return;
        }
        let input_numel: u64 = group.params.iter().map(|x| x.padded_shard).sum();
        let world = self.sharding.world;
        let dtype = self.param_dtype;
        let casts = self.casts;
        let output = p.tape.on_stream(ALL_GATHER_STREAM, || {
            p.tape.with_role(Role::Weights, || {
                let input = casts.then(|| p.tape.empty(&[input_numel], dtype));
                let output = p.tape.empty(&[input_numel * world], dtype);
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
            .map(|x| x.padded_shard * self.param_dtype.bytes())
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

    /// The engine's final callback after backward (queued by the first pre-backward): the
    /// post-backward of each group that did not run its own (the root first), then the last
    /// reduce-scatter's input freed.
    fn finish_backward(&mut self, p: &mut Process) {
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

    /// The rank's shards whose gradient exists, in `model.parameters()` order (what the
    /// optimizer steps).
    fn shards_with_gradients(&self) -> Vec<Tensor> {
        (self.order.iter())
            .map(|&(g, i)| &self.groups[g].params[i])
            .filter(|x| x.grad.is_some())
            .map(|x| x.local.clone())
            .collect()
    }

    /// `zero_grad(set_to_none=True)`: the sharded gradients let go in `model.parameters()` order.
    fn drop_gradients(&mut self) {
        for &(g, i) in &self.order {
            drop(self.groups[g].params[i].grad.take());
        }
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

    fn final_callback(&mut self, p: &mut Process) {
        self.finish_backward(p);
    }

    fn stepped(&self) -> Vec<Tensor> {
        self.shards_with_gradients()
    }

    fn zero_grad(&mut self) {
        self.drop_gradients();
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
