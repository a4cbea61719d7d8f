//! Handing a command line over to the companion `mesure_memoire_torch`: the GPU commands of
//! `mesure_memoire` (`environment`, `measure`, `lesson`) run there, in the program
//! that links libtorch, with this program's stdout and stderr, and its exit code passed through.
//! A companion that is missing, or that the system loader cannot start, is said clearly (exit 2),
//! never left to the loader's own message alone.

use super::{signals, Outcome};
use crate::companion::{Companion, Ending, PROGRAM};
use crate::measure::MeasureError;
use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

/// Why the companion could not do the work.
pub struct Refusal {
    /// The companion exists (then the loader or a signal stopped it).
    pub companion_found: bool,
    pub message: String,
}

/// Runs this program's own command line in the companion with the variables `env` set, passing
/// its exit code through; Ctrl-C or SIGTERM stops the companion (exit 130, no file). `Err` says
/// why libtorch could not be used: the companion is missing or the loader refused it.
pub fn run_companion(env: &[(&str, &OsStr)]) -> Result<ExitCode, Refusal> {
    let companion = Companion::locate().map_err(|_| Refusal {
        companion_found: false,
        message: format!("the GPU companion {PROGRAM} is not installed beside this program"),
    })?;
    let refused = |message: String| Refusal {
        companion_found: true,
        message,
    };
    signals::stop_companions_on_interrupt();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // The file name alone in messages: a report never carries a path of this machine.
    match Ending::of(companion.run(&args, false, env), None) {
        Ending::Completed => Ok(ExitCode::SUCCESS),
        Ending::Interrupted => Ok(crate::status::Status::Interrupted.into()),
        Ending::NotStarted(why) => Err(refused(why)),
        // The system loader could not load a library (it printed which one above).
        Ending::LoaderFailed(_) => Err(refused(format!(
            "the system loader could not start {PROGRAM} (message above); make libtorch \
             reachable, e.g. LD_LIBRARY_PATH=<site-packages>/torch/lib:<site-packages>/nvidia/cu13/lib"
        ))),
        Ending::Failed { code: None, .. } => {
            Err(refused(format!("{PROGRAM} was killed by a signal")))
        }
        Ending::Failed {
            code: Some(code), ..
        } => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
        Ending::Unavailable(_) => Ok(crate::status::Status::Unavailable.into()),
        Ending::OutOfMemory { .. } => Ok(crate::status::Status::OutOfMemory.into()),
    }
}

/// Hands this command line over to the companion (see [`run_companion`]); a companion that is
/// missing or cannot be loaded is exit 2.
pub fn hand_over(env: &[(&str, &OsStr)]) -> Outcome {
    run_companion(env).map_err(|why| {
        if why.companion_found {
            MeasureError::LibtorchNotLoadable(why.message)
        } else {
            MeasureError::NoCompanion {
                companion: PROGRAM.into(),
            }
        }
        .into()
    })
}
