//! A model's `generation_config.json`: the defaults `generate` takes from it where the call
//! gives none (sampling and its warpers, the repetition penalty, beams, the end-of-sequence
//! tokens beam search keeps candidates for, the cache), as transformers 5.17 reads them. Fields
//! it does not change memory by are ignored.

use super::folder::FolderError;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// The values of a `generation_config.json` that change what `generate` allocates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_sample: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Decimal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<Decimal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<Decimal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_beams: Option<u64>,
    /// How many ids `eos_token_id` names (one id or a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_tokens: Option<u64>,
    /// `cache_implementation`: the cache `generate` makes, by transformers' name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_implementation: Option<String>,
}

/// What `generate` makes of a `cache_implementation` in transformers 5.17
/// (`generation/configuration_utils.py`: `ALL_CACHE_IMPLEMENTATIONS` and `"paged"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// `dynamic`: a `DynamicCache`, grown at each step.
    Dynamic,
    /// `offloaded`: a dynamic cache whose full layers wait on the CPU.
    Offloaded,
    /// `static`, `offloaded_static` and the deprecated `sliding_window`, `hybrid`,
    /// `hybrid_chunked`, `offloaded_hybrid`, `offloaded_hybrid_chunked`: a cache allocated whole
    /// for the longest sequence, and on a GPU `generate` compiles its decoding step
    /// (`_valid_auto_compile_criteria`: `torch.compile` in mode `reduce-overhead`, CUDA graphs).
    Compiled,
    /// `quantized` (a `QuantizedCache`) and `paged` (continuous batching).
    Other,
}

impl CacheKind {
    /// The kind of a transformers `cache_implementation` name, if it is one.
    pub fn of(name: &str) -> Option<CacheKind> {
        Some(match name {
            "dynamic" => CacheKind::Dynamic,
            "offloaded" => CacheKind::Offloaded,
            "static"
            | "offloaded_static"
            | "sliding_window"
            | "hybrid"
            | "hybrid_chunked"
            | "offloaded_hybrid"
            | "offloaded_hybrid_chunked" => CacheKind::Compiled,
            "quantized" | "paged" => CacheKind::Other,
            _ => return None,
        })
    }

    /// Why a cache of this kind is not budgeted (`None` where it is).
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            CacheKind::Dynamic | CacheKind::Offloaded => None,
            CacheKind::Compiled => Some(
                "generate allocates such a cache whole and compiles its decoding step on the \
                 GPU (torch.compile in mode reduce-overhead: CUDA graphs and their private pools), \
                 whose allocations are not emulated (traced on the H200, a 2-layer Llama's decode \
                 reserved 140 MB where its prefill took 40 MB: \
                 docs/gpu-runs/2026-12-04-h200-records/generate-small-llama-static.json.gz)",
            ),
            CacheKind::Other => {
                Some("its allocations (a quantized cache, or continuous batching's pages) are not emulated")
            }
        }
    }
}

/// `do_sample true, temperature 0.6, top_p 0.9`: the values it gives (`no value that changes
/// memory`).
pub fn described(d: &GenerationDefaults) -> String {
    let parts = [
        d.do_sample.map(|v| format!("do_sample {v}")),
        d.temperature.map(|v| format!("temperature {v}")),
        d.top_k.map(|v| format!("top_k {v}")),
        d.top_p.map(|v| format!("top_p {v}")),
        d.repetition_penalty
            .map(|v| format!("repetition_penalty {v}")),
        d.num_beams.map(|v| format!("num_beams {v}")),
        d.eos_tokens
            .filter(|&n| n > 1)
            .map(|n| format!("{n} end-of-sequence tokens")),
        (d.cache_implementation.as_ref()).map(|c| format!("cache_implementation {c}")),
    ];
    let given: Vec<String> = parts.into_iter().flatten().collect();
    match given.is_empty() {
        true => "no value that changes memory".into(),
        false => given.join(", "),
    }
}

/// The file's name in a model folder or repository.
pub const FILE: &str = "generation_config.json";

