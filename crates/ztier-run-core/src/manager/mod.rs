//! The manager: page states of the arena, the userfaultfd handler thread,
//! the resident budget and eviction into the compressed page store.
//!
//! ```text
//!  page state (1 byte per arena page; the replacement policy keeps its
//!  own flags per page, see `ztier_policy::segmented`)
//!  ┌────────┬─────────┬───────┬───────┬───────┬─────────────────────────────┐
//!  │ bit 7  │ bit 6   │ bit 4 │ bit 3 │ bit 2 │ bits 0..1                   │
//!  │ (free) │ NOEVICT │ CLEAN │(free) │ OWNED │ ABSENT 0 · RESIDENT 1 ·     │
//!  │        │         │       │       │       │ STORED 2 · EVICTING 3       │
//!  └────────┴─────────┴───────┴───────┴───────┴─────────────────────────────┘
//!
//!   ABSENT ──fault: UFFDIO_COPY of zeros (a run of up to 16)──► RESIDENT
//!   RESIDENT ──evict: WP, compress, MADV_DONTNEED, commit, wake──► STORED (or ABSENT if all zero)
//!   STORED ──fault: get + decompress + UFFDIO_COPY (+ prefetch of a walk)──► RESIDENT
//!   any ──munmap / MADV_DONTNEED / free of a large block──► ABSENT (copy dropped)
//! ```
//!
//! Every page of the arena is registered for missing-page faults, so a
//! page becomes resident only through the handler: the resident count is
//! exact, and it is held at the budget by eviction.
//!
//! Which pages go, and what a fault brings in besides its page, the
//! policy decides: a replacement ([`ztier_policy::replacement`]; the
//! shipped one is [`ztier_policy::segmented`]: protected and probation
//! segments, refault-distance promotion, adaptive aging), a prefetch
//! ([`ztier_policy::walk`]) and, with `--policy ...+SIZING`, a split of the
//! budget between resident pages and the store ([`ztier_policy::split`]).
//! They are the objects `ztier sim` replays; the manager feeds them the
//! faults, installs and evictions, and keeps their per-page tables
//! ([`Table`]). When it evicts, and how many pages at a time, is
//! [`ztier_policy::pacing`]; victims are asked of the replacement by
//! [`ztier_policy::pick`], as in `ztier sim`, with the manager's word on
//! each ([`crate::victims`]: pinned, owned, shared pages).
//!
//! Clean pages: a page that comes back from the store and goes out again
//! unwritten need not be compressed again, if the store kept its copy.
//! Which pages those are is told one of two ways (`ZTIER_CLEAN`,
//! `ztier run --clean`):
//!
//! - `verify` (the default): a store fault whose pages go to probation
//!   reads them without removing their copies and installs them writable,
//!   marked CLEAN. Every compression records the page's xxh3-128 hash (16
//!   bytes per arena page, in a mapping of its own). A CLEAN victim is
//!   hashed; if the hash is its copy's (and the copy is still there, in
//!   the store or its next tier) it
//!   is only released, else it is compressed as usual and counted
//!   `dirtied`. No fault is added anywhere: the cost is a hash per
//!   eviction (~0.3 µs, against a compression's ~3) on the evictor's CPU.
//!   Pages bound for the protected segment drop their copies on fault as
//!   before: they stay resident long, and keeping theirs would cost the
//!   store about budget × compression ratio of memory (+100 MB of peak RSS
//!   on pyapp at 256M) for the few that leave unwritten. A hash collision
//!   (2^-128 for a changed page) would bring back the copy's content.
//! - `wp`: every store fault keeps the copies and installs the pages
//!   write-protected (`UFFDIO_COPY_MODE_WP`), marked CLEAN. A first write
//!   is a write-protect fault: the copy is dropped, the protection removed
//!   (a call as dear as making one, shootdown included:
//!   `scripts/wp-cost.c`), the writer woken. A page
//!   still CLEAN when it is evicted is only released — no compression, no
//!   write-protect call. Each first write costs a round trip through the
//!   handler on the program's CPU, so this pays for read-mostly data only.
//!
//! (UFFD WP_ASYNC with `PAGEMAP_SCAN` would track writes without those
//! faults, but one userfaultfd has one write-protect mode, and eviction
//! needs writers to wait while it reads a page: a write between the read
//! and `MADV_DONTNEED` would be lost. Verify mode gets the same result —
//! no recompression of unchanged pages, no fault per first write — from
//! the content instead of the page tables.)
//!
//! While a run of pages is evicted it is write-protected
//! (`UFFDIO_WRITEPROTECT`), so a thread writing it meanwhile waits instead
//! of losing its write; after `MADV_DONTNEED` (which drops the protection
//! with the page) its waiters are woken, and their retry faults the page
//! back from the store. One call covers one run of adjacent victims, and
//! nothing else: each call is a TLB shootdown on the program's CPU, but
//! protecting more than the victims (a span across the resident pages
//! between two runs, unprotected again right after) made a random-access
//! program slower — xz -9 under a tight budget took 1.24× as long with
//! spans up to 64 pages apart, 1.06× with spans of at most 32 pages
//! (whose shootdown still flushes page by page), while the sequential
//! pyapp did not change (0.98×). The background evictor takes
//! [`BACKGROUND_BATCH`] victims at a time.
//!
//! The background evictor holds the manager's lock only to pick victims
//! and to commit them; the handler, which needs the lock for every
//! fault, would otherwise wait (with the program) for the evictor's
//! write protections and `MADV_DONTNEED`, each a TLB shootdown. So a
//! victim is OWNED by the evictor from the pick to the commit, and it is
//! write-protected (by the next fault service, on the program's CPU: see
//! the crate root's `near`), read and released in between, without the lock
//! (faults waited behind the protections: lock wait 2.04 s of 13.5 s of
//! service on the corpus builder at 256M with them under the lock, 0.14
//! s without). While a page is OWNED, a
//! missing-page fault on it is not served (its content is between memory
//! and the store) but left waiting (the page is recorded): the evictor
//! wakes those after the commit, and the retried fault finds the page STORED (unless the
//! page is one of a sealed background batch whose release by the evictor
//! has returned: that one is committed early, see
//! [`Manager::commit_early`]). A page the
//! program releases meanwhile stays OWNED (ABSENT), so nothing can be
//! installed there before the evictor's late `MADV_DONTNEED` is over.
//!
//! Taking a victim back (a write to a victim of the background batch
//! before the evictor seals it gets the page back at once instead of
//! waiting for the whole batch), the seal, early commits and the commit
//! are the eviction handshake, drawn with its states in
//! [`crate::handshake`]; the manager keeps one
//! ([`Handshake`]) and is the [`Arena`] it works on.
//!
//! The handler never touches memory of the arena except pages it knows
//! resident (eviction reads them), and its own allocations come from
//! glibc's malloc (see the crate docs), so it cannot fault on itself.

