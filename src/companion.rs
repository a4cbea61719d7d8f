//! The GPU companion program `mesure_memoire_torch`: the process that links libtorch and measures.
//! Every measurement of the command line, of a sweep and of the notebooks runs in a fresh
//! companion process, so that each `cold_forward` is a real first pass and no allocator state
//! crosses from one measurement to the next. The companion dies with the process that started it
//! (it is told that process's id and asks the kernel to be stopped when it goes), and an
//! interruption of this process (see [`INTERRUPTED`]) stops the running companion at once. A
//! sweep starts each point's process ahead, as a [`Spare`] that loads its libraries and touches no
//! GPU until it is given its point.

use crate::measure::{MeasureConfig, MeasureError, Measurement};
use crate::status::Status;
use crate::sweep::{PointOutcome, PointRunner};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The companion's file name.
pub const PROGRAM: &str = "mesure_memoire_torch";
/// Where the companion may be named explicitly (a notebook's kernel sets it).
pub const PATH_VARIABLE: &str = "IGL_COMPANION";
/// The variable through which the companion learns its parent's process id.
pub const PARENT_VARIABLE: &str = "IGL_PARENT_PID";

/// Set in a spare companion's environment (see [`Companion::spare`]): it reads its command line
/// from stdin.
pub const SPARE_VARIABLE: &str = "IGL_SPARE";

/// The companion's exit codes this program acts on (see [`Status`]); 127 is the system loader's
/// own, when a library is missing.
const UNAVAILABLE: i32 = Status::Unavailable as i32;
const OUT_OF_MEMORY: i32 = Status::OutOfMemory as i32;
pub const LOADER_FAILED: i32 = 127;

