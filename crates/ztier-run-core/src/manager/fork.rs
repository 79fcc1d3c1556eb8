//! Fork bookkeeping: what the parent does before `fork` and after it, and
//! what a forked child does before the program runs on.

use super::*;
impl Manager {
    /// In a forked child: memory locks are not inherited, nor holds (they
    /// were asked of the parent).
    pub fn unlock_after_fork(&mut self) {
        self.pins.set_locked_all(false);
        self.pins.clear_holds();
        self.unlock_pages(0, self.pages);
    }

    /// In a forked child, after [`Stats::reset`]: what its store holds
    /// now is the parent's, not counted in the child's store figures.
    pub fn inherit_store(&self, stats: &Stats) {
        let st = self.store.stats();
        stats.store_inherited.0.store(st.memory_used, Ordering::Relaxed);
        stats.store_inherited.1.store(st.orig_bytes + st.tier_entries * PAGE as u64, Ordering::Relaxed);
    }

    /// In a forked child: releases the pages the parent marked
    /// ([`Manager::wipe_on_fork`]), which then read as zeros, and makes
    /// those kept from the child inaccessible (never evicted).
    pub fn wipe_after_fork(&mut self, stats: &Stats) {
        for (f, e, how) in self.pins.fork_marks().to_vec() {
            self.release(f, e - f, stats);
            if how == OnFork::Drop {
                sys::mprotect(self.addr(f) as *mut libc::c_void, (e - f) * PAGE, libc::PROT_NONE);
                self.set_noevict(f, e - f, true);
            }
        }
    }

    /// In a forked child whose one thread `child` was the parent's thread
    /// `parent`: every pin ends, and that thread's kept pins are pinned
    /// again, now the child's ([`Pins::kept_after_fork`]).
    pub fn kept_after_fork(&mut self, parent: i32, child: i32) {
        let mine = self.pins.kept_after_fork(parent, child);
        while let Some((first, end)) = self.pins.last_pin() {
            self.unpin(first, end - first);
        }
        for k in mine {
            PINNED_PAGES.fetch_add(self.pins.pin(k.first, k.end), Ordering::Relaxed);
            self.pins.keep(k);
        }
    }

