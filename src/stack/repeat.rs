//! Decoder layers written again instead of run again. In one forward of `generate` (no autograd,
//! a cache), layers alike (the same configuration, weights of the same shapes and types, no
//! adapter and no quantized weight) make the same allocations and frees: each layer's own
//! allocations numbered from where it starts, and the frees of what it was given (its cache's
//! old keys and values). Once two layers of a kind in a row have written the same record (their
//! events, and the shapes of the tensors they return and leave in the cache), the next layers of
//! that kind in the forward are written from the record without running them: one event on the
//! tape that stands for the record's events numbered for the layer (`WrittenLayer`), and the same
//! tensors out. A record is taken only when every
//! allocation the layer makes is freed by it or held by what it returns, so that what is
//! written stays what running the layer would write (`repeated_layers_write_what_running_them_writes`
//! compares whole programs).

use super::cache::Cache;
use super::tape::{Storage, Tape};
use super::tensor::{Dims, Tensor};
use crate::allocator::size::{round_size, SMALL_SIZE};
use crate::dtype::Dtype;
use crate::model::{Layer, Model};
use crate::replay::program::{Event, Role, Step, WrittenLayer};
use rustc_hash::FxHashMap;
use std::rc::Rc;

/// What makes layers alike: the layer's configuration, and its tensors (name within the layer,
/// shape, type) in name order.
type Signature = (Layer, Vec<(String, Dims, Dtype)>);

/// Which layers are alike (per layer, its kind, or `None` for a layer never repeated), and
/// the shapes of the records layers were written again from, numbered.
#[derive(Debug, Clone)]
pub struct LayerKinds {
    kinds: Vec<Option<usize>>,
    shapes: FxHashMap<Vec<Shaped>, u32>,
}

/// A step of a record as the small pool sees it: the sizes of large-pool allocations left out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Shaped {
    Small { bytes: u64, role: Role },
    Large,
    FreeLocal(u32),
    FreeSlot { slot: usize, small: bool },
}

impl LayerKinds {
    /// The layers of `model` by kind, from the model's tensors by name and the names of the
    /// linear layers given adapters or quantized weights.
    pub fn of<'a>(
        model: &Model,
        tensors: impl Iterator<Item = (&'a String, &'a Tensor)>,
        altered: impl Iterator<Item = &'a String>,
    ) -> LayerKinds {
        let prefix = [model.text_prefix(), "layers."].concat();
        let layer_of = |name: &str| -> Option<(usize, String)> {
            let rest = name.strip_prefix(&prefix)?;
            let (index, suffix) = rest.split_once('.')?;
            Some((index.parse().ok()?, suffix.to_string()))
        };
        let n = model.layers.len();
        let mut by_layer: Vec<Vec<(String, Dims, Dtype)>> = vec![Vec::new(); n];
        for (name, t) in tensors {
            if let Some((i, suffix)) = layer_of(name).filter(|(i, _)| *i < n) {
                by_layer[i].push((suffix, t.shape.clone(), t.elem));
            }
        }
        let mut changed = vec![false; n];
        for name in altered {
            if let Some((i, _)) = layer_of(&[name.as_str(), "."].concat()).filter(|(i, _)| *i < n) {
                changed[i] = true;
            }
        }
        let mut signatures: Vec<Signature> = Vec::new();
        let kinds = (0..n)
            .map(|i| {
                if changed[i] {
                    return None;
                }
                by_layer[i].sort_by(|a, b| a.0.cmp(&b.0));
                let signature = (model.layers[i], std::mem::take(&mut by_layer[i]));
                Some(
                    signatures
                        .iter()
                        .position(|s| *s == signature)
                        .unwrap_or_else(|| {
                            signatures.push(signature);
                            signatures.len() - 1
                        }),
                )
            })
            .collect();
        LayerKinds {
            kinds,
            shapes: FxHashMap::default(),
        }
    }

    /// Layer `layer`'s kind (`None`: never written again).
    pub fn of_layer(&self, layer: usize) -> Option<usize> {
        self.kinds[layer]
    }

    /// The number of `record`'s shape (records of one shape make the same choices in the small
    /// pool).
    fn shape_of(&mut self, record: &Record) -> u32 {
        let small = |bytes: u64| round_size(bytes) <= SMALL_SIZE;
        let shape: Vec<Shaped> = record
            .steps
            .iter()
            .map(|step| match *step {
                Step::Alloc { bytes, role } if small(bytes) => Shaped::Small { bytes, role },
                Step::Alloc { .. } => Shaped::Large,
                Step::FreeLocal(n) => Shaped::FreeLocal(n),
                Step::FreeSlot(slot) => Shaped::FreeSlot {
                    slot,
                    small: record.slot_bytes[slot].is_some_and(small),
                },
            })
            .collect();
        let next = u32::try_from(self.shapes.len()).expect("fewer than 2^32 shapes");
        *self.shapes.entry(shape).or_insert(next)
    }
}

