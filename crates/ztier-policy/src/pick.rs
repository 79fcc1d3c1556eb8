//! `pick`: victim choice — the pager's loop over a replacement policy's
//! candidates, the same live (`ztier run`'s evictor) and in the simulator.
//!
//! ```text
//!  looks = queued entries; while victims < want and looks left:
//!    i = candidate(resident)          oldest entry (the protected part ages
//!                                     first if it is due)
//!    verdict = pager's word on i      Take / Hold / Owned / Requeue / Stale
//!    judge(i, verdict)                the policy moves or drops the entry
//!    Take: i is a victim, and so are its resident neighbours i+1, i+2, ..
//!          (fewer than CLUSTER pages from i) while the pager lets them
//!          go ([`Candidates::joins`]) and the policy does
//!          ([`Replacement::clusters`]: not in the protected part)
//! ```
//!
//! Each queue entry is looked at at most once per call: an entry that
//! cannot go now goes to the back (or out of the queues), so a queue of
//! pinned pages ends the call instead of spinning. A neighbour taken
//! along keeps its queue entry, which is stale when it comes up. The
//! victims come out in the order taken (oldest first, each followed by
//! its neighbours); the pager sorts them if it wants runs.
//!
//! What the pager knows of its pages (resident, owned by an eviction in
//! flight, pinned, shared) it says through [`Candidates`]; the run
//! library's is `ztier_run_core::victims::Live`, the simulator's its
//! model of it.

use crate::pacing::CLUSTER;
use crate::replacement::{Replacement, Verdict};

/// What victim choice asks the pager about its pages.
pub trait Candidates {
    /// Pages of the managed range (neighbours stop at its end).
    fn pages(&self) -> usize;

    /// Whether page `i` is resident and not being evicted (an entry of
    /// a page that is not is stale).
    fn resident(&self, i: usize) -> bool;

    /// The pager's verdict on candidate `i` (it may note the page, e.g.
    /// one it sets aside for later).
    fn verdict(&mut self, i: usize) -> Verdict;

    /// Whether page `j`, next to a victim, may go along with it (the
    /// policy is asked besides: [`Replacement::clusters`]).
    fn joins(&self, j: usize) -> bool;

    /// Page `i` is a victim: the pager marks it so.
    fn take(&mut self, i: usize);
}

