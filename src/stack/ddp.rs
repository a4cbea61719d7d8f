//! One rank of `DistributedDataParallel` (PyTorch 2.11's module and its C++ reducer): the whole
//! model on every rank, and what DDP allocates around a training written by hand.
//!
//! - At its construction: the trained parameters' shapes checked across ranks (a size on the
//!   device, one a rank, then every size and stride as int64), the parameters and buffers
//!   broadcast from rank 0 (`broadcast_coalesced`: flattened in chunks of 250 MiB or more, two in
//!   flight; a chunk of one tensor is a view), then the reducer's buckets: one flat buffer a
//!   dtype for every trained parameter (`find_unused_parameters=False` sizes them without limit).
//! - Each forward under grad mode: once a backward has run, the buckets rebuilt in the order the
//!   gradients became ready (the indices broadcast as int32, the old buckets freed, the new ones
//!   made: a first of 1 MiB, then 25 MiB or more each, or `bucket_cap_mb` for both when given);
//!   then the buffers broadcast again.
//! - Each gradient, once `AccumulateGrad` has set it, is copied into its bucket, all-reduced in
//!   place there and copied back (nothing allocated); with `gradient_as_bucket_view=True` the
//!   gradient becomes its bucket's view and the tensor autograd made goes.

use super::process::{Process, Replicated};
use super::tensor::{contiguous_strides, Leaf, Meta, Tensor};
use crate::dtype::Dtype;
use crate::replay::program::Role;
use std::collections::VecDeque;

/// `broadcast_coalesced`'s chunk (`broadcast_bucket_size`, 250 MiB).
const BROADCAST_CHUNK: u64 = 250 << 20;
/// The first bucket after the rebuild under the default cap (`_DEFAULT_FIRST_BUCKET_BYTES`).
const FIRST_BUCKET: u64 = 1 << 20;
/// `bucket_cap_mb`'s default, 25 MiB.
const DEFAULT_CAP: u64 = 25 << 20;

/// How a rank of DDP is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ddp {
    pub world: u64,
    pub rank: u64,
    /// `gradient_as_bucket_view=True`: the gradients are views of the buckets.
    pub gradient_as_bucket_view: bool,
    /// `bucket_cap_mb` in bytes when given (the first bucket is then as large); `None`: the
    /// default, 25 MiB after a first bucket of 1 MiB.
    pub bucket_cap: Option<u64>,
}

impl Ddp {
    /// The limits of the rebuilt buckets: the first, then every other.
    fn rebuilt_limits(self) -> [u64; 2] {
        match self.bucket_cap {
            None => [FIRST_BUCKET, DEFAULT_CAP],
            Some(cap) => [cap, cap],
        }
    }
}

/// A tensor as DDP's bucketing sees it: its type and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorBytes {
    pub elem: Dtype,
    pub bytes: u64,
}

impl TensorBytes {
    pub fn of(t: &Tensor) -> TensorBytes {
        TensorBytes {
            elem: t.elem,
            bytes: t.bytes(),
        }
    }
}

/// `compute_bucket_assignment_by_size`: the tensors (`order`, or all in turn) put in buckets by
/// type, a bucket closed once its bytes reach its limit (`limits` in turn for each type, the
/// last repeated), the others closed at the end; without an order, sorted by their first
/// tensor. Indices into `tensors`.
fn buckets_by_size(
    tensors: &[TensorBytes],
    limits: &[u64],
    order: Option<&[usize]>,
) -> Vec<Vec<usize>> {
    let all: Vec<usize> = (0..tensors.len()).collect();
    let mut open: Vec<(Dtype, Vec<usize>, u64, usize)> = Vec::new();
    let mut out = Vec::new();
    for &i in order.unwrap_or(&all) {
        let t = tensors[i];
        let at = match open.iter().position(|b| b.0 == t.elem) {
            Some(at) => at,
            None => {
                open.push((t.elem, Vec::new(), 0, 0));
                open.len() - 1
            }
        };
        let b = &mut open[at];
        b.1.push(i);
        b.2 += t.bytes;
        if b.2 >= limits[b.3] {
            out.push(std::mem::take(&mut b.1));
            b.2 = 0;
            b.3 = (b.3 + 1).min(limits.len() - 1);
        }
    }
    out.extend(open.into_iter().map(|b| b.1).filter(|b| !b.is_empty()));
    if order.is_none() {
        out.sort_by_key(|b| b.iter().min().copied());
    }
    out
}

