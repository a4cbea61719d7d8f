//! The GPU companion program `mesure_memoire_torch`: the process that links libtorch and measures.
//! Every measurement of the command line, of a sweep and of the notebooks runs in a fresh
//! companion process, so that each `cold_forward` is a real first pass and no allocator state
//! crosses from one measurement to the next. The companion dies with the process that started it
//! (it is told that process's id and asks the kernel to be stopped when it goes), and an
//! interruption of this process stops the running companion at once.
//!
//! - [`process`]: locating it, running it, the spare started ahead, stopping it;
//! - [`handover`]: its command lines, the result file in which it says how it ended, and the one
//!   reading of its exit;
//! - [`fresh`]: one measurement, lesson or environment report in one fresh process;
//! - [`point`]: a sweep's points, each in a fresh process.

pub mod fresh;
pub mod handover;
pub mod point;
pub mod process;

pub use fresh::LessonError;
pub use handover::{CompanionResult, Ending, LOADER_FAILED};
pub use point::CompanionRunner;
pub use process::{command_line, interrupt, interrupted, Companion, Ended, Spare};

/// The companion's file name.
pub const PROGRAM: &str = "mesure_memoire_torch";
/// Where the companion may be named explicitly (a notebook's kernel sets it).
pub const PATH_VARIABLE: &str = "IGL_COMPANION";
/// The variable through which the companion learns its parent's process id.
pub const PARENT_VARIABLE: &str = "IGL_PARENT_PID";
/// The variable through which a parent names the companion's result file (see [`handover`]).
pub const RESULT_VARIABLE: &str = "IGL_RESULT_FILE";
/// Set in a spare companion's environment (see [`Companion::spare`]): it reads its command line
/// from stdin.
pub const SPARE_VARIABLE: &str = "IGL_SPARE";
