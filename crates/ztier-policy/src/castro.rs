//! `castro`: adaptive sizing by expense and profit (de Castro, Lago & de
//! Oliveira, "Adaptive Compressed Caching: Design and Implementation",
//! SBAC-PAD 2003, §3).
//!
//! Every read from the compressed region is classified by where the page
//! would have been **without** a compressed region: if it was among the M
//! most recently used pages (M = memory size), plain LRU memory would have
//! held it uncompressed — the compressed region cost a decompression: an
//! **expense** read. Otherwise the compressed region saved a read from
//! disk: a **profit** read. (The paper keeps expense and profit lists by
//! LRU position; the exact stack depth gives the same classification.)
//!
//! * The region grows by one cell whenever a page must be evicted from
//!   uncompressed memory (a fault once memory is full, i.e. once more
//!   than M distinct pages have been touched) and growth is not locked.
//! * Two consecutive expense reads lock growth; the third (and every
//!   further consecutive one) shrinks the region by one cell — in the
//!   paper, by relocating fragments to free a cell, else freeing the
//!   oldest cell; here the simulator evicts the oldest compressed pages.
//! * A profit read unlocks growth and ends the run of expenses.
//!
//! Choices where the paper leaves room: a cell is 2 pages (the paper's
//! best cell size); the region never exceeds half of memory (the paper
//! bounds it by the memory available); the compression ratio enters
//! through the depth test (pages held compressed beyond M are profit).

use crate::policy::{Outcome, Policy, Reference};

/// Pages per cell.
pub const CELL_PAGES: usize = 2;

/// The expense/profit policy.
pub struct Castro {
    m: usize,
    max: usize,
    target: usize,
    locked: bool,
    expenses: u32,
    /// Distinct pages seen (first references): memory is full, and a
    /// fault evicts, only once more than M pages have been touched.
    touched: usize,
}

impl Castro {
    /// The policy for a memory of `memory_pages` pages.
    pub fn new(memory_pages: usize) -> Self {
        let m = memory_pages.max(2);
        Castro { m, max: m / 2, target: 0, locked: false, expenses: 0, touched: 0 }
    }

    /// Whether growth is locked.
    pub fn locked(&self) -> bool {
        self.locked
    }
}

impl Policy for Castro {
    fn name(&self) -> String {
        "castro".into()
    }

    fn interest_depth(&self) -> usize {
        // Shallower references hit uncompressed whatever the region's size.
        self.m - self.max
    }

    fn reference(&mut self, r: &Reference) {
        match r.outcome {
            Outcome::Hit => {}
            Outcome::CompressedHit => {
                let expense = r.depth.is_some_and(|d| d <= self.m);
                if expense {
                    self.expenses += 1;
                    if self.expenses >= 2 {
                        self.locked = true;
                    }
                    if self.expenses >= 3 {
                        self.target = self.target.saturating_sub(CELL_PAGES);
                    }
                } else {
                    self.expenses = 0;
                    self.locked = false;
                }
            }
            Outcome::Fault => {
                if r.depth.is_none() {
                    self.touched += 1;
                }
                // Only a fault that must evict a page grows the region:
                // the re-read of an evicted page, or a new page once
                // memory is full. Filling free memory does not.
                let evicts = r.depth.is_some() || self.touched > self.m;
                if !self.locked && evicts {
                    self.target = (self.target + CELL_PAGES).min(self.max);
                }
            }
        }
    }

    fn target(&self) -> usize {
        self.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(depth: usize, outcome: Outcome) -> Reference {
        Reference { depth: Some(depth), outcome, size: 1000 }
    }

    /// Fills memory with first references (no growth: nothing is evicted).
    fn fill(c: &mut Castro, pages: usize) {
        for _ in 0..pages {
            c.reference(&Reference { depth: None, outcome: Outcome::Fault, size: 1000 });
        }
    }

    /// §3: the region grows while pages are evicted and growth is unlocked.
    #[test]
    fn grows_by_a_cell_per_eviction_up_to_half_of_memory() {
        let mut c = Castro::new(100);
        fill(&mut c, 100);
        assert_eq!(c.target(), 0, "filling free memory evicts nothing");
        fill(&mut c, 1);
        assert_eq!(c.target(), CELL_PAGES);
        let mut c = Castro::new(100);
        fill(&mut c, 100);
        for _ in 0..10 {
            c.reference(&r(150, Outcome::Fault));
        }
        assert_eq!(c.target(), 10 * CELL_PAGES);
        for _ in 0..100 {
            c.reference(&r(150, Outcome::Fault));
        }
        assert_eq!(c.target(), 50);
    }

    /// §3: two consecutive expense reads lock growth; the third shrinks.
    #[test]
    fn two_expense_reads_lock_the_third_shrinks() {
        let mut c = Castro::new(100);
        fill(&mut c, 100);
        for _ in 0..10 {
            c.reference(&r(150, Outcome::Fault));
        }
        let t = c.target();
        c.reference(&r(90, Outcome::CompressedHit)); // within M: expense
        assert!(!c.locked());
        c.reference(&r(95, Outcome::CompressedHit));
        assert!(c.locked());
        c.reference(&r(150, Outcome::Fault));
        assert_eq!(c.target(), t, "locked: no growth");
        c.reference(&r(85, Outcome::CompressedHit));
        assert_eq!(c.target(), t - CELL_PAGES, "the third expense read shrinks");
    }

    /// §3: a profit read (a page the region saved from disk) unlocks.
    #[test]
    fn a_profit_read_unlocks() {
        let mut c = Castro::new(100);
        fill(&mut c, 100);
        c.reference(&r(90, Outcome::CompressedHit));
        c.reference(&r(90, Outcome::CompressedHit));
        assert!(c.locked());
        c.reference(&r(130, Outcome::CompressedHit)); // beyond M: profit
        assert!(!c.locked());
        c.reference(&r(150, Outcome::Fault));
        assert_eq!(c.target(), CELL_PAGES);
        // The run of expenses starts again from zero.
        c.reference(&r(90, Outcome::CompressedHit));
        assert!(!c.locked());
    }
}
