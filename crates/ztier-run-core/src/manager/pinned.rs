//! What keeps pages resident: pins for system calls in flight, memory
//! locks, threads' kept pins, holds; and the ranges a forked child gets as
//! zeros or not at all.

use super::*;
/// The main thread has left (`pthread_exit`) while others run: it stays
/// a zombie until the process ends, and signal 0 still reaches it, but
/// its `/proc` state says `Z`.
pub(super) fn leader_is_zombie(pid: i32) -> bool {
    ztier_uffd::tree::proc_state(format_args!("/proc/self/task/{pid}/stat")) == Some(b'Z')
}

/// Ranges the program locked ([`Manager::lock_pages`]): a `free` checks
/// this before it takes the manager's lock to unlock.
pub static LOCKED_RANGES: AtomicUsize = AtomicUsize::new(0);

/// Ranges marked for wiping in a forked child ([`Manager::wipe_on_fork`]):
/// a `free` checks this before it takes the manager's lock to unmark.
pub static WIPE_RANGES: AtomicUsize = AtomicUsize::new(0);

/// Pages pinned now (the sum of [`Manager::pin`]s not yet ended): at
/// exit, pins that nothing ended.
pub static PINNED_PAGES: AtomicUsize = AtomicUsize::new(0);

impl Manager {
    /// Marks pages not evictable (not readable) or evictable again.
    pub fn set_noevict(&mut self, first: usize, n: usize, on: bool) {
        for i in first..first + n {
            let s = self.st(i);
            self.set(i, state::noevict(s, on));
        }
    }

    /// Is page `i` pinned by a system call in flight?
    pub(super) fn pinned(&self, i: usize) -> bool {
        self.pins.pinned(i)
    }

    /// Makes pages `[first, first + n)` resident and keeps them from
    /// eviction until [`Manager::unpin`] — for a system call about to
    /// read or write them: with a user-mode-only userfaultfd the kernel's
    /// own access to a missing page fails the call with `EFAULT` instead
    /// of waiting for the handler (see the `sud` module). Stored pages
    /// are brought back (their copies dropped), never-touched ones filled
    /// with zeros, as a fault would. Pages that are not readable
    /// (NOEVICT) are left alone: the call gets the kernel's own answer.
    ///
    /// `Ok(false)`, with nothing pinned: a page of the range is owned by
    /// an eviction in flight; let go of the lock, wait, and call again.
    /// Threads that faulted on a page meanwhile are woken. Pinned pages
    /// may take the resident count over the budget until unpinned.
    pub fn pin(&mut self, first: usize, n: usize, stats: &Stats) -> io::Result<bool> {
        let end = (first + n).min(self.pages);
        if first >= end {
            return Ok(true);
        }
        if self.owned_in(first, end - first) {
            return Ok(false);
        }
        PINNED_PAGES.fetch_add(self.pins.pin(first, end), Ordering::Relaxed);
        let mut i = first;
        while i < end {
            let s = self.st(i);
            if s & NOEVICT != 0 {
                i += 1;
                continue;
            }
            let room = |m: &Self, k: usize| {
                k < m.buf.len() / PAGE && i + k < end && m.st(i + k) & (STATE | NOEVICT | OWNED) == s & STATE
            };
            match s & STATE {
                STORED => {
                    let t0 = self.log_clock();
                    let d = self.repl.distance(i);
                    // No longer than the shared budget can give
                    // ([`Manager::run_room`]).
                    let (mut k, cap) = (1, self.run_room(self.buf.len() / PAGE));
                    while k < cap && room(self, k) {
                        k += 1;
                    }
                    self.read_stored(i, k, true)?;
                    self.make_room(k, stats)?;
                    if let Some((at, len)) = self.install(i, k, false, false, stats)? {
                        self.uffd.wake(at, len)?;
                    }
                    self.log_row(t0, Kind::Pin, i, k, Some(d), false);
                    stats.pinned_in.fetch_add(k as u64, Ordering::Relaxed);
                    i += k;
                }
                ABSENT => {
                    let t0 = self.log_clock();
                    let (mut k, cap) = (1, self.run_room(ZERO_RUN));
                    while k < cap && room(self, k) {
                        k += 1;
                    }
                    self.make_room(k, stats)?;
                    if let Some((at, len)) = self.install(i, k, true, false, stats)? {
                        self.uffd.wake(at, len)?;
                    }
                    self.log_row(t0, Kind::Pin, i, k, None, false);
                    i += k;
                }
                _ => i += 1,
            }
        }
        Ok(true)
    }

