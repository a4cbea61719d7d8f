//! Model presets: public configurations of well-known models (`data/modeles.csv`, one row per
//! model with the `config.json` it comes from), read into [`ModelShape`]s.

use super::shape::{AttentionKind, ModelShape};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The presets shipped with the program.
pub const BUILTIN_CSV: &str = include_str!("../../data/modeles.csv");
/// Where the shipped presets live in the repository.
pub const BUILTIN_FILE: &str = "data/modeles.csv";

/// One model of the presets file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preset {
    pub preset: String,
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub tied_embeddings: bool,
    pub attention_bias: bool,
    pub experts: u64,
    pub experts_per_token: u64,
    pub attention: AttentionKind,
    pub sliding_window: Option<u64>,
    pub max_context: u64,
    /// The published parameter count, where a source states it.
    pub parameters: Option<u64>,
    /// The public configuration the row comes from.
    pub source: String,
}

impl Preset {
    pub fn shape(&self) -> ModelShape {
        ModelShape {
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: self.intermediate,
            vocab: self.vocab,
            tied_embeddings: self.tied_embeddings,
            attention_bias: self.attention_bias,
            experts: self.experts,
            experts_per_token: self.experts_per_token,
            attention: self.attention,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    #[error("{file}, line {line}: {message}")]
    Invalid {
        file: String,
        line: u64,
        message: String,
    },
    #[error("{file}, line {line}: preset {preset:?} appears twice")]
    Duplicate {
        file: String,
        line: u64,
        preset: String,
    },
    #[error("unknown model preset {requested:?}; known: {}", known.join(", "))]
    Unknown {
        requested: String,
        known: Vec<String>,
    },
    #[error(transparent)]
    Read(#[from] crate::files::ReadError),
}

impl crate::status::Classify for PresetError {
    fn status(&self) -> crate::status::Status {
        match self {
            PresetError::Unknown { .. } => crate::status::Status::Usage,
            PresetError::Read(e) => e.status(),
            _ => crate::status::Status::DataError,
        }
    }
}

/// The presets of one file.
#[derive(Debug, Clone, Serialize)]
pub struct Presets {
    pub file: String,
    pub rows: Vec<Preset>,
}

impl Presets {
    /// The shipped presets.
    pub fn builtin() -> Presets {
        Self::parse(BUILTIN_CSV.as_bytes(), BUILTIN_FILE).expect("the shipped presets are valid")
    }

    /// The presets of `path` (same columns as the shipped file).
    pub fn load_file(path: &Path) -> Result<Presets, PresetError> {
        let bytes = crate::files::read_capped(path, crate::files::Input::Presets)?;
        Self::parse(&bytes, &path.display().to_string())
    }

    pub fn parse(bytes: &[u8], file: &str) -> Result<Presets, PresetError> {
        let mut reader = csv::Reader::from_reader(bytes);
        let mut rows: Vec<Preset> = Vec::new();
        for record in reader.deserialize::<Preset>() {
            let line = |e: &csv::Error| e.position().map_or(0, |p| p.line());
            let row = record.map_err(|e| PresetError::Invalid {
                file: file.into(),
                line: line(&e),
                message: match e.kind() {
                    csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
                    _ => e.to_string(),
                },
            })?;
            let line = rows.len() as u64 + 2;
            if rows.iter().any(|r| r.preset == row.preset) {
                return Err(PresetError::Duplicate {
                    file: file.into(),
                    line,
                    preset: row.preset,
                });
            }
            if let Err(e) = row.shape().validated() {
                return Err(PresetError::Invalid {
                    file: file.into(),
                    line,
                    message: format!("preset {}: {e}", row.preset),
                });
            }
            rows.push(row);
        }
        Ok(Presets {
            file: file.into(),
            rows,
        })
    }

    pub fn get(&self, preset: &str) -> Result<&Preset, PresetError> {
        self.rows
            .iter()
            .find(|r| r.preset == preset)
            .ok_or_else(|| PresetError::Unknown {
                requested: preset.into(),
                known: self.rows.iter().map(|r| r.preset.clone()).collect(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_presets_count_their_published_parameters() {
        let presets = Presets::builtin();
        assert!(presets.rows.len() >= 10);
        let mut checked = 0;
        for p in &presets.rows {
            // Only the architectures the formulas cover: Gemma-2 has four norms per layer and
            // DeepSeek-V2 latent attention with shared experts; both are refused by budgets.
            if p.attention != AttentionKind::Full {
                continue;
            }
            let published = p
                .parameters
                .expect("every covered preset has a published count");
            assert_eq!(p.shape().parameters(), published, "{}", p.preset);
            checked += 1;
        }
        assert!(checked >= 10, "{checked}");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let good = BUILTIN_CSV.lines().take(2).collect::<Vec<_>>().join("\n");
        let bad = good.replacen(",32,4096,", ",32,zero,", 1);
        let e = Presets::parse(bad.as_bytes(), "m.csv")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("m.csv, line 2:"), "{e}");
        let dup = format!("{good}\n{}", good.lines().nth(1).unwrap());
        let e = Presets::parse(dup.as_bytes(), "m.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "m.csv, line 3: preset \"llama-2-7b\" appears twice");
        let zero = good.replacen(",32,4096,32,32,", ",32,4096,32,0,", 1);
        let e = Presets::parse(zero.as_bytes(), "m.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "m.csv, line 2: preset llama-2-7b: kv_heads must be at least 1"
        );
        let e = Presets::builtin().get("llama-9").unwrap_err().to_string();
        assert!(e.contains("llama-2-7b"), "{e}");
    }
}