/// Where a tensor out of a layer views its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// The layer's allocation of this number (counted from its first), of these bytes.
    Local(u32, u64),
    /// A tensor the cache held for the layer before it ran (`Cache::slots` order).
    Slot(usize),
    /// A storage of no bytes, made by the layer.
    Empty,
}

/// A tensor's view, without its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
struct View {
    shape: Dims,
    strides: Dims,
    elem: Dtype,
    is_view: bool,
}

impl View {
    /// Whether `t` is viewed so.
    fn fits(&self, t: &Tensor) -> bool {
        self.shape == t.shape
            && self.strides == t.strides
            && self.elem == t.elem
            && self.is_view == t.is_view
    }

    fn of(t: &Tensor) -> View {
        View {
            shape: t.shape.clone(),
            strides: t.strides.clone(),
            elem: t.elem,
            is_view: t.is_view,
        }
    }
}

/// What running one layer wrote and left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The layer's input and its cache as the layer found them.
    hidden_in: View,
    slots_in: [Option<View>; 3],
    /// The bytes of the storages of those.
    slot_bytes: [Option<u64>; 3],
    seen_in: u64,
    steps: std::sync::Arc<[Step]>,
    /// How many of the steps are allocations.
    allocations: u32,
    /// The tensor it returned and the tensors it left in the cache.
    hidden_out: (Source, View),
    slots_out: [Option<(Source, View)>; 3],
    seen_added: u64,
    /// Whether its steps free each slot's storage.
    frees_slots: [bool; 3],
}

impl Record {
    fn keeps_slot(&self, slot: usize) -> bool {
        let kept =
            |o: &Option<(Source, View)>| matches!(o, Some((Source::Slot(s), _)) if *s == slot);
        self.slots_out.iter().any(kept) || matches!(self.hidden_out.0, Source::Slot(s) if s == slot)
    }
}

/// Where a kind of layer stands in one forward.
enum KindState {
    /// The last layer of the kind ran and wrote this record.
    Recorded(Record),
    /// Two layers in a row wrote this record (of this shape): the next ones are written from it.
    Repeated(Record, u32),
    /// A layer of the kind cannot be recorded, or its record did not fit a layer.
    Unrepeatable,
}

/// The records of one forward.
#[derive(Default)]
pub struct ForwardRecords(FxHashMap<usize, KindState>);

impl ForwardRecords {
    /// Layer `layer` of `kind` written again from the record of the layers before it, if two in
    /// a row wrote it and it fits this one's input and cache (if not, no layer of the kind is
    /// written again in this forward).
    pub fn write_again(
        &mut self,
        kind: usize,
        hidden: &Tensor,
        cache: &mut Cache,
        layer: usize,
    ) -> Option<Tensor> {
        let Some(KindState::Repeated(record, shape)) = self.0.get(&kind) else {
            return None;
        };
        let out = write_again(record, *shape, hidden, cache, layer);
        if out.is_none() {
            self.0.insert(kind, KindState::Unrepeatable);
        }
        out
    }

    /// Whether a layer of `kind` that runs is to be recorded.
    pub fn records(&self, kind: usize) -> bool {
        !matches!(self.0.get(&kind), Some(KindState::Unrepeatable))
    }

    /// What a layer of `kind` recorded (`None`: nothing that can be written again); the second
    /// record in a row equal to the first makes the next layers of the kind written again.
    pub fn note(&mut self, kind: usize, record: Option<Record>, kinds: &mut LayerKinds) {
        let state = match (record, self.0.remove(&kind)) {
            (Some(r), Some(KindState::Recorded(last))) if r == last => {
                let shape = kinds.shape_of(&r);
                KindState::Repeated(r, shape)
            }
            (Some(r), _) => KindState::Recorded(r),
            (None, _) => KindState::Unrepeatable,
        };
        self.0.insert(kind, state);
    }
}

/// What a layer is given, noted before it runs, and the events it writes, kept as it runs.
pub struct Capture {
    tape: Tape,
    first: u32,
    hidden_in: View,
    slots_in: [Option<View>; 3],
    slot_allocs: [Option<u32>; 3],
    slot_bytes: [Option<u64>; 3],
    seen_in: u64,
}

