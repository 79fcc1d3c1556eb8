//! The replay of a fault-driven policy: a model of the pager `ztier run`
//! runs (the run library's manager), driving the same policy objects
//! ([`ztier_policy::replacement`], [`ztier_policy::prefetch`],
//! [`ztier_policy::split`]) with a trace's references.
//!
//! The pager sees faults only. A reference to a resident page is a hit
//! the policy never hears of; any other reference is a fault:
//!
//! ```text
//!  reference to page p
//!    resident ─────────────► hit (a write marks it written)
//!    stored   ─► store fault: refault distance → replacement (hot?) and sizing;
//!                the prefetch's run of stored pages from p comes back
//!                (a compressed hit per fault, a decompression per page;
//!                from the spill file: a disk fault)
//!    absent   ─► zero fault: the prefetch's run of never-touched pages, zeros
//!  then, as the manager: over the budget → evict at once, what the fault needs
//!  (INLINE_LEAST at least);
//!  above budget − reserve/2 → the background evictor's batches, down to
//!  budget − reserve ([`ztier_policy::pacing`])
//! ```
//!
//! The background evictor's pipeline ([`PagerOptions::pipeline`], on by
//! default) is modelled as the run library runs it: one batch in flight
//! at a time, its victims still in memory until the batch is committed.
//!
//! ```text
//!  take (up to BACKGROUND_BATCH victims, EVICTING, still resident)
//!   ─► protected: by the next fault service, or NEAR_WAIT after the take
//!   ─► compressed: victims × compress time later ─► sealed and committed
//!  reads of a victim in flight hit; a write after the protection takes it
//!  back (`taken_back`, no fault; queued again at the commit); a write
//!  before it lands in the page (the evictor compresses what it reads)
//! ```
//!
//! The clock for that is the program's: `ref_ns` per reference, a
//! fault's service, an inline eviction's compressions; the evictor
//! compresses beside it on a CPU of its own. After a commit the evictor
//! takes its next batch at once if there is one to take (the run
//! library's `evictor_loop`), else it sleeps until a fault finds the
//! resident count above budget − reserve/2.
//!
//! Victims are asked of the replacement one by one, each taking its
//! resident neighbours along (up to [`ztier_policy::pacing::CLUSTER`]:
//! the policy crate's loop, [`ztier_policy::pick`], as live); an evicted
//! page whose content is zero (its latest compression record says size
//! 0, or it has none and was never written) leaves nothing stored (its
//! next touch is a zero fault again, as live); one that came back from the
//! store with its copy kept (`--clean verify`: pages bound for probation)
//! and was not written since costs no compression; any other is
//! compressed. Without a sizing policy the store is beside the budget
//! and holds every evicted page (`ztier run`'s default `--store` is half
//! of RAM); with one, it holds its share of the memory and the oldest
//! copies beyond it go to the backing store (the spill file).
//!
//! What the model leaves out: with the pipeline off, the background
//! evictor runs at once after each fault (live it runs beside the
//! program, a little behind), and no victim is taken back by a write;
//! with it on, the time between the seal and the commit (the release,
//! during which reads of a victim still hit live), faults that wait for
//! a commit, and the evictor's 100 ms naps; pages the program releases
//! stay as they are (a trace holds references only), but for those a
//! trace records as released (`munmap`s and the large blocks whose
//! pages a `free` released, as the allocation-only library logged them:
//! [`crate::lackey`]); system calls' pins and the
//! library's own pages are not there; a page's content is taken from
//! its compression records.
//!
//! Pages a trace marks unmanaged (mapped from files, the main stack:
//! [`crate::trace`] records them since version 2) are left out: they are
//! not in the arena, nor in the budget. A program's memory that the
//! library leaves to glibc (what it asked for before it had asked for
//! 1 MiB) cannot be told apart in a trace, and is modelled as managed.
//!
//! Pages are laid out as in the trace: a run of faults or evictions goes
//! over adjacent page numbers. Each referenced page and the
//! [`ZERO_RUN`] pages after it are modelled (a zero fault may install
//! those); a gap separates stretches further apart, so that no run or
//! walk crosses it.

use std::collections::VecDeque;
use std::fs::File;
use std::hash::BuildHasherDefault;
use std::io::BufReader;
use std::path::Path;
use std::time::Instant;

use hashbrown::HashMap;
use ztier_policy::pacing::{
    reserve_of, BACKGROUND_BATCH, BACKGROUND_LEAST, EVICT_BATCH, INLINE_LEAST, INLINE_RUN,
};
use ztier_policy::pick::{pick, Candidates};
use ztier_policy::prefetch::{Prefetch, MAX_STORE_RUN, MAX_ZERO_RUN};
use ztier_policy::recency::PageHasher;
use ztier_policy::replacement::{Replacement, Verdict};
use ztier_policy::spec::{Parts, Spec};
use ztier_policy::split::Split;
use ztier_policy::Costs;

use crate::replay::{Counts, SimError, TraceSummary};
use crate::trace::{Event, TraceReader};

type PageMap<V> = HashMap<u64, V, BuildHasherDefault<PageHasher>>;

/// Pages after a referenced page that a zero fault may install.
pub const ZERO_RUN: usize = MAX_ZERO_RUN;
/// Unmodelled slots between two stretches of pages: more than a walk's
/// reach (16 pages), so none crosses.
const GAP: usize = 32;

/// How long the background evictor waits for a fault service to make
/// its batch's write protections before it makes them itself, in ns
/// (`ztier_policy::pacing::NEAR_WAIT`, which the run library uses).
pub const NEAR_WAIT_NS: f64 = ztier_policy::pacing::NEAR_WAIT.as_nanos() as f64;

