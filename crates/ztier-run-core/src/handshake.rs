//! The eviction handshake of `ztier run`'s pager: the victims of the
//! evictions in flight, and the background evictor's batch — which of
//! its victims a write takes back, when it is sealed, which of its
//! victims a fault may commit early, and what the commit does with each.
//!
//! The preload library's manager holds a [`Handshake`] under its lock and
//! calls it at each step; what the steps do to memory and the store (the
//! page-state bytes, dropping a stored copy, removing a write
//! protection, the replacement policy's queues) goes through [`Arena`],
//! which the manager implements and the tests fake.
//!
//! The background evictor holds the manager's lock only to pick victims,
//! to say where it is and to commit; in between it write-protects its
//! batch (by the next fault service, on the program's CPU), reads and
//! compresses it, and releases it, without the lock. Its victims are
//! OWNED from the pick to the commit (page states: [`crate::state`]).
//!
//! ```text
//!   evictor:  take (lock) ─ protect ─┬─ compress ─ seal (lock) ─ release ─┬─ commit (lock)
//!                            protected (lock)                    released (lock)
//!   a write:  ├─ waits ─────────────┤├ takes back ┤├─ waits for the commit ─────────────┤
//!   a fault:  ├─ waits for the commit ──────────────────────────────────┤├ commits early ┤
//!
//!   the batch:                 [picked]            [protected]          [seal]
//!     (none) ──take_background──► Open ──protected──► Open+protected ──seal──► Sealed
//!        ▲                                                                      │
//!        │                                                             [released]
//!        └─────────────────────────commit_background──── Sealed+released ◄──────┘
//!
//!   a victim (EVICTING+OWNED):
//!     Open+protected, a write ─────────► taken back: RESIDENT+OWNED, its copy dropped,
//!                                        unprotected; not released; at the commit
//!                                        its copy (if stored) dropped, requeued
//!     Sealed: Released(outcome) ─fault after the release returned─► Early: committed
//!                                        now, skipped by the batch's commit
//!     Sealed: Kept (taken back, or refused by the store): waits for the commit
//!   commit, per victim not committed early (no longer OWNED):
//!     still EVICTING ─Stored / Zero / Gone─► STORED / ABSENT (left memory)
//!                    ─Kept (refused)──────► RESIDENT, requeued
//!     RESIDENT (taken back) ──────────────► its stored copy dropped, requeued
//!     ABSENT (released by the program meanwhile) ─► its stored copy dropped
//! ```
//!
//! Taking a victim back: a write to a victim of the background batch in
//! flight used to wait for the whole batch (compressing it, releasing
//! it, the commit: 1.8 ms a wait, 0.69 s of the corpus builder's 24 s at
//! 256M, with the program's CPU idle). Until the evictor seals its batch
//! (under the lock, right before releasing it) nothing of it has been
//! released, so such a write takes the page back instead
//! ([`Handshake::take_back`]): RESIDENT again, unprotected, still OWNED
//! (nothing releases or evicts it while the evictor may be reading it)
//! and out of the queues until the commit, which drops what the evictor
//! stored of it and queues it at the back of probation; the evictor
//! does not release it. Writes after the seal wait as before, and so do
//! faults before the batch's protections are all made (the thread that
//! made them says so under the lock, [`Handshake::protected`], before it
//! goes back to the program): a late fault there could take back a page
//! the protection job then protects.
//!
//! An inline eviction (the fault handler making room, the lock held
//! throughout) uses only the count of victims in flight and the commit
//! ([`Handshake::picked`], [`Handshake::commit`] with `background`
//! false): nothing can take its victims back or commit them early.

use std::io;

use crate::state::{self, CLEAN, EVICTING, RESIDENT, STATE};

/// What became of one victim of an eviction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// Compressed into the store.
    Stored,
    /// All zero: nothing stored.
    Zero,
    /// Not in memory any more (released behind our back).
    Gone,
    /// The store refused it: it stays resident.
    Kept,
}

