//! transformers' `DynamicCache` as `generate` and training build it: each layer's keys and
//! values concatenated with the new ones at every forward (a new tensor each time, the old one
//! freed); a sliding layer keeps a view of its last `window - 1` positions, which holds the whole
//! concatenation's storage until the next update. With offloading
//! (`cache_implementation="offloaded"`) every full layer's keys and values go to the CPU after its
//! update, and the next full layer's come back ahead of its update on a stream of their own.

use super::process::Process;
use super::tensor::{Meta, Tensor};

/// The stream the offloaded cache brings its layers back on (`prefetch_stream`): its blocks are
/// its own pool's.
pub const PREFETCH_STREAM: u8 = 3;

enum Layer {
    Full {
        keys: Option<Tensor>,
        values: Option<Tensor>,
    },
    Sliding {
        window: u64,
        /// Tokens seen (`cumulative_length`).
        seen: u64,
        /// The window as a tensor on the device, made at the first update.
        window_tensor: Option<Tensor>,
        keys: Option<Tensor>,
        values: Option<Tensor>,
    },
}

/// The cache of every layer.
pub struct Cache {
    layers: Vec<Layer>,
    /// With offloading: each full layer's keys and values while they are on the CPU.
    on_cpu: Option<Vec<Option<[Meta; 2]>>>,
}

impl Cache {
    /// A cache whose layers slide where `windows` says so.
    pub fn new(windows: &[Option<u64>]) -> Cache {
        Cache {
            on_cpu: None,
            layers: windows
                .iter()
                .map(|w| match w {
                    None => Layer::Full {
                        keys: None,
                        values: None,
                    },
                    Some(window) => Layer::Sliding {
                        window: *window,
                        seen: 0,
                        window_tensor: None,
                        keys: None,
                        values: None,
                    },
                })
                .collect(),
        }
    }

    /// The cache with offloading (`DynamicCache(offloading=True)`; its sliding layers stay on the
    /// GPU, `offload_only_non_sliding`).
    pub fn offloaded(windows: &[Option<u64>]) -> Cache {
        Cache {
            on_cpu: Some(vec![None; windows.len()]),
            ..Cache::new(windows)
        }
    }

    /// Tokens cached by layer `layer` (what `get_seq_length` reports).
    pub fn len(&self, layer: usize) -> u64 {
        let on_cpu = (self.on_cpu.as_ref()).and_then(|c| c[layer].as_ref());
        match (&self.layers[layer], on_cpu) {
            (_, Some([keys, _])) => keys.shape[keys.shape.len() - 2],
            (Layer::Full { keys, .. } | Layer::Sliding { keys, .. }, None) => {
                keys.as_ref().map_or(0, |k| k.size(-2))
            }
        }
    }

    /// Tokens seen by the first layer of the kind (`None`: global, `Some(window)`: sliding),
    /// as `get_mask_sizes` reads them.
    pub fn seen(&self, kind: Option<u64>) -> u64 {
        (self.layers.iter().enumerate())
            .find_map(|(i, l)| match (l, kind) {
                (Layer::Full { .. }, None) => Some(self.len(i)),
                (Layer::Sliding { seen, .. }, Some(_)) => Some(*seen),
                _ => None,
            })
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty() || self.len(0) == 0
    }

    /// Layer `layer`'s tensors (keys, values, the sliding window as a tensor) and the tokens it
    /// has seen, as a repeated layer finds them.
    pub(super) fn slots(&self, layer: usize) -> ([Option<&Tensor>; 3], u64) {
        match &self.layers[layer] {
            Layer::Full { keys, values } => ([keys.as_ref(), values.as_ref(), None], 0),
            Layer::Sliding {
                seen,
                window_tensor,
                keys,
                values,
                ..
            } => (
                [keys.as_ref(), values.as_ref(), window_tensor.as_ref()],
                *seen,
            ),
        }
    }

    /// Takes layer `layer`'s tensors out, in the order of [`Cache::slots`].
    pub(super) fn take_slots(&mut self, layer: usize) -> [Option<Tensor>; 3] {
        match &mut self.layers[layer] {
            Layer::Full { keys, values } => [keys.take(), values.take(), None],
            Layer::Sliding {
                window_tensor,
                keys,
                values,
                ..
            } => [keys.take(), values.take(), window_tensor.take()],
        }
    }