// The docs of public items name the private steps they take (read with
// `--document-private-items`, as the lint builds them).
#![allow(rustdoc::private_intra_doc_links)]

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_128;
use ztier_codec::CodecId;
use ztier_policy::pick::pick;
use ztier_policy::prefetch::{Prefetch, MAX_STORE_RUN, MAX_ZERO_RUN};
use ztier_policy::replacement::Replacement;
use ztier_policy::spec::Parts;
use ztier_policy::split::Split;
use ztier_store::alloc::AllocatorKind;
use ztier_store::tier::FileTier;
use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig, StoreError};
use ztier_uffd::tree::Member;
use ztier_uffd::uffd::{Installed, Uffd, REGISTER_MODE_MISSING, REGISTER_MODE_WP};

use crate::budget::{self, Follow};
use crate::faultlog::{FaultLog, Kind, Row};
pub use crate::handshake::Outcome;
use crate::handshake::{Arena, Handshake};
use crate::host::host;
use crate::inherit::{self, PageMap, Shared};
use crate::names::env;
use crate::pins::{Kept, Pins};
pub use crate::pins::{KeptKind, OnFork};
use crate::state;
use crate::sys;
use crate::treewait;
use crate::victims::{self, Live};

use crate::counters::Timed;
pub use crate::counters::{lat_upper_ns, Stats, LAT_BUCKETS};
pub use crate::state::{ABSENT, CLEAN, EVICTING, NOEVICT, OWNED, RESIDENT, STATE, STORED};
pub use crate::sys::PAGE;
pub use ztier_policy::pacing::{
    reserve_of, BACKGROUND_BATCH, BACKGROUND_LEAST, EVICT_BATCH, INLINE_LEAST, INLINE_RUN,
};

mod evict;
mod fork;
mod pinned;
mod setup;
mod table;
mod tree;

