//! Eviction: making room inline on a fault, the background evictor's
//! batches ([`Victims`]: picked and committed under the lock, protected,
//! compressed and released outside it), the eviction handshake's calls,
//! write faults and releases.

use super::*;
impl Manager {
    /// Pages picked by evictions that have not committed yet.
    pub fn evicting(&self) -> usize {
        self.handshake.evicting()
    }

    /// Is any page of `[first, first + n)` OWNED by an eviction in flight?
    pub fn owned_in(&self, first: usize, n: usize) -> bool {
        (first..(first + n).min(self.pages)).any(|i| self.st(i) & OWNED != 0)
    }

    /// Over budget?
    pub fn over_budget(&self) -> bool {
        self.resident > self.limit()
    }

    /// How many of a fault's run of `lim` pages (the page and those the
    /// prefetch brings along) it installs: those that fit under the
    /// budget now, or [`INLINE_RUN`] (at least 1). The fault evicts for
    /// its run ([`Manager::make_room`]) and waits for that: with no room
    /// a store run of 64 pages cost it ~600 µs of evictions. The pages
    /// left out were the prefetch's guess; the next fault brings them.
    pub(super) fn inline_room(&self, lim: usize) -> usize {
        lim.min(self.limit().saturating_sub(self.resident).max(INLINE_RUN)).max(1)
    }