    /// Gives layer `layer` its tensors (in the order of [`Cache::slots`]), having seen `added`
    /// more tokens.
    pub(super) fn put_slots(&mut self, layer: usize, slots: [Option<Tensor>; 3], added: u64) {
        let [k, v, w] = slots;
        match &mut self.layers[layer] {
            Layer::Full { keys, values } => {
                debug_assert!(w.is_none() && added == 0, "a full layer has no window");
                (*keys, *values) = (k, v);
            }
            Layer::Sliding {
                seen,
                window_tensor,
                keys,
                values,
                ..
            } => {
                (*keys, *values, *window_tensor) = (k, v, w);
                *seen += added;
            }
        }
    }

    /// `reorder_cache(beam_idx)` of beam search: every layer's keys, then values, gathered into
    /// new tensors (`index_select`), each old one let go once its new one is made.
    pub fn reorder(&mut self, p: &mut Process) {
        p.in_role(crate::replay::program::Role::KvCache, |p| {
            for layer in &mut self.layers {
                let (Layer::Full { keys, values } | Layer::Sliding { keys, values, .. }) = layer;
                for slot in [keys, values] {
                    if let Some(old) = slot.take() {
                        *slot = Some(p.empty(&old.shape, old.elem));
                    }
                }
            }
        })
    }

    /// Lets the cache go as Python frees its list of layers: from the last.
    pub fn drop_from_last(mut self) {
        while let Some(layer) = self.layers.pop() {
            drop(layer);
        }
    }

    /// `update(key_states, value_states, layer)`: the keys and values the attention uses.
    pub fn update(
        &mut self,
        p: &mut Process,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> (Tensor, Tensor) {
        p.in_role(crate::replay::program::Role::KvCache, |p| {
            self.prefetch(p, layer + 1);
            let out = self.update_layer(p, layer, k, v);
            // The layer's keys and values to the CPU (the attention's references to them let go
            // after it).
            if let (Some(on_cpu), Layer::Full { keys, values }) =
                (self.on_cpu.as_mut(), &mut self.layers[layer])
            {
                if let (Some(k), Some(v)) = (keys.take(), values.take()) {
                    on_cpu[layer] = Some([Meta::of(&k), Meta::of(&v)]);
                }
            }
            out
        })
    }

    /// `prefetch(from)`: the first full layer at or after `from` (else from the first) brought
    /// back from the CPU on the prefetch stream, keys then values, if it is there.
    fn prefetch(&mut self, p: &mut Process, from: usize) {
        let Some(on_cpu) = self.on_cpu.as_mut() else {
            return;
        };
        let full = |i: &usize| matches!(self.layers[*i], Layer::Full { .. });
        let n = self.layers.len();
        let Some(next) = (from.min(n)..n).chain(0..n).find(full) else {
            return;
        };
        if let (Some([mk, mv]), Layer::Full { keys, values }) =
            (on_cpu[next].take(), &mut self.layers[next])
        {
            p.tape.on_stream(PREFETCH_STREAM, || {
                *keys = Some(p.empty_like(&mk));
                *values = Some(p.empty_like(&mv));
            });
        }
    }

    fn update_layer(
        &mut self,
        p: &mut Process,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> (Tensor, Tensor) {
        // The first update starts from empty tensors of the keys' type: the values are cast
        // to it by the concatenation.
        let key_elem = k.elem;
        let cat = |p: &mut Process, old: &Option<Tensor>, new: &Tensor| match old {
            Some(o) => p.cat(&[o, new], -2),
            None => {
                let empty = p.empty(&[0], key_elem);
                p.cat(&[&empty, new], -2)
            }
        };
        match &mut self.layers[layer] {
            Layer::Full { keys, values } => {
                let nk = cat(p, keys, k);
                *keys = Some(nk.clone());
                let nv = cat(p, values, v);
                *values = Some(nv.clone());
                (nk, nv)
            }
            Layer::Sliding {
                window,
                seen,
                window_tensor,
                keys,
                values,
            } => {
                if window_tensor.is_none() {
                    *window_tensor = Some(p.empty(&[1], crate::dtype::Dtype::Int64));
                }
                *seen += k.size(-2);
                let fk = cat(p, keys, k);
                let fv = cat(p, values, v);
                let keep = |p: &mut Process, full: &Tensor| {
                    let s = full.size(-2);
                    p.slice(full, -2, s.saturating_sub(*window - 1), s)
                };
                *keys = Some(keep(p, &fk));
                *values = Some(keep(p, &fv));
                (fk, fv)
            }
        }
    }
}
