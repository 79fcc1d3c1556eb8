//! `castro`, `castro-aggressive`, `castro-sluggish`: adaptive sizing by
//! expense and profit (Rodrigo S. de Castro, Alair Pereira do Lago, Dilma
//! Da Silva, "Adaptive Compressed Caching: Design and Implementation",
//! SBAC-PAD 2003, §3, Figure 5 and Table 1).
//!
//! # Expense and profit
//!
//! Every read from the compressed cache is classified by where the page
//! would be **without** a compressed cache. If it is among the M most
//! recently used pages (M = memory size), plain LRU memory would have held
//! it uncompressed: the compressed cache cost a decompression, an
//! **expense** read (the paper's *expense list*). Otherwise the compressed
//! cache saved a read from disk: a **profit** read (the *profit list*).
//! The paper keeps the two lists by LRU position; the exact stack depth
//! the simulator and `ztier run` give ([`Reference::depth`]) makes the same
//! split.
//!
//! # The rules (Figure 5), one per test
//!
//! ```text
//!   fault that evicts a page ──► room for it in the cache? ── yes ─► store it
//!                                       │ no
//!                         growth locked? ── no ─► grow by one cell
//!                                       │ yes
//!                                       └──────► free the oldest pages
//!
//!   profit read ──► the run of expense reads ends, the barrier is removed
//!
//!   expense read ──► run += 1
//!        run = 2 ──► lock growth (the growth barrier)
//!        run = 3 ──► shrink by one cell: relocate a cell's pages if the
//!                    others have room, else free the oldest pages;
//!                    then "the growth barrier is removed and the
//!                    analysis starts again" (run = 0, unlocked)
//! ```
//!
//! The last line is what the policy before this one missed: it stayed
//! locked after the shrink, shrank again on every further expense read,
//! and unlocked only at a profit read — which never comes once the cache
//! has shrunk to nothing, so on many traces it sat at zero for good.
//!
//! The paper's Table 1 compares its policy with two others, kept here as
//! named variants of the same state machine ([`Evidence`]):
//!
//! * `castro-aggressive` "shrinks the compressed cache at each access to
//!   the expense list": lock and shrink at the first expense read (there
//!   is never a barrier to remove).
//! * `castro-sluggish` is "less sensible to changes" and "takes an action
//!   when there is stronger evidence"; the paper gives no number. Chosen
//!   here: twice castro's run, lock at the 4th consecutive expense read,
//!   shrink at the 6th. If a share p of the cache's reads were expense
//!   reads at random, a run of k happens by chance with probability p^k:
//!   at p = ½, 1/8 for castro, 1/64 for sluggish.
//!
//! # How the simulator plays the shrink (relocation)
//!
//! The policy only sets the cache's size (its [`Policy::target`], in pages
//! of memory); the frontend holds the pages. `ztier sim` models the
//! compressed region as its bytes, packed without fragmentation: a shrink
//! by one cell (C pages of memory → C − 2) keeps every compressed page if
//! the region had a cell's worth of bytes free — the cell's pages are
//! *relocated* into the other cells, at no charge (the copy is not
//! counted) — and otherwise sends the region's **oldest** pages to the
//! backing store until the rest fit, which is what freeing the oldest
//! cell does when cells fill in the order pages arrive. `ztier run`'s
//! store does the same with real bytes (it compacts, then spills the
//! oldest).
//!
//! # Choices where the paper leaves room
//!
//! * A cell is 2 pages (the paper's best cell size); the cache never
//!   exceeds half of memory (the paper bounds it by the memory available).
//! * Growth is decided at faults that evict a page (a fault once memory is
//!   full: more than M distinct pages touched, or the re-read of an evicted
//!   page). A compressed read frees the fragment the evicted page then
//!   takes, so it needs no new cell; deciding growth there would also undo
//!   every shrink at once, since a shrink leaves the cache full.
//! * "Room" is an estimate kept from the sizes the frontend reports
//!   ([`Policy::compressed`]): a new cell holds 2 pages' bytes, less the 2
//!   pages of uncompressed memory it takes, which are compressed into it;
//!   each evicted page then takes the mean compressed size; a compressed
//!   read gives back its page's size. The frontend need not report every
//!   page (`ztier run` reports its store's mean now and then).

