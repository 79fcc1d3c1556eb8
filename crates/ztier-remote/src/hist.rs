//! A latency histogram: four buckets per power of two of nanoseconds,
//! lock-free (the remote tier's, and the run library's for its round
//! trips to the proxy).

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

    /// Adds `other`'s samples to these.
    pub fn merge(&self, other: &Histogram) {
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            let n = b.load(Relaxed);
            if n > 0 {
                a.fetch_add(n, Relaxed);
            }
        }
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