/// Settings of the model that `ztier run` takes from its options.
#[derive(Clone, Copy, Debug)]
pub struct PagerOptions {
    /// Most stored pages a sequential walk brings in (`--prefetch`).
    pub prefetch: usize,
    /// Pages bound for probation keep their stored copies (`--clean
    /// verify`, the default): evicted unwritten, they cost no compression.
    pub verify: bool,
    /// The background evictor's pipeline (see the module docs); `None`:
    /// its victims leave memory the moment they are chosen.
    pub pipeline: Option<Pipeline>,
    /// The background evictor runs (`false`: it never gets a CPU, every
    /// eviction is a fault's, inline: the other end of what a loaded
    /// machine does to it).
    pub background: bool,
}

/// The clock of the evictor's pipeline: the program's time and the
/// evictor's, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pipeline {
    /// The program's own time per traced reference (`ztier sim
    /// --ref-ns`, default 1 ns: sort of 50k lines made 74.6 M references
    /// in 78 ms outside fault service at 3M, sqlite3 70.8 M in 88 ms).
    pub ref_ns: f64,
    /// A fault's service, the program stopped meanwhile (5 µs: `ztier
    /// run --stats`' `fault_p50_us` on those runs, 5.1).
    pub fault_ns: f64,
    /// The evictor's compression of one page (3 µs: lz4 of a 4 KiB
    /// page, as the run library's manager docs put it).
    pub compress_ns: f64,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline { ref_ns: 1.0, fault_ns: 5_000.0, compress_ns: 3_000.0 }
    }
}

impl Default for PagerOptions {
    fn default() -> Self {
        PagerOptions {
            prefetch: ztier_policy::walk::SHIPPED_PREFETCH,
            verify: true,
            pipeline: Some(Pipeline::default()),
            background: true,
        }
    }
}

/// Where each referenced page of a trace sits among the modelled slots.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Referenced page → slot.
    slot: PageMap<u32>,
    /// Slots modelled (referenced pages, their zero-run neighbours, gaps).
    slots: usize,
    /// Slot → page number (`u64::MAX` in a gap).
    page: Vec<u64>,
    /// Pages the trace marks unmanaged (left out).
    unmanaged: usize,
}

impl Layout {
    /// The layout of the pages of `pages` (any order, repeats allowed).
    pub fn of(pages: impl IntoIterator<Item = u64>) -> Layout {
        let mut v: Vec<u64> = pages.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        let mut l = Layout::default();
        let mut k = 0;
        while k < v.len() {
            // A stretch: pages that are within a zero run of the last.
            let start = v[k];
            let mut last = start;
            while k < v.len() && v[k] <= last + ZERO_RUN as u64 {
                last = v[k];
                k += 1;
            }
            if !l.page.is_empty() {
                l.page.extend(std::iter::repeat_n(u64::MAX, GAP));
            }
            let base = l.page.len();
            for p in start..=last + ZERO_RUN as u64 {
                l.page.push(p);
            }
            for &p in &v[..k] {
                if p >= start {
                    l.slot.insert(p, (base as u64 + p - start) as u32);
                }
            }
        }
        l.slots = l.page.len();
        l
    }

    /// The layout of the pages `path` references (one pass over it),
    /// but those it marks unmanaged: memory `ztier run` does not manage.
    pub fn of_trace(path: &Path) -> Result<Layout, SimError> {
        let mut t = TraceReader::new(BufReader::with_capacity(1 << 20, File::open(path)?))?;
        let mut seen: PageMap<bool> = PageMap::default();
        while let Some(e) = t.next_event()? {
            match e {
                Event::Ref { page, .. } => {
                    seen.entry(page).or_insert(true);
                }
                Event::Unmanaged { page } => {
                    seen.insert(page, false);
                }
                Event::Sizes { .. } | Event::Released { .. } => {}
            }
        }
        let unmanaged = seen.values().filter(|&&m| !m).count();
        let mut l = Layout::of(seen.into_iter().filter(|&(_, managed)| managed).map(|(p, _)| p));
        l.unmanaged = unmanaged;
        Ok(l)
    }

    /// Pages of the trace left out as unmanaged.
    pub fn unmanaged(&self) -> usize {
        self.unmanaged
    }

    /// Slots modelled.
    pub fn slots(&self) -> usize {
        self.slots
    }
}

/// Slot states (bits 0..2) and flags.
const ABSENT: u8 = 0;
const RESIDENT: u8 = 1;
const STORED: u8 = 2;
/// A victim of the background batch in flight: still in memory (and
/// counted resident) until the batch is committed.
const EVICTING: u8 = 3;
/// A gap between stretches: never installed.
const GAP_SLOT: u8 = 4;
const STATE: u8 = 7;
/// Resident, taken back by a write from the batch in flight: out of the
/// replacement's queues until the batch's commit queues it again (the
/// run library's RESIDENT | OWNED).
const TAKEN: u8 = 0x08;
/// Written since it was installed as zeros: its content is not zero.
const DATA: u8 = 0x10;
/// Resident, and the store kept its copy: unwritten since, so evicting
/// it costs no compression.
const CLEAN: u8 = 0x20;
/// Its stored copy went to the backing store (the spill file).
const SPILLED: u8 = 0x40;

/// The slot states as victim choice sees them (the run library's
/// `victims::Live`, without pins, locks or pages shared with a parent).
struct Model<'a>(&'a mut [u8]);

