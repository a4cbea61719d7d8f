//! The distributable bundle: a zip with one top folder holding the notebooks, data files,
//! protocol, LICENSE and README, and a `MANIFEST.json` listing every member with its size and the
//! SHA-256 of every content file (the manifest declares itself without size or hash). Builds are
//! deterministic: same tree, byte-identical zip. Verification checks a zip or an extracted folder
//! against its manifest, rejects unsafe paths and links, and writes nothing.

use crate::files::{self, WriteError};
use crate::notebook::unstripped_cells;
use crate::sha256_hex;
use crate::status::{Classify, Status};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Component, Path};

pub const MANIFEST: &str = "MANIFEST.json";
pub const MANIFEST_SCHEMA: &str = "iteragpu-lab/manifest/v1";
/// The files shipped besides the notebooks, relative to the project root.
pub const CONTENT: [&str; 5] = [
    "LICENSE.txt",
    "README.md",
    "data/protocole-qualite.md",
    "data/resultats-bruts.csv",
    "data/tarifs-forfaits.csv",
];

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot read {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file} is shipped with outputs: {problems}; strip them first")]
    NotebookOutputs { file: String, problems: String },
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl Classify for BundleError {
    fn status(&self) -> Status {
        match self {
            BundleError::Io { .. } => Status::Failure,
            BundleError::NotebookOutputs { .. } | BundleError::Invalid { .. } => Status::DataError,
            BundleError::Write(e) => e.status(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestEntry {
    /// Path inside the top folder, with `/` separators.
    pub path: String,
    /// Size in bytes; `null` for the manifest itself.
    pub size: Option<u64>,
    /// SHA-256, lowercase hex; `null` for the manifest itself.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub schema: String,
    /// The archive's top folder.
    pub name: String,
    pub files: Vec<ManifestEntry>,
    pub note: String,
}

fn io(file: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |source| BundleError::Io {
        file: file.display().to_string(),
        source,
    }
}

/// Members (path inside the top folder, bytes) read from the project at `root`, sorted by path;
/// notebooks carrying outputs are refused.
pub fn collect(root: &Path) -> Result<Vec<(String, Vec<u8>)>, BundleError> {
    let mut members = Vec::new();
    for rel in CONTENT {
        let path = root.join(rel);
        members.push((rel.to_string(), std::fs::read(&path).map_err(io(&path))?));
    }
    let folder = root.join("notebooks");
    let mut notebooks: Vec<_> = std::fs::read_dir(&folder)
        .map_err(io(&folder))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ipynb"))
        .collect();
    notebooks.sort();
    for path in notebooks {
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let problems = unstripped_cells(&bytes).map_err(|e| BundleError::Invalid {
            file: path.display().to_string(),
            message: format!("not a notebook: {e}"),
        })?;
        if !problems.is_empty() {
            return Err(BundleError::NotebookOutputs {
                file: path.display().to_string(),
                problems: problems.join("; "),
            });
        }
        let name = path.file_name().expect("a file").to_string_lossy();
        members.push((format!("notebooks/{name}"), bytes));
    }
    members.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(members)
}

/// The manifest of `members` (sorted), ending with the manifest's own entry.
pub fn manifest(name: &str, members: &[(String, Vec<u8>)]) -> Manifest {
    let mut files: Vec<ManifestEntry> = members
        .iter()
        .map(|(path, bytes)| ManifestEntry {
            path: path.clone(),
            size: Some(bytes.len() as u64),
            sha256: Some(sha256_hex(bytes)),
        })
        .collect();
    files.push(ManifestEntry {
        path: MANIFEST.into(),
        size: None,
        sha256: None,
    });
    Manifest {
        schema: MANIFEST_SCHEMA.into(),
        name: name.into(),
        files,
        note: "MANIFEST.json lists itself without size or hash: they would refer to themselves."
            .into(),
    }
}

/// The zip bytes: every member and `manifest` under `name/`, in path order, with fixed time and
/// permissions.
pub fn zip_bytes(name: &str, members: &[(String, Vec<u8>)], manifest: &Manifest) -> Vec<u8> {
    let mut manifest_bytes = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    manifest_bytes.push(b'\n');
    let mut all: Vec<(&str, &[u8])> = members
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    all.push((MANIFEST, &manifest_bytes));
    all.sort_by(|a, b| a.0.cmp(b.0));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .last_modified_time(zip::DateTime::default())
        .unix_permissions(0o644);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, bytes) in all {
        zip.start_file(format!("{name}/{path}"), options)
            .expect("writing to memory");
        zip.write_all(bytes).expect("writing to memory");
    }
    zip.finish().expect("writing to memory").into_inner()
}

/// Builds the bundle of the project at `root` into a new file `output`.
pub fn build(root: &Path, name: &str, output: &Path) -> Result<Manifest, BundleError> {
    let members = collect(root)?;
    let manifest = manifest(name, &members);
    files::write_new_file(output, &zip_bytes(name, &members, &manifest))?;
    Ok(manifest)
}

/// What verification found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verification {
    pub target: String,
    pub name: String,
    /// Listed in the manifest, absent.
    pub missing: Vec<String>,
    /// Present, not listed.
    pub extra: Vec<String>,
    /// Present with another size or hash than listed.
    pub altered: Vec<String>,
    /// Absolute paths, `..` components, links, or members outside the top folder.
    pub rejected: Vec<String>,
}

impl Verification {
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

/// Why a member path is unsafe, if it is: empty, absolute, `..`, `.` or backslashes.
fn unsafe_path(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("empty path");
    }
    if path.starts_with('/') || path.contains('\\') || path.contains(':') {
        return Some("absolute or non-portable path");
    }
    if Path::new(path)
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Some("`..` or `.` component");
    }
    None
}

/// Verifies a zip file or an extracted folder (the top folder, or a folder holding only it).
pub fn verify(target: &Path) -> Result<Verification, BundleError> {
    let mut v = Verification {
        target: target.display().to_string(),
        ..Default::default()
    };
    let found = if target.is_dir() {
        read_folder(target, &mut v)?
    } else {
        read_zip(target, &mut v)?
    };
    let Some(manifest_bytes) = found.get(MANIFEST) else {
        v.missing.push(MANIFEST.into());
        return Ok(v);
    };
    let manifest: Manifest =
        serde_json::from_slice(manifest_bytes).map_err(|e| BundleError::Invalid {
            file: format!("{}/{MANIFEST}", v.name),
            message: e.to_string(),
        })?;
    let mut listed = BTreeMap::new();
    for e in &manifest.files {
        if let Some(why) = unsafe_path(&e.path) {
            v.rejected
                .push(format!("{} in the manifest: {why}", e.path));
        } else {
            listed.insert(e.path.clone(), e);
        }
    }
    for (path, entry) in &listed {
        match found.get(path) {
            None => v.missing.push(path.clone()),
            Some(_) if path == MANIFEST => {}
            Some(bytes) => {
                let size = bytes.len() as u64;
                let sha = sha256_hex(bytes);
                if entry.size != Some(size) || entry.sha256.as_deref() != Some(sha.as_str()) {
                    v.altered.push(format!(
                        "{path}: listed {} bytes sha256 {}, found {size} bytes sha256 {sha}",
                        entry.size.map_or("?".into(), |s| s.to_string()),
                        entry.sha256.as_deref().unwrap_or("?")
                    ));
                }
            }
        }
    }
    v.extra = found
        .keys()
        .filter(|p| !listed.contains_key(*p))
        .cloned()
        .collect();
    Ok(v)
}

/// Files of a zip under its single top folder; unsafe members are recorded, never extracted.
fn read_zip(path: &Path, v: &mut Verification) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    let invalid = |message: String| BundleError::Invalid {
        file: path.display().to_string(),
        message,
    };
    let mut zip = zip::ZipArchive::new(file).map_err(|e| invalid(e.to_string()))?;
    let mut found = BTreeMap::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| invalid(e.to_string()))?;
        let raw = entry.name().to_string();
        if let Some(why) = unsafe_path(raw.trim_end_matches('/')) {
            v.rejected.push(format!("{raw}: {why}"));
            continue;
        }
        if entry.unix_mode().is_some_and(|m| m & 0o170000 == 0o120000) {
            v.rejected.push(format!("{raw}: symbolic link"));
            continue;
        }
        if entry.is_dir() {
            continue;
        }
        let (top, rest) = raw.split_once('/').unwrap_or(("", raw.as_str()));
        if top.is_empty() || (!v.name.is_empty() && top != v.name) {
            v.rejected
                .push(format!("{raw}: outside the single top folder"));
            continue;
        }
        v.name = top.to_string();
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| invalid(format!("{raw}: {e}")))?;
        found.insert(rest.to_string(), bytes);
    }
    Ok(found)
}

