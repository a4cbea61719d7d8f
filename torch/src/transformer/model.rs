//! The model's tensors on the GPU: every weight created there directly in the run's dtype, one
//! allocation each, in `ModelShape::tensors()` order (no CPU-side build, no temporary copy), and
//! the float32 LoRA adapters.

use super::in_place;
use iteragpu_lab::budget::{adapter_names, LinearTarget, ModelShape, WeightTensor};
use std::collections::HashMap;
use tch::{Device, Kind, TchError, Tensor};

/// Standard deviation of the random matrices (Llama's `initializer_range`).
const INIT_STD: f64 = 0.02;

/// A tensor trained by the optimizer, under the name `ModelShape::tensors()` (or the adapter)
/// gives it. It shares its storage and its gradient with the model's tensor.
pub struct Parameter {
    pub name: String,
    pub tensor: Tensor,
}

/// A LoRA adapter: `A [rank, in]` (small random) and `B [out, rank]` (zeros), both float32.
pub struct Adapter {
    pub a: Tensor,
    pub b: Tensor,
    /// alpha / rank, with alpha = 2 × rank.
    pub scale: f64,
}

/// A linear layer without or with a bias, and its adapter in mode lora.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub adapter: Option<Adapter>,
}

/// One decoder layer's weights.
pub struct Layer {
    pub input_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub post_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Layer {
    fn linear_mut(&mut self, target: LinearTarget) -> &mut Linear {
        match target {
            LinearTarget::Q => &mut self.q,
            LinearTarget::K => &mut self.k,
            LinearTarget::V => &mut self.v,
            LinearTarget::O => &mut self.o,
            LinearTarget::Gate => &mut self.gate,
            LinearTarget::Up => &mut self.up,
            LinearTarget::Down => &mut self.down,
        }
    }
}

/// The whole model on the GPU.
pub struct Model {
    pub shape: ModelShape,
    pub kind: Kind,
    pub device: Device,
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    /// `None` when tied: the embedding's matrix serves as the LM head.
    lm_head: Option<Tensor>,
    /// Every weight in build order, sharing storage with the fields above.
    weights: Vec<Parameter>,
}

fn internal(message: String) -> TchError {
    TchError::Torch(format!("internal error: {message}"))
}

fn dim(n: u64) -> i64 {
    i64::try_from(n).expect("a validated run's sizes fit in i64")
}

/// The dimensions of a weight tensor, checked against its element count.
fn dims_of(shape: &ModelShape, t: &WeightTensor) -> Result<Vec<i64>, TchError> {
    let last = t.name.rsplit('.').next().unwrap_or_default();
    let dims = match t.linear {
        Some(target) => {
            let (out, inp) = shape.linear_features(target);
            vec![out, inp]
        }
        None if t.name == "embed_tokens" || t.name == "lm_head" => vec![shape.vocab, shape.hidden],
        None if last == "bias" => vec![t.elements],
        None if last.ends_with("layernorm") || t.name == "norm" => vec![shape.hidden],
        None => {
            return Err(internal(format!(
                "no dimensions known for weight {}",
                t.name
            )))
        }
    };
    if dims.iter().product::<u64>() != t.elements {
        return Err(internal(format!(
            "weight {}: dimensions {dims:?} do not hold its {} elements",
            t.name, t.elements
        )));
    }
    Ok(dims.into_iter().map(dim).collect())
}

/// One weight, allocated once on the GPU and initialised in place: norms to ones, biases to
/// zeros, matrices and embeddings to N(0, 0.02²).
fn new_weight(
    t: &WeightTensor,
    dims: &[i64],
    kind: Kind,
    device: Device,
) -> Result<Tensor, TchError> {
    let mut w = Tensor::f_empty(dims, (kind, device))?;
    let last = t.name.rsplit('.').next().unwrap_or_default();
    if last.ends_with("layernorm") || t.name == "norm" {
        in_place(w.f_fill_(1.0))?;
    } else if last == "bias" {
        in_place(w.f_zero_())?;
    } else {
        in_place(w.f_normal_(0.0, INIT_STD))?;
    }
    Ok(w)
}

/// The built weight `name`, taken out of `by_name`.
fn take(by_name: &mut HashMap<String, Tensor>, name: &str) -> Result<Tensor, TchError> {
    by_name
        .remove(name)
        .ok_or_else(|| internal(format!("weight {name} was not built")))
}

/// The linear layer `name` (its weight, and its bias `name.bias` when `biased`).
fn linear(
    by_name: &mut HashMap<String, Tensor>,
    name: &str,
    biased: bool,
) -> Result<Linear, TchError> {
    Ok(Linear {
        weight: take(by_name, name)?,
        bias: if biased {
            Some(take(by_name, &format!("{name}.bias"))?)
        } else {
            None
        },
        adapter: None,
    })
}

impl Model {
    /// Creates every weight of `shape` on `device` in `kind`, in `ModelShape::tensors()` order.
    pub fn build(shape: &ModelShape, kind: Kind, device: Device) -> Result<Model, TchError> {
        let _no_grad = tch::no_grad_guard();
        let mut weights = Vec::new();
        let mut by_name = HashMap::new();
        for t in shape.tensors() {
            let w = new_weight(&t, &dims_of(shape, &t)?, kind, device)?;
            by_name.insert(t.name.clone(), w.shallow_clone());
            weights.push(Parameter {
                name: t.name,
                tensor: w,
            });
        }
        let by = &mut by_name;
        let embed = take(by, "embed_tokens")?;
        let mut layers = Vec::new();
        for l in 0..shape.layers {
            let at = |part: &str| format!("layers.{l}.{part}");
            let biased = shape.attention_bias;
            layers.push(Layer {
                input_norm: take(by, &at("input_layernorm"))?,
                q: linear(by, &at("q_proj"), biased)?,
                k: linear(by, &at("k_proj"), biased)?,
                v: linear(by, &at("v_proj"), biased)?,
                o: linear(by, &at("o_proj"), false)?,
                post_norm: take(by, &at("post_attention_layernorm"))?,
                gate: linear(by, &at("gate_proj"), false)?,
                up: linear(by, &at("up_proj"), false)?,
                down: linear(by, &at("down_proj"), false)?,
            });
        }
        let norm = take(by, "norm")?;
        let lm_head = if shape.tied_embeddings {
            None
        } else {
            Some(take(by, "lm_head")?)
        };
        if let Some(left) = by_name.keys().next() {
            return Err(internal(format!("weight {left} is not part of the model")));
        }
        Ok(Model {
            shape: shape.clone(),
            kind,
            device,
            embed,
            layers,
            norm,
            lm_head,
            weights,
        })
    }