/// `broadcast_coalesced` of `tensors` from rank 0: each chunk flattened into one tensor (a chunk
/// of one tensor is a view of it), at most two in flight, each let go once broadcast and copied
/// back.
fn broadcast_coalesced(p: &mut Process, tensors: &[TensorBytes]) {
    let mut in_flight: VecDeque<Option<Tensor>> = VecDeque::new();
    for chunk in buckets_by_size(tensors, &[BROADCAST_CHUNK], None) {
        if in_flight.len() >= 2 {
            drop(in_flight.pop_front());
        }
        let flat = (chunk.len() > 1).then(|| {
            let t = tensors[chunk[0]];
            let bytes: u64 = chunk.iter().map(|&i| tensors[i].bytes).sum();
            p.empty(&[bytes / t.elem.bytes()], t.elem)
        });
        in_flight.push_back(flat);
    }
    while let Some(flat) = in_flight.pop_front() {
        drop(flat);
    }
}

/// A bucket: its flat buffer and the trained parameters it holds.
struct Bucket {
    flat: Tensor,
    members: Vec<usize>,
}

/// The reducer of one rank: its buckets, and the order the gradients became ready in the first
/// backward.
pub struct Reducer {
    ddp: Ddp,
    /// The trained parameters in `parameters()` order: the leaf their gradient goes to, and its
    /// layout.
    trained: Vec<(usize, Meta)>,
    /// Their types and bytes, as the buckets are sized.
    sizes: Vec<TensorBytes>,
    buckets: Vec<Bucket>,
    ready: Vec<usize>,
    rebuilt: bool,
    /// The buffers broadcast before each forward.
    buffers: Vec<TensorBytes>,
}

/// A leaf's identity (its gradient's place).
fn leaf_key(leaf: &Leaf) -> usize {
    leaf as *const Leaf as usize
}

impl Reducer {
    /// `DistributedDataParallel(model)`: `trained` the trained parameters (their leaves) in
    /// `parameters()` order, `states` every parameter then every buffer of the module in
    /// `named_parameters()` and `named_buffers()` order, `buffers` how many of those are
    /// buffers.
    pub fn new(
        p: &mut Process,
        ddp: Ddp,
        trained: &[std::rc::Rc<Leaf>],
        states: &[TensorBytes],
        buffers: usize,
    ) -> Reducer {
        // `_verify_param_shape_across_processes`: the count on the device, gathered from every
        // rank, then each trained parameter's sizes and strides.
        let dims: u64 = trained.iter().map(|l| l.meta.shape.len() as u64).sum();
        p.in_role(Role::Activations, |p| {
            let count = p.empty(&[1], Dtype::Int64);
            let gathered: Vec<Tensor> = (0..ddp.world)
                .map(|_| p.empty(&[1], Dtype::Int64))
                .collect();
            let metadata = p.empty(&[2 * dims], Dtype::Int64);
            drop(metadata);
            drop(gathered);
            drop(count);
            // `_sync_module_states`: parameters and buffers from rank 0.
            broadcast_coalesced(p, states);
        });
        let sizes = (trained.iter())
            .map(|l| TensorBytes {
                elem: l.meta.elem,
                bytes: l.meta.shape.iter().product::<u64>() * l.meta.elem.bytes(),
            })
            .collect();
        let mut reducer = Reducer {
            ddp,
            trained: (trained.iter())
                .map(|l| (leaf_key(l), l.meta.clone()))
                .collect(),
            sizes,
            buckets: Vec::new(),
            ready: Vec::new(),
            rebuilt: false,
            buffers: states[states.len() - buffers..].to_vec(),
        };
        // One bucket a type, given to the reducer last first.
        let mut first = buckets_by_size(&reducer.sizes, &[u64::MAX], None);
        first.reverse();
        reducer.make_buckets(p, first);
        reducer
    }