/// Files of an extracted bundle; links are rejected and never followed.
fn read_folder(
    path: &Path,
    v: &mut Verification,
) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    let mut root = path.to_path_buf();
    if !root.join(MANIFEST).exists() {
        let subfolders: Vec<_> = std::fs::read_dir(path)
            .map_err(io(path))?
            .flatten()
            .filter(|e| e.path().join(MANIFEST).exists())
            .collect();
        if let [only] = subfolders.as_slice() {
            root = only.path();
        }
    }
    v.name = root
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let mut found = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
            let p = entry.path();
            let rel = p
                .strip_prefix(&root)
                .expect("below root")
                .to_string_lossy()
                .replace('\\', "/");
            let meta = std::fs::symlink_metadata(&p).map_err(io(&p))?;
            if meta.file_type().is_symlink() {
                v.rejected.push(format!("{rel}: symbolic link"));
            } else if meta.is_dir() {
                stack.push(p);
            } else {
                found.insert(rel, std::fs::read(&p).map_err(io(&p))?);
            }
        }
    }
    Ok(found)
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
        assert!(unsafe_path("C:\\x").is_some());
        assert!(unsafe_path("").is_some());
    }

    #[test]
    fn zip_is_deterministic_and_lists_itself_without_hash() {
        let members = vec![("a.txt".to_string(), b"alpha".to_vec())];
        let m = manifest("top", &members);
        assert_eq!(
            zip_bytes("top", &members, &m),
            zip_bytes("top", &members, &m)
        );
        assert_eq!(m.files.last().unwrap().path, MANIFEST);
        assert_eq!(m.files.last().unwrap().sha256, None);
    }
}
