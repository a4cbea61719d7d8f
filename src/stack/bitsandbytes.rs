//! bitsandbytes 0.50's 4-bit weights as transformers 5.17 loads them for QLoRA
//! (`BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
//! bnb_4bit_use_double_quant=True)`), for memory: each `nn.Linear` weight but the head quantized
//! as it is loaded (`quantize_4bit`, then its float32 scales quantized again by
//! `quantize_blockwise`), and the product of a quantized layer by its dequantizing path
//! (`_dequant_linear_fallback`), which bitsandbytes takes on every CUDA GPU above
//! [`DEQUANTIZING_ROWS`] rows or when the input width is not a multiple of the block.

use super::process::Process;
use super::tensor::Tensor;
use crate::dtype::Dtype;

/// The elements sharing one scale of a 4-bit weight (bitsandbytes' default `blocksize`).
pub const BLOCK: u64 = 64;
/// The scales sharing one float32 scale of their own (double quantization's `blocksize`).
pub const SCALE_BLOCK: u64 = 256;
/// Above this many rows (tokens) in a product, `gemm_4bit` dequantizes the weight then calls
/// `F.linear` on every CUDA GPU (`_gemm_4bit_custom_max_m`); at or below it, a heuristic of the
/// GPU's SM count and the layer's shape may pick bitsandbytes' own kernel instead.
pub const DEQUANTIZING_ROWS: u64 = 1536;
/// Entries of the 4-bit type's code (`get_4bit_type`, float32), kept per weight.
const CODE_ENTRIES: u64 = 16;
/// Entries of the dynamic map of `quantize_blockwise` (float32): made once, and copied into
/// every weight's second state.
const DYNAMIC_MAP_ENTRIES: u64 = 256;

/// Whether QLoRA's loading quantizes this parameter: a linear layer's weight (not its bias, not
/// the head).
pub fn quantizes(t: &crate::model::Parameter) -> bool {
    t.role == crate::model::TensorRole::Linear && !t.is_bias()
}

/// One quantized weight on the device: the packed 4-bit values and its quantization state.
pub struct Quantized4bit {
    pub out_features: u64,
    pub in_features: u64,
    /// The packed values, the code, the offset, the 8-bit scales, their float32 scales and the
    /// dynamic map's copy.
    pub tensors: Vec<Tensor>,
}

/// The blocks of 64 elements of a weight of `elements`.
fn blocks(elements: u64) -> u64 {
    elements.div_ceil(BLOCK)
}

/// What one quantized weight of `elements` keeps on the device, as (entries, type): the packed
/// values (two a byte), the code, the offset, one byte per block, a float32 per 256 blocks and
/// the dynamic map's copy.
fn kept(elements: u64) -> [(u64, Dtype); 6] {
    let b = blocks(elements);
    [
        (elements.div_ceil(2), Dtype::Uint8),
        (CODE_ENTRIES, Dtype::Float32),
        (1, Dtype::Float32),
        (b, Dtype::Uint8),
        (b.div_ceil(SCALE_BLOCK), Dtype::Float32),
        (DYNAMIC_MAP_ENTRIES, Dtype::Float32),
    ]
}

/// The bytes one quantized weight of `elements` keeps on the device.
pub fn quantized_bytes(elements: u64) -> u64 {
    kept(elements).iter().map(|(n, e)| n * e.bytes()).sum()
}

/// The dynamic map `quantize_blockwise` makes at its first call and keeps for the process.
pub fn dynamic_map_bytes() -> u64 {
    DYNAMIC_MAP_ENTRIES * Dtype::Float32.bytes()
}

/// Whether bitsandbytes dequantizes the weight for a product of `rows` rows of `in_features`
/// (whatever the GPU), the only path emulated.
pub fn dequantizes(rows: u64, in_features: u64) -> bool {
    rows > DEQUANTIZING_ROWS || !in_features.is_multiple_of(BLOCK)
}

/// Where quantization stands in a loading: the dynamic map, once made.
#[derive(Default)]
pub struct Quantizer {
    dynamic_map: Option<Tensor>,
}

impl Quantizer {
    /// `Params4bit.to("cuda")` of the `[out, in]` weight just staged on the device in its
    /// 16-bit type (freed at the end): `quantize_4bit`'s scales and packed values, the code
    /// (`get_4bit_type`: its values, their absolute values and maximum, freed), the offset (the
    /// scales' mean, and what the reduction stages) and the centred scales quantized by
    /// `quantize_blockwise` (its float32 scales, its bytes, the dynamic map copied), the float32
    /// scales then freed.
    pub fn quantize(&mut self, p: &mut Process, staged: Tensor) -> Quantized4bit {
        let (out_features, in_features) = (staged.shape[0], staged.shape[1]);
        let n = out_features * in_features;
        let b = blocks(n);
        let [packed, code, offset, bytes, scales, map] = kept(n);
        let make = |p: &mut Process, (entries, elem): (u64, Dtype)| p.empty(&[entries], elem);
        let absmax = p.empty(&[b], Dtype::Float32);
        let packed = make(p, packed);
        let code = make(p, code);
        let abs = p.empty(&[CODE_ENTRIES], Dtype::Float32);
        let max = p.empty(&[], Dtype::Float32);
        drop(abs);
        drop(max);
        let offset = make(p, offset);
        // `absmax.mean()` of the block maxima: a whole reduction of `b` float32 values.
        p.reduction_staging(super::reduce::Reduction::whole(b), Dtype::Float32);
        let centred = p.empty(&[b], Dtype::Float32);
        if self.dynamic_map.is_none() {
            self.dynamic_map = Some(p.empty(&[DYNAMIC_MAP_ENTRIES], Dtype::Float32));
        }
        let scales = make(p, scales);
        let bytes = make(p, bytes);
        let map = make(p, map);
        drop(centred);
        drop(absmax);
        drop(staged);
        Quantized4bit {
            out_features,
            in_features,
            tensors: vec![packed, code, offset, bytes, scales, map],
        }
    }

