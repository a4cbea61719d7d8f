//! Files in and out.
//!
//! Result files are written whole or not at all (temporary file in the same folder, then an atomic
//! rename that refuses to replace an existing file), so no partial or overwritten result can exist.
//! A file that is updated in place (the results grid) is replaced the same way, keeping its
//! permissions and any symbolic link that leads to it, and a read-only file is never replaced.
//!
//! Temporary files are named `.NAME.XXXXXXXXXXXXXXXX.iteragpu-tmp` (16 random letters and digits,
//! created with `O_EXCL`), so that [`remove_leftovers`] can recognise the ones a killed writer left
//! and never touches a file of the user's.
//!
//! Input files (catalog, measurement, grid, budget, presets...) are read by [`read_capped`]: only
//! regular files, and at most the size limit of their [`Input`] kind, so that `/dev/zero`, a named
//! pipe or a huge file given as an input is refused at once with a clear error naming the file's
//! role instead of exhausting memory or waiting forever. A JSON file tagged with its schema is read
//! and checked by [`load_tagged`], once for every kind.

use crate::status::{Classify, Status};
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The kinds of input file the programs read whole, each with its size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray)]
pub enum Input {
    /// A package catalog (`data/tarifs-forfaits.csv` is about 3 KiB): at most 16 MiB.
    Catalog,
    /// A measurement written by `mesure_memoire measure` (the recorded example is 5 KiB): at most
    /// 64 MiB.
    Measurement,
    /// The results grid (about 1 KiB a row): at most 256 MiB.
    Grid,
    /// A budget written by `mesure_memoire budget --output` (a few KiB): at most 64 MiB.
    Budget,
    /// Model presets with the columns of `data/modeles.csv` (a few KiB): at most 16 MiB.
    Presets,
    /// A GPU proof report (`data/hf-proof-*.json`, a few hundred KiB): at most 64 MiB.
    ProofReport,
    /// A model's `config.json` (a few KiB): at most 16 MiB.
    ModelConfig,
    /// A safetensors file's header (its 8-byte length and JSON; the tensors are never read):
    /// at most 100 MiB, the limit of Hugging Face's reader.
    SafetensorsHeader,
    /// A lesson record written by `mesure_memoire lesson` (about 100 KiB): at most 64 MiB.
    Lesson,
    /// A sweep's `sweep.csv` or `sweep.json` (about 1 KiB a point): at most 64 MiB.
    Sweep,
    /// The result file a GPU process writes at its exit (a few hundred bytes): at most 1 MiB.
    CompanionResult,
}

impl Input {
    /// Every kind, in the order of the README's "Limits on input sizes".
    pub const ALL: &'static [Input] = <Input as strum::VariantArray>::VARIANTS;

    /// The largest file of this kind that is read, in bytes.
    pub const fn limit(self) -> u64 {
        match self {
            Input::Catalog | Input::Presets | Input::ModelConfig => 16 << 20,
            Input::SafetensorsHeader => 100 << 20,
            Input::Measurement
            | Input::Budget
            | Input::ProofReport
            | Input::Lesson
            | Input::Sweep => 64 << 20,
            Input::Grid => 256 << 20,
            Input::CompanionResult => 1 << 20,
        }
    }

    /// What a file of this kind is called when it is refused as not being one.
    pub const fn document(self) -> &'static str {
        match self {
            Input::Measurement => "measurement file",
            Input::Grid => "results grid",
            kind => kind.name(),
        }
    }

    /// The kind's name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Input::Catalog => "catalog",
            Input::Measurement => "measurement",
            Input::Grid => "grid",
            Input::Budget => "budget file",
            Input::Presets => "model presets",
            Input::ModelConfig => "model configuration",
            Input::SafetensorsHeader => "safetensors header",
            Input::ProofReport => "GPU proof report",
            Input::Lesson => "lesson record",
            Input::Sweep => "sweep file",
            Input::CompanionResult => "GPU process result",
        }
    }
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an input file was not read. The OS error, when there is one, is the error's source, not
/// part of its message, so that a report printing the causes shows it once.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {kind} {}", path.display())]
    Io {
        kind: Input,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {kind} {}: it is {what}, not a regular file", path.display())]
    NotRegular {
        kind: Input,
        path: PathBuf,
        what: &'static str,
    },
    #[error(
        "cannot read {kind} {}: it is larger than {} MiB ({} bytes), the limit for a {kind}",
        path.display(),
        limit >> 20,
        limit
    )]
    TooLarge {
        kind: Input,
        path: PathBuf,
        limit: u64,
    },
}