    /// The LM head's matrix `[vocab, hidden]` (the embedding's when tied).
    pub fn lm_head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Makes every weight trainable and returns them in build order (full training).
    /// Every weight in build order, with its name.
    pub fn weights(&self) -> &[Parameter] {
        &self.weights
    }

    pub fn train_all(&self) -> Result<Vec<Parameter>, TchError> {
        self.weights
            .iter()
            .map(|p| {
                in_place(p.tensor.f_set_requires_grad(true))?;
                Ok(Parameter {
                    name: p.name.clone(),
                    tensor: p.tensor.shallow_clone(),
                })
            })
            .collect()
    }

    /// Adds a trainable float32 adapter of `rank` to each layer's `targets` (in module order), A
    /// then B for each, and returns them in that order; the weights stay frozen.
    pub fn add_adapters(
        &mut self,
        rank: u64,
        targets: &[LinearTarget],
    ) -> Result<Vec<Parameter>, TchError> {
        let options = (Kind::Float, self.device);
        let mut trainable = Vec::new();
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for &target in targets {
                let (out, inp) = self.shape.linear_features(target);
                let adapter = {
                    let _no_grad = tch::no_grad_guard();
                    // A as PEFT initialises it (Kaiming-uniform bound 1/√in), B zeros: the adapted
                    // layer starts equal to the frozen one.
                    let bound = 1.0 / (inp as f64).sqrt();
                    let mut a = Tensor::f_empty([dim(rank), dim(inp)], options)?;
                    in_place(a.f_uniform_(-bound, bound))?;
                    let b = Tensor::f_zeros([dim(out), dim(rank)], options)?;
                    Adapter {
                        a: a.f_set_requires_grad(true)?,
                        b: b.f_set_requires_grad(true)?,
                        scale: 2.0,
                    }
                };
                for (name, t) in adapter_names(l as u64, target)
                    .into_iter()
                    .zip([&adapter.a, &adapter.b])
                {
                    trainable.push(Parameter {
                        name,
                        tensor: t.shallow_clone(),
                    });
                }
                layer.linear_mut(target).adapter = Some(adapter);
            }
        }
        Ok(trainable)
    }
}