impl Candidates for Model<'_> {
    fn pages(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn resident(&self, i: usize) -> bool {
        self.0[i] & STATE == RESIDENT
    }

    fn verdict(&mut self, i: usize) -> Verdict {
        let s = self.0[i];
        if s & (STATE | TAKEN) == RESIDENT | TAKEN {
            Verdict::Owned
        } else if s & STATE == RESIDENT {
            Verdict::Take
        } else {
            Verdict::Stale
        }
    }

    fn joins(&self, j: usize) -> bool {
        self.0[j] & (STATE | TAKEN) == RESIDENT
    }

    fn take(&mut self, i: usize) {
        self.0[i] = (self.0[i] & !STATE) | EVICTING;
    }
}

/// The compressed store: copies in memory, oldest first, and their bytes.
struct StoreModel {
    /// Slot → (size, stamp) of its copy in memory.
    copies: HashMap<u32, (u16, u64), BuildHasherDefault<PageHasher>>,
    fifo: VecDeque<(u32, u64)>,
    stamp: u64,
    bytes: usize,
    /// Most bytes in memory (`None`: no limit, the store is beside the budget).
    cap: Option<usize>,
}

impl StoreModel {
    fn put(&mut self, slot: usize, size: u16) {
        self.stamp += 1;
        if let Some((old, _)) = self.copies.insert(slot as u32, (size, self.stamp)) {
            self.bytes -= old as usize;
        }
        self.fifo.push_back((slot as u32, self.stamp));
        self.bytes += size as usize;
    }

    fn take(&mut self, slot: usize) -> bool {
        match self.copies.remove(&(slot as u32)) {
            Some((size, _)) => {
                self.bytes -= size as usize;
                true
            }
            None => false,
        }
    }

    fn contains(&self, slot: usize) -> bool {
        self.copies.contains_key(&(slot as u32))
    }

    /// The oldest copies beyond the cap go to the backing store: their
    /// slots, for the caller to mark.
    fn spill(&mut self, out: &mut Vec<usize>) {
        let Some(cap) = self.cap else { return };
        while self.bytes > cap {
            let Some((s, st)) = self.fifo.pop_front() else { break };
            if self.copies.get(&s).is_some_and(|&(_, cur)| cur == st) {
                let (size, _) = self.copies.remove(&s).expect("just seen");
                self.bytes -= size as usize;
                out.push(s as usize);
            }
        }
        if self.fifo.len() > 4 * self.copies.len() + 64 {
            let copies = &self.copies;
            self.fifo.retain(|(s, st)| copies.get(s).is_some_and(|&(_, cur)| cur == *st));
        }
    }
}

/// The background evictor's batch in flight.
struct Flight {
    /// Its victims (EVICTING, or RESIDENT | TAKEN once taken back).
    pages: Vec<usize>,
    /// When it was taken.
    taken_at: f64,
    /// When its protections were made (from then on a write takes a
    /// victim back) and when it is sealed and committed.
    protected_at: Option<(f64, f64)>,
}

/// The model of one pager over a layout.
struct Pager<'a> {
    state: Vec<u8>,
    /// Compressed size of each page's content (its latest record, else
    /// the trace's mean).
    size: Vec<u16>,
    /// Whether a page's size comes from a record of its own.
    sized: Vec<bool>,
    repl: Box<dyn Replacement>,
    prefetch: Box<dyn Prefetch>,
    sizing: Option<Split>,
    store: StoreModel,
    verify: bool,
    /// The background evictor runs ([`PagerOptions::background`]).
    background: bool,
    resident: usize,
    /// Resident pages allowed now.
    budget: usize,
    /// The budget given (with a sizing policy: resident and store).
    cap: usize,
    counts: &'a mut Counts,
    spilled: Vec<usize>,
    target_sum: f64,
    misses: u64,
    pipeline: Option<Pipeline>,
    /// The program's clock, ns (with the pipeline).
    clock: f64,
    flight: Option<Flight>,
    /// The page-ins and take-backs, when asked for ([`replay_logged`]).
    log: Option<Vec<LogRow>>,
}

/// What a logged replay saw happen ([`replay_logged`]), as `ztier run
/// --fault-log` rows: a page-in or a take-back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogKind {
    /// A fault served from the store.
    Store,
    /// A fault that installed zeros.
    Zero,
    /// A write that took a victim of the batch in flight back.
    TakenBack,
}

/// One row of a logged replay.
#[derive(Clone, Copy, Debug)]
pub struct LogRow {
    /// References replayed before it.
    pub reference: u64,
    /// The program's clock (the pipeline's), ns; 0 without the pipeline.
    pub clock_ns: f64,
    /// What happened.
    pub kind: LogKind,
    /// The trace's page number of the faulting (or taken back) page.
    pub page: u64,
    /// Pages installed (1 for a take-back).
    pub pages: usize,
}

