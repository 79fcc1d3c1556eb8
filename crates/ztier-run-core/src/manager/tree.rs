//! `--budget-scope tree`: a process's part of the budget every process of
//! the command holds together — the waits for it (`hold_tree`,
//! `wait_tree`, `wait_for_room`, `trim_tree`), the budget that follows it
//! (`follow_tree`, `follow_tree_store`), and a forked child's pages shared
//! with its parent (`adopt_look`, `adopt_unshared`).

use super::*;
/// Pages a forked child counts as shared with its parent, to look up in
/// its page map without the manager's lock ([`Manager::adopt_look`]).
pub struct AdoptLook {
    /// The arena's first page, as a page number.
    pub(super) base: usize,
    /// Words of the shared pages' bits with a bit set, (index, bits), in
    /// ascending runs ([`Shared::look`]).
    pub(super) words: Vec<(usize, u64)>,
    pub(super) pagemap: std::sync::Arc<Pagemap>,
    /// The parent's page map ([`Inherited::parent`]).
    pub(super) parent: std::sync::Arc<Pagemap>,
}

impl AdoptLook {
    /// The pages of the look that are no longer shared with the parent
    /// ([`inherit::not_shared`], which says which those are), from this
    /// process's page map and its parent's, up to [`ADOPT_SPAN`] pages per
    /// `pread`.
    pub fn read(&self) -> Vec<usize> {
        inherit::not_shared(&self.words, self.base, ADOPT_SPAN, &*self.pagemap, &*self.parent)
    }
}

