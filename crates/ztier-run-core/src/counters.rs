//! The run library's counters ([`Stats`]): what each process of a run
//! counts while it runs — faults by kind, evictions, the eviction
//! handshake's events, the replacement policy's gauges, peaks, and the
//! fault service time in a histogram ([`lat_bucket`]) — read by the
//! stats writer (`PID.json` at exit) and the control socket while the
//! fault handler runs. The names they are written under are
//! [`crate::names::stats`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Fault-latency buckets: 100 ns wide below 100 µs, then 10 µs wide up to
/// 10.1 ms; the last collects the rest.
pub const LAT_BUCKETS: usize = 2000;

/// The bucket of a service time.
pub fn lat_bucket(ns: u64) -> usize {
    if ns < 100_000 {
        (ns / 100) as usize
    } else {
        (1000 + (ns - 100_000) / 10_000).min(LAT_BUCKETS as u64 - 1) as usize
    }
}

/// The upper bound of bucket `i`, in ns (the last bucket is open-ended:
/// its bound is where it starts, so a quantile there reads "at least").
pub fn lat_upper_ns(i: usize) -> u64 {
    if i < 1000 {
        (i as u64 + 1) * 100
    } else if i < LAT_BUCKETS - 1 {
        100_000 + (i as u64 - 999) * 10_000
    } else {
        100_000 + (i as u64 - 1000) * 10_000
    }
}

/// The `f` quantile (0 < `f` ≤ 1) of a histogram of service times
/// (counts per bucket of [`lat_bucket`]), in µs: the upper bound of the
/// bucket where it falls (at least that, in the last bucket); 0 for an
/// empty histogram.
pub fn quantile_us(lat: &[u64], f: f64) -> f64 {
    let total: u64 = lat.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let want = ((total as f64) * f).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, c) in lat.iter().enumerate() {
        seen += c;
        if seen >= want {
            return lat_upper_ns(i) as f64 / 1000.0;
        }
    }
    lat_upper_ns(LAT_BUCKETS - 1) as f64 / 1000.0
}

