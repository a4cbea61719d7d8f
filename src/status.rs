//! Exit statuses, and the trait by which every library error names its own. This is a leaf of the
//! crate: error types implement [`Classify`] beside their definition, and the command-line layer
//! (`cli`) accepts only errors that do, so no error can reach a program without a status.

use std::process::ExitCode;

/// Exit statuses of the programs; the README's table lists them (a test keeps the two equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// An unexpected failure (I/O, an internal error): the message says what.
    Failure = 1,
    /// libtorch or the GPU is missing or unusable: nothing measured, nothing written, no CPU fallback.
    Unavailable = 2,
    /// CUDA ran out of memory during a phase: no file claiming a measurement is written.
    OutOfMemory = 3,
    /// The output file already exists: it is left untouched.
    OutputExists = 4,
    /// A command-line flag or value is invalid.
    Usage = 64,
    /// An input file (catalog, grid, measurement, manifest) is invalid.
    DataError = 65,
    /// Interrupted (Ctrl-C or SIGTERM): the running GPU process was stopped, completed work kept,
    /// no partial file left.
    Interrupted = 130,
}

impl Status {
    /// Every status, in the order of the README's table.
    pub const ALL: &'static [Status] = <Status as strum::VariantArray>::VARIANTS;

    /// The numeric exit code.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Status> for ExitCode {
    fn from(s: Status) -> ExitCode {
        ExitCode::from(s.code())
    }
}

/// An error that knows which exit status it deserves.
pub trait Classify {
    fn status(&self) -> Status;
}

/// Reading or writing failed for a reason the program could not foresee.
impl Classify for std::io::Error {
    fn status(&self) -> Status {
        Status::Failure
    }
}

/// Serialising a result failed (in practice: writing it failed).
impl Classify for serde_json::Error {
    fn status(&self) -> Status {
        Status::Failure
    }
}
