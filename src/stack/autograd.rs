//! Autograd as PyTorch's engine runs it, for memory: each recorded operation is a node holding
//! the tensors it saved; `backward` runs the nodes on one device queue, the ready node with the
//! highest sequence number first (a parameter's gradient accumulation as soon as it is ready),
//! frees each node's incoming gradients when it returns and its saved tensors right after, and
//! adds gradients that meet at one input in place when the first is not shared.

use super::tensor::{Grad, Leaf, Meta, Node, NodeRef, Rule, Tensor};
use crate::dtype::Dtype;
use crate::replay::program::Role;
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::BinaryHeap;
use std::rc::Rc;

/// What recorded nodes do with the tensors they save.
#[derive(Default)]
pub enum Saving {
    /// Keep them (autograd's default).
    #[default]
    Keep,
    /// Inside a checkpointed layer's forward: keep none; the layer is recomputed in backward.
    Checkpoint { frame: usize },
    /// Recomputing a checkpointed layer: collect them, in order, until `needed` are collected
    /// (PyTorch stops the recomputation there).
    Capture {
        needed: usize,
        captured: Vec<Vec<Tensor>>,
    },
}

/// A checkpointed layer: its inputs (held until its backward is over), the nodes waiting for
/// recomputed tensors, and how many tensors they wait for.
pub struct Frame {
    pub layer: usize,
    pub inputs: Vec<Tensor>,
    pub nodes: Vec<NodeRef>,
    pub needed: usize,
    /// Nodes with saved tensors still to run.
    pub remaining: usize,
    /// The autocast type of the forward, which the recomputation runs under again.
    pub autocast: Option<Dtype>,
}

/// The graph's state in the emulated process.
#[derive(Default)]
pub struct Autograd {
    /// `torch.no_grad()` is off.
    pub enabled: bool,
    next_seq: u64,
    pub saving: Saving,
    pub frames: Vec<Frame>,
    /// The recomputation has collected what it needed (the tape allocates nothing more).
    pub stop: bool,
}

impl Autograd {
    pub fn new() -> Autograd {
        Autograd {
            enabled: true,
            ..Default::default()
        }
    }

    /// Whether an operation on `inputs` is recorded: autograd is on and an input has a history.
    pub fn records(&self, inputs: &[&Tensor]) -> bool {
        self.enabled && inputs.iter().any(|t| t.grad_fn.is_some())
    }

    /// Records `rule` over `inputs` if grad mode is on and an input needs a gradient; sets the
    /// outputs' `grad_fn`.
    pub fn record(
        &mut self,
        rule: Rule,
        inputs: &[&Tensor],
        saved: Vec<Tensor>,
        outputs: &mut [&mut Tensor],
    ) {
        if !self.records(inputs) {
            return;
        }
        let has_saved = !saved.is_empty();
        let (saved, frame) = match &mut self.saving {
            Saving::Keep => (saved, None),
            Saving::Checkpoint { frame } => {
                let f = &mut self.frames[*frame];
                if has_saved {
                    f.needed += saved.len();
                    f.remaining += 1;
                }
                (Vec::new(), Some(*frame).filter(|_| has_saved))
            }
            Saving::Capture { needed, captured } => {
                if has_saved {
                    captured.push(saved);
                    if captured.iter().map(Vec::len).sum::<usize>() >= *needed {
                        self.stop = true;
                    }
                }
                (Vec::new(), None)
            }
        };
        let node = Rc::new(RefCell::new(Node {
            seq: self.next_seq,
            rule,
            saved,
            next: inputs.iter().map(|t| t.grad_fn.clone()).collect(),
            inputs: inputs.iter().map(|t| Meta::of(t)).collect(),
            frame,
        }));
        self.next_seq += 1;
        if let Some(f) = frame {
            self.frames[f].nodes.push(node.clone());
        }
        for (i, out) in outputs.iter_mut().enumerate() {
            out.grad_fn = Some(Grad::Node(node.clone(), i));
        }
    }
}

struct Ready {
    seq: u64,
    key: usize,
    grad: Grad,
}

impl PartialEq for Ready {
    fn eq(&self, o: &Self) -> bool {
        (self.seq, self.key) == (o.seq, o.key)
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.seq.cmp(&o.seq).then(self.key.cmp(&o.key))
    }
}

/// What a node's backward needs besides its gradients: the emulated process.
pub trait Backward {
    /// Runs `rule` on the incoming gradients; returns one gradient per input.
    fn run(&mut self, node: &Node, grads: &[Option<Tensor>]) -> Vec<Option<Tensor>>;
    /// `a + b` (a new tensor), when two gradients meet and neither can take the other in place.
    fn add(&mut self, a: &Tensor, b: &Tensor) -> Tensor;
    /// A copy of `grad` laid out as the parameter (a gradient that cannot be stolen).
    fn clone_as(&mut self, grad: &Tensor, meta: &Meta) -> Tensor;
    /// The engine's checks of a node's outputs: each gradient reduced to its input's shape (a
    /// broadcast input) and cast to its type.
    fn validate(&mut self, node: &Node, outputs: Vec<Option<Tensor>>) -> Vec<Option<Tensor>>;
    /// Recomputes checkpointed layer `frame`, giving its nodes their saved tensors.
    fn recompute(&mut self, frame: usize);
    /// A node of checkpointed layer `frame` has run (its inputs go after the last one).
    fn frame_node_done(&mut self, frame: usize);
    /// `AccumulateGrad`'s post-hooks on `leaf` (DDP's reducer).
    fn gradient_ready(&mut self, leaf: &Leaf);
}

