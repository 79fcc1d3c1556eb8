//! `ztier bench ...`: measurements side by side with peers.

use anyhow::Result;
use clap::Subcommand;

use super::bench_codecs;

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Compression ratio and speed of every page codec on a corpus of pages.
    ///
    /// For each codec: ratio, compress and decompress MB/s, time relative to
    /// memcpy of the same pages, and a compressed-size histogram. Every page
    /// is round-tripped and compared. Zero and same-filled pages are counted
    /// and stored as metadata only.
    Codecs(bench_codecs::CodecsArgs),
}

/// Runs a benchmark.
pub fn run(c: BenchCommand) -> Result<i32> {
    match c {
        BenchCommand::Codecs(a) => bench_codecs::run(a),
    }
}
