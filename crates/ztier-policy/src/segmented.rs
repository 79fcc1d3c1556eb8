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
//!                    └─► probation (1/12) otherwise ──► victims, oldest first
//!   protected ──1 page per 8..256 victims (aging), or over its share──► probation
//!   refault distance < hot distance (budget/4 .. budget/64) ──► protected
//!                                     (a hot page evicted too soon)
//! ```
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
//!         bit 5 PROTECTED  the entry is in the protected queue
//!         bit 3 DEMOTED    aged out of the protected segment, not back since
//! ```
//!
//! A page's flags outlive its stay in memory: an evicted page keeps
//! DEMOTED (to be judged regretted when it faults back), and a page the
//! program released keeps its (stale) entry, which it takes up again if
//! it comes back before the entry comes up.

use std::collections::VecDeque;

use crate::pacing::EVICT_BATCH;
use crate::replacement::{Admitted, Clock, Gauges, Refault, Replacement, Slots, Verdict};

/// Has an entry in one of the two queues of resident pages.
pub const QUEUED: u8 = 0x80;
/// In the protected segment (with QUEUED: its entry is in that queue).
pub const PROTECTED: u8 = 0x20;
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
    /// Protected segment, oldest first.
    prot: VecDeque<u32>,
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
    /// The last candidate came from the protected queue.
    from_prot: bool,
}

impl<B: Slots<u8>, C: Slots<u32>> Segmented<B, C> {
    /// The policy for `budget` resident pages, over zeroed per-page
    /// tables of the managed range.
    pub fn new(budget: usize, bits: B, stamps: C) -> Self {
        Segmented {
            fifo: VecDeque::new(),
            prot: VecDeque::new(),
            prot_res: 0,
            prot_max: budget - probation(budget),
            budget,
            aging: Aging::new(),
            clock: Clock::new(stamps),
            bits,
            hot: usize::MAX,
            demoted: 0,
            from_prot: false,
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

    /// Probation's queue, then the protected segment's, oldest first
    /// (stale entries included).
    pub fn queues(&self) -> (&VecDeque<u32>, &VecDeque<u32>) {
        (&self.fifo, &self.prot)
    }

    /// Moves the oldest resident page of the protected segment to the back
    /// of probation (stale entries on the way are dropped).
    fn demote_one(&mut self, resident: &dyn Fn(usize) -> bool) {
        while let Some(i) = self.prot.pop_front() {
            let i = i as usize;
            let b = self.bits[i] & !(QUEUED | PROTECTED);
            if resident(i) {
                self.prot_res -= 1;
                self.fifo.push_back(i as u32);
                self.bits[i] = b | QUEUED | DEMOTED;
                self.demoted += 1;
                self.aging.demoted();
                return;
            }
            self.bits[i] = b;
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
            // faulted back soon after their eviction join it.
            if self.prot_res < self.prot_max || i == self.hot {
                self.prot.push_back(i as u32);
                n |= QUEUED | PROTECTED;
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
    }

    fn queued(&self) -> usize {
        self.fifo.len() + self.prot.len()
    }

    fn candidate(&mut self, resident: &dyn Fn(usize) -> bool) -> Option<usize> {
        // The protected segment ages (one page to probation every
        // `Aging::every` victims), so it follows a changing working set;
        // and it never holds more than its share.
        if self.prot_res > self.prot_max || self.aging.due() {
            self.demote_one(resident);
        }
        let (i, from_prot) = match self.fifo.pop_front() {
            Some(i) => (i as usize, false),
            None => (self.prot.pop_front()? as usize, true),
        };
        self.bits[i] &= !(QUEUED | PROTECTED);
        self.from_prot = from_prot;
        Some(i)
    }

    fn judge(&mut self, i: usize, verdict: Verdict) {
        match verdict {
            Verdict::Take => {
                if self.from_prot {
                    self.prot_res -= 1;
                }
                self.aging.victim(aging_period(self.budget));
            }
            // Pinned: out of the queues until it is unpinned (cycling
            // through probation, pinned pages would keep the victims
            // behind them from being looked at).
            Verdict::Hold => {
                if self.from_prot {
                    self.prot_res -= 1;
                }
            }
            // Taken back from an eviction in flight: out of the queues
            // until its commit puts it back.
            Verdict::Owned | Verdict::Stale => {}
            Verdict::Requeue => {
                if self.from_prot {
                    self.prot.push_back(i as u32);
                    self.bits[i] |= QUEUED | PROTECTED;
                } else {
                    self.fifo.push_back(i as u32);
                    self.bits[i] |= QUEUED;
                }
            }
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
