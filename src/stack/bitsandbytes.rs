//! bitsandbytes 0.50's 4-bit weights as transformers 5.17 loads them (QLoRA's
//! `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
//! bnb_4bit_use_double_quant=True)`, or a checkpoint saved so), for memory: each `nn.Linear`
//! weight but the head quantized as it is loaded (`quantize_4bit`, then its float32 scales
//! quantized again by `quantize_blockwise`) or read as saved, and the product of a quantized layer
//! as `gemm_4bit` dispatches it on CUDA: bitsandbytes' own kernel (`cgemm_4bit_*`, its output the
//! only allocation) or the dequantizing path (`_dequant_linear_fallback`), chosen from the rows,
//! the layer's shape and the GPU ([`own_kernel`]).

use super::process::Process;
use super::tensor::Tensor;
use crate::dtype::Dtype;

/// The elements sharing one scale of a 4-bit weight (bitsandbytes' default `blocksize`).
pub const BLOCK: u64 = 64;
/// The scales sharing one float32 scale of their own (double quantization's `blocksize`).
pub const SCALE_BLOCK: u64 = 256;
/// Above this many rows (tokens) in a product, `gemm_4bit` dequantizes the weight then calls
/// `F.linear` on every CUDA GPU (`_gemm_4bit_custom_max_m`); at or below it, a heuristic of the
/// GPU's multiprocessors, its architecture and the layer's shape may pick bitsandbytes' own
/// kernel instead ([`own_kernel`]).
pub const DEQUANTIZING_ROWS: u64 = 1536;
/// At or below this many rows bitsandbytes' own kernel always runs (`_GEMM_4BIT_CUSTOM_FLOOR_M`).
const OWN_KERNEL_ROWS: u64 = 4;
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
/// whatever the GPU.
pub fn dequantizes(rows: u64, in_features: u64) -> bool {
    rows > DEQUANTIZING_ROWS || !in_features.is_multiple_of(BLOCK)
}

/// The GPU `gemm_4bit`'s dispatch reads (`_gpu_dispatch_props`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchGpu {
    pub multiprocessors: u64,
    pub architecture: crate::allocator::ComputeCapability,
}