impl Capture {
    /// Starts keeping what layer `layer` writes, given `hidden` and `cache`.
    pub fn begin(tape: &Tape, hidden: &Tensor, cache: &Cache, layer: usize) -> Capture {
        let (slots, seen_in) = cache.slots(layer);
        let capture = Capture {
            tape: tape.clone(),
            first: tape.next_allocation(),
            hidden_in: View::of(hidden),
            slots_in: slots.map(|s| s.map(View::of)),
            slot_allocs: slots.map(|s| s.and_then(|t| t.storage.alloc())),
            slot_bytes: slots.map(|s| s.map(|t| t.storage.bytes)),
            seen_in,
        };
        tape.start_capture();
        capture
    }

    /// The record of the layer that returned `out` and left `cache`, when what it wrote can be
    /// written again.
    pub fn end(self, out: &Tensor, cache: &Cache, layer: usize) -> Option<Record> {
        let events = self.tape.end_capture();
        let (slots_after, seen_after) = cache.slots(layer);
        let (first, slot_allocs) = (self.first, self.slot_allocs);
        let mut steps = Vec::with_capacity(events.len());
        let mut freed = Vec::new();
        for e in events {
            steps.push(match e {
                // Written again on the default stream only.
                Event::Alloc {
                    bytes,
                    role,
                    stream: 0,
                } => Step::Alloc { bytes, role },
                Event::Alloc { .. } => return None,
                Event::Free { alloc } if alloc >= first => {
                    freed.push(alloc - first);
                    Step::FreeLocal(alloc - first)
                }
                Event::Free { alloc } => {
                    Step::FreeSlot(slot_allocs.iter().position(|&a| a == Some(alloc))?)
                }
                Event::Written { .. } => return None,
            });
        }
        let source = |t: &Tensor| -> Option<Source> {
            if t.grad_fn.is_some() {
                return None;
            }
            match t.storage.alloc() {
                Some(a) if a >= first => Some(Source::Local(a - first, t.storage.bytes)),
                Some(a) => Some(Source::Slot(
                    slot_allocs.iter().position(|&s| s == Some(a))?,
                )),
                None => Some(Source::Empty),
            }
        };
        let hidden_out = (source(out)?, View::of(out));
        let mut slots_out: [Option<(Source, View)>; 3] = [None, None, None];
        for (o, s) in slots_out.iter_mut().zip(slots_after) {
            if let Some(t) = s {
                *o = Some((source(t)?, View::of(t)));
            }
        }
        let allocations = u32::try_from(
            steps
                .iter()
                .filter(|s| matches!(s, Step::Alloc { .. }))
                .count(),
        )
        .ok()?;
        let record = Record {
            hidden_in: self.hidden_in,
            slots_in: self.slots_in,
            slot_bytes: self.slot_bytes,
            seen_in: self.seen_in,
            steps: steps.as_slice().into(),
            allocations,
            hidden_out,
            slots_out,
            seen_added: seen_after - self.seen_in,
            frees_slots: [0, 1, 2].map(|slot| steps.contains(&Step::FreeSlot(slot))),
        };
        // Every allocation is freed by the layer or held by what it returns.
        let held: Vec<u32> = std::iter::once(&record.hidden_out)
            .chain(record.slots_out.iter().flatten())
            .filter_map(|(s, _)| match s {
                Source::Local(n, _) => Some(*n),
                _ => None,
            })
            .collect();
        (0..allocations)
            .all(|n| freed.contains(&n) || held.contains(&n))
            .then_some(record)
    }
}

