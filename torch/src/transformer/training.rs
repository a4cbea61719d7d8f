//! Training: full (every weight trained) or LoRA (frozen weights, float32 adapters), with AdamW,
//! optionally with full-layer recomputation. One whole iteration first (`first_step`), then a
//! second one measured as `forward`, `backward` and `optimizer_step`.
//!
//! Recomputation is done by hand, as `torch.utils.checkpoint` (absent from libtorch's C++ API)
//! does per layer: the forward pass runs the layers without autograd and keeps only each layer's
//! input; the head and the loss run with autograd from a leaf input. The backward pass then
//! recomputes each layer from the last to the first, with autograd, from its saved input made a
//! leaf, and sends the incoming gradient through it (`y.backward(gradient)`, accumulating the
//! parameters' gradients); that input's gradient goes to the layer below. The embedding's
//! gradient comes last.

use super::adamw::AdamW;
use super::decoder::{Decoder, Keys};
use super::model::Model;
use super::stages::Stages;
use crate::ffi;
use iteragpu_lab::budget::bench::stage;
use iteragpu_lab::budget::{BenchMode, BenchRun};
use iteragpu_lab::measure::MeasureError;
use tch::{Device, Kind, TchError, Tensor};

/// The token ids and targets of a batch, `[batch, context]` int64 each, random.
struct Batch {
    ids: Tensor,
    targets: Tensor,
}

/// What the forward pass leaves to the backward pass.
enum Pending {
    /// The loss, its graph holding every layer's saved activations.
    Graph { loss: Tensor },
    /// With recomputation: the loss over the head only, the head's leaf input, each layer's
    /// input, and the embedding's output with its graph (a graph only in full training).
    Recompute {
        loss: Tensor,
        head_input: Tensor,
        layer_inputs: Vec<Tensor>,
        embedded: Tensor,
    },
}

/// `gradient` of `leaf` after a backward pass; an error when none reached it.
fn gradient_of(leaf: &Tensor, what: &str) -> Result<Tensor, TchError> {
    let g = leaf.f_grad()?;
    if g.defined() {
        Ok(g)
    } else {
        Err(TchError::Torch(format!(
            "internal error: no gradient reached {what}"
        )))
    }
}

/// `x` detached from any graph, as a leaf that requires a gradient.
fn leaf(x: &Tensor) -> Result<Tensor, TchError> {
    x.f_detach()?.f_set_requires_grad(true)
}

struct Trainer<'a> {
    decoder: Decoder<'a>,
    checkpointing: bool,
}

impl Trainer<'_> {
    /// The forward pass up to the loss.
    fn forward(&self, batch: &Batch) -> Result<Pending, TchError> {
        let d = &self.decoder;
        let embedded = d.embed(&batch.ids)?;
        if !self.checkpointing {
            let mut x = embedded;
            for layer in &d.model.layers {
                x = d.layer(layer, &x, Keys::Fresh)?;
            }
            let loss = d.loss(&x, &batch.targets)?;
            return Ok(Pending::Graph { loss });
        }
        let mut layer_inputs = Vec::with_capacity(d.model.layers.len());
        let mut x = embedded.f_detach()?;
        {
            let _no_grad = tch::no_grad_guard();
            for layer in &d.model.layers {
                let y = d.layer(layer, &x, Keys::Fresh)?;
                layer_inputs.push(std::mem::replace(&mut x, y));
            }
        }
        let head_input = leaf(&x)?;
        drop(x);
        let loss = d.loss(&head_input, &batch.targets)?;
        Ok(Pending::Recompute {
            loss,
            head_input,
            layer_inputs,
            embedded,
        })
    }

    /// The backward pass; everything the forward pass left is freed by its end.
    fn backward(&self, pending: Pending) -> Result<(), TchError> {
        let (loss, head_input, layer_inputs, embedded) = match pending {
            Pending::Graph { loss } => return loss.f_backward(),
            Pending::Recompute {
                loss,
                head_input,
                layer_inputs,
                embedded,
            } => (loss, head_input, layer_inputs, embedded),
        };
        loss.f_backward()?;
        drop(loss);
        let mut gradient = gradient_of(&head_input, "the last layer's output")?;
        drop(head_input);
        let d = &self.decoder;
        for (index, (layer, input)) in d.model.layers.iter().zip(layer_inputs).enumerate().rev() {
            let x = leaf(&input)?;
            drop(input);
            let y = d.layer(layer, &x, Keys::Fresh)?;
            ffi::backward_with_gradient(&y, &gradient).map_err(TchError::Torch)?;
            drop(y);
            gradient = gradient_of(&x, &format!("the input of layer {index}"))?;
        }
        if embedded.requires_grad() {
            ffi::backward_with_gradient(&embedded, &gradient).map_err(TchError::Torch)?;
        }
        Ok(())
    }
}

/// Runs the training stages of `run.mode` (full or lora).
pub fn run(run: &BenchRun, stages: &mut Stages, device: Device) -> Result<(), MeasureError> {
    let kind = crate::backend::kind(run.dtype);
    let name_weights = |stages: &mut Stages, model: &Model| {
        stages.map_named(model.weights().iter().map(|p| (&p.tensor, p.name.clone())))
    };
    let (model, trainable) = if run.mode == BenchMode::Lora {
        let mut model =
            stages.measure(stage::WEIGHTS, || Model::build(&run.shape, kind, device))?;
        name_weights(stages, &model)?;
        let adapters = stages.measure(stage::ADAPTERS, || {
            model.add_adapters(run.lora_rank, &run.ordered_targets())
        })?;
        stages.map_named(adapters.iter().map(|p| (&p.tensor, p.name.clone())))?;
        (model, adapters)
    } else {
        let (model, all) = stages.measure(stage::WEIGHTS, || {
            let model = Model::build(&run.shape, kind, device)?;
            let all = model.train_all()?;
            Ok((model, all))
        })?;
        name_weights(stages, &model)?;
        (model, all)
    };
    let mut optimizer = stages.measure(stage::OPTIMIZER_STATES, || AdamW::new(trainable))?;
    stages.map_named(optimizer.tensors().into_iter().map(|(name, t)| (t, name)))?;
    let trainer = Trainer {
        decoder: Decoder {
            model: &model,
            flash: run.flash_attention,
        },
        checkpointing: run.checkpointing,
    };
    // The batch is made once and stays alive for both iterations.
    let batch = stages.measure(stage::FIRST_STEP, || {
        let dims = [run.batch as i64, run.context as i64];
        let options = (Kind::Int64, device);
        let vocab = run.shape.vocab as i64;
        let batch = Batch {
            ids: Tensor::f_randint(vocab, dims, options)?,
            targets: Tensor::f_randint(vocab, dims, options)?,
        };
        trainer.backward(trainer.forward(&batch)?)?;
        optimizer.step()?;
        Ok(batch)
    })?;
    let pending = stages.measure(stage::FORWARD, || trainer.forward(&batch))?;
    stages.measure(stage::BACKWARD, || trainer.backward(pending))?;
    stages.measure(stage::OPTIMIZER_STEP, || optimizer.step())
}
