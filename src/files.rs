//! Result files: written whole or not at all (temporary file in the same folder, then an atomic
//! rename that refuses to replace an existing file), so no partial or overwritten result can exist.
//! A file that is updated in place (the results grid) is replaced the same way, keeping its
//! permissions and any symbolic link that leads to it, and a read-only file is never replaced.
//!
//! Temporary files are named `.NAME.XXXXXXXXXXXXXXXX.iteragpu-tmp` (16 random letters and digits,
//! created with `O_EXCL`), so that [`remove_leftovers`] can recognise the ones a killed writer left
//! and never touches a file of the user's.

use crate::status::{Classify, Status};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0} already exists: results are never overwritten; choose a new file name")]
    Exists(PathBuf),
    #[error("the folder of {0} does not exist")]
    MissingFolder(PathBuf),
    #[error("{0} is read-only: it is never replaced; make it writable to change it")]
    ReadOnly(PathBuf),
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
            WriteError::ReadOnly(_) | WriteError::Io { .. } => Status::Failure,
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

/// Replaces the content of the existing file `path` with `bytes` atomically: readers see the old
/// file or the new one, never a mix, and a killed writer leaves the old file intact. A symbolic
/// link is followed (the link stays a link and its target gets the content); the file's
/// permissions are kept (and, where allowed, its group); a file without write permission is
/// refused with [`WriteError::ReadOnly`], never replaced.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let io = |source| io_error(path, source);
    let target = std::fs::canonicalize(path).map_err(io)?;
    let metadata = std::fs::metadata(&target).map_err(io)?;
    if !metadata.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    refuse_read_only(path, &target, &metadata)?;
    let tmp = temporary_beside(&target).map_err(io)?;
    keep_owner_and_mode(tmp.as_file(), &metadata).map_err(io)?;
    let tmp = fill(tmp, bytes).map_err(io)?;
    tmp.persist(&target).map_err(|e| io(e.error))?;
    // Make the rename itself durable; a folder that cannot be synced only loses that guarantee.
    if let Ok(folder) = std::fs::File::open(folder_of(&target)) {
        let _ = folder.sync_all();
    }
    Ok(())
}

/// Refuses a file whose permissions forbid writing: no write bit at all (which root would
/// otherwise ignore), or no write permission for this user.
fn refuse_read_only(
    path: &Path,
    target: &Path,
    metadata: &std::fs::Metadata,
) -> Result<(), WriteError> {
    let denied = metadata.permissions().readonly()
        || std::fs::OpenOptions::new()
            .write(true)
            .open(target)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if denied {
        return Err(WriteError::ReadOnly(path.to_path_buf()));
    }
    Ok(())
}

/// Gives the replacement the permissions of the file it replaces, and its group where this user
/// may set it (the owner cannot change without privileges: the replacement belongs to the writer).
fn keep_owner_and_mode(file: &std::fs::File, metadata: &std::fs::Metadata) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let _ = std::os::unix::fs::fchown(file, None, Some(metadata.gid()));
    }
    file.set_permissions(metadata.permissions())
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
    fill(temporary_beside(path).map_err(io)?, bytes).map_err(io)
}

/// `tmp` with `bytes` written and flushed to disk.
fn fill(
    mut tmp: tempfile::NamedTempFile,
    bytes: &[u8],
) -> std::io::Result<tempfile::NamedTempFile> {
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    Ok(tmp)
}

/// The fixed end of every temporary file's name.
const TEMPORARY_SUFFIX: &str = ".iteragpu-tmp";
/// How many random letters and digits a temporary file's name holds.
const TEMPORARY_RANDOM: usize = 16;

/// A new temporary file in the folder of `path`, named after it
/// (`.NAME.XXXXXXXXXXXXXXXX.iteragpu-tmp`), so that a leftover from a killed writer is
/// recognisable (see [`remove_leftovers`]). It is created with `O_EXCL`: never an existing file.
fn temporary_beside(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&leftover_prefix(path))
        .rand_bytes(TEMPORARY_RANDOM)
        .suffix(TEMPORARY_SUFFIX)
        .tempfile_in(folder_of(path))
}

fn leftover_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy());
    format!(".{name}.")
}

/// Whether `name` is exactly the name of a temporary file [`temporary_beside`] makes for a file
/// whose leftovers start with `prefix`.
fn is_temporary_name(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(TEMPORARY_SUFFIX))
        .is_some_and(|random| {
            random.len() == TEMPORARY_RANDOM && random.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// Removes the temporary files a killed writer of `path` left behind: regular files named exactly
/// as [`temporary_beside`] names them, nothing else. Call it only while holding the lock that
/// serialises writers of `path`.
pub fn remove_leftovers(path: &Path) {
    let prefix = leftover_prefix(path);
    let Ok(entries) = std::fs::read_dir(folder_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|name| is_temporary_name(name, &prefix));
        if ours && entry.file_type().is_ok_and(|t| t.is_file()) {
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
    fn leftovers_are_only_our_own_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.csv");
        std::fs::write(&p, b"old").unwrap();
        let ours = temporary_beside(&p).unwrap().keep().unwrap().1;
        let name = ours.file_name().unwrap().to_str().unwrap().to_string();
        assert!(is_temporary_name(&name, ".g.csv."), "{name}");
        let users = [
            ".g.csv.backup.tmp",
            ".g.csv.notes.iteragpu-tmp",
            ".g.csv.ABCDEFGHIJKLMNOPQ.iteragpu-tmp",
            "g.csv.ABCDEFGHIJKLMNOP.iteragpu-tmp",
        ];
        for user in users {
            std::fs::write(dir.path().join(user), b"mine").unwrap();
        }
        remove_leftovers(&p);
        assert!(!ours.exists());
        for user in users {
            assert!(dir.path().join(user).exists(), "{user} was removed");
        }
    }

    #[cfg(unix)]
    #[test]
    fn replacing_keeps_links_and_permissions_and_refuses_read_only_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.csv");
        std::fs::write(&target, b"old").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("link.csv");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        replace_file(&link, b"new").unwrap();
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o640);
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o444)).unwrap();
        let e = replace_file(&link, b"newer").unwrap_err();
        assert!(matches!(e, WriteError::ReadOnly(_)), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn missing_folder_is_named() {
        let e = check_new_file(Path::new("/nonexistent-folder-igl/x.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-folder-igl/x.json"));
    }
}
