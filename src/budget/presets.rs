//! Model presets: public configurations of well-known models (`data/modeles.csv`, one row per
//! model: its `model_type`, the fields of its `config.json` that change memory, and the
//! parameter count transformers gives for them), read into [`Model`]s.

use crate::model::{config, Model};
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
    pub model_type: String,
    /// The `config.json` fields, as JSON.
    pub config: String,
    pub max_context: u64,
    /// What `sum(p.numel() for p in model.parameters())` gives in transformers 5.17.
    pub parameters: u64,
    /// The public configuration the row comes from.
    pub source: String,
}

impl Preset {
    /// The row as the `config.json` it comes from (its fields and `model_type`).
    pub fn config_json(&self) -> Result<serde_json::Value, config::ConfigError> {
        let mut value: serde_json::Value = serde_json::from_str(&self.config)
            .map_err(|e| config::ConfigError::Invalid(format!("config: not JSON: {e}")))?;
        let object = value
            .as_object_mut()
            .ok_or_else(|| config::ConfigError::Invalid("config: not a JSON object".into()))?;
        object.insert("model_type".into(), self.model_type.clone().into());
        Ok(value)
    }

    /// The model of the row.
    pub fn model(&self) -> Result<Model, config::ConfigError> {
        config::from_value(&self.config_json()?)
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

    /// Reads a presets file: the columns of `data/modeles.csv`, at least one row, each preset
    /// named as it is typed after `--model` (lowercase letters, digits, `.`, `-`, `_`) and once,
    /// each parameter count the one its configuration gives. Errors name the file's line.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Presets, PresetError> {
        let invalid = |line: u64, message: String| PresetError::Invalid {
            file: file.into(),
            line,
            message,
        };
        // The line where what starts at a position begins, counted in the file itself: the csv
        // reader's own count, and its position, pass over blank lines.
        let line_at = |p: &csv::Position| {
            let from = usize::try_from(p.byte()).map_or(bytes.len(), |b| b.min(bytes.len()));
            let blank = bytes[from..]
                .iter()
                .take_while(|&&b| b == b'\n' || b == b'\r')
                .count();
            bytes[..from + blank]
                .iter()
                .filter(|&&b| b == b'\n')
                .count() as u64
                + 1
        };
        let position = |e: &csv::Error| e.position().map_or(0, line_at);
        let mut reader = csv::Reader::from_reader(bytes);
        let headers = reader
            .headers()
            .map_err(|e| invalid(position(&e), e.to_string()))?
            .clone();
        let mut rows: Vec<Preset> = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| invalid(position(&e), e.to_string()))?;
            let line = record.position().map_or(0, line_at);
            let row: Preset = record.deserialize(Some(&headers)).map_err(|e| {
                invalid(
                    line,
                    match e.kind() {
                        csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
                        _ => e.to_string(),
                    },
                )
            })?;
            let shown = crate::text::printable(&row.preset).to_string();
            let typed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
            if row.preset.is_empty() || !row.preset.chars().all(typed) {
                return Err(invalid(
                    line,
                    format!(
                        "preset name `{shown}`: lowercase letters, digits, `.`, `-` and `_` \
                         only, as it is typed after --model"
                    ),
                ));
            }
            if rows.iter().any(|r| r.preset == row.preset) {
                return Err(PresetError::Duplicate {
                    file: file.into(),
                    line,
                    preset: row.preset,
                });
            }
            let model = row
                .model()
                .map_err(|e| invalid(line, format!("preset {shown}: {e}")))?;
            let counted = model.parameter_count();
            if counted != row.parameters {
                return Err(invalid(
                    line,
                    format!(
                        "preset {shown}: parameters {} differs from the {counted} its \
                         configuration counts",
                        row.parameters,
                    ),
                ));
            }
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(invalid(1, "holds no preset".into()));
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
        assert!(presets.rows.len() >= 22);
        // The published counts (model cards, rounded as published): every row's exact count
        // rounds to it.
        let published = [
            ("llama-3.1-8b", 8.03),
            ("qwen3-8b", 8.19),
            ("qwen3-30b-a3b", 30.5),
            ("gemma-2-2b", 2.61),
            ("gemma-2-9b", 9.24),
            ("phi-3-mini", 3.82),
            ("mistral-small-24b", 23.6),
            ("llama-3.3-70b", 70.6),
            ("deepseek-v2-lite", 15.7),
            ("mixtral-8x7b", 46.7),
        ];
        for (name, billions) in published {
            let p = presets.get(name).unwrap();
            let n = p.model().unwrap().parameter_count();
            assert_eq!(n, p.parameters, "{name}");
            let digits = if billions >= 10.0 { 1 } else { 2 };
            let scale = 10f64.powi(digits);
            assert_eq!(
                ((n as f64 / 1e9) * scale).round() / scale,
                billions,
                "{name}: {n}"
            );
        }
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let good = BUILTIN_CSV.lines().take(2).collect::<Vec<_>>().join("\n");
        let bad = good.replacen(
            "\"\"num_hidden_layers\"\":32",
            "\"\"num_hidden_layers\"\":\"\"x\"\"",
            1,
        );
        let e = Presets::parse(bad.as_bytes(), "m.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.csv, line 2: preset llama-2-7b: `num_hidden_layers`"),
            "{e}"
        );
        let dup = format!("{good}\n{}", good.lines().nth(1).unwrap());
        let e = Presets::parse(dup.as_bytes(), "m.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "m.csv, line 3: preset \"llama-2-7b\" appears twice");
        let wrong = good.replacen(",6738415616,", ",6738415617,", 1);
        let e = Presets::parse(wrong.as_bytes(), "m.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("differs from the 6738415616"), "{e}");
        let e = Presets::builtin().get("llama-9").unwrap_err().to_string();
        assert!(e.contains("llama-2-7b"), "{e}");
    }
}
