//! Starting and supervising the companion's processes: locating the program, one run waited for
//! until it exits (or is stopped by an interruption of this process), and the spare started ahead
//! that loads its libraries and touches no GPU until it is given its command line.

use super::{PARENT_VARIABLE, PATH_VARIABLE, PROGRAM, RESULT_VARIABLE, SPARE_VARIABLE};
use crate::measure::MeasureError;
use shared_child::SharedChild;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Set once this process is interrupted (Ctrl-C, SIGTERM): the running companions are stopped
/// and no new one starts.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The companions running now, stopped at once by [`interrupt`].
static RUNNING: Mutex<Vec<Weak<SharedChild>>> = Mutex::new(Vec::new());

/// Stops every running companion and keeps new ones from starting (the signal handler's work).
pub fn interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
    for child in RUNNING.lock().expect("no holder panics").iter() {
        if let Some(child) = child.upgrade() {
            let _ = child.kill();
        }
    }
}

/// Whether an interruption was asked for.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// How a companion run ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited with this status; stderr as captured (empty when inherited).
    Exited { status: ExitStatus, stderr: String },
    /// It was stopped because this process was interrupted.
    Interrupted,
}

/// A located companion program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Companion {
    pub path: PathBuf,
}

impl Companion {
    /// `$IGL_COMPANION` when set, else `mesure_memoire_torch` beside this program.
    pub fn locate() -> Result<Companion, MeasureError> {
        let missing = || MeasureError::NoCompanion {
            companion: PROGRAM.into(),
        };
        let path = match std::env::var_os(PATH_VARIABLE) {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|_| missing())?
                .with_file_name(PROGRAM),
        };
        if path.is_file() {
            Ok(Companion { path })
        } else {
            Err(missing())
        }
    }

    /// The companion as a command: told this process's id (so that it dies with it), reading
    /// nothing.
    pub(super) fn command(&self) -> Command {
        let mut command = Command::new(&self.path);
        command
            .env(PARENT_VARIABLE, std::process::id().to_string())
            .stdin(Stdio::null());
        command
    }

    /// Runs the companion with `args` and the variables `env`; stdout and stderr are inherited,
    /// or with `capture` stdout dropped and stderr captured. An interruption stops it.
    pub fn run(
        &self,
        args: &[OsString],
        capture: bool,
        env: &[(&str, &OsStr)],
    ) -> std::io::Result<Ended> {
        if interrupted() {
            return Ok(Ended::Interrupted);
        }
        let mut command = self.command();
        command.args(args).envs(env.iter().copied());
        if capture {
            command.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        wait_for(SharedChild::spawn(&mut command)?)
    }

    /// Starts a spare companion: it loads its libraries, then waits, touching no GPU, until
    /// [`Spare::run`] gives it its command line. Started while the point before it still runs,
    /// it takes the libraries' loading (about half of a process's start) off the next point.
    /// It writes its result file (see [`super::handover`]) at `result`.
    pub fn spare(&self, result: &Path) -> std::io::Result<Spare> {
        let mut command = self.command();
        command
            .env(SPARE_VARIABLE, "1")
            .env(RESULT_VARIABLE, result)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Ok(Spare {
            child: Some(SharedChild::spawn(&mut command)?),
            result: result.to_path_buf(),
        })
    }
}

/// A companion started ahead of its work (see [`Companion::spare`]). Dropped unused, it is
/// stopped.
#[derive(Debug)]
pub struct Spare {
    child: Option<SharedChild>,
    /// Where it writes its result file.
    pub result: PathBuf,
}

impl Spare {
    /// Gives the spare its command line (each argument followed by a NUL byte on its stdin, which
    /// is then closed) and waits for it as [`Companion::run`] does, stderr captured.
    pub fn run(mut self, args: &[OsString]) -> std::io::Result<Ended> {
        if interrupted() {
            return Ok(Ended::Interrupted);
        }
        let child = self.child.take().expect("a spare runs once");
        let mut line = Vec::new();
        for a in args {
            line.extend_from_slice(a.as_bytes());
            line.push(0);
        }
        if let Some(mut stdin) = child.take_stdin() {
            // A spare that could not start (its libraries missing) has closed its stdin: its exit
            // status and stderr say why.
            let _ = stdin.write_all(&line);
        }
        wait_for(child)
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for `child` (blocking, no polling); [`interrupt`] stops it meanwhile. Its stderr is read
/// when piped.
fn wait_for(child: SharedChild) -> std::io::Result<Ended> {
    let reader = child.take_stderr().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = e.read_to_string(&mut text);
            text
        })
    });
    let child = Arc::new(child);
    {
        let mut running = RUNNING.lock().expect("no holder panics");
        running.retain(|c| c.strong_count() > 0);
        running.push(Arc::downgrade(&child));
    }
    // An interruption between the start and the registration stops it here.
    if interrupted() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    let stderr = reader
        .map(|r| r.join().unwrap_or_default())
        .unwrap_or_default();
    if interrupted() {
        return Ok(Ended::Interrupted);
    }
    Ok(Ended::Exited { status, stderr })
}

/// This companion's command line: its own, or, in a spare, the one given on its stdin (see
/// [`Spare::run`]) behind its program name. `None`: a spare let go without one.
pub fn command_line() -> std::io::Result<Option<Vec<OsString>>> {
    let mut own = std::env::args_os();
    if std::env::var_os(SPARE_VARIABLE).is_none() {
        return Ok(Some(own.collect()));
    }
    let mut given = Vec::new();
    std::io::stdin().lock().read_to_end(&mut given)?;
    let Some(given) = given.strip_suffix(&[0]) else {
        return Ok(None);
    };
    let args = given
        .split(|b| *b == 0)
        .map(|a| OsStr::from_bytes(a).to_owned());
    Ok(Some(own.next().into_iter().chain(args).collect()))
}
