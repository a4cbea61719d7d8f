//! A budget file read back (`calcul_forfaits --fit`): untrusted input, none of whose figures is
//! believed. Its structure and bounds are checked, then its workload is budgeted again and the
//! file must say exactly what that budget says.

use super::compute::{budget, Budget};
use super::settings::{BudgetSettings, MAX_RESERVE_BYTES};
use super::terms::Place;
use super::workload::Workload;
use crate::files::JsonError;
use crate::stack::process::Kernels;

/// A budget file as read, untrusted: its structure and bounds checked, none of its figures
/// believed yet ([`BudgetFile::verify`] gives the budget the planner takes).
#[derive(Debug)]
pub struct BudgetFile {
    file: String,
    value: serde_json::Value,
    checkpoint: Option<crate::model::folder::Checkpoint>,
    workload: Workload,
    settings: BudgetSettings,
}

impl BudgetFile {
    /// Parses budget bytes: the schema, no control character in any text, a model and a workload
    /// within every bound a `config.json` and the command line keep, kernels that are an
    /// architecture's, the outside memory this version ships, a reserve within
    /// [`MAX_RESERVE_BYTES`].
    pub fn parse(bytes: &[u8], file: &str) -> Result<BudgetFile, JsonError> {
        let invalid =
            |message: String| JsonError::invalid(file, crate::files::Input::Budget, message);
        let b: Budget = crate::files::parse_tagged(bytes, file)?;
        // Text the budget prints comes from the file: none may reach a terminal as a control.
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if let Some((pointer, c)) = crate::text::first_unsafe_in_json(&value) {
            return Err(invalid(format!(
                "`{pointer}` holds the control character {}",
                c.escape_unicode()
            )));
        }
        let workload = b
            .workload
            .clone()
            .validated()
            .map_err(|e| invalid(format!("workload: {e}")))?;
        if b.parameters != workload.model.parameter_count() {
            return Err(invalid("parameters: not the model's count".into()));
        }
        let cc = crate::allocator::workspace::KNOWN_ARCHITECTURES
            .into_iter()
            .find(|&cc| {
                let multiprocessors = b.kernels.reduction_grid.multiprocessors;
                multiprocessors > 0
                    && Kernels::for_gpu(cc).with_multiprocessors(multiprocessors) == b.kernels
            })
            .ok_or_else(|| {
                invalid(
                    "kernels: not the workspaces of an architecture PyTorch 2.11 runs on".into(),
                )
            })?;
        let reserve = b
            .terms
            .iter()
            .find(|t| t.place == Place::Reserve)
            .map_or(0, |t| t.bytes.0);
        if reserve > MAX_RESERVE_BYTES {
            return Err(invalid(format!(
                "terms: a reserve of {reserve} B, above 2^50 B (1 PiB)"
            )));
        }
        let settings = BudgetSettings {
            kernels: b.kernels,
            ..BudgetSettings::for_gpu(cc, reserve)
        };
        if b.outside != settings.outside {
            return Err(invalid(
                "outside: not the measurement of what lives outside the allocator that this \
                 version ships"
                    .into(),
            ));
        }
        Ok(BudgetFile {
            file: file.to_string(),
            value,
            checkpoint: b.checkpoint,
            workload,
            settings,
        })
    }

    /// The file's workload, within every bound.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The workload budgeted again; the file must say exactly what that budget says (a file
    /// edited, or written by another version of the replay, is refused, naming the first field
    /// that differs). The budget returned is the one computed here, with the programs the
    /// planner replays.
    pub fn verify(self) -> Result<Budget, JsonError> {
        let again = Budget {
            checkpoint: self.checkpoint,
            ..budget(&self.workload, &self.settings)
        };
        let computed = serde_json::to_value(&again).expect("a budget serializes");
        match first_difference(&self.value, &computed, String::new()) {
            None => Ok(again),
            Some(pointer) => Err(JsonError::invalid(
                &self.file,
                crate::files::Input::Budget,
                format!(
                    "`{pointer}` is not what this version computes for the file's workload \
                     (edited, or written by another version): budget it again with \
                     `mesure_memoire budget --output`"
                ),
            )),
        }
    }
}

/// The JSON pointer of the first place where `a` and `b` differ, if any.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let here = format!("{at}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => {
                        if let Some(d) = first_difference(p, q, here) {
                            return Some(d);
                        }
                    }
                    _ => return Some(here),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if let Some(d) = first_difference(p, q, format!("{at}/{i}")) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| format!("{at}/{}", x.len().min(y.len())))
        }
        _ => (a != b).then_some(if at.is_empty() { "/".into() } else { at }),
    }
}

impl Budget {
    /// Reads a budget written by `mesure_memoire budget --output`: [`BudgetFile::parse`], then
    /// [`BudgetFile::verify`].
    pub fn load(path: &std::path::Path) -> Result<Budget, JsonError> {
        let bytes = crate::files::read_capped(path, crate::files::Input::Budget)?;
        BudgetFile::parse(&bytes, &path.display().to_string())?.verify()
    }
}