    /// Before `fork`: the child gets a copy of the memory, the store's
    /// included, so stored pages stay stored: the child serves them from
    /// its copy. The store's next tier (the spill file, which the two
    /// processes would share) is copied for the child, each entry at its
    /// offset ([`Store::prepare_fork_tier`]), so spilled pages stay
    /// spilled too. Only if that copy cannot be made (a full device) are
    /// they brought back into memory first, as before; the parent evicts
    /// them again after the fork. Clean pages whose kept copies went
    /// there then lose the copies (they are resident). Then every lock
    /// of the store is taken, so that the copy is whole; the parent lets
    /// go of them in [`Manager::parent_after_fork`], the child in
    /// [`Manager::reopen_after_fork`]. `used`: the parts of the arena ever
    /// handed out (page ranges); the rest is ABSENT.
    pub fn prepare_fork(&mut self, used: &[std::ops::Range<usize>], stats: &Stats) -> io::Result<()> {
        let child_keeps_tier = self.store.tier_entries() == 0
            || self.store.prepare_fork_tier().unwrap_or_else(|e| {
                static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    (host().notice)(format_args!(
                        "ztier: process {}: copying the spill file for a forked child failed ({e}): \
                         spilled pages come back for a fork instead (said once)",
                        std::process::id()
                    ));
                }
                false
            });
        if !child_keeps_tier {
            for i in pages_in(self.pages, used) {
                if i % 1024 == 0 {
                    PROGRESS.fetch_add(1, Ordering::Relaxed);
                }
                let s = self.st(i);
                if s & CLEAN != 0 && !self.store.contains(self.key(i)) {
                    // A clean page's kept copy went to the spill file: the
                    // page is here, the copy is dropped (it is written
                    // again when the page goes out).
                    let _ = self.store.flush_page(self.key(i));
                    self.set(i, state::written(s));
                } else if s & STATE == STORED && !self.store.contains(self.key(i)) {
                    let key = self.key(i);
                    let found = self.store.get(key, &mut self.buf[..PAGE], true).map_err(store_err)?;
                    if !found {
                        return Err(io::Error::other(format!(
                            "page {:#x} is missing from the store",
                            self.addr(i)
                        )));
                    }
                    if let Some((addr, len)) = self.install(i, 1, false, false, stats)? {
                        self.uffd.wake(addr, len)?;
                    }
                }
            }
        }
        // No thread waits for the store's locks (as `lock_for_fork`
        // requires): every store call but the evictor's is made under the
        // manager's lock, held here, and the evictor's batch is done.
        self.store.lock_for_fork();
        Ok(())
    }

    /// In the parent after `fork`: lets go of the store's locks.
    pub fn parent_after_fork(&mut self) {
        self.store.tier_parent_after_fork();
        // SAFETY: `prepare_fork` took them in this thread, and nothing
        // has let go of them since.
        unsafe { self.store.unlock_after_fork() };
    }

    /// In a forked child: a userfaultfd of its own, over the same page
    /// states, and its copy of the parent's store (the compressed pages
    /// it holds are the child's now, shared with the parent's memory
    /// until one of them changes it; its next tier the child's own: see
    /// [`Store::after_fork`]). `used` as for [`Manager::prepare_fork`].
    pub fn reopen_after_fork(&mut self, used: &[std::ops::Range<usize>]) -> io::Result<()> {
        // SAFETY: `prepare_fork` took them in the thread that forked,
        // which is this thread of the child.
        unsafe { self.store.unlock_after_fork() };
        self.store.after_fork().map_err(store_err)?;
        for i in pages_in(self.pages, used) {
            let s = self.st(i);
            // The child's copies are not write-protected: with
            // `--clean wp` a write would go unseen, so no page is clean
            // (its kept copy dropped). Verify mode tells by content, and
            // the copies and hashes are the child's as well.
            if s & CLEAN != 0 && self.clean == CleanMode::Wp {
                let _ = self.store.flush_page(self.key(i));
                self.set(i, state::written(s));
            }
            // Pages the parent's evictor was working on are plain
            // resident pages here (the child's copies lost the write
            // protection).
            let s = self.st(i);
            if s & STATE == EVICTING {
                let _ = self.store.flush_page(self.key(i));
                self.set(i, state::taken_back(s));
                self.repl.requeue(i);
            }
        }
        self.uffd = open_uffd(self.base, self.pages * PAGE)?;
        if let Some(log) = &mut self.log {
            log.clear();
        }
        // The parent's slot and pages are the parent's: the child takes
        // its own, and holds the resident pages it shares with the parent
        // once they are its own ([`Manager::adopt_unshared`]); it holds
        // those it installs from now on at once.
        self.inherited = None;
        self.store_held = 0;
        if let Some(t) = self.tree.take() {
            self.tree = t.rejoin();
            if self.tree.is_none() {
                (host().notice)(format_args!(
                    "ztier: process {}: the command's {} places in its shared budget are all taken: \
                     this forked child keeps its own --budget",
                    std::process::id(),
                    ztier_uffd::tree::SLOTS
                ));
            }
        }
        self.publish_wake_word();
        if self.tree.is_some() {
            let end = used.iter().map(|r| r.end.min(self.pages)).max().unwrap_or(0);
            let pagemap = std::sync::Arc::new(Pagemap::open());
            let parent = std::sync::Arc::new(Pagemap::open_parent());
            let mut h = Inherited { pages: Shared::new(end), pagemap, parent };
            for i in pages_in(self.pages, used) {
                if self.st(i) & STATE == RESIDENT {
                    h.pages.insert(i);
                }
            }
            self.inherited = (h.pages.count() > 0).then_some(h);
        }
        Ok(())
    }

    /// Registers `[first, first + n)` again (after a fixed mapping
    /// replaced that part of the arena).
    pub fn reregister(&mut self, first: usize, n: usize) -> io::Result<()> {
        self.uffd.register_mode(self.addr(first), n * PAGE, REGISTER_MODE_MISSING | REGISTER_MODE_WP)
    }
}