/// Reads a `generation_config.json`'s bytes (untrusted), `file` naming it in errors: each field
/// absent or `null` is no default; one of the wrong kind is refused, naming it.
pub fn parse(bytes: &[u8], file: &str) -> Result<GenerationDefaults, FolderError> {
    let bad = |message: String| FolderError::Generation {
        file: file.to_string(),
        message,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let fields = value
        .as_object()
        .ok_or_else(|| bad("not a JSON object".into()))?;
    let field = |key: &str| fields.get(key).filter(|v| !v.is_null());
    let decimal = |key: &str, ok: fn(&Decimal) -> bool, what: &str| match field(key) {
        None => Ok(None),
        Some(v) => v
            .as_number()
            .and_then(|n| n.to_string().parse::<Decimal>().ok())
            .filter(ok)
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be {what}, not {v}"))),
    };
    let whole = |key: &str| match field(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be a whole number, not {v}"))),
    };
    Ok(GenerationDefaults {
        do_sample: match field("do_sample") {
            None => None,
            Some(v) => Some(
                v.as_bool()
                    .ok_or_else(|| bad(format!("`do_sample` must be true or false, not {v}")))?,
            ),
        },
        temperature: decimal(
            "temperature",
            |t| t.is_sign_positive(),
            "a number of 0 or more",
        )?,
        top_k: whole("top_k")?,
        top_p: decimal("top_p", |p| p.is_sign_positive(), "a number of 0 or more")?,
        repetition_penalty: decimal(
            "repetition_penalty",
            |p| p.is_sign_positive(),
            "a number of 0 or more",
        )?,
        num_beams: whole("num_beams")?,
        eos_tokens: match field("eos_token_id") {
            None => None,
            Some(v) if v.is_u64() => Some(1),
            Some(serde_json::Value::Array(ids)) if ids.iter().all(|id| id.is_u64()) => {
                Some(ids.len() as u64)
            }
            Some(v) => {
                return Err(bad(format!(
                    "`eos_token_id` must be a token id or a list of them, not {v}"
                )))
            }
        },
        cache_implementation: match field("cache_implementation") {
            None => None,
            Some(v) => match v.as_str().filter(|c| CacheKind::of(c).is_some()) {
                Some(c) => Some(c.to_string()),
                None => {
                    return Err(bad(format!(
                        "`cache_implementation` must be one of transformers' caches (dynamic, \
                         offloaded, static, offloaded_static, sliding_window, hybrid, \
                         hybrid_chunked, offloaded_hybrid, offloaded_hybrid_chunked, quantized, \
                         paged), not {v}"
                    )))
                }
            },
        },
    })
}

/// The `generation_config.json` of a model folder, if it has one.
pub fn read(folder: &std::path::Path) -> Result<Option<GenerationDefaults>, FolderError> {
    let path = folder.join(FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = crate::files::read_capped(&path, crate::files::Input::ModelConfig)?;
    parse(&bytes, &path.display().to_string()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_config_gives_its_sampling_defaults() {
        // Llama 3.1 8B Instruct's, as shipped.
        let text = br#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001,
            128008, 128009], "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}"#;
        let d = parse(text, "g.json").unwrap();
        assert_eq!(d.do_sample, Some(true));
        assert_eq!(d.temperature, Some(Decimal::new(6, 1)));
        assert_eq!(d.top_p, Some(Decimal::new(9, 1)));
        assert_eq!(
            (d.top_k, d.num_beams, d.repetition_penalty),
            (None, None, None)
        );
        assert_eq!(d.eos_tokens, Some(3));
        assert!(described(&d).contains("3 end-of-sequence tokens"));
        for bad in [
            &br#"{"do_sample": "yes"}"#[..],
            br#"{"top_k": -1}"#,
            br#"{"temperature": "hot"}"#,
            br#"{"eos_token_id": [1, "two"]}"#,
            br#"[1]"#,
        ] {
            let e = parse(bad, "g.json").unwrap_err().to_string();
            assert!(e.contains("g.json"), "{e}");
        }
        assert_eq!(
            parse(br#"{"top_k": null}"#, "g.json").unwrap(),
            GenerationDefaults::default()
        );
    }

    #[test]
    fn a_generation_config_names_the_cache_generate_makes() {
        // Gemma 2's, as shipped: transformers 5.17 reads "hybrid" as a static cache, and compiles.
        let text = br#"{"bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1,
            107], "pad_token_id": 0, "transformers_version": "4.42.0.dev0"}"#;
        let d = parse(text, "g.json").unwrap();
        assert_eq!(d.cache_implementation.as_deref(), Some("hybrid"));
        assert!(described(&d).contains("cache_implementation hybrid"));
        let kind = |name: &str| CacheKind::of(name);
        assert_eq!(kind("hybrid"), Some(CacheKind::Compiled));
        assert_eq!(kind("static"), Some(CacheKind::Compiled));
        assert!(kind("static")
            .unwrap()
            .refusal()
            .unwrap()
            .contains("torch.compile"));
        assert_eq!(kind("offloaded"), Some(CacheKind::Offloaded));
        assert_eq!(kind("dynamic").and_then(CacheKind::refusal), None);
        assert!(kind("quantized").unwrap().refusal().is_some());
        for bad in [
            &br#"{"cache_implementation": "fast"}"#[..],
            br#"{"cache_implementation": 1}"#,
        ] {
            let e = parse(bad, "g.json").unwrap_err().to_string();
            assert!(
                e.contains("g.json") && e.contains("cache_implementation"),
                "{e}"
            );
        }
    }
}
