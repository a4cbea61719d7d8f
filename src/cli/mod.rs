//! The command-line programs, defined once with clap and validated once: the binaries in
//! `src/bin/` (and the companion in `torch/src/bin/`) only call the `main` of their module here.
//! Flag vocabulary lives in this layer alone; library errors name values and fields.
//!
//! Errors reach a program's exit through [`Failure`], which accepts only errors that implement
//! [`Classify`]: an error type without an exit status does not compile here. Output goes through
//! [`print`] and [`say`], which stop quietly on a closed pipe without changing the exit status.
//! An error is printed by [`report`] with each of its causes once, and with any character that a
//! terminal would obey (escape sequences, NUL, bidirectional overrides) escaped.

pub mod budget;
pub mod calcul_forfaits;
pub mod handover;
pub mod lesson;
pub mod mesure_memoire;
pub mod paquet_lab;
pub mod progress;
pub mod resultats_bruts;
pub mod shape;
pub mod signals;
pub mod sweep;
pub mod values;

use crate::status::{Classify, Status};
use std::fmt::Display;
use std::io::Write;
use std::process::ExitCode;

/// Where `environment`, `measure` and `lesson` run.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// This program does not link libtorch: it hands GPU work to its companion
    /// `mesure_memoire_torch`.
    Front,
    /// This program is the companion, which links libtorch: the GPU work runs here, through this
    /// backend.
    Companion(&'a dyn crate::gpu::Gpu),
}

/// A command that failed: the exit status its error chose, and the error with its context.
#[derive(Debug)]
pub struct Failure {
    pub status: Status,
    pub error: anyhow::Error,
}

impl<E> From<E> for Failure
where
    E: Classify + std::error::Error + Send + Sync + 'static,
{
    fn from(e: E) -> Failure {
        Failure {
            status: e.status(),
            error: e.into(),
        }
    }
}

impl Failure {
    /// A flag combination refused by this layer (exit 64).
    pub fn usage_owned(message: String) -> Failure {
        Failure {
            status: Status::Usage,
            error: anyhow::anyhow!(message),
        }
    }
    pub fn usage(message: &'static str) -> Failure {
        Failure {
            status: Status::Usage,
            error: anyhow::anyhow!(message),
        }
    }
    /// Adds what was being done, keeping the status.
    pub fn context(self, what: impl Display + Send + Sync + 'static) -> Failure {
        Failure {
            status: self.status,
            error: self.error.context(what),
        }
    }
}

/// `.context(..)` on any result whose error can become a [`Failure`].
pub trait Context<T> {
    fn context(self, what: impl Display + Send + Sync + 'static) -> Result<T, Failure>;
}

impl<T, E: Into<Failure>> Context<T> for Result<T, E> {
    fn context(self, what: impl Display + Send + Sync + 'static) -> Result<T, Failure> {
        self.map_err(|e| e.into().context(what))
    }
}

/// What a program's `run` returns.
pub type Outcome = Result<ExitCode, Failure>;

/// Parses the command line; help and version exit 0, any other clap error exits
/// [`Status::Usage`] (64), so that exit code 2 keeps its one meaning: libtorch or the GPU is missing.
pub fn parse_from<P: clap::Parser>(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<P, ExitCode> {
    P::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            Status::Usage.into()
        } else {
            Status::Ok.into()
        }
    })
}

/// A program's whole life: parse the command line, run, report an error with its exit code.
pub fn run_main<P: clap::Parser>(program: &str, run: impl FnOnce(P) -> Outcome) -> ExitCode {
    run_main_from(program, std::env::args_os(), run)
}

/// [`run_main`] of the command line `args` (the program's name first).
pub fn run_main_from<P: clap::Parser>(
    program: &str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
    run: impl FnOnce(P) -> Outcome,
) -> ExitCode {
    signals::exit_on_interrupt();
    match parse_from::<P>(args) {
        Ok(args) => {
            let outcome = run(args);
            // A parent that asked for it (the companion's hand-over) is told how this ended.
            let result = match &outcome {
                Ok(_) => crate::companion::CompanionResult::new(Status::Ok, None, None),
                Err(f) => crate::companion::CompanionResult::new(
                    f.status,
                    Some(message(&f.error)),
                    crate::companion::CompanionResult::place_of(&f.error),
                ),
            };
            result.write_if_asked();
            outcome.unwrap_or_else(|f| report(program, &f))
        }
        Err(code) => code,
    }
}

/// Whether an error chain was caused by writing into a closed pipe (`| head`), directly or
/// through serde_json.
pub fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// Prints the failure with its causes on stderr and returns its exit code. A closed pipe while
/// writing a result ends the program quietly with status 0: the reader asked for no more.
pub fn report(program: &str, failure: &Failure) -> ExitCode {
    if is_closed_pipe(&failure.error) {
        return Status::Ok.into();
    }
    eprintln!("{program}: error: {}", message(&failure.error));
    failure.status.into()
}

/// The error and its causes, joined by `: `, each said once, safe for a terminal. Errors of this
/// crate keep an OS error as their source rather than in their text; a cause that the text before
/// it already ends with (an error that also quotes its source) is not repeated. Characters a
/// terminal would obey are escaped ([`crate::text::printable_lines`]).
pub fn message(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    crate::text::printable_lines(&text).into_owned()
}

/// Writes to stdout; a closed pipe stops the output quietly (`Ok`), any other error is returned.
fn write_stdout(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Prints `value` as one pretty JSON document on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<(), Failure> {
    write_stdout(|out| {
        serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
        writeln!(out)
    })
}

/// Prints a message for the person on stderr (stdout holds a JSON document).
pub fn note(line: impl Display) -> Result<(), Failure> {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    Ok(())
}

/// Prints a line on stdout (see [`write_stdout`] for a closed pipe).
pub fn say(line: impl Display) -> Result<(), Failure> {
    write_stdout(|out| writeln!(out, "{line}"))
}

/// Prints `value` as pretty JSON, or its text form (see [`write_stdout`] for a closed pipe).
pub fn print<T: serde::Serialize + Display>(value: &T, json: bool) -> Result<(), Failure> {
    write_stdout(|out| {
        if json {
            serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
        } else {
            write!(out, "{value}")?;
        }
        writeln!(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read grid g.csv: {source}")]
    struct Quoting {
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once() {
        let os = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let quoting = anyhow::Error::new(Quoting { source: os() }).context("cannot append");
        let m = message(&quoting);
        assert_eq!(m.matches("entity not found").count(), 1, "{m}");
        assert!(
            m.starts_with("cannot append: cannot read grid g.csv: "),
            "{m}"
        );
        let read = anyhow::Error::new(crate::files::ReadError::Io {
            kind: crate::files::Input::Catalog,
            path: "c.csv".into(),
            source: os(),
        });
        assert_eq!(
            message(&read),
            "cannot read catalog c.csv: entity not found"
        );
    }

    #[test]
    fn terminal_controls_are_escaped_line_breaks_kept() {
        let e = anyhow::anyhow!("schema `\u{1b}[2J\0`\nsecond line\r");
        assert_eq!(message(&e), "schema `\\u{1b}[2J\\u{0}`\nsecond line\\u{d}");
    }
}