pub use crate::treewait::{TREE_WAIT, TREE_WAIT_MOST};
pub use evict::Victims;
pub use pinned::{LOCKED_RANGES, PINNED_PAGES, WIPE_RANGES};
use setup::*;
pub use setup::{signal_path, CleanMode, Config, MapsLine, POLICY_COSTS};
pub use table::{CopyHash, Table, Zeroed};
pub use tree::{
    AdoptLook, ADOPT_EVERY, ADOPT_LOOK, ADOPT_SPAN, STORE_AHEAD, TABLES_AHEAD, TREE_GROW_EVERY, TREE_LIFE,
    TREE_WAKE, TREE_WAKE_EVERY,
};
/// Zero pages installed per fault on a never-touched page, at most (the
/// prefetch says how many; pins fill this many at a time).
pub const ZERO_RUN: usize = MAX_ZERO_RUN;
/// How long no eviction is tried after the store refused a victim
/// ([`Manager::refusing`]).
pub const REFUSED_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
/// Progress of the handler and of long manager operations (read by the
/// watchdog).
pub static PROGRESS: AtomicU64 = AtomicU64::new(0);

fn store_err(e: StoreError) -> io::Error {
    io::Error::other(e.to_string())
}

/// The arena's pages and everything the handler needs; behind one lock.
pub struct Manager {
    /// Arena start.
    pub base: usize,
    /// Arena pages.
    pub pages: usize,
    /// Per arena page: the page-state byte (drawn in the module docs).
    states: Table<u8>,
    /// The userfaultfd (shared with the handler's event loop).
    pub uffd: Arc<Uffd>,
    store: Arc<Store>,
    pool: u32,
    /// The replacement policy: which resident pages go.
    repl: Box<dyn Replacement>,
    /// The prefetch policy: what a fault brings in besides its page.
    prefetch: Box<dyn Prefetch>,
    /// `--policy ...+SIZING`: the split of the budget between resident
    /// pages and the store.
    sizing: Option<Split>,
    /// How pages that still have their stored copy are told apart from
    /// written ones.
    clean: CleanMode,
    /// Per arena page: the xxh3-128 hash of the content of its stored
    /// copy ([`CleanMode::Verify`]), shared with the eviction batches
    /// ([`Victims`]), which read and write their victims' outside the lock.
    hashes: Arc<Table<CopyHash>>,
    resident: usize,
    /// Resident pages allowed: what the replacement policy's sizes
    /// follow. With a sizing policy it moves with the policy's split,
    /// with the tree scope with what the process can have
    /// ([`Manager::follow_tree`]).
    budget: usize,
    /// The budget asked for (`ZTIER_BUDGET`).
    cap: usize,
    /// This process's part of the budget: `cap`, or with the tree scope
    /// what it can have now ([`Manager::follow_tree`]). Resident pages get
    /// it all, or with a sizing policy what the policy's split leaves
    /// them ([`Manager::set_share`]).
    share: usize,
    /// With a sizing policy, the store's pages last given to it
    /// (`Store::set_budget`).
    store_applied: usize,
    /// With a sizing policy and the tree scope, pages of the shared budget
    /// this process holds for its store's memory (besides one per
    /// resident page): what the store used at the last eviction.
    store_held: usize,
    /// The evictions in flight and the background evictor's batch: what
    /// a write takes back, the seal, early commits, the commit.
    handshake: Handshake,
    buf: Vec<u8>,
    zero: Vec<u8>,
    cfg: Config,
    /// What keeps pages resident — pins for system calls in flight
    /// ([`Manager::pin`]), the program's memory locks
    /// ([`Manager::lock_pages`], [`Manager::lock_all`]), threads' kept
    /// pins ([`Manager::keep_pinned`]), holds ([`Manager::hold`]) — and
    /// the ranges a forked child gets as zeros or not at all
    /// ([`Manager::wipe_on_fork`]).
    pins: Pins,
    /// One row per page-in (`--fault-log`), if asked for.
    log: Option<FaultLog>,
    /// The store refused a victim (it is full and nothing can go to a
    /// next tier): no eviction is tried before this time, or before
    /// [`EVICT_BATCH`] pages have been read out of the store since, when
    /// [`Manager::taken_out`] was the second value ([`Manager::refusing`]).
    refusing: Option<(std::time::Instant, u64)>,
    /// Pages read out of the store (their copies removed) so far.
    taken_out: u64,
    /// `--budget-scope tree`: this process's share of the budget that
    /// every process of the command holds together (`ZTIER_TREE`; see
    /// [`ztier_uffd::tree`]). It holds at least a page per resident page
    /// that is not [`Manager::inherited`].
    tree: Option<Member>,
    /// With the tree scope, in a forked child: the pages it inherited
    /// resident and still shares copy-on-write with its parent, which
    /// holds them, so that they count once ([`Manager::adopt_look`]).
    inherited: Option<Inherited>,
    /// When its last wait for them ([`TREE_WAIT`]) ended with nothing.
    tree_wait_failed: Option<std::time::Instant>,
    /// When a fault last woke the others' evictors for an overdrawn
    /// pool ([`TREE_WAKE_EVERY`]).
    tree_woken: Option<std::time::Instant>,
    /// Pages this process took past the budget ([`Member::force`]), and
    /// whether it said so ([`Manager::forced_notice`]).
    tree_forced: usize,
    tree_forced_said: bool,
    /// Under `--budget-covers all`, in a forked child: pages shared with
    /// its parent taken out of the victims' queues while the pool was
    /// overdrawn ([`Manager::take_victims`]), to requeue once it is not.
    set_aside: Vec<usize>,
    /// In a forked child: victims of the evictions in flight that its
    /// page map showed as its own before they were released, though
    /// still counted as shared with its parent (sorted;
    /// [`Manager::victims_own`]).
    left_own: Vec<usize>,
    /// Pages whose fault (missing page or write) was left waiting for the
    /// commit of the eviction that owns them: the only victims the
    /// evictor wakes after its commit ([`Victims::wake_released`]). A
    /// fault read later finds the page committed and is served (and
    /// woken) as any other.
    waiters: Vec<usize>,
    /// A fault left to wait for the eviction in flight
    /// ([`Manager::wait_for_room`]), and since when faults have waited so.
    room_wait: bool,
    room_since: Option<std::time::Instant>,
    /// How long it waits ([`TREE_WAIT`]; longer in a test whose other
    /// process is a thread that may start late).
    tree_wait: std::time::Duration,
    /// With the tree scope, when [`Manager::follow_tree`] last let the
    /// budget grow.
    tree_grown: std::time::Instant,
    /// With the tree scope, the store's share of the command's `--store`
    /// last applied ([`Manager::follow_tree_store`]).
    store_share: usize,
    /// Per 256 arena pages (a page of the hash table), whether one of
    /// them was ever resident: the per-page tables are backed there
    /// ([`tables_bytes`]); and how many are.
    table_chunks: Vec<u64>,
    table_chunks_used: usize,
}

