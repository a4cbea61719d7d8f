//! Documented exit codes of the command-line programs, and the mapping from library errors to them.

use std::process::ExitCode;

/// Exit codes; the README lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl From<Status> for ExitCode {
    fn from(s: Status) -> ExitCode {
        ExitCode::from(s as u8)
    }
}

impl Classify for crate::measure::report::LoadError {
    fn status(&self) -> Status {
        match self {
            crate::measure::report::LoadError::Io { .. } => Status::Failure,
            crate::measure::report::LoadError::Invalid { .. } => Status::DataError,
        }
    }
}

/// Library errors say which exit code they deserve.
pub trait Classify {
    fn status(&self) -> Status;
}

/// The exit status for an error chain: the first library error found in it decides.
pub fn status_of(error: &anyhow::Error) -> Status {
    for cause in error.chain() {
        macro_rules! try_as {
            ($($t:ty),*) => {$(
                if let Some(e) = cause.downcast_ref::<$t>() {
                    return e.status();
                }
            )*};
        }
        try_as!(
            crate::estimate::EstimateError,
            crate::catalog::CatalogError,
            crate::quote::QuoteError,
            crate::files::WriteError,
            crate::measure::MeasureError,
            crate::grid::GridError,
            crate::bundle::BundleError,
            crate::measure::report::LoadError
        );
    }
    Status::Failure
}

/// Prints `error` with its causes on stderr and returns its exit code. A closed pipe is not an error.
pub fn report(program: &str, error: &anyhow::Error) -> ExitCode {
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            return Status::Ok.into();
        }
    }
    eprintln!("{program}: error: {error:#}");
    status_of(error).into()
}
