//! What keeps pages of `ztier run`'s arena resident, and what a forked
//! child gets of them: the books the preload library's manager keeps of
//! pins, memory locks, kept pins of threads, holds and fork marks.
//!
//! Page ranges are `[first, end)` in arena pages. These are the books
//! only: bringing pages back, waking threads and the counters the stats
//! show are the manager's. Every change is a method here, so that the
//! range arithmetic (a lock split by a partial `munlock`, a fork mark
//! cut by a new one, a kept pin replaced) is tested without the library.
//!
//! * A **pin** keeps a range resident for a system call in flight; pins
//!   of the same range add up, and each ends alone.
//! * A **lock** (`mlock`) is a pin that lasts until `munlock`, a release
//!   or a fork; locked ranges are disjoint and sorted, and a partial
//!   `munlock` leaves the rest locked. `mlockall` ([`Pins::set_locked_all`])
//!   stops every eviction.
//! * A **kept pin** is a pin a thread needs outside any system call (its
//!   stack, its rseq area, a robust mutex, its thread vector): one per
//!   thread and kind, except robust mutexes, which add up.
//! * A **hold** (`ztier hold`) by a process until its lease runs out
//!   stops every eviction while in force.
//! * A **fork mark** says what a forked child gets of a range: the
//!   parent's pages, zeros, or nothing; marked ranges are disjoint and
//!   sorted.

use std::time::Instant;

/// What a forked child gets of a range ([`Pins::mark_fork`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnFork {
    /// The parent's pages (`MADV_KEEPONFORK`, `MADV_DOFORK`: the default).
    Keep,
    /// Zeros (`MADV_WIPEONFORK`).
    Wipe,
    /// Nothing: a touch is a `SIGSEGV` (`MADV_DONTFORK`).
    Drop,
}

/// Memory a thread needs resident outside any system call, kept pinned
/// while the thread has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeptKind {
    /// A stack the program gave a thread (`pthread_attr_setstack`): its
    /// frames, control block and thread-locals.
    Stack,
    /// An `rseq` area: the CPU number, on every return to user space.
    Rseq,
    /// A robust mutex the thread holds as it exits (one entry each): the
    /// kernel's walk of the thread's robust list reads and marks it
    /// after the thread's last code has run.
    Robust,
    /// The thread's dynamic thread vector (glibc's table of its
    /// thread-local blocks), which every access to a library's
    /// thread-local reads: glibc allocates it with the program's
    /// `calloc`, arena memory where the program has an allocator of its
    /// own (`keep_thread_vector` in the preload library's `sud` module).
    Dtv,
}

/// One kept pin: thread `tid`'s `kind` of memory, pages `[first, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The thread (its ID).
    pub tid: i32,
    /// What memory of it.
    pub kind: KeptKind,
    /// The first page.
    pub first: usize,
    /// The page after the last.
    pub end: usize,
}

/// A locked range a `munlock` cut ([`Pins::unlock`]): its pin ends, and
/// each part of it left locked gets a pin of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlocked {
    /// The locked range, `[first, end)`.
    pub range: (usize, usize),
    /// Its parts still locked (before and after the cut), none empty.
    pub left: Vec<(usize, usize)>,
}

/// The books; see the module docs.
#[derive(Debug, Default)]
pub struct Pins {
    /// Pinned ranges, one entry per pin (kept pins and locks included).
    pins: Vec<(usize, usize)>,
    /// Locked ranges, disjoint, sorted.
    locked: Vec<(usize, usize)>,
    /// `mlockall` in force.
    locked_all: bool,
    /// Holds by process ID, each until its lease runs out.
    holds: Vec<(i32, Instant)>,
    /// Fork marks, disjoint, sorted; none is [`OnFork::Keep`].
    wipe: Vec<(usize, usize, OnFork)>,
    /// Kept pins.
    kept: Vec<Kept>,
}

impl Pins {
    /// Empty books: nothing pinned, locked, held or marked.
    pub fn new() -> Pins {
        Pins::default()
    }

    /// Is page `i` pinned (by a pin, a lock or a kept pin)?
    #[inline]
    pub fn pinned(&self, i: usize) -> bool {
        !self.pins.is_empty() && self.pins.iter().any(|&(a, b)| (a..b).contains(&i))
    }

    /// Adds a pin of `[first, end)`; the pages it pins (0 if empty:
    /// nothing is added).
    pub fn pin(&mut self, first: usize, end: usize) -> usize {
        if first >= end {
            return 0;
        }
        self.pins.push((first, end));
        end - first
    }

