//! `paquet_lab build|verify`: the distributable zip and its manifest.

use super::{say, Outcome};
use crate::bundle;
use crate::status::Status;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Build the distributable zip (deterministic, with MANIFEST.json) or verify one against its manifest.
#[derive(Debug, Parser)]
#[command(name = "paquet_lab", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the zip: notebooks (refused if any carries outputs), data, protocol, LICENSE, README.
    Build {
        /// Project root to read.
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Top folder inside the zip.
        #[arg(long, default_value = concat!("iteragpu-lab-", env!("CARGO_PKG_VERSION")))]
        name: String,
        /// New zip file; an existing file is never overwritten [default: NAME.zip].
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
    }
}

pub fn main() -> ExitCode {
    super::run_main("paquet_lab", |args: Args| run(&args))
}
