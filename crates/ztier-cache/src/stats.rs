//! Counters, latency histograms, and the statistics report (JSON, and
//! the Prometheus text form).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Bits of the fraction: 2^SUB_BITS buckets per power of two (resolution ≈ 19%).
const SUB_BITS: u32 = 2;
const SUB: u32 = 1 << SUB_BITS;
/// Buckets: up to 2^40 ns (~18 minutes).
const BUCKETS: usize = 40 * SUB as usize;

/// A latency histogram in nanoseconds, lock-free.
pub struct Histogram {
    b: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { b: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < 2 {
        return 0;
    }
    let l = 63 - ns.leading_zeros();
    // position within the power of two, in SUB steps
    let mask = (1u64 << SUB_BITS) - 1;
    let frac = if l >= SUB_BITS { (ns >> (l - SUB_BITS)) & mask } else { (ns << (SUB_BITS - l)) & mask };
    ((l * SUB) as usize + frac as usize).min(BUCKETS - 1)
}

fn upper(i: usize) -> u64 {
    let l = i as u32 / SUB;
    let f = i as u64 % SUB as u64;
    // upper bound of bucket i
    let base = 1u64 << l;
    base + (base * (f + 1)) / SUB as u64
}

impl Histogram {
    /// Records one value.
    pub fn record(&self, ns: u64) {
        self.b[bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.b.iter().map(|x| x.load(Ordering::Relaxed)).sum()
    }

    /// The `q` quantile (0..1) in microseconds (a bucket's upper bound);
    /// 0 if empty.
    pub fn quantile_us(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self.b.iter().map(|x| x.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, c) in counts.iter().enumerate() {
            acc += c;
            if acc >= want {
                return upper(i) as f64 / 1000.0;
            }
        }
        upper(BUCKETS - 1) as f64 / 1000.0
    }

    /// p50/p99/count.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary { count: self.count(), p50_us: self.quantile_us(0.5), p99_us: self.quantile_us(0.99) }
    }
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
    /// Blocks read from the backing.
    pub misses: AtomicU64,
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
    /// Read requests that went to the backing.
    pub miss: Histogram,
    /// Write requests.
    pub write: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_within_a_bucket() {
        let h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile_us(0.5);
        assert!((500.0..=620.0).contains(&p50), "{p50}");
        let p99 = h.quantile_us(0.99);
        assert!((990.0..=1200.0).contains(&p99), "{p99}");
        for v in [0u64, 1, 2, 3, 7, 1 << 20, u64::MAX] {
            let b = bucket(v);
            assert!(b < BUCKETS);
            if v > 1 && v < 1 << 39 {
                assert!(upper(b) >= v, "{v}: bucket {b} upper {}", upper(b));
            }
        }
    }
}