/// Set by a signal handler (Ctrl-C, SIGTERM): the running companion is stopped and no new one
/// starts.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

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
    fn command(&self) -> Command {
        let mut command = Command::new(&self.path);
        command
            .env(PARENT_VARIABLE, std::process::id().to_string())
            .stdin(Stdio::null());
        command
    }

    /// Runs the companion with `args`; stdout and stderr are inherited, or captured with
    /// `capture`. Polls for [`INTERRUPTED`] while it runs and stops it then.
    pub fn run(&self, args: &[OsString], capture: bool) -> std::io::Result<Ended> {
        self.run_with_env(args, capture, &[])
    }

    /// [`run`](Self::run) with the variables `env` set in the companion's environment.
    pub fn run_with_env(
        &self,
        args: &[OsString],
        capture: bool,
        env: &[(&str, &str)],
    ) -> std::io::Result<Ended> {
        if interrupted() {
            return Ok(Ended::Interrupted);
        }
        let mut command = self.command();
        command.args(args).envs(env.iter().copied());
        if capture {
            command.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        wait_for(&mut command.spawn()?)
    }

    /// Starts a spare companion: it loads its libraries, then waits, touching no GPU, until
    /// [`Spare::run`] gives it its command line. Started while the point before it still runs,
    /// it takes the libraries' loading (about half of a process's start) off the next point.
    pub fn spare(&self) -> std::io::Result<Spare> {
        let mut command = self.command();
        command
            .env(SPARE_VARIABLE, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Ok(Spare {
            child: command.spawn()?,
        })
    }

    /// Measures `config` in a fresh companion process, writing the result to `output`.
    pub fn measure(&self, config: &MeasureConfig, output: &Path, blocks: bool) -> PointOutcome {
        point_outcome(self.run(&point_args(config, output, blocks), true), output)
    }
}

/// The companion's command line measuring `config` into `output`, quietly.
fn point_args(config: &MeasureConfig, output: &Path, blocks: bool) -> Vec<OsString> {
    let mut args: Vec<OsString> = measure_args(config).into_iter().map(Into::into).collect();
    args.extend(["--quiet".into(), "--output".into(), output.into()]);
    if blocks {
        args.push("--blocks".into());
    }
    args
}

/// A point's outcome from how its companion ended (exit 3: out of memory).
fn point_outcome(ended: std::io::Result<Ended>, output: &Path) -> PointOutcome {
    match ended {
        Err(e) => PointOutcome::Failed(format!("cannot start {}: {e}", PROGRAM)),
        // Stopped after writing its measurement (the file is written whole or not at all), in its
        // teardown: the point was measured. Stopped before, it may have left a temporary file.
        Ok(Ended::Interrupted) => match Measurement::load(output) {
            Ok(m) => PointOutcome::Measured(Box::new(m)),
            Err(_) => {
                crate::files::remove_leftovers(output);
                PointOutcome::Interrupted
            }
        },
        Ok(Ended::Exited { status, stderr }) => match status.code() {
            Some(0) => match Measurement::load(output) {
                Ok(m) => PointOutcome::Measured(Box::new(m)),
                Err(e) => PointOutcome::Failed(e.to_string()),
            },
            Some(OUT_OF_MEMORY) => PointOutcome::OutOfMemory {
                phase: oom_phase(&stderr),
                message: last_line(&stderr),
            },
            Some(code) => PointOutcome::Failed(format!("exit {code}: {}", last_line(&stderr))),
            None => PointOutcome::Failed(format!("{PROGRAM} was killed by a signal")),
        },
    }
}

/// A companion started ahead of its work (see [`Companion::spare`]). Dropped unused, it is
/// stopped.
#[derive(Debug)]
pub struct Spare {
    child: Child,
}

impl Spare {
    /// Gives the spare its command line (each argument followed by a NUL byte on its stdin, which
    /// is then closed) and waits for it as [`Companion::run`] does, stderr captured.
    pub fn run(mut self, args: &[OsString]) -> std::io::Result<Ended> {
        if interrupted() {
            return Ok(Ended::Interrupted);
        }
        let mut line = Vec::new();
        for a in args {
            line.extend_from_slice(a.as_bytes());
            line.push(0);
        }
        let mut stdin = self.child.stdin.take().expect("a spare's stdin is piped");
        // A spare that could not start (its libraries missing) has closed its stdin: its exit
        // status and stderr say why, below.
        let _ = stdin.write_all(&line);
        drop(stdin);
        wait_for(&mut self.child)
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        // Nothing is sent to a child already waited for.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `child`, polling for [`INTERRUPTED`] and stopping it then; its stderr is read when
/// piped.
fn wait_for(child: &mut Child) -> std::io::Result<Ended> {
    let reader = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = e.read_to_string(&mut text);
            text
        })
    });
    loop {
        if let Some(status) = child.try_wait()? {
            let stderr = reader
                .map(|r| r.join().unwrap_or_default())
                .unwrap_or_default();
            return Ok(Ended::Exited { status, stderr });
        }
        if interrupted() {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Ended::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
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

impl Companion {
    /// Measures `config` in a fresh companion process and returns the measurement (written to a
    /// temporary file, then read back): what the notebooks use, so that each measurement is a
    /// process's first and nothing of the kernel's own state reaches it.
    pub fn measure_fresh(
        &self,
        config: &MeasureConfig,
        blocks: bool,
    ) -> Result<Measurement, MeasureError> {
        let dir = temporary_folder()?;
        let output = dir.path().join("measurement.json");
        let ended = self.run(&point_args(config, &output, blocks), true);
        if let Ok(Ended::Exited { status, stderr }) = &ended {
            if status.code() == Some(UNAVAILABLE) {
                return Err(MeasureError::NoGpu(last_line(stderr).trim().to_string()));
            }
        }
        match point_outcome(ended, &output) {
            PointOutcome::Measured(m) => Ok(*m),
            PointOutcome::OutOfMemory { message, .. } => Err(MeasureError::from_torch_message(
                &format!("CUDA out of memory: {message}"),
            )),
            PointOutcome::Failed(message) => Err(MeasureError::Torch {
                phase: None,
                message,
            }),
            PointOutcome::Interrupted => Err(MeasureError::Torch {
                phase: None,
                message: "interrupted".into(),
            }),
        }
    }

    /// The environment report of a fresh companion process (`environment --json`).
    pub fn environment(
        &self,
        device: crate::device::CudaDevice,
    ) -> Result<crate::environment::EnvironmentReport, MeasureError> {
        let out = self
            .command()
            .args(["environment", "--json", "--device", &device.to_string()])
            .stderr(Stdio::null())
            .output()
            .map_err(|e| {
                MeasureError::LibtorchNotLoadable(format!("cannot start {PROGRAM}: {e}"))
            })?;
        if !out.status.success() {
            return Err(MeasureError::LibtorchNotLoadable(format!(
                "{PROGRAM} could not report ({})",
                out.status
            )));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| MeasureError::Torch {
            phase: None,
            message: format!("{PROGRAM} printed no environment report: {e}"),
        })
    }
}

/// Measures `config` in a fresh companion process (see [`Companion::measure_fresh`]), or says why
/// no companion could be found (exit code 2's reason).
pub fn measure(config: &MeasureConfig, blocks: bool) -> Result<Measurement, MeasureError> {
    Companion::locate()?.measure_fresh(config, blocks)
}

/// Why a lesson could not be run in the companion, or its record read back.
#[derive(Debug, thiserror::Error)]
pub enum LessonError {
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// No GPU or no libtorch in the companion (its exit 2), in its own words.
    #[error("{0}")]
    Unavailable(String),
    /// The companion's exit 3.
    #[error("{0}")]
    OutOfMemory(String),
    #[error("{PROGRAM} failed (exit {code}): {message}")]
    Failed { code: i32, message: String },
    #[error(transparent)]
    Conflict(#[from] crate::lesson::record::AllocConfConflict),
    #[error(transparent)]
    File(#[from] crate::lesson::record::LessonFileError),
}

impl crate::status::Classify for LessonError {
    fn status(&self) -> Status {
        match self {
            LessonError::Measure(e) => e.status(),
            LessonError::Unavailable(_) => Status::Unavailable,
            LessonError::OutOfMemory(_) => Status::OutOfMemory,
            LessonError::Failed { .. } => Status::Failure,
            LessonError::Conflict(e) => e.status(),
            LessonError::File(e) => e.status(),
        }
    }
}

impl Companion {
    /// Runs the lesson (`lesson`, PyTorch's default allocator settings, or with `expandable`
    /// segments) on `device` in a fresh companion process and returns its record (written to a
    /// temporary file, then read back): nothing of this process's own allocator reaches it. With
    /// `expandable`, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` is set in the companion's
    /// environment, unless this process already has it (a different value is refused).
    pub fn lesson_fresh(
        &self,
        device: crate::device::CudaDevice,
        expandable: bool,
    ) -> Result<crate::lesson::LessonRecord, LessonError> {
        use crate::lesson::record::{alloc_conf_for, ALLOC_CONF};
        let set = alloc_conf_for(expandable, std::env::var_os(ALLOC_CONF).as_deref())?;
        let dir = temporary_folder()?;
        let output = dir.path().join("lesson.json");
        let mut args: Vec<OsString> = ["lesson", "--quiet", "--device", &device.to_string()]
            .into_iter()
            .map(Into::into)
            .collect();
        args.extend(["--output".into(), output.clone().into()]);
        if expandable {
            args.push("--expandable-segments".into());
        }
        let env: Vec<(&str, &str)> = set.map(|v| (ALLOC_CONF, v)).into_iter().collect();
        let ended = self
            .run_with_env(&args, true, &env)
            .map_err(|e| LessonError::Unavailable(format!("cannot start {PROGRAM}: {e}")))?;
        let (status, stderr) = match ended {
            Ended::Interrupted => {
                return Err(LessonError::Failed {
                    code: Status::Interrupted as i32,
                    message: "interrupted".into(),
                })
            }
            Ended::Exited { status, stderr } => (status, stderr),
        };
        // The companion's error line, without its program prefix.
        let said = last_line(&stderr);
        let said = said
            .split_once(": error: ")
            .map_or(said.as_str(), |(_, m)| m)
            .to_string();
        match status.code() {
            Some(0) => Ok(crate::lesson::LessonRecord::load(&output)?),
            Some(UNAVAILABLE) => Err(LessonError::Unavailable(said)),
            Some(OUT_OF_MEMORY) => Err(LessonError::OutOfMemory(said)),
            Some(LOADER_FAILED) => Err(LessonError::Unavailable(format!(
                "the system loader could not start {PROGRAM}: {said}"
            ))),
            Some(code) => Err(LessonError::Failed {
                code,
                message: said,
            }),
            None => Err(LessonError::Failed {
                code: -1,
                message: format!("{PROGRAM} was killed by a signal"),
            }),
        }
    }
}

/// Runs the lesson on `device` in a fresh companion process (see [`Companion::lesson_fresh`]), or
/// says why no companion could be found.
pub fn lesson(
    device: crate::device::CudaDevice,
    expandable: bool,
) -> Result<crate::lesson::LessonRecord, LessonError> {
    Companion::locate()?.lesson_fresh(device, expandable)
}

/// The lesson for the notebook: run on `device` in a fresh companion process, first with PyTorch's
/// default allocator settings, then with expandable segments (one after the other: each sizes its
/// last steps from the free memory, which the other must not hold); each one that cannot run here
/// is read instead from the recording in `data` (`exemple-lecon-h200.json`,
/// `exemple-lecon-h200-expandable.json`), labelled as recorded elsewhere, with why nothing was
/// measured here.
pub fn lessons_or_recorded(
    device: crate::device::CudaDevice,
    data: &Path,
) -> crate::lesson::Lessons {
    use crate::lesson::record::{RECORDED_DEFAULT, RECORDED_EXPANDABLE};
    use crate::lesson::{Lessons, ShownLesson};
    let default = lesson(device, false);
    // Without a GPU or a companion the second run would fail the same way: it is not started.
    let expandable = match &default {
        Err(LessonError::Unavailable(why)) => Err(LessonError::Unavailable(why.clone())),
        Err(LessonError::Measure(e @ MeasureError::NoCompanion { .. })) => {
            Err(LessonError::Unavailable(e.to_string()))
        }
        _ => lesson(device, true),
    };
    let shown = |run: Result<_, LessonError>, expandable: bool, file: &str| match run {
        Ok(record) => ShownLesson::measured(record, expandable),
        Err(e) => ShownLesson::recorded(data.join(file), e.to_string(), expandable),
    };
    Lessons {
        default: shown(default, false, RECORDED_DEFAULT),
        expandable: shown(expandable, true, RECORDED_EXPANDABLE),
    }
}

/// The environment report for `device`: from a fresh companion process when one is installed,
/// else a report that says why no libtorch was reached (always a valid report).
pub fn environment_report(
    device: crate::device::CudaDevice,
) -> crate::environment::EnvironmentReport {
    use crate::environment::EnvironmentReport;
    match Companion::locate() {
        Ok(c) => c.environment(device).unwrap_or_else(|e| {
            EnvironmentReport::companion_unreachable(device, true, e.to_string())
        }),
        Err(e) => EnvironmentReport::companion_unreachable(device, false, e.to_string()),
    }
}

/// A new temporary folder for a companion's result file.
fn temporary_folder() -> Result<tempfile::TempDir, MeasureError> {
    tempfile::tempdir().map_err(|e| MeasureError::Torch {
        phase: None,
        message: format!("cannot make a temporary folder: {e}"),
    })
}

/// The command line of `measure` for `config` (without `--output`).
pub fn measure_args(config: &MeasureConfig) -> Vec<String> {
    let mut a = vec![
        "measure".to_string(),
        "--device".into(),
        config.device.to_string(),
        "--batch".into(),
        config.batch.to_string(),
        "--context".into(),
        config.context.to_string(),
        "--width".into(),
        config.width.to_string(),
        "--dtype".into(),
        config.dtype.name().into(),
        "--warmup".into(),
        config.warmup.to_string(),
        "--repeats".into(),
        config.repeats.to_string(),
    ];
    if let Some(h) = config.hidden {
        a.extend(["--hidden".into(), h.to_string()]);
    }
    a
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

/// The phase an out-of-memory message names (`during phase `cold_forward``).
fn oom_phase(stderr: &str) -> Option<String> {
    let at = stderr.find("during phase `")? + "during phase `".len();
    let end = stderr[at..].find('`')?;
    Some(stderr[at..at + end].to_string())
}

/// Runs each point in a fresh companion process on one device. While a point runs, the next
/// point's process is already started as a [`Spare`]: it loads its libraries meanwhile and touches
/// no GPU until it is given its point, after this one has exited.
pub struct CompanionRunner {
    companion: Companion,
    device: crate::device::CudaDevice,
    spare: Option<Spare>,
}

impl CompanionRunner {
    pub fn new(companion: Companion, device: crate::device::CudaDevice) -> CompanionRunner {
        CompanionRunner {
            companion,
            device,
            spare: None,
        }
    }
}

impl PointRunner for CompanionRunner {
    fn run(&mut self, config: &MeasureConfig, output: &Path) -> PointOutcome {
        let config = MeasureConfig {
            device: self.device,
            ..config.clone()
        };
        let spare = match self.spare.take() {
            Some(spare) => Ok(spare),
            None => self.companion.spare(),
        };
        self.spare = self.companion.spare().ok();
        let ended = spare.and_then(|s| s.run(&point_args(&config, output, false)));
        point_outcome(ended, output)
    }
}

/// A sweep to show: run just now, or read from a folder recorded on another machine.
pub struct ShownSweep {
    pub sweep: crate::sweep::Sweep,
    /// The recorded folder, when the sweep was not run here.
    pub recorded: Option<PathBuf>,
}

impl ShownSweep {
    /// The sweep's chart under a line saying where it was measured.
    pub fn chart(&self) -> crate::markup::Html {
        let gpu = self.sweep.gpu_name();
        let whence = match &self.recorded {
            None => "measured just now on this machine, one fresh process per point".to_string(),
            Some(folder) => format!(
                "{} ({}), not measured on this machine",
                crate::markup::labels::RECORDED_ELSEWHERE,
                folder.display()
            ),
        };
        self.sweep.chart().with_caption(&format!("{gpu}: {whence}"))
    }
}

/// Sweeps `dimension` over `values` from `base`, each point in a fresh companion process on
/// `base`'s device, in a new temporary folder; without a companion or a GPU, reads the sweep
/// recorded in `recorded` instead (and says so).
pub fn sweep_or_recorded(
    base: &MeasureConfig,
    dimension: crate::sweep::Dimension,
    values: &[u64],
    recorded: &Path,
) -> Result<ShownSweep, crate::sweep::SweepError> {
    use crate::sweep::Sweep;
    let from_record = || -> Result<ShownSweep, crate::sweep::SweepError> {
        Ok(ShownSweep {
            sweep: Sweep::load(recorded)?,
            recorded: Some(recorded.to_path_buf()),
        })
    };
    let (Ok(companion), Some(first), Some(last)) =
        (Companion::locate(), values.first(), values.last())
    else {
        return from_record();
    };
    let folder = tempfile::Builder::new()
        .prefix("iteragpu-sweep-")
        .tempdir()
        .map_err(|source| crate::sweep::SweepError::Io {
            file: std::env::temp_dir().display().to_string(),
            source,
        })?
        .keep()
        .join("sweep");
    let mut sweep = Sweep::open(&folder, dimension, *first, *last, base, false)?;
    let mut runner = CompanionRunner::new(companion, base.device);
    for v in values {
        match sweep.measure(&mut runner, *v)? {
            Some(row) if row.status == "error" && sweep.rows.len() == 1 => return from_record(),
            Some(row) if row.status == "oom" => break,
            _ => {}
        }
    }
    Ok(ShownSweep {
        sweep,
        recorded: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_stopped_after_writing_its_measurement_was_measured() {
        let dir = tempfile::tempdir().unwrap();
        let written = dir.path().join("point.json");
        let recorded =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data/exemple-mesure-h200-petit-essai.json");
        std::fs::copy(recorded, &written).unwrap();
        assert!(matches!(
            point_outcome(Ok(Ended::Interrupted), &written),
            PointOutcome::Measured(_)
        ));
        assert!(matches!(
            point_outcome(Ok(Ended::Interrupted), &dir.path().join("none.json")),
            PointOutcome::Interrupted
        ));
    }

    #[test]
    fn the_phase_of_an_out_of_memory_is_read_from_the_message() {
        let e = "mesure_memoire: error: measuring [...]: CUDA ran out of memory during phase \
                 `cold_forward`: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert_eq!(oom_phase(e).as_deref(), Some("cold_forward"));
        assert_eq!(oom_phase("no phase"), None);
        let a = measure_args(&MeasureConfig {
            hidden: Some(8),
            ..Default::default()
        });
        assert_eq!(a[0], "measure");
        assert!(a.windows(2).any(|w| w == ["--hidden", "8"]));
    }
}
