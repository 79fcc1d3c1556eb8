//! `ztier bench ...`: measurements side by side with peers.

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Compression ratio and speed of every page codec on a corpus of pages.
    Codecs,
}

/// Runs a benchmark.
pub fn run(c: BenchCommand) -> Result<i32> {
    match c {
        BenchCommand::Codecs => Ok(0),
    }
}
