//! `MANIFEST.json`: every file of a bundle with its size, SHA-256 and whether it is executable, in
//! path order, then the manifest's own entry, without size or hash (they would refer to
//! themselves). It has one written form, [`Manifest::to_bytes`]; [`Manifest::parse`] accepts that
//! form only and checks every field, so that a manifest either says exactly what `build` would
//! have said or is refused.

use super::{unsafe_path, Member, MAX_CONTENT_BYTES, MAX_FILES, MAX_FILE_BYTES};
use crate::sha256_hex;
use serde::{Deserialize, Serialize};

/// The manifest's file name, at the top of the bundle.
pub const MANIFEST: &str = "MANIFEST.json";
/// The manifest's `schema` tag.
pub const MANIFEST_SCHEMA: &str = "iteragpu-lab/manifest/v2";
/// The manifest's `note`, always the same.
pub const NOTE: &str =
    "MANIFEST.json lists itself last, without size or hash: they would refer to themselves.";

/// One file of the bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Path inside the top folder, with `/` separators.
    pub path: String,
    /// Size in bytes; `null` for the manifest itself.
    pub size: Option<u64>,
    /// SHA-256, lowercase hex; `null` for the manifest itself.
    pub sha256: Option<String>,
    /// Whether the file is executable (mode 0755 in the zip, 0644 otherwise).
    pub executable: bool,
}

/// The whole manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_SCHEMA`].
    pub schema: String,
    /// The archive's top folder.
    pub name: String,
    /// The content files in path order, then the manifest's own entry.
    pub files: Vec<ManifestEntry>,
    /// Always [`NOTE`].
    pub note: String,
}

impl Manifest {
    /// The manifest of `members` (sorted by path) under the top folder `name`.
    pub fn of(name: &str, members: &[Member]) -> Manifest {
        let mut files: Vec<ManifestEntry> = members
            .iter()
            .map(|m| ManifestEntry {
                path: m.path.clone(),
                size: Some(m.bytes.len() as u64),
                sha256: Some(sha256_hex(&m.bytes)),
                executable: m.executable,
            })
            .collect();
        files.push(self_entry());
        Manifest {
            schema: MANIFEST_SCHEMA.into(),
            name: name.into(),
            files,
            note: NOTE.into(),
        }
    }

    /// The one written form: pretty JSON, fields in declaration order, a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        bytes.push(b'\n');
        bytes
    }

    /// The content files' entries: every entry but the manifest's own (the last one).
    pub fn content(&self) -> &[ManifestEntry] {
        &self.files[..self.files.len().saturating_sub(1)]
    }

    /// Reads a manifest found at the top of the folder `top`, accepting only what `build`
    /// writes: its written form byte for byte, the schema and note, the name `top`, content
    /// entries with safe paths, sizes and hashes in strictly increasing path order (so no path
    /// twice), within the bundle's limits, then the manifest's own entry, last, without size or
    /// hash. The error says which rule failed and for which entry.
    pub fn parse(bytes: &[u8], top: &str) -> Result<Manifest, String> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| format!("is not a manifest: {e}"))?;
        if manifest.schema != MANIFEST_SCHEMA {
            return Err(format!(
                "schema is `{}`, expected `{MANIFEST_SCHEMA}`",
                manifest.schema
            ));
        }
        if manifest.name != top {
            return Err(format!(
                "names the bundle `{}` but its top folder is `{top}`",
                manifest.name
            ));
        }
        if manifest.note != NOTE {
            return Err(format!("note is not the standard one: `{NOTE}`"));
        }
        match manifest.files.last() {
            Some(last) if *last == self_entry() => {}
            Some(last) if last.path == MANIFEST => {
                return Err(format!(
                    "lists {MANIFEST} with a size, a hash or as executable: it must list itself \
                     without size or hash (they would refer to themselves)"
                ))
            }
            _ => return Err(format!("does not list itself last ({MANIFEST})")),
        }
        let content = manifest.content();
        if content.len() >= MAX_FILES {
            return Err(format!(
                "lists {} files: a bundle holds at most {MAX_FILES}",
                content.len() + 1
            ));
        }
        let mut total = 0u64;
        for (i, entry) in content.iter().enumerate() {
            check_entry(entry)?;
            if let Some(previous) = i.checked_sub(1).map(|p| &content[p]) {
                if previous.path == entry.path {
                    return Err(format!("lists {} twice", entry.path));
                }
                if previous.path > entry.path {
                    return Err(format!(
                        "lists {} after {}: entries are in path order",
                        entry.path, previous.path
                    ));
                }
            }
            total += entry.size.unwrap_or(0);
        }
        if total > MAX_CONTENT_BYTES {
            return Err(format!(
                "lists {total} bytes in all, over the limit of {MAX_CONTENT_BYTES}"
            ));
        }
        if manifest.to_bytes() != bytes {
            return Err(
                "is not written in the one form build writes (pretty JSON, fields in order, \
                 a final newline)"
                    .into(),
            );
        }
        Ok(manifest)
    }
}

