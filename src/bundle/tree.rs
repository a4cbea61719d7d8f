//! Reading a folder for a bundle, the project to ship or an extracted bundle, without trusting it:
//! links are reported and never followed, named pipes, sockets and devices are reported and never
//! opened (so nothing can block), and every file is read or hashed up to a limit, so that neither
//! `build` nor `verify` can be made to hang or to read without bound.

use super::{BundleError, MAX_FILES};
use rustix::fs::OFlags;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What an entry of a folder is, read without following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File {
        /// Whether any execute bit is set.
        executable: bool,
    },
    /// A folder.
    Folder,
    /// A symbolic link: never followed.
    Link,
    /// A named pipe, socket or device: never opened.
    Other,
}

/// One entry below the folder walked.
#[derive(Debug, Clone)]
pub struct Node {
    /// Path relative to the folder walked, with `/` separators.
    pub rel: String,
    /// Path on disk.
    pub path: PathBuf,
    /// What it is.
    pub kind: Kind,
}

/// What an entry is, from its own metadata (a link is not followed).
pub fn kind_of(path: &Path) -> Result<Kind, BundleError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| BundleError::io(path, e))?;
    let kind = meta.file_type();
    Ok(if kind.is_symlink() {
        Kind::Link
    } else if kind.is_dir() {
        Kind::Folder
    } else if kind.is_file() {
        Kind::File {
            executable: meta.permissions().mode() & 0o111 != 0,
        }
    } else {
        Kind::Other
    })
}

/// Every entry below `folder`, sorted by relative path, links and other non-regular entries
/// included (as such) but never entered. Names for which `skip` is true are left out, with
/// everything below them. More than [`MAX_FILES`] entries is an error.
pub fn walk(folder: &Path, skip: fn(&str) -> bool) -> Result<Vec<Node>, BundleError> {
    let mut nodes = Vec::new();
    let mut pending = vec![(folder.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| BundleError::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| BundleError::io(&dir, e))?;
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                return Err(BundleError::invalid(&path, "the name is not UTF-8"));
            };
            if skip(&name) {
                continue;
            }
            let rel = format!("{prefix}{name}");
            let kind = kind_of(&path)?;
            if kind == Kind::Folder {
                pending.push((path.clone(), format!("{rel}/")));
            }
            nodes.push(Node { rel, path, kind });
            if nodes.len() > 2 * MAX_FILES {
                return Err(BundleError::invalid(
                    folder,
                    format!(
                        "more than {} entries: a bundle holds at most {MAX_FILES} files",
                        2 * MAX_FILES
                    ),
                ));
            }
        }
    }
    nodes.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(nodes)
}

/// Opens a regular file for reading without following a link at its last component and without
/// blocking: a named pipe, socket or device is refused before anything is read from it.
pub fn open_regular(path: &Path) -> Result<File, BundleError> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, rustix::fs::Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::LOOP {
            BundleError::invalid(path, "a symbolic link: links are never followed")
        } else {
            BundleError::io(path, e.into())
        }
    })?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| BundleError::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular(path));
    }
    Ok(file)
}

/// The error for a named pipe, socket or device where a file was expected.
pub fn not_regular(path: &Path) -> BundleError {
    BundleError::invalid(
        path,
        "not a regular file (a named pipe, socket or device): never read",
    )
}

/// The bytes of the regular file at `path`, refused beyond `limit` bytes (nothing more is read).
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, BundleError> {
    crate::files::read_at_most(open_regular(path)?, limit)
        .map_err(|e| BundleError::io(path, e))?
        .ok_or_else(|| BundleError::TooLarge {
            file: path.display().to_string(),
            limit,
        })
}

/// Size and SHA-256 (lowercase hex) of the regular file at `path`, read in pieces; refused beyond
/// `limit` bytes.
pub fn hash_regular(path: &Path, limit: u64) -> Result<(u64, String), BundleError> {
    let mut reader = open_regular(path)?.take(limit + 1);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = reader
            .read(&mut buffer)
            .map_err(|e| BundleError::io(path, e))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buffer[..n]);
    }
    if size > limit {
        return Err(BundleError::TooLarge {
            file: path.display().to_string(),
            limit,
        });
    }
    Ok((size, format!("{:x}", hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_up_to_their_limit_and_links_never() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.txt");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_regular(&file, 4),
            Err(BundleError::TooLarge { limit: 4, .. })
        ));
        assert_eq!(hash_regular(&file, 5).unwrap().0, 5);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(kind_of(&link).unwrap(), Kind::Link);
        let e = read_regular(&link, 5).unwrap_err().to_string();
        assert!(e.contains("link") && e.contains("never followed"), "{e}");
    }
}