/// Appends up to `want` victims to `pages`, oldest first, each followed
/// by the resident neighbours that go along (see the module docs).
/// Returns how many it appended.
pub fn pick<R, C>(repl: &mut R, pager: &mut C, want: usize, pages: &mut Vec<usize>) -> usize
where
    R: Replacement + ?Sized,
    C: Candidates,
{
    let first = pages.len();
    let end = pager.pages();
    let mut looks = repl.queued();
    while pages.len() - first < want && looks > 0 {
        looks -= 1;
        let Some(i) = repl.candidate(&|i| pager.resident(i)) else { break };
        let verdict = pager.verdict(i);
        repl.judge(i, verdict);
        if verdict != Verdict::Take {
            continue;
        }
        pager.take(i);
        pages.push(i);
        // Its resident neighbours that the policy lets go along go with
        // it: a run is write-protected and released in one call each.
        let mut j = i + 1;
        while j < end && j < i + CLUSTER && pages.len() - first < want {
            if !pager.joins(j) || !repl.clusters(j) {
                break;
            }
            pager.take(j);
            pages.push(j);
            j += 1;
        }
    }
    pages.len() - first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fifo::Fifo;
    use crate::segmented::Segmented;

    /// A pager's pages in a fake: resident or not, pinned or not.
    struct Fake {
        resident: Vec<bool>,
        pinned: Vec<bool>,
        taken: Vec<usize>,
    }

    impl Fake {
        fn new(pages: usize) -> Fake {
            Fake { resident: vec![false; pages], pinned: vec![false; pages], taken: Vec::new() }
        }
    }

    impl Candidates for Fake {
        fn pages(&self) -> usize {
            self.resident.len()
        }
        fn resident(&self, i: usize) -> bool {
            self.resident[i]
        }
        fn verdict(&mut self, i: usize) -> Verdict {
            match (self.resident[i], self.pinned[i]) {
                (true, false) => Verdict::Take,
                (true, true) => Verdict::Hold,
                (false, _) => Verdict::Stale,
            }
        }
        fn joins(&self, j: usize) -> bool {
            self.resident[j] && !self.pinned[j]
        }
        fn take(&mut self, i: usize) {
            assert!(self.resident[i], "page {i} taken twice or never resident");
            self.resident[i] = false;
            self.taken.push(i);
        }
    }

    fn fill<R: Replacement + ?Sized>(repl: &mut R, pager: &mut Fake, order: &[usize]) {
        for &i in order {
            pager.resident[i] = true;
            repl.resident(i);
        }
    }

    #[test]
    fn victims_come_oldest_first_with_the_neighbours_that_go_along() {
        let mut repl = Fifo::new(vec![0u8; 64], vec![0u32; 64]);
        let mut pager = Fake::new(64);
        // Faults at 10, 40, 11, 12, 41: 10's neighbours 11 and 12 go with
        // it, 40's neighbour 41 with 40.
        fill(&mut repl, &mut pager, &[10, 40, 11, 12, 41]);
        let mut pages = vec![99];
        assert_eq!(pick(&mut repl, &mut pager, 8, &mut pages), 5);
        assert_eq!(pages, [99, 10, 11, 12, 40, 41]);
        assert_eq!(pager.taken, [10, 11, 12, 40, 41]);
        // Nothing is left; the stale entries (11, 12, 41) are dropped.
        assert_eq!(pick(&mut repl, &mut pager, 8, &mut pages), 0);
        assert_eq!(repl.queued(), 0);
    }

    #[test]
    fn it_stops_at_want_even_inside_a_run_of_neighbours() {
        let mut repl = Fifo::new(vec![0u8; 64], vec![0u32; 64]);
        let mut pager = Fake::new(64);
        fill(&mut repl, &mut pager, &[0, 1, 2, 3, 4, 5]);
        let mut pages = Vec::new();
        assert_eq!(pick(&mut repl, &mut pager, 4, &mut pages), 4);
        assert_eq!(pages, [0, 1, 2, 3]);
        assert_eq!(pick(&mut repl, &mut pager, 0, &mut pages), 0);
        assert_eq!(pick(&mut repl, &mut pager, 4, &mut pages), 2);
        assert_eq!(pages, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn neighbours_stop_at_a_pinned_page_at_the_cluster_and_at_the_end() {
        let mut repl = Fifo::new(vec![0u8; CLUSTER + 8], vec![0u32; CLUSTER + 8]);
        let mut pager = Fake::new(CLUSTER + 8);
        // A run longer than a cluster: its first CLUSTER pages go
        // together, the rest from their own entries.
        let run: Vec<usize> = (0..CLUSTER + 2).collect();
        fill(&mut repl, &mut pager, &run);
        let mut pages = Vec::new();
        assert_eq!(pick(&mut repl, &mut pager, CLUSTER, &mut pages), CLUSTER);
        assert_eq!(pages, (0..CLUSTER).collect::<Vec<_>>());
        // Pinned page in a run: the run stops there and the pinned one
        // is held (out of the queue), its neighbour after it taken alone.
        let end = CLUSTER + 8;
        fill(&mut repl, &mut pager, &[end - 3, end - 2, end - 1]);
        pager.pinned[end - 2] = true;
        let mut pages = Vec::new();
        pick(&mut repl, &mut pager, 64, &mut pages);
        assert_eq!(pages, [CLUSTER, CLUSTER + 1, end - 3, end - 1]);
        assert!(pager.resident[end - 2]);
        assert_eq!(repl.queued(), 0, "held pages leave the queue");
    }

    #[test]
    fn each_entry_is_looked_at_once_per_call() {
        let mut repl = Fifo::new(vec![0u8; 16], vec![0u32; 16]);
        let mut pager = Fake::new(16);
        fill(&mut repl, &mut pager, &[3, 7, 9]);
        pager.pinned = vec![true; 16];
        // All pinned: held, none taken, and the call ends.
        let mut pages = Vec::new();
        assert_eq!(pick(&mut repl, &mut pager, 8, &mut pages), 0);
        assert_eq!(repl.queued(), 0);
        // Requeued once unpinned, they go.
        pager.pinned = vec![false; 16];
        for i in [3, 7, 9] {
            repl.requeue(i);
        }
        assert_eq!(pick(&mut repl, &mut pager, 8, &mut pages), 3);
        assert_eq!(pages, [3, 7, 9]);
    }

    #[test]
    fn protected_neighbours_stay_with_the_shipped_policy() {
        // Four protected places: the first four pages of the fill take
        // them (on trial), the next go to probation, where victims come
        // from. Victim 9's neighbour 10 is protected: it stays, and the
        // second victim is probation's next page, not 10 as with fifo.
        let pages = 64;
        let mut repl = Segmented::new(64, vec![0u8; pages], vec![0u32; pages]);
        repl.set_protected_max(4);
        let mut pager = Fake::new(pages);
        fill(&mut repl, &mut pager, &[10, 11, 12, 13, 9, 30]);
        assert!(repl.protected(10) && !repl.protected(9));
        let mut got = Vec::new();
        assert_eq!(pick(&mut repl, &mut pager, 2, &mut got), 2);
        assert_eq!(got, [9, 30]);
        assert!((10..14).all(|i| pager.resident[i] && repl.protected(i)));
        let mut repl = Fifo::new(vec![0u8; pages], vec![0u32; pages]);
        let mut pager = Fake::new(pages);
        fill(&mut repl, &mut pager, &[10, 11, 12, 13, 9, 30]);
        let mut got = Vec::new();
        pick(&mut repl, &mut pager, 2, &mut got);
        assert_eq!(got, [10, 11]);
    }
}
