//! Result files: written whole or not at all (temporary file in the same folder, then an atomic
//! rename that refuses to replace an existing file), so no partial or overwritten result can exist.

use crate::status::{Classify, Status};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0} already exists: results are never overwritten; choose a new file name")]
    Exists(PathBuf),
    #[error("the folder of {0} does not exist")]
    MissingFolder(PathBuf),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Classify for WriteError {
    fn status(&self) -> Status {
        match self {
            WriteError::Exists(_) => Status::OutputExists,
            WriteError::MissingFolder(_) => Status::Usage,
            WriteError::Io { .. } => Status::Failure,
        }
    }
}

/// The folder a file will be written in ("" means the current directory).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks, before any work is done, that `path` could be created: its folder exists and it does not.
pub fn check_new_file(path: &Path) -> Result<(), WriteError> {
    if !folder_of(path).is_dir() {
        return Err(WriteError::MissingFolder(path.to_path_buf()));
    }
    if path.symlink_metadata().is_ok() {
        return Err(WriteError::Exists(path.to_path_buf()));
    }
    Ok(())
}

/// Writes `bytes` to a new file at `path`, atomically; an existing file is never replaced.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    check_new_file(path)?;
    staged(path, bytes)?.persist_noclobber(path).map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            WriteError::Exists(path.to_path_buf())
        } else {
            io_error(path, e.error)
        }
    })?;
    Ok(())
}

/// Replaces the content of `path` with `bytes` atomically: readers see the old file or the new
/// one, never a mix, and a killed writer leaves the old file intact.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    staged(path, bytes)?
        .persist(path)
        .map_err(|e| io_error(path, e.error))?;
    Ok(())
}

fn io_error(path: &Path, source: std::io::Error) -> WriteError {
    WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `bytes` written and flushed to disk in a temporary file beside `path`, ready to be renamed.
fn staged(path: &Path, bytes: &[u8]) -> Result<tempfile::NamedTempFile, WriteError> {
    let io = |source| io_error(path, source);
    let mut tmp = temporary_beside(path).map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    Ok(tmp)
}

/// A temporary file in the folder of `path`, named after it (`.NAME.XXXX.tmp`), so that a
/// leftover from a killed writer is recognisable (see [`remove_leftovers`]).
fn temporary_beside(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&leftover_prefix(path))
        .suffix(".tmp")
        .tempfile_in(folder_of(path))
}

fn leftover_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy());
    format!(".{name}.")
}

/// Removes temporary files a killed writer of `path` left behind. Call it only while holding the
/// lock that serialises writers of `path`.
pub fn remove_leftovers(path: &Path) {
    let prefix = leftover_prefix(path);
    let Ok(entries) = std::fs::read_dir(folder_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Pretty JSON with a final newline, written with [`write_new_file`].
pub fn write_new_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), WriteError> {
    let mut text = serde_json::to_vec_pretty(value).expect("result types serialize");
    text.push(b'\n');
    write_new_file(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_overwrite_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write_new_file(&p, b"first").unwrap();
        let e = write_new_file(&p, b"second").unwrap_err();
        assert!(matches!(e, WriteError::Exists(_)));
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn missing_folder_is_named() {
        let e = check_new_file(Path::new("/nonexistent-folder-igl/x.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-folder-igl/x.json"));
    }
}
