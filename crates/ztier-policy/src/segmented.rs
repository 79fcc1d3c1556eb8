//! `segmented`: the replacement policy `ztier run` ships — resident pages
//! in a protected segment and a probation segment, promotion by refault
//! distance, adaptive aging and an adaptive hot distance.
//!
//! Which pages go: uffd shows misses, never hits, so recency of resident
//! pages is unknown. Oldest-first (`fifo`) eviction is the worst
//! case for a program that sweeps more than the budget over and over — a
//! garbage collector's full-heap pass, a join, a scan — because the page
//! evicted is always the one the sweep needs next, and every page of
//! every pass faults. So resident pages are split in two segments:
//!
//! ```text
//!   fault / new page ──► protected (11/12 of the budget) while it has room
//!                    │   (a page never out of memory: on trial there)
//!                    └─► probation (1/12) otherwise ──► victims, oldest first
//!   protected ──1 page per 8..256 victims (aging; pages on trial first),
//!               or over its share, or in it too long (below) ──► probation
//!   refault distance < hot distance (budget/4 .. budget/64) ──► protected
//!                                     (a hot page evicted too soon)
//! ```
//!
//! No page stays in the protected segment indefinitely while others are
//! evicted. A page that takes a place there without having been out of
//! memory (the first fill, or any page meeting a free place) is *on
//! trial* ([`TRIAL`]): it has not shown that it comes back. It is aged
//! out before the others and leaves after a protected segment's worth of
//! evictions at the latest ([`trial_limit`]); if it is still in use it
//! comes back from the store once and takes a place for good. Any page
//! leaves after 64 budgets of evictions ([`protected_limit`]). Without
//! this, a page at the back of the segment waited 256 victims per page
//! ahead of it at the slowest aging (235 budgets' worth): a program
//! writing three times a 16M budget over and over (`run_progs/spawn.c`)
//! kept a command it built between two rounds of writes resident so
//! whenever the evictor, lagging on a loaded machine, had just aged a
//! page out when the command's first fault came. Keeping new pages out
//! of freed places instead kept the first fill in for good when nothing
//! came back to take its places (`run_progs/remap_fixed.c`).
//!
//! The refault distance is the number of evictions between a page's
//! eviction and its fault back (per-page eviction clock, as the kernel's
//! workingset detection: [`crate::replacement::Clock`]). A sweep over
//! more than the budget refaults at a long distance, so it cycles through
//! probation and leaves the protected segment resident: about
//! budget·11/12 pages per pass are hits instead of none. (Probation must
//! stay larger than the pages the background evictor keeps free, a
//! sixteenth of the budget ([`crate::pacing::reserve_of`]), or victims
//! come from the protected segment directly: at a 32nd, pyapp compressed
//! 1.6× as many pages. A twelfth instead of an eighth: 6% fewer on pyapp
//! at 256M, 0.97× wall in 5 paired runs; xz -9, random access, 2% more.)
//!
//! The protected segment must age, or pages a program stopped using
//! would hold it forever while a new working set that fits the budget
//! thrashes through probation. But every page aged out of a segment
//! that is still in use comes back as a fault. So the aging rate adapts
//! ([`Aging`]): a demoted page is marked DEMOTED, and one that faults
//! back from the store still marked is a regretted demotion. While at
//! least half of the recent demotions are regretted, aging slows down
//! (twice the victims per demotion, up to [`AGE_SLOWEST`]); while fewer
//! than an eighth are, it speeds up (down to [`AGE_FASTEST`]). A loop
//! over more than the budget (a collector's full passes) ends up aging
//! slowly; a program that leaves a working set behind ages fast and
//! drains it (`docs/measurements/2026-11-25-protected-segment-aging.md`
//! has the measurements).
//!
//! The hot distance adapts too. Each hot refault takes a protected page's
//! place, and that page is demoted and comes back in turn. When more than
//! half of the store faults are hot, the protected segment is cycling
//! like one FIFO over the whole budget and protects nothing: the hot
//! distance halves (down to a 64th of the budget), so that only the
//! pages refaulting soonest take places — once four adjustments in a row
//! found it so, since a heap that has just outgrown the budget refaults
//! short for a while too (pyapp-corpus's first collections past 256M:
//! 82–90% hot for three). While fewer than an eighth are hot, it doubles
//! (up to a quarter). `xz -T2 -6` of 40 MB at 160M (its
//! peak is 269 MB) ran 84 s with a fixed quarter, 42 s adapted.
//!
//! Victims from probation take their resident probation neighbours
//! along (up to [`crate::pacing::CLUSTER`] pages: [`Replacement::clusters`]), because
//! each run costs a write-protect call and a release, each with a TLB
//! shootdown on the program's CPU.
//!
//! Per page it keeps one byte of flags and the eviction clock's stamp:
//!
//! ```text
//!  flags  bit 7 QUEUED     an entry in one of the two queues (it may be stale:
//!                          the page left memory some other way since)
//!         bit 5 PROTECTED  the entry is in a protected queue
//!         bit 4 TRIAL      ... the queue of pages on trial
//!         bit 3 DEMOTED    aged out of the protected segment, not back since
//! ```
//!
//! A page's flags outlive its stay in memory: an evicted page keeps
//! DEMOTED (to be judged regretted when it faults back), and a page the
//! program released keeps its (stale) entry, which it takes up again if
//! it comes back before the entry comes up.