    /// Evicts first if installing `n` more pages would go over budget, so
    /// the resident count never exceeds it — unless the store is full
    /// ([`Manager::refusing`]): then the pages stay resident over it.
    pub(super) fn make_room(&mut self, n: usize, stats: &Stats) -> io::Result<()> {
        let before = stats.evicted_inline.load(Ordering::Relaxed);
        let r = self.make_room_now(n, stats);
        if stats.evicted_inline.load(Ordering::Relaxed) != before {
            stats.inline_evictions.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// [`Manager::make_room`]'s work. The fault waits for this eviction,
    /// so it takes only what the fault needs and [`INLINE_LEAST`] at
    /// least, not a batch below the budget: the background evictor
    /// (woken after the fault) makes the rest of the room. An inline
    /// batch of [`EVICT_BATCH`] cost the fault ~300 µs (~9 µs a page:
    /// write protection, compression, the store's push to its next tier,
    /// the release), a 99th percentile of their own.
    pub(super) fn make_room_now(&mut self, n: usize, stats: &Stats) -> io::Result<()> {
        let limit = self.limit();
        if self.resident + n > limit && !self.refusing() {
            let target = limit.saturating_sub(n).min(self.resident.saturating_sub(INLINE_LEAST));
            while !self.refusing() && self.resident > target && self.evict_batch(target, stats)? {}
        }
        self.hold_tree(n, stats)
    }

    /// Evicts the oldest resident pages until the resident count is a
    /// batch below the budget (or nothing more can go); with the tree
    /// scope, then until the pool covers every resident page.
    pub fn evict(&mut self, stats: &Stats) -> io::Result<()> {
        let target = self.limit().saturating_sub(EVICT_BATCH);
        // The same steps as the background evictor, with the lock held
        // throughout (this is the handler making room right now). A
        // refusal by the store stops it (`commit` notes it).
        while !self.refusing() && self.evict_batch(target, stats)? {}
        self.hold_tree(0, stats)
    }

    /// One batch of [`Manager::evict`] towards `target` resident pages;
    /// `false` if no victim could be taken.
    pub(super) fn evict_batch(&mut self, target: usize, stats: &Stats) -> io::Result<bool> {
        let _all = Timed::start(&stats.evict_ns);
        let v = {
            let _t = Timed::start(&stats.evict_take_ns);
            self.take_victims(EVICT_BATCH, target, 0)?
        };
        let Some(v) = v else { return Ok(false) };
        PROGRESS.fetch_add(1, Ordering::Relaxed);
        stats.evicted_inline.fetch_add(v.pages.len() as u64, Ordering::Relaxed);
        {
            let _t = Timed::start(&stats.evict_protect_ns);
            v.protect(stats)?;
        }
        let outcome = {
            let _t = Timed::start(&stats.evict_compress_ns);
            let mut tier = 0;
            let o = v.compress_timed(stats, &mut tier);
            stats.evict_tier_ns.fetch_add(tier, Ordering::Relaxed);
            o?
        };
        // Victims already its own count as adopted when they leave.
        if let Some(look) = self.victims_look(&v.pages) {
            let own = look.read();
            self.victims_own(own);
        }
        {
            let _t = Timed::start(&stats.evict_release_ns);
            v.release(&outcome)?;
        }
        v.unprotect_kept(&outcome)?;
        self.commit(&v, &outcome, stats);
        v.wake_released(&outcome)?;
        Ok(true)
    }

    /// Is the store refusing victims? After a refusal (the store is full,
    /// and without a next tier, or with one that cannot take more — a
    /// spill file at `--spill-max` or on a full device — nothing can
    /// leave it) every eviction would compress its victims only to have
    /// them refused: on the program's CPU under the manager's lock for
    /// each fault over budget, and in the background evictor without end
    /// (a run of `pyapp.py 100000` at `--budget 8M --store 4M` took 2.6×
    /// as long as with room, one with a full spill device 7×). So for
    /// [`REFUSED_PAUSE`] after one none is tried, or until the faults
    /// have taken a batch of pages out of the store (room for a batch,
    /// about), and faults install their pages over the budget meanwhile.
    pub fn refusing(&self) -> bool {
        self.refusing.is_some_and(|(until, out)| {
            self.taken_out - out < EVICT_BATCH as u64 && std::time::Instant::now() < until
        })
    }

    /// The store refused a victim: no evictions for a while
    /// ([`Manager::refusing`]), and the first time, the reason in the log.
    pub(super) fn store_refused(&mut self) {
        self.refusing = Some((std::time::Instant::now() + REFUSED_PAUSE, self.taken_out));
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if SAID.swap(true, Ordering::Relaxed) {
            return;
        }
        let next = match (self.cfg.spill_dir.is_some(), self.store.tier_error()) {
            (_, Some(why)) => why,
            (false, None) => "there is no --spill folder".to_string(),
            (true, None) => "the spill file cannot take more".to_string(),
        };
        let size = match self.tree.as_ref().map(Member::store_limit).filter(|&l| l > 0) {
            Some(limit) => format!(
                "its share, {} MiB, of the {} MiB of --store the command's processes share",
                self.store.budget() >> 20,
                limit >> 20
            ),
            None => format!("{} MiB", self.store.budget() >> 20),
        };
        (host().notice)(format_args!(
            "ztier: process {}: the compressed store is full ({size}) and {next}: pages over \
             --budget stay in memory uncompressed until the store has room",
            std::process::id(),
        ));
    }

    /// Records the store's size if it is the largest seen (for the
    /// `orig_bytes`/`stored_bytes` statistics), less what a forked child
    /// inherited ([`Manager::inherit_store`]).
    pub(super) fn sample_store(&mut self, stats: &Stats) {
        let st = self.store.stats();
        if let Some(s) = &mut self.sizing {
            if let Some(mean) = st.compressed_bytes.checked_div(st.pages) {
                s.compressed(mean);
            }
        }
        let inherited = stats.store_inherited.0.load(Ordering::Relaxed);
        let used = st.memory_used.saturating_sub(inherited);
        if self.sizing.is_some() && self.tree.is_some() {
            self.store_held = (used as usize).div_ceil(PAGE);
        }
        self.follow_tree_store(used as usize, inherited as usize);
        if used >= stats.peak_store_bytes.load(Ordering::Relaxed) {
            let orig = st.orig_bytes + st.tier_entries * PAGE as u64;
            stats.peak_store_bytes.store(used, Ordering::Relaxed);
            stats.peak_store_orig.store(
                orig.saturating_sub(stats.store_inherited.1.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
        }
    }

    /// Should the background evictor work (resident above budget −
    /// reserve/2, or with the tree scope, less than half a reserve of
    /// room: pages held by no process and its own slack; and eviction neither refused by the store
    /// nor [`Manager::frozen`])?
    pub fn evict_wanted(&self) -> bool {
        let tree_short = self.tree.is_some() && self.tree_room() < self.reserve() / 2 && self.resident > 0;
        (self.resident > self.limit() - self.reserve() / 2 || tree_short)
            && !self.refusing()
            && !self.frozen()
    }

    /// No page may be evicted now: `mlockall` is in force, or a hold
    /// ([`Manager::hold`]). (Before `frozen` counted in
    /// [`Manager::evict_wanted`], a program over its budget after
    /// `mlockall` had the evictor spin a CPU: it was woken for victims it
    /// could not take.)
    pub fn frozen(&self) -> bool {
        self.pins.frozen()
    }

    /// Takes up to `max` victims for the background evictor, oldest first,
    /// and marks them EVICTING; `None` when the resident count, less the
    /// pages already being evicted, is at or below budget − reserve, or
    /// less than [`BACKGROUND_LEAST`] above it while eviction is not
    /// wanted yet ([`Manager::evict_wanted`]).
    pub fn take_background_victims(&mut self, max: usize) -> io::Result<Option<Victims>> {
        // Short of pages: those of processes that are gone come back first.
        let reserve = self.reserve();
        if let Some(t) = self.tree.as_mut().filter(|t| t.free() < reserve) {
            // No /proc reads: this runs beside the program, whose next
            // `open` would get a higher descriptor than the lowest free
            // one meanwhile.
            t.reclaim_due(ztier_uffd::tree::Look::Signal);
        }
        self.follow_tree();
        let target = (self.limit() - self.reserve()).min(self.resident - self.tree_excess());
        let least = BACKGROUND_LEAST.min(self.reserve() / 2);
        if self.refusing() || (!self.evict_wanted() && self.resident < target + self.evicting() + least) {
            return Ok(None);
        }
        let v = self.take_victims(max, target, self.evicting())?;
        if v.is_some() {
            self.handshake.opened();
        }
        Ok(v)
    }

    /// A write hit page `i`, a victim of the background evictor's batch in
    /// flight (write-protected, present: `present` says so for a fault
    /// that does not tell a write from a missing page). While the batch
    /// is not sealed ([`Manager::seal_background`]) nothing of it has been
    /// released, so the page can go back to the program at once instead
    /// of the writer waiting for the commit (compressing and releasing
    /// the batch: see the module docs): it becomes RESIDENT again (at the
    /// back of probation from its commit on), its stored copy (if it had
    /// one) dropped, its write protection
    /// removed (one call; on this kernel removing a protection sends a
    /// TLB shootdown as making one does, `scripts/wp-cost.c`). It stays OWNED
    /// until the commit, so nothing releases or evicts it while the
    /// evictor may still be reading it, and the evictor neither releases
    /// it nor keeps what it made of it. Returns whether it was taken back.
    pub fn take_back(&mut self, i: usize, present: bool, stats: &Stats) -> io::Result<bool> {
        let back = self.with_handshake(|h, m| h.take_back(m, i, present))?;
        if back {
            stats.taken_back.fetch_add(1, Ordering::Relaxed);
        }
        Ok(back)
    }

    /// The background batch in flight is write-protected, all of it: its
    /// victims may be taken back from now on (the thread that made the
    /// protections calls this at once). Not before: a fault can reach
    /// [`Manager::take_back`] late — one taken on a page while it was
    /// out of memory or a victim of an earlier batch, its service delayed
    /// (waiting for the lock) until the page was back in memory and
    /// chosen again, say as a neighbour of another victim, by this batch
    /// — and the protection job still to come would then protect a page
    /// already taken back. The commit only wakes the waiters of a
    /// page it counted as released, so that page would stay RESIDENT
    /// and write-protected, every write to it faulting (with
    /// `--fault-path signal`, for ever: `sort` under `cli_run` spun so
    /// once).
    pub fn background_protected(&mut self) {
        self.handshake.protected();
    }

    /// Ends taking back victims of the background batch in flight, before
    /// the evictor releases it: returns those taken back (the evictor
    /// must not release them; [`Manager::commit_background`] drops what
    /// it stored of them). `pages` are the batch's victims (sorted) and
    /// `outcome` what the evictor made of each: from here on a fault on
    /// one it has released can be served at once
    /// ([`Manager::commit_early`]).
    pub fn seal_background(&mut self, pages: &[usize], outcome: &[Outcome]) -> Vec<usize> {
        self.handshake.seal(pages, outcome)
    }

    /// A fault on page `i`, a victim of the sealed background batch in
    /// flight whose release has returned: the evictor has released it
    /// (unless it was taken back or refused), and what it
    /// made of it (the compressed copy, or nothing for a page of zeros)
    /// is in the store already. Commits that page alone, now, as
    /// [`Manager::commit_background`] would, so that the fault is served
    /// from the store at once instead of waiting for the rest of the
    /// batch to be released and committed (up to [`BACKGROUND_BATCH`]
    /// pages, ~1 ms). Returns whether it did; the batch's commit then
    /// skips the page.
    ///
    /// Only once the evictor's release has returned
    /// ([`Manager::background_released`]), not as soon as the page is out
    /// of memory: `MADV_DONTNEED` clears a page's entry at once but
    /// flushes the other CPUs' TLBs at its end (for the whole batch, when
    /// `process_madvise` batches it). A page installed in between could
    /// be written by a thread on one CPU and then read, by the same
    /// thread moved to another CPU, through that CPU's stale entry for
    /// the old page: the write seems lost. (`sort` under `cli_run` at
    /// 16M printed a NUL for one newline, one run in about a hundred:
    /// `sort` writes the newline into its line, then copies the line
    /// out.) Before the release returns, such a fault waits for the
    /// commit, as a fault on a victim still in memory always does (a
    /// write, or one raised before the page came back and was chosen).
    /// Only the evictor's release takes a sealed victim out of memory
    /// (the program's own releases wait for OWNED pages,
    /// `lock_unowned`), and a released page is not released again.
    pub fn commit_early(&mut self, i: usize, stats: &Stats) -> bool {
        if !self.with_handshake(|h, m| h.commit_early(m, i)) {
            return false;
        }
        stats.committed_early.fetch_add(1, Ordering::Relaxed);
        stats.resident.store(self.resident, Ordering::Relaxed);
        true
    }

    /// The evictor's release of the sealed background batch has returned
    /// (every TLB flushed): its released victims may be committed early
    /// from now on ([`Manager::commit_early`]).
    pub fn background_released(&mut self) {
        self.handshake.released();
    }

    /// Takes up to `max` victims, oldest first, while the resident count
    /// is above `target` + `in_flight` + those taken; marks them EVICTING
    /// and OWNED. [`Victims::compress`] write-protects them first. Which
    /// pages: the policy's loop ([`ztier_policy::pick`]) over the
    /// manager's verdicts ([`Live`]).
    pub(super) fn take_victims(
        &mut self,
        max: usize,
        target: usize,
        in_flight: usize,
    ) -> io::Result<Option<Victims>> {
        if self.frozen() {
            return Ok(None);
        }
        // Under `--budget-covers all`, while the pool is overdrawn, a
        // forked child leaves the pages it shares with its parent: they
        // stay in memory (its parent's) and their compressed copy would
        // only add to what the command holds.
        let overdrawn = self.tree.as_ref().is_some_and(|t| t.covers_all() && t.overdrawn() > 0);
        if !overdrawn {
            self.requeue_set_aside();
        }
        // (The picked victims stay counted resident until the commit.)
        let want = max.min(self.resident.saturating_sub(target + in_flight));
        let mut pages = Vec::with_capacity(max);
        let mut live = Live {
            states: &mut self.states,
            pins: &self.pins,
            shared: self.inherited.as_ref().filter(|_| overdrawn).map(|h| &h.pages),
            set_aside: &mut self.set_aside,
        };
        pick(&mut *self.repl, &mut live, want, &mut pages);
        if pages.is_empty() {
            return Ok(None);
        }
        self.handshake.picked(pages.len());
        pages.sort_unstable();
        let clean: Vec<bool> = pages.iter().map(|&i| self.st(i) & CLEAN != 0).collect();
        // Clean pages in write-protect mode are write-protected already.
        let verify = self.clean == CleanMode::Verify;
        let dirty = pages.iter().zip(&clean).filter(|(_, &c)| !c || verify).map(|(&i, _)| i);
        Ok(Some(Victims {
            protect: runs_of(dirty),
            clean,
            mode: self.clean,
            hashes: self.hashes.clone(),
            pages,
            uffd: self.uffd.clone(),
            store: self.store.clone(),
            pool: self.pool,
            base: self.base,
            waiters: std::sync::Mutex::new(Vec::new()),
            wakes: AtomicUsize::new(0),
            mincores: AtomicUsize::new(0),
        }))
    }

    /// Puts the pages set aside while the pool was overdrawn (a forked
    /// child's pages shared with its parent, [`Manager::take_victims`])
    /// back in line for eviction, those still resident and evictable.
    pub(super) fn requeue_set_aside(&mut self) {
        victims::requeue_set_aside(&mut self.set_aside, &self.states, &self.pins, &mut *self.repl);
    }

    /// Finishes an eviction whose memory [`Victims::release`] gave back:
    /// pages still EVICTING become STORED (or ABSENT); pages released
    /// meanwhile by the program get their stored copy dropped; refused
    /// pages stay (unprotected before, [`Victims::unprotect_kept`]), and
    /// a refusal pauses evictions ([`Manager::refusing`]). No victim is
    /// OWNED afterwards; the caller then wakes the others
    /// ([`Victims::wake_released`]).
    pub fn commit(&mut self, v: &Victims, outcome: &[Outcome], stats: &Stats) {
        self.commit_as(v, outcome, false, stats);
    }

    /// [`Manager::commit`] for the background evictor's batch, sealed
    /// with [`Manager::seal_background`]: its victims committed early
    /// ([`Manager::commit_early`]) are done already.
    pub fn commit_background(&mut self, v: &Victims, outcome: &[Outcome], stats: &Stats) {
        self.commit_as(v, outcome, true, stats);
    }

    /// [`Manager::commit`], of the sealed background batch if `background`
    /// ([`Handshake::commit`]).
    pub(super) fn commit_as(&mut self, v: &Victims, outcome: &[Outcome], background: bool, stats: &Stats) {
        self.with_handshake(|h, m| h.commit(m, &v.pages, outcome, background));
        if !self.left_own.is_empty() {
            self.left_own.retain(|i| v.pages.binary_search(i).is_err());
        }
        if !self.waiters.is_empty() {
            let mut w = lock_waiters(v);
            self.waiters.retain(|&i| {
                let mine = v.pages.binary_search(&i).is_ok();
                if mine {
                    w.push(i);
                }
                !mine
            });
            w.sort_unstable();
            w.dedup();
        }
        stats.resident.store(self.resident, Ordering::Relaxed);
        let g = self.repl.gauges();
        stats.demoted.store(g.demoted, Ordering::Relaxed);
        stats.age_every.store(g.age_every, Ordering::Relaxed);
        stats.hot_distance.store(g.hot_distance, Ordering::Relaxed);
        // The store's growth is said first: under `--budget-covers all`
        // the pages this batch evicted then go back to the pool at once
        // while it is overdrawn (`trim_tree`), in the same commit.
        self.sample_store(stats);
        self.trim_tree();
        self.follow_tree();
        if outcome.contains(&Outcome::Kept) {
            self.store_refused();
        }
    }

    /// A write hit a write-protected page at `addr`. A clean page becomes
    /// an ordinary one (its stored copy dropped, the protection removed,
    /// the writer woken); a page being evicted stays protected (the
    /// evictor wakes the writer when it is done); anything else is
    /// unprotected and woken.
    pub fn write_fault(&mut self, addr: usize, stats: &Stats) -> io::Result<()> {
        let t0 = self.log_clock();
        let r = self.write_fault_at(addr, stats);
        self.log_row(t0, Kind::Wp, (addr - self.base) / PAGE, 0, None, false);
        r
    }

    pub(super) fn write_fault_at(&mut self, addr: usize, stats: &Stats) -> io::Result<()> {
        let i = (addr - self.base) / PAGE;
        let s = self.st(i);
        if s & STATE == EVICTING {
            // Taken back if its batch is not sealed yet (that also wakes
            // the writer), else the evictor wakes it after the commit.
            if !self.take_back(i, true, stats)? {
                self.waiters.push(i);
            }
            return Ok(());
        }
        if s & STATE == RESIDENT && s & CLEAN != 0 {
            let _ = self.store.flush_page(self.key(i));
            self.set(i, state::written(s));
            stats.dirtied.fetch_add(1, Ordering::Relaxed);
        }
        let page = self.addr(i);
        if s & STATE == RESIDENT {
            // It wakes the writer.
            self.uffd.writeprotect(page, PAGE, false)
        } else {
            self.uffd.wake(page, PAGE)
        }
    }

    /// Releases `[first, first + n)`: memory returned to the kernel,
    /// compressed copies dropped; the pages read as zeros afterwards.
    pub fn release(&mut self, first: usize, n: usize, stats: &Stats) {
        // Kept pins there end: the memory is no longer what was registered.
        for e in self.pins.take_kept(|e| e.first < first + n && first < e.end) {
            self.unpin(e.first, e.end - e.first);
        }
        for i in first..first + n {
            let s = self.st(i);
            let was_resident = matches!(s & STATE, RESIDENT | EVICTING);
            self.repl.released(i, was_resident);
            match s & STATE {
                RESIDENT | EVICTING => {
                    self.resident -= 1;
                    self.uninherit(i);
                    if s & CLEAN != 0 {
                        let _ = self.store.flush_page(self.key(i));
                    }
                }
                STORED => {
                    let _ = self.store.flush_page(self.key(i));
                }
                _ => {}
            }
            // The protection stays what it was: MADV_DONTNEED on an
            // unreadable page (a guard page V8 gives back) must not make
            // it a candidate for the zero runs that fault in neighbours.
            // An OWNED page stays so until its eviction commits.
            self.set(i, state::released(s));
        }
        sys::madvise(self.addr(first) as *mut libc::c_void, n * PAGE, libc::MADV_DONTNEED);
        stats.resident.store(self.resident, Ordering::Relaxed);
        self.trim_tree();
    }
}

/// A batch of pages the background evictor works on outside the lock.
pub struct Victims {
    /// Page indices, sorted.
    pub pages: Vec<usize>,
    /// Runs (first page, pages) to write-protect before reading them:
    /// every victim but the clean ones of `--clean wp` (protected since
    /// they came back).
    pub(super) protect: Vec<(usize, usize)>,
    /// Per page: CLEAN (it came from the store, which kept its copy).
    pub(super) clean: Vec<bool>,
    pub(super) mode: CleanMode,
    /// The manager's per-page hashes of stored copies: the victims' are
    /// this batch's to read and write.
    pub(super) hashes: Arc<Table<CopyHash>>,
    pub(super) uffd: Arc<Uffd>,
    pub(super) store: Arc<Store>,
    pub(super) pool: u32,
    pub(super) base: usize,
    /// The victims whose faults wait for the commit, handed over by it
    /// (sorted): [`Victims::wake_released`] wakes only those.
    pub(super) waiters: std::sync::Mutex<Vec<usize>>,
    /// `UFFDIO_WAKE` calls [`Victims::wake_released`] made.
    pub(super) wakes: AtomicUsize,
    /// `mincore` calls [`Victims::compress`] made.
    pub(super) mincores: AtomicUsize,
}

/// The waiters handed to `v` ([`Manager::commit`]); a poisoned lock
/// still holds them.
fn lock_waiters(v: &Victims) -> std::sync::MutexGuard<'_, Vec<usize>> {
    v.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs of victims less than this many pages apart are looked up by one
/// `mincore` ([`Victims::compress`]).
const MINCORE_GAP: usize = 256;

/// Per page of `[addr, addr + n pages)`: in memory (bit 0), by the
/// kernel's `mincore`, not the library's export (which fails on free
/// pages, and victims may be free).
fn in_memory(addr: usize, n: usize) -> io::Result<Vec<u8>> {
    let mut inmem = vec![0u8; n];
    let r =
        (host().raw)(libc::SYS_mincore, [addr as u64, (n * PAGE) as u64, inmem.as_mut_ptr() as u64, 0, 0, 0]);
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r as i32));
    }
    Ok(inmem)
}

/// Contiguous runs of ascending page indices: (first page, pages).
pub(super) fn runs_of(pages: impl IntoIterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for i in pages {
        match runs.last_mut() {
            Some((f, n)) if *f + *n == i => *n += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

impl Victims {
    /// Contiguous runs of the victims.
    pub(super) fn runs(&self) -> Vec<(usize, usize)> {
        runs_of(self.pages.iter().copied())
    }

    /// Write-protects the victims, a call per run: a thread that writes
    /// one from now on waits on a write-protect fault until the eviction
    /// commits ([`Manager::write_fault`] leaves EVICTING pages alone).
    /// The background evictor's batches are protected without the
    /// manager's lock, by the next fault service on the program's CPU
    /// (the crate root's `near`): from another CPU each call is a TLB
    /// shootdown there, and under the lock faults waited behind a batch
    /// of them (the lock wait's long tail). Nothing can change a victim's
    /// mapping meanwhile: it is OWNED, so releases, protection changes
    /// and pins wait for the commit, and faults on it are not served.
    pub fn protect(&self, stats: &Stats) -> io::Result<()> {
        for &(f, n) in &self.protect {
            let addr = self.base + f * PAGE;
            stats.wp_calls.fetch_add(1, Ordering::Relaxed);
            self.uffd.writeprotect(addr, n * PAGE, true).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("write-protecting {addr:#x}+{:#x} to evict it: {e}", n * PAGE),
                )
            })?;
        }
        Ok(())
    }

    /// Write-protects the victims ([`Victims::protect`]), then reads and
    /// compresses them (no lock held: the handler keeps serving faults
    /// meanwhile). A writer that touches a victim now waits until
    /// [`Victims::unprotect_kept`] (a page the store refused) or
    /// [`Victims::wake_released`].
    pub fn compress(&self, stats: &Stats) -> io::Result<Vec<Outcome>> {
        self.protect(stats)?;
        self.compress_protected(stats)
    }

    /// [`Victims::compress`] after the victims were write-protected.
    pub fn compress_protected(&self, stats: &Stats) -> io::Result<Vec<Outcome>> {
        self.compress_timed(stats, &mut 0)
    }

    /// [`Victims::compress_protected`], adding to `tier` the nanoseconds
    /// the store spent on its next tier.
    pub(super) fn compress_timed(&self, stats: &Stats, tier: &mut u64) -> io::Result<Vec<Outcome>> {
        let runs = self.runs();
        let mut out = Vec::with_capacity(self.pages.len());
        let mut at = 0;
        let inmem = self.in_memory()?;
        for &(f, n) in &runs {
            let addr = self.base + f * PAGE;
            for (k, &present) in inmem[at..at + n].iter().enumerate() {
                let clean = self.clean[at];
                at += 1;
                if present & 1 == 0 {
                    out.push(Outcome::Gone);
                    continue;
                }
                if clean && self.mode == CleanMode::Wp {
                    // Write-protected since it came back: the store holds
                    // this very content.
                    stats.clean_evicted.fetch_add(1, Ordering::Relaxed);
                    out.push(Outcome::Stored);
                    continue;
                }
                // SAFETY: the page is present and OWNED by this eviction,
                // so nothing releases it meanwhile: it can be read without
                // faulting. It is write-protected, so it cannot change,
                // unless a write takes it back (`Manager::take_back`),
                // and then what is made of it here is dropped at the
                // commit and it is not released.
                let page = unsafe { std::slice::from_raw_parts((addr + k * PAGE) as *const u8, PAGE) };
                if is_zero(page) {
                    stats.evicted_zero.fetch_add(1, Ordering::Relaxed);
                    out.push(Outcome::Zero);
                    continue;
                }
                let key = Key { pool: self.pool, object: 0, index: (f + k) as u32 };
                let verify = self.mode == CleanMode::Verify;
                let hash = if verify { xxh3_128(page) } else { 0 };
                // The victim is OWNED by this eviction, so no other
                // thread reads or writes its hash meanwhile.
                let slot = &self.hashes[f + k];
                if clean {
                    // Verify mode: unchanged since it came back if its hash
                    // is the stored copy's (and the copy is still there, in
                    // the store or gone on to its next tier: a get that
                    // keeps the copy leaves a tier's where it is).
                    if slot.get() == hash && self.store.holds(key) {
                        stats.clean_evicted.fetch_add(1, Ordering::Relaxed);
                        out.push(Outcome::Stored);
                        continue;
                    }
                    stats.dirtied.fetch_add(1, Ordering::Relaxed);
                }
                let (put, tier_ns) = self.store.put_timed(key, page, PutFlags::default());
                *tier += tier_ns;
                match put {
                    Ok(()) => {
                        if verify {
                            slot.set(hash);
                        }
                        stats.pages_compressed.fetch_add(1, Ordering::Relaxed);
                        out.push(Outcome::Stored);
                    }
                    Err(StoreError::Refused(_)) => {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        out.push(Outcome::Kept);
                    }
                    Err(e) => return Err(store_err(e)),
                }
            }
        }
        Ok(out)
    }

    /// Which victims are in memory (bit 0 of each byte, in the order of
    /// the victims). One `mincore` covers each cluster of runs of victims
    /// less than [`MINCORE_GAP`] pages apart, not one per run (the pages
    /// between are looked at too, and cost less than a system call); a
    /// cluster with a hole (unmapped by the program) gets a call per run.
    fn in_memory(&self) -> io::Result<Vec<u8>> {
        let runs = self.runs();
        let mut out = Vec::with_capacity(self.pages.len());
        let mut c = 0;
        while c < runs.len() {
            let first = runs[c].0;
            let mut end = c + 1;
            while end < runs.len() && runs[end].0 - (runs[end - 1].0 + runs[end - 1].1) < MINCORE_GAP {
                end += 1;
            }
            let last = runs[end - 1].0 + runs[end - 1].1;
            self.mincores.fetch_add(1, Ordering::Relaxed);
            match in_memory(self.base + first * PAGE, last - first) {
                Ok(v) => {
                    for &(f, n) in &runs[c..end] {
                        out.extend_from_slice(&v[f - first..f - first + n]);
                    }
                }
                Err(_) if end > c + 1 => {
                    for &(f, n) in &runs[c..end] {
                        self.mincores.fetch_add(1, Ordering::Relaxed);
                        out.extend(in_memory(self.base + f * PAGE, n)?);
                    }
                }
                Err(e) => return Err(e),
            }
            c = end;
        }
        Ok(out)
    }

    /// Gives the memory of the compressed (and all-zero) victims back,
    /// without the manager's lock: they are OWNED, so nothing else is
    /// installed there meanwhile. Pages the store refused stay; pages the
    /// program released are gone already.
    pub fn release(&self, outcome: &[Outcome]) -> io::Result<()> {
        let drops =
            self.pages.iter().zip(outcome).filter(|(_, &o)| matches!(o, Outcome::Stored | Outcome::Zero));
        let ranges: Vec<(usize, usize)> = runs_of(drops.map(|(&i, _)| i))
            .into_iter()
            .map(|(f, n)| (self.base + f * PAGE, n * PAGE))
            .collect();
        sys::madvise_many(&ranges, libc::MADV_DONTNEED)
    }

    /// Ends the write protection of the victims the store refused
    /// (they stay resident), waking their writers — before the commit,
    /// while the pages are still OWNED: after it the program may unmap
    /// them, and the call would fail on a range no longer registered
    /// (it did, `ENOENT`, and aborted the process, when a full store
    /// refused many pages).
    pub fn unprotect_kept(&self, outcome: &[Outcome]) -> io::Result<()> {
        let kept = self.pages.iter().zip(outcome).filter(|(_, &o)| o == Outcome::Kept);
        for (f, n) in runs_of(kept.map(|(&i, _)| i)) {
            let addr = self.base + f * PAGE;
            self.uffd.writeprotect(addr, n * PAGE, false).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("unprotecting {addr:#x}+{:#x} the store refused: {e}", n * PAGE),
                )
            })?;
        }
        Ok(())
    }

    /// Wakes the threads whose faults on the victims were left waiting
    /// for the commit (the waiters the commit handed over, a call per
    /// run of them), after it: their retried accesses find the page
    /// STORED or ABSENT and fault it back. A fault read after the commit
    /// is served and woken as any other, so the other victims need no
    /// call (there was one per run of victims, most waking nobody).
    /// Released memory needs no unprotecting: `MADV_DONTNEED` on
    /// anonymous memory drops the write-protect bit with the page. A wake
    /// needs no registered range.
    pub fn wake_released(&self, _outcome: &[Outcome]) -> io::Result<()> {
        let waiters = std::mem::take(&mut *lock_waiters(self));
        for (f, n) in runs_of(waiters) {
            let addr = self.base + f * PAGE;
            self.wakes.fetch_add(1, Ordering::Relaxed);
            self.uffd.wake(addr, n * PAGE).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("waking the waiters of {addr:#x}+{:#x} after eviction: {e}", n * PAGE),
                )
            })?;
        }
        Ok(())
    }

    /// The `UFFDIO_WAKE` calls [`Victims::wake_released`] made.
    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::Relaxed)
    }

    /// The victims whose faults wait for the commit, as handed over by
    /// it (sorted); woken by [`Victims::wake_released`].
    pub fn waiters(&self) -> Vec<usize> {
        lock_waiters(self).clone()
    }
}