use crate::policy::{Outcome, Policy, Reference};

/// Pages of memory per cell.
pub const CELL_PAGES: usize = 2;
const PAGE: f64 = 4096.0;
/// Compressed-size mean before the frontend reports any (ratio 2).
const FIRST_MEAN: f64 = 2048.0;
/// Per-report decay of the compressed-size mean (256 reports to 20%).
const MEAN_DECAY_EVENTS: f64 = 256.0;

/// How much evidence a variant wants before it acts: the length of the
/// run of consecutive expense reads that locks growth and the one that
/// shrinks the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    /// Run length that locks growth.
    pub lock_at: u32,
    /// Run length that shrinks the cache (then unlocks and starts again).
    pub shrink_at: u32,
}

/// §3's policy: two expense reads lock, the third shrinks.
pub const CASTRO: Evidence = Evidence { lock_at: 2, shrink_at: 3 };
/// Table 1's aggressive policy: every expense read shrinks.
pub const AGGRESSIVE: Evidence = Evidence { lock_at: 1, shrink_at: 1 };
/// Table 1's sluggish policy: twice castro's evidence.
pub const SLUGGISH: Evidence = Evidence { lock_at: 4, shrink_at: 6 };

/// The expense/profit policy.
pub struct Castro {
    name: &'static str,
    evidence: Evidence,
    m: usize,
    max: usize,
    target: usize,
    locked: bool,
    /// Consecutive expense reads since the last action or profit read.
    run: u32,
    /// Distinct pages seen (first references): memory is full, and a
    /// fault evicts, only once more than M pages have been touched.
    touched: usize,
    /// Estimated free bytes in the cache.
    room: f64,
    /// Decayed sum and count of the compressed sizes reported.
    size_sum: f64,
    size_n: f64,
    shrinks: u64,
    relocations: u64,
}

impl Castro {
    /// §3's policy for a memory of `memory_pages` pages.
    pub fn new(memory_pages: usize) -> Self {
        Self::variant("castro", CASTRO, memory_pages)
    }

    /// `castro-aggressive`.
    pub fn aggressive(memory_pages: usize) -> Self {
        Self::variant("castro-aggressive", AGGRESSIVE, memory_pages)
    }

    /// `castro-sluggish`.
    pub fn sluggish(memory_pages: usize) -> Self {
        Self::variant("castro-sluggish", SLUGGISH, memory_pages)
    }

    fn variant(name: &'static str, evidence: Evidence, memory_pages: usize) -> Self {
        assert!(1 <= evidence.lock_at && evidence.lock_at <= evidence.shrink_at, "{evidence:?}");
        let m = memory_pages.max(2);
        Castro {
            name,
            evidence,
            m,
            max: m / 2,
            target: 0,
            locked: false,
            run: 0,
            touched: 0,
            room: 0.0,
            size_sum: 0.0,
            size_n: 0.0,
            shrinks: 0,
            relocations: 0,
        }
    }

    /// Whether growth is locked (the growth barrier is up).
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// Shrinks so far, and how many of them could relocate the freed
    /// cell's pages instead of freeing the oldest ones (by the estimate).
    pub fn shrinks(&self) -> (u64, u64) {
        (self.shrinks, self.relocations)
    }

    /// Mean compressed size of a page, bytes.
    fn mean(&self) -> f64 {
        if self.size_n > 0.0 {
            self.size_sum / self.size_n
        } else {
            FIRST_MEAN
        }
    }