/// Counters (read by the stats writer and the control socket while the
/// handler runs).
pub struct Stats {
    /// Faults served.
    pub faults: AtomicU64,
    /// … of which on never-touched (or released) pages.
    pub zero_faults: AtomicU64,
    /// … of which decompressed from the store.
    pub store_faults: AtomicU64,
    /// … of which continued no walk (neither right after nor within 16
    /// pages after one of the last 8 faults): one page, no prefetch
    /// tried. Random access, or a walk lost over a resident stretch.
    pub lone_faults: AtomicU64,
    /// System calls whose memory arguments were made resident and pinned
    /// first (user-mode-only userfaultfd; see the `sud` module).
    pub pinned_calls: AtomicU64,
    /// Stored pages brought back for those calls (not faults).
    pub pinned_in: AtomicU64,
    /// System calls run by the dispatch handler (a `SIGSYS` each).
    pub dispatched_calls: AtomicU64,
    /// System calls that entered through the library's wrappers of
    /// glibc's functions and so needed no `SIGSYS` (see `sud::fast`).
    pub direct_calls: AtomicU64,
    /// Extra stored pages installed by sequential prefetch.
    pub prefetched: AtomicU64,
    /// Faults left waiting for an eviction's commit (the page was OWNED).
    pub deferred: AtomicU64,
    /// Writes to a victim of the background evictor's batch in flight
    /// that took it back instead of waiting (the manager's `take_back`).
    pub taken_back: AtomicU64,
    /// Faults on a victim of the background batch in flight that its
    /// evictor had already released, served at once from the store
    /// instead of waiting for the batch's commit
    /// (the manager's `commit_early`).
    pub committed_early: AtomicU64,
    /// Pages compressed into the store.
    pub pages_compressed: AtomicU64,
    /// Victims evicted by the fault handler itself, to make room for a
    /// fault (the background evictor had not kept up): work on the
    /// program's CPU, with the fault waiting.
    pub evicted_inline: AtomicU64,
    /// Fault services (and pins) that evicted inline: the faults that
    /// waited for an eviction of their own.
    pub inline_evictions: AtomicU64,
    /// Time those inline evictions took (ns), and its parts: taking the
    /// victims, write-protecting them, compressing them into the store,
    /// of that the store's pushes to its next tier (spill file, remote),
    /// and releasing their memory. The rest is the commit and the wakes.
    pub evict_ns: AtomicU64,
    /// … taking the victims.
    pub evict_take_ns: AtomicU64,
    /// … write-protecting them.
    pub evict_protect_ns: AtomicU64,
    /// … compressing them into the store (the next tier's part included).
    pub evict_compress_ns: AtomicU64,
    /// … of that, the store pushing older entries to its next tier.
    pub evict_tier_ns: AtomicU64,
    /// … releasing their memory.
    pub evict_release_ns: AtomicU64,
    /// Evicted pages that were all zero (not stored).
    pub evicted_zero: AtomicU64,
    /// Pages the store refused (they stayed resident).
    pub refused: AtomicU64,
    /// Write-protect faults (a write hit a page while it was evicted).
    pub wp_faults: AtomicU64,
    /// Write-protect calls made to evict (see `Victims::protect`).
    pub wp_calls: AtomicU64,
    /// Of the background evictor's batches, those it write-protected
    /// itself, from its own CPU (each call a TLB shootdown on the
    /// program's): no fault service took the job in time, or it failed
    /// there (see the crate root's `near`). The others were protected on
    /// the program's CPU.
    pub wp_batches_far: AtomicU64,
    /// The background evictor's batches protected by a fault service.
    pub wp_batches_near: AtomicU64,
    /// Pages faulted back soon after their eviction, put in the
    /// protected segment.
    pub promoted: AtomicU64,
    /// Pages moved from the protected segment to probation.
    pub demoted: AtomicU64,
    /// Demoted pages that faulted back from the store.
    pub regretted: AtomicU64,
    /// Victims per page aged out of the protected segment, now.
    pub age_every: AtomicUsize,
    /// Refault distance under which a page is hot now, in evictions.
    pub hot_distance: AtomicUsize,
    /// Clean pages evicted without compression (their copy was kept).
    pub clean_evicted: AtomicU64,
    /// Clean pages written (a write-protect fault; their copy dropped).
    pub dirtied: AtomicU64,
    /// Forks.
    pub forks: AtomicU64,
    /// 1 in a forked child (it inherited the parent's pages, resident
    /// and stored, and a copy of its store).
    pub forked_child: AtomicU64,
    /// Resident pages now.
    pub resident: AtomicUsize,
    /// Most memory the store used (sampled after each eviction round),
    /// less what it held when this process was forked
    /// ([`Stats::store_inherited`]).
    pub peak_store_bytes: AtomicU64,
    /// Uncompressed bytes the store (and spill file) held at that moment,
    /// less those it held at the fork.
    pub peak_store_orig: AtomicU64,
    /// In a forked child, the store's memory and uncompressed bytes at
    /// the fork: its copy of the parent's store, counted in the parent's
    /// figures already. Without it, each child of a fork reported its
    /// parent's store as its own, and the figures of a process tree
    /// (`ztier run --stats`, `bench pressure`'s "compressed" column) summed
    /// it once per child: 2692 MB in for a program of 169 MB
    /// (`examples/workloads/forks.py`, 20 children).
    pub store_inherited: (AtomicU64, AtomicU64),
    /// Most resident pages seen.
    pub peak_resident: AtomicUsize,
    /// Fault service time, buckets of [`lat_bucket`].
    pub latency: Vec<AtomicU64>,
    /// Fault service time in all (ns), and three parts of it: waiting
    /// for the manager's lock, reading runs out of the store
    /// (decompression included), and installing pages (`UFFDIO_COPY`).
    /// The rest is eviction to make room and the books.
    pub service_ns: AtomicU64,
    /// … waiting for the manager's lock.
    pub lock_wait_ns: AtomicU64,
    /// Nanoseconds the program's threads waited for evictions in flight
    /// to commit (deferred faults; `--fault-path signal` only: in the
    /// handler thread's mode the writer sleeps in the kernel).
    pub deferred_wait_ns: AtomicU64,
    /// Fault service time reading runs out of the store.
    pub store_read_ns: AtomicU64,
    /// Fault service time installing pages.
    pub install_ns: AtomicU64,
}