/// Writes layer `layer` from `record`, or `None` (nothing written) where its input or cache do
/// not match the record's.
fn write_again(
    record: &Record,
    shape: u32,
    hidden: &Tensor,
    cache: &mut Cache,
    layer: usize,
) -> Option<Tensor> {
    let (slots, seen) = cache.slots(layer);
    let fits = |v: &Option<View>, t: Option<&Tensor>| match (v, t) {
        (Some(v), Some(t)) => v.fits(t),
        (None, None) => true,
        _ => false,
    };
    if !record.hidden_in.fits(hidden)
        || seen != record.seen_in
        || !record.slots_in.iter().zip(slots).all(|(v, t)| fits(v, t))
    {
        return None;
    }
    // What the layer frees of its cache must be held by the cache alone, and what it lets go
    // otherwise must stay held elsewhere.
    for (i, s) in slots.iter().enumerate() {
        let Some(t) = s else { continue };
        let alone = Rc::strong_count(&t.storage) == 1 && t.storage.alloc().is_some();
        let elsewhere = Rc::strong_count(&t.storage) > 1 || t.storage.alloc().is_none();
        let fits = if record.frees_slots[i] {
            alone
        } else {
            record.keeps_slot(i) || elsewhere
        };
        if !fits {
            return None;
        }
    }
    let tape = hidden.tape().clone();
    let taken = cache.take_slots(layer);
    let first = tape.next_allocation();
    let slot_allocs = taken
        .each_ref()
        .map(|t| t.as_ref().and_then(|t| t.storage.alloc()));
    tape.write_layer(
        WrittenLayer {
            steps: record.steps.clone(),
            shape,
            first,
            slots: slot_allocs,
        },
        record.allocations,
    );
    // The storages of the layer's allocations that outlive it, each made once.
    let mut storages: Vec<(u32, Rc<Storage>)> = Vec::new();
    let mut made = |(source, view): &(Source, View), taken: &[Option<Tensor>; 3]| -> Tensor {
        let storage = match source {
            Source::Local(n, bytes) => match storages.iter().find(|(m, _)| m == n) {
                Some((_, s)) => s.clone(),
                None => {
                    let s = tape.written_storage(Some(first + n), *bytes);
                    storages.push((*n, s.clone()));
                    s
                }
            },
            Source::Slot(i) => taken[*i]
                .as_ref()
                .expect("a slot kept by the record")
                .storage
                .clone(),
            Source::Empty => tape.written_storage(None, 0),
        };
        Tensor {
            storage,
            shape: view.shape.clone(),
            strides: view.strides.clone(),
            elem: view.elem,
            grad_fn: None,
            is_view: view.is_view,
        }
    };
    let out = made(&record.hidden_out, &taken);
    let mut slots_out: [Option<Tensor>; 3] = [None, None, None];
    for (slot, o) in slots_out.iter_mut().zip(&record.slots_out) {
        if let Some(o) = o {
            *slot = Some(made(o, &taken));
        }
    }
    // The slots' storages the record freed are freed on the tape already.
    for (i, t) in taken.iter().enumerate() {
        if record.frees_slots[i] {
            if let Some(t) = t {
                debug_assert_eq!(
                    Rc::strong_count(&t.storage),
                    1,
                    "a freed slot's storage is held by the cache alone"
                );
                t.storage.forget();
            }
        }
    }
    drop(taken);
    cache.put_slots(layer, slots_out, record.seen_added);
    tape.count_written_again();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::run::{program, program_running_every_layer, Run};
    use crate::budget::proof::Report;
    use crate::replay::Event;

    /// Every inference run of the six recorded proofs (Llama, Mistral, Mixtral, Qwen3 and its
    /// mixture, DeepSeek-V2 and V3's latent attention, Gemma 2 past its window, Gemma 3 with its
    /// vision tower under both mask orders, expandable segments): the program with alike layers
    /// written again is the program with every layer run, event for event and stage for stage.
    #[test]
    fn repeated_layers_write_what_running_them_writes() {
        let reports = Report::all_recorded();
        let (mut compared, mut written_again) = (0, 0);
        for rec in reports.iter().flat_map(|r| &r.records) {
            // Ranks of several (trainings, one refused) are not generated.
            if rec.spec.get("distributed").is_some() {
                continue;
            }
            let run = Run::from_spec(&rec.spec).expect("a recorded spec");
            if run.work.trains() {
                continue;
            }
            let (written, ran) = (program(&run), program_running_every_layer(&run));
            assert_eq!(written.stages(), ran.stages(), "{}: stages", rec.name);
            assert_eq!(ran.layers_written_again(), 0);
            written_again += written.layers_written_again();
            let (w, r): (Vec<Event>, Vec<Event>) =
                (written.events().collect(), ran.events().collect());
            assert_eq!(w.len(), r.len(), "{}: events", rec.name);
            if let Some(i) = (0..w.len()).find(|&i| w[i] != r[i]) {
                panic!("{}: event {i} written {:?}, run {:?}", rec.name, w[i], r[i]);
            }
            compared += 1;
        }
        assert!(compared >= 20, "{compared} inference runs compared");
        // Most layers of a decode step are written again (of the 21 runs' 4 700 decode steps).
        println!("{compared} runs, {written_again} layers written again");
        assert!(
            written_again > 100_000,
            "{written_again} layers written again"
        );
    }
}
