//! A model as its user has it on disk: a `config.json`, or the folder that holds it with the
//! checkpoint's safetensors files. The headers alone give every tensor's dtype and bytes (an
//! 8-byte length, then JSON; no tensor data is read); they are untrusted input: the header's
//! size capped, every tensor's dtype known, its bytes equal to its shape's, the offsets
//! contiguous and within the file, the shards an index names present.

use super::{config, Model};
use crate::files::{read_capped, Input};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Why a model's files were refused: the file, and the field or tensor.
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error(transparent)]
    Read(#[from] crate::files::ReadError),
    #[error("{file}: {source}")]
    Config {
        file: String,
        source: config::ConfigError,
    },
    #[error("{0} holds no config.json")]
    NoConfig(String),
    #[error("{file}: {message}")]
    Checkpoint { file: String, message: String },
    /// A `generation_config.json` refused: its field and why.
    #[error("{file}: {message}")]
    Generation { file: String, message: String },
    #[error("cannot read {file}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

impl crate::status::Classify for FolderError {
    fn status(&self) -> crate::status::Status {
        match self {
            FolderError::Read(e) => e.status(),
            FolderError::Io { .. } => crate::status::Status::Failure,
            _ => crate::status::Status::DataError,
        }
    }
}

/// What a checkpoint's headers say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// The safetensors files read (their headers only).
    pub files: Vec<String>,
    pub tensors: u64,
    /// Elements of every tensor.
    pub elements: u64,
    /// Bytes of the tensors as stored, by dtype (`BF16`, `U8`…).
    pub bytes_by_dtype: BTreeMap<String, u64>,
    pub bytes: u64,
}

/// The most shards an index may name.
pub const MAX_SHARDS: usize = 4096;

/// Reads the model at `path` (a `config.json`, or a folder with one).
pub fn read(path: &Path) -> Result<Model, FolderError> {
    read_with_checkpoint(path).map(|(m, _)| m)
}

/// Reads the model at `path` and, in a folder, its checkpoint's headers.
pub fn read_with_checkpoint(path: &Path) -> Result<(Model, Option<Checkpoint>), FolderError> {
    let (config_path, folder) = if path.is_dir() {
        let c = path.join("config.json");
        if !c.exists() {
            return Err(FolderError::NoConfig(path.display().to_string()));
        }
        (c, Some(path.to_path_buf()))
    } else {
        (path.to_path_buf(), None)
    };
    let bytes = read_capped(&config_path, Input::ModelConfig)?;
    let model = parse_config(&bytes, &config_path.display().to_string())?;
    let checkpoint = match folder {
        Some(f) => checkpoint(&f)?,
        None => None,
    };
    Ok((model, checkpoint))
}

/// The checkpoint of a folder: `model.safetensors`, or the shards `model.safetensors.index.json`
/// names; `None` without either.
pub fn checkpoint(folder: &Path) -> Result<Option<Checkpoint>, FolderError> {
    let single = folder.join("model.safetensors");
    let index = folder.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.exists() {
        let bytes = read_capped(&index, Input::ModelConfig)?;
        let file = index.display().to_string();
        let bad = |message: String| FolderError::Checkpoint {
            file: file.clone(),
            message,
        };
        let shards = shard_names(&bytes).map_err(bad)?;
        let mut paths = Vec::new();
        for s in shards {
            let p = folder.join(&s);
            if !p.exists() {
                return Err(bad(format!(
                    "shard {} is missing",
                    crate::text::printable(&s)
                )));
            }
            paths.push(p);
        }
        paths
    } else if single.exists() {
        vec![single]
    } else {
        return Ok(None);
    };
    let mut c = Checkpoint::empty();
    for f in files {
        header(&f, &mut c)?;
        c.files.push(
            f.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        );
    }
    Ok(Some(c))
}

/// The shards a `model.safetensors.index.json` names (untrusted): file names of the same folder,
/// sorted, each once, at most [`MAX_SHARDS`].
pub fn shard_names(index: &[u8]) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(index).map_err(|e| format!("not JSON: {e}"))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| "`weight_map` is missing or not an object".to_string())?;
    let mut shards: Vec<String> = Vec::new();
    for (tensor, shard) in map {
        let shard = shard.as_str().ok_or_else(|| {
            format!(
                "weight_map[{}]: not a file name",
                crate::text::printable(tensor)
            )
        })?;
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(format!(
                "shard `{}` is not a file of the folder",
                crate::text::printable(shard)
            ));
        }
        if !shards.iter().any(|s| s == shard) {
            shards.push(shard.to_string());
        }
    }
    if shards.len() > MAX_SHARDS {
        return Err(format!("{} shards, more than {MAX_SHARDS}", shards.len()));
    }
    shards.sort();
    Ok(shards)
}

/// A `config.json`'s bytes read as a model transformers can build, `file` naming it in errors.
pub fn parse_config(bytes: &[u8], file: &str) -> Result<Model, FolderError> {
    config::parse(bytes)
        .and_then(|m| m.check_runnable().map(|()| m))
        .map_err(|source| FolderError::Config {
            file: file.to_string(),
            source,
        })
}

