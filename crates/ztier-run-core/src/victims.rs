//! Victim choice of the run library: what the manager says of a page the
//! replacement policy offers as a victim, and of the page next to one.
//!
//! The loop is the policy crate's ([`ztier_policy::pick`], which the
//! simulator runs too); this is the live pager's side of it, [`Live`],
//! a view of the page-state bytes ([`crate::state`]), the pins
//! ([`crate::pins`]) and, under `--budget-covers all` while the pool is
//! overdrawn, a forked child's pages still shared with its parent
//! ([`crate::inherit`]):
//!
//! ```text
//!  page-state byte of candidate i          verdict   the policy's queues
//!  RESIDENT+OWNED (taken back, in flight)  Owned     out until the commit requeues it
//!  RESIDENT, readable, free, not shared    Take      out: a victim (→ EVICTING+OWNED)
//!  RESIDENT, readable, free, shared        Hold      out, set aside (see below)
//!  RESIDENT, readable, pinned              Hold      out until unpinned
//!  RESIDENT, NOEVICT (not readable)        Requeue   back at the end
//!  not RESIDENT (left memory while queued) Stale     dropped
//! ```
//!
//! A neighbour of a victim goes along when it is evictable
//! ([`state::evictable`]), not pinned and not shared (and the policy lets
//! it: not protected). A shared page set aside stays out of the queues
//! while the pool is overdrawn — requeued, such pages would keep the
//! child's own pages behind them from being looked at — and is put back
//! in line by [`requeue_set_aside`] once it is not.

use ztier_policy::pick::Candidates;
use ztier_policy::replacement::{Replacement, Verdict};

use crate::inherit::Shared;
use crate::pins::Pins;
use crate::state::{self, NOEVICT, OWNED, RESIDENT, STATE};

/// The manager's pages as victim choice sees them.
pub struct Live<'a> {
    /// The page-state bytes (victims taken are marked picked).
    pub states: &'a mut [u8],
    /// What keeps pages resident.
    pub pins: &'a Pins,
    /// Pages shared with the parent that stay out of the victims now
    /// (a forked child under `--budget-covers all`, its pool overdrawn).
    pub shared: Option<&'a Shared>,
    /// Where such pages go when they come up as candidates.
    pub set_aside: &'a mut Vec<usize>,
}

impl Live<'_> {
    fn shared(&self, i: usize) -> bool {
        self.shared.is_some_and(|h| h.has(i))
    }
}

impl Candidates for Live<'_> {
    fn pages(&self) -> usize {
        self.states.len()
    }

    #[inline]
    fn resident(&self, i: usize) -> bool {
        self.states[i] & STATE == RESIDENT
    }

    fn verdict(&mut self, i: usize) -> Verdict {
        let s = self.states[i];
        if s & (STATE | OWNED) == RESIDENT | OWNED {
            // Taken back from an eviction in flight: out of the queues
            // until its commit puts it back.
            Verdict::Owned
        } else if s & STATE == RESIDENT && s & NOEVICT == 0 && !self.pins.pinned(i) && !self.shared(i) {
            Verdict::Take
        } else if s & STATE == RESIDENT && s & NOEVICT == 0 && !self.pins.pinned(i) {
            // Shared with the parent while the pool is overdrawn: out of
            // the queues until it is not.
            self.set_aside.push(i);
            Verdict::Hold
        } else if s & STATE == RESIDENT && s & NOEVICT == 0 {
            // Pinned by a system call: out of the queues until it is
            // unpinned.
            Verdict::Hold
        } else if s & STATE == RESIDENT {
            Verdict::Requeue
        } else {
            // A stale entry (the page left memory while queued).
            Verdict::Stale
        }
    }

    fn joins(&self, j: usize) -> bool {
        state::evictable(self.states[j]) && !self.pins.pinned(j) && !self.shared(j)
    }

    fn take(&mut self, i: usize) {
        self.states[i] = state::picked(self.states[i]);
    }
}

