//! Something a notebook shows, and where it comes from: measured just now on this machine, or,
//! when nothing could be measured here, read from a recording made on another machine and
//! labelled so (in the words of [`crate::markup::labels`]), or neither, with why. One type for a
//! measurement, a sweep and a lesson; each one's views live beside its other HTML.

use crate::markup::labels;
use std::fmt::Display;
use std::path::{Path, PathBuf};

/// Where a shown value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Measured just now on this machine.
    Here,
    /// Read from `file`, recorded on another machine, because nothing was measured here (`why`).
    Recorded { file: PathBuf, why: String },
}

/// A value to show, with its origin; `value` is `None` when nothing was measured here and the
/// recording could not be read either (`missing` says why).
#[derive(Debug, Clone)]
pub struct Shown<T> {
    pub value: Option<T>,
    pub origin: Origin,
    /// Why the recording could not be read, when it could not.
    pub missing: Option<String>,
}

impl<T> Shown<T> {
    /// A value measured just now on this machine.
    pub fn here(value: T) -> Shown<T> {
        Shown {
            value: Some(value),
            origin: Origin::Here,
            missing: None,
        }
    }

    /// The value `measured` holds, else the one recorded in `file` (read by `load`), labelled as
    /// recorded elsewhere with why nothing was measured here.
    pub fn or_recorded<E: Display, L: Display>(
        measured: Result<T, E>,
        file: &Path,
        load: impl FnOnce(&Path) -> Result<T, L>,
    ) -> Shown<T> {
        match measured {
            Ok(value) => Shown::here(value),
            Err(why) => Shown::recorded(file, why.to_string(), load),
        }
    }

    /// The value recorded in `file` (read by `load`), shown because nothing was measured here
    /// (`why`); when the file cannot be read, nothing is shown and both reasons are said.
    pub fn recorded<L: Display>(
        file: &Path,
        why: String,
        load: impl FnOnce(&Path) -> Result<T, L>,
    ) -> Shown<T> {
        let (value, missing) = match load(file) {
            Ok(v) => (Some(v), None),
            Err(e) => (
                None,
                Some(format!(
                    "The recording made elsewhere ({}) cannot be shown: {e}.",
                    file.display()
                )),
            ),
        };
        Shown {
            value,
            origin: Origin::Recorded {
                file: file.to_path_buf(),
                why,
            },
            missing,
        }
    }

    /// The recorded file, when the value was not measured here.
    pub fn recorded_file(&self) -> Option<&Path> {
        match &self.origin {
            Origin::Here => None,
            Origin::Recorded { file, .. } => Some(file),
        }
    }

    /// Why nothing was measured here, when nothing was.
    pub fn not_measured(&self) -> Option<&str> {
        match &self.origin {
            Origin::Here => None,
            Origin::Recorded { why, .. } => Some(why),
        }
    }

    /// Where the figures were measured, in words: "measured just now on this machine", or the
    /// recorded-elsewhere label and the file.
    pub fn whence(&self) -> String {
        match &self.origin {
            Origin::Here => "measured just now on this machine".to_string(),
            Origin::Recorded { file, .. } => format!(
                "{} ({}), not measured on this machine",
                labels::RECORDED_ELSEWHERE,
                file.display()
            ),
        }
    }

    /// The value, or what the notebook shows instead (why nothing was measured here, and why the
    /// recording could not be shown).
    pub fn value_or_why(&self) -> Result<&T, String> {
        self.value.as_ref().ok_or_else(|| {
            let mut why = String::new();
            if let Some(w) = self.not_measured() {
                why = format!("{} {w}. ", labels::NO_GPU);
            }
            why + self.missing.as_deref().unwrap_or("Nothing to show.")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_says_where_it_comes_from() {
        let here = Shown::or_recorded(Ok::<u32, String>(3), Path::new("r.json"), |_| {
            Err::<u32, String>("unused".into())
        });
        assert_eq!(here.value, Some(3));
        assert_eq!(here.whence(), "measured just now on this machine");
        let recorded = Shown::or_recorded(Err::<u32, _>("no GPU"), Path::new("r.json"), |_| {
            Ok::<u32, String>(4)
        });
        assert_eq!(recorded.value, Some(4));
        assert!(recorded.whence().starts_with(labels::RECORDED_ELSEWHERE));
        assert_eq!(recorded.not_measured(), Some("no GPU"));
        let missing = Shown::or_recorded(Err::<u32, _>("no GPU"), Path::new("r.json"), |_| {
            Err::<u32, String>("absent".into())
        });
        let why = missing.value_or_why().unwrap_err();
        assert!(why.contains("no GPU") && why.contains("absent"), "{why}");
    }
}
