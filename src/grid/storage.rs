//! The grid file on disk: where it really is (a symbolic link is followed, never replaced), the
//! lock that serialises writers, and the atomic replace that adds one row while keeping every
//! existing byte and the file's permissions (see [`crate::files::replace_file`]).

use super::report::{check_bytes, find_measurement};
use super::row::{csv_line, GridRow};
use super::GridError;
use crate::files;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The name of the lock file beside a grid named `name`.
pub fn lock_file_name(name: &str) -> String {
    format!(".{name}.lock")
}

/// Appends `row` to the grid at `grid` under its lock: refused if the grid is broken or already
/// holds this measurement, then written by an atomic replace of the grid's real file.
pub(super) fn append_row(grid: &Path, row: &GridRow) -> Result<(), GridError> {
    let file = grid.display().to_string();
    let io = |source| GridError::Io {
        file: file.clone(),
        source,
    };
    // A grid in a missing folder is a usage error naming the folder, as for every output.
    files::check_folder(grid)?;
    let target = std::fs::canonicalize(grid).map_err(io)?;
    let _lock = lock(&target, &mut |lock| {
        // One write, so that lines of writers waiting together never interleave.
        let line = format!(
            "waiting for the lock {}: another writer is appending to {file}\n",
            lock.display()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    })?;
    files::remove_leftovers(&target);
    let current = files::read_capped(&target, files::Input::Grid)?;
    let report = check_bytes(&current, &file);
    if !report.problems.is_empty() {
        return Err(GridError::BrokenGrid { file, report });
    }
    if let Some(line) = find_measurement(&current, &row.measurement_sha256) {
        return Err(GridError::Duplicate {
            file,
            sha256: row.measurement_sha256.clone(),
            line,
        });
    }
    let mut next = current;
    if !next.is_empty() && !next.ends_with(b"\n") {
        next.push(b'\n');
    }
    next.extend_from_slice(&csv_line(&row.cells()));
    files::replace_file(&target, &next)?;
    Ok(())
}

/// The lock file of the grid whose real file is `target`: `.NAME.lock` in the same folder (the
/// grid itself is replaced by each append, so it cannot carry the lock).
pub fn lock_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map_or("grid".into(), |n| n.to_string_lossy());
    target.with_file_name(lock_file_name(&name))
}

/// Holds an exclusive lock on the lock file of `target` until dropped. When another writer holds
/// it, calls `waiting` once with the lock file's path, then waits.
fn lock(target: &Path, waiting: &mut dyn FnMut(&Path)) -> Result<std::fs::File, GridError> {
    let path = lock_path(target);
    let io = |source| GridError::Io {
        file: path.display().to_string(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            waiting(&path);
            file.lock().map_err(io)?;
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_makes_the_next_writer_say_it_waits_then_wait() {
        let dir = tempfile::tempdir().unwrap();
        let grid = dir.path().join("g.csv");
        std::fs::write(&grid, b"").unwrap();
        let held = lock(&grid, &mut |_| panic!("nobody holds the lock yet")).unwrap();
        assert!(dir.path().join(".g.csv.lock").is_file());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let grid = grid.clone();
            std::thread::spawn(move || {
                let mut said = Vec::new();
                let _second = lock(&grid, &mut |p| said.push(p.to_path_buf())).unwrap();
                tx.send(()).unwrap();
                said
            })
        };
        let still_waiting = rx.recv_timeout(std::time::Duration::from_millis(300));
        assert!(still_waiting.is_err(), "the second writer did not wait");
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert_eq!(waiter.join().unwrap(), [dir.path().join(".g.csv.lock")]);
    }
}