    fn shrink(&mut self) {
        if self.target == 0 {
            return;
        }
        self.target -= CELL_PAGES;
        self.shrinks += 1;
        let cell = CELL_PAGES as f64 * PAGE;
        if self.room >= cell {
            self.relocations += 1;
            self.room -= cell;
        } else {
            // The oldest pages go: the cache is full again at its new size.
            self.room = 0.0;
        }
    }

    /// A page evicted from uncompressed memory is stored in the cache.
    fn store_evicted(&mut self) {
        let need = self.mean();
        if self.room < need && !self.locked && self.target + CELL_PAGES <= self.max {
            self.target += CELL_PAGES;
            self.room += CELL_PAGES as f64 * (PAGE - need);
        }
        // Locked (or at its largest): the oldest pages make room.
        self.room = (self.room - need).max(0.0);
    }
}

impl Policy for Castro {
    fn name(&self) -> String {
        self.name.into()
    }

    fn interest_depth(&self) -> usize {
        // Shallower references hit uncompressed whatever the cache's size.
        self.m - self.max
    }

    fn reference(&mut self, r: &Reference) {
        match r.outcome {
            Outcome::Hit => {}
            Outcome::CompressedHit => {
                // The page leaves the cache; the page it displaces from
                // uncompressed memory takes its place.
                self.room = (self.room + f64::from(r.size) - self.mean()).max(0.0);
                let expense = r.depth.is_some_and(|d| d <= self.m);
                if !expense {
                    self.run = 0;
                    self.locked = false;
                    return;
                }
                self.run += 1;
                if self.run >= self.evidence.lock_at {
                    self.locked = true;
                }
                if self.run >= self.evidence.shrink_at {
                    self.shrink();
                    self.run = 0;
                    self.locked = false;
                }
            }
            Outcome::Fault => {
                if r.depth.is_none() {
                    self.touched += 1;
                }
                // Only a fault that must evict a page stores one in the
                // cache: the re-read of an evicted page, or a new page
                // once memory is full. Filling free memory does not.
                if r.depth.is_some() || self.touched > self.m {
                    self.store_evicted();
                }
            }
        }
        self.room = self.room.min(self.target as f64 * PAGE);
    }

    fn target(&self) -> usize {
        self.target
    }