impl Classify for ReadError {
    fn status(&self) -> Status {
        match self {
            ReadError::Io { .. } => Status::Failure,
            ReadError::NotRegular { .. } | ReadError::TooLarge { .. } => Status::DataError,
        }
    }
}

/// Reads the whole input file at `path` of kind `kind`: refused if it is not a regular file (a
/// named pipe, a device such as `/dev/zero`, a folder) or larger than [`Input::limit`].
pub fn read_capped(path: &Path, kind: Input) -> Result<Vec<u8>, ReadError> {
    read_limited(path, kind, kind.limit())
}

/// A JSON document tagged with its schema, read by [`load_tagged`].
pub trait Tagged: serde::de::DeserializeOwned {
    /// The schema tag its files carry (`iteragpu-lab/measurement/v1`).
    const SCHEMA: &'static str;
    /// What such a file is, in messages, and its size limit.
    const KIND: Input;
    /// The tag this document carries.
    fn schema(&self) -> &str;
}

/// Why a tagged JSON file was not read.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The file could not be read, is not a regular file, or is larger than its kind may be.
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{file} is not a {what}: {message}")]
    Invalid {
        file: String,
        what: &'static str,
        message: String,
    },
}

impl JsonError {
    /// `file` refused as a `kind`, with why.
    pub fn invalid(file: &str, kind: Input, message: impl Into<String>) -> JsonError {
        JsonError::Invalid {
            file: file.to_string(),
            what: kind.document(),
            message: message.into(),
        }
    }
}

impl Classify for JsonError {
    fn status(&self) -> Status {
        match self {
            JsonError::Read(e) => e.status(),
            JsonError::Invalid { .. } => Status::DataError,
        }
    }
}

/// Reads the tagged JSON file at `path` (within its kind's limit) and checks its tag.
pub fn load_tagged<T: Tagged>(path: &Path) -> Result<T, JsonError> {
    let bytes = read_capped(path, T::KIND)?;
    parse_tagged(&bytes, &path.display().to_string())
}

/// Parses tagged JSON bytes read from `file` and checks the tag.
pub fn parse_tagged<T: Tagged>(bytes: &[u8], file: &str) -> Result<T, JsonError> {
    let value: T = serde_json::from_slice(bytes)
        .map_err(|e| JsonError::invalid(file, T::KIND, e.to_string()))?;
    if value.schema() != T::SCHEMA {
        return Err(JsonError::invalid(
            file,
            T::KIND,
            format!(
                "schema `{}`, expected `{}`",
                crate::text::printable(value.schema()),
                T::SCHEMA
            ),
        ));
    }
    Ok(value)
}

/// Why [`read_regular`] refused a file.
#[derive(Debug)]
pub enum Refused {
    /// The system could not read it.
    Io(std::io::Error),
    /// It is not a regular file: what it is, in words (`a named pipe`, `a device`...).
    NotRegular(&'static str),
    /// It is larger than the limit.
    TooLarge,
}

/// Reads the whole regular file at `path`, at most `limit` bytes: a named pipe, a device or a
/// folder is refused before it is opened (and again once open, in case the path was replaced in
/// between), a larger file from its size, a file that grows while read by the cap.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, Refused> {
    let check = |meta: &std::fs::Metadata| match not_regular(meta) {
        Some(what) => Err(Refused::NotRegular(what)),
        None if meta.len() > limit => Err(Refused::TooLarge),
        None => Ok(()),
    };
    check(&std::fs::metadata(path).map_err(Refused::Io)?)?;
    let file = open_without_waiting(path).map_err(Refused::Io)?;
    check(&file.metadata().map_err(Refused::Io)?)?;
    read_at_most(file, limit)
        .map_err(Refused::Io)?
        .ok_or(Refused::TooLarge)
}