/// A victim of the sealed background batch, for
/// [`Handshake::commit_early`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sealed {
    /// Released (or being released) by the evictor, with what it made of it.
    Released(Outcome),
    /// Not released: taken back by a write, or refused by the store.
    Kept,
    /// Committed early, by a fault on it.
    Early,
}

/// What the handshake does to the pages, through the manager: their
/// state bytes, their stored copies, their write protection, the
/// replacement policy's queues and the resident count.
pub trait Arena {
    /// The page-state byte of page `i`.
    fn state(&self, i: usize) -> u8;
    /// Sets the page-state byte of page `i`.
    fn set_state(&mut self, i: usize, s: u8);
    /// Drops what the store holds of page `i` (if anything).
    fn drop_copy(&mut self, i: usize);
    /// Removes page `i`'s write protection (which wakes its writers).
    fn unprotect(&mut self, i: usize) -> io::Result<()>;
    /// Queues resident page `i` for eviction again (at the back of
    /// probation).
    fn requeue(&mut self, i: usize);
    /// Page `i` left memory by an eviction: the policy is told, the
    /// resident count falls by one.
    fn left(&mut self, i: usize);
}

/// The evictions in flight and the background evictor's batch (see the
/// module docs).
#[derive(Default, Debug)]
pub struct Handshake {
    /// Victims picked and not committed yet, of every eviction.
    evicting: usize,
    /// The background batch in flight has not been sealed yet
    /// ([`Handshake::seal`]): its victims can still be taken back
    /// ([`Handshake::take_back`]).
    open: bool,
    /// That batch's write protections are all made
    /// ([`Handshake::protected`]).
    protected: bool,
    /// Victims of that batch taken back since it was picked.
    taken_back: Vec<usize>,
    /// The release of the sealed batch in flight has returned
    /// ([`Handshake::released`]).
    released: bool,
    /// The sealed background batch in flight: its victims, each with
    /// whether a fault may commit it early ([`Handshake::commit_early`]);
    /// empty while none is sealed.
    sealed: Vec<(usize, Sealed)>,
}

impl Handshake {
    /// No eviction in flight.
    pub fn new() -> Handshake {
        Handshake::default()
    }

    /// Victims picked and not committed yet (by every eviction).
    pub fn evicting(&self) -> usize {
        self.evicting
    }

    /// `n` victims were picked (and marked EVICTING and OWNED).
    pub fn picked(&mut self, n: usize) {
        self.evicting += n;
    }

    /// The victims just picked are the background evictor's batch: open
    /// (not sealed), not protected yet, none taken back.
    pub fn opened(&mut self) {
        self.open = true;
        self.protected = false;
        self.taken_back.clear();
    }

    /// The background batch in flight is write-protected, all of it: its
    /// victims may be taken back from now on. Not before: a fault can
    /// reach [`Handshake::take_back`] late — one taken on a page while it
    /// was out of memory or a victim of an earlier batch, its service
    /// delayed (waiting for the lock) until the page was back in memory
    /// and chosen again, say as a neighbour of another victim, by this
    /// batch — and the protection job still to come would then protect a
    /// page already taken back. The commit only wakes the waiters of a
    /// page it counted as released, so that page would stay RESIDENT and
    /// write-protected, every write to it faulting.
    pub fn protected(&mut self) {
        self.protected = true;
    }

    /// A write hit page `i`, a victim of the background batch in flight
    /// (write-protected, present: `present` says so for a fault that does
    /// not tell a write from a missing page). While the batch is open and
    /// protected, the page goes back to the program: RESIDENT again (its
    /// stored copy, if CLEAN, dropped), unprotected, still OWNED until
    /// the commit. Returns whether it was taken back.
    pub fn take_back(&mut self, a: &mut impl Arena, i: usize, present: bool) -> io::Result<bool> {
        let s = a.state(i);
        if !self.open || !self.protected || !present || !state::in_flight(s) {
            return Ok(false);
        }
        if s & CLEAN != 0 {
            a.drop_copy(i);
        }
        a.set_state(i, state::taken_back(s));
        self.taken_back.push(i);
        a.unprotect(i)?;
        Ok(true)
    }