/// The manifest's own entry.
fn self_entry() -> ManifestEntry {
    ManifestEntry {
        path: MANIFEST.into(),
        size: None,
        sha256: None,
        executable: false,
    }
}

/// One content entry's own rules: a safe path other than the manifest's, a size within the
/// limit, a SHA-256 in lowercase hex.
fn check_entry(entry: &ManifestEntry) -> Result<(), String> {
    let path = &entry.path;
    if let Some(why) = unsafe_path(path) {
        return Err(format!("lists `{path}`: {why}"));
    }
    if path == MANIFEST {
        return Err(format!("lists {MANIFEST} twice"));
    }
    match entry.size {
        None => return Err(format!("lists {path} without a size")),
        Some(size) if size > MAX_FILE_BYTES => {
            return Err(format!(
                "lists {path} with {size} bytes, over the limit of {MAX_FILE_BYTES} for one file"
            ))
        }
        Some(_) => {}
    }
    match entry.sha256.as_deref() {
        Some(s) if crate::is_sha256_hex(s) => Ok(()),
        Some(s) => Err(format!(
            "lists {path} with the hash `{s}`, not a SHA-256 in lowercase hex"
        )),
        None => Err(format!("lists {path} without a hash")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let members = vec![
            Member::new("a.txt", b"alpha".to_vec(), false),
            Member::new("run", b"#!/bin/sh\n".to_vec(), true),
        ];
        Manifest::of("top", &members)
    }

    #[test]
    fn the_written_form_is_read_back_and_lists_itself_last_without_hash() {
        let m = sample();
        assert_eq!(Manifest::parse(&m.to_bytes(), "top").unwrap(), m);
        assert_eq!(m.files.last().unwrap(), &self_entry());
        assert_eq!(m.content().len(), 2);
        assert!(Manifest::parse(&m.to_bytes(), "other")
            .unwrap_err()
            .contains("top folder is `other`"));
    }

    #[test]
    fn every_field_is_checked() {
        let refused = |edit: &dyn Fn(&mut Manifest), why: &str| {
            let mut m = sample();
            edit(&mut m);
            let e = Manifest::parse(&m.to_bytes(), "top").unwrap_err();
            assert!(e.contains(why), "{e} lacks {why}");
        };
        refused(&|m| m.schema = "iteragpu-lab/manifest/v1".into(), "schema");
        refused(&|m| m.note = "trust me".into(), "note");
        refused(
            &|m| m.files[2].size = Some(3),
            "itself without size or hash",
        );
        refused(
            &|m| m.files[2].sha256 = Some("0".repeat(64)),
            "without size",
        );
        refused(&|m| drop(m.files.pop()), "does not list itself last");
        refused(&|m| m.files[1] = m.files[0].clone(), "lists a.txt twice");
        refused(&|m| m.files.swap(0, 1), "path order");
        refused(&|m| m.files[0].path = "../a.txt".into(), "`..`");
        refused(&|m| m.files[0].sha256 = Some("ABC".into()), "lowercase hex");
        refused(&|m| m.files[0].size = None, "without a size");
        refused(
            &|m| m.files[0].size = Some(MAX_FILE_BYTES + 1),
            "over the limit",
        );
        let m = sample();
        let mut compact = serde_json::to_vec(&m).unwrap();
        compact.push(b'\n');
        assert!(Manifest::parse(&compact, "top")
            .unwrap_err()
            .contains("one form"));
        let extra = String::from_utf8(m.to_bytes()).unwrap().replacen(
            "\"schema\"",
            "\"extra\": 1,\n  \"schema\"",
            1,
        );
        assert!(Manifest::parse(extra.as_bytes(), "top")
            .unwrap_err()
            .contains("unknown field"));
    }
}