use std::collections::VecDeque;

use crate::pacing::{CLUSTER, EVICT_BATCH};
use crate::replacement::{Admitted, Clock, Gauges, Refault, Replacement, Slots, Verdict};

/// Has an entry in one of the two queues of resident pages.
pub const QUEUED: u8 = 0x80;
/// In the protected segment (with QUEUED: its entry is in that queue).
pub const PROTECTED: u8 = 0x20;
/// In the protected segment on trial: it took a place there without
/// having been out of memory (the first fill, or a place freed once
/// evictions had begun); its entry is in the trial queue, and it leaves
/// the segment after [`trial_limit`] evictions at the latest.
pub const TRIAL: u8 = 0x10;
/// Aged out of the protected segment and not back from the store since
/// (see [`Aging`]).
pub const DEMOTED: u8 = 0x08;
/// Fewest victims per page aged out of the protected segment (the
/// fastest aging, and the rate a run starts with).
pub const AGE_FASTEST: usize = 8;
/// Most victims per page aged out of the protected segment.
pub const AGE_SLOWEST: usize = 256;

/// The rate at which the protected segment ages, adapted to what its
/// demotions cost (see the module docs). Counts are decayed (halved) at
/// each adjustment, which comes every `period` victims, or every eight
/// demotions' worth of victims if that is more (so that even the slowest
/// rate sees enough demotions to speed up again).
#[derive(Debug)]
pub struct Aging {
    /// Victims per demotion now.
    every: usize,
    /// Victims since the last demotion.
    since: usize,
    /// Victims since the last adjustment.
    victims: usize,
    /// Demotions (decayed).
    demoted: u32,
    /// Demoted pages that faulted back from the store (decayed).
    regretted: u32,
    /// The hot distance is the budget >> `hot_shift` ([`HOT_SHIFT_FIRST`]
    /// to [`HOT_SHIFT_LAST`]).
    hot_shift: u32,
    /// Store faults (decayed).
    faults: u32,
    /// Store faults within the hot distance (decayed).
    hot: u32,
    /// Adjustments in a row that found more than half of the store faults
    /// hot.
    hot_streak: u32,
}

impl Aging {
    /// The fastest aging, no history.
    pub fn new() -> Aging {
        Aging {
            every: AGE_FASTEST,
            since: 0,
            victims: 0,
            demoted: 0,
            regretted: 0,
            hot_shift: HOT_SHIFT_FIRST,
            faults: 0,
            hot: 0,
            hot_streak: 0,
        }
    }

    /// Refault distance (evictions) under which a page of a budget of
    /// `budget` pages is hot: it goes to the protected segment.
    pub fn hot_distance(&self, budget: usize) -> usize {
        budget >> self.hot_shift
    }

    /// A page came back from the store, from within the hot distance
    /// (`hot`) or not.
    pub fn store_fault(&mut self, hot: bool) {
        self.faults = self.faults.saturating_add(1);
        if hot {
            self.hot = self.hot.saturating_add(1);
        }
    }

    /// Victims per demotion now.
    pub fn every(&self) -> usize {
        self.every
    }

    /// One victim taken; adjusts the rate every `period` victims (or
    /// every eight demotions).
    pub fn victim(&mut self, period: usize) {
        self.victims += 1;
        if self.victims >= period.max(self.every * 8) {
            self.adjust();
        }
        self.since += 1;
    }

    /// Is a protected page to be demoted now? (Once per `every` victims.)
    pub fn due(&mut self) -> bool {
        if self.since >= self.every {
            self.since = 0;
            return true;
        }
        false
    }

    /// A page left the protected segment.
    pub fn demoted(&mut self) {
        self.demoted = self.demoted.saturating_add(1);
    }

    /// A demoted page came back from the store.
    pub fn regretted(&mut self) {
        self.regretted = self.regretted.saturating_add(1);
    }