/// A forked child's resident pages shared with its parent: a bit per
/// arena page (up to the last page in use at the fork).
struct Inherited {
    /// The pages, and where the next look at `/proc/self/pagemap` starts.
    pages: Shared,
    /// `/proc/self/pagemap`, opened at the fork (before the program runs
    /// on); shared with a look in progress ([`AdoptLook`]), which reads
    /// it without the manager's lock.
    pagemap: std::sync::Arc<Pagemap>,
    /// The parent's page map (`/proc/PPID/pagemap`), opened then too, to
    /// tell a page still shared with the parent from one the parent has
    /// dropped while brothers and sisters still share it.
    parent: std::sync::Arc<Pagemap>,
}

impl Manager {
    /// A manager over `pages` pages at `base` (already mapped).
    pub fn new(base: usize, pages: usize, cfg: Config) -> io::Result<Manager> {
        // Per-page tables: private, zero-filled, and backed only where
        // touched (the arena is 64 GiB of address space).
        let states = Table::<u8>::new(pages)?;
        let hashes = Arc::new(Table::<CopyHash>::new(pages)?);
        let clean = CleanMode::from_env()?;
        let budget = cfg.budget_pages.max(EVICT_BATCH * 2);
        let prefetch = std::env::var(env::PREFETCH)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ztier_policy::walk::PREFETCH);
        let Parts { replacement: repl, prefetch, sizing } =
            policies(cfg.policy.as_deref(), pages, budget, prefetch)?;
        let uffd = open_uffd(base, pages * PAGE)?;
        // A user-mode-only userfaultfd fails the kernel's writes to a
        // write-protected page with EFAULT, so pages are not installed
        // write-protected there (the same result, told by content).
        let clean = if (uffd.user_mode_only || uffd.sigbus) && clean == CleanMode::Wp {
            (host().notice)(format_args!(
                "ztier: --clean wp needs a userfaultfd that serves the kernel's faults too \
                 (this one is {}): using --clean verify",
                if uffd.sigbus { "in --fault-path signal mode" } else { "user-mode-only" }
            ));
            CleanMode::Verify
        } else {
            clean
        };
        let (store, pool) = open_store(&cfg)?;
        let mut m = Manager {
            base,
            pages,
            states,
            uffd,
            store,
            pool,
            repl,
            prefetch,
            sizing,
            clean,
            hashes,
            resident: 0,
            budget,
            cap: budget,
            share: budget,
            store_applied: usize::MAX,
            store_held: 0,
            handshake: Handshake::new(),
            buf: vec![0; MAX_STORE_RUN * PAGE],
            zero: vec![0; ZERO_RUN * PAGE],
            cfg,
            pins: Pins::new(),
            log: FaultLog::from_env(),
            refusing: None,
            taken_out: 0,
            tree: join_tree(),
            inherited: None,
            tree_wait_failed: None,
            tree_woken: None,
            tree_forced: 0,
            tree_forced_said: false,
            set_aside: Vec::new(),
            left_own: Vec::new(),
            waiters: Vec::new(),
            room_wait: false,
            room_since: None,
            tree_wait: TREE_WAIT,
            tree_grown: std::time::Instant::now(),
            store_share: usize::MAX,
            table_chunks: vec![0; pages.div_ceil(256 * 64)],
            table_chunks_used: 0,
        };
        m.publish_wake_word();
        m.apply_sizing(true);
        m.follow_tree_store(0, 0);
        Ok(m)
    }

    /// Resizes the resident budget and the store to the sizing policy's
    /// target, if it moved (or `force`).
    fn apply_sizing(&mut self, force: bool) {
        if let Some(t) = self.sizing.as_mut().and_then(|s| s.apply(force)) {
            self.resized(t);
        }
    }

    /// The sizing policy moved its split (the store's pages of the whole
    /// budget now `t`): applied to this process's share.
    fn resized(&mut self, _t: usize) {
        self.set_share(self.share, true);
    }

    /// The store's part of this process's share: the sizing policy's split
    /// of the whole budget, scaled to the share (0 without a policy).
    fn store_part(&self) -> usize {
        match &self.sizing {
            Some(s) if s.store_pages() != usize::MAX => {
                (s.store_pages() as u128 * self.share as u128 / s.total().max(1) as u128) as usize
            }
            _ => 0,
        }
    }

    /// This process's part of the budget is `share` pages: resident pages
    /// get what the sizing policy's split leaves them (all of it without a
    /// policy), the store the rest — given to the store when the policy
    /// moved (`moved`) or the store's part moved by a 32nd of the budget
    /// since (resizing the store compacts it).
    fn set_share(&mut self, share: usize, moved: bool) {
        self.share = share;
        let store = self.store_part();
        self.budget = share - store;
        self.repl.set_budget(self.budget);
        if let Some(s) = &self.sizing {
            if moved || store.abs_diff(self.store_applied) >= (s.total() / 32).max(16) {
                self.store_applied = store;
                self.store.set_budget(store * PAGE);
            }
        }
    }

    /// The policy's name and the store's share of the budget now (bytes),
    /// if a policy sizes it.
    pub fn sizing(&self) -> Option<(String, usize)> {
        self.sizing.as_ref().map(|s| (s.name(), self.store_applied * PAGE))
    }

    /// The names of the replacement and prefetch policies.
    pub fn policy_names(&self) -> (&'static str, &'static str) {
        (self.repl.name(), self.prefetch.name())
    }

    /// Resident pages allowed now.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The store (for its statistics).
    pub fn store(&self) -> &Store {
        &self.store
    }

    #[inline]
    fn st(&self, i: usize) -> u8 {
        self.states[i]
    }

    #[inline]
    fn set(&mut self, i: usize, v: u8) {
        self.states[i] = v;
    }

    fn key(&self, i: usize) -> Key {
        Key { pool: self.pool, object: 0, index: i as u32 }
    }

    fn addr(&self, i: usize) -> usize {
        self.base + i * PAGE
    }

    fn became_resident(&mut self, i: usize, stats: &Stats) {
        let s = self.st(i);
        // A regretted demotion: back from the store (or as zeros, if it
        // was all zero when evicted; a released page loses the mark). A
        // promotion: the page faulted back soon after its eviction.
        let a = self.repl.resident(i);
        if a.regretted {
            stats.regretted.fetch_add(1, Ordering::Relaxed);
        }
        if a.promoted {
            stats.promoted.fetch_add(1, Ordering::Relaxed);
        }
        self.set(i, state::resident(s));
        let (w, b) = (i >> 14, 1u64 << ((i >> 8) & 63));
        if let Some(word) = self.table_chunks.get_mut(w).filter(|x| **x & b == 0) {
            *word |= b;
            self.table_chunks_used += 1;
        }
        self.resident += 1;
        stats.resident.store(self.resident, Ordering::Relaxed);
        stats.peak_resident.fetch_max(self.resident, Ordering::Relaxed);
    }

    /// Installs `n` pages of `data` at page `i` (the newly installed ones
    /// are marked resident); falls back to one page at a time if some
    /// page of the run is there already. With `clean` the pages are
    /// marked CLEAN (the store kept their copies), and in
    /// [`CleanMode::Wp`] go in write-protected: clean until the first
    /// write.
    ///
    /// A run installed whole does not wake its waiters: the range is
    /// returned for the caller to wake once it has let go of the
    /// manager's lock. (The woken thread usually runs on the handler's
    /// CPU and preempts it at once; with the lock held, the evictor on
    /// the other CPU would wait for the program's next fault.)
    #[must_use = "the threads waiting on the returned range must be woken"]
    fn install(
        &mut self,
        i: usize,
        n: usize,
        from_zero: bool,
        clean: bool,
        stats: &Stats,
    ) -> io::Result<Option<(usize, usize)>> {
        let _timed = Timed::start(&stats.install_ns);
        let wp = clean && self.clean == CleanMode::Wp;
        let addr = self.addr(i);
        let src: &[u8] = if from_zero { &self.zero[..n * PAGE] } else { &self.buf[..n * PAGE] };
        let mut tries = 0;
        let r = loop {
            match self.uffd.copy_with(addr, src, wp, false) {
                Ok(Installed::Retry) if tries < 1000 => tries += 1,
                Ok(Installed::Retry) => return Err(io::Error::other("UFFDIO_COPY kept failing with EAGAIN")),
                Ok(r) => break r,
                // A run that crosses into another mapping (the program
                // changed protections inside the arena): page by page.
                Err(e) if n > 1 && e.raw_os_error() == Some(libc::ENOENT) => break Installed::AlreadyThere,
                Err(e) => {
                    return Err(io::Error::new(e.kind(), format!("installing {n} page(s) at {addr:#x}: {e}")))
                }
            }
        };
        if r == Installed::Done {
            for k in 0..n {
                self.became_resident(i + k, stats);
                if clean {
                    self.set(i + k, state::clean(self.st(i + k)));
                }
            }
            return Ok(Some((addr, n * PAGE)));
        }
        // Some page of the run was present (EEXIST): one by one.
        for k in 0..n {
            let src: &[u8] = if from_zero { &self.zero[..PAGE] } else { &self.buf[k * PAGE..(k + 1) * PAGE] };
            let at = addr + k * PAGE;
            let r = loop {
                match self.uffd.copy_mode(at, src, wp) {
                    Ok(Installed::Retry) => continue,
                    Ok(r) => break r,
                    // Not ours to fill (another mapping): leave it.
                    Err(e) if k > 0 && e.raw_os_error() == Some(libc::ENOENT) => {
                        break Installed::AlreadyThere
                    }
                    Err(e) => {
                        return Err(io::Error::new(e.kind(), format!("installing the page at {at:#x}: {e}")))
                    }
                }
            };
            let s = self.st(i + k);
            if r == Installed::Done && s & STATE != RESIDENT {
                self.became_resident(i + k, stats);
                if clean {
                    self.set(i + k, state::clean(self.st(i + k)));
                }
            } else if matches!(s & STATE, STORED | ABSENT) && s & (OWNED | NOEVICT) == 0 {
                // Present already though our books say otherwise: the
                // first try of the whole run copied its first pages
                // before it met a present one (a partial UFFDIO_COPY
                // ends in EAGAIN, the retry in EEXIST). It is resident
                // now; its stored copy, if any, is dropped (the page is
                // not counted clean: it is treated as written).
                let _ = self.store.flush_page(self.key(i + k));
                self.became_resident(i + k, stats);
            }
        }
        Ok(None)
    }

    /// Serves one missing-page fault at `addr`. Returns the range whose
    /// waiters the caller must wake (with [`Uffd::wake`]) after letting
    /// go of the manager's lock; see [`Manager::install`].
    #[must_use = "the faulting thread sleeps until the returned range is woken"]
    pub fn serve(&mut self, addr: usize, stats: &Stats) -> io::Result<Option<(usize, usize)>> {
        let t0 = self.log_clock();
        let i = (addr - self.base) / PAGE;
        let walk = self.prefetch.fault(i);
        if self.st(i) & OWNED != 0 && !self.commit_early(i, stats) {
            // Released by an eviction that has not committed yet: the
            // evictor wakes this fault after its commit (see the module
            // docs); the retry finds the page stored.
            self.waiters.push(i);
            stats.deferred.fetch_add(1, Ordering::Relaxed);
            self.log_row(t0, Kind::Deferred, i, 0, None, false);
            return Ok(None);
        }
        if self.wait_for_room() {
            // Not served: the caller wakes the thread after the batch's
            // commit, and the retry faults again.
            stats.deferred.fetch_add(1, Ordering::Relaxed);
            self.log_row(t0, Kind::Deferred, i, 0, None, false);
            return Ok(Some((self.addr(i), PAGE)));
        }
        let wake = match self.st(i) & STATE {
            STORED => {
                // Refault distance (evictions since this page went out),
                // and whether the page is hot: the replacement's to say.
                let d = self.repl.refault(i).distance;
                let key = self.key(i);
                if let Some(s) = &mut self.sizing {
                    let store = &self.store;
                    if let Some(t) = s.fault(self.budget, d, || store.contains(key)) {
                        self.resized(t);
                    }
                }
                let mut n = 1;
                let lim = self.prefetch.store_run(walk).min(MAX_STORE_RUN);
                // No longer than the shared budget can give ([`Manager::run_room`]),
                // nor than what the fault may evict for ([`Manager::inline_room`]).
                let lim = self.run_room(self.inline_room(lim));
                {
                    while n < lim && i + n < self.pages && self.st(i + n) & (STATE | NOEVICT) == STORED {
                        n += 1;
                    }
                }
                // Verify mode keeps the copies of pages bound for
                // probation only: a protected page stays long, and its
                // copy would be memory held for little.
                let keep = match self.clean {
                    CleanMode::Off => false,
                    CleanMode::Wp => true,
                    CleanMode::Verify => !self.repl.stays_long(i),
                };
                {
                    let _timed = Timed::start(&stats.store_read_ns);
                    self.read_stored(i, n, !keep)?;
                }
                self.make_room(n, stats)?;
                let r = self.install(i, n, false, keep, stats);
                let hot = self.repl.refault_done();
                let wake = r?;
                self.log_row(t0, Kind::Store, i, n, Some(d), hot);
                stats.store_faults.fetch_add(1, Ordering::Relaxed);
                if walk.lone() {
                    stats.lone_faults.fetch_add(1, Ordering::Relaxed);
                }
                stats.prefetched.fetch_add(n as u64 - 1, Ordering::Relaxed);
                self.prefetch.ran_to(i + n - 1);
                wake
            }
            RESIDENT => {
                // Resident by our books but the fault says missing: the
                // program released it behind our back (a raw syscall).
                // Zeros are what the kernel would have given.
                let addr = self.addr(i);
                let r = {
                    let _timed = Timed::start(&stats.install_ns);
                    self.uffd.copy(addr, &self.zero[..PAGE])?
                };
                if r == Installed::Done {
                    stats.zero_faults.fetch_add(1, Ordering::Relaxed);
                    self.log_row(t0, Kind::Lost, i, 1, None, false);
                } else if signal_path() {
                    // Present: with `--fault-path signal` a `SIGBUS` here
                    // is a write to a page left write-protected though
                    // nothing evicts it. Never meant (see
                    // `background_protected`), but as the handler thread's
                    // `write_fault` does, unprotect it rather than let
                    // the write fault for ever.
                    self.uffd.writeprotect(addr, PAGE, false)?;
                }
                None
            }
            _ => {
                let mut n = 1;
                let lim = self.run_room(self.inline_room(self.prefetch.zero_run().min(ZERO_RUN)));
                while n < lim && i + n < self.pages && self.st(i + n) & (STATE | NOEVICT | OWNED) == ABSENT {
                    n += 1;
                }
                self.make_room(n, stats)?;
                let wake = self.install(i, n, true, false, stats)?;
                stats.zero_faults.fetch_add(1, Ordering::Relaxed);
                self.log_row(t0, Kind::Zero, i, n, None, false);
                wake
            }
        };
        stats.faults.fetch_add(1, Ordering::Relaxed);
        Ok(wake)
    }

    /// The fault log's clock (0 without a log).
    #[inline]
    pub fn log_clock(&self) -> u64 {
        self.log.as_ref().map_or(0, FaultLog::now)
    }

    /// Logs a page-in of `n` pages from page `i` whose service began at
    /// `t0` (see [`crate::faultlog`]); nothing without a log.
    #[inline]
    fn log_row(&mut self, t0: u64, kind: Kind, i: usize, n: usize, distance: Option<usize>, hot: bool) {
        let (addr, evictions) = (self.addr(i) as u64, self.repl.clock());
        if let Some(log) = &mut self.log {
            let service = log.now().saturating_sub(t0);
            log.push(Row {
                t_ns: t0,
                addr,
                service_ns: service.min(u32::MAX as u64) as u32,
                distance: distance.map_or(u32::MAX, |d| d.min(u32::MAX as usize - 1) as u32),
                evictions,
                pages: n.min(u16::MAX as usize) as u16,
                kind,
                hot,
            });
        }
    }

    /// Logs a fault the caller handled without [`Manager::serve`]
    /// (`--fault-path signal`: a write that took a victim back, or a fault
    /// deferred to an eviction's commit), at `addr`, begun at `t0`
    /// ([`Manager::log_clock`] when the lock was taken).
    pub fn log_fault(&mut self, t0: u64, kind: Kind, addr: usize) {
        self.log_row(t0, kind, (addr - self.base) / PAGE, 0, None, false);
    }

    /// Takes the fault log's rows out (written at exit), if there is a log.
    pub fn take_fault_log(&mut self) -> Option<FaultLog> {
        self.log.as_mut().map(FaultLog::take)
    }

    /// Reads stored pages `[i, i + n)` into the buffer (their copies
    /// removed from the store if `exclusive`); a page missing from the
    /// store is an error.
    fn read_stored(&mut self, i: usize, n: usize, exclusive: bool) -> io::Result<()> {
        let found = self
            .store
            .get_run(self.key(i), n, &mut self.buf[..n * PAGE], exclusive)
            .map_err(|e| io::Error::other(format!("pages {:#x}+{n}: {e}", self.addr(i))))?;
        if found < n {
            return Err(io::Error::other(format!(
                "page {:#x} is missing from the store",
                self.addr(i + found)
            )));
        }
        if exclusive {
            self.taken_out += n as u64;
        }
        Ok(())
    }

    /// Runs `f` on the eviction handshake with the manager as the arena
    /// it works on (the handshake is out of `self` meanwhile; nothing
    /// [`Arena`] calls looks at it).
    fn with_handshake<R>(&mut self, f: impl FnOnce(&mut Handshake, &mut Manager) -> R) -> R {
        let mut h = std::mem::take(&mut self.handshake);
        let r = f(&mut h, self);
        self.handshake = h;
        r
    }

    /// Resident pages now.
    pub fn resident(&self) -> usize {
        self.resident
    }
}