/// Puts the pages set aside while the pool was overdrawn back in line
/// for eviction, those still resident, evictable and not pinned.
pub fn requeue_set_aside(set_aside: &mut Vec<usize>, states: &[u8], pins: &Pins, repl: &mut dyn Replacement) {
    for i in std::mem::take(set_aside) {
        let s = states[i];
        if s & (STATE | OWNED | NOEVICT) == RESIDENT && !pins.pinned(i) {
            repl.requeue(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ABSENT, CLEAN, EVICTING, STORED};
    use ztier_policy::fifo::Fifo;
    use ztier_policy::pick::pick;

    /// Pages `order` resident (in that order of faults) in a range of
    /// `pages`, under fifo replacement.
    fn arena(pages: usize, order: &[usize]) -> (Vec<u8>, Fifo) {
        let mut states = vec![ABSENT; pages];
        let mut repl = Fifo::new(vec![0u8; pages], vec![0u32; pages]);
        for &i in order {
            states[i] = state::resident(states[i]);
            repl.resident(i);
        }
        (states, repl)
    }

    #[test]
    fn each_page_state_gets_its_verdict() {
        let pins = {
            let mut p = Pins::new();
            p.pin(5, 6);
            p
        };
        let mut shared = Shared::new(16);
        shared.insert(6);
        let mut states = vec![ABSENT; 16];
        let cases = [
            (RESIDENT | OWNED, Verdict::Owned),
            (RESIDENT, Verdict::Take),
            (RESIDENT | CLEAN, Verdict::Take),
            (RESIDENT | NOEVICT, Verdict::Requeue),
            (STORED, Verdict::Stale),
            (ABSENT, Verdict::Stale),
            (EVICTING | OWNED, Verdict::Stale),
            (ABSENT | NOEVICT, Verdict::Stale),
        ];
        let mut set_aside = Vec::new();
        for (s, want) in cases {
            states[1] = s;
            let mut live =
                Live { states: &mut states, pins: &pins, shared: Some(&shared), set_aside: &mut set_aside };
            assert_eq!(live.verdict(1), want, "state {s:#x}");
        }
        assert!(set_aside.is_empty());
        states[5] = RESIDENT;
        states[6] = RESIDENT;
        let mut live =
            Live { states: &mut states, pins: &pins, shared: Some(&shared), set_aside: &mut set_aside };
        // Pinned: held, not set aside; shared: held and set aside.
        assert_eq!(live.verdict(5), Verdict::Hold);
        assert_eq!(live.verdict(6), Verdict::Hold);
        assert_eq!(set_aside, [6]);
        // Without the shared pages (the pool not overdrawn), 6 is a victim.
        let mut live = Live { states: &mut states, pins: &pins, shared: None, set_aside: &mut set_aside };
        assert_eq!(live.verdict(6), Verdict::Take);
    }

    #[test]
    fn victims_are_marked_picked_with_their_free_neighbours() {
        let (mut states, mut repl) = arena(64, &[20, 30, 21, 22, 23, 24, 31, 32]);
        states[23] |= NOEVICT;
        let mut pins = Pins::new();
        pins.pin(32, 33);
        let mut set_aside = Vec::new();
        let mut live = Live { states: &mut states, pins: &pins, shared: None, set_aside: &mut set_aside };
        let mut pages = Vec::new();
        pick(&mut repl, &mut live, 64, &mut pages);
        // 20 takes 21 and 22 along (23 is not readable); 30 takes 31 (32
        // is pinned); 24's own entry makes it a victim; 23 is requeued and
        // 32 held.
        assert_eq!(pages, [20, 21, 22, 30, 31, 24]);
        for &i in &pages {
            assert!(state::in_flight(states[i]), "page {i}: {:#x}", states[i]);
        }
        assert_eq!(states[23], RESIDENT | NOEVICT);
        assert_eq!(states[32], RESIDENT);
        assert_eq!(repl.queued(), 1, "only the unreadable page is back in line");
    }

    #[test]
    fn shared_pages_are_set_aside_and_requeued_when_still_evictable() {
        let (mut states, mut repl) = arena(16, &[1, 2, 3, 4, 8]);
        let mut shared = Shared::new(16);
        for i in [2, 3, 4] {
            shared.insert(i);
        }
        let pins = Pins::new();
        let mut set_aside = Vec::new();
        let mut live =
            Live { states: &mut states, pins: &pins, shared: Some(&shared), set_aside: &mut set_aside };
        let mut pages = Vec::new();
        pick(&mut repl, &mut live, 16, &mut pages);
        // 1's neighbour 2 is shared: it stays; 2, 3 and 4 are set aside.
        assert_eq!(pages, [1, 8]);
        assert_eq!(set_aside, [2, 3, 4]);
        assert_eq!(repl.queued(), 0);
        // Meanwhile 3 was released and 4 pinned: only 2 goes back in line.
        states[3] = state::released(states[3]);
        let mut pins = Pins::new();
        pins.pin(4, 5);
        requeue_set_aside(&mut set_aside, &states, &pins, &mut repl);
        assert!(set_aside.is_empty());
        assert_eq!(repl.queued(), 1);
        let mut live = Live { states: &mut states, pins: &pins, shared: None, set_aside: &mut set_aside };
        let mut pages = Vec::new();
        pick(&mut repl, &mut live, 16, &mut pages);
        assert_eq!(pages, [2]);
    }
}