    /// The dynamic map, kept by the process as long as the model.
    pub fn into_map(self) -> Option<Tensor> {
        self.dynamic_map
    }
}

/// A weight saved quantized (`[out, in]` of `compute` elements), as transformers 5.17 loads it:
/// the checkpoint's tensors in their (sorted) order, `weight`, then its state
/// (`absmax`: the 8-bit scales, `nested_absmax`: their float32 scales, `nested_quant_map`: the
/// dynamic map, `quant_map`: the code, and `quant_state.bitsandbytes__nf4`: the state's other
/// fields as JSON bytes, read then let go), then `Params4bit.from_prequantized`'s offset
/// (`QuantState.from_dict`: a float32 scalar made from the JSON's `nested_offset`). Nothing is
/// staged in 16 bits and no dynamic map is made for the process.
pub fn load_saved(
    p: &mut Process,
    weight: &crate::model::Parameter,
    compute: Dtype,
) -> Quantized4bit {
    let (out_features, in_features) = (weight.shape[0], weight.shape[1]);
    let n = out_features * in_features;
    let [packed, code, offset, bytes, scales, map] = kept(n);
    let make = |p: &mut Process, (entries, elem): (u64, Dtype)| p.empty(&[entries], elem);
    let packed = make(p, packed);
    let bytes = make(p, bytes);
    let scales = make(p, scales);
    let map = make(p, map);
    let code = make(p, code);
    let json = p.empty(
        &[saved_state_json(out_features, in_features, compute)],
        Dtype::Uint8,
    );
    let offset = make(p, offset);
    drop(json);
    Quantized4bit {
        out_features,
        in_features,
        tensors: vec![packed, code, offset, bytes, scales, map],
    }
}

/// The length of the JSON `QuantState.as_dict(packed=True)` saves beside a weight's tensors: its
/// fields that are not tensors, `json.dumps`'d (the offset's digits vary from weight to weight:
/// 17 decimals are counted, as for an offset between 0.01 and 0.1; any length up to 512 bytes
/// takes the same block).
fn saved_state_json(out_features: u64, in_features: u64, compute: Dtype) -> u64 {
    let dtype = match compute {
        Dtype::Float16 => "float16",
        Dtype::Float32 => "float32",
        _ => "bfloat16",
    };
    let json = format!(
        "{{\"quant_type\": \"nf4\", \"blocksize\": {BLOCK}, \"dtype\": \"{dtype}\", \"shape\": \
         [{out_features}, {in_features}], \"nested_blocksize\": {SCALE_BLOCK}, \"nested_dtype\": \
         \"float32\", \"nested_offset\": 0.0{:016}}}",
        0
    );
    json.len() as u64
}

impl Quantized4bit {
    pub fn elements(&self) -> u64 {
        self.out_features * self.in_features
    }

    pub fn blocks(&self) -> u64 {
        blocks(self.elements())
    }
}

impl Process {
    /// `bnb.matmul_4bit(x, weight.t(), bias)` by the dequantizing path: the scales dequantized
    /// (`empty_like`, then plus the offset), the weight dequantized into a new tensor of `x`'s
    /// type, `F.linear`, then those three freed in the order the frame releases them. Under
    /// autograd one node (`MatMul4Bit`) saves nothing that allocates; its backward dequantizes
    /// again.
    pub fn linear_4bit(&mut self, x: &Tensor, w: &Quantized4bit, bias: Option<&Tensor>) -> Tensor {
        let scales = self.empty(&[w.blocks()], Dtype::Float32);
        let shifted = self.empty(&[w.blocks()], Dtype::Float32);
        let dequantized = self.empty(&[w.out_features, w.in_features], x.elem);
        let enabled = std::mem::replace(&mut self.autograd.enabled, false);
        let mut out = self.linear(x, &dequantized, bias);
        self.autograd.enabled = enabled;
        drop(shifted);
        drop(scales);
        drop(dequantized);
        let rule = super::tensor::Rule::MatMul4bit {
            out_features: w.out_features,
            in_features: w.in_features,
            blocks: w.blocks(),
            elem: x.elem,
        };
        self.record_op(rule, &[x], &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantized_weight_keeps_what_bitsandbytes_keeps() {
        // 448 × 320 (the small traced model's gate_proj): 71 680 packed bytes, 2 240 blocks,
        // 9 float32 scales of scales.
        assert_eq!(
            quantized_bytes(448 * 320),
            71_680 + 64 + 4 + 2_240 + 36 + 1_024
        );
    }

    #[test]
    fn the_dequantizing_path_runs_above_1536_rows_or_on_unaligned_widths() {
        assert!(dequantizes(1537, 4096));
        assert!(!dequantizes(1536, 4096));
        assert!(dequantizes(8, 360));
    }
}