    /// `initialize_buckets`: the old buckets let go, then a flat buffer for each new one.
    fn make_buckets(&mut self, p: &mut Process, assignment: Vec<Vec<usize>>) {
        self.buckets.clear();
        for members in assignment {
            let elem = self.sizes[members[0]].elem;
            let bytes: u64 = members.iter().map(|&i| self.sizes[i].bytes).sum();
            let flat = p.in_role(Role::Gradients, |p| p.empty(&[bytes / elem.bytes()], elem));
            self.buckets.push(Bucket { flat, members });
        }
    }
}

impl Replicated for Reducer {
    /// DDP's `_pre_forward` under grad mode: the buckets rebuilt after the first backward, then
    /// the buffers broadcast.
    fn pre_forward(&mut self, p: &mut Process) {
        if !self.rebuilt && !self.ready.is_empty() {
            self.rebuilt = true;
            let order = std::mem::take(&mut self.ready);
            let assignment = buckets_by_size(&self.sizes, &self.ddp.rebuilt_limits(), Some(&order));
            // `sync_bucket_indices`: every index and a terminator, then each bucket's size.
            p.in_role(Role::Activations, |p| {
                let indices = p.empty(&[self.trained.len() as u64 + 1], Dtype::Int32);
                let sizes = p.empty(&[assignment.len() as u64], Dtype::Int32);
                drop(sizes);
                drop(indices);
            });
            self.make_buckets(p, assignment);
        }
        if !self.buffers.is_empty() {
            p.in_role(Role::Activations, |p| broadcast_coalesced(p, &self.buffers));
        }
    }

    /// The post-hook of a trained parameter's `AccumulateGrad`: the first backward notes the
    /// order; a gradient that is a bucket's view gives its own tensor up.
    fn gradient_ready(&mut self, leaf: &Leaf) {
        let key = leaf_key(leaf);
        let Some(index) = self.trained.iter().position(|(k, _)| *k == key) else {
            return;
        };
        if !self.rebuilt && !self.ready.contains(&index) {
            self.ready.push(index);
        }
        if !self.ddp.gradient_as_bucket_view {
            return;
        }
        let bucket = (self.buckets.iter())
            .find(|b| b.members.contains(&index))
            .expect("every trained parameter has a bucket");
        let mut grad = leaf.grad.borrow_mut();
        if grad
            .as_ref()
            .is_some_and(|g| !g.shares_storage(&bucket.flat))
        {
            let meta = &self.trained[index].1;
            let view = bucket
                .flat
                .restrided(meta.shape.clone(), contiguous_strides(&meta.shape));
            drop(grad.replace(view));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(elem: Dtype, bytes: u64) -> TensorBytes {
        TensorBytes { elem, bytes }
    }

    #[test]
    fn buckets_close_at_their_limit_by_type_and_sort_by_their_first_tensor() {
        let (b, f) = (Dtype::Bfloat16, Dtype::Float32);
        // Llama 3.1 8B's widths, two layers: the embeddings alone (a view when broadcast),
        // then chunks closed past 250 MiB, the float32 buffers last.
        let mib = 1 << 20;
        let tensors = [
            s(b, 1002 * mib),
            s(b, 32 * mib),
            s(b, 8 * mib),
            s(b, 8 * mib),
            s(b, 32 * mib),
            s(b, 112 * mib),
            s(b, 112 * mib),
            s(f, 256),
            s(b, 112 * mib),
            s(f, 256),
        ];
        assert_eq!(
            buckets_by_size(&tensors, &[BROADCAST_CHUNK], None),
            [vec![0], vec![1, 2, 3, 4, 5, 6], vec![7, 9], vec![8]]
        );
        // In the order given, unsorted; the limits in turn.
        assert_eq!(
            buckets_by_size(&tensors[1..5], &[mib, 40 * mib], Some(&[3, 2, 1, 0])),
            [vec![3], vec![2, 1, 0]]
        );
    }
}