    /// Ends one pin of exactly `[first, end)`; the pages it pinned (0 if
    /// there was none).
    pub fn unpin(&mut self, first: usize, end: usize) -> usize {
        match self.pins.iter().position(|&p| p == (first, end)) {
            Some(k) => {
                self.pins.swap_remove(k);
                end - first
            }
            None => 0,
        }
    }

    /// The pin added last, if any.
    pub fn last_pin(&self) -> Option<(usize, usize)> {
        self.pins.last().copied()
    }

    /// The parts of `[first, end)` not locked yet, in order.
    pub fn not_locked(&self, first: usize, end: usize) -> Vec<(usize, usize)> {
        let mut parts = Vec::new();
        let mut at = first;
        for &(f, e) in &self.locked {
            if e <= at || f >= end {
                continue;
            }
            if f > at {
                parts.push((at, f));
            }
            at = at.max(e);
        }
        if at < end {
            parts.push((at, end));
        }
        parts
    }

    /// Books `[first, end)`, a part [`Pins::not_locked`] gave, as locked
    /// (its pin is the caller's to add).
    pub fn lock(&mut self, first: usize, end: usize) {
        debug_assert!(self.not_locked(first, end) == [(first, end)]);
        let k = self.locked.partition_point(|&(f, _)| f < first);
        self.locked.insert(k, (first, end));
    }

    /// Unlocks `[first, end)`: the locked ranges it meets, in order, each
    /// with the parts of it left locked. The caller ends each range's pin
    /// and then pins each part left, range by range.
    pub fn unlock(&mut self, first: usize, end: usize) -> Vec<Unlocked> {
        let mut cut = Vec::new();
        let mut keep = Vec::with_capacity(self.locked.len() + 1);
        for (f, e) in std::mem::take(&mut self.locked) {
            if e <= first || f >= end {
                keep.push((f, e));
                continue;
            }
            let left: Vec<(usize, usize)> =
                [(f, first.max(f)), (end.min(e), e)].into_iter().filter(|&(a, b)| a < b).collect();
            keep.extend(&left);
            cut.push(Unlocked { range: (f, e), left });
        }
        keep.sort_unstable();
        self.locked = keep;
        cut
    }

    /// Locked ranges.
    pub fn locked(&self) -> &[(usize, usize)] {
        &self.locked
    }

    /// `mlockall` (`true`) or `munlockall`.
    pub fn set_locked_all(&mut self, on: bool) {
        self.locked_all = on;
    }

    /// No page may be evicted: `mlockall` or a hold in force.
    #[inline]
    pub fn frozen(&self) -> bool {
        self.locked_all || !self.holds.is_empty()
    }

    /// A hold by process `by` until `until`, or its renewal; `true` if it
    /// is a new hold (none was in force).
    pub fn hold(&mut self, by: i32, until: Instant) -> bool {
        let new = self.holds.is_empty();
        match self.holds.iter_mut().find(|h| h.0 == by) {
            Some(h) => h.1 = until,
            None => self.holds.push((by, until)),
        }
        new
    }

    /// Ends process `by`'s hold, and every hold whose lease ran out by
    /// `now`; `true` if none is left in force of those there were.
    pub fn release_holds(&mut self, by: Option<i32>, now: Instant) -> bool {
        let had = !self.holds.is_empty();
        self.holds.retain(|&(p, until)| Some(p) != by && until > now);
        had && self.holds.is_empty()
    }

    /// The processes whose holds are in force.
    pub fn holders(&self) -> Vec<i32> {
        self.holds.iter().map(|h| h.0).collect()
    }

    /// Ends every hold (a forked child's: they were asked of the parent).
    pub fn clear_holds(&mut self) {
        self.holds.clear();
    }

    /// Marks what a forked child gets of `[first, end)`, replacing the
    /// marks there were on it.
    pub fn mark_fork(&mut self, first: usize, end: usize, how: OnFork) {
        let mut kept = Vec::with_capacity(self.wipe.len() + 2);
        for &(f, e, h) in &self.wipe {
            if e <= first || f >= end {
                kept.push((f, e, h));
                continue;
            }
            if f < first {
                kept.push((f, first, h));
            }
            if e > end {
                kept.push((end, e, h));
            }
        }
        if how != OnFork::Keep && first < end {
            kept.push((first, end, how));
        }
        kept.sort_unstable_by_key(|&(f, _, _)| f);
        self.wipe = kept;
    }

