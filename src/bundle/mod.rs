//! The distributable bundle: a release that builds and runs on its own, in one zip.
//!
//! - [`contents`]: what ships ([`SHIPPED`]: both crates, the scripts, notebooks, data and docs),
//!   read from the project without following links or opening anything but regular files;
//! - [`manifest`]: `MANIFEST.json`, every file with its size, SHA-256 and execute bit, then itself
//!   without size or hash, in one written form;
//! - [`archive`]: the zip in one canonical form (stored members in path order, fixed time and
//!   modes) and its strict reader;
//! - [`verify`](mod@verify): a zip or an extracted folder against its manifest, accepting only what
//!   [`build`] writes, with bounded reading; nothing is written;
//! - [`extract`](mod@extract): a verified zip into a new folder, atomically;
//! - [`tree`]: reading a folder without trusting it;
//! - [`notebook`]: whether a notebook is stripped of its outputs, as it must be to ship.
//!
//! Builds are deterministic: the same tree gives the same bytes.

#![warn(missing_docs)]

pub mod archive;
pub mod contents;
pub mod extract;
pub mod manifest;
pub mod notebook;
pub mod tree;
pub mod verify;

pub use contents::{collect, Member, SHIPPED};
pub use extract::extract;
pub use manifest::{Manifest, ManifestEntry, MANIFEST, MANIFEST_SCHEMA};
pub use verify::{verify, Verification};

use crate::files::{self, WriteError};
use crate::status::{Classify, Status};
use std::path::{Component, Path};

/// The most bytes one shipped file may hold: `build` refuses more, `verify` stops there.
pub const MAX_FILE_BYTES: u64 = 32 << 20;
/// The most bytes all shipped files may hold together.
pub const MAX_CONTENT_BYTES: u64 = 64 << 20;
/// The most files a bundle holds, its manifest included.
pub const MAX_FILES: usize = 4096;
/// The longest path inside the zip, top folder included, in bytes.
pub const MAX_PATH_BYTES: usize = 255;
/// The most bytes a bundle's zip may take: the content, the manifest and two headers of at most
/// 76 + 2 × [`MAX_PATH_BYTES`] bytes per file fit with room to spare. `verify` holds the zip and
/// its canonical rewrite in memory, so it never needs much more than twice this.
pub const MAX_ARCHIVE_BYTES: u64 = MAX_CONTENT_BYTES + (8 << 20);

/// Why a bundle could not be built, verified or extracted; the message names the file or member.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Reading `file` failed for a reason the program could not foresee (exit 1).
    #[error("cannot read {file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// A notebook to ship carries outputs (exit 65).
    #[error("{file} is shipped with outputs: {problems}; strip them first")]
    NotebookOutputs {
        /// The notebook.
        file: String,
        /// Each offending cell or field.
        problems: String,
    },
    /// A file, member or manifest is not what a bundle accepts (exit 65).
    #[error("{file}: {message}")]
    Invalid {
        /// The file (for a member, the zip; the message names the member).
        file: String,
        /// What is wrong, naming the member or entry.
        message: String,
    },
    /// A file is larger than a bundle reads (exit 65).
    #[error("{file}: larger than {limit} bytes, the most a bundle reads")]
    TooLarge {
        /// The file.
        file: String,
        /// The limit it passed, in bytes.
        limit: u64,
    },
    /// The bundle's name is not one plain folder name (exit 64).
    #[error("invalid bundle name `{name}`: {message}")]
    Name {
        /// The name given.
        name: String,
        /// Why it is refused.
        message: String,
    },
    /// A zip to extract does not match its manifest (exit 65); nothing was written.
    #[error("{file} does not match its manifest; nothing extracted\n{report}")]
    NotVerified {
        /// The zip.
        file: String,
        /// The verification's report.
        report: String,
    },
    /// Writing the zip or the extracted folder failed, or would overwrite (exit 4).
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl BundleError {
    /// Reading `file` failed.
    pub fn io(file: &Path, source: std::io::Error) -> BundleError {
        BundleError::Io {
            file: file.display().to_string(),
            source,
        }
    }

    /// `file` is not what a bundle accepts, and `message` says why.
    pub fn invalid(file: &Path, message: impl Into<String>) -> BundleError {
        BundleError::Invalid {
            file: file.display().to_string(),
            message: message.into(),
        }
    }
}