impl Checkpoint {
    /// No file read yet.
    pub fn empty() -> Checkpoint {
        Checkpoint {
            files: Vec::new(),
            tensors: 0,
            elements: 0,
            bytes_by_dtype: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// Adds the tensors of one safetensors header (its JSON, untrusted) once every tensor is
    /// checked against the `data_len` bytes that follow the header in its file: a known dtype,
    /// bytes equal to its shape's, offsets contiguous from 0 to `data_len`.
    pub fn add_header(&mut self, header: &[u8], data_len: u64) -> Result<(), String> {
        let meta: safetensors::tensor::Metadata =
            serde_json::from_slice(header).map_err(|e| format!("header: {e}"))?;
        // (start, end, name, dtype, elements)
        let mut spans: Vec<(u64, u64, String, String, u64)> = Vec::new();
        for (name, info) in meta.tensors() {
            let shown = crate::text::printable(&name).to_string();
            let elements = info
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
                .ok_or_else(|| format!("tensor {shown}: its shape overflows"))?;
            let bytes = elements
                .checked_mul(info.dtype.size() as u64)
                .ok_or_else(|| format!("tensor {shown}: its size overflows"))?;
            let (start, end) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
            if end < start || end - start != bytes {
                return Err(format!(
                    "tensor {shown}: offsets {start}..{end} do not hold its {bytes} bytes"
                ));
            }
            spans.push((start, end, shown, format!("{:?}", info.dtype), elements));
        }
        spans.sort();
        let mut at = 0u64;
        for (start, end, name, _, _) in &spans {
            if *start != at {
                return Err(format!(
                    "tensor {name}: starts at {start}, not at {at} (overlapping or a gap)"
                ));
            }
            at = *end;
        }
        if at != data_len {
            return Err(format!(
                "its tensors end {at} bytes after the header, the file holds {data_len}"
            ));
        }
        // Contiguous within the file: every sum below is at most the file's length.
        for (start, end, _, dtype, elements) in spans {
            let by_dtype = self.bytes_by_dtype.entry(dtype).or_default();
            *by_dtype = by_dtype.saturating_add(end - start);
            self.bytes = self.bytes.saturating_add(end - start);
            self.elements = self.elements.saturating_add(elements);
            self.tensors += 1;
        }
        Ok(())
    }

    /// What the checkpoint says of the model the config describes: equal element counts, or
    /// how far apart they are (a quantized or a different checkpoint), and which the budget
    /// counts.
    pub fn agreement(&self, model: &Model) -> String {
        match self.elements == super::prequantized::checkpoint_elements(model) {
            true => self.stored(model),
            false => format!(
                "{}: the budget counts the config's model",
                self.stored(model)
            ),
        }
    }

    /// What the checkpoint's tensors store, against the parameters the config describes.
    pub fn stored(&self, model: &Model) -> String {
        let params = model.parameter_count();
        let expected = super::prequantized::checkpoint_elements(model);
        let dtypes: Vec<String> = self
            .bytes_by_dtype
            .iter()
            .map(|(d, b)| format!("{} B in {d}", crate::units::grouped(*b)))
            .collect();
        let held = format!(
            "the checkpoint ({} in {} file{}) holds {} tensors, {} elements ({})",
            self.files.join(", "),
            self.files.len(),
            if self.files.len() == 1 { "" } else { "s" },
            crate::units::grouped(self.tensors),
            crate::units::grouped(self.elements),
            dtypes.join(", ")
        );
        if let Some(q) = model.quantization.filter(|_| expected != params) {
            format!(
                "{held}{} the {} elements the config's {} parameters take saved in {}",
                if self.elements == expected {
                    ":"
                } else {
                    ", where"
                },
                crate::units::grouped(expected),
                crate::units::grouped(params),
                q.described()
            )
        } else if self.elements == params {
            format!(
                "{held}: the {} parameters the config describes",
                crate::units::grouped(params)
            )
        } else {
            format!(
                "{held}, where the config describes {} parameters",
                crate::units::grouped(params)
            )
        }
    }
}

/// Reads one safetensors file's header into `c`.
fn header(path: &Path, c: &mut Checkpoint) -> Result<(), FolderError> {
    let file = path.display().to_string();
    let bad = |message: String| FolderError::Checkpoint {
        file: file.clone(),
        message,
    };
    let io = |source| FolderError::Io {
        file: file.clone(),
        source,
    };
    let (mut f, len) = crate::files::open_regular(path, Input::SafetensorsHeader)?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| bad("shorter than its 8-byte header length".into()))?;
    let n = u64::from_le_bytes(n);
    let limit = Input::SafetensorsHeader.limit();
    if n > limit || n.checked_add(8).is_none_or(|end| end > len) {
        return Err(bad(format!(
            "header length {n} is larger than the file ({len} bytes) or than {limit}"
        )));
    }
    let mut text = vec![0u8; usize::try_from(n).expect("a header within its limit")];
    f.read_exact(&mut text).map_err(io)?;
    c.add_header(&text, len - 8 - n).map_err(bad)
}