    fn compressed(&mut self, size: u16) {
        let keep = 0.2f64.powf(1.0 / MEAN_DECAY_EVENTS);
        self.size_sum = self.size_sum * keep + f64::from(size);
        self.size_n = self.size_n * keep + 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: usize = 100;
    /// Compressed size of every page in these tests: ratio 4, so a new
    /// cell (2 pages) holds the 2 pages it takes from memory and 6 more.
    const SIZE: u16 = 1024;

    fn at(depth: usize, outcome: Outcome) -> Reference {
        Reference { depth: Some(depth), outcome, size: SIZE }
    }
    /// A read from the cache of a page that would be in memory without it.
    fn expense() -> Reference {
        at(M - 10, Outcome::CompressedHit)
    }
    /// A read from the cache of a page that would be on disk without it.
    fn profit() -> Reference {
        at(M + 30, Outcome::CompressedHit)
    }
    /// A fault on a page evicted before (it evicts another).
    fn refault() -> Reference {
        at(M + 400, Outcome::Fault)
    }

    /// A policy whose memory is full (M pages touched, nothing evicted).
    fn full(p: fn(usize) -> Castro) -> Castro {
        let mut c = p(M);
        c.compressed(SIZE);
        for _ in 0..M {
            c.reference(&Reference { depth: None, outcome: Outcome::Fault, size: SIZE });
        }
        assert_eq!(c.target(), 0, "filling free memory evicts nothing");
        c
    }

    /// Grown to `cells` cells, with the cache full.
    fn grown(p: fn(usize) -> Castro, cells: usize) -> Castro {
        let mut c = full(p);
        while c.target() < cells * CELL_PAGES {
            c.reference(&refault());
        }
        while c.room >= f64::from(SIZE) {
            c.reference(&refault());
        }
        assert_eq!(c.target(), cells * CELL_PAGES);
        c
    }

    /// An expense read is a read of a page that plain LRU memory of the
    /// same size would have held; a profit read, of one it would not.
    #[test]
    fn a_read_is_an_expense_when_the_page_would_be_in_memory_without_the_compressed_cache() {
        let mut c = grown(Castro::new, 5);
        c.reference(&at(M, Outcome::CompressedHit)); // the M-th most recent: in memory
        c.reference(&at(M, Outcome::CompressedHit));
        assert!(c.locked(), "two reads at depth M are expense reads");
        let mut c = grown(Castro::new, 5);
        c.reference(&at(M + 1, Outcome::CompressedHit));
        c.reference(&at(M + 1, Outcome::CompressedHit));
        assert!(!c.locked(), "reads at depth M + 1 are profit reads");
    }

    /// Figure 5: a page evicted from memory that finds no room in the
    /// compressed cache makes it grow by one cell while growth is not
    /// locked; a page that finds room is simply stored.
    #[test]
    fn the_cache_grows_by_a_cell_when_an_evicted_page_finds_no_room() {
        let mut c = full(Castro::new);
        c.reference(&Reference { depth: None, outcome: Outcome::Fault, size: SIZE });
        assert_eq!(c.target(), CELL_PAGES, "the first page evicted finds an empty cache: one cell");
        // That cell holds its 2 pages of memory compressed (2 KiB) and
        // the first evicted page; 5 KiB are left: 5 more pages fit.
        for _ in 0..5 {
            c.reference(&refault());
            assert_eq!(c.target(), CELL_PAGES, "room for the page: no growth");
        }
        c.reference(&refault());
        assert_eq!(c.target(), 2 * CELL_PAGES, "no room: another cell");
        // Up to half of memory.
        for _ in 0..1000 {
            c.reference(&refault());
        }
        assert_eq!(c.target(), M / 2);
    }

    /// Figure 5: two consecutive accesses to the expense list lock growth.
    #[test]
    fn two_consecutive_expense_reads_lock_growth() {
        let mut c = grown(Castro::new, 5);
        c.reference(&expense());
        assert!(!c.locked(), "one expense read is not enough");
        c.reference(&expense());
        assert!(c.locked());
        for _ in 0..20 {
            c.reference(&refault());
        }
        assert_eq!(c.target(), 5 * CELL_PAGES, "locked: faults do not grow the cache");
        // A fault between expense reads does not break their run.
        c.reference(&expense());
        assert_eq!(c.target(), 4 * CELL_PAGES, "the run went on: the third shrinks");
    }

    /// Figure 5: on the third consecutive access to the expense list the
    /// compressed cache shrinks by one cell.
    #[test]
    fn the_third_consecutive_expense_read_shrinks_the_cache_by_a_cell() {
        let mut c = grown(Castro::new, 5);
        c.reference(&expense());
        c.reference(&expense());
        assert_eq!(c.target(), 5 * CELL_PAGES, "locked, not shrunk yet");
        c.reference(&expense());
        assert_eq!(c.target(), 4 * CELL_PAGES);
        // The cache was full: the oldest pages went, nothing relocated.
        assert_eq!(c.shrinks(), (1, 0));
    }

    /// §3: the shrink relocates the pages of a cell when the other cells
    /// have room for them, else frees the oldest pages.
    #[test]
    fn the_shrink_relocates_a_cells_pages_when_the_others_have_room() {
        let mut c = grown(Castro::new, 5);
        // Profit reads of pages that took 4000 bytes each, displacing
        // pages of 1024: three leave a cell's worth of room.
        for _ in 0..3 {
            c.reference(&Reference { size: 4000, ..profit() });
        }
        for _ in 0..3 {
            c.reference(&expense());
        }
        assert_eq!(c.target(), 4 * CELL_PAGES);
        assert_eq!(c.shrinks(), (1, 1), "a cell's worth of room: relocated");
        for _ in 0..3 {
            c.reference(&expense());
        }
        assert_eq!(c.shrinks(), (2, 1), "full again: the oldest pages went");
    }

    /// §3: "once one of these actions is taken, the growth barrier is
    /// removed and the analysis starts again".
    #[test]
    fn once_an_action_is_taken_the_growth_barrier_is_removed_and_the_analysis_starts_again() {
        let mut c = grown(Castro::new, 5);
        for _ in 0..3 {
            c.reference(&expense());
        }
        assert_eq!(c.target(), 4 * CELL_PAGES);
        assert!(!c.locked(), "the barrier is removed after the shrink");
        c.reference(&refault());
        assert_eq!(c.target(), 5 * CELL_PAGES, "unlocked: the full cache grows again");
        // The analysis starts again: the next expense read is the first of
        // a new run; only the third from now shrinks.
        c.reference(&expense());
        assert!(!c.locked());
        c.reference(&expense());
        assert!(c.locked());
        assert_eq!(c.target(), 5 * CELL_PAGES);
        c.reference(&expense());
        assert_eq!(c.target(), 4 * CELL_PAGES);
    }

    /// The policy before this one stayed locked after shrinking and sat at
    /// zero for good once the cache was empty (nothing left to read, so no
    /// profit read to unlock it). Expense runs shrink the cache to
    /// nothing; the next faults grow it again.
    #[test]
    fn a_cache_shrunk_to_nothing_grows_again() {
        let mut c = grown(Castro::new, 3);
        for _ in 0..9 {
            c.reference(&expense());
        }
        assert_eq!(c.target(), 0);
        assert!(!c.locked());
        c.reference(&refault());
        assert_eq!(c.target(), CELL_PAGES);
    }

    /// §3: a read from the profit list (the cache saved a disk read) ends
    /// the run of expense reads and removes the barrier.
    #[test]
    fn a_profit_read_ends_the_run_and_removes_the_barrier() {
        let mut c = grown(Castro::new, 5);
        c.reference(&expense());
        c.reference(&expense());
        assert!(c.locked());
        c.reference(&profit());
        assert!(!c.locked());
        c.reference(&expense());
        c.reference(&expense());
        assert_eq!(c.target(), 5 * CELL_PAGES, "the run started again at the profit read");
        c.reference(&expense());
        assert_eq!(c.target(), 4 * CELL_PAGES);
    }

    /// Table 1: the aggressive policy shrinks the compressed cache at each
    /// access to the expense list.
    #[test]
    fn aggressive_shrinks_at_each_access_to_the_expense_list() {
        let mut c = grown(Castro::aggressive, 5);
        assert_eq!(c.name(), "castro-aggressive");
        for k in 1..=5 {
            c.reference(&expense());
            assert_eq!(c.target(), (5 - k) * CELL_PAGES);
            assert!(!c.locked(), "no barrier is left up");
        }
        c.reference(&refault());
        assert_eq!(c.target(), CELL_PAGES);
    }

    /// Table 1: the sluggish policy takes an action only when there is
    /// stronger evidence: it locks at the 4th consecutive expense read and
    /// shrinks at the 6th, and a profit read in between starts it over.
    #[test]
    fn sluggish_acts_only_on_stronger_evidence() {
        let mut c = grown(Castro::sluggish, 5);
        assert_eq!(c.name(), "castro-sluggish");
        for _ in 0..3 {
            c.reference(&expense());
        }
        assert!(!c.locked(), "three expense reads are not enough");
        c.reference(&expense());
        assert!(c.locked());
        c.reference(&expense());
        assert_eq!(c.target(), 5 * CELL_PAGES);
        c.reference(&profit());
        for _ in 0..5 {
            c.reference(&expense());
        }
        assert_eq!(c.target(), 5 * CELL_PAGES, "the profit read started the run over");
        c.reference(&expense());
        assert_eq!(c.target(), 4 * CELL_PAGES);
        assert!(!c.locked());
    }
}
