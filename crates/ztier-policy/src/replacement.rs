//! The replacement interface: which resident pages leave memory, and in
//! what order, for a pager that sees **faults only** (`ztier run`:
//! userfaultfd reports misses, never hits).
//!
//! A replacement policy is a state machine over page indices `0..pages`
//! of the range a pager manages. The pager (the run library live, the
//! simulator's model of it offline) tells it what happened to each page
//! and asks it for victims; the policy never does I/O and never looks at
//! a page's memory. Its per-page state lives in tables the pager gives it
//! ([`Slots`]: a `Vec` in the simulator, a mapping of the run library's
//! live), so that one object runs in both.
//!
//! ```text
//!  pager                                  policy
//!  ─────                                  ──────
//!  fault on a stored page ──refault(i)──► distance since i went out, hot?
//!  (install) page i resident ─resident(i)► queued; promoted / regretted
//!  fault served ─────────refault_done()─► (adapts)
//!  want victims ─────────candidate(..)──► oldest page of a queue
//!           verdict on it ──judge(i, v)─► taken / held / requeued / dropped
//!  page i stored ────────evicted(i)─────► eviction clock ticks
//!  page i released ──────released(i, r)─► forgotten while out
//!  page i back in line ──requeue(i)─────► at the back of the victims' queue
//! ```
//!
//! A policy keeps its own queues; a page's entry in one may go stale (the
//! page left memory some other way): [`Verdict::Stale`] drops it when it
//! comes up. The eviction clock ([`Clock`]) counts evictions; a page's
//! *refault distance* is the evictions between its eviction and its
//! fault back — the kernel's workingset measure, and the only recency a
//! fault-driven pager has.

use std::ops::DerefMut;

/// Per-page storage a policy keeps state in: one slot per page of the
/// managed range, all zero at first. A `Vec` (the simulator) or a
/// mapping the pager made (the run library), so the policy needs no
/// allocator of its own for tables as long as the address space.
pub trait Slots<T>: DerefMut<Target = [T]> + Send {}

impl<T, S: DerefMut<Target = [T]> + Send> Slots<T> for S {}

/// What the pager says of a page a policy offers as a victim
/// ([`Replacement::candidate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Evicted: it leaves the policy's queues.
    Take,
    /// Resident but pinned (a system call in flight uses it): out of the
    /// queues until the pager [`Replacement::requeue`]s it.
    Hold,
    /// Resident and owned by an eviction in flight that gave it back
    /// (a write took it back): out of the queues until that eviction
    /// commits and requeues it.
    Owned,
    /// Resident but never a victim (not readable): back in its queue.
    Requeue,
    /// Not resident (the entry is stale): dropped.
    Stale,
}

/// A fault on a stored page, as the policy sees it ([`Replacement::refault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refault {
    /// Evictions since the page went out.
    pub distance: usize,
    /// The page refaulted soon enough to be kept longer this time.
    pub hot: bool,
}

/// What a page's arrival in memory told the policy ([`Replacement::resident`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admitted {
    /// It went to the protected part of memory for refaulting soon.
    pub promoted: bool,
    /// It had been moved out of the protected part, and came back.
    pub regretted: bool,
}

/// Gauges of a policy, for statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Pages moved from the protected part to the victims' queue, so far.
    pub demoted: u64,
    /// Victims per page aged out of the protected part, now.
    pub age_every: usize,
    /// Refault distance under which a page is hot, now (evictions).
    pub hot_distance: usize,
    /// Most pages the protected part holds now.
    pub protected_max: usize,
}

/// A replacement policy driven by faults and evictions (see the module
/// docs for the order of the calls).
pub trait Replacement: Send {
    /// The name `--policy` gives it (`segmented`).
    fn name(&self) -> &'static str;

    /// Resident pages allowed now (a sizing policy or a shared budget
    /// moved it).
    fn set_budget(&mut self, budget: usize);

    /// A fault on stored page `page` is being served: its refault
    /// distance, and whether it is hot — the page then goes to the
    /// protected part when it becomes resident ([`Replacement::resident`]).
    fn refault(&mut self, page: usize) -> Refault;

    /// The fault [`Replacement::refault`] announced is served; returns
    /// whether it was hot.
    fn refault_done(&mut self) -> bool;

    /// Whether `page`, about to become resident, will stay long (the
    /// protected part): a pager keeps the stored copies only of pages
    /// that will not.
    fn stays_long(&self, page: usize) -> bool;

    /// `page` became resident (a fault installed it).
    fn resident(&mut self, page: usize) -> Admitted;

    /// Resident `page` is back in line for eviction (unpinned, refused by
    /// the store, given back by an eviction): at the back of the victims'
    /// queue unless it has an entry already.
    fn requeue(&mut self, page: usize);

    /// `page` left memory by eviction (compressed or dropped): the
    /// eviction clock ticks.
    fn evicted(&mut self, page: usize);

    /// `page` was released by the program (`was_resident`: it was in
    /// memory, or being evicted).
    fn released(&mut self, page: usize, was_resident: bool);

    /// Entries in the queues (each is looked at at most once per round
    /// of [`Replacement::candidate`]s).
    fn queued(&self) -> usize;

    /// The next victim to consider, oldest first, out of its queue (the
    /// protected part ages first if it is due); `resident(i)` tells
    /// whether page `i` is resident (and not being evicted). Each
    /// candidate must be [`Replacement::judge`]d before the next.
    fn candidate(&mut self, resident: &dyn Fn(usize) -> bool) -> Option<usize>;

    /// What became of the last candidate.
    fn judge(&mut self, page: usize, verdict: Verdict);

    /// Whether resident `page` may leave with a neighbouring victim (it
    /// is not in the protected part).
    fn clusters(&self, page: usize) -> bool;

    /// Whether `page` is in the protected part.
    fn protected(&self, page: usize) -> bool;

    /// Evictions since `page` last went out.
    fn distance(&self, page: usize) -> usize;

    /// The eviction clock: evictions so far.
    fn clock(&self) -> u32;

    /// Gauges for statistics.
    fn gauges(&self) -> Gauges;

    /// The policy itself (tests and experiments reach its knobs).
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// The eviction clock: evictions so far, and per page the clock when it
/// last went out.
pub struct Clock<C> {
    now: u32,
    at: C,
}

impl<C: Slots<u32>> Clock<C> {
    /// A clock over the pages of `at` (zeroed).
    pub fn new(at: C) -> Self {
        Clock { now: 0, at }
    }

    /// `page` went out now.
    #[inline]
    pub fn tick(&mut self, page: usize) {
        self.now = self.now.wrapping_add(1);
        self.at[page] = self.now;
    }

    /// Evictions since `page` went out.
    #[inline]
    pub fn distance(&self, page: usize) -> usize {
        self.now.wrapping_sub(self.at[page]) as usize
    }

    /// Has `page` gone out (been evicted) since the clock started or it
    /// was [`Clock::forget`]ten? (Its stamp is the clock's at that
    /// eviction, never 0 but at the one eviction in 2^32 that wraps it.)
    #[inline]
    pub fn went_out(&self, page: usize) -> bool {
        self.at[page] != 0
    }

    /// `page` was released: what it holds next is new
    /// ([`Clock::went_out`] is false until it is evicted again).
    #[inline]
    pub fn forget(&mut self, page: usize) {
        self.at[page] = 0;
    }

    /// Evictions so far.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// Moves the clock on by `n` evictions (tests: pages out since long).
    pub fn advance(&mut self, n: u32) {
        self.now = self.now.wrapping_add(n);
    }
}
