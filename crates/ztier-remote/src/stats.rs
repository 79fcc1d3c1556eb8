//! What a remote tier counts: pages and bytes each way, latencies,
//! fallbacks, failovers, refusals.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A latency histogram: four buckets per power of two of nanoseconds.
pub struct Histogram([AtomicU64; 252]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

fn bucket(ns: u64) -> usize {
    if ns < 4 {
        ns as usize
    } else {
        let b = 63 - ns.leading_zeros() as usize;
        (b - 1) * 4 + ((ns >> (b - 2)) & 3) as usize
    }
}

fn bucket_floor(i: usize) -> u64 {
    if i < 4 {
        i as u64
    } else {
        let b = i / 4 + 1;
        (4 + (i % 4) as u64) << (b - 2)
    }
}

impl Histogram {
    /// Counts one sample.
    pub fn record(&self, ns: u64) {
        self.0[bucket(ns).min(251)].fetch_add(1, Relaxed);
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// The `q` quantile (0..=1) in nanoseconds (its bucket's floor; 0
    /// with no samples).
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64 * q).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, b) in self.0.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= want {
                return bucket_floor(i);
            }
        }
        bucket_floor(251)
    }
}

/// Live counters of a remote tier.
#[derive(Default)]
pub struct Stats {
    pub(crate) puts: AtomicU64,
    pub(crate) put_bytes: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) get_bytes: AtomicU64,
    pub(crate) pending_hits: AtomicU64,
    pub(crate) fallback_puts: AtomicU64,
    pub(crate) fallback_gets: AtomicU64,
    pub(crate) local_copies: AtomicU64,
    pub(crate) failovers: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) mac_errors: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) wait_timeouts: AtomicU64,
    pub(crate) unlinks: AtomicU64,
    pub(crate) get_ns: Histogram,
    pub(crate) batch_ns: Histogram,
}

/// A copy of [`Stats`] at one moment, with the latencies' quantiles.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Pages written to the remote (acknowledged as the durability asks).
    pub remote_puts: u64,
    /// Bytes of those pages (as the store held them).
    pub remote_put_bytes: u64,
    /// Batches written (one round of pipelined writes each).
    pub remote_batches: u64,
    /// Pages read from the remote.
    pub remote_gets: u64,
    /// Bytes of those pages.
    pub remote_get_bytes: u64,
    /// Gets served from pages still waiting to be written.
    pub pending_hits: u64,
    /// Pages put to the local fallback instead (remote down, full or slow).
    pub fallback_puts: u64,
    /// Pages read from the local fallback (there, or a local copy).
    pub fallback_gets: u64,
    /// Local copies written (`--remote-durability local`).
    pub local_copies: u64,
    /// Masters seen replaced by one of their replicas.
    pub failovers: u64,
    /// Failed requests (each retried or fallen back from).
    pub errors: u64,
    /// Pages refused because their MAC did not match.
    pub mac_errors: u64,
    /// Pages the remote no longer had.
    pub lost: u64,
    /// Batches a replica did not acknowledge in time.
    pub wait_timeouts: u64,
    /// Values deleted on the remote.
    pub unlinks: u64,
    /// Remote get latency, median (µs).
    pub get_p50_us: f64,
    /// Remote get latency, 99th percentile (µs).
    pub get_p99_us: f64,
    /// Batch write latency (pipeline and acknowledgement), median (µs).
    pub batch_p50_us: f64,
    /// Batch write latency, 99th percentile (µs).
    pub batch_p99_us: f64,
}

impl Stats {
    /// A snapshot.
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let us = |ns: u64| ns as f64 / 1000.0;
        StatsSnapshot {
            remote_puts: l(&self.puts),
            remote_put_bytes: l(&self.put_bytes),
            remote_batches: l(&self.batches),
            remote_gets: l(&self.gets),
            remote_get_bytes: l(&self.get_bytes),
            pending_hits: l(&self.pending_hits),
            fallback_puts: l(&self.fallback_puts),
            fallback_gets: l(&self.fallback_gets),
            local_copies: l(&self.local_copies),
            failovers: l(&self.failovers),
            errors: l(&self.errors),
            mac_errors: l(&self.mac_errors),
            lost: l(&self.lost),
            wait_timeouts: l(&self.wait_timeouts),
            unlinks: l(&self.unlinks),
            get_p50_us: us(self.get_ns.quantile(0.5)),
            get_p99_us: us(self.get_ns.quantile(0.99)),
            batch_p50_us: us(self.batch_ns.quantile(0.5)),
            batch_p99_us: us(self.batch_ns.quantile(0.99)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_quantiles_land_near() {
        let mut last = 0;
        for ns in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 40_000, 1 << 40, u64::MAX] {
            let b = bucket(ns);
            assert!(b >= last && b <= 251, "{ns}");
            assert!(bucket_floor(b) <= ns, "{ns}");
            last = b;
        }
        let h = Histogram::default();
        for i in 1..=1000u64 {
            h.record(i * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((400_000..=500_000).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((800_000..=990_000).contains(&p99), "{p99}");
    }
}
