//! Extraction of a bundle's zip, for a release to be used where it lands. Nothing is written
//! unless the whole zip verifies against its manifest; then the files appear at once: they are
//! written into a hidden temporary folder inside the destination and renamed to `INTO/NAME` only
//! if that name is free, so an existing folder is never replaced nor merged into (exit 4), and an
//! interrupted extraction leaves no partial bundle.

use super::verify::verify_zip;
use super::{archive, BundleError};
use crate::files::{self, WriteError};
use rustix::fs::{RenameFlags, CWD};
use std::fs::Permissions;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Verifies the zip at `zip` and extracts it into the new folder `into/NAME` (NAME: its top
/// folder), with modes 0644 and 0755 as listed. Returns that folder.
pub fn extract(zip: &Path, into: &Path) -> Result<PathBuf, BundleError> {
    let (verification, bundle) = verify_zip(zip)?;
    if !verification.ok() {
        return Err(BundleError::NotVerified {
            file: zip.display().to_string(),
            report: verification.to_string(),
        });
    }
    let dest = into.join(&verification.name);
    files::check_new_file(&dest)?;
    let write_error = |source| WriteError::Io {
        path: dest.clone(),
        source,
    };
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{}.", verification.name))
        .suffix(".tmp")
        .tempdir_in(into)
        .map_err(write_error)?;
    for file in &bundle.files {
        let bytes = &bundle.bytes[file.range.clone()];
        let mode = archive::mode(file.executable);
        write_file(&staging.path().join(&file.path), bytes, mode).map_err(write_error)?;
    }
    std::fs::set_permissions(staging.path(), Permissions::from_mode(0o755)).map_err(write_error)?;
    rustix::fs::renameat_with(CWD, staging.path(), CWD, &dest, RenameFlags::NOREPLACE).map_err(
        |e| match e {
            rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY => {
                WriteError::Exists(dest.clone())
            }
            e => write_error(e.into()),
        },
    )?;
    let _ = staging.keep();
    Ok(dest)
}

/// A new file with `bytes` and `mode`, flushed to disk, its folders created as needed.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.set_permissions(Permissions::from_mode(mode))?;
    file.sync_all()
}
