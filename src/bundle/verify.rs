//! Verification of a bundle, a zip or an extracted folder, against its manifest. Nothing is
//! written. A zip is accepted only in the one form `build` writes: after its layout is read
//! strictly ([`archive::read`]) and its files agree with the manifest, the canonical archive is
//! written again in memory and must equal the file byte for byte. A folder must hold exactly the
//! manifest's files with their sizes, hashes and execute bits, and nothing else; links and
//! non-regular files are reported, never followed nor opened. Reading is bounded: the zip and each
//! file are capped (see the limits in [`super`]), members are never inflated, files are hashed in
//! pieces.

use super::archive::{self, Entry, Found};
use super::tree::{self, Kind};
use super::{
    check_name, unsafe_path, BundleError, Manifest, MANIFEST, MAX_ARCHIVE_BYTES, MAX_CONTENT_BYTES,
    MAX_FILES, MAX_FILE_BYTES,
};
use crate::sha256_hex;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What verification found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verification {
    /// The zip or folder verified, as given.
    pub target: String,
    /// The bundle's top folder.
    pub name: String,
    /// Listed in the manifest, absent.
    pub missing: Vec<String>,
    /// Present, not listed.
    pub extra: Vec<String>,
    /// Present with another size, hash or execute bit than listed.
    pub altered: Vec<String>,
    /// Absolute paths, `..` components, links, non-regular files, members outside the top folder.
    pub rejected: Vec<String>,
}

impl Verification {
    /// Whether the bundle is exactly what its manifest says.
    pub fn ok(&self) -> bool {
        self.missing.is_empty()
            && self.extra.is_empty()
            && self.altered.is_empty()
            && self.rejected.is_empty()
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ok() {
            return write!(
                f,
                "{}: every file matches MANIFEST.json ({})",
                self.target, self.name
            );
        }
        writeln!(f, "{}: does NOT match its manifest", self.target)?;
        for (what, list) in [
            ("missing", &self.missing),
            ("extra", &self.extra),
            ("altered", &self.altered),
            ("rejected", &self.rejected),
        ] {
            for item in list {
                writeln!(f, "  {what:<8} {item}")?;
            }
        }
        Ok(())
    }
}

/// A file found in the bundle: its size, hash and execute bit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    size: u64,
    sha256: String,
    executable: bool,
}

impl Seen {
    /// The manifest's own entry: neither size nor hash is compared.
    fn manifest(executable: bool) -> Seen {
        Seen {
            size: 0,
            sha256: String::new(),
            executable,
        }
    }
}

/// Verifies a zip file or an extracted folder (the top folder, or a folder holding only it).
pub fn verify(target: &Path) -> Result<Verification, BundleError> {
    if target.is_dir() {
        verify_folder(target)
    } else {
        verify_zip(target).map(|(v, _)| v)
    }
}

/// A zip's bytes and where its files lie in them, kept for extraction.
pub(super) struct ZipBundle {
    /// The whole archive.
    pub bytes: Vec<u8>,
    /// Its files, the manifest included, in archive order.
    pub files: Vec<ZipFile>,
}

/// One file of a zip bundle.
pub(super) struct ZipFile {
    /// Path inside the top folder.
    pub path: String,
    /// Where its bytes lie in the archive.
    pub range: Range<usize>,
    /// Whether its mode is 0755.
    pub executable: bool,
}