/// The page indices of `used` clipped to an arena of `pages` pages.
fn pages_in(pages: usize, used: &[std::ops::Range<usize>]) -> impl Iterator<Item = usize> + '_ {
    used.iter().flat_map(move |r| r.start.min(pages)..r.end.min(pages))
}

fn is_zero(page: &[u8]) -> bool {
    page.chunks_exact(64).all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

/// The manager's side of the eviction handshake: the page states, the
/// store's copies, write protection, the replacement policy's queues.
impl Arena for Manager {
    fn state(&self, i: usize) -> u8 {
        self.st(i)
    }

    fn set_state(&mut self, i: usize, s: u8) {
        self.set(i, s);
    }

    fn drop_copy(&mut self, i: usize) {
        let _ = self.store.flush_page(self.key(i));
    }

    fn unprotect(&mut self, i: usize) -> io::Result<()> {
        self.uffd.writeprotect(self.addr(i), PAGE, false)
    }

    fn requeue(&mut self, i: usize) {
        self.repl.requeue(i);
    }

    fn left(&mut self, i: usize) {
        self.repl.evicted(i);
        self.resident -= 1;
        if self.uninherit(i) && self.left_own.binary_search(&i).is_ok() {
            if let Some(t) = &self.tree {
                t.adopt(1);
            }
        }
    }
}

#[cfg(test)]
mod tests;