/// Whether `t` may be added into in place: not a view, its storage held by it alone, dense
/// (as observed on the GPU, a gradient that arrives through a view is never added into).
fn unique_dense(t: &Tensor) -> bool {
    !t.is_view && t.storage_uses() == 1 && t.is_contiguous()
}

/// Runs backward from `root` with the incoming gradient `grad`.
pub fn backward(process: &mut dyn Backward, root: &Tensor, grad: Tensor) {
    let Some(start) = root.grad_fn.clone() else {
        return;
    };
    // Dependencies: how many edges of the reachable graph lead to each node.
    let mut deps: FxHashMap<usize, usize> = FxHashMap::default();
    let mut seen: FxHashMap<usize, ()> = FxHashMap::default();
    let mut stack = vec![start.clone()];
    seen.insert(start.key(), ());
    while let Some(g) = stack.pop() {
        if let Grad::Node(n, _) = &g {
            for next in n.borrow().next.iter().flatten() {
                *deps.entry(next.key()).or_default() += 1;
                if seen.insert(next.key(), ()).is_none() {
                    stack.push(next.clone());
                }
            }
        }
    }
    let mut buffers: FxHashMap<usize, Vec<Option<Tensor>>> = FxHashMap::default();
    let mut ready = BinaryHeap::new();
    let slots = |g: &Grad| match g {
        Grad::Node(n, _) => n.borrow().rule.outputs(),
        Grad::Leaf(_) => 1,
    };
    let mut first = vec![None; slots(&start)];
    first[start.slot()] = Some(grad);
    buffers.insert(start.key(), first);
    ready.push(Ready {
        seq: start.seq(),
        key: start.key(),
        grad: start,
    });
    while let Some(Ready { key, grad: g, .. }) = ready.pop() {
        let grads = buffers.remove(&key).unwrap_or_default();
        match g {
            Grad::Leaf(leaf) => accumulate(process, &leaf, grads),
            Grad::Node(node, _) => {
                let frame = node.borrow().frame;
                if let Some(f) = frame {
                    if node.borrow().saved.is_empty() {
                        process.recompute(f);
                    }
                }
                let outputs = {
                    let n = node.borrow();
                    process.run(&n, &grads)
                };
                let (next, saved) = {
                    let mut n = node.borrow_mut();
                    (n.next.clone(), std::mem::take(&mut n.saved))
                };
                // A recomputed node's tensors, unpacked into the call, go when it returns;
                // then the engine checks its outputs, frees its incoming gradients and releases
                // its saved tensors.
                let saved = if frame.is_some() {
                    // Unpacked into the backward's locals, they go as C++ destroys them: a
                    // product's operands in order, the others last first.
                    let product = matches!(node.borrow().rule, Rule::Mul);
                    let mut saved = saved;
                    if !product {
                        saved.reverse();
                    }
                    for t in saved {
                        drop(t);
                    }
                    Vec::new()
                } else {
                    saved
                };
                let outputs = process.validate(&node.borrow(), outputs);
                drop(grads);
                drop(saved);
                if let Some(f) = frame {
                    process.frame_node_done(f);
                }
                for (out, edge) in outputs.into_iter().zip(next) {
                    let (Some(out), Some(edge)) = (out, edge) else {
                        continue;
                    };
                    let k = edge.key();
                    let n_slots = slots(&edge);
                    let buffer = buffers.entry(k).or_insert_with(|| vec![None; n_slots]);
                    let slot = &mut buffer[edge.slot()];
                    *slot = Some(match slot.take() {
                        None => out,
                        // `InputBuffer::accumulate`: in place in the first gradient when
                        // nothing else holds it (never in the second, a dense one), else a sum.
                        Some(old) if unique_dense(&old) => {
                            drop(out);
                            old
                        }
                        Some(old) => {
                            let sum = process.add(&old, &out);
                            drop(old);
                            drop(out);
                            sum
                        }
                    });
                    let d = deps.get_mut(&k).expect("a reachable node");
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Ready {
                            seq: edge.seq(),
                            key: k,
                            grad: edge,
                        });
                    }
                }
            }
        }
    }
}

/// `AccumulateGrad`: the first gradient is stolen when nothing else holds it and it has the
/// parameter's layout (else copied); a later one is added in place.
fn accumulate(process: &mut dyn Backward, leaf: &Leaf, grads: Vec<Option<Tensor>>) {
    let Some(Some(new)) = grads.into_iter().next() else {
        return;
    };
    set_gradient(process, leaf, new);
    process.gradient_ready(leaf);
}

fn set_gradient(process: &mut dyn Backward, leaf: &Leaf, new: Tensor) {
    let mut grad = leaf.grad.borrow_mut();
    match grad.as_ref() {
        None => {
            let stealable = new.storage_uses() == 1
                && new.shape == leaf.meta.shape
                && new.strides == leaf.meta.strides;
            *grad = Some(if stealable {
                new
            } else {
                new.tape()
                    .with_role(Role::Gradients, || process.clone_as(&new, &leaf.meta))
            });
        }
        Some(_) => drop(new),
    }
}