/// Verifies the zip at `path`; also returns its bytes for extraction.
pub(super) fn verify_zip(path: &Path) -> Result<(Verification, ZipBundle), BundleError> {
    let mut v = Verification {
        target: path.display().to_string(),
        ..Default::default()
    };
    // The zip itself may be reached through a link the user chose; its members may not be links.
    let real = std::fs::canonicalize(path).map_err(|e| BundleError::io(path, e))?;
    let bytes = tree::read_regular(&real, MAX_ARCHIVE_BYTES)?;
    let members = archive::read(&bytes, MAX_FILE_BYTES, MAX_FILES)
        .map_err(|message| BundleError::invalid(path, message))?;
    let mut seen = BTreeMap::new();
    let mut files = Vec::new();
    for m in &members {
        let raw = archive::shown(&m.name);
        if let Some(why) = unsafe_path(m.name.trim_end_matches('/')) {
            v.rejected.push(format!("{raw}: {why}"));
            continue;
        }
        if m.is_link() {
            v.rejected.push(format!("{raw}: symbolic link"));
            continue;
        }
        if m.name.ends_with('/') {
            v.rejected
                .push(format!("{raw}: a folder entry (build writes files only)"));
            continue;
        }
        let (top, rest) = m.name.split_once('/').unwrap_or(("", m.name.as_str()));
        if top.is_empty() || (!v.name.is_empty() && top != v.name) || check_name(top).is_err() {
            v.rejected
                .push(format!("{raw}: outside the single top folder"));
            continue;
        }
        v.name = top.to_string();
        let seen_file = Seen {
            size: m.bytes.len() as u64,
            sha256: sha256_hex(m.bytes),
            executable: m.mode & 0o111 != 0,
        };
        files.push(ZipFile {
            path: rest.to_string(),
            range: m.data_at..m.data_at + m.bytes.len(),
            executable: seen_file.executable,
        });
        seen.insert(rest.to_string(), seen_file);
    }
    let manifest_bytes = files
        .iter()
        .find(|f| f.path == MANIFEST)
        .map(|f| &bytes[f.range.clone()]);
    let manifest = manifest_of(&mut v, manifest_bytes)?;
    if let Some(manifest) = &manifest {
        compare(&mut v, &seen, manifest);
    }
    if v.ok() {
        same_as_canonical(path, &v.name, &bytes, &members, &files)?;
    }
    Ok((v, ZipBundle { bytes, files }))
}

/// The manifest, checked, or `None` with `MANIFEST.json` reported missing.
fn manifest_of(
    v: &mut Verification,
    bytes: Option<&[u8]>,
) -> Result<Option<Manifest>, BundleError> {
    let Some(bytes) = bytes else {
        v.missing.push(MANIFEST.into());
        return Ok(None);
    };
    Manifest::parse(bytes, &v.name)
        .map(Some)
        .map_err(|message| BundleError::Invalid {
            file: v.target.clone(),
            message: format!("{}/{MANIFEST} {message}", v.name),
        })
}

/// The archive `build` would write for these files must be the archive read, byte for byte:
/// this refuses every difference the layout walk does not look at (times, versions, flags,
/// attributes, checksums, order).
fn same_as_canonical(
    path: &Path,
    name: &str,
    bytes: &[u8],
    members: &[Found],
    files: &[ZipFile],
) -> Result<(), BundleError> {
    let entries: Vec<Entry> = files
        .iter()
        .map(|f| Entry {
            path: &f.path,
            bytes: &bytes[f.range.clone()],
            executable: f.executable,
        })
        .collect();
    let canonical = archive::write(name, &entries);
    if canonical == bytes {
        return Ok(());
    }
    let at = canonical
        .iter()
        .zip(bytes)
        .position(|(a, b)| a != b)
        .unwrap_or(canonical.len().min(bytes.len()));
    let place = archive::member_at(members, at).unwrap_or("the end record");
    Err(BundleError::invalid(
        path,
        format!(
            "{place}: the archive differs from the one form build writes from byte {at} \
             (time, flags, attributes, checksum or order)"
        ),
    ))
}

