//! Counters and latency histograms (`ztier_blk::live`'s, which the
//! control socket and the Prometheus endpoint read).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

pub use ztier_blk::live::Histogram;

/// p50/p99/count of a histogram.
pub fn summary(h: &Histogram) -> LatencySummary {
    LatencySummary { count: h.count(), p50_us: h.quantile_us(0.5), p99_us: h.quantile_us(0.99) }
}

/// A histogram's summary.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

/// Monotonic counters of the cache.
#[derive(Default)]
pub struct Counters {
    /// Read requests.
    pub reads: AtomicU64,
    /// Write requests.
    pub writes: AtomicU64,
    /// Flushes.
    pub flushes: AtomicU64,
    /// Trims.
    pub trims: AtomicU64,
    /// Write-zeroes requests.
    pub zeroes: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Blocks read by clients.
    pub read_blocks: AtomicU64,
    /// Blocks written by clients.
    pub written_blocks: AtomicU64,
    /// Blocks served from the RAM cache.
    pub ram_hits: AtomicU64,
    /// Blocks served from the SSD cache.
    pub ssd_hits: AtomicU64,
    /// Blocks found in the remote RAM cache (`--remote`).
    pub remote_hits: AtomicU64,
    /// Blocks given to the remote RAM cache.
    pub remote_puts: AtomicU64,
    /// Blocks not given to it because its queue to the servers was long.
    pub remote_skipped: AtomicU64,
    /// Remote gets that failed (server down, value lost): served from below.
    pub remote_errors: AtomicU64,
    /// Times a slow failure rested the remote.
    pub remote_rests: AtomicU64,
    /// Blocks read from the backing.
    pub misses: AtomicU64,
    /// Write-back: blocks written to the cache only (dirty).
    pub dirty_writes: AtomicU64,
    /// Write-back: dirty blocks copied to the backing.
    pub written_back: AtomicU64,
    /// Write-back: copies to the backing whose block was written again
    /// meanwhile (still dirty: only the newest goes back).
    pub writeback_superseded: AtomicU64,
    /// Write-back: failed copies to the backing (the block stays dirty).
    pub writeback_errors: AtomicU64,
    /// Write-back: blocks written through instead (no line, no room, or
    /// too many dirty).
    pub writeback_fallbacks: AtomicU64,
    /// Blocks put into the SSD cache.
    pub ssd_fills: AtomicU64,
    /// Blocks put into the RAM cache.
    pub ram_fills: AtomicU64,
    /// Fills dropped: a write of the block (or a newer fill of it) came meanwhile.
    pub fills_dropped_race: AtomicU64,
    /// Fills dropped: the fill queue was full.
    pub fills_dropped_queue: AtomicU64,
    /// Fills dropped: no free segment.
    pub fills_dropped_space: AtomicU64,
    /// Fills kept out of the full SSD cache (not asked for before).
    pub fills_not_admitted: AtomicU64,
    /// Of the fills, the write-through ones.
    pub write_through_fills: AtomicU64,
    /// Blocks of sequential streams read around the cache.
    pub bypassed_read_blocks: AtomicU64,
    /// Blocks of sequential streams written around the cache.
    pub bypassed_write_blocks: AtomicU64,
    /// Lines dropped because a write/trim/zero made them stale.
    pub invalidated_lines: AtomicU64,
    /// Lines replaced by another block of their set.
    pub conflict_evictions: AtomicU64,
    /// Cached lines that failed their check when read (damaged, or moved meanwhile).
    pub verify_failures: AtomicU64,
    /// Reads of the cache device that failed.
    pub cache_read_errors: AtomicU64,
    /// Backing requests that failed.
    pub backing_errors: AtomicU64,
    /// Checkpoints written.
    pub checkpoints: AtomicU64,
}

impl Counters {
    /// Reads one counter.
    pub fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }
}

/// Latency histograms.
#[derive(Default)]
pub struct Latencies {
    /// Read requests served wholly from the RAM cache.
    pub ram_hit: Histogram,
    /// Read requests served from the caches, some block from the SSD cache.
    pub ssd_hit: Histogram,
    /// Reads with a block from the remote RAM cache (none from the backing).
    pub remote_hit: Histogram,
    /// Read requests that went to the backing.
    pub miss: Histogram,
    /// Write requests.
    pub write: Histogram,
    /// Write requests, the backing's part left out: the cache's own cost
    /// (invalidation and its journal record, queueing the write-through).
    pub write_cache: Histogram,
}