    /// Ends taking back victims of the background batch in flight, before
    /// the evictor releases it: returns those taken back (the evictor
    /// must not release them; the commit drops what it stored of them).
    /// `pages` are the batch's victims (sorted) and `outcome` what the
    /// evictor made of each.
    pub fn seal(&mut self, pages: &[usize], outcome: &[Outcome]) -> Vec<usize> {
        self.open = false;
        self.released = false;
        let back = std::mem::take(&mut self.taken_back);
        self.sealed.clear();
        self.sealed.extend(pages.iter().zip(outcome).map(|(&i, &o)| {
            // A victim taken back is not released, nor one the store refused.
            (i, if o == Outcome::Kept || back.contains(&i) { Sealed::Kept } else { Sealed::Released(o) })
        }));
        back
    }

    /// The evictor's release of the sealed batch has returned (every TLB
    /// flushed): its released victims may be committed early from now on.
    pub fn released(&mut self) {
        self.released = !self.sealed.is_empty();
    }

    /// A fault on page `i`: if it is a victim of the sealed background
    /// batch that the evictor has released (and that release has
    /// returned), commits it alone, now, as [`Handshake::commit`] would;
    /// the batch's commit then skips it. Returns whether it did.
    pub fn commit_early(&mut self, a: &mut impl Arena, i: usize) -> bool {
        if !self.released || !state::in_flight(a.state(i)) {
            return false;
        }
        let Ok(k) = self.sealed.binary_search_by_key(&i, |e| e.0) else { return false };
        let Sealed::Released(o) = self.sealed[k].1 else { return false };
        self.sealed[k].1 = Sealed::Early;
        self.evicting -= 1;
        let s = state::disowned(a.state(i));
        a.set_state(i, s);
        commit_one(a, i, s, o);
        true
    }

    /// Commits an eviction whose memory the evictor gave back: `pages`
    /// its victims (sorted) and `outcome` what it made of each. Pages
    /// still EVICTING become STORED (or ABSENT); pages released meanwhile
    /// by the program, or taken back, get their stored copy dropped (and
    /// those taken back are requeued); refused pages stay resident. No
    /// victim is OWNED afterwards. With `background`, the batch is the
    /// sealed one: its victims committed early are skipped, and the
    /// handshake has no batch in flight afterwards.
    pub fn commit(&mut self, a: &mut impl Arena, pages: &[usize], outcome: &[Outcome], background: bool) {
        let sealed = if background { std::mem::take(&mut self.sealed) } else { Vec::new() };
        if background {
            self.released = false;
        }
        for (k, (&i, &o)) in pages.iter().zip(outcome).enumerate() {
            if sealed.get(k) == Some(&(i, Sealed::Early)) {
                continue;
            }
            self.evicting -= 1;
            let s = state::disowned(a.state(i));
            a.set_state(i, s);
            if s & STATE != EVICTING {
                // Released (munmap, MADV_DONTNEED) while it was
                // compressed, or taken back by a write (`take_back`).
                if o == Outcome::Stored {
                    a.drop_copy(i);
                }
                if s & STATE == RESIDENT {
                    a.requeue(i);
                }
                continue;
            }
            commit_one(a, i, s, o);
        }
    }
}

