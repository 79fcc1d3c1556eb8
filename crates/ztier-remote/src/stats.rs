//! What a remote tier counts: pages and bytes each way, latencies,
//! fallbacks, failovers, refusals.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use crate::hist::Histogram;

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
    /// Adds `other`'s counts and samples to these (a run's totals over
    /// its processes' tiers).
    pub fn merge(&self, other: &Stats) {
        let add = |a: &AtomicU64, b: &AtomicU64| {
            a.fetch_add(b.load(Relaxed), Relaxed);
        };
        add(&self.puts, &other.puts);
        add(&self.put_bytes, &other.put_bytes);
        add(&self.batches, &other.batches);
        add(&self.gets, &other.gets);
        add(&self.get_bytes, &other.get_bytes);
        add(&self.pending_hits, &other.pending_hits);
        add(&self.fallback_puts, &other.fallback_puts);
        add(&self.fallback_gets, &other.fallback_gets);
        add(&self.local_copies, &other.local_copies);
        add(&self.failovers, &other.failovers);
        add(&self.errors, &other.errors);
        add(&self.mac_errors, &other.mac_errors);
        add(&self.lost, &other.lost);
        add(&self.wait_timeouts, &other.wait_timeouts);
        add(&self.unlinks, &other.unlinks);
        self.get_ns.merge(&other.get_ns);
        self.batch_ns.merge(&other.batch_ns);
    }

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
