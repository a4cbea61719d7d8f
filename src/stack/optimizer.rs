//! `torch.optim.AdamW` as PyTorch 2.11 ships it, for memory: the states created at the first
//! step (two moments per parameter, and with `fused` a step counter on the device), and each
//! implementation's temporaries (foreach: the square roots of every second moment at once;
//! for-loop: one parameter's at a time; fused: none).

use super::ops::Process;
use super::tensor::{Elem, Role, Tensor};
use serde::{Deserialize, Serialize};

/// Which implementation of the step runs.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum OptimizerImpl {
    /// `foreach` (PyTorch's default on CUDA): `_foreach_sqrt` of all second moments of a
    /// (device, dtype) group, alive until the update.
    Foreach,
    /// `fused=True`: one kernel, no intermediate; the step counters on the device.
    Fused,
    /// `foreach=False`: one parameter at a time.
    ForLoop,
}

impl OptimizerImpl {
    pub const ALL: &'static [OptimizerImpl] = <OptimizerImpl as strum::VariantArray>::VARIANTS;
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// AdamW's state for the trained parameters.
pub struct AdamW {
    implementation: OptimizerImpl,
    /// Per parameter: (step counter on the device, first moment, second moment), made at the
    /// first step.
    states: Vec<Vec<Tensor>>,
}

impl AdamW {
    pub fn new(implementation: OptimizerImpl) -> AdamW {
        AdamW {
            implementation,
            states: Vec::new(),
        }
    }

    /// `step()` over `params` (in the parameter group's order), whose gradients exist.
    pub fn step(&mut self, p: &mut Process, params: &[Tensor]) {
        if self.states.is_empty() {
            let fused = self.implementation == OptimizerImpl::Fused;
            self.states = p.in_role(Role::OptimizerStates, |p| {
                params
                    .iter()
                    .map(|w| {
                        let mut s = Vec::new();
                        if fused {
                            s.push(p.empty(&[], Elem::F32));
                        }
                        s.push(p.empty_like(&super::tensor::Meta::of(w)));
                        s.push(p.empty_like(&super::tensor::Meta::of(w)));
                        s
                    })
                    .collect()
            });
        }
        p.in_role(Role::OptimizerStep, |p| match self.implementation {
            OptimizerImpl::Fused => {}
            OptimizerImpl::Foreach => {
                let sqrt: Vec<Tensor> = params.iter().map(|w| p.empty(&w.shape, w.elem)).collect();
                // A list goes from its last item to its first.
                for t in sqrt.into_iter().rev() {
                    drop(t);
                }
            }
            OptimizerImpl::ForLoop => {
                for w in params {
                    let sqrt = p.empty(&w.shape, w.elem);
                    let denom = p.empty(&w.shape, w.elem);
                    drop(sqrt);
                    drop(denom);
                }
            }
        });
    }
}