/// Files, sizes, hashes and execute bits against the manifest.
fn compare(v: &mut Verification, seen: &BTreeMap<String, Seen>, manifest: &Manifest) {
    let listed: BTreeMap<&str, _> = manifest
        .content()
        .iter()
        .map(|e| (e.path.as_str(), e))
        .collect();
    for (path, entry) in &listed {
        let Some(found) = seen.get(*path) else {
            v.missing.push(path.to_string());
            continue;
        };
        if entry.size != Some(found.size) || entry.sha256.as_deref() != Some(&found.sha256) {
            v.altered.push(format!(
                "{path}: listed {} bytes sha256 {}, found {} bytes sha256 {}",
                entry.size.unwrap_or(0),
                entry.sha256.as_deref().unwrap_or("?"),
                found.size,
                found.sha256
            ));
        } else if entry.executable != found.executable {
            let mode = |x: bool| if x { "executable" } else { "not executable" };
            v.altered.push(format!(
                "{path}: listed {}, found {}",
                mode(entry.executable),
                mode(found.executable)
            ));
        }
    }
    if seen.get(MANIFEST).is_some_and(|m| m.executable) {
        v.altered.push(format!(
            "{MANIFEST}: listed not executable, found executable"
        ));
    }
    v.extra.extend(
        seen.keys()
            .filter(|p| *p != MANIFEST && !listed.contains_key(p.as_str()))
            .map(|p| archive::shown(p)),
    );
}

/// Verifies an extracted folder without writing to it.
fn verify_folder(target: &Path) -> Result<Verification, BundleError> {
    let root = top_folder(target)?;
    let real = std::fs::canonicalize(&root).map_err(|e| BundleError::io(&root, e))?;
    let mut v = Verification {
        target: target.display().to_string(),
        name: real
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned()),
        ..Default::default()
    };
    let mut seen = BTreeMap::new();
    let mut folders = Vec::new();
    let mut total = 0u64;
    for node in tree::walk(&root, |_| false)? {
        match node.kind {
            Kind::Link => v
                .rejected
                .push(format!("{}: symbolic link", archive::shown(&node.rel))),
            Kind::Other => v.rejected.push(format!(
                "{}: not a regular file (a named pipe, socket or device)",
                archive::shown(&node.rel)
            )),
            Kind::Folder => folders.push(node.rel),
            Kind::File { executable } if node.rel == MANIFEST => {
                seen.insert(node.rel, Seen::manifest(executable));
            }
            Kind::File { executable } => {
                let (size, sha256) = tree::hash_regular(&node.path, MAX_FILE_BYTES)?;
                total += size;
                if total > MAX_CONTENT_BYTES {
                    return Err(BundleError::invalid(
                        target,
                        format!(
                            "holds more than {MAX_CONTENT_BYTES} bytes, the most a bundle holds"
                        ),
                    ));
                }
                let found = Seen {
                    size,
                    sha256,
                    executable,
                };
                seen.insert(node.rel, found);
            }
        }
    }
    let manifest_bytes = match seen.get(MANIFEST) {
        Some(_) => Some(tree::read_regular(&root.join(MANIFEST), MAX_FILE_BYTES)?),
        None => None,
    };
    let manifest = manifest_of(&mut v, manifest_bytes.as_deref())?;
    if let Some(manifest) = &manifest {
        compare(&mut v, &seen, manifest);
        let holding: BTreeSet<&str> = manifest
            .files
            .iter()
            .flat_map(|e| e.path.match_indices('/').map(|(i, _)| &e.path[..i]))
            .collect();
        v.extra.extend(
            folders
                .iter()
                .filter(|f| !holding.contains(f.as_str()))
                .map(|f| format!("{}/", archive::shown(f))),
        );
        v.extra.sort();
    }
    Ok(v)
}

/// The bundle's top folder: `target` if it holds the manifest, else the one folder `target`
/// holds, if it holds nothing else.
fn top_folder(target: &Path) -> Result<PathBuf, BundleError> {
    if tree::kind_of(&target.join(MANIFEST)).is_ok() {
        return Ok(target.to_path_buf());
    }
    let entries: Vec<_> = std::fs::read_dir(target)
        .map_err(|e| BundleError::io(target, e))?
        .take(2)
        .collect::<Result<_, _>>()
        .map_err(|e| BundleError::io(target, e))?;
    match entries.as_slice() {
        [only] if tree::kind_of(&only.path())? == Kind::Folder => Ok(only.path()),
        _ => Err(BundleError::invalid(
            target,
            format!("holds no {MANIFEST}, nor only one folder (an extracted bundle's top folder)"),
        )),
    }
}
