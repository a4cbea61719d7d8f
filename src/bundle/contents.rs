//! What a bundle ships: the one list, [`SHIPPED`], of the files and folders that make a release
//! that builds and runs on its own (both crates' sources and lock file, the scripts behind the
//! README's two commands, the notebooks and what they read, the data and the docs the README
//! cites), and reading them from a project tree without trusting it: links and non-regular files
//! are refused, never followed or opened, each file and the whole are capped, and notebooks must
//! carry no outputs.

use super::notebook::unstripped_cells;
use super::tree::{self, Kind};
use super::{unsafe_path, BundleError, MANIFEST, MAX_CONTENT_BYTES, MAX_FILES, MAX_FILE_BYTES};
use std::path::Path;

/// What a release ships, relative to the project root: a file, or with a final `/` a folder and
/// everything below it except hidden names (starting with `.`: checkpoints, locks, temporary
/// files) and `__pycache__`. A test keeps this list equal to the files git tracks.
pub const SHIPPED: [&str; 17] = [
    ".ci/run",
    ".gitignore",
    "ARCHITECTURE.md",
    "Cargo.lock",
    "Cargo.toml",
    "LICENSE.txt",
    "README.md",
    "SECURITY.md",
    "build.rs",
    "data/",
    "docs/",
    "examples/",
    "notebooks/",
    "scripts/",
    "src/",
    "tests/",
    "torch/",
];

/// Whether a name inside a shipped folder is left out.
fn left_out(name: &str) -> bool {
    name.starts_with('.') || name == "__pycache__"
}

/// A file to ship.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Path inside the top folder, with `/` separators.
    pub path: String,
    /// The content.
    pub bytes: Vec<u8>,
    /// Whether any execute bit is set in the project (it is shipped with mode 0755).
    pub executable: bool,
}

impl Member {
    /// A member from its parts.
    pub fn new(path: &str, bytes: Vec<u8>, executable: bool) -> Member {
        Member {
            path: path.into(),
            bytes,
            executable,
        }
    }
}

/// The files [`SHIPPED`] names in the project at `root`, sorted by path. Refused, naming the
/// file: a shipped path missing, a link, a named pipe or other non-regular file, a path a bundle
/// cannot hold, a notebook carrying outputs, more than the bundle's limits.
pub fn collect(root: &Path) -> Result<Vec<Member>, BundleError> {
    let mut files = Vec::new();
    for rule in SHIPPED {
        let rel = rule.trim_end_matches('/');
        let path = root.join(rel);
        let kind = match tree::kind_of(&path) {
            Err(BundleError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(BundleError::invalid(
                    &path,
                    "missing: every release ships it",
                ))
            }
            other => other?,
        };
        match (kind, rule.ends_with('/')) {
            (Kind::File { executable }, false) => files.push((rel.to_string(), executable)),
            (Kind::Folder, true) => {
                for node in tree::walk(&path, left_out)? {
                    let rel = format!("{rel}/{}", node.rel);
                    match node.kind {
                        Kind::File { executable } => files.push((rel, executable)),
                        Kind::Folder => {}
                        Kind::Link => return Err(link(&node.path)),
                        Kind::Other => return Err(tree::not_regular(&node.path)),
                    }
                }
            }
            (Kind::Link, _) => return Err(link(&path)),
            (Kind::Other, _) => return Err(tree::not_regular(&path)),
            (_, folder) => {
                let expected = if folder { "a folder" } else { "a file" };
                return Err(BundleError::invalid(&path, format!("not {expected}")));
            }
        }
    }
    if files.len() >= MAX_FILES {
        return Err(BundleError::invalid(
            root,
            format!(
                "{} files to ship: a bundle holds at most {MAX_FILES}",
                files.len() + 1
            ),
        ));
    }
    let mut members = Vec::with_capacity(files.len());
    let mut total = 0u64;
    for (rel, executable) in files {
        let path = root.join(&rel);
        if let Some(why) = unsafe_path(&rel).or((rel == MANIFEST).then_some("the manifest's name"))
        {
            return Err(BundleError::invalid(
                &path,
                format!("cannot be shipped: {why}"),
            ));
        }
        let bytes = tree::read_regular(&path, MAX_FILE_BYTES)?;
        total += bytes.len() as u64;
        if total > MAX_CONTENT_BYTES {
            return Err(BundleError::invalid(
                root,
                format!("the files to ship hold more than {MAX_CONTENT_BYTES} bytes"),
            ));
        }
        if rel.ends_with(".ipynb") {
            check_notebook(&path, &bytes)?;
        }
        members.push(Member::new(&rel, bytes, executable));
    }
    members.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(members)
}

fn link(path: &Path) -> BundleError {
    BundleError::invalid(
        path,
        "a symbolic link: links are never followed nor shipped",
    )
}

/// A notebook is shipped only without outputs, in any shape they may take.
fn check_notebook(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    let problems = unstripped_cells(bytes)
        .map_err(|e| BundleError::invalid(path, format!("not a notebook: {e}")))?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BundleError::NotebookOutputs {
            file: path.display().to_string(),
            problems: problems.join("; "),
        })
    }
}
