//! The live split of a budget between resident pages and the compressed
//! store, by a sizing [`Policy`] that sees faults only (`ztier run
//! --policy ...+kaplan`, and the simulator's model of it).
//!
//! The sizing policies were made for a simulator that sees every
//! reference with its LRU depth. Live there are faults only, so a fault
//! on a stored page is taken as a reference at depth ≈ resident budget +
//! its refault distance (pages evicted since it went out): a compressed
//! hit if the store still held it in memory, a fault if it came from the
//! spill file (the backing store). The policy's target is applied with
//! floors and some hysteresis:
//!
//! * at least an eighth of the budget stays for resident pages, and at
//!   least a sixteenth (2 MiB or more) for the store, which needs room in
//!   every shard to take pages before it spills the oldest;
//! * resizing the store compacts it: only for a real move (a 32nd of the
//!   budget), at most once per 256 references.

use crate::pacing::EVICT_BATCH;
use crate::policy::{Outcome, Policy, Reference};

/// A sizing policy applied to faults.
pub struct Split {
    policy: Box<dyn Policy>,
    /// Pages of memory the budget gives: resident + store.
    total: usize,
    /// Store pages applied last.
    applied: usize,
    /// Mean compressed page size seen (bytes).
    size: u16,
    /// References fed since the last resize.
    since: usize,
}

impl Split {
    /// `policy` splitting `total` pages.
    pub fn new(policy: Box<dyn Policy>, total: usize) -> Split {
        Split { policy, total, applied: usize::MAX, size: 2048, since: 0 }
    }

    /// The policy's name.
    pub fn name(&self) -> String {
        self.policy.name()
    }

    /// Pages resident and store share now.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The store's pages applied last (`usize::MAX` before the first).
    pub fn store_pages(&self) -> usize {
        self.applied
    }

    /// A fault on a stored page at refault `distance` while `budget` pages
    /// may be resident; `in_memory()` tells whether the store held it in
    /// memory (asked only when the policy wants the reference). Returns
    /// the store's new share (pages) when it moves.
    pub fn fault(
        &mut self,
        budget: usize,
        distance: usize,
        in_memory: impl FnOnce() -> bool,
    ) -> Option<usize> {
        let depth = budget + distance;
        if depth <= self.policy.interest_depth() {
            return None;
        }
        let outcome = if in_memory() { Outcome::CompressedHit } else { Outcome::Fault };
        self.policy.reference(&Reference { depth: Some(depth), outcome, size: self.size });
        self.since += 1;
        self.apply(false)
    }

    /// The store's share of the total (pages) if it is to move now (or
    /// `force`d): then resident pages get the rest.
    pub fn apply(&mut self, force: bool) -> Option<usize> {
        let floor = (self.total / 8).max(EVICT_BATCH * 4).min(self.total);
        let t = self.policy.target().max(self.total / 16).max(512).min(self.total - floor);
        if !force && (t.abs_diff(self.applied) < (self.total / 32).max(16) || self.since < 256) {
            return None;
        }
        self.since = 0;
        self.applied = t;
        Some(t)
    }

    /// The store's pages compress to `mean` bytes each now.
    pub fn compressed(&mut self, mean: u64) {
        self.size = mean.clamp(1, 4096) as u16;
        self.policy.compressed(self.size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::static_size::Static;

    #[test]
    fn a_static_split_is_applied_once_with_its_floors() {
        let mut s = Split::new(Box::new(Static::new("static:0.5".into(), 0.5, 8192)), 8192);
        assert_eq!(s.apply(true), Some(4096));
        assert_eq!(s.store_pages(), 4096);
        // No move: nothing to apply, whatever the faults.
        for d in 0..1000 {
            assert_eq!(s.fault(4096, d * 10, || true), None);
        }
        // At least 512 pages for the store, an eighth for resident pages.
        let mut s = Split::new(Box::new(Static::new("static:0".into(), 0.0, 8192)), 8192);
        assert_eq!(s.apply(true), Some(512));
        let mut s = Split::new(Box::new(Static::new("static:0.99".into(), 0.99, 8192)), 8192);
        assert_eq!(s.apply(true), Some(8192 - 1024));
    }

    #[test]
    fn faults_that_a_larger_store_would_have_served_grow_it() {
        let costs = crate::policy::Costs { disk_ns: 5e6, compress_ns: 7e3, decompress_ns: 2e3 };
        let total = 8192;
        let mut s = Split::new(Box::new(crate::pressure::Pressure::new(total, costs)), total);
        let first = s.apply(true).unwrap();
        let mut moved = None;
        for _ in 0..5000 {
            // Refaults from the spill file, just beyond the resident budget.
            if let Some(t) = s.fault(total - first, 200, || false) {
                moved = Some(t);
            }
        }
        assert!(moved.is_some_and(|t| t > first), "{moved:?} after {first}");
    }
}