    fn adjust(&mut self) {
        self.victims = 0;
        // Four demotions at least, or the ratio says nothing (a period
        // sees eight at any rate, fewer only if the protected segment is
        // empty).
        if self.demoted >= 4 {
            if self.regretted * 2 >= self.demoted {
                self.every = (self.every * 2).min(AGE_SLOWEST);
            } else if self.regretted * 8 < self.demoted {
                self.every = (self.every / 2).max(AGE_FASTEST);
            }
        }
        self.demoted /= 2;
        self.regretted /= 2;
        // When most store faults are hot, every one of them takes a
        // protected page's place, and that page comes back in turn: the
        // segment cycles like one FIFO over the budget and protects
        // nothing. The hot distance halves then, so that only the pages
        // refaulting soonest take places; it doubles back while few are
        // hot.
        if self.faults >= 16 {
            if self.hot * 2 > self.faults {
                self.hot_streak += 1;
                if self.hot_streak >= HOT_STREAK {
                    self.hot_shift = (self.hot_shift + 1).min(HOT_SHIFT_LAST);
                    self.hot_streak = 0;
                }
            } else {
                self.hot_streak = 0;
                if self.hot * 8 < self.faults {
                    self.hot_shift = (self.hot_shift - 1).max(HOT_SHIFT_FIRST);
                }
            }
        }
        self.faults /= 2;
        self.hot /= 2;
    }
}

impl Default for Aging {
    fn default() -> Self {
        Aging::new()
    }
}

/// Victims between two adjustments of the aging rate, for a budget of
/// `budget` pages: an eighth of the budget (at least 256).
pub fn aging_period(budget: usize) -> usize {
    (budget / 8).max(256)
}

/// The longest hot distance, and the one a run starts with, as a shift
/// of the budget: a quarter. With slow aging, pyapp at 256M compressed
/// 7% fewer pages than with the probation's size (an eighth) and 5%
/// fewer than with half the budget.
pub const HOT_SHIFT_FIRST: u32 = 2;
/// The shortest hot distance, as a shift of the budget: a 64th.
pub const HOT_SHIFT_LAST: u32 = 6;
/// Adjustments in a row that must find most store faults hot before the
/// hot distance halves: a heap that just outgrew the budget refaults
/// short for a while (pyapp's first collections past it), a cycling
/// segment for good.
pub const HOT_STREAK: u32 = 4;

/// Evictions after which a page on trial in the protected segment (see
/// [`TRIAL`]) leaves it, whatever the aging rate: one protected segment's
/// worth (`prot_max`).
pub fn trial_limit(prot_max: usize) -> usize {
    prot_max.max(1)
}

/// Evictions after which any page leaves the protected segment, whatever
/// the aging rate: 64 budgets. At the slowest aging a page at the back
/// waits 256 victims per page ahead of it (235 budgets' worth at least);
/// this bounds that wait at a cost of at most one demotion per 64·12/11
/// evictions (1.4%) to a loop that keeps the aging slow.
pub fn protected_limit(budget: usize) -> usize {
    budget.saturating_mul(64).max(1)
}

/// Probation: the part of a budget of `budget` pages that cycles (a
/// twelfth); the rest is the protected segment.
pub fn probation(budget: usize) -> usize {
    (budget / 12).max(EVICT_BATCH * 4).min(budget / 2)
}

/// The shipped replacement policy (see the module docs), over per-page
/// flags `B` and eviction stamps `C`.
pub struct Segmented<B = Vec<u8>, C = Vec<u32>> {
    /// Probation: resident pages, oldest first; victims come from here.
    fifo: VecDeque<u32>,
    /// Protected segment, pages that came back from the store (or hot),
    /// oldest first, with the eviction clock when each joined it.
    prot: VecDeque<(u32, u32)>,
    /// Protected segment, pages on trial ([`TRIAL`]), oldest first, with
    /// the eviction clock when each joined it.
    trial: VecDeque<(u32, u32)>,
    /// Resident (or evicting) pages with PROTECTED set.
    prot_res: usize,
    /// Largest protected segment (budget − probation).
    prot_max: usize,
    /// Resident pages allowed.
    budget: usize,
    /// How fast the protected segment ages.
    aging: Aging,
    /// The eviction clock (refault distances).
    clock: Clock<C>,
    /// Per page: QUEUED, PROTECTED, DEMOTED.
    bits: B,
    /// The page whose fault is being served goes to the protected segment.
    hot: usize,
    /// Pages demoted so far.
    demoted: u64,
    /// Where the last candidate came from (to put it back on `Requeue`).
    from: From,
}

/// The queue a candidate came from, with its entry's stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum From {
    Probation,
    Protected(u32),
    Trial(u32),
}

impl<B: Slots<u8>, C: Slots<u32>> Segmented<B, C> {
    /// The policy for `budget` resident pages, over zeroed per-page
    /// tables of the managed range.
    pub fn new(budget: usize, bits: B, stamps: C) -> Self {
        Segmented {
            fifo: VecDeque::new(),
            prot: VecDeque::new(),
            trial: VecDeque::new(),
            prot_res: 0,
            prot_max: budget - probation(budget),
            budget,
            aging: Aging::new(),
            clock: Clock::new(stamps),
            bits,
            hot: usize::MAX,
            demoted: 0,
            from: From::Probation,
        }
    }