    /// The fork marks: ranges a child gets as zeros or not at all.
    pub fn fork_marks(&self) -> &[(usize, usize, OnFork)] {
        &self.wipe
    }

    /// Books a kept pin (its pin is the caller's to add).
    pub fn keep(&mut self, k: Kept) {
        self.kept.push(k);
    }

    /// Kept pins.
    pub fn kept(&self) -> &[Kept] {
        &self.kept
    }

    /// Takes out the kept pins `pick` chooses, in the order the caller
    /// must end their pins.
    pub fn take_kept(&mut self, mut pick: impl FnMut(&Kept) -> bool) -> Vec<Kept> {
        let mut out = Vec::new();
        let mut k = 0;
        while k < self.kept.len() {
            if pick(&self.kept[k]) {
                out.push(self.kept.swap_remove(k));
            } else {
                k += 1;
            }
        }
        out
    }

    /// Is a new kept pin of thread `tid`'s `kind` (`n` pages; 0 ends it)
    /// to replace `e`? Every kind replaces its own, except robust mutexes,
    /// whose entries add up until an `n` of 0 ends them all.
    pub fn replaced(e: &Kept, tid: i32, kind: KeptKind, n: usize) -> bool {
        e.tid == tid && e.kind == kind && (kind != KeptKind::Robust || n == 0)
    }

    /// In a forked child whose one thread `child` was the parent's
    /// `parent`: takes out every kept pin and returns that thread's, now
    /// the child's (the caller ends every pin, then adds those).
    pub fn kept_after_fork(&mut self, parent: i32, child: i32) -> Vec<Kept> {
        let mine = self.kept.iter().filter(|k| k.tid == parent).map(|&k| Kept { tid: child, ..k }).collect();
        self.kept.clear();
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pins_add_up_and_end_one_at_a_time() {
        let mut p = Pins::new();
        assert!(!p.pinned(0));
        assert_eq!(p.pin(10, 14), 4);
        assert_eq!(p.pin(10, 14), 4);
        assert_eq!(p.pin(12, 20), 8);
        assert_eq!(p.pin(5, 5), 0, "an empty range pins nothing");
        assert!(p.pinned(10) && p.pinned(19) && !p.pinned(9) && !p.pinned(20));
        assert_eq!(p.unpin(10, 14), 4);
        assert!(p.pinned(10), "the other pin of the range stays");
        assert_eq!(p.unpin(10, 14), 4);
        assert!(!p.pinned(10) && p.pinned(12));
        assert_eq!(p.unpin(10, 14), 0, "no pin left of that range");
        assert_eq!(p.unpin(12, 19), 0, "only an exact range ends a pin");
        assert_eq!(p.last_pin(), Some((12, 20)));
        assert_eq!(p.unpin(12, 20), 8);
        assert!((0..30).all(|i| !p.pinned(i)), "no page is pinned any more");
        assert_eq!(p.last_pin(), None);
    }

    #[test]
    fn a_lock_covers_only_what_is_not_locked_yet() {
        let mut p = Pins::new();
        assert_eq!(p.not_locked(10, 20), [(10, 20)]);
        p.lock(10, 20);
        assert_eq!(p.not_locked(10, 20), []);
        assert_eq!(p.not_locked(12, 15), []);
        assert_eq!(p.not_locked(5, 25), [(5, 10), (20, 25)]);
        for (f, e) in p.not_locked(5, 25) {
            p.lock(f, e);
        }
        assert_eq!(p.locked(), [(5, 10), (10, 20), (20, 25)]);
        p.lock(40, 50);
        p.lock(30, 35);
        assert_eq!(p.locked(), [(5, 10), (10, 20), (20, 25), (30, 35), (40, 50)], "kept sorted");
        assert_eq!(p.not_locked(0, 60), [(0, 5), (25, 30), (35, 40), (50, 60)]);
        assert_eq!(p.not_locked(7, 7), []);
    }

    #[test]
    fn a_partial_unlock_leaves_the_rest_locked() {
        let mut p = Pins::new();
        p.lock(10, 20);
        p.lock(30, 40);
        // The middle of the first, nothing of the second.
        let cut = p.unlock(12, 15);
        assert_eq!(cut, [Unlocked { range: (10, 20), left: vec![(10, 12), (15, 20)] }]);
        assert_eq!(p.locked(), [(10, 12), (15, 20), (30, 40)]);
        // The end of one and the start of the next.
        let cut = p.unlock(18, 35);
        assert_eq!(
            cut,
            [
                Unlocked { range: (15, 20), left: vec![(15, 18)] },
                Unlocked { range: (30, 40), left: vec![(35, 40)] }
            ]
        );
        assert_eq!(p.locked(), [(10, 12), (15, 18), (35, 40)]);
        // Ranges it does not touch are not cut.
        assert_eq!(p.unlock(12, 15), []);
        assert_eq!(p.unlock(0, 10), []);
        // All of them.
        let cut = p.unlock(0, usize::MAX);
        assert_eq!(cut.len(), 3);
        assert!(cut.iter().all(|u| u.left.is_empty()));
        assert_eq!(p.locked(), []);
    }

    #[test]
    fn lock_all_and_holds_freeze_evictions() {
        let mut p = Pins::new();
        assert!(!p.frozen());
        p.set_locked_all(true);
        assert!(p.frozen());
        p.set_locked_all(false);
        assert!(!p.frozen());
        let t0 = Instant::now();
        let (soon, later) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(5));
        assert!(p.hold(7, soon), "the first hold is new");
        assert!(!p.hold(8, later), "a second is not");
        assert!(!p.hold(7, later), "a renewal is not");
        assert!(p.frozen());
        assert_eq!(p.holders(), [7, 8]);
        // 7's lease now ends later: at `soon` nothing runs out.
        assert!(!p.release_holds(None, soon));
        assert_eq!(p.holders(), [7, 8]);
        assert!(!p.release_holds(Some(7), t0), "8's is left");
        assert_eq!(p.holders(), [8]);
        assert!(p.release_holds(None, later), "8's ran out: none left");
        assert!(!p.frozen());
        assert!(!p.release_holds(None, later), "none was in force");
        p.hold(9, later);
        p.clear_holds();
        assert!(!p.frozen());
    }

