//! transformers' `DynamicCache` as `generate` and training build it: each layer's keys and
//! values concatenated with the new ones at every forward (a new tensor each time, the old one
//! freed); a sliding layer keeps a view of its last `window - 1` positions, which holds the whole
//! concatenation's storage until the next update.

use super::ops::Process;
use super::tensor::Tensor;

enum Layer {
    Full {
        keys: Option<Tensor>,
        values: Option<Tensor>,
    },
    Sliding {
        window: u64,
        keys: Option<Tensor>,
        values: Option<Tensor>,
    },
}

/// The cache of every layer.
pub struct Cache {
    layers: Vec<Layer>,
}

impl Cache {
    /// A cache whose layers slide where `windows` says so.
    pub fn new(windows: &[Option<u64>]) -> Cache {
        Cache {
            layers: windows
                .iter()
                .map(|w| match w {
                    None => Layer::Full {
                        keys: None,
                        values: None,
                    },
                    Some(window) => Layer::Sliding {
                        window: *window,
                        keys: None,
                        values: None,
                    },
                })
                .collect(),
        }
    }

    /// Tokens cached by layer `layer` (what `get_seq_length` reports).
    pub fn len(&self, layer: usize) -> u64 {
        match &self.layers[layer] {
            Layer::Full { keys, .. } | Layer::Sliding { keys, .. } => {
                keys.as_ref().map_or(0, |k| k.size(-2))
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty() || self.len(0) == 0
    }

    /// `update(key_states, value_states, layer)`: the keys and values the attention uses.
    pub fn update(
        &mut self,
        p: &mut Process,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> (Tensor, Tensor) {
        let cat = |p: &mut Process, old: &Option<Tensor>, new: &Tensor| match old {
            Some(o) => p.cat(&[o, new], -2),
            None => p.clone_contiguous(new),
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
                keys,
                values,
            } => {
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