    /// Caps the protected segment at `n` pages (until the budget moves):
    /// for tests and experiments.
    pub fn set_protected_max(&mut self, n: usize) {
        self.prot_max = n;
    }

    /// Whether `page` is marked demoted (aged out of the protected
    /// segment and not back since).
    pub fn demoted(&self, page: usize) -> bool {
        self.bits[page] & DEMOTED != 0
    }

    /// The eviction clock (tests move it on).
    pub fn clock_mut(&mut self) -> &mut Clock<C> {
        &mut self.clock
    }

    /// The aging state.
    pub fn aging(&self) -> &Aging {
        &self.aging
    }

    /// Probation's queue, the protected segment's, and its pages on
    /// trial, oldest first (stale entries included; the protected ones
    /// with the eviction clock when each joined).
    #[allow(clippy::type_complexity)]
    pub fn queues(&self) -> (&VecDeque<u32>, &VecDeque<(u32, u32)>, &VecDeque<(u32, u32)>) {
        (&self.fifo, &self.prot, &self.trial)
    }

    /// Moves the oldest resident page of the protected segment to the
    /// back of probation: from the pages on trial first (they have not
    /// shown they come back), then the others. Stale entries on the way
    /// are dropped.
    fn demote_one(&mut self, resident: &dyn Fn(usize) -> bool) {
        if !self.demote_front(true, 0, resident) {
            self.demote_front(false, 0, resident);
        }
    }

    /// Demotes the front page of the trial queue (`trial`) or of the
    /// others, if it joined the segment `limit` evictions ago or more
    /// (stale entries in front are dropped). Returns whether it demoted.
    fn demote_front(&mut self, trial: bool, limit: usize, resident: &dyn Fn(usize) -> bool) -> bool {
        let now = self.clock.now();
        loop {
            let q = if trial { &mut self.trial } else { &mut self.prot };
            let Some(&(i, at)) = q.front() else { return false };
            let i = i as usize;
            if resident(i) && (now.wrapping_sub(at) as usize) < limit {
                return false;
            }
            q.pop_front();
            let b = self.bits[i] & !(QUEUED | PROTECTED | TRIAL);
            if resident(i) {
                self.prot_res -= 1;
                self.fifo.push_back(i as u32);
                self.bits[i] = b | QUEUED | DEMOTED;
                self.demoted += 1;
                self.aging.demoted();
                return true;
            }
            self.bits[i] = b;
        }
    }

    /// Demotes the pages that have been in the protected segment too
    /// long, whatever the aging rate: on trial, [`trial_limit`]
    /// evictions; any, [`protected_limit`]. At most
    /// [`crate::pacing::CLUSTER`] per call (about the pages a victim
    /// takes along), so that a first fill that comes due at once leaves
    /// over many victims rather than in one long call.
    fn demote_overdue(&mut self, resident: &dyn Fn(usize) -> bool) {
        let (trial, any) = (trial_limit(self.prot_max), protected_limit(self.budget));
        let mut n = 0;
        while n < CLUSTER && self.demote_front(true, trial, resident) {
            n += 1;
        }
        while n < CLUSTER && self.demote_front(false, any, resident) {
            n += 1;
        }
    }
}