    #[test]
    fn a_fork_mark_replaces_the_marks_it_covers() {
        let mut p = Pins::new();
        p.mark_fork(10, 20, OnFork::Wipe);
        p.mark_fork(30, 40, OnFork::Drop);
        assert_eq!(p.fork_marks(), [(10, 20, OnFork::Wipe), (30, 40, OnFork::Drop)]);
        // Keep cuts a hole.
        p.mark_fork(12, 15, OnFork::Keep);
        assert_eq!(p.fork_marks(), [(10, 12, OnFork::Wipe), (15, 20, OnFork::Wipe), (30, 40, OnFork::Drop)]);
        // Across two marks, another way.
        p.mark_fork(18, 35, OnFork::Drop);
        assert_eq!(
            p.fork_marks(),
            [(10, 12, OnFork::Wipe), (15, 18, OnFork::Wipe), (18, 35, OnFork::Drop), (35, 40, OnFork::Drop)]
        );
        // Everything back to the default.
        p.mark_fork(0, 100, OnFork::Keep);
        assert_eq!(p.fork_marks(), []);
        p.mark_fork(5, 5, OnFork::Wipe);
        assert_eq!(p.fork_marks(), [], "an empty range marks nothing");
    }

    #[test]
    fn kept_pins_are_replaced_by_thread_and_kind_except_robust_ones() {
        let k = |tid, kind, first| Kept { tid, kind, first, end: first + 1 };
        let rseq = k(1, KeptKind::Rseq, 10);
        assert!(Pins::replaced(&rseq, 1, KeptKind::Rseq, 4));
        assert!(!Pins::replaced(&rseq, 2, KeptKind::Rseq, 4), "another thread's");
        assert!(!Pins::replaced(&rseq, 1, KeptKind::Stack, 4), "another kind");
        let robust = k(1, KeptKind::Robust, 20);
        assert!(!Pins::replaced(&robust, 1, KeptKind::Robust, 1), "robust mutexes add up");
        assert!(Pins::replaced(&robust, 1, KeptKind::Robust, 0), "until ended all at once");

        let mut p = Pins::new();
        for e in [rseq, robust, k(1, KeptKind::Robust, 30), k(2, KeptKind::Rseq, 40)] {
            p.keep(e);
        }
        let out = p.take_kept(|e| Pins::replaced(e, 1, KeptKind::Robust, 0));
        assert_eq!(out, [robust, k(1, KeptKind::Robust, 30)]);
        assert_eq!(p.kept().len(), 2);
        // After a fork: thread 1's, as the child's thread 99; no other.
        let mine = p.kept_after_fork(1, 99);
        assert_eq!(mine, [Kept { tid: 99, ..rseq }]);
        assert_eq!(p.kept(), []);
    }
}
