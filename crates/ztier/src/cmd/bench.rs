//! `ztier bench ...`: measurements side by side with peers.

use anyhow::Result;
use clap::Subcommand;

use super::{
    bench_blk, bench_cache, bench_codecs, bench_pressure, bench_pressure_suite, bench_remote, bench_store,
    bench_uffd,
};

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
    /// The compressed page store: allocators compared on the same pages.
    ///
    /// Fills a store past its budget with corpus pages, then runs put+get
    /// pairs (timed against the codec alone on the same pages) and a skewed
    /// random workload of puts, gets, overwrites and flushes on 1 and N
    /// threads. Reports the effective ratio after all overhead, metadata
    /// bytes per page, fragmentation, put/get rates and compaction time.
    /// Every get that hits is checked against what was put.
    Store(bench_store::StoreArgs),
    /// The compressed block device against `nbdkit file` with the same
    /// client: fio's nbd engine (1 MiB sequential write and read, 4K
    /// random read and write at queue depth 32) on unix sockets; then the
    /// space a device takes per data type (text, source, binaries, a
    /// SQLite database, random) next to `gzip -6` (ZBD's Table III).
    Blk(bench_blk::BlkBenchArgs),
    /// Caches in front of a slow backing (`nbdkit --filter=delay`): the
    /// backing alone, `nbdkit --filter=cache` (uncompressed, same size),
    /// and `ztier cache` raw, compressed (set-associative and
    /// direct-mapped) and compressed with a RAM cache; fio zipf random
    /// reads and a 70/30 read/write mix over working sets of 1x..8x the
    /// cache, on 50%-compressible data and an ext4 image of system files.
    /// Hit ratio (what reached the backing), IOPS, latency, CPU.
    Cache(bench_cache::CacheBenchArgs),
    /// A program under memory pressure: natively, then at each budget under
    /// kernel swap to a file, zswap and zram (in a memory cgroup; root) and
    /// under `ztier run`. Checks outputs are identical; prints wall time,
    /// CPU time, peak RSS, major faults, bytes compressed and ztier run's
    /// fault service p50/p99/mean, and can plot them.
    Pressure(bench_pressure::PressureArgs),
    /// What userfaultfd itself costs on this machine: the kernel's own
    /// anonymous fault, a missing-page fault's round trip through a handler
    /// on the same CPU (as `ztier run` serves them), and each further page
    /// of a run, with nothing to look up or decompress: the floor under
    /// `ztier run`'s fault service here.
    Uffd(bench_uffd::UffdArgs),
    /// The remote tier (Redis) against redis-benchmark on the same server.
    ///
    /// Puts and gets of 4 KiB pages through the remote tier (sealed,
    /// batched, pipelined) against `redis-benchmark -t set,get -d 4096`
    /// at the same concurrency and pipeline depth, in turn, round by
    /// round; with the latency of single gets (a fault's) at depth 1.
    Remote(bench_remote::RemoteBenchArgs),
}

/// Runs a benchmark.
pub fn run(c: BenchCommand) -> Result<i32> {
    match c {
        BenchCommand::Codecs(a) => bench_codecs::run(a),
        BenchCommand::Store(a) => bench_store::run(a),
        BenchCommand::Blk(a) => bench_blk::run(a),
        BenchCommand::Cache(a) => bench_cache::run(a),
        BenchCommand::Pressure(a) => match &a.suite {
            Some(suite) => bench_pressure_suite::run(&a, suite),
            None => bench_pressure::run(a),
        },
        BenchCommand::Uffd(a) => bench_uffd::run(a),
        BenchCommand::Remote(a) => bench_remote::run(a),
    }
}