impl Pager<'_> {
    /// Logs a row (its page as a slot: [`replay_logged`] maps it).
    fn log(&mut self, kind: LogKind, slot: usize, pages: usize) {
        if let Some(l) = &mut self.log {
            l.push(LogRow {
                reference: self.counts.references,
                clock_ns: self.clock,
                kind,
                page: slot as u64,
                pages,
            });
        }
    }

    fn limit(&self) -> usize {
        self.budget
    }

    /// A reference to slot `i` that is not resident.
    fn fault(&mut self, i: usize) {
        // The fault service makes the protections of a batch waiting for
        // them (after serving this fault).
        if let Some(pl) = self.pipeline {
            let at = self.clock + pl.fault_ns;
            self.protect(at);
            self.clock = at;
        }
        let walk = self.prefetch.fault(i);
        self.counts.faults += 1;
        match self.state[i] & STATE {
            STORED => {
                let d = self.repl.refault(i).distance;
                if let Some(s) = &mut self.sizing {
                    let (store, budget) = (&self.store, self.budget);
                    if let Some(t) = s.fault(budget, d, || store.contains(i)) {
                        self.resized(t);
                    }
                }
                let lim = self.inline_room(self.prefetch.store_run(walk).min(MAX_STORE_RUN));
                let mut n = 1;
                while n < lim && i + n < self.state.len() && self.state[i + n] & STATE == STORED {
                    n += 1;
                }
                let keep = self.verify && !self.repl.stays_long(i);
                let from_disk = self.state[i] & SPILLED != 0;
                for k in i..i + n {
                    self.counts.decompressions += 1;
                    let spilled = self.state[k] & SPILLED != 0;
                    // A copy kept stays in the store (in memory, or spilled).
                    if !keep {
                        self.store.take(k);
                    }
                    let flags = self.state[k] & DATA;
                    let clean = if keep && !spilled { CLEAN } else { 0 };
                    self.state[k] = flags | clean | ABSENT;
                }
                if from_disk {
                    self.counts.disk_faults += 1;
                } else {
                    self.counts.compressed_hits += 1;
                }
                self.make_room(n);
                for k in i..i + n {
                    self.install(k);
                }
                self.repl.refault_done();
                self.counts.store_faults += 1;
                self.log(LogKind::Store, i, n);
                self.counts.prefetched += n as u64 - 1;
                if walk.lone() {
                    self.counts.lone_faults += 1;
                }
                self.prefetch.ran_to(i + n - 1);
            }
            _ => {
                let lim = self.inline_room(self.prefetch.zero_run().min(ZERO_RUN));
                let mut n = 1;
                while n < lim && i + n < self.state.len() && self.state[i + n] & STATE == ABSENT {
                    n += 1;
                }
                self.make_room(n);
                for k in i..i + n {
                    self.install(k);
                }
                self.counts.zero_faults += 1;
                self.log(LogKind::Zero, i, n);
            }
        }
        self.background();
    }

    fn install(&mut self, k: usize) {
        self.state[k] = (self.state[k] & !STATE) | RESIDENT;
        self.repl.resident(k);
        self.resident += 1;
    }

    fn resized(&mut self, t: usize) {
        let total = self.sizing.as_ref().map_or(self.cap, Split::total);
        self.budget = total - t;
        self.repl.set_budget(self.budget);
        self.store.cap = Some(t * 4096);
        self.spill();
    }

    fn spill(&mut self) {
        let mut out = std::mem::take(&mut self.spilled);
        self.store.spill(&mut out);
        for &s in &out {
            self.state[s] |= SPILLED;
            self.state[s] &= !CLEAN;
        }
        out.clear();
        self.spilled = out;
    }

    /// The manager's `inline_room`: of a run of `lim` pages, those that
    /// fit under the budget now, or [`INLINE_RUN`] (at least 1).
    fn inline_room(&self, lim: usize) -> usize {
        lim.min(self.limit().saturating_sub(self.resident).max(INLINE_RUN)).max(1)
    }

    /// The manager's `make_room`: evicts at once if `n` more pages would
    /// go over the budget, what they need and [`INLINE_LEAST`] at least.
    fn make_room(&mut self, n: usize) {
        if self.resident + n > self.limit() {
            let target = self.limit().saturating_sub(n).min(self.resident.saturating_sub(INLINE_LEAST));
            let before = self.resident;
            while self.resident > target && self.evict(EVICT_BATCH, target) {}
            self.counts.evicted_inline += (before - self.resident) as u64;
        }
    }

    /// The background evictor, woken above budget − reserve/2: down to
    /// budget − reserve.
    fn background(&mut self) {
        if !self.background {
            return;
        }
        let reserve = reserve_of(self.limit());
        if self.resident > self.limit() - reserve / 2 {
            if self.pipeline.is_some() {
                self.take_batch();
                return;
            }
            let target = self.limit() - reserve;
            while self.evict(BACKGROUND_BATCH, target) {}
        }
    }

    /// The run library's `take_background_victims`: a batch of up to
    /// [`BACKGROUND_BATCH`] victims towards budget − reserve, none while
    /// one is in flight (one evictor), and none of fewer than
    /// [`BACKGROUND_LEAST`] (at most half the reserve) while eviction is
    /// not wanted yet. Its victims stay in memory until the commit.
    fn take_batch(&mut self) {
        if self.flight.is_some() {
            return;
        }
        let limit = self.limit();
        let reserve = reserve_of(limit);
        let target = limit - reserve;
        let least = BACKGROUND_LEAST.min(reserve / 2);
        let wanted = self.resident > limit - reserve / 2;
        if !wanted && self.resident < target + least {
            return;
        }
        let mut pages = Vec::new();
        self.pick(BACKGROUND_BATCH, target, &mut pages);
        if pages.is_empty() {
            return;
        }
        self.flight = Some(Flight { pages, taken_at: self.clock, protected_at: None });
    }

    /// The batch in flight is write-protected at `at` (if it is not yet):
    /// from then on it is compressed, a victim after another.
    fn protect(&mut self, at: f64) {
        let Some(pl) = self.pipeline else { return };
        let Some(f) = &self.flight else { return };
        if f.protected_at.is_some() {
            return;
        }
        let at = at.max(f.taken_at);
        let n = f.pages.iter().filter(|&&i| self.state[i] & STATE == EVICTING && self.compresses(i)).count();
        if let Some(f) = &mut self.flight {
            f.protected_at = Some((at, at + n as f64 * pl.compress_ns));
        }
    }

    /// The program's clock moves `ns` on: a batch not protected within
    /// [`NEAR_WAIT_NS`] is protected by the evictor itself; a batch
    /// compressed is sealed and committed, and the evictor takes its next.
    fn advance(&mut self, ns: f64) {
        self.clock += ns;
        while let Some(f) = &self.flight {
            let taken_at = f.taken_at;
            match f.protected_at {
                None if self.clock >= taken_at + NEAR_WAIT_NS => self.protect(taken_at + NEAR_WAIT_NS),
                Some((_, sealed)) if self.clock >= sealed => {
                    self.commit();
                    self.take_batch();
                    if let Some(f) = &mut self.flight {
                        f.taken_at = sealed;
                    }
                }
                _ => break,
            }
        }
    }

    /// The batch in flight is committed: its victims leave memory, those
    /// taken back are queued again.
    fn commit(&mut self) {
        let Some(f) = self.flight.take() else { return };
        for &i in &f.pages {
            let s = self.state[i];
            if s & TAKEN != 0 {
                self.state[i] = s & !TAKEN;
                self.repl.requeue(i);
            } else {
                self.out(i);
            }
        }
        self.spill();
    }

    /// A reference to victim `i` of the batch in flight: a write after
    /// its protection takes it back (the run library's `take_back`).
    fn touch_evicting(&mut self, i: usize, write: bool) {
        let protected = self.flight.as_ref().is_some_and(|f| f.protected_at.is_some());
        if !write || !protected {
            return;
        }
        let s = self.state[i];
        if s & CLEAN != 0 {
            self.store.take(i);
        }
        self.state[i] = (s & !(STATE | CLEAN)) | RESIDENT | TAKEN;
        self.counts.taken_back += 1;
        self.log(LogKind::TakenBack, i, 1);
    }

    /// Would evicting `i` compress it (not all zero, not an unwritten
    /// page whose stored copy was kept)?
    fn compresses(&self, i: usize) -> bool {
        let s = self.state[i];
        let zero = if self.sized[i] { self.size[i] == 0 } else { s & DATA == 0 };
        !(zero || (s & CLEAN != 0 && self.store.contains(i)))
    }

    /// One batch of up to `max` victims while more than `target` pages
    /// are resident; whether any was taken.
    fn evict(&mut self, max: usize, target: usize) -> bool {
        let mut pages = Vec::new();
        self.pick(max, target, &mut pages);
        let pipeline = self.pipeline;
        for &i in &pages {
            // Compressed inline: the program waits.
            if let Some(pl) = pipeline.filter(|_| self.compresses(i)) {
                self.clock += pl.compress_ns;
            }
            self.out(i);
        }
        if !pages.is_empty() {
            self.spill();
        }
        !pages.is_empty()
    }

    /// The run library's `take_victims`: up to `max` victims into
    /// `pages`, oldest first, each with the resident neighbours the
    /// replacement lets go along, while more than `target` pages (and
    /// those taken) are resident — the policy crate's loop
    /// ([`ztier_policy::pick`]) over [`Model`]'s verdicts. The victims are
    /// marked EVICTING (still counted resident): the caller evicts them
    /// or puts them in flight.
    fn pick(&mut self, max: usize, target: usize, pages: &mut Vec<usize>) {
        let want = max.min(self.resident.saturating_sub(target));
        pick(&mut *self.repl, &mut Model(&mut self.state), want, pages);
    }

    /// The program released page `i` (`munmap`, which the run library
    /// serves by dropping the page and its stored copy): out of memory
    /// and the store, its next touch a zero fault; a victim of the batch
    /// in flight leaves the batch.
    fn release(&mut self, i: usize) {
        let s = self.state[i];
        match s & STATE {
            RESIDENT | EVICTING => {
                if let Some(f) = &mut self.flight {
                    f.pages.retain(|&p| p != i);
                }
                if s & CLEAN != 0 {
                    self.store.take(i);
                }
                self.resident -= 1;
                self.repl.released(i, true);
            }
            STORED => {
                self.store.take(i);
                self.repl.released(i, false);
            }
            _ => return,
        }
        self.state[i] = ABSENT;
        self.counts.released += 1;
    }

    /// Victim `i` leaves memory.
    fn out(&mut self, i: usize) {
        let s = self.state[i];
        self.resident -= 1;
        // Zero: its compression record says so, or it has none and was
        // never written.
        let zero = if self.sized[i] { self.size[i] == 0 } else { s & DATA == 0 };
        if zero {
            // All zero: nothing stored; its next touch is a zero fault.
            self.store.take(i);
            self.state[i] = (s & DATA) | ABSENT;
        } else if s & CLEAN != 0 && self.store.contains(i) {
            // Unwritten since it came back, its copy kept: just dropped.
            self.state[i] = (s & !(STATE | CLEAN)) | STORED;
        } else {
            self.counts.compressions += 1;
            if !self.sized[i] {
                self.counts.unsized_compressions += 1;
            }
            self.store.put(i, self.size[i]);
            self.state[i] = (s & !(STATE | CLEAN | SPILLED)) | STORED;
        }
        self.repl.evicted(i);
    }
}

