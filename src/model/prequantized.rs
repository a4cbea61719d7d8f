//! What a checkpoint saved quantized by GPTQ, AWQ, bitsandbytes' 8-bit or fine-grained FP8 stores
//! for each quantized linear layer, which transformers loads onto the GPU as stored: each
//! tensor's name, shape and type, from the layer's shape and the `quantization_config`
//! (bitsandbytes' 4-bit: `stack::bitsandbytes`).

use super::{Model, Parameter, Quantization};
use crate::dtype::Dtype;

/// One tensor a quantized layer stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The tensor's name after the layer's (`qweight`, `scales`, `weight_scale_inv`…).
    pub suffix: &'static str,
    pub shape: [u64; 2],
    /// Its element type as the allocator sees it: its size (int8 and float8 as bytes).
    pub elem: Dtype,
}

impl Stored {
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.elements() * self.elem.bytes()
    }
}

fn tensor(suffix: &'static str, shape: [u64; 2], elem: Dtype) -> Stored {
    Stored {
        suffix,
        shape,
        elem,
    }
}

/// The tensors `q` stores for the linear layer whose dense weight is `weight` (`[out, in]`), in
/// the order of their names; `None` for any other parameter (kept in the compute dtype) and for
/// bitsandbytes' 4-bit, stored otherwise.
pub fn stored(weight: &Parameter, q: Quantization) -> Option<Vec<Stored>> {
    if !weight.is_linear_weight() {
        return None;
    }
    let (out, inp) = (weight.shape[0], weight.shape[1]);
    Some(match q {
        Quantization::Bnb4 { .. } => return None,
        // GPTQ packs 32 / bits input rows into each int32 of `qweight` and keeps `g_idx`, each
        // input row's group; AWQ packs output columns instead. Both keep zeros packed the AWQ
        // way and float16 scales, one row per group (one group: `group_size` -1).
        Quantization::Packed {
            bits,
            group_size,
            g_idx,
        } => {
            let groups = match group_size {
                0 => 1,
                g => inp.div_ceil(g),
            };
            let packed = |n: u64| (n * bits).div_ceil(32);
            let qweight = match g_idx {
                true => [packed(inp), out],
                false => [inp, packed(out)],
            };
            let mut t = vec![
                tensor("qweight", qweight, Dtype::Int32),
                tensor("qzeros", [groups, packed(out)], Dtype::Int32),
                tensor("scales", [groups, out], Dtype::Float16),
            ];
            if g_idx {
                t.insert(0, tensor("g_idx", [1, inp], Dtype::Int32));
            }
            t
        }
        // LLM.int8(): the int8 weight and one float32 scale per output row.
        Quantization::Bnb8 => vec![
            tensor("SCB", [1, out], Dtype::Float32),
            tensor("weight", [out, inp], Dtype::Uint8),
        ],
        // The float8 weight and one float32 inverse scale per block.
        Quantization::Fp8 {
            block_rows,
            block_cols,
        } => vec![
            tensor("weight", [out, inp], Dtype::Uint8),
            tensor(
                "weight_scale_inv",
                [out.div_ceil(block_rows), inp.div_ceil(block_cols)],
                Dtype::Float32,
            ),
        ],
    })
}

/// What `q` stores for a layer, in words.
pub fn layout(q: Quantization) -> &'static str {
    match q {
        Quantization::Packed { g_idx: true, .. } => {
            "qweight, qzeros and g_idx in int32, float16 scales"
        }
        Quantization::Packed { .. } => "qweight and qzeros in int32, float16 scales",
        Quantization::Bnb8 => "int8 weights, a float32 scale per output row",
        Quantization::Fp8 { .. } => "float8 weights, a float32 inverse scale per block",
        Quantization::Bnb4 { .. } => "NF4 or FP4 values, two a byte, and their block scales",
    }
}

/// The bytes of what `q` stores for `weight`, `None` as [`stored`].
pub fn stored_bytes(weight: &Parameter, q: Quantization) -> Option<u64> {
    stored(weight, q).map(|t| t.iter().map(Stored::bytes).sum())
}

/// The elements of a checkpoint of `model` saved as its `quantization_config` says (bitsandbytes'
/// 4-bit and unquantized models: its parameters), to set against a checkpoint's headers.
pub fn checkpoint_elements(model: &Model) -> u64 {
    model
        .parameters()
        .iter()
        .map(|p| {
            let kept = model.quantization.and_then(|q| stored(p, q));
            match kept {
                Some(t) => t.iter().map(Stored::elements).sum(),
                None => p.elements(),
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TensorRole;

    fn q_proj(out: u64, inp: u64) -> Parameter {
        Parameter {
            name: "model.layers.0.self_attn.q_proj.weight".into(),
            shape: vec![out, inp],
            role: TensorRole::Linear,
        }
    }

    #[test]
    fn gptq_awq_int8_and_fp8_store_what_their_packers_write() {
        let w = q_proj(4096, 4096);
        let gptq = Quantization::Packed {
            bits: 4,
            group_size: 128,
            g_idx: true,
        };
        let shapes = |q| -> Vec<(&str, [u64; 2])> {
            stored(&w, q)
                .unwrap()
                .iter()
                .map(|t| (t.suffix, t.shape))
                .collect()
        };
        assert_eq!(
            shapes(gptq),
            [
                ("g_idx", [1, 4096]),
                ("qweight", [512, 4096]),
                ("qzeros", [32, 512]),
                ("scales", [32, 4096])
            ]
        );
        // 8 MiB of packed values, 64 KiB of zeros, 256 KiB of scales, 16 KiB of group indices.
        assert_eq!(
            stored_bytes(&w, gptq),
            Some((8 << 20) + (64 << 10) + (256 << 10) + (16 << 10))
        );
        let awq = Quantization::Packed {
            bits: 4,
            group_size: 128,
            g_idx: false,
        };
        assert_eq!(shapes(awq)[0], ("qweight", [4096, 512]));
        assert_eq!(
            stored_bytes(&w, awq),
            Some((8 << 20) + (64 << 10) + (256 << 10))
        );
        // One group for `group_size` -1; 3 bits pack 32 values in three int32.
        let whole = Quantization::Packed {
            bits: 3,
            group_size: 0,
            g_idx: true,
        };
        assert_eq!(
            shapes(whole)[1..3],
            [("qweight", [384, 4096]), ("qzeros", [1, 384])]
        );
        assert_eq!(
            stored_bytes(&w, Quantization::Bnb8),
            Some((16 << 20) + 4 * 4096)
        );
        let fp8 = Quantization::Fp8 {
            block_rows: 128,
            block_cols: 128,
        };
        assert_eq!(
            stored_bytes(&q_proj(1000, 4096), fp8),
            Some(1000 * 4096 + 8 * 32 * 4)
        );
        assert_eq!(stored(&w, Quantization::Bnb4 { double_quant: true }), None);
    }
}