/// Opens the regular file at `path` for reading a part of it (a checkpoint's header): a named
/// pipe, a device or a folder is refused before it is opened and again once open, and opening
/// never waits for a writer.
pub fn open_regular(path: &Path, kind: Input) -> Result<(std::fs::File, u64), ReadError> {
    let refused = |what| ReadError::NotRegular {
        kind,
        path: path.to_path_buf(),
        what,
    };
    let io = |source| ReadError::Io {
        kind,
        path: path.to_path_buf(),
        source,
    };
    if let Some(what) = not_regular(&std::fs::metadata(path).map_err(io)?) {
        return Err(refused(what));
    }
    let file = open_without_waiting(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if let Some(what) = not_regular(&meta) {
        return Err(refused(what));
    }
    Ok((file, meta.len()))
}

/// Reads `reader` to its end, or `None` when it holds more than `limit` bytes (at most one byte
/// more is read: a file that grows while read, or a device, cannot exhaust memory).
pub fn read_at_most(reader: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader.take(limit + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// [`read_capped`] with an explicit limit in bytes.
fn read_limited(path: &Path, kind: Input, limit: u64) -> Result<Vec<u8>, ReadError> {
    let path_buf = || path.to_path_buf();
    read_regular(path, limit).map_err(|refused| match refused {
        Refused::Io(source) => ReadError::Io {
            kind,
            path: path_buf(),
            source,
        },
        Refused::NotRegular(what) => ReadError::NotRegular {
            kind,
            path: path_buf(),
            what,
        },
        Refused::TooLarge => ReadError::TooLarge {
            kind,
            path: path_buf(),
            limit,
        },
    })
}

/// What a file that is not a regular file is, in words; `None` for a regular file.
fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a folder");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a named pipe");
        }
        if t.is_char_device() || t.is_block_device() {
            return Some("a device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("a special file")
}

/// Opens `path` for reading; on Unix without waiting for a writer should it be a named pipe.
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Why a result file was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0} already exists: results are never overwritten; choose a new file name")]
    Exists(PathBuf),
    #[error("the folder {} of {} does not exist", folder_of(.0).display(), .0.display())]
    MissingFolder(PathBuf),
    #[error("{} cannot be written: {} is {what}, not a folder", .path.display(), folder_of(.path).display())]
    NotAFolder { path: PathBuf, what: &'static str },
    #[error("{0} is read-only: it is never replaced; make it writable to change it")]
    ReadOnly(PathBuf),
    #[error("cannot write {}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Classify for WriteError {
    fn status(&self) -> Status {
        match self {
            WriteError::Exists(_) => Status::OutputExists,
            WriteError::MissingFolder(_) | WriteError::NotAFolder { .. } => Status::Usage,
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

/// Checks that the folder `path` would be written in exists.
pub fn check_folder(path: &Path) -> Result<(), WriteError> {
    match std::fs::metadata(folder_of(path)) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) => Err(WriteError::NotAFolder {
            path: path.to_path_buf(),
            what: not_regular(&meta).unwrap_or("a file"),
        }),
        Err(_) => Err(WriteError::MissingFolder(path.to_path_buf())),
    }
}

/// Whether two new files' paths name the same file (`out.json` and `./out.json`): the same name
/// in the same folder, both folders existing.
pub fn same_destination(a: &Path, b: &Path) -> bool {
    let folder = |p: &Path| std::fs::canonicalize(folder_of(p)).ok();
    a.file_name() == b.file_name() && folder(a).is_some() && folder(a) == folder(b)
}

/// Checks, before any work is done, that `path` could be created: its folder exists and it does not.
pub fn check_new_file(path: &Path) -> Result<(), WriteError> {
    check_folder(path)?;
    if path.symlink_metadata().is_ok() {
        return Err(WriteError::Exists(path.to_path_buf()));
    }
    Ok(())
}

/// Writes `bytes` to a new file at `path`, atomically; an existing file is never replaced.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    check_new_file(path)?;
    let tmp = staged(path, bytes)?;
    let temporary = tmp.path().to_path_buf();
    let persisted = tmp.persist_noclobber(path);
    staging(&temporary, false);
    persisted.map_err(|e| {
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
    let temporary = tmp.path().to_path_buf();
    let persisted = fill(tmp, bytes)
        .map_err(io)
        .and_then(|tmp| tmp.persist(&target).map_err(|e| io(e.error)));
    staging(&temporary, false);
    persisted?;
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
    let tmp = temporary_beside(path).map_err(io)?;
    let temporary = tmp.path().to_path_buf();
    fill(tmp, bytes).map_err(|e| {
        staging(&temporary, false);
        io(e)
    })
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
/// recognisable (see [`remove_leftovers`]). It is created with `O_EXCL`: never an existing file,
/// and with the permissions the umask gives (0666 less the umask, as other tools create files).
fn temporary_beside(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o666))
        .prefix(&leftover_prefix(path))
        .rand_bytes(TEMPORARY_RANDOM)
        .suffix(TEMPORARY_SUFFIX)
        .tempfile_in(folder_of(path))?;
    staging(tmp.path(), true);
    Ok(tmp)
}

/// The temporary files being written, removed by [`remove_staged`] when the program is
/// interrupted (a file renamed into place, or dropped, is forgotten first).
static STAGED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Notes that the temporary file `path` is being written (`true`) or is no longer (`false`).
fn staging(path: &Path, written: bool) {
    if let Ok(mut staged) = STAGED.lock() {
        staged.retain(|p| p != path);
        if written {
            staged.push(path.to_path_buf());
        }
    }
}

/// Removes every temporary file still being written: what an interrupted program calls before
/// it exits, so that it leaves no partial file.
pub fn remove_staged() {
    if let Ok(staged) = STAGED.lock() {
        for p in staged.iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The longest file name the systems this runs on take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// The start of a temporary file's name: the file's name between dots, cut (on a character's
/// boundary) so that the whole temporary name stays within [`NAME_MAX`] bytes for any file name
/// that itself does.
fn leftover_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy());
    let room = NAME_MAX - 2 - TEMPORARY_RANDOM - TEMPORARY_SUFFIX.len();
    let mut end = name.len().min(room);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!(".{}.", &name[..end])
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
        assert_eq!(
            e.to_string(),
            "the folder /nonexistent-folder-igl of /nonexistent-folder-igl/x.json does not exist"
        );
        assert_eq!(e.status(), Status::Usage);
    }

    #[test]
    fn inputs_are_read_up_to_their_limit_and_not_a_byte_more() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.csv");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_limited(&p, Input::Catalog, 10).unwrap(), b"0123456789");
        let e = read_limited(&p, Input::Catalog, 9).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { limit: 9, .. }), "{e}");
        assert_eq!(e.status(), Status::DataError);
        assert_eq!(read_capped(&p, Input::Catalog).unwrap(), b"0123456789");
    }

    #[test]
    fn a_huge_input_is_refused_without_being_read() {
        let dir = tempfile::tempdir().unwrap();
        for &kind in Input::ALL {
            let p = dir.path().join(kind.name());
            // A sparse file: no disk space used, and refused from its size alone.
            std::fs::File::create(&p)
                .unwrap()
                .set_len(kind.limit() + 1)
                .unwrap();
            let e = read_capped(&p, kind).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, ReadError::TooLarge { .. }), "{text}");
            assert!(text.contains(&p.display().to_string()), "{text}");
            assert!(
                text.contains(&format!(
                    "{} MiB ({} bytes)",
                    kind.limit() >> 20,
                    kind.limit()
                )),
                "{text}"
            );
        }
        assert_eq!(Input::Catalog.limit(), 16 << 20);
        assert_eq!(Input::Measurement.limit(), 64 << 20);
        assert_eq!(Input::Grid.limit(), 256 << 20);
    }

    #[cfg(unix)]
    #[test]
    fn devices_pipes_and_folders_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.csv");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for (path, what) in [
            (Path::new("/dev/zero"), "a device"),
            (fifo.as_path(), "a named pipe"),
            (dir.path(), "a folder"),
        ] {
            let e = read_capped(path, Input::Grid).unwrap_err();
            assert_eq!(e.status(), Status::DataError);
            assert_eq!(
                e.to_string(),
                format!(
                    "cannot read grid {}: it is {what}, not a regular file",
                    path.display()
                )
            );
        }
    }

    #[test]
    fn a_missing_input_keeps_the_os_error_as_its_source_only() {
        use std::error::Error;
        let e = read_capped(Path::new("/nonexistent-igl/m.json"), Input::Measurement).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot read measurement /nonexistent-igl/m.json"
        );
        assert_eq!(e.status(), Status::Failure);
        assert!(e.source().unwrap().to_string().contains("os error 2"));
        let w = io_error(Path::new("x"), std::io::Error::from_raw_os_error(28));
        assert_eq!(w.to_string(), "cannot write x");
    }
}
