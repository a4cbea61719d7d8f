//! The weights reaching the GPU, as transformers loads them (`from_pretrained` with a device map:
//! its allocator warm-up, then each tensor in the checkpoint's order, quantized as it comes for
//! QLoRA or as a quantizer saved it; or `from_config` built on the device), and PEFT's LoRA
//! adapters made on it.

use super::decoder::{Adapter, Weights};
use super::process::Process;
use super::tensor::Tensor;
use crate::dtype::Dtype;
use crate::model::prequantized::stored;
use crate::model::{Model, Parameter, TensorRole};
use crate::replay::program::Role;
use rustc_hash::FxHashMap;

/// How the weights reach the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loading {
    /// `from_pretrained(..., device_map=...)`: transformers' allocator warm-up (one block of
    /// the weights' total size, freed), then each tensor in the checkpoint's (sorted) order.
    Pretrained,
    /// `from_config` built on the device: each tensor in the order the modules make them.
    FromConfig,
    /// `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
    /// bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True), device_map=...)` (QLoRA):
    /// the warm-up counts each quantized weight at half a byte per element, then each tensor in
    /// the checkpoint's order, every linear layer's weight but the head's quantized as it comes.
    PretrainedNf4,
    /// `from_pretrained` of a checkpoint saved in NF4 with double quantization (its
    /// `quantization_config`): the same warm-up, then each tensor in the checkpoint's order, a
    /// quantized weight as bitsandbytes saved it (its packed values and state, no 16-bit copy).
    PrequantizedNf4,
    /// `from_pretrained` of a checkpoint saved by GPTQ, AWQ, bitsandbytes' 8-bit or FP8: each
    /// tensor in the checkpoint's order, a quantized layer's as stored
    /// ([`crate::model::prequantized`]); its product replayed as a 16-bit one (the kernels'
    /// own temporaries, and a repacking at load, not emulated).
    Prequantized(crate::model::Quantization),
}

/// PEFT LoRA on the modules named `targets` (`q_proj`, `v_proj`…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lora {
    pub rank: u64,
    pub targets: Vec<String>,
    /// `lora_dropout` is above 0 (PEFT then puts an `nn.Dropout` before each adapter, else an
    /// `nn.Identity`).
    pub dropout: bool,
}

/// What `caching_allocator_warmup` finds unused in the cache before loading: the 2 MiB segment
/// `torch.zeros(1)` made when CUDA started, its block freed.
const UNUSED_AT_WARMUP: u64 = 2 << 20;

/// The bytes `caching_allocator_warmup` asks for when the weights take `total`: less what the
/// cache holds unused when that leaves more than it; else nothing (its middle rule, for more than
/// 1.5 GiB left beside the unused bytes, cannot apply with 2 MiB unused). Its cap at the device's
/// memory less 1.2 GiB is not applied: the program does not depend on the card.
fn warmup_bytes(total: u64) -> u64 {
    let unused = UNUSED_AT_WARMUP;
    if total.saturating_sub(unused) > unused {
        total - unused
    } else {
        0
    }
}