/// With the tree scope, the futex word in the shared segment that this
/// process's background evictor sleeps on (null: its eventfd instead),
/// so that other processes can wake it ([`Member::wake_others`]).
pub static TREE_WAKE: std::sync::atomic::AtomicPtr<std::sync::atomic::AtomicU32> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// With the tree scope, this process's life word in the shared segment
/// (null: none), which the watchdog thread holds for as long as it lives
/// ([`ztier_uffd::tree::hold_life`]).
pub static TREE_LIFE: std::sync::atomic::AtomicPtr<std::sync::atomic::AtomicU32> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Under `--budget-covers all`, least time between two wakes of the
/// other processes' evictors by a fault that found the pool overdrawn
/// ([`Manager::hold_tree`]).
pub const TREE_WAKE_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// With the tree scope, how often the budget a process's protected
/// segment follows may grow (by a 64th; [`Manager::follow_tree`]).
pub const TREE_GROW_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs of 256 arena pages whose tables ([`tables_bytes`]: 64 KiB for
/// 12) a process says ahead of those it uses ([`Manager::tables_due`]).
pub const TABLES_AHEAD: usize = 12;

/// Bytes a process says its store uses beyond what it uses
/// ([`Manager::follow_tree_store`]): the store grows into them between
/// two says.
pub const STORE_AHEAD: usize = 64 << 10;

/// Least time between two looks at which inherited pages are no longer
/// shared ([`Manager::adopt_unshared`]).
pub const ADOPT_EVERY: std::time::Duration = std::time::Duration::from_millis(50);
/// Most inherited pages one look reads the page map of.
pub const ADOPT_LOOK: usize = 1 << 14;
/// Most pages of the page map one `pread` of a look reads.
pub const ADOPT_SPAN: usize = 4096;

impl Manager {
    /// With the tree scope: holds a page of the shared budget for every
    /// resident page (but those shared with its parent) and `n` more.
    /// While the pool has none to give, this process's own oldest pages
    /// go (the others' evictors give back their share of the shortfall:
    /// [`Manager::tree_excess`]) — unless most of its resident pages are
    /// shared with its parent: evicting those gives nothing back, so it
    /// first wakes the others' evictors and waits for them
    /// ([`Manager::wait_tree`]). With nothing of its own left to evict
    /// (none resident, or all in an eviction in flight, pinned or not
    /// evictable, or the store refusing), it waits for them too, and only
    /// then takes the pages past the budget (counted in `over`).
    ///
    /// Under `--budget-covers all`, while the pool is overdrawn (the
    /// stores and tables grew into it), it first gives back what it holds
    /// beyond `n` more than it needs ([`Member::settle`]) and wakes the
    /// others' evictors (at most every [`TREE_WAKE_EVERY`]), so that each
    /// gives back its share.
    pub(super) fn hold_tree(&mut self, n: usize, stats: &Stats) -> io::Result<()> {
        let mut waited = false;
        loop {
            let want = self.tree_need() + n;
            let shared = self.inherited.as_ref().map_or(0, |h| h.pages.count());
            let tables = self.tables_due(n);
            let Some(t) = &mut self.tree else { return Ok(()) };
            // The tables' growth is held for first, and said once held.
            let extra = tables.map_or(0, |(_, pages)| pages);
            if t.settle(want + extra) > 0 {
                let now = std::time::Instant::now();
                if self.tree_woken.is_none_or(|w| now.duration_since(w) >= TREE_WAKE_EVERY) {
                    self.tree_woken = Some(now);
                    t.wake_others();
                }
            }
            if t.ensure(want + extra) {
                if let Some((bytes, _)) = tables {
                    t.publish_tables_keeping(bytes, want);
                }
                return Ok(());
            }
            if !waited && shared > self.resident / 2 {
                waited = true;
                if self.wait_tree(want) {
                    return Ok(());
                }
            }
            let target = self.resident.saturating_sub(EVICT_BATCH);
            if !self.refusing() && self.evict_batch(target, stats)? {
                continue;
            }
            // Nothing of its own can go now.
            let want = self.tree_need() + n;
            let tables = self.tables_due(n);
            let extra = tables.map_or(0, |(_, pages)| pages);
            if !self.wait_tree(want + extra) {
                if let Some(t) = &mut self.tree {
                    self.tree_forced += t.force(want + extra);
                }
                self.forced_notice();
            }
            if let (Some(t), Some((bytes, _))) = (&mut self.tree, tables) {
                t.publish_tables_keeping(bytes, want);
            }
            return Ok(());
        }
    }

    /// With the tree scope, before `n` pages are installed: if the
    /// library's tables ([`tables_bytes`]), with those the run may
    /// begin, take more than this process said, what to say now — the
    /// tables of [`TABLES_AHEAD`] runs of 256 arena pages more, so that
    /// it is said again only after as many — and, under `--budget-covers
    /// all`, the pages of the pool that takes ([`Manager::hold_tree`]
    /// holds them first). The tables grow as pages are first installed
    /// in a run of 256; said only after an eviction, as they were, a
    /// program's first fill took them past the budget uncounted (121 KiB
    /// at 16M).
    pub(super) fn tables_due(&self, n: usize) -> Option<(usize, usize)> {
        // (With a sizing policy the tables are not counted.)
        let t = self.tree.as_ref().filter(|_| self.sizing.is_none())?;
        tables_due_of(t, self.table_chunks_used, n)
    }

    /// With the tree scope, when the pool cannot give this process `want`
    /// pages: wakes the other processes' evictors (each gives back its
    /// share of the shortfall, [`Manager::tree_excess`]) and waits for the
    /// pool, up to `tree_wait` ([`TREE_WAIT`]); whether it holds them now
    /// (when, how long, and when a wait failed: [`treewait::wait`]).
    ///
    /// Under `--budget-covers all` it waits up to [`TREE_WAIT_MOST`] in
    /// all. A forked child whose resident pages are all shared with its
    /// parent has nothing of its own to evict: with the wait cut short
    /// after [`TREE_WAIT`] without a page given back (on a loaded
    /// machine, where the others' evictors wait for a CPU), each of its
    /// faults for the next `20 × TREE_WAIT` took its page past the budget
    /// (`workers.py` at 24M: up to 186 pages, one a fault, with
    /// `--fault-path signal`).
    pub(super) fn wait_tree(&mut self, want: usize) -> bool {
        let Some(t) = &mut self.tree else { return true };
        let mut clock = treewait::RealClock;
        treewait::wait(&mut TreePool(t), &mut clock, want, self.tree_wait, &mut self.tree_wait_failed)
    }

    /// Under `--budget-covers all`: should a fault wait for this
    /// process's eviction in flight instead of being served now? So when
    /// the pool has no page to give, this process holds none beyond its
    /// resident pages, and all of those it could evict are in the
    /// background evictor's batch in flight (the pages it shares with its
    /// parent give nothing back): taking one past the budget would be the
    /// only way. Its commit gives room (the pages go back to the pool),
    /// and it needs the lock the fault's service holds: so the fault is
    /// not served, and the caller waits for the commit after letting go
    /// of the lock ([`Manager::take_room_wait`]). Waiting stops after
    /// [`TREE_WAIT_MOST`] in a row (a batch stuck: the fault is then served
    /// as before, past the budget if need be).
    pub(super) fn wait_for_room(&mut self) -> bool {
        let Some(t) = &self.tree else { return false };
        let own_left = self.evicting() == 0 || self.tree_resident() > self.evicting();
        if !t.covers_all() || own_left || t.free() > 0 || t.held() > self.tree_need() {
            self.room_since = None;
            return false;
        }
        let now = std::time::Instant::now();
        let since = *self.room_since.get_or_insert(now);
        if now.duration_since(since) >= TREE_WAIT_MOST {
            return false;
        }
        self.room_wait = true;
        true
    }

    /// Did the last [`Manager::serve`] leave its fault to wait for this
    /// process's eviction in flight ([`Manager::wait_for_room`])? Clears it.
    pub fn take_room_wait(&mut self) -> bool {
        std::mem::take(&mut self.room_wait)
    }

    /// With the tree scope, after this process took pages past the
    /// budget ([`Member::force`]): once they reach a 64th of the budget
    /// (64 pages at least), says so once. A page or a run now and then
    /// goes past it while the process's own batch is in flight (its
    /// commit gives them back); this many means nothing of the command's
    /// could be evicted for long (pages pinned or locked, the stores
    /// refusing).
    pub(super) fn forced_notice(&mut self) {
        if self.tree_forced < (self.cap / 64).max(64) || self.tree_forced_said {
            return;
        }
        self.tree_forced_said = true;
        (host().notice)(format_args!(
            "ztier: process {}: the command's --budget is taken and none of its pages could be evicted \
             (pinned, locked, or refused by a full store): {} KiB of pages went past it so far",
            std::process::id(),
            self.tree_forced * PAGE / 1024,
        ));
    }

    /// With the tree scope, when the pages no process holds and its own
    /// slack ([`Manager::tree_room`]) are fewer than the reserve: this
    /// process's share of the shortfall, in
    /// proportion to the pages it holds — what its background evictor
    /// gives back.
    pub(super) fn tree_excess(&self) -> usize {
        let Some(t) = &self.tree else { return 0 };
        // Under `--budget-covers all` the pool shrinks as the stores grow:
        // what is held past it is short too.
        budget::excess(self.tree_room(), self.reserve(), t.overdrawn(), t.held(), t.reserved(), self.resident)
    }

    /// With the tree scope, the pages this process can fill without
    /// evicting: those no process holds and, alone in the pool, its own
    /// slack ([`budget::room`]); 0 without it.
    pub(super) fn tree_room(&self) -> usize {
        let Some(t) = &self.tree else { return 0 };
        budget::room(t.free(), t.held(), self.tree_need(), t.reserved(), t.overdrawn())
    }

    /// Gives back to the shared budget what this process holds beyond its
    /// resident pages (and a chunk); under `--budget-covers all`, while
    /// the pool is overdrawn, all it holds beyond them, up to the
    /// overdraft ([`Member::settle`]): pages it evicted then go back to
    /// the pool instead of staying its slack, which its next faults
    /// would install into while the stores grow (a trace of
    /// `workers.py` showed the workers' held pages never moving while
    /// their stores grew from 0 to 6 MB).
    pub(super) fn trim_tree(&mut self) {
        let need = self.tree_need();
        if let Some(t) = &mut self.tree {
            t.settle(need);
            t.trim(need);
        }
    }

    /// With the tree scope, how many of the `lim` pages a fault (or a
    /// pin) may install as one run: those it can hold without going past
    /// the shared budget. It takes them from the pool now if it can (as
    /// [`Member::ensure`] does), or what the pool has of them (held, so
    /// that another process cannot take them before the install), and
    /// counts those it could evict of its own (held, not in an eviction
    /// in flight); at least 1. A longer run would be taken past the
    /// budget by a process with nothing of its own to evict (a forked
    /// child whose pages all went while its siblings hold the pool): 16
    /// children of `sharedkids` at 48M went over in 7 runs of 20, by up
    /// to 68 pages, up to 32 at a time. `lim` without the tree scope.
    pub(super) fn run_room(&mut self, lim: usize) -> usize {
        let (own, need) = (self.tree_resident(), self.tree_need());
        let Some(t) = &mut self.tree else { return lim };
        if t.ensure(need + lim) {
            return lim;
        }
        let held = t.ensure_some(need + lim);
        budget::run_room(held, own, self.evicting(), need, lim)
    }

    /// Resident pages this process must hold a page of the shared budget
    /// for: all but those it shares with its parent.
    pub(super) fn tree_resident(&self) -> usize {
        self.resident - self.inherited.as_ref().map_or(0, |h| h.pages.count())
    }

    /// Pages of the shared budget this process must hold: its resident
    /// pages ([`Manager::tree_resident`]) and, with a sizing policy, its
    /// store's ([`Manager::store_held`]).
    pub(super) fn tree_need(&self) -> usize {
        self.tree_resident() + self.store_held
    }

    /// Page `i` is no longer resident: if it was shared with the parent,
    /// it is not any more (and was not held); whether it was counted so.
    pub(super) fn uninherit(&mut self, i: usize) -> bool {
        self.inherited.as_mut().is_some_and(|h| h.pages.take(i))
    }

    /// In a forked child, before a batch of victims (`pages`, sorted) is
    /// released: those it still counts as shared with its parent, to look
    /// up in its page map as [`Manager::adopt_look`]'s pages are (the
    /// background evictor without the lock), then
    /// [`Manager::victims_own`].
    pub fn victims_look(&self, pages: &[usize]) -> Option<AdoptLook> {
        let h = self.inherited.as_ref()?;
        let mut words: Vec<(usize, u64)> = Vec::new();
        for &i in pages.iter().filter(|&&i| h.pages.has(i)) {
            match words.last_mut() {
                Some((w, bits)) if *w == i / 64 => *bits |= 1 << (i % 64),
                _ => words.push((i / 64, 1 << (i % 64))),
            }
        }
        (!words.is_empty()).then(|| AdoptLook {
            base: self.base / PAGE,
            words,
            pagemap: h.pagemap.clone(),
            parent: h.parent.clone(),
        })
    }

    /// From a look made by [`Manager::victims_look`]: the victims of `own`
    /// are this process's own already (written since the fork, or dropped
    /// by the parent) though still counted as shared, and count as
    /// adopted when they leave memory at the commit. Before, they left
    /// uncounted: a child that wrote all 20 MiB it shared, its evictor
    /// taking the pages faster than the looks (every [`ADOPT_EVERY`])
    /// found them its own, was said to have taken over 13 MiB of them.
    pub fn victims_own(&mut self, own: Vec<usize>) {
        if !own.is_empty() {
            self.left_own.extend(own);
            self.left_own.sort_unstable();
        }
    }

    /// In a forked child with the tree scope, at most every
    /// [`ADOPT_EVERY`] (the background evictor calls it, with the lock
    /// held): up to [`ADOPT_LOOK`] of the pages it still counts as shared
    /// with its parent, to look up in `/proc/self/pagemap` without the
    /// lock ([`AdoptLook::read`]), then [`Manager::adopt_unshared`].
    pub fn adopt_look(&mut self) -> Option<AdoptLook> {
        let h = self.inherited.as_mut()?;
        let words = h.pages.look(std::time::Instant::now(), ADOPT_EVERY, ADOPT_LOOK)?;
        Some(AdoptLook {
            base: self.base / PAGE,
            words,
            pagemap: h.pagemap.clone(),
            parent: h.parent.clone(),
        })
    }

    /// From a look made by [`AdoptLook::read`]: the pages of `gone` still
    /// counted as shared with the parent are this process's own from now
    /// on — mapped here alone (written since by either process, so that
    /// copy-on-write gave one of them a page of its own, or dropped by
    /// the parent) or not mapped — and it holds them (which may evict).
    /// A page that left memory since the look is not counted any more
    /// (its bit went then), and one installed since is its own anyway.
    /// A page map that cannot be read makes every inherited page looked
    /// at count as this process's own.
    pub fn adopt_unshared(&mut self, gone: &[usize], stats: &Stats) -> io::Result<()> {
        // A page in an eviction in flight stays its parent's: it leaves
        // memory at the commit, or is adopted by a later look if it stays
        // (before, a process whose resident pages were all in flight
        // took adopted ones past the budget: 48 pages at once).
        let states = &self.states;
        let in_flight = |i: usize| states.get(i).is_some_and(|&s| s & STATE == EVICTING);
        let Some(h) = &mut self.inherited else { return Ok(()) };
        let adopted = gone.iter().filter(|&&i| !in_flight(i) && h.pages.take(i)).count();
        if h.pages.count() == 0 {
            self.inherited = None;
        }
        // Pages set aside as shared may be its own now.
        if adopted > 0 && !self.set_aside.is_empty() {
            self.requeue_set_aside();
        }
        if adopted > 0 {
            if let Some(t) = &self.tree {
                t.adopt(adopted);
            }
            self.hold_tree(0, stats)?;
        }
        Ok(())
    }

    /// With the tree scope, now: the pages this process holds of the
    /// shared budget, those every process holds together, and its
    /// resident pages still shared with its parent (not held).
    pub fn tree_now(&self) -> Option<(usize, usize, usize)> {
        let t = self.tree.as_ref()?;
        Some((t.held(), t.reserved(), self.inherited.as_ref().map_or(0, |h| h.pages.count())))
    }

    /// With the tree scope and the command's `--store` shared: the size
    /// of this process's store now (its share, [`Manager::follow_tree_store`]).
    pub fn tree_store_budget(&self) -> Option<usize> {
        self.tree.as_ref().filter(|t| t.store_limit() > 0).map(|_| self.store.budget())
    }

    /// Points [`TREE_WAKE`] and [`TREE_LIFE`] at this process's words (or at nothing).
    pub(super) fn publish_wake_word(&self) {
        let w = self.tree.as_ref().map_or(std::ptr::null_mut(), |t| t.wake_word() as *const _ as *mut _);
        TREE_WAKE.store(w, Ordering::Release);
        let l = self.tree.as_ref().map_or(std::ptr::null_mut(), |t| t.life_word() as *const _ as *mut _);
        TREE_LIFE.store(l, Ordering::Release);
    }

    /// At exit: the pages this process holds go back to the shared budget.
    pub fn leave_tree(&mut self) {
        if let Some(t) = &mut self.tree {
            t.leave();
        }
        self.tree = None;
        self.publish_wake_word();
    }

    /// With the tree scope: says that this process's store uses `used`
    /// bytes (besides the `inherited` a forked child's store began with,
    /// shared with its parent's), and sizes the store to its share of the
    /// command's `--store` ([`Member::store_share`]) when that moved by a
    /// 32nd of the limit (256 KiB at least), or at once when it shrank
    /// to near what the store uses: resizing down moves the
    /// oldest pages to the spill file, or, without one, makes the store
    /// refuse pages until the faults take some out.
    ///
    /// Under `--budget-covers all` with a next tier, the store first lets
    /// go of its oldest pages (to the spill file) as far as it outgrew
    /// the room the pages held, the other stores and the tables leave
    /// ([`Member::store_room`]), so that what all hold stays within
    /// the budget whatever this process can give back.
    pub(super) fn follow_tree_store(&mut self, mut used: usize, inherited: usize) {
        // (A sizing policy sizes the store itself: `set_share`.)
        let need = self.tree_need();
        let Some(t) = self.tree.as_mut().filter(|_| self.sizing.is_none()) else { return };
        let limit = t.store_limit();
        if limit == 0 {
            return;
        }
        // The tables first, which `--budget-covers all` counts (KiB): said
        // before faults install pages ([`Manager::hold_tree`]), so here
        // only if they grew some other way (a forked child's, its
        // parent's until then) and the pool has the pages for them now;
        // if not, its next fault holds for them first.
        if let Some((bytes, pages)) = tables_due_of(t, self.table_chunks_used, 0) {
            if t.ensure(need + pages) {
                t.publish_tables_keeping(bytes, need);
            }
        }
        let room = if self.store.has_tier() { t.store_room(need) } else { None };
        let spill = room.map_or(0, |r| used.saturating_sub(r));
        if spill > 0 {
            self.store.set_budget(used - spill + inherited);
            used = self.store.memory_used().saturating_sub(inherited);
            // Back to its share at the next call, if that is a step away.
            self.store_share = used;
        }
        // Under `--budget-covers all` with a next tier, said
        // [`STORE_AHEAD`] ahead of what it uses (in the room the others
        // leave), when it outgrew what it said or shrank well below it:
        // between two says it grows into what it said, which the budget
        // counted already. Otherwise (nothing could leave it anyway) said
        // when it moved by as much. (A cache line the processes share,
        // written once a batch at most.)
        let said = t.stored();
        match room {
            Some(r) if used > said || said > used + 2 * STORE_AHEAD || used == 0 => {
                let say = if used == 0 { 0 } else { (used + STORE_AHEAD).min(r.max(used)) };
                t.publish_store_keeping(say, need);
            }
            None if used.abs_diff(said) >= STORE_AHEAD || used == 0 => t.publish_store_keeping(used, need),
            _ => {}
        }
        let Some(share) = t.store_share() else { return };
        // Followed when it moved by a 32nd of the limit, and at once when
        // it shrank to near what the store uses: the others may be
        // growing into what it gave up (the stores of `workers.py 100000
        // 3` at `--store 6M` used 5.99–6.33 MB together at most, against
        // a limit of 6.29 MB, and 5.84–6.05 MB with this).
        let step = (limit / 32).max(256 << 10);
        let near = share < used + step;
        if self.store_share != usize::MAX
            && share.abs_diff(self.store_share) < step
            && !(share < self.store_share && near)
        {
            return;
        }
        self.store_share = share;
        self.store.set_budget(share + inherited);
    }

    /// Resident pages kept free below the budget by the background evictor.
    pub(super) fn reserve(&self) -> usize {
        reserve_of(self.limit())
    }

    /// The most pages this process may have resident: the budget; with
    /// the tree scope, all of it (the shared budget bounds it first) —
    /// but with a sizing policy, what its split leaves resident pages of
    /// the process's part.
    pub(super) fn limit(&self) -> usize {
        if self.tree.is_some() && self.sizing.is_none() {
            self.cap
        } else {
            self.budget
        }
    }

    /// With the tree scope, the budget the protected segment and the
    /// other sizes follow ([`Manager::budget`]) is what this process can
    /// have now: the pages it holds and those no process holds. It
    /// shrinks at once but grows by at most a 64th (or a batch) every
    /// [`TREE_GROW_EVERY`]: processes that share the budget trade pages
    /// back and forth, and a protected segment that grew with each
    /// passing surplus then had to shed it as the others took their
    /// pages back. Those pages, faulted back into the protected segment,
    /// had no copy in the store (only probation's keep theirs), so each
    /// was compressed again, and most came back (three `workers.py`
    /// workers at 48M demoted 45 k pages each, 44 k of them regretted,
    /// against 10 k with a budget of 16M each). Held to what the process
    /// has kept for a while, its protected segment stays, and a passing
    /// surplus goes to probation.
    pub(super) fn follow_tree(&mut self) {
        let Some(t) = &self.tree else { return };
        let shared = self.inherited.as_ref().map_or(0, |h| h.pages.count());
        let target = budget::share_target(t.held(), t.free(), shared, self.cap, EVICT_BATCH);
        let b = match budget::follow(self.share, target, EVICT_BATCH) {
            Follow::Stay => return,
            Follow::Shrink(b) => b,
            Follow::Grow(b) => {
                let now = std::time::Instant::now();
                if now.duration_since(self.tree_grown) < TREE_GROW_EVERY {
                    return;
                }
                self.tree_grown = now;
                b
            }
        };
        self.set_share(b, false);
    }
}

/// [`Manager::tables_due`] of member `t` with tables for `used` runs
/// of 256 pages, before `n` pages are installed.
fn tables_due_of(t: &Member, used: usize, n: usize) -> Option<(usize, usize)> {
    let said = (t.tables_kib() as usize) << 10;
    let chunks = used + n.div_ceil(256) + usize::from(n > 0);
    if tables_bytes(chunks) <= said {
        return None;
    }
    let bytes = tables_bytes(chunks + TABLES_AHEAD);
    let pages = if t.covers_all() { (bytes - said).div_ceil(PAGE) + 1 } else { 0 };
    Some((bytes, pages))
}

/// This process's member of the tree budget, as a wait for it sees it
/// ([`treewait::wait`]).
pub(super) struct TreePool<'a>(&'a mut Member);

impl treewait::Pool for TreePool<'_> {
    fn covers_all(&self) -> bool {
        self.0.covers_all()
    }
    fn reserved(&self) -> usize {
        self.0.reserved()
    }
    fn held(&self) -> usize {
        self.0.held()
    }
    fn charged(&self) -> usize {
        self.0.charged()
    }
    fn ensure(&mut self, want: usize) -> bool {
        self.0.ensure(want)
    }
    fn wake_others(&self) {
        self.0.wake_others()
    }
}