impl Classify for BundleError {
    fn status(&self) -> Status {
        match self {
            BundleError::Io { .. } => Status::Failure,
            BundleError::NotebookOutputs { .. }
            | BundleError::Invalid { .. }
            | BundleError::TooLarge { .. }
            | BundleError::NotVerified { .. } => Status::DataError,
            BundleError::Name { .. } => Status::Usage,
            BundleError::Write(e) => e.status(),
        }
    }
}

/// Checks a bundle's name, its top folder and default file name: one path component of ASCII
/// letters, digits, `.`, `_` and `-`, not starting with `.` or `-`, at most 100 characters. So
/// `../x`, `/x`, `a/b` and the empty name are refused, and `NAME.zip` stays in the current folder.
pub fn check_name(name: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() {
        Err("empty".into())
    } else if name.len() > 100 {
        Err("longer than 100 characters".into())
    } else if name.starts_with(['.', '-']) {
        Err("starts with `.` or `-`".into())
    } else if let Some(c) = name.chars().find(|c| !allowed(*c)) {
        Err(format!(
            "`{}` is not allowed: one folder name of letters, digits, `.`, `_` and `-`",
            c.escape_default()
        ))
    } else {
        Ok(name.to_string())
    }
}

/// Why a member path is unsafe, if it is: empty, too long, absolute, with `..` or `.`
/// components, backslashes, colons or control characters.
pub fn unsafe_path(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("empty path");
    }
    if path.len() > MAX_PATH_BYTES {
        return Some("path longer than 255 bytes");
    }
    if path.starts_with('/') || path.contains(['\\', ':']) {
        return Some("absolute or non-portable path");
    }
    if path.chars().any(char::is_control) {
        return Some("control character in the path");
    }
    if path.split('/').any(|c| c.is_empty())
        || Path::new(path)
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Some("`..`, `.` or empty component");
    }
    None
}

/// The canonical zip of `members` and their manifest under the top folder `name`.
pub fn zip_bytes(name: &str, members: &[Member], manifest: &Manifest) -> Vec<u8> {
    let manifest_bytes = manifest.to_bytes();
    let mut entries: Vec<archive::Entry> = members
        .iter()
        .map(|m| archive::Entry {
            path: &m.path,
            bytes: &m.bytes,
            executable: m.executable,
        })
        .collect();
    entries.push(archive::Entry {
        path: MANIFEST,
        bytes: &manifest_bytes,
        executable: false,
    });
    archive::write(name, &entries)
}

/// Builds the bundle of the project at `root` under the top folder `name` into a new file
/// `output`, written atomically and never over an existing file.
pub fn build(root: &Path, name: &str, output: &Path) -> Result<Manifest, BundleError> {
    check_name(name).map_err(|message| BundleError::Name {
        name: name.into(),
        message,
    })?;
    files::check_new_file(output)?;
    let members = collect(root)?;
    let manifest = Manifest::of(name, &members);
    files::write_new_file(output, &zip_bytes(name, &members, &manifest))?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_paths_are_named() {
        assert_eq!(unsafe_path("data/a.csv"), None);
        assert!(unsafe_path("/etc/passwd").is_some());
        assert!(unsafe_path("a/../../x").is_some());
        assert!(unsafe_path("./a").is_some());
        assert!(unsafe_path("a//b").is_some());
        assert!(unsafe_path("a/").is_some());
        assert!(unsafe_path("C:\\x").is_some());
        assert!(unsafe_path("a\nb").is_some());
        assert!(unsafe_path("").is_some());
        assert!(unsafe_path(&"a".repeat(256)).is_some());
    }

    #[test]
    fn names_are_one_plain_folder_name() {
        assert!(check_name("iteragpu-lab-0.1.0").is_ok());
        for bad in [
            "", "../x", "/tmp/x", "a/b", ".", "..", ".hidden", "-x", "a b", "é",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn zip_is_deterministic_and_read_back_in_its_canonical_form() {
        let members = vec![Member::new("a.txt", b"alpha".to_vec(), false)];
        let m = Manifest::of("top", &members);
        let zip = zip_bytes("top", &members, &m);
        assert_eq!(zip, zip_bytes("top", &members, &m));
        let found = archive::read(&zip, MAX_FILE_BYTES, MAX_FILES).unwrap();
        let names: Vec<_> = found.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["top/MANIFEST.json", "top/a.txt"]);
        assert_eq!(found[0].bytes, m.to_bytes());
    }
}