/// Loads the weights (and buffers) in the order `loading` gives.
pub(super) fn load(p: &mut Process, model: &Model, dtype: Dtype, loading: Loading) -> Weights {
    let params = match p.tensor_parallel {
        Some(tp) => tp.parameters(model),
        None => model.parameters(),
    };
    let e = dtype;
    let mut by_name = FxHashMap::default();
    let mut quantized = FxHashMap::default();
    let mut quantizer = super::bitsandbytes::Quantizer::default();
    let mut stored_layers = Vec::new();
    p.in_role(Role::Weights, |p| {
        let mut put = |p: &mut Process, t: &Parameter| {
            by_name.insert(t.name.clone(), p.empty(&t.shape, e));
        };
        match loading {
            Loading::FromConfig => {
                let (head, body): (Vec<&Parameter>, Vec<&Parameter>) =
                    params.iter().partition(|t| t.role == TensorRole::LmHead);
                for t in body {
                    put(p, t);
                }
                for b in model.buffers() {
                    let buffer = p.empty(&b.shape, b.buffer_dtype_in(e));
                    by_name.insert(b.name.clone(), buffer);
                }
                for t in head {
                    by_name.insert(t.name.clone(), p.empty(&t.shape, e));
                }
                // A tied head is first made as a layer of its own, then tied (and freed).
                if model.tied_embeddings {
                    drop(p.empty(&[model.vocab, model.hidden], e));
                }
            }
            Loading::Pretrained
            | Loading::PretrainedNf4
            | Loading::PrequantizedNf4
            | Loading::Prequantized(_) => {
                let quantizes = |t: &Parameter| {
                    loading != Loading::Pretrained && super::bitsandbytes::quantizes(t)
                };
                let stored = |t: &Parameter| match loading {
                    Loading::Prequantized(q) => stored(t, q),
                    _ => None,
                };
                // `get_total_byte_count`: each tensor's bytes (as stored), half a byte per
                // element of a weight the 4-bit quantizer packs (counted here in halves); then
                // `torch.empty(byte_count // 2, dtype=float16)`.
                let halves: u64 = params
                    .iter()
                    .map(|t| match stored(t) {
                        Some(kept) => 2 * kept.iter().map(|k| k.bytes()).sum::<u64>(),
                        None if quantizes(t) => t.elements(),
                        None => 2 * t.elements() * e.bytes(),
                    })
                    .sum();
                drop(p.empty(&[warmup_bytes(halves / 2) / 2], Dtype::Float16));
                let mut sorted: Vec<&Parameter> = params.iter().collect();
                sorted.sort_by(|a, b| a.name.cmp(&b.name));
                for t in sorted {
                    let prefix = t.name.trim_end_matches(".weight").to_string();
                    if let Some(kept) = stored(t) {
                        // The layer's tensors as stored; its weight for the product, a view of
                        // the largest (its values) in the dense shape.
                        let kept: Vec<Tensor> =
                            kept.iter().map(|k| p.empty(&k.shape, k.elem)).collect();
                        let values = (kept.iter()).max_by_key(|k| k.bytes()).expect("a tensor");
                        let mut weight = Tensor::over(values.storage.clone(), &t.shape, e);
                        weight.is_view = true;
                        by_name.insert(t.name.clone(), weight);
                        stored_layers.extend(kept);
                        continue;
                    }
                    if loading == Loading::PrequantizedNf4 && quantizes(t) {
                        quantized.insert(prefix, super::bitsandbytes::load_saved(p, t, e));
                        continue;
                    }
                    let staged = p.empty(&t.shape, e);
                    if quantizes(t) {
                        quantized.insert(prefix, quantizer.quantize(p, staged));
                    } else {
                        by_name.insert(t.name.clone(), staged);
                    }
                }
                for b in model.buffers() {
                    let buffer = p.empty(&b.shape, b.buffer_dtype_in(e));
                    by_name.insert(b.name.clone(), buffer);
                }
            }
        }
    });
    if model.tied_embeddings {
        let embed = by_name[&format!("{}embed_tokens.weight", model.text_prefix())].clone();
        by_name.insert("lm_head.weight".into(), embed);
    }
    Weights {
        by_name,
        adapters: FxHashMap::default(),
        quantized,
        quantization_map: quantizer.into_map(),
        stored: stored_layers,
    }
}

/// PEFT's adapters: per targeted module, `A` then `B` made in the base's dtype on the device,
/// then every adapter cast to float32 (each cast freeing its 16-bit original).
pub(super) fn adapters(
    p: &mut Process,
    model: &Model,
    lora: &Lora,
    dtype: Dtype,
) -> FxHashMap<String, Adapter> {
    let e = dtype;
    let targets: Vec<Parameter> = model
        .parameters()
        .into_iter()
        .filter(|t| {
            t.role == TensorRole::Linear
                && !t.is_bias()
                && lora.targets.iter().any(|m| m == t.module())
        })
        .collect();
    p.in_role(Role::Adapters, |p| {
        let first: Vec<(String, Tensor, Tensor)> = targets
            .iter()
            .map(|t| {
                let (out, inp) = (t.shape[0], t.shape[1]);
                let a = p.empty(&[lora.rank, inp], e);
                let b = p.empty(&[out, lora.rank], e);
                (t.name.trim_end_matches(".weight").to_string(), a, b)
            })
            .collect();
        let mut out = FxHashMap::default();
        for (name, a, b) in first {
            let a32 = if e == Dtype::Float32 { a } else { cast(p, a) };
            let b32 = if e == Dtype::Float32 { b } else { cast(p, b) };
            out.insert(
                name,
                Adapter {
                    a: a32,
                    b: b32,
                    dropout: lora.dropout,
                },
            );
        }
        out
    })
}

fn cast(p: &mut Process, t: Tensor) -> Tensor {
    let c = p.empty(&t.shape, Dtype::Float32);
    drop(t);
    c
}