    /// Ends one [`Manager::pin`] of the same range.
    pub fn unpin(&mut self, first: usize, n: usize) {
        let end = (first + n).min(self.pages);
        PINNED_PAGES.fetch_sub(self.pins.unpin(first, end), Ordering::Relaxed);
        // Pages that left the queues while pinned go back to probation.
        for i in first..end {
            let s = self.st(i);
            if s & STATE == RESIDENT && !self.pinned(i) {
                self.repl.requeue(i);
            }
        }
    }

    /// Keeps pages `[first, first + n)` pinned for thread `tid`'s memory
    /// of `kind` until it is replaced (another call for the same thread
    /// and kind, except [`KeptKind::Robust`], whose entries add up; `n` =
    /// 0 drops it, all of them for `Robust`), released
    /// ([`Manager::release`]) or the thread is gone. For memory the kernel reads or writes on the
    /// thread's behalf outside any system call — an rseq area's CPU
    /// number; a stack the program gave the thread, which holds its
    /// control block, its thread-locals (the dispatch selector among
    /// them) and its signal frames' neighbours — which must never be
    /// missing (under a user-mode-only or SIGBUS userfaultfd the kernel's
    /// access would fail and kill the process; the library's
    /// thread-locals are read under the manager's lock). Kept pins of
    /// threads that no longer exist are dropped here.
    ///
    /// `Ok(false)`, with nothing changed: as [`Manager::pin`].
    pub fn keep_pinned(
        &mut self,
        tid: i32,
        kind: KeptKind,
        first: usize,
        n: usize,
        stats: &Stats,
    ) -> io::Result<bool> {
        let end = (first + n).min(self.pages);
        if first < end && !self.pin(first, end - first, stats)? {
            return Ok(false);
        }
        self.drop_kept(|e| Pins::replaced(e, tid, kind, n));
        if first < end {
            self.pins.keep(Kept { tid, kind, first, end });
        }
        Ok(true)
    }

    /// Ends the kept pins of threads that are gone (see
    /// [`Manager::keep_pinned`]); done there, and before the stats are
    /// read.
    pub fn drop_kept_of_gone(&mut self) {
        self.drop_kept(|_| false);
    }

    /// Ends the kept pins that `drop` picks, and those of threads gone.
    pub(super) fn drop_kept(&mut self, drop: impl Fn(&Kept) -> bool) {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let gone = |e: &Kept| {
            // Signal 0 only checks that the thread exists.
            let r = sys::tgkill(pid, e.tid, 0);
            (r != 0 && sys::errno() == libc::ESRCH) || (e.tid == pid && leader_is_zombie(pid))
        };
        for e in self.pins.take_kept(|e| drop(e) || gone(e)) {
            self.unpin(e.first, e.end - e.first);
        }
    }

    /// In a forked child, whose one thread is `child` (the parent's
    /// thread `parent`, which forked): that thread's kept pins stay, now
    /// the child's; every other pin (other threads' kept ones, system
    /// calls in flight in the parent) ends.
    /// What a forked child gets of pages `[first, first + n)`: the
    /// parent's (`MADV_KEEPONFORK`, `MADV_DOFORK`), zeros
    /// (`MADV_WIPEONFORK`) or nothing (`MADV_DONTFORK`). The kernel is
    /// not told: the arena must reach a forked child whole (its
    /// registration, its other pages). Instead the child releases those
    /// pages at once ([`Manager::wipe_after_fork`]), so they read as
    /// zeros there, as a wiped range does natively, and makes a range
    /// kept from it inaccessible, so a touch is a `SIGSEGV` as where
    /// natively nothing is mapped (it read zeros before). Before, the
    /// child got the parent's bytes: a random generator's state kept in
    /// such a page (its way to notice a fork) was the parent's.
    pub fn wipe_on_fork(&mut self, first: usize, n: usize, how: OnFork) {
        self.pins.mark_fork(first, first + n, how);
        WIPE_RANGES.store(self.pins.fork_marks().len(), Ordering::Relaxed);
    }

