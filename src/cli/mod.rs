//! The command-line programs, defined once with clap and validated once: the binaries in
//! `src/bin/` only call the `main` of their module here.

pub mod calcul_forfaits;
pub mod mesure_memoire;
pub mod paquet_lab;
pub mod resultats_bruts;
pub mod values;

use crate::exit::Status;
use std::process::ExitCode;

/// Parses the command line; help and version exit 0, any other clap error exits
/// [`Status::Usage`] (64), so that exit code 2 keeps its one meaning: libtorch or the GPU is missing.
pub fn parse<P: clap::Parser>() -> Result<P, ExitCode> {
    P::try_parse().map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            Status::Usage.into()
        } else {
            Status::Ok.into()
        }
    })
}

/// A program's whole life: parse the command line, run, report an error with its exit code.
pub fn run_main<P: clap::Parser>(
    program: &str,
    run: impl FnOnce(P) -> anyhow::Result<ExitCode>,
) -> ExitCode {
    match parse::<P>() {
        Ok(args) => run(args).unwrap_or_else(|e| crate::exit::report(program, &e)),
        Err(code) => code,
    }
}

/// Prints `value` as pretty JSON, or its text form.
pub fn print<T: serde::Serialize + std::fmt::Display>(value: &T, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, value)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{value}")?;
    }
    Ok(())
}