/// Commits victim `i`, still EVICTING (its state `s`, no longer OWNED),
/// by what the evictor made of it.
fn commit_one(a: &mut impl Arena, i: usize, s: u8, o: Outcome) {
    match o {
        Outcome::Stored | Outcome::Zero | Outcome::Gone => {
            if o != Outcome::Stored && s & CLEAN != 0 {
                a.drop_copy(i);
            }
            a.set_state(i, state::evicted(s, o == Outcome::Stored));
            a.left(i);
        }
        Outcome::Kept => {
            a.set_state(i, state::resident(s));
            a.requeue(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ABSENT, OWNED, STORED};

    /// A fake arena: page states, the pages with a stored copy, the
    /// protected pages, the replacement's queue and the resident count.
    #[derive(Default)]
    struct Fake {
        states: Vec<u8>,
        copies: Vec<bool>,
        protected: Vec<bool>,
        queue: Vec<usize>,
        resident: usize,
        fail_unprotect: bool,
    }

    impl Fake {
        /// `n` resident pages, each with a stored copy if `clean`.
        fn new(n: usize, clean: bool) -> Fake {
            let s = if clean { state::clean(RESIDENT) } else { RESIDENT };
            Fake {
                states: vec![s; n],
                copies: vec![clean; n],
                protected: vec![false; n],
                resident: n,
                ..Fake::default()
            }
        }

        /// Picks `pages` as a batch of `h` (the manager's
        /// `take_victims`), protected if `background` (the protection job).
        fn pick(&mut self, h: &mut Handshake, pages: &[usize], background: bool) {
            for &i in pages {
                assert!(state::evictable(self.states[i]));
                self.states[i] = state::picked(self.states[i]);
                self.protected[i] = true;
            }
            h.picked(pages.len());
            if background {
                h.opened();
            }
        }

        /// What the evictor does with victim `i` given `o`: stores it
        /// (the copy made), or not.
        fn store(&mut self, i: usize, o: Outcome) {
            if o == Outcome::Stored {
                self.copies[i] = true;
            }
        }

        fn owned(&self) -> usize {
            self.states.iter().filter(|&&s| s & OWNED != 0).count()
        }
    }

    impl Arena for Fake {
        fn state(&self, i: usize) -> u8 {
            self.states[i]
        }
        fn set_state(&mut self, i: usize, s: u8) {
            self.states[i] = s;
        }
        fn drop_copy(&mut self, i: usize) {
            self.copies[i] = false;
        }
        fn unprotect(&mut self, i: usize) -> io::Result<()> {
            if self.fail_unprotect {
                return Err(io::Error::other("unprotect"));
            }
            self.protected[i] = false;
            Ok(())
        }
        fn requeue(&mut self, i: usize) {
            self.queue.push(i);
        }
        fn left(&mut self, i: usize) {
            self.protected[i] = false;
            self.resident -= 1;
        }
    }

    #[test]
    fn a_batch_goes_through_protect_seal_release_and_commit() {
        let mut a = Fake::new(8, false);
        let mut h = Handshake::new();
        let pages = [1, 2, 3, 5];
        a.pick(&mut h, &pages, true);
        assert_eq!(h.evicting(), 4);
        h.protected();
        let outcome = [Outcome::Stored, Outcome::Zero, Outcome::Stored, Outcome::Stored];
        for (&i, &o) in pages.iter().zip(&outcome) {
            a.store(i, o);
        }
        assert!(h.seal(&pages, &outcome).is_empty());
        h.released();
        h.commit(&mut a, &pages, &outcome, true);
        assert_eq!(h.evicting(), 0);
        assert_eq!(a.states[1], STORED);
        assert_eq!(a.states[2], ABSENT);
        assert_eq!(a.states[3], STORED);
        assert_eq!(a.states[5], STORED);
        assert_eq!(a.resident, 4);
        assert_eq!(a.owned(), 0);
        assert!(a.queue.is_empty());
        // Nothing in flight: no fault commits anything early, nothing is
        // taken back.
        a.states[1] = state::picked(RESIDENT);
        assert!(!h.commit_early(&mut a, 1));
        assert!(!h.take_back(&mut a, 1, true).unwrap());
    }

    #[test]
    fn a_victim_written_between_protection_and_seal_is_taken_back() {
        let mut a = Fake::new(8, true);
        let mut h = Handshake::new();
        let pages = [2, 3, 4];
        a.pick(&mut h, &pages, true);
        // Before the protections are all made: the writer waits.
        assert!(!h.take_back(&mut a, 3, true).unwrap());
        assert!(state::in_flight(a.states[3]));
        h.protected();
        // A fault that does not find the page present (a missing page, or
        // a SIGBUS on one already gone) takes nothing back.
        assert!(!h.take_back(&mut a, 3, false).unwrap());
        // Not a victim: nothing.
        assert!(!h.take_back(&mut a, 6, true).unwrap());
        assert!(h.take_back(&mut a, 3, true).unwrap());
        assert_eq!(a.states[3], RESIDENT | OWNED, "resident, written, owned till the commit");
        assert!(!a.copies[3], "its copy is dropped");
        assert!(!a.protected[3]);
        // Taken back once only.
        assert!(!h.take_back(&mut a, 3, true).unwrap());
        let outcome = [Outcome::Stored; 3];
        for &i in &pages {
            a.store(i, Outcome::Stored);
        }
        assert_eq!(h.seal(&pages, &outcome), vec![3]);
        // Sealed: a write to another victim waits for the commit.
        assert!(!h.take_back(&mut a, 4, true).unwrap());
        h.released();
        // Not released by the evictor: not committed early either.
        assert!(!h.commit_early(&mut a, 3));
        h.commit(&mut a, &pages, &outcome, true);
        assert_eq!(a.states[3], RESIDENT);
        assert!(!a.copies[3], "what the evictor stored of it is dropped");
        assert_eq!(a.queue, vec![3]);
        assert_eq!([a.states[2], a.states[4]], [STORED, STORED]);
        assert_eq!(a.resident, 6);
        assert_eq!(h.evicting(), 0);
        // The next batch starts with none taken back.
        a.pick(&mut h, &[3], true);
        h.protected();
        assert!(h.seal(&[3], &[Outcome::Stored]).is_empty());
    }

    #[test]
    fn a_failed_unprotect_is_an_error_after_the_page_is_taken_back() {
        let mut a = Fake::new(4, false);
        let mut h = Handshake::new();
        a.pick(&mut h, &[1], true);
        h.protected();
        a.fail_unprotect = true;
        assert!(h.take_back(&mut a, 1, true).is_err());
        assert_eq!(a.states[1], RESIDENT | OWNED);
        assert_eq!(h.seal(&[1], &[Outcome::Stored]), vec![1]);
    }

    #[test]
    fn a_released_victim_is_committed_early_once_the_release_returns() {
        let mut a = Fake::new(8, false);
        let mut h = Handshake::new();
        let pages = [0, 1, 2, 6];
        a.pick(&mut h, &pages, true);
        h.protected();
        assert!(h.take_back(&mut a, 1, true).unwrap());
        let outcome = [Outcome::Stored, Outcome::Stored, Outcome::Kept, Outcome::Zero];
        for (&i, &o) in pages.iter().zip(&outcome) {
            a.store(i, o);
        }
        assert_eq!(h.seal(&pages, &outcome), vec![1]);
        // Sealed, the release not returned yet: the fault waits.
        assert!(!h.commit_early(&mut a, 0));
        h.released();
        assert!(h.commit_early(&mut a, 0));
        assert_eq!(a.states[0], STORED);
        assert_eq!(h.evicting(), 3);
        assert_eq!(a.resident, 7);
        // Once only.
        assert!(!h.commit_early(&mut a, 0));
        // Taken back, or refused by the store: not released, so not early.
        assert!(!h.commit_early(&mut a, 1));
        assert!(!h.commit_early(&mut a, 2));
        // All zero: committed early as ABSENT.
        assert!(h.commit_early(&mut a, 6));
        assert_eq!(a.states[6], ABSENT);
        // Not of the batch.
        assert!(!h.commit_early(&mut a, 4));
        h.commit(&mut a, &pages, &outcome, true);
        assert_eq!(h.evicting(), 0);
        assert_eq!(a.states[0], STORED, "skipped: committed already");
        assert_eq!(a.states[1], RESIDENT);
        assert_eq!(a.states[2], RESIDENT, "refused: resident again");
        assert_eq!(a.queue, vec![1, 2]);
        assert_eq!(a.resident, 6);
        assert_eq!(a.owned(), 0);
        // After the commit nothing is early.
        a.states[2] = state::picked(RESIDENT);
        assert!(!h.commit_early(&mut a, 2));
    }

    #[test]
    fn a_batch_with_nothing_released_commits_nothing_early() {
        let mut a = Fake::new(4, false);
        let mut h = Handshake::new();
        a.pick(&mut h, &[0, 1], true);
        h.protected();
        let outcome = [Outcome::Kept; 2];
        assert!(h.seal(&[0, 1], &outcome).is_empty());
        h.released();
        assert!(!h.commit_early(&mut a, 0));
        h.commit(&mut a, &[0, 1], &outcome, true);
        assert_eq!([a.states[0], a.states[1]], [RESIDENT, RESIDENT]);
        assert_eq!(a.resident, 4);
    }

    #[test]
    fn the_commit_of_a_page_freed_meanwhile_drops_its_copy() {
        for clean in [false, true] {
            let mut a = Fake::new(6, clean);
            let mut h = Handshake::new();
            let pages = [1, 2, 3, 4];
            a.pick(&mut h, &pages, false);
            // The program releases 1 and 2 while they are compressed: they
            // stay OWNED (ABSENT) until the commit.
            for i in [1, 2] {
                a.states[i] = state::released(a.states[i]);
                a.copies[i] = false;
                a.resident -= 1;
            }
            let outcome = [Outcome::Stored, Outcome::Gone, Outcome::Zero, Outcome::Gone];
            for (&i, &o) in pages.iter().zip(&outcome) {
                a.store(i, o);
            }
            h.commit(&mut a, &pages, &outcome, false);
            assert_eq!(h.evicting(), 0);
            assert_eq!(a.states[1], ABSENT);
            assert!(!a.copies[1], "stored after it was freed: dropped");
            assert_eq!(a.states[2], ABSENT);
            assert!(a.queue.is_empty(), "freed pages are not requeued");
            // All zero, or gone behind our back: ABSENT, a CLEAN page's
            // kept copy dropped.
            assert_eq!(a.states[3], ABSENT);
            assert_eq!(a.states[4], ABSENT);
            assert!(!a.copies[3] && !a.copies[4]);
            assert_eq!(a.resident, 2);
            assert_eq!(a.owned(), 0);
        }
    }

    #[test]
    fn a_clean_victim_keeps_its_copy_when_stored_or_refused() {
        let mut a = Fake::new(4, true);
        let mut h = Handshake::new();
        a.pick(&mut h, &[0, 1], false);
        let outcome = [Outcome::Stored, Outcome::Kept];
        h.commit(&mut a, &[0, 1], &outcome, false);
        assert_eq!(a.states[0], STORED);
        assert!(a.copies[0]);
        assert_eq!(a.states[1], state::clean(RESIDENT), "refused: still CLEAN, its copy good");
        assert!(a.copies[1]);
        assert_eq!(a.queue, vec![1]);
    }

    #[test]
    fn an_inline_eviction_beside_a_background_batch_leaves_the_batch_alone() {
        let mut a = Fake::new(10, false);
        let mut h = Handshake::new();
        let batch = [0, 1, 2];
        a.pick(&mut h, &batch, true);
        h.protected();
        // The handler evicts inline meanwhile (its own victims).
        a.pick(&mut h, &[7, 8], false);
        assert_eq!(h.evicting(), 5);
        h.commit(&mut a, &[7, 8], &[Outcome::Stored; 2], false);
        assert_eq!(h.evicting(), 3);
        // The batch is still open: a write takes its victim back.
        assert!(h.take_back(&mut a, 1, true).unwrap());
        let outcome = [Outcome::Stored; 3];
        assert_eq!(h.seal(&batch, &outcome), vec![1]);
        h.released();
        assert!(h.commit_early(&mut a, 2));
        h.commit(&mut a, &batch, &outcome, true);
        assert_eq!(h.evicting(), 0);
        assert_eq!(a.resident, 10 - 2 - 2);
        assert_eq!(a.owned(), 0);
    }

    #[test]
    fn released_without_a_sealed_batch_allows_no_early_commit() {
        let mut a = Fake::new(4, false);
        let mut h = Handshake::new();
        h.released();
        a.pick(&mut h, &[0], false);
        assert!(!h.commit_early(&mut a, 0));
        h.commit(&mut a, &[0], &[Outcome::Zero], false);
        assert_eq!(a.states[0], ABSENT);
    }
}
