//! Inference, without autograd: the weights, a KV cache preallocated for the prompt and every
//! generated token, the prefill of the prompt, then one decode step per generated token, greedy.

use super::decoder::{Decoder, Keys};
use super::model::Model;
use super::stages::Stages;
use iteragpu_lab::budget::bench::stage;
use iteragpu_lab::budget::{kv_cache_names, BenchRun};
use iteragpu_lab::measure::MeasureError;
use tch::{Device, Kind, TchError, Tensor};

/// K and V of every layer, `[batch, kv_heads, context + generated, head_dim]` each.
struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
}

impl KvCache {
    /// Allocates the cache, K then V for each layer, zeroed as a static cache is.
    fn new(run: &BenchRun, model: &Model) -> Result<KvCache, TchError> {
        let s = &run.shape;
        let positions = run.positions().expect("a validated run's positions fit");
        let dims = [run.batch, s.kv_heads, positions, s.head_dim].map(|n| n as i64);
        let options = (model.kind, model.device);
        let mut layers = Vec::new();
        for _ in 0..s.layers {
            let k = Tensor::f_zeros(dims, options)?;
            let v = Tensor::f_zeros(dims, options)?;
            layers.push((k, v));
        }
        Ok(KvCache { layers })
    }
}

/// Every layer over `x` `[batch, len, hidden]`, the new keys and values written into the cache
/// at `start`, then the final norm and the logits of the last position; returns the next token
/// ids `[batch, 1]` (argmax).
fn next_tokens(
    decoder: &Decoder,
    cache: &KvCache,
    mut x: Tensor,
    start: i64,
) -> Result<Tensor, TchError> {
    for (layer, (k, v)) in decoder.model.layers.iter().zip(&cache.layers) {
        x = decoder.layer(layer, &x, Keys::Cache { k, v, start })?;
    }
    let len = x.size3()?.1;
    let normed = decoder.final_norm(&x)?;
    drop(x);
    let logits = decoder.logits(&normed.f_narrow(1, len - 1, 1)?)?;
    drop(normed);
    logits.f_argmax(-1, false)
}

/// Runs the inference stages: `weights`, `kv_cache`, `prefill`, `decode`.
pub fn run(run: &BenchRun, stages: &mut Stages, device: Device) -> Result<(), MeasureError> {
    let _no_grad = tch::no_grad_guard();
    let kind = crate::backend::kind(run.dtype);
    let model = stages.measure(stage::WEIGHTS, || Model::build(&run.shape, kind, device))?;
    stages.map_named(model.weights().iter().map(|p| (&p.tensor, p.name.clone())))?;
    let decoder = Decoder {
        model: &model,
        flash: run.flash_attention,
    };
    let cache = stages.measure(stage::KV_CACHE, || KvCache::new(run, &model))?;
    stages.map_named(
        cache
            .layers
            .iter()
            .enumerate()
            .flat_map(|(l, (k, v))| [k, v].into_iter().zip(kv_cache_names(l as u64))),
    )?;
    let context = run.context as i64;
    // What stays alive after the prefill: the cache and the first generated token.
    let first = stages.measure(stage::PREFILL, || {
        let prompt = Tensor::f_randint(
            run.shape.vocab as i64,
            [run.batch as i64, context],
            (Kind::Int64, device),
        )?;
        next_tokens(&decoder, &cache, decoder.embed(&prompt)?, 0)
    })?;
    stages.measure(stage::DECODE, || {
        let mut token = first;
        for step in 0..run.generated as i64 {
            token = next_tokens(&decoder, &cache, decoder.embed(&token)?, context + step)?;
        }
        Ok(())
    })
}
