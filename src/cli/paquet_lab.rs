//! `paquet_lab build|verify|extract`: the release zip and its manifest.

use super::{say, Outcome};
use crate::bundle;
use crate::status::Status;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Build the release zip (deterministic, with MANIFEST.json), verify one against its manifest, or
/// extract a verified one.
#[derive(Debug, Parser)]
#[command(name = "paquet_lab", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the zip: a release that builds and runs on its own (both crates, scripts, notebooks
    /// refused if any carries outputs, data, docs); links and non-regular files are refused.
    Build {
        /// Project root to read.
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Top folder inside the zip: one folder name (letters, digits, `.`, `_`, `-`).
        #[arg(long, default_value = concat!("iteragpu-lab-", env!("CARGO_PKG_VERSION")),
              value_parser = bundle::check_name)]
        name: String,
        /// New zip file; an existing file is never overwritten [default: NAME.zip in the current
        /// folder].
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Verify a zip or an extracted folder against its MANIFEST.json (writes nothing).
    Verify {
        /// The zip file or the extracted folder.
        target: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Verify a zip, then extract it into the new folder INTO/NAME (never over an existing one).
    Extract {
        /// The zip file.
        zip: PathBuf,
        /// The existing folder to extract into.
        #[arg(long, default_value = ".")]
        into: PathBuf,
    },
}

pub fn run(args: &Args) -> Outcome {
    match &args.command {
        Command::Build { root, name, output } => {
            let output = output
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{name}.zip")));
            let manifest = bundle::build(root, name, &output)?;
            for f in &manifest.files {
                say(format_args!(
                    "{:<40} {:>8} {}",
                    f.path,
                    f.size.map_or("-".into(), |s| s.to_string()),
                    f.sha256
                        .as_deref()
                        .unwrap_or("(the manifest itself: no hash)")
                ))?;
            }
            say(format_args!("Written to {}", output.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { target, json } => {
            let v = bundle::verify(target)?;
            super::print(&v, *json)?;
            Ok(if v.ok() {
                ExitCode::SUCCESS
            } else {
                Status::DataError.into()
            })
        }
        Command::Extract { zip, into } => {
            let folder = bundle::extract(zip, into)?;
            say(format_args!(
                "{} verified against its MANIFEST.json and extracted into {}",
                zip.display(),
                folder.display()
            ))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub fn main() -> ExitCode {
    super::run_main("paquet_lab", |args: Args| run(&args))
}
