//! AdamW with mixed precision, written with in-place operations: per parameter an fp32 master
//! copy (16-bit parameters only: a float32 parameter is its own master, as in
//! `torch.optim.AdamW`), fp32 `exp_avg` and `exp_avg_sq`; each step reads the gradient in fp32,
//! updates the moments and the master, copies the master into the parameter, and at the end sets
//! every gradient to None (freed).

use super::in_place;
use super::model::Parameter;
use crate::ffi;
use iteragpu_lab::budget::optimizer_state_names;
use tch::{Kind, TchError, Tensor};

const LEARNING_RATE: f64 = 1e-4;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;
const WEIGHT_DECAY: f64 = 0.01;

/// One parameter's optimizer state.
struct State {
    parameter: Parameter,
    /// The fp32 weights the step updates (`None`: the parameter is float32 and updated itself).
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

pub struct AdamW {
    states: Vec<State>,
    steps: i32,
}

impl AdamW {
    /// Creates the states of `parameters` now (before the first step, so that their bytes can be
    /// read alone), in order: for each parameter its master copy, `exp_avg`, `exp_avg_sq`.
    pub fn new(parameters: Vec<Parameter>) -> Result<AdamW, TchError> {
        let _no_grad = tch::no_grad_guard();
        let mut states = Vec::new();
        for parameter in parameters {
            let p = &parameter.tensor;
            let master = match p.kind() {
                Kind::Float => None,
                _ => Some(p.f_to_kind(Kind::Float)?),
            };
            let options = (Kind::Float, p.device());
            let exp_avg = Tensor::f_zeros(p.size(), options)?;
            let exp_avg_sq = Tensor::f_zeros(p.size(), options)?;
            states.push(State {
                parameter,
                master,
                exp_avg,
                exp_avg_sq,
            });
        }
        Ok(AdamW { states, steps: 0 })
    }

    /// Every state tensor with its name, in the order they were made.
    pub fn tensors(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::new();
        for s in &self.states {
            let names = optimizer_state_names(&s.parameter.name, s.master.is_some());
            let tensors = s.master.iter().chain([&s.exp_avg, &s.exp_avg_sq]);
            out.extend(names.into_iter().zip(tensors));
        }
        out
    }

    /// One step over every parameter, then every gradient set to None. A parameter without a
    /// gradient is an error (the backward pass missed it).
    pub fn step(&mut self) -> Result<(), TchError> {
        let _no_grad = tch::no_grad_guard();
        self.steps += 1;
        let bias_correction1 = 1.0 - BETA1.powi(self.steps);
        let bias_correction2 = 1.0 - BETA2.powi(self.steps);
        for s in &mut self.states {
            let grad = s.parameter.tensor.f_grad()?;
            if !grad.defined() {
                return Err(TchError::Torch(format!(
                    "internal error: parameter {} received no gradient",
                    s.parameter.name
                )));
            }
            // A float32 copy of a 16-bit gradient; the gradient itself when it is float32.
            let mut g = grad.f_to_kind(Kind::Float)?;
            drop(grad);
            in_place(s.exp_avg.f_lerp_(&g, 1.0 - BETA1))?;
            in_place(s.exp_avg_sq.f_mul_scalar_(BETA2))?;
            // tch's addcmul_ takes no `value`: g is scaled in place by √(1 − β2) so that g·g
            // carries the factor (1 − β2), with no temporary.
            in_place(g.f_mul_scalar_((1.0 - BETA2).sqrt()))?;
            in_place(s.exp_avg_sq.f_addcmul_(&g, &g))?;
            drop(g);
            // denom = √exp_avg_sq / √bias_correction2 + eps: the square root allocates, the rest
            // is in place.
            let mut denom = s.exp_avg_sq.f_sqrt()?;
            in_place(denom.f_div_scalar_(bias_correction2.sqrt()))?;
            in_place(denom.f_add_scalar_(EPS))?;
            // tch's addcdiv_ takes no `value` either: the step size −lr / bias_correction1 is
            // folded into denom (its reciprocal scales the divisor).
            in_place(denom.f_mul_scalar_(-bias_correction1 / LEARNING_RATE))?;
            let weights = s.master.as_mut().unwrap_or(&mut s.parameter.tensor);
            in_place(weights.f_mul_scalar_(1.0 - LEARNING_RATE * WEIGHT_DECAY))?;
            in_place(weights.f_addcdiv_(&s.exp_avg, &denom))?;
            drop(denom);
            if let Some(master) = &s.master {
                s.parameter.tensor.f_copy_(master)?;
            }
        }
        for s in &self.states {
            ffi::clear_grad(&s.parameter.tensor).map_err(TchError::Torch)?;
        }
        Ok(())
    }
}