/// Whether bitsandbytes 0.50's `gemm_4bit` runs its own kernel for a product of `rows` rows of
/// `x_elem` by a weight `[n, k]` on `gpu`, rather than dequantizing the weight: its guards
/// (rows, the block's alignment), then `_gemm_4bit_use_custom_cuda`, the library's own tiers of
/// architecture, wave occupancy (`n` in blocks of 64 against the multiprocessors) and shape.
pub fn own_kernel(gpu: DispatchGpu, x_elem: Dtype, rows: u64, n: u64, k: u64) -> bool {
    if dequantizes(rows, k) {
        return false;
    }
    let m = rows;
    if m <= OWN_KERNEL_ROWS {
        return true;
    }
    let sms = gpu.multiprocessors;
    let (major, minor) = (gpu.architecture.major, gpu.architecture.minor);
    let n_blocks = n.div_ceil(64);
    // No MMA kernel for float32, before sm75, or for bfloat16 on sm75.
    if x_elem == Dtype::Float32
        || major < 7
        || (major == 7 && (minor < 5 || x_elem != Dtype::Float16))
    {
        return m < 8;
    }
    if (major == 8 && minor == 7) || major == 11 {
        return false;
    }
    if major == 10 {
        return match () {
            _ if n_blocks >= sms * 3 => m <= 32,
            _ if n_blocks >= sms => k < n && m <= 8,
            _ => false,
        };
    }
    let sm75 = major == 7 && minor == 5;
    let sm80 = major == 8 && minor == 0;
    let sm86 = major == 8 && minor == 6;
    let sm90 = major == 9;
    let sm120 = major == 12 && minor == 0;
    let sm121 = major == 12 && minor == 1;
    let hbm = sm80 || sm90;
    let tall_k_2xn = k > n * 2;
    // Small weights (fewer than 4 Mi elements).
    if n * k < 4 * 1024 * 1024 {
        if k * 2 < n {
            if hbm {
                let low_wave = n_blocks * 3 < sms;
                return match (sm80, low_wave) {
                    (true, true) => m <= 1536,
                    (true, false) => m <= 512,
                    (false, true) => m <= 512,
                    (false, false) => m <= 320,
                };
            }
            if sm75 {
                return match () {
                    _ if n_blocks >= sms * 3 => m <= 320,
                    _ if k >= 1024 => m <= 64,
                    _ if k >= 704 => m <= 96,
                    _ => m <= 320,
                };
            }
            if n_blocks >= sms {
                return m <= 320;
            }
            return match n_blocks * k > sms * 320 {
                true => m <= 192,
                false => m <= 320,
            };
        }
        let quarter_wave = n_blocks * 4 <= sms;
        if sm80 && quarter_wave {
            if k >= n {
                return m <= if n_blocks * 8 <= sms { 32 } else { 128 };
            }
            return m <= 384;
        }
        if sm75 && n_blocks < sms && m > 8 {
            return m <= 64;
        }
        if quarter_wave {
            return m <= if k < n || hbm { 32 } else { 23 };
        }
        return n_blocks * 2 <= sms && m <= 16;
    }
    if m > 512 {
        return false;
    }
    if m < 8 {
        let hbm_threshold = if sm90 { 36 } else { 48 };
        if hbm && m >= 6 && n_blocks >= hbm_threshold {
            let under_75_percent = n_blocks * 4 < sms * 3;
            let under_60_percent = n_blocks * 5 < sms * 3;
            if k > n && under_75_percent {
                return false;
            }
            if k == n && sm80 && under_60_percent {
                return false;
            }
            if k == n && sm90 && under_75_percent && !under_60_percent {
                return false;
            }
        }
        return true;
    }
    if sm75 {
        return match () {
            _ if n_blocks >= sms * 3 => m <= if k < n { 128 } else { 64 },
            _ if n_blocks >= sms / 2 => m <= 64,
            _ => m <= 32,
        };
    }
    if sm80 {
        if n_blocks >= sms * 3 {
            return m <= 128;
        }
        if n_blocks >= sms {
            return m <= if k < n { 64 } else { 32 };
        }
        if k >= n * 3 && n_blocks * 4 > sms {
            return false;
        }
        if k == n && n_blocks >= 48 && n_blocks * 5 < sms * 3 {
            return false;
        }
        if n_blocks * 2 < sms {
            if k <= n {
                return m <= 128;
            }
            if n_blocks * 3 >= sms {
                return false;
            }
        }
        if n_blocks >= sms / 2 && k < n {
            return m <= 128;
        }
        return m <= 16;
    }
    if sm86 {
        return match () {
            _ if n_blocks >= sms => m <= 128,
            _ if n_blocks >= sms / 2 => m <= 64,
            _ => m <= 16,
        };
    }
    if sm90 {
        return match () {
            _ if n_blocks >= sms * 3 => m <= 64,
            _ if n_blocks >= sms * 2 => m <= 48,
            _ if n_blocks >= sms => m <= 32,
            _ if n_blocks >= sms / 2 => !(k >= n && n_blocks * 4 < sms * 3) && m <= 16,
            _ => false,
        };
    }
    if sm121 && n_blocks >= sms {
        return m <= 256;
    }
    if sm120 {
        return match () {
            _ if n_blocks >= sms * 3 => m <= 256,
            _ if n_blocks >= sms * 2 => m <= 128,
            _ if n_blocks * 5 >= sms * 4 => m <= if k >= n { 96 } else { 64 },
            _ if n_blocks >= sms => m <= 64,
            _ if n_blocks >= sms / 2 => m <= if k * 2 >= n && n_blocks >= 128 { 64 } else { 8 },
            _ if tall_k_2xn && n_blocks > 64 => m <= 16,
            _ => m <= 8,
        };
    }
    // sm89 (RTX 4090, L40S, L4), sm121 below one wave and other architectures.
    if n_blocks >= sms * 3 {
        return m <= 256;
    }
    if n_blocks >= sms * 2 {
        return m <= 128;
    }
    if n_blocks * 5 >= sms * 4 {
        if tall_k_2xn || n_blocks >= 200 {
            return m <= 128;
        }
        if k >= n {
            return m <= if sms >= 60 { 128 } else { 32 };
        }
        return m <= 64;
    }
    if n_blocks >= sms / 2 {
        return match () {
            _ if tall_k_2xn => m <= 64,
            _ if n_blocks >= 64 => m <= 8,
            _ => m <= 32,
        };
    }
    if k > n && n_blocks <= 48 {
        return m <= if k >= n * 3 { 12 } else { 10 };
    }
    m <= if tall_k_2xn || n_blocks < 48 { 16 } else { 8 }
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
    /// `bnb.matmul_4bit(x, weight.t(), bias)`: by bitsandbytes' own kernel where `gemm_4bit`
    /// picks it for this GPU ([`own_kernel`]; the output is all it allocates), else by the
    /// dequantizing path: the scales dequantized (`empty_like`, then plus the offset), the weight
    /// dequantized into a new tensor of `x`'s type, `F.linear`, then those three freed in the
    /// order the frame releases them. Under autograd one node (`MatMul4Bit`) saves nothing that
    /// allocates; its backward dequantizes again.
    pub fn linear_4bit(&mut self, x: &Tensor, w: &Quantized4bit, bias: Option<&Tensor>) -> Tensor {
        let gpu = DispatchGpu {
            multiprocessors: self.kernels.reduction_grid.multiprocessors,
            architecture: self.kernels.compute_capability,
        };
        let rows = x.numel() / w.in_features;
        let mut out = if own_kernel(gpu, x.elem, rows, w.out_features, w.in_features) {
            let mut shape = x.shape.clone();
            *shape.last_mut().expect("a dimension") = w.out_features;
            self.empty(&shape, x.elem)
        } else {
            let scales = self.empty(&[w.blocks()], Dtype::Float32);
            let shifted = self.empty(&[w.blocks()], Dtype::Float32);
            let dequantized = self.empty(&[w.out_features, w.in_features], x.elem);
            let enabled = std::mem::replace(&mut self.autograd.enabled, false);
            let out = self.linear(x, &dequantized, bias);
            self.autograd.enabled = enabled;
            drop(shifted);
            drop(scales);
            drop(dequantized);
            out
        };
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

    /// Each case worked through bitsandbytes 0.50's `gemm_4bit` dispatch by hand.
    #[test]
    fn bitsandbytes_picks_its_kernel_by_rows_shape_and_gpu() {
        let cc = crate::allocator::ComputeCapability::new;
        let h200 = DispatchGpu {
            multiprocessors: 132,
            architecture: cc(9, 0),
        };
        let l4 = DispatchGpu {
            multiprocessors: 58,
            architecture: cc(8, 9),
        };
        let bf16 = Dtype::Bfloat16;
        // Four rows or fewer: its own kernel, but on an unaligned width.
        assert!(own_kernel(h200, bf16, 2, 4096, 4096));
        assert!(!own_kernel(h200, bf16, 2, 4096, 360));
        // Llama 3.1 8B's q_proj at 8 rows: under half a wave of 64-wide blocks, square: the
        // H200 dequantizes; the L4 (near a wave, square, under 60 SMs) runs its kernel to 32.
        assert!(!own_kernel(h200, bf16, 8, 4096, 4096));
        assert!(own_kernel(l4, bf16, 8, 4096, 4096));
        assert!(!own_kernel(l4, bf16, 33, 4096, 4096));
        // Its gate_proj (224 blocks, over a wave of the H200's 132): the kernel to 32 rows.
        assert!(own_kernel(h200, bf16, 32, 14336, 4096));
        assert!(!own_kernel(h200, bf16, 33, 14336, 4096));
        // Small weights, a quarter wave: 32 rows on HBM.
        assert!(own_kernel(h200, bf16, 32, 448, 320));
        assert!(!own_kernel(h200, bf16, 120, 448, 320));
        // float32 inputs: the SIMT kernel below 8 rows only.
        assert!(own_kernel(h200, Dtype::Float32, 7, 4096, 4096));
        assert!(!own_kernel(h200, Dtype::Float32, 8, 4096, 4096));
        // Blackwell (sm100): over three waves, to 32 rows; under a wave, never.
        let b200 = DispatchGpu {
            multiprocessors: 148,
            architecture: cc(10, 0),
        };
        assert!(own_kernel(b200, bf16, 32, 28672, 8192));
        assert!(!own_kernel(b200, bf16, 8, 4096, 4096));
        // Above 1 536 rows, never.
        assert!(!own_kernel(l4, bf16, 1537, 14336, 4096));
    }

    #[test]
    fn the_dequantizing_path_runs_above_1536_rows_or_on_unaligned_widths() {
        assert!(dequantizes(1537, 4096));
        assert!(!dequantizes(1536, 4096));
        assert!(dequantizes(8, 360));
    }
}
