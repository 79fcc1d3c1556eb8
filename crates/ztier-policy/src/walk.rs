//! `walk`: the prefetch `ztier run` ships. A fault right after the last
//! fault's pages continues a sequential walk and brings in up to
//! `prefetch` stored pages; one within 16 pages after one of the last 8
//! faults continues one of several interleaved ascending walks (a
//! collector tracing objects of several size classes, each class's pages
//! in allocation order) and brings in up to [`STREAM_PREFETCH`]; any
//! other fault brings its page alone. A first touch fills up to
//! [`ZERO_RUN`] never-touched pages with zeros, walk or not.

use crate::prefetch::{Prefetch, Walk, MAX_STORE_RUN};

/// Zero pages installed per fault on a never-touched page.
pub const ZERO_RUN: usize = 16;
/// Stored pages installed per fault when faults run sequentially, where
/// the pager is not told (`ZTIER_PREFETCH` unset).
pub const PREFETCH: usize = 8;
/// What `ztier run --prefetch` gives by default (and the simulator).
pub const SHIPPED_PREFETCH: usize = 32;
/// Stored pages installed per fault when the fault continues one of the
/// last 8 faults' walks (within 16 pages after it) but not the last one's.
pub const STREAM_PREFETCH: usize = 8;

/// Walk detection over the last faults.
pub struct WalkPrefetch {
    prefetch: usize,
    last_fault: usize,
    /// Pages of the last faults (stream detection).
    recent: [usize; 8],
    recent_at: usize,
}

impl WalkPrefetch {
    /// Up to `prefetch` stored pages (1..=64) for a sequential walk.
    pub fn new(prefetch: usize) -> Self {
        WalkPrefetch {
            prefetch: prefetch.clamp(1, MAX_STORE_RUN),
            last_fault: usize::MAX,
            recent: [usize::MAX; 8],
            recent_at: 0,
        }
    }
}

impl Prefetch for WalkPrefetch {
    fn name(&self) -> &'static str {
        "walk"
    }

    fn fault(&mut self, i: usize) -> Walk {
        let sequential = i == self.last_fault.wrapping_add(1);
        // One of several interleaved ascending walks: a recent fault
        // shortly before this one.
        let stream = self.recent.iter().any(|&r| r < i && i - r <= 16);
        self.recent[self.recent_at % 8] = i;
        self.recent_at += 1;
        self.last_fault = i;
        Walk { sequential, stream }
    }

    fn store_run(&self, w: Walk) -> usize {
        if w.sequential {
            self.prefetch
        } else if w.stream {
            self.prefetch.min(STREAM_PREFETCH)
        } else {
            1
        }
    }

    fn zero_run(&self) -> usize {
        ZERO_RUN
    }

    fn ran_to(&mut self, last: usize) {
        self.last_fault = last;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_and_interleaved_walks_prefetch_and_lone_faults_do_not() {
        let mut p = WalkPrefetch::new(32);
        let w = p.fault(300);
        assert!(w.lone());
        assert_eq!(p.store_run(w), 1);
        p.ran_to(300);
        let w = p.fault(301);
        assert!(w.sequential);
        assert_eq!(p.store_run(w), 32);
        p.ran_to(332);
        // Far away: lone; 10 pages after it: an interleaved walk.
        assert!(p.fault(100).lone());
        p.ran_to(100);
        let w = p.fault(110);
        assert!(!w.sequential && w.stream);
        assert_eq!(p.store_run(w), STREAM_PREFETCH);
        // The walk goes on after the pages the last fault brought in.
        p.ran_to(117);
        assert!(p.fault(118).sequential);
        assert_eq!(p.zero_run(), ZERO_RUN);
        assert_eq!(WalkPrefetch::new(1000).store_run(Walk { sequential: true, stream: false }), 64);
    }
}