impl<B: Slots<u8> + 'static, C: Slots<u32> + 'static> Replacement for Segmented<B, C> {
    fn name(&self) -> &'static str {
        "segmented"
    }

    fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.prot_max = budget - probation(budget);
    }

    fn refault(&mut self, page: usize) -> Refault {
        // Refault distance (evictions since this page went out): shorter
        // than the hot distance means a bigger probation would have kept
        // it — a hot page, it goes to the protected segment. A loop over
        // more than the budget refaults at a long distance and leaves the
        // protected segment alone.
        let distance = self.clock.distance(page);
        let hot = distance < self.aging.hot_distance(self.budget);
        self.hot = if hot { page } else { usize::MAX };
        Refault { distance, hot }
    }

    fn refault_done(&mut self) -> bool {
        let hot = self.hot != usize::MAX;
        self.hot = usize::MAX;
        self.aging.store_fault(hot);
        hot
    }

    fn stays_long(&self, page: usize) -> bool {
        self.prot_res < self.prot_max || page == self.hot
    }

    fn resident(&mut self, i: usize) -> Admitted {
        let b = self.bits[i];
        let mut a = Admitted::default();
        if b & DEMOTED != 0 {
            // Back from the store (or as zeros, if it was all zero when
            // evicted; a released page loses the mark).
            self.aging.regretted();
            a.regretted = true;
        }
        let mut n = b & !DEMOTED;
        if b & QUEUED == 0 {
            // The protected segment fills first; after that only pages
            // faulted back soon after their eviction join it, and any
            // page takes a place it frees. A page that has not been out
            // of memory before is on trial there (see [`TRIAL`]).
            if self.prot_res < self.prot_max || i == self.hot {
                let now = self.clock.now();
                if i == self.hot || self.clock.went_out(i) {
                    self.prot.push_back((i as u32, now));
                    n |= QUEUED | PROTECTED;
                } else {
                    self.trial.push_back((i as u32, now));
                    n |= QUEUED | PROTECTED | TRIAL;
                }
                a.promoted = i == self.hot;
            } else {
                self.fifo.push_back(i as u32);
                n |= QUEUED;
            }
        }
        if n & PROTECTED != 0 {
            self.prot_res += 1;
        }
        self.bits[i] = n;
        a
    }

    fn requeue(&mut self, i: usize) {
        if self.bits[i] & QUEUED == 0 {
            self.fifo.push_back(i as u32);
            self.bits[i] |= QUEUED;
        }
    }

    fn evicted(&mut self, i: usize) {
        self.clock.tick(i);
    }

    fn released(&mut self, i: usize, was_resident: bool) {
        if was_resident && self.bits[i] & PROTECTED != 0 {
            self.prot_res -= 1;
        }
        self.bits[i] &= !DEMOTED;
        // What the program puts there next is new: on trial if it takes
        // a protected place.
        self.clock.forget(i);
    }

    fn queued(&self) -> usize {
        self.fifo.len() + self.prot.len() + self.trial.len()
    }

    fn candidate(&mut self, resident: &dyn Fn(usize) -> bool) -> Option<usize> {
        // The protected segment ages (one page to probation every
        // `Aging::every` victims), so it follows a changing working set;
        // and it never holds more than its share.
        // Pages in it too long leave whatever the rate (see
        // [`trial_limit`], [`protected_limit`]).
        if self.prot_res > self.prot_max || self.aging.due() {
            self.demote_one(resident);
        }
        self.demote_overdue(resident);
        let (i, from) = match self.fifo.pop_front() {
            Some(i) => (i as usize, From::Probation),
            None => match self.trial.pop_front() {
                Some((i, at)) => (i as usize, From::Trial(at)),
                None => {
                    let (i, at) = self.prot.pop_front()?;
                    (i as usize, From::Protected(at))
                }
            },
        };
        self.bits[i] &= !(QUEUED | PROTECTED | TRIAL);
        self.from = from;
        Some(i)
    }

    fn judge(&mut self, i: usize, verdict: Verdict) {
        match verdict {
            Verdict::Take => {
                if self.from != From::Probation {
                    self.prot_res -= 1;
                }
                self.aging.victim(aging_period(self.budget));
            }
            // Pinned: out of the queues until it is unpinned (cycling
            // through probation, pinned pages would keep the victims
            // behind them from being looked at).
            Verdict::Hold => {
                if self.from != From::Probation {
                    self.prot_res -= 1;
                }
            }
            // Taken back from an eviction in flight: out of the queues
            // until its commit puts it back.
            Verdict::Owned | Verdict::Stale => {}
            Verdict::Requeue => match self.from {
                From::Protected(at) => {
                    self.prot.push_back((i as u32, at));
                    self.bits[i] |= QUEUED | PROTECTED;
                }
                From::Trial(at) => {
                    self.trial.push_back((i as u32, at));
                    self.bits[i] |= QUEUED | PROTECTED | TRIAL;
                }
                From::Probation => {
                    self.fifo.push_back(i as u32);
                    self.bits[i] |= QUEUED;
                }
            },
        }
    }

    fn clusters(&self, i: usize) -> bool {
        self.bits[i] & PROTECTED == 0
    }

    fn protected(&self, i: usize) -> bool {
        self.bits[i] & PROTECTED != 0
    }

    fn distance(&self, i: usize) -> usize {
        self.clock.distance(i)
    }

    fn clock(&self) -> u32 {
        self.clock.now()
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            demoted: self.demoted,
            age_every: self.aging.every(),
            hot_distance: self.aging.hot_distance(self.budget),
            protected_max: self.prot_max,
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacing::CLUSTER;

    fn seg(budget: usize, pages: usize) -> Segmented {
        Segmented::new(budget, vec![0; pages], vec![0; pages])
    }

    /// Takes victims as a pager would (every page resident is evictable)
    /// until `n` are taken; returns them.
    fn victims(s: &mut Segmented, resident: &[bool], n: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut looks = s.queued();
        while out.len() < n && looks > 0 {
            looks -= 1;
            let Some(i) = s.candidate(&|i| resident[i]) else { break };
            let v = if resident[i] { Verdict::Take } else { Verdict::Stale };
            s.judge(i, v);
            if v == Verdict::Take {
                out.push(i);
            }
        }
        out
    }

    #[test]
    fn the_protected_segment_fills_first_then_victims_come_from_probation() {
        let budget = 1200;
        let mut s = seg(budget, 4096);
        let pmax = budget - probation(budget);
        assert_eq!(s.gauges().protected_max, pmax);
        let mut resident = vec![false; 4096];
        for (i, r) in resident.iter_mut().enumerate().take(budget) {
            let a = s.resident(i);
            assert!(!a.promoted && !a.regretted);
            *r = true;
        }
        assert!((0..pmax).all(|i| s.protected(i)));
        assert!((pmax..budget).all(|i| !s.protected(i) && s.clusters(i)));
        // The oldest of probation go first (aging demotes one protected
        // page per AGE_FASTEST victims to probation's back meanwhile).
        let v = victims(&mut s, &resident, 16);
        assert_eq!(v, (pmax..pmax + 16).collect::<Vec<_>>());
    }

    #[test]
    fn a_page_that_refaults_soon_is_promoted_and_one_that_refaults_late_is_not() {
        let budget = 1200;
        let mut s = seg(budget, 8192);
        let mut resident = vec![false; 8192];
        for (i, r) in resident.iter_mut().enumerate().take(budget) {
            s.resident(i);
            *r = true;
        }
        // Evict probation's first 8 (no aging before the ninth); the
        // first refaults 7 evictions later: hot, into the protected
        // segment though it is full.
        let v = victims(&mut s, &resident, 8);
        for &i in &v {
            s.evicted(i);
            resident[i] = false;
        }
        let r = s.refault(v[0]);
        assert_eq!(r, Refault { distance: 7, hot: true });
        assert!(s.stays_long(v[0]));
        let a = s.resident(v[0]);
        assert!(a.promoted && s.protected(v[0]));
        assert!(s.refault_done());
        // Evictions far beyond the hot distance (a quarter of the budget).
        s.clock_mut().advance(budget as u32);
        let r = s.refault(1101);
        assert!(!r.hot && r.distance > budget);
        assert!(!s.stays_long(1101), "the protected segment is full");
        assert!(!s.resident(1101).promoted);
        assert!(!s.refault_done());
    }

    #[test]
    fn demoted_pages_that_come_back_are_regretted_and_released_ones_forgotten() {
        let budget = 1200;
        let mut s = seg(budget, 4096);
        let mut resident = vec![false; 4096];
        for (i, r) in resident.iter_mut().enumerate().take(budget) {
            s.resident(i);
            *r = true;
        }
        s.set_protected_max(100);
        let v = victims(&mut s, &resident, 32);
        assert_eq!(v.len(), 32);
        let demoted: Vec<usize> = (0..budget).filter(|&i| s.bits[i] & DEMOTED != 0).collect();
        assert!(!demoted.is_empty(), "over its share, the protected segment sheds pages");
        assert_eq!(s.gauges().demoted, demoted.len() as u64);
        let (d, e) = (demoted[0], demoted[1]);
        // d goes out and comes back: regretted. e is released: forgotten.
        s.evicted(d);
        assert!(s.resident(d).regretted);
        s.released(e, true);
        assert!(!s.resident(e).regretted);
    }

    /// A pager's view of a page touched by the program: faulted in if it
    /// is not resident (from the store if it went out), after evicting
    /// one victim at a time while the budget is full. Returns the
    /// evictions it made.
    fn touch(s: &mut Segmented, resident: &mut [bool], i: usize) -> usize {
        if resident[i] {
            return 0;
        }
        let mut evictions = 0;
        while resident.iter().filter(|&&r| r).count() >= s.budget {
            let v = victims(s, resident, 1);
            assert_eq!(v.len(), 1, "no victim");
            s.evicted(v[0]);
            resident[v[0]] = false;
            evictions += 1;
        }
        let back = s.clock.went_out(i);
        if back {
            s.refault(i);
        }
        s.resident(i);
        if back {
            s.refault_done();
        }
        resident[i] = true;
        evictions
    }

    /// Passes of a loop over `pages` until the aging is at its slowest
    /// (each page it ages out comes back on the next pass).
    fn loop_until_the_aging_is_slowest(
        s: &mut Segmented,
        resident: &mut [bool],
        pages: std::ops::Range<usize>,
    ) {
        let mut pass = 0;
        while s.aging().every() < AGE_SLOWEST {
            assert!(pass < 64, "aging at {} after {pass} passes", s.aging().every());
            for i in pages.clone() {
                touch(s, resident, i);
            }
            pass += 1;
        }
    }

    #[test]
    fn a_new_page_taking_a_place_the_slow_aging_frees_leaves_within_a_protected_segments_worth() {
        // A loop over three times the budget ages the protected segment
        // at its slowest rate. A page touched once (a command built
        // between two rounds of writes) takes a place the aging frees.
        // Before, it stood at the back of the segment: 256 victims per
        // page ahead of it (over 280,000 here) before it could leave.
        let budget = 1200;
        let (lo, hi, new) = (0, 3 * budget, 10_000);
        let mut s = seg(budget, 16_384);
        let mut resident = vec![false; 16_384];
        loop_until_the_aging_is_slowest(&mut s, &mut resident, lo..hi);
        let demoted = s.gauges().demoted;
        while s.gauges().demoted == demoted {
            let v = victims(&mut s, &resident, 1);
            s.evicted(v[0]);
            resident[v[0]] = false;
        }
        touch(&mut s, &mut resident, new);
        assert!(s.protected(new), "it takes the free place, as any page does");
        // The loop goes on: the page leaves the segment within a
        // protected segment's worth of evictions, and memory within a
        // budget's.
        let pmax = budget - probation(budget);
        let (mut evictions, mut left_at) = (0, None);
        'run: for _ in 0..2 {
            for i in lo..hi {
                evictions += touch(&mut s, &mut resident, i);
                if left_at.is_none() && !s.protected(new) {
                    left_at = Some(evictions);
                }
                if !resident[new] {
                    break 'run;
                }
            }
        }
        let left_at = left_at.expect("it never left the protected segment");
        assert!(left_at <= pmax + CLUSTER, "left the segment after {left_at} evictions");
        assert!(!resident[new], "still resident after {evictions} evictions");
        assert!(evictions <= budget + CLUSTER, "resident for {evictions} evictions");
        // The loop keeps its protected part, at the slowest aging still.
        let protected = (lo..hi).filter(|&i| resident[i] && s.protected(i)).count();
        assert!(protected >= pmax - 2, "{protected} of {pmax} protected");
        assert_eq!(s.aging().every(), AGE_SLOWEST);
    }

    #[test]
    fn pages_of_the_first_fill_nothing_touches_again_leave_within_a_protected_segments_worth() {
        // The first fill takes the protected segment; then the program
        // writes new memory only (a mapping filled and then pushed out by
        // churn). Each page of the fill must leave the segment within a
        // protected segment's worth of evictions: aging alone, at its
        // fastest, takes eight victims per page (8,800 here), at its
        // slowest 256.
        let budget = 1200;
        let pmax = budget - probation(budget);
        let mut s = seg(budget, 16_384);
        let mut resident = vec![false; 16_384];
        for i in 0..budget {
            touch(&mut s, &mut resident, i);
        }
        assert!((0..pmax).all(|i| s.protected(i)));
        let mut evictions = 0;
        for i in budget..budget + 2 * pmax + 2 * CLUSTER {
            evictions += touch(&mut s, &mut resident, i);
            // Due after `pmax` evictions, they leave with the victims,
            // CLUSTER per victim (a pager's victims take up to CLUSTER
            // pages along; these, one).
            if evictions == pmax + pmax / CLUSTER + 1 {
                let left = (0..pmax).filter(|&i| s.protected(i)).count();
                assert_eq!(left, 0, "{left} pages of the first fill protected after {evictions} evictions");
            }
        }
        let left = (0..budget).filter(|&i| resident[i]).count();
        assert_eq!(left, 0, "{left} pages of the first fill resident after {evictions} evictions");
        // The pages that took their places are protected in turn.
        assert!((budget..budget + 2 * pmax).filter(|&i| s.protected(i)).count() >= pmax - 2 * CLUSTER);
    }

    #[test]
    fn a_loop_whose_pages_were_the_first_fill_keeps_a_protected_part() {
        // The first fill of a loop over twice the budget goes out once
        // (on trial, it leaves after a segment's worth of evictions); the
        // pages coming back take its places for good: after a few passes
        // nearly all of the segment is resident and protected, and a pass
        // faults about the loop minus the segment.
        let budget = 1200;
        let pmax = budget - probation(budget);
        let (lo, hi) = (0, 2 * budget);
        let mut s = seg(budget, 16_384);
        let mut resident = vec![false; 16_384];
        for _ in 0..6 {
            for i in lo..hi {
                touch(&mut s, &mut resident, i);
            }
        }
        let mut evictions = 0;
        for i in lo..hi {
            evictions += touch(&mut s, &mut resident, i);
        }
        let protected = (lo..hi).filter(|&i| resident[i] && s.protected(i)).count();
        assert!(protected >= pmax - pmax / 16, "{protected} of {pmax} protected");
        assert!(evictions <= hi - lo - pmax + pmax / 8, "{evictions} evictions in a pass");
    }

    #[test]
    fn pinned_pages_leave_the_queues_and_unevictable_ones_stay_in_them() {
        let mut s = seg(1200, 4096);
        for i in 0..100 {
            s.resident(i);
        }
        assert!((0..100).all(|i| s.protected(i)), "the protected segment fills first");
        // Page 0 is pinned (held), page 1 cannot go (requeued): the
        // others are taken, in one look at each entry.
        let mut taken = Vec::new();
        let mut looks = s.queued();
        while looks > 0 {
            looks -= 1;
            let i = s.candidate(&|_| true).expect("a candidate");
            let v = match i {
                0 => Verdict::Hold,
                1 => Verdict::Requeue,
                _ => Verdict::Take,
            };
            s.judge(i, v);
            if v == Verdict::Take {
                taken.push(i);
            }
        }
        assert_eq!(taken.len(), 98);
        assert!(s.protected(1), "a page that cannot go stays in its segment");
        assert!(!s.protected(0));
        assert_eq!(s.queued(), 1, "only the unevictable page is queued");
        // Unpinned, page 0 is back in line, once.
        s.requeue(0);
        s.requeue(0);
        assert_eq!(s.queued(), 2);
        assert_eq!(s.candidate(&|_| true), Some(0));
    }

    #[test]
    fn the_hot_distance_shortens_while_most_store_faults_are_hot_and_grows_back_when_few_are() {
        let budget = 64 * 1024;
        let mut a = Aging::new();
        assert_eq!(a.hot_distance(budget), budget / 4);
        // Most store faults hot for three adjustments (a heap that just
        // outgrew the budget): it holds.
        for _ in 0..3 {
            for _ in 0..100 {
                a.store_fault(true);
            }
            a.adjust();
        }
        assert_eq!(a.hot_distance(budget), budget / 4);
        let mut a = Aging::new();
        // Every store fault hot (a segment that cycles): shorter, a step
        // per four adjustments, down to a 64th.
        let mut seen = vec![a.hot_distance(budget)];
        for k in 0..40 {
            for _ in 0..100 {
                a.store_fault(true);
            }
            a.adjust();
            if seen.last() != Some(&a.hot_distance(budget)) {
                seen.push(a.hot_distance(budget));
            }
            if k == 3 {
                assert_eq!(a.hot_distance(budget), budget / 8, "after four adjustments");
            }
        }
        assert_eq!(seen, [budget / 4, budget / 8, budget / 16, budget / 32, budget / 64]);
        // One in four hot: neither, the distance holds.
        for k in 0..4000 {
            a.store_fault(k % 4 == 0);
            if k % 100 == 99 {
                a.adjust();
            }
        }
        assert_eq!(a.hot_distance(budget), budget / 64);
        // Few hot (a loop over more than the budget): back to a quarter.
        for k in 0..4000 {
            a.store_fault(k % 20 == 0);
            if k % 100 == 99 {
                a.adjust();
            }
        }
        assert_eq!(a.hot_distance(budget), budget / 4);
        // Too few faults to judge: it holds.
        let mut a = Aging::new();
        for _ in 0..10 {
            for _ in 0..7 {
                a.store_fault(true);
            }
            a.adjust();
        }
        assert_eq!(a.hot_distance(budget), budget / 4);
    }

    #[test]
    fn aging_slows_while_demotions_come_back_and_speeds_up_when_they_do_not() {
        let period = 1000;
        let mut a = Aging::new();
        assert_eq!(a.every(), AGE_FASTEST);
        // Every demoted page comes back: slower, down to the slowest rate.
        for _ in 0..40 * period {
            a.victim(period);
            if a.due() {
                a.demoted();
                a.regretted();
            }
        }
        assert_eq!(a.every(), AGE_SLOWEST);
        // None comes back (a working set that left): faster again.
        let mut demotions = 0;
        for _ in 0..40 * period {
            a.victim(period);
            if a.due() {
                a.demoted();
                demotions += 1;
            }
        }
        assert_eq!(a.every(), AGE_FASTEST, "after {demotions} demotions without regret");
        // One in four comes back: neither, the rate holds.
        let mut a = Aging::new();
        for _ in 0..3 {
            for _ in 0..8 {
                a.demoted();
                a.regretted();
            }
            a.adjust();
        }
        let held = a.every();
        assert_eq!(held, AGE_FASTEST * 8);
        for k in 0..400 {
            a.demoted();
            if k % 4 == 0 {
                a.regretted();
            }
            if k % 40 == 39 {
                a.adjust();
            }
        }
        assert_eq!(a.every(), held);
        // Too few demotions to judge (once the history has decayed): the
        // rate holds too.
        for _ in 0..10 {
            a.adjust();
        }
        for _ in 0..10 {
            a.demoted();
            a.adjust();
        }
        assert_eq!(a.every(), held);
    }
}