impl Stats {
    /// Zeroed counters.
    pub fn new() -> Stats {
        Stats {
            faults: AtomicU64::new(0),
            zero_faults: AtomicU64::new(0),
            store_faults: AtomicU64::new(0),
            lone_faults: AtomicU64::new(0),
            pinned_calls: AtomicU64::new(0),
            dispatched_calls: AtomicU64::new(0),
            direct_calls: AtomicU64::new(0),
            pinned_in: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            taken_back: AtomicU64::new(0),
            committed_early: AtomicU64::new(0),
            pages_compressed: AtomicU64::new(0),
            evicted_inline: AtomicU64::new(0),
            inline_evictions: AtomicU64::new(0),
            evict_ns: AtomicU64::new(0),
            evict_take_ns: AtomicU64::new(0),
            evict_protect_ns: AtomicU64::new(0),
            evict_compress_ns: AtomicU64::new(0),
            evict_tier_ns: AtomicU64::new(0),
            evict_release_ns: AtomicU64::new(0),
            evicted_zero: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            wp_faults: AtomicU64::new(0),
            wp_calls: AtomicU64::new(0),
            wp_batches_far: AtomicU64::new(0),
            wp_batches_near: AtomicU64::new(0),
            promoted: AtomicU64::new(0),
            demoted: AtomicU64::new(0),
            regretted: AtomicU64::new(0),
            age_every: AtomicUsize::new(ztier_policy::segmented::AGE_FASTEST),
            hot_distance: AtomicUsize::new(0),
            clean_evicted: AtomicU64::new(0),
            dirtied: AtomicU64::new(0),
            forks: AtomicU64::new(0),
            forked_child: AtomicU64::new(0),
            resident: AtomicUsize::new(0),
            peak_store_bytes: AtomicU64::new(0),
            peak_store_orig: AtomicU64::new(0),
            store_inherited: (AtomicU64::new(0), AtomicU64::new(0)),
            peak_resident: AtomicUsize::new(0),
            latency: (0..LAT_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            service_ns: AtomicU64::new(0),
            lock_wait_ns: AtomicU64::new(0),
            deferred_wait_ns: AtomicU64::new(0),
            store_read_ns: AtomicU64::new(0),
            install_ns: AtomicU64::new(0),
        }
    }

    /// Resets every counter (a forked child counts its own).
    pub fn reset(&self, resident: usize) {
        for c in [
            &self.faults,
            &self.zero_faults,
            &self.store_faults,
            &self.lone_faults,
            &self.pinned_calls,
            &self.pinned_in,
            &self.dispatched_calls,
            &self.direct_calls,
            &self.prefetched,
            &self.pages_compressed,
            &self.evicted_inline,
            &self.inline_evictions,
            &self.evict_ns,
            &self.evict_take_ns,
            &self.evict_protect_ns,
            &self.evict_compress_ns,
            &self.evict_tier_ns,
            &self.evict_release_ns,
            &self.evicted_zero,
            &self.refused,
            &self.wp_faults,
            &self.wp_calls,
            &self.wp_batches_far,
            &self.wp_batches_near,
            &self.deferred,
            &self.taken_back,
            &self.committed_early,
            &self.promoted,
            &self.demoted,
            &self.regretted,
            &self.clean_evicted,
            &self.dirtied,
            &self.forks,
            &self.peak_store_bytes,
            &self.peak_store_orig,
            &self.service_ns,
            &self.lock_wait_ns,
            &self.deferred_wait_ns,
            &self.store_read_ns,
            &self.install_ns,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        for c in &self.latency {
            c.store(0, Ordering::Relaxed);
        }
        self.resident.store(resident, Ordering::Relaxed);
        self.peak_resident.store(resident, Ordering::Relaxed);
    }

    /// Counts one fault service time.
    pub fn record(&self, ns: u64) {
        let b = lat_bucket(ns);
        self.latency[b].fetch_add(1, Ordering::Relaxed);
        self.service_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Adds the nanoseconds from its start to its drop to a counter.
pub struct Timed<'a>(&'a AtomicU64, std::time::Instant);

impl<'a> Timed<'a> {
    /// Starts timing into `counter`.
    pub fn start(counter: &'a AtomicU64) -> Timed<'a> {
        Timed(counter, std::time::Instant::now())
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(self.1.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_ordered_and_bounded() {
        let mut last = 0;
        for i in 0..LAT_BUCKETS - 1 {
            let u = lat_upper_ns(i);
            assert!(u > last, "bucket {i}");
            assert_eq!(lat_bucket(u - 1), i, "bucket {i} holds times just under its bound");
            last = u;
        }
        assert_eq!(lat_bucket(5_000), 50);
        assert_eq!(lat_bucket(150_000), 1005);
        assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS - 1);
        assert!(lat_upper_ns(LAT_BUCKETS - 1) >= 10_000_000);
    }

    #[test]
    fn quantiles_read_the_upper_bound_of_their_bucket() {
        let mut lat = vec![0u64; LAT_BUCKETS];
        assert_eq!(quantile_us(&lat, 0.5), 0.0);
        // 98 faults of 4.95 µs, one of 150 µs, one of a second.
        lat[lat_bucket(4_950)] += 98;
        lat[lat_bucket(150_000)] += 1;
        lat[lat_bucket(1_000_000_000)] += 1;
        assert_eq!(quantile_us(&lat, 0.5), 5.0);
        assert_eq!(quantile_us(&lat, 0.98), 5.0);
        assert_eq!(quantile_us(&lat, 0.99), 160.0);
        assert_eq!(quantile_us(&lat, 1.0), lat_upper_ns(LAT_BUCKETS - 1) as f64 / 1000.0);
    }

    #[test]
    fn a_reset_zeroes_the_counts_and_starts_the_peak_at_the_resident_pages() {
        let s = Stats::new();
        assert_eq!(s.age_every.load(Ordering::Relaxed), ztier_policy::segmented::AGE_FASTEST);
        s.faults.fetch_add(3, Ordering::Relaxed);
        s.forked_child.store(1, Ordering::Relaxed);
        s.peak_resident.store(900, Ordering::Relaxed);
        s.record(5_000);
        s.record(7_000);
        assert_eq!(s.service_ns.load(Ordering::Relaxed), 12_000);
        assert_eq!(s.latency[50].load(Ordering::Relaxed), 1);
        s.reset(40);
        assert_eq!(s.faults.load(Ordering::Relaxed), 0);
        assert_eq!(s.service_ns.load(Ordering::Relaxed), 0);
        assert!(s.latency.iter().all(|c| c.load(Ordering::Relaxed) == 0));
        assert_eq!((s.resident.load(Ordering::Relaxed), s.peak_resident.load(Ordering::Relaxed)), (40, 40));
        // What says what the process is stays.
        assert_eq!(s.forked_child.load(Ordering::Relaxed), 1);
    }
}