/// One replay of `path` through a pager of `memory_pages` pages (resident
/// pages; with a sizing policy, resident pages and the store together)
/// under the fault-driven `spec`. Returns the counts and the references
/// per second achieved.
pub fn replay(
    path: &Path,
    summary: &TraceSummary,
    layout: &Layout,
    memory_pages: usize,
    spec: &Spec,
    costs: Costs,
    opts: PagerOptions,
) -> Result<(Counts, f64), SimError> {
    run_replay(path, summary, layout, memory_pages, spec, costs, opts, None).map(|(c, r, _)| (c, r))
}

/// [`replay`], with the rows of its page-ins and take-backs, in order
/// (to set beside a run's `--fault-log`).
pub fn replay_logged(
    path: &Path,
    summary: &TraceSummary,
    layout: &Layout,
    memory_pages: usize,
    spec: &Spec,
    costs: Costs,
    opts: PagerOptions,
) -> Result<(Counts, Vec<LogRow>), SimError> {
    let (c, _, mut log) =
        run_replay(path, summary, layout, memory_pages, spec, costs, opts, Some(Vec::new()))?;
    for r in &mut log {
        r.page = layout.page[r.page as usize];
    }
    Ok((c, log))
}

#[allow(clippy::too_many_arguments)]
fn run_replay(
    path: &Path,
    summary: &TraceSummary,
    layout: &Layout,
    memory_pages: usize,
    spec: &Spec,
    costs: Costs,
    opts: PagerOptions,
    log: Option<Vec<LogRow>>,
) -> Result<(Counts, f64, Vec<LogRow>), SimError> {
    // As the manager: a budget of at least two eviction batches.
    let m = memory_pages.max(EVICT_BATCH * 2);
    let slots = layout.slots();
    let Parts { replacement: repl, prefetch, sizing } =
        spec.parts(m, vec![0u8; slots], vec![0u32; slots], opts.prefetch, costs).map_err(SimError::Policy)?;
    let mut state = vec![ABSENT; slots];
    for (s, &p) in layout.page.iter().enumerate() {
        if p == u64::MAX {
            state[s] = GAP_SLOT;
        }
    }
    let mut counts = Counts::default();
    let mut seen = vec![false; slots];
    let mut p = Pager {
        state,
        size: vec![summary.mean_size; slots],
        sized: vec![false; slots],
        repl,
        prefetch,
        sizing,
        store: StoreModel {
            copies: HashMap::default(),
            fifo: VecDeque::new(),
            stamp: 0,
            bytes: 0,
            cap: None,
        },
        verify: opts.verify,
        background: opts.background,
        resident: 0,
        budget: m,
        cap: m,
        counts: &mut counts,
        spilled: Vec::new(),
        target_sum: 0.0,
        misses: 0,
        pipeline: opts.pipeline,
        clock: 0.0,
        flight: None,
        log,
    };
    if let Some(t) = p.sizing.as_mut().and_then(|s| s.apply(true)) {
        p.resized(t);
    }
    let col = summary.column;
    let mut t = TraceReader::new(BufReader::with_capacity(1 << 20, File::open(path)?))?;
    let start = Instant::now();
    while let Some(e) = t.next_event()? {
        let (page, write) = match e {
            Event::Sizes { page, sizes } => {
                if let Some(&i) = layout.slot.get(&page) {
                    p.size[i as usize] = sizes[col];
                    p.sized[i as usize] = true;
                }
                continue;
            }
            Event::Unmanaged { .. } => continue,
            Event::Released { page } => {
                if let Some(&i) = layout.slot.get(&page) {
                    p.release(i as usize);
                }
                continue;
            }
            Event::Ref { page, write } => (page, write),
        };
        p.counts.references += 1;
        if let Some(pl) = p.pipeline {
            p.advance(pl.ref_ns);
        }
        // Memory the library does not manage is not the pager's: its
        // references are neither hits nor faults here.
        let Some(&i) = layout.slot.get(&page) else { continue };
        let i = i as usize;
        if !seen[i] {
            // A first reference is compulsory, a disk fault in every
            // model (here, whether a zero run brought the page in or not).
            seen[i] = true;
            p.counts.disk_faults += 1;
        }
        let st = p.state[i] & STATE;
        if st == EVICTING {
            // Still in memory: a hit, but a write may take it back.
            p.touch_evicting(i, write);
        } else if st != RESIDENT {
            p.fault(i);
            p.misses += 1;
            p.target_sum += p.sizing.as_ref().map_or(0, Split::store_pages) as f64;
        }
        if write {
            p.state[i] = (p.state[i] | DATA) & !CLEAN;
        }
    }
    // What is in flight at the end is not counted: the program is gone.
    let secs = start.elapsed().as_secs_f64();
    let (misses, target_sum) = (p.misses, p.target_sum);
    let log = p.log.take().unwrap_or_default();
    drop(p);
    counts.mean_target_pages = if misses == 0 { 0.0 } else { target_sum / misses as f64 };
    Ok((counts.clone(), counts.references as f64 / secs.max(1e-9), log))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::summarize;
    use crate::trace::{CodecColumn, TraceWriter};
    use ztier_codec::CodecId;

    /// A trace of `refs` (page, write), every page sized `size` at its
    /// first reference (`None`: no records, pages of zeros unless written).
    fn write_trace(path: &Path, refs: &[(u64, bool)], size: Option<u16>) {
        let cols = [CodecColumn { codec: CodecId::Lz4, compress_ns: 10_000, decompress_ns: 2_000 }];
        let mut w = TraceWriter::new(std::io::BufWriter::new(File::create(path).unwrap()), &cols).unwrap();
        let mut seen = std::collections::HashSet::new();
        // The summary needs a record; one for a page never referenced.
        w.sizes(1 << 40, &[1024]).unwrap();
        for &(p, write) in refs {
            if let (true, Some(s)) = (seen.insert(p), size) {
                w.sizes(p, &[s]).unwrap();
            }
            w.reference(p, write).unwrap();
        }
        w.finish().unwrap();
    }

    fn costs() -> Costs {
        Costs { disk_ns: 5e6, compress_ns: 10_000.0, decompress_ns: 2_000.0 }
    }

    fn run(path: &Path, m: usize, policy: &str) -> Counts {
        let s = summarize(path, CodecId::Lz4).unwrap();
        let spec = Spec::parse(policy, ztier_policy::Frontend::Sim).unwrap();
        let layout = Layout::of_trace(path).unwrap();
        replay(path, &s, &layout, m, &spec, costs(), PagerOptions::default()).unwrap().0
    }

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ztier-pager-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_layout_keeps_neighbours_and_separates_stretches() {
        let l = Layout::of([100, 101, 110, 5000, 100]);
        let (a, b, c, d) = (l.slot[&100], l.slot[&101], l.slot[&110], l.slot[&5000]);
        assert_eq!((b - a, c - a), (1, 10), "one stretch: page numbers kept apart as they are");
        assert!(d as usize >= c as usize + ZERO_RUN + GAP, "another stretch after a gap");
        assert_eq!(l.slots(), (110 + ZERO_RUN - 100 + 1) + GAP + ZERO_RUN + 1);
        assert_eq!(l.page[d as usize - 1], u64::MAX);
    }

    /// The reason for the shipped replacement: a program that loops over
    /// more pages than the budget faults on every page of every pass under
    /// oldest-first eviction; with a protected segment most of the loop
    /// stays resident.
    #[test]
    fn a_loop_over_more_than_the_budget_keeps_most_of_it_resident_under_segmented() {
        let d = dir("loop");
        let path = d.join("loop.trace");
        // 12 passes over 1500 pages, every page written, under 1000 pages.
        let refs: Vec<(u64, bool)> = (0..12).flat_map(|_| (0..1500u64).map(|p| (p * 3, true))).collect();
        write_trace(&path, &refs, Some(1024));
        let seg = run(&path, 1000, "segmented+single");
        let fifo = run(&path, 1000, "fifo+single");
        assert!(fifo.store_faults > 11 * 1500 * 9 / 10, "{fifo:?}");
        assert!(seg.store_faults < fifo.store_faults / 2, "segmented {seg:?} vs fifo {fifo:?}");
        assert_eq!(seg.disk_faults, 1500, "first references only: the store is beside the budget");
        assert_eq!(seg.compressed_hits, seg.store_faults);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A walk over stored pages brings them back a prefetch's run at a
    /// time; pages never written were evicted as zeros and come back as
    /// zero faults, not from the store.
    #[test]
    fn walks_prefetch_and_unwritten_pages_come_back_as_zeros() {
        let d = dir("walk");
        let path = d.join("walk.trace");
        // Write 4096 adjacent pages, then read them all again twice.
        let mut refs: Vec<(u64, bool)> = (0..4096u64).map(|p| (p, true)).collect();
        for _ in 0..2 {
            refs.extend((0..4096u64).map(|p| (p, false)));
        }
        write_trace(&path, &refs, None);
        let walk = run(&path, 1024, "segmented+walk");
        let single = run(&path, 1024, "segmented+single");
        assert!(single.store_faults >= 4096, "{single:?}");
        assert!(walk.store_faults * 8 < single.store_faults, "walk {walk:?} vs single {single:?}");
        assert!(walk.prefetched > 4096, "{walk:?}");
        assert_eq!(walk.zero_faults * 16, 4096, "first touches in zero runs of 16: {walk:?}");
        // Never written: all zeros, nothing stored, every pass zero faults.
        let reads: Vec<(u64, bool)> = (0..3).flat_map(|_| (0..4096u64).map(|p| (p, false))).collect();
        write_trace(&path, &reads, None);
        let z = run(&path, 1024, "segmented+walk");
        assert_eq!((z.store_faults, z.compressions), (0, 0), "{z:?}");
        // (What is still resident of a pass when the next begins is hit.)
        assert!(z.zero_faults * 16 >= 3 * 4096 - 2 * 1024, "{z:?}");
        assert!(z.zero_faults * 16 < 3 * 4096, "{z:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The background evictor's batch in flight: its victims are still
    /// in memory, so a write takes one back (no fault: `taken_back`) and
    /// a read hits, where victims that left at once fault; once the batch
    /// is compressed and committed (3 ms of the program's clock later,
    /// past the protection's longest wait) they fault as before.
    #[test]
    fn victims_in_flight_are_taken_back_by_writes_and_hit_by_reads() {
        let d = dir("flight");
        let path = d.join("flight.trace");
        // 992 adjacent pages written under 1000 (62 zero runs of 16): the
        // evictor wakes above 968 and takes 40 victims (down to budget −
        // reserve, 936), nothing else is evicted; then every page is
        // touched again, `pause` references to a resident page later.
        let case = |pause: usize, write: bool| -> (Counts, Counts) {
            let mut refs: Vec<(u64, bool)> = (0..992u64).map(|p| (p, true)).collect();
            refs.extend(std::iter::repeat_n((991, false), pause));
            refs.extend((0..992u64).map(|p| (p, write)));
            write_trace(&path, &refs, Some(1024));
            let s = summarize(&path, CodecId::Lz4).unwrap();
            let spec = Spec::parse("shipped", ztier_policy::Frontend::Sim).unwrap();
            let layout = Layout::of_trace(&path).unwrap();
            let on = PagerOptions::default();
            let off = PagerOptions { pipeline: None, ..on };
            let run = |o| replay(&path, &s, &layout, 1000, &spec, costs(), o).unwrap().0;
            (run(on), run(off))
        };
        let (on, off) = case(0, true);
        assert_eq!(off.taken_back, 0, "{off:?}");
        assert!(off.store_faults >= 3, "40 victims gone at once, faulted back by walks: {off:?}");
        assert_eq!((on.taken_back, on.store_faults), (40, 0), "{on:?}");
        let (on, _) = case(0, false);
        assert_eq!((on.taken_back, on.store_faults), (0, 0), "reads of victims in flight hit: {on:?}");
        let (on, _) = case(3_000_000, true);
        assert_eq!(on.taken_back, 0, "committed before the writes: {on:?}");
        assert_eq!(on.compressions, 40, "{on:?}");
        assert!(on.store_faults >= 2, "the 40 come back from the store, by walks: {on:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Without the background evictor every eviction is a fault's,
    /// inline, what the fault needs (INLINE_LEAST pages at least; not
    /// down to budget less the reserve): nothing is in flight to take
    /// back. The logged replay's rows add up
    /// to its counts.
    #[test]
    fn without_the_background_evictor_faults_evict_inline() {
        let d = dir("inline");
        let path = d.join("inline.trace");
        // 8 passes over 1040 pages, every page written, under 1000 pages.
        let refs: Vec<(u64, bool)> = (0..8).flat_map(|_| (0..1040u64).map(|p| (p * 3, true))).collect();
        write_trace(&path, &refs, Some(1024));
        let s = summarize(&path, CodecId::Lz4).unwrap();
        let spec = Spec::parse("shipped", ztier_policy::Frontend::Sim).unwrap();
        let layout = Layout::of_trace(&path).unwrap();
        let on = PagerOptions::default();
        let off = PagerOptions { background: false, ..on };
        let (bg, log) = replay_logged(&path, &s, &layout, 1000, &spec, costs(), on).unwrap();
        let (inline, _) = replay_logged(&path, &s, &layout, 1000, &spec, costs(), off).unwrap();
        // Evicted inline: every page compressed, and the never-written
        // neighbours a zero run brought in (evicted as zeros).
        assert_eq!(inline.taken_back, 0, "{inline:?}");
        // (Down to a batch below the budget, 7000+ compressions: the
        // 32 pages less resident missed on every pass.)
        assert!(inline.evicted_inline >= inline.compressions && inline.compressions > 2500, "{inline:?}");
        assert!(bg.evicted_inline * 2 < inline.evicted_inline, "the evictor evicted most: {bg:?}");
        let count = |k: LogKind| log.iter().filter(|r| r.kind == k).count() as u64;
        assert_eq!(
            (count(LogKind::Store), count(LogKind::Zero), count(LogKind::TakenBack)),
            (bg.store_faults, bg.zero_faults, bg.taken_back)
        );
        assert!(log.windows(2).all(|w| w[0].reference <= w[1].reference));
        assert!(log.iter().all(|r| r.page % 3 == 0 && r.page < 3120), "trace pages: {:?}", &log[..3]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Pages the program released (`munmap`) leave memory and the store:
    /// touched again they are new (zero faults), not store faults, and
    /// while gone they take no room in the budget.
    #[test]
    fn released_pages_are_gone_from_memory_and_the_store() {
        let d = dir("release");
        let path = d.join("release.trace");
        let write = |release: bool| {
            let cols = [CodecColumn { codec: CodecId::Lz4, compress_ns: 10_000, decompress_ns: 2_000 }];
            let mut w =
                TraceWriter::new(std::io::BufWriter::new(File::create(&path).unwrap()), &cols).unwrap();
            for p in 0..1500u64 {
                w.sizes(p, &[1024]).unwrap();
                w.reference(p, true).unwrap();
            }
            if release {
                for p in 0..1500u64 {
                    w.released(p).unwrap();
                }
            }
            for p in 0..1500u64 {
                w.reference(p, true).unwrap();
            }
            w.finish().unwrap();
        };
        write(false);
        let kept = run(&path, 1000, "shipped");
        write(true);
        let gone = run(&path, 1000, "shipped");
        assert!(kept.store_faults > 0 && kept.released == 0, "{kept:?}");
        assert_eq!((gone.store_faults, gone.released), (0, 1500), "{gone:?}");
        assert!(gone.zero_faults > kept.zero_faults, "{gone:?} vs {kept:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// With a sizing policy the store holds its share only: a static
    /// split of 8 pages' worth of memory spills the rest, whose faults
    /// are disk faults.
    #[test]
    fn a_split_store_spills_what_its_share_cannot_hold() {
        let d = dir("split");
        let path = d.join("split.trace");
        let refs: Vec<(u64, bool)> = (0..6).flat_map(|_| (0..3000u64).map(|p| (p * 20, true))).collect();
        write_trace(&path, &refs, Some(2048));
        let beside = run(&path, 2048, "segmented+walk");
        let split = run(&path, 2048, "segmented+walk+static:0.25");
        assert_eq!(beside.disk_faults, 3000);
        assert!(split.disk_faults > 3000 && split.compressed_hits > 0, "{split:?}");
        assert!(split.mean_target_pages >= 512.0, "{split:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