    /// `mlock` of pages `[first, first + n)`: stored ones are brought back
    /// and all stay resident, never victims, until
    /// [`Manager::unlock_pages`], their release or unmapping, or a fork
    /// (locks are not inherited). The kernel is not told: a locked range
    /// of the arena would refuse the `MADV_DONTNEED` of every later
    /// eviction and release (`EINVAL`; before, the first one aborted the
    /// process). Pages already locked are left as they are. The pages
    /// count against the budget, which they may exceed, as pins do.
    /// `Ok(false)` as [`Manager::pin`] (nothing changed).
    pub fn lock_pages(&mut self, first: usize, n: usize, stats: &Stats) -> io::Result<bool> {
        let end = (first + n).min(self.pages);
        if self.owned_in(first, end.saturating_sub(first)) {
            return Ok(false);
        }
        // The parts of the range not locked yet.
        for (f, e) in self.pins.not_locked(first, end) {
            if !self.pin(f, e - f, stats)? {
                LOCKED_RANGES.store(self.pins.locked().len(), Ordering::Relaxed);
                return Ok(false);
            }
            self.pins.lock(f, e);
        }
        LOCKED_RANGES.store(self.pins.locked().len(), Ordering::Relaxed);
        Ok(true)
    }

    /// `munlock` of pages `[first, first + n)` (any part of a locked range:
    /// the rest stays locked). Also when the pages are unmapped or freed.
    pub fn unlock_pages(&mut self, first: usize, n: usize) {
        for cut in self.pins.unlock(first, first + n) {
            let (f, e) = cut.range;
            self.unpin(f, e - f);
            for (a, b) in cut.left {
                // Resident and pinned until now: nothing to bring back.
                PINNED_PAGES.fetch_add(self.pins.pin(a, b), Ordering::Relaxed);
            }
        }
        LOCKED_RANGES.store(self.pins.locked().len(), Ordering::Relaxed);
    }

    /// `mlockall` (`on`) or `munlockall`: while on, no page is evicted and
    /// every page the program faults in stays, as locked memory does;
    /// `on` brings stored pages back first (`MCL_CURRENT`: what is mapped
    /// now is resident). `munlockall` also ends every `mlock`.
    pub fn lock_all(&mut self, on: bool, used: &[std::ops::Range<usize>], stats: &Stats) -> io::Result<()> {
        self.pins.set_locked_all(on);
        if on {
            for r in used {
                let (f, e) = (r.start.min(self.pages), r.end.min(self.pages));
                if f < e {
                    // Brought back, never-touched pages filled in, as the
                    // kernel's `MCL_CURRENT` does: a pin that ends at once.
                    let _ = self.pin(f, e - f, stats)?;
                    self.unpin(f, e - f);
                }
            }
        } else {
            self.unlock_pages(0, self.pages);
        }
        Ok(())
    }

    /// Every stored page of `used` (page ranges) back in memory, the spill
    /// file's too; pages never touched or given back stay out (they take
    /// no memory, and read as zeros in a core dump).
    pub fn bring_back(&mut self, used: &[std::ops::Range<usize>], stats: &Stats) -> io::Result<()> {
        for r in used {
            let (mut i, e) = (r.start.min(self.pages), r.end.min(self.pages));
            while i < e {
                if self.st(i) & STATE != STORED {
                    i += 1;
                    continue;
                }
                let mut k = i + 1;
                while k < e && self.st(k) & STATE == STORED {
                    k += 1;
                }
                // Brought back: a pin that ends at once.
                let _ = self.pin(i, k - i, stats)?;
                self.unpin(i, k - i);
                i = k;
            }
        }
        Ok(())
    }

    /// A hold by process `by` (`ztier hold`) until `until`, or its renewal:
    /// no eviction while any hold is in force. The caller brings the stored
    /// pages back ([`Manager::bring_back`]) once nothing is in flight.
    /// `true` if it is a new hold (none was in force).
    pub fn hold(&mut self, by: i32, until: std::time::Instant) -> bool {
        self.pins.hold(by, until)
    }

    /// Ends process `by`'s hold, and every hold whose lease ran out by
    /// `now`; `true` if none is left in force of those there were.
    pub fn release_holds(&mut self, by: Option<i32>, now: std::time::Instant) -> bool {
        self.pins.release_holds(by, now)
    }

    /// The processes whose holds are in force.
    pub fn holders(&self) -> Vec<i32> {
        self.pins.holders()
    }
}
