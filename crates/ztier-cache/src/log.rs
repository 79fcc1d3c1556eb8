//! The line store: compressed lines appended to segments, segments
//! written whole and used as a ring.
//!
//! This is ZBD's idea (blocks compressed one by one, packed into large
//! units written out of place, a table of where each one is) shaped for a
//! cache instead of a device: a cache may drop a block, so space comes
//! back by recycling a segment — the one LFS's cost-benefit rule picks
//! ([`Pick`]): much dead space, long unchanged — whose lines still cached
//! are copied forward when few, else only those hit since they were
//! written (second chance, as CLOCK gives), the others dropped. The table
//! of where lines are is the directory's 4-byte location per line; the
//! directory also counts the lines pointing into each segment.
//!
//! ```text
//!   free list ─► [open] → [writing] → [sealed] … [sealed]   (N segments)
//!   append: into the open segment's buffer (RAM); when full it is sealed
//!           (summary written, lines no longer cached marked dead) and
//!           written with one pwrite, read from its buffer until then
//!   recycle: a sealed segment is picked and its summary read; its lines
//!           still cached are copied to the open segment or dropped; it
//!           goes back to the free list
//! ```
//!
//! Segment states: free, open (in the buffer), writing (buffer kept for
//! readers), sealed (on the device).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use ztier_blk::backing::Backing;

use crate::dir::Directory;
use crate::format::{
    self, Entry, Form, ItemHeader, Superblock, BLOCK, ENTRY, ITEM_HEADER, MAX_ITEMS, SEG_HEADER,
};

/// Free segment.
pub const FREE: u8 = 0;
/// Open: being filled in RAM.
pub const OPEN: u8 = 1;
/// Sealed, being written.
pub const WRITING: u8 = 2;
/// On the device.
pub const SEALED: u8 = 3;

/// Segments kept free for copies made while recycling.
pub const RESERVE: u64 = 1;

struct Open {
    idx: u32,
    seq: u64,
    buf: Vec<u8>,
    entries: Vec<Entry>,
    back: usize,
    opened: Instant,
    logical: u64,
}

impl Open {
    fn fits(&self, span: usize) -> bool {
        self.entries.len() < MAX_ITEMS && self.back >= span + SEG_HEADER + (self.entries.len() + 1) * ENTRY
    }
}

struct State {
    open: Option<Open>,
    /// Segments not in use (state FREE).
    free: u64,
    /// Where the search for a free segment starts next.
    next_free: u32,
    next_seq: u64,
    /// A recycle is copying lines forward (see [`Log::recycling`]).
    recycling: bool,
}

/// Which sealed segment recycling takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pick {
    /// The oldest (lowest seq): a FIFO ring, the choice before [`Pick::CostBenefit`].
    Oldest,
    /// The one with the most dead space (fewest of its items still
    /// cached, as a share); the oldest among equals.
    Greedy,
    /// LFS's cost-benefit: the most (1 − u) × age / (1 + u), u the share
    /// of its items still cached, age in segments written since it was;
    /// the oldest when no segment has dead space.
    CostBenefit,
}

impl std::str::FromStr for Pick {
    type Err = String;
    fn from_str(s: &str) -> Result<Pick, String> {
        match s {
            "oldest" => Ok(Pick::Oldest),
            "greedy" => Ok(Pick::Greedy),
            "cost-benefit" => Ok(Pick::CostBenefit),
            _ => Err(format!("unknown recycling choice '{s}' (oldest, greedy, cost-benefit)")),
        }
    }
}

/// Segments looked at for each choice (a window that moves on each
/// time, over larger caches).
const PICK_WINDOW: u32 = 4096;

/// An item to append.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// Backing block.
    pub lba: u64,
    /// Generation (a copy keeps its original's).
    pub gen: u64,
    /// Form.
    pub form: Form,
    /// Codec tag.
    pub codec: u8,
    /// Data.
    pub data: &'a [u8],
}

/// The tail segment's contents, to recycle.
pub struct Tail {
    /// Its seq.
    pub seq: u64,
    /// Its summary.
    pub entries: Vec<Entry>,
    /// The whole segment.
    pub buf: Vec<u8>,
}

/// What reading an item found.
pub enum ItemRead {
    /// The item (checked): its header, and its bytes (the data from
    /// [`ITEM_HEADER`] on, `len` long).
    Found(ItemHeader, Vec<u8>),
    /// Not there (moved, dropped, or damaged).
    Gone,
    /// Reading it would wait for the device.
    WouldBlock,
}

/// A sealed segment to write (by whoever sealed it, outside every lock).
pub struct Sealed {
    idx: u32,
    buf: Arc<Vec<u8>>,
}

/// Per-segment accounting (set when sealed, cleared when recycled).
#[derive(Default)]
struct SegAcct {
    items: AtomicU16,
    span: AtomicU32,
}

/// Counters.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct LogStats {
    /// Segments in the ring.
    pub segments: u64,
    /// Segments in use (sealed, writing or open).
    pub used_segments: u64,
    /// Segments written.
    pub sealed: u64,
    /// Segments recycled.
    pub recycled: u64,
    /// Lines copied forward when their segment was recycled.
    pub reinserted: u64,
    /// Lines dropped when their segment was recycled.
    pub capacity_evictions: u64,
    /// Segment writes that failed.
    pub write_errors: u64,
    /// Reads of items that failed (I/O).
    pub read_errors: u64,
    /// Items on the device and in buffers (live or not).
    pub items: u64,
    /// Their uncompressed bytes.
    pub logical_bytes: u64,
    /// Bytes they take (headers, data, alignment).
    pub stored_bytes: u64,
}

/// The line store.
pub struct Log {
    dev: Arc<dyn Backing>,
    sb: Superblock,
    st: Mutex<State>,
    state: Box<[AtomicU8]>,
    seqs: Box<[AtomicU64]>,
    acct: Box<[SegAcct]>,
    writing: Mutex<HashMap<u32, Arc<Vec<u8>>>>,
    writes_in_flight: Mutex<usize>,
    writes_done: Condvar,
    /// Where the next choice's window starts.
    cursor: AtomicU32,
    sealed: AtomicU64,
    recycled: AtomicU64,
    reinserted: AtomicU64,
    evicted: AtomicU64,
    write_errors: AtomicU64,
    read_errors: AtomicU64,
    /// Wakes the maintenance thread when free segments run low.
    pub low: Condvar,
    /// Paired with `low`.
    pub low_lock: Mutex<()>,
}

/// What recovery found in one segment.
pub struct Found {
    /// Segment index.
    pub idx: u32,
    /// Its seq.
    pub seq: u64,
    /// Its summary.
    pub entries: Vec<Entry>,
}

impl Log {
    /// A log over `dev`; `found` are the valid segments recovery read (the
    /// others are free). Appends continue after the newest one.
    pub fn new(dev: Arc<dyn Backing>, sb: &Superblock, found: &[Found]) -> Log {
        let n = sb.segments as usize;
        let state: Box<[AtomicU8]> = (0..n).map(|_| AtomicU8::new(FREE)).collect();
        let seqs: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let acct: Box<[SegAcct]> = (0..n).map(|_| SegAcct::default()).collect();
        let mut newest: Option<u64> = None;
        for f in found {
            state[f.idx as usize].store(SEALED, Ordering::Relaxed);
            seqs[f.idx as usize].store(f.seq, Ordering::Relaxed);
            let a = &acct[f.idx as usize];
            a.items.store(f.entries.len() as u16, Ordering::Relaxed);
            a.span.store(
                f.entries.iter().map(|e| format::item_span(e.len as usize, sb.loc_unit) as u32).sum(),
                Ordering::Relaxed,
            );
            if newest.is_none_or(|s| f.seq > s) {
                newest = Some(f.seq);
            }
        }
        // Appends continue after the newest segment; the others found
        // are sealed, the rest free.
        let next_seq = newest.map_or(1, |s| s + 1);
        let free = (n - found.len()) as u64;
        Log {
            dev,
            sb: *sb,
            st: Mutex::new(State { open: None, free, next_free: 0, next_seq, recycling: false }),
            state,
            seqs,
            acct,
            writing: Mutex::new(HashMap::new()),
            writes_in_flight: Mutex::new(0),
            writes_done: Condvar::new(),
            cursor: AtomicU32::new(0),
            sealed: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            reinserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            low: Condvar::new(),
            low_lock: Mutex::new(()),
        }
    }

    fn n(&self) -> u64 {
        self.sb.segments as u64
    }

    /// Free segments now.
    pub fn free(&self) -> u64 {
        self.st.lock().free
    }

    /// Free segments below which recycling starts.
    pub fn low_mark(&self) -> u64 {
        (self.n() / 64).clamp(2, 64).min(self.n() / 2)
    }

    /// The next segment seq (segments below it are sealed or open now).
    pub fn next_seq(&self) -> u64 {
        self.st.lock().next_seq
    }

    fn loc_of(&self, idx: u32, off: usize) -> u32 {
        idx * self.sb.units_per_segment() + (off / self.sb.loc_unit as usize) as u32
    }

    /// Segment index and byte offset of a location.
    pub fn split(&self, loc: u32) -> (u32, usize) {
        let ups = self.sb.units_per_segment();
        (loc / ups, (loc % ups) as usize * self.sb.loc_unit as usize)
    }

    /// Appends an item for `lba` and calls `place` with its location
    /// under the log's lock, where the caller points the item's line at
    /// it: a seal (which marks dead every item no line points to) never
    /// runs between the two. Returns what `place` returned, or `None`
    /// when no segment is free (`reserve`: may take the last ones, for
    /// copies made while recycling); and a sealed segment the caller
    /// must [`Log::write`] (after releasing its locks).
    pub fn append<R>(
        &self,
        dir: &Directory,
        it: Item<'_>,
        reserve: bool,
        place: impl FnOnce(u32) -> R,
    ) -> (Option<R>, Option<Sealed>) {
        let Item { lba, gen, form, codec, data } = it;
        let span = format::item_span(data.len(), self.sb.loc_unit);
        let mut st = self.st.lock();
        // While a recycle copies lines forward with the reserve all that
        // is free, the open segment's room is its: another append taking
        // it could leave a dirty copy nowhere to go.
        if !reserve && st.recycling && st.free <= RESERVE {
            drop(st);
            self.low.notify_all();
            return (None, None);
        }
        let mut sealed = None;
        if st.open.as_ref().is_some_and(|o| !o.fits(span)) {
            let o = st.open.take().expect("checked");
            sealed = Some(self.seal(o, dir));
        }
        if st.open.is_none() {
            let free = st.free;
            let keep = if reserve { 0 } else { RESERVE };
            if free <= keep {
                drop(st);
                self.low.notify_all();
                return (None, sealed);
            }
            // The next free segment after the last one taken (a free list
            // would cost 4 bytes of RAM per segment; free segments are
            // about 1 in 64 when the cache is full, so this looks at
            // about 64 states).
            let n = self.sb.segments;
            let idx = (0..n)
                .map(|k| (st.next_free + k) % n)
                .find(|&i| self.state[i as usize].load(Ordering::Acquire) == FREE)
                .expect("a free segment counted");
            st.next_free = (idx + 1) % n;
            st.free -= 1;
            let seq = st.next_seq;
            st.next_seq += 1;
            self.seqs[idx as usize].store(seq, Ordering::Release);
            self.state[idx as usize].store(OPEN, Ordering::Release);
            let ss = self.sb.segment_size as usize;
            st.open = Some(Open {
                idx,
                seq,
                buf: vec![0u8; ss],
                entries: Vec::new(),
                back: ss,
                opened: Instant::now(),
                logical: 0,
            });
            if free - 1 < self.low_mark() {
                self.low.notify_all();
            }
        }
        let o = st.open.as_mut().expect("opened above");
        o.back -= span;
        let off = o.back;
        format::put_item(&mut o.buf[off..], o.seq, lba, form, codec, data);
        o.entries.push(Entry {
            lba,
            gen,
            off: off as u32,
            len: data.len() as u16,
            form,
            dead: false,
            dirty: false,
        });
        o.logical += BLOCK as u64;
        let loc = self.loc_of(o.idx, off);
        (Some(place(loc)), sealed)
    }

    /// Seals `o`: marks dead the lines the directory no longer points to,
    /// writes the summary and header, and moves it to writing.
    fn seal(&self, mut o: Open, dir: &Directory) -> Sealed {
        for (i, e) in o.entries.iter_mut().enumerate() {
            let loc = self.loc_of(o.idx, e.off as usize);
            let line = dir.find_at(e.lba, loc);
            e.dead = line.is_none();
            e.dirty = line.is_some_and(|l| dir.is_dirty(l));
            e.put(&mut o.buf[SEG_HEADER + i * ENTRY..]);
        }
        format::seal_segment(&mut o.buf, o.entries.len(), o.seq, self.sb.uuid);
        let a = &self.acct[o.idx as usize];
        a.items.store(o.entries.len() as u16, Ordering::Relaxed);
        a.span.store((self.sb.segment_size as usize - o.back) as u32, Ordering::Relaxed);
        let buf = Arc::new(o.buf);
        self.writing.lock().insert(o.idx, buf.clone());
        *self.writes_in_flight.lock() += 1;
        self.state[o.idx as usize].store(WRITING, Ordering::Release);
        Sealed { idx: o.idx, buf }
    }

    /// Writes a sealed segment. On failure its lines are dropped from the
    /// directory (`drop_lines` is called for each) and it stays as it is
    /// on the device: its items fail their checks (the seq) until recycled.
    pub fn write(&self, s: Sealed, mut drop_lines: impl FnMut(u64, u32)) -> io::Result<()> {
        let r = self.dev.write_at(&s.buf, self.sb.segment_offset(s.idx));
        if r.is_err() {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
            if let Some((_, _, es)) = format::parse_summary(&s.buf, self.sb.segment_size) {
                for e in es {
                    drop_lines(e.lba, self.loc_of(s.idx, e.off as usize));
                }
            }
        }
        self.state[s.idx as usize].store(SEALED, Ordering::Release);
        self.writing.lock().remove(&s.idx);
        self.sealed.fetch_add(1, Ordering::Relaxed);
        let mut n = self.writes_in_flight.lock();
        *n -= 1;
        self.writes_done.notify_all();
        r
    }

    /// Seals the open segment if it holds anything (and is older than
    /// `age`, if given). Returns it to write.
    pub fn seal_open(&self, dir: &Directory, age: Option<Duration>) -> Option<Sealed> {
        let mut st = self.st.lock();
        let due = st
            .open
            .as_ref()
            .is_some_and(|o| !o.entries.is_empty() && age.is_none_or(|a| o.opened.elapsed() >= a));
        if !due {
            return None;
        }
        let o = st.open.take().expect("checked");
        Some(self.seal(o, dir))
    }

    /// Waits until no segment is being written.
    pub fn wait_writes(&self) {
        let mut n = self.writes_in_flight.lock();
        while *n > 0 {
            self.writes_done.wait(&mut n);
        }
    }

    /// Reads the item at `loc` and checks it: its checksum (with the
    /// segment's seq) and that it holds `lba`. With `nowait`, only if that
    /// needs no wait for the device.
    pub fn read_item(&self, loc: u32, lba: u64, nowait: bool) -> io::Result<ItemRead> {
        let (idx, off) = self.split(loc);
        if idx >= self.sb.segments {
            return Ok(ItemRead::Gone);
        }
        let ss = self.sb.segment_size as usize;
        let len = (ITEM_HEADER + BLOCK).min(ss - off);
        let mut b = vec![0u8; len];
        // A segment sealed (open → writing) or written (writing → sealed)
        // between the state's load and the copy is read again from where
        // it is now: the item is still there.
        let mut tries = 0;
        let seq = loop {
            tries += 1;
            let state = self.state[idx as usize].load(Ordering::Acquire);
            let seq = self.seqs[idx as usize].load(Ordering::Acquire);
            let moved_on = |now: u8| tries < 3 && self.state[idx as usize].load(Ordering::Acquire) == now;
            match state {
                OPEN => {
                    let st = self.st.lock();
                    match &st.open {
                        Some(o) if o.idx == idx => b.copy_from_slice(&o.buf[off..off + len]),
                        _ if moved_on(WRITING) || moved_on(SEALED) => continue,
                        _ => return Ok(ItemRead::Gone),
                    }
                }
                WRITING => match self.writing.lock().get(&idx) {
                    Some(buf) => b.copy_from_slice(&buf[off..off + len]),
                    None if moved_on(SEALED) => continue,
                    None => return Ok(ItemRead::Gone),
                },
                SEALED => {
                    let at = self.sb.segment_offset(idx) + off as u64;
                    let r = if nowait {
                        match self.dev.read_at_nowait(&mut b, at) {
                            Some(r) => r,
                            None => return Ok(ItemRead::WouldBlock),
                        }
                    } else {
                        self.dev.read_at(&mut b, at)
                    };
                    if let Err(e) = r {
                        self.read_errors.fetch_add(1, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                _ => return Ok(ItemRead::Gone),
            }
            break seq;
        };
        match format::get_item(&b, seq) {
            Ok((h, _)) if h.lba == lba => Ok(ItemRead::Found(h, b)),
            _ => Ok(ItemRead::Gone),
        }
    }

    /// The sealed segment `pick` chooses (`dir` counts the lines
    /// pointing into each), if any. Only one recycler at a time may call
    /// this (the segment stays sealed until [`Log::release`]).
    pub fn choose(&self, dir: &Directory, pick: Pick) -> Option<u32> {
        let n = self.sb.segments;
        let window = n.min(PICK_WINDOW);
        let start = if window == n { 0 } else { self.cursor.fetch_add(window, Ordering::Relaxed) % n };
        let next = self.st.lock().next_seq;
        // The highest (score, age) wins: age breaks ties, so with no dead
        // space anywhere every choice is the oldest.
        let mut best: Option<(f64, u64, u32)> = None;
        for k in 0..window {
            let idx = (start + k) % n;
            if self.state[idx as usize].load(Ordering::Acquire) != SEALED {
                continue;
            }
            let age = next.saturating_sub(self.seqs[idx as usize].load(Ordering::Acquire));
            let items = self.acct[idx as usize].items.load(Ordering::Relaxed) as u32;
            let u = if items == 0 { 0.0 } else { dir.live_in(idx).min(items) as f64 / items as f64 };
            let score = match pick {
                Pick::Oldest => 0.0,
                Pick::Greedy => 1.0 - u,
                Pick::CostBenefit => (1.0 - u) * age as f64 / (1.0 + u),
            };
            if best.is_none_or(|(s, a, _)| (score, age) > (s, a)) {
                best = Some((score, age, idx));
            }
        }
        best.map(|(_, _, idx)| idx)
    }

    /// Marks a recycle's copying as under way (`true`) or done: meanwhile,
    /// with no more than the reserve free, only appends with `reserve`
    /// (the recycle's copies) are placed, so that copies of one segment's
    /// lines always fit in the open segment's room and the reserve.
    pub fn recycling(&self, on: bool) {
        self.st.lock().recycling = on;
    }

    /// Reads sealed segment `idx`, chosen to recycle: its contents
    /// (`None` for an unreadable one, whose lines are simply gone).
    pub fn take(&self, idx: u32) -> Option<Tail> {
        debug_assert_eq!(self.state[idx as usize].load(Ordering::Acquire), SEALED);
        let seq = self.seqs[idx as usize].load(Ordering::Acquire);
        let mut buf = vec![0u8; self.sb.segment_size as usize];
        if self.dev.read_at(&mut buf, self.sb.segment_offset(idx)).is_err() {
            self.read_errors.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match format::parse_summary(&buf, self.sb.segment_size) {
            Some((s, uuid, entries)) if s == seq && uuid == self.sb.uuid => Some(Tail { seq, entries, buf }),
            _ => None,
        }
    }

    /// The location of entry `e` of segment `idx`.
    pub fn entry_loc(&self, idx: u32, e: &Entry) -> u32 {
        self.loc_of(idx, e.off as usize)
    }

    /// Counts a recycled line (copied forward or dropped).
    pub fn count_recycled_line(&self, reinserted: bool) {
        if reinserted {
            self.reinserted.fetch_add(1, Ordering::Relaxed);
        } else {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Returns a recycled segment (taken with [`Log::take`]) to the free ones.
    pub fn release(&self, idx: u32) {
        let mut st = self.st.lock();
        debug_assert_ne!(self.state[idx as usize].load(Ordering::Acquire), FREE);
        self.state[idx as usize].store(FREE, Ordering::Release);
        let a = &self.acct[idx as usize];
        a.items.store(0, Ordering::Relaxed);
        a.span.store(0, Ordering::Relaxed);
        st.free += 1;
        self.recycled.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes of RAM the log's tables take (not counting segment buffers).
    pub fn memory_bytes(&self) -> u64 {
        self.sb.segments as u64 * (1 + 8 + 2 + 4)
    }

    /// Counters.
    pub fn stats(&self) -> LogStats {
        let (used, open_items, open_logical, open_span) = {
            let st = self.st.lock();
            let o = st.open.as_ref();
            (
                self.n() - st.free,
                o.map_or(0, |o| o.entries.len() as u64),
                o.map_or(0, |o| o.logical),
                o.map_or(0, |o| (self.sb.segment_size as usize - o.back) as u64),
            )
        };
        let sum = |f: &dyn Fn(&SegAcct) -> u64| self.acct.iter().map(f).sum::<u64>();
        LogStats {
            segments: self.n(),
            used_segments: used,
            sealed: self.sealed.load(Ordering::Relaxed),
            recycled: self.recycled.load(Ordering::Relaxed),
            reinserted: self.reinserted.load(Ordering::Relaxed),
            capacity_evictions: self.evicted.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            read_errors: self.read_errors.load(Ordering::Relaxed),
            items: sum(&|a| a.items.load(Ordering::Relaxed) as u64) + open_items,
            logical_bytes: sum(&|a| a.items.load(Ordering::Relaxed) as u64 * BLOCK as u64) + open_logical,
            stored_bytes: sum(&|a| a.span.load(Ordering::Relaxed) as u64) + open_span,
        }
    }
}

/// Reads every segment's summary: the valid segments of cache `uuid`.
pub fn scan(dev: &dyn Backing, sb: &Superblock) -> io::Result<Vec<Found>> {
    let mut out = Vec::new();
    let mut head = vec![0u8; SEG_HEADER];
    for idx in 0..sb.segments {
        let at = sb.segment_offset(idx);
        dev.read_at(&mut head, at)?;
        let Some((count, _, uuid)) = format::peek_segment(&head) else { continue };
        if uuid != sb.uuid {
            continue;
        }
        let mut b = vec![0u8; format::summary_len(count)];
        dev.read_at(&mut b, at)?;
        if let Some((seq, _, entries)) = format::parse_summary(&b, sb.segment_size) {
            out.push(Found { idx, seq, entries });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Geometry, Placement, Policy};
    use ztier_blk::backing::CrashBacking;

    /// A 2 MiB cache of 16 KiB segments (three raw blocks each).
    fn small() -> Superblock {
        Geometry {
            size: 2 << 20,
            segment_size: 16 << 10,
            lines_per_block: 2.0,
            placement: Placement::Assoc,
            ways: 4,
            policy: Policy::Clock,
            codec: 0,
            journal_size: Some(64 << 10),
        }
        .superblock(7, 0)
        .unwrap()
    }

    /// A seal racing an append waits until the item's line points at it:
    /// the item is live in the summary. (Inserting the line after
    /// `append` returned let a seal in between mark the item dead; the
    /// segment's recycling then skipped its line, which was left pointing
    /// into the segment's next contents.)
    #[test]
    fn a_seal_racing_an_append_sees_the_items_line() {
        let sb = small();
        let log = Arc::new(Log::new(Arc::new(CrashBacking::new()), &sb, &[]));
        let dir = Arc::new(Directory::new(sb.lines, 4, Placement::Assoc, Policy::Clock));
        let data = vec![9u8; BLOCK];
        let it = |lba| Item { lba, gen: lba, form: Form::Raw, codec: 0, data: &data };
        // Block 1's line was dropped before the seal: dead.
        let (l1, _) = log.append(&dir, it(1), false, |loc| loc);
        assert!(l1.is_some());
        let (placed, _) = log.append(&dir, it(2), false, |loc| {
            let sealer = {
                let (log, dir) = (log.clone(), dir.clone());
                std::thread::spawn(move || log.seal_open(&dir, None))
            };
            // The sealer waits for the log's lock until the line is in.
            std::thread::sleep(Duration::from_millis(20));
            assert!(!sealer.is_finished(), "a seal ran while an item had no line yet");
            dir.insert(2, loc);
            sealer
        });
        let s = placed.unwrap().join().unwrap().expect("the open segment sealed");
        let (_, _, entries) = format::parse_summary(&s.buf, sb.segment_size).unwrap();
        let dead: Vec<(u64, bool)> = entries.iter().map(|e| (e.lba, e.dead)).collect();
        assert_eq!(dead, [(1, true), (2, false)]);
    }

    /// While a recycle copies lines forward with only the reserve free,
    /// an ordinary append is refused even where the open segment has
    /// room: that room is the copies'. (A fill taking it once left a
    /// recycled dirty block nowhere to go.)
    #[test]
    fn a_recycles_copies_keep_the_open_segments_room() {
        let sb = small();
        let log = Log::new(Arc::new(CrashBacking::new()), &sb, &[]);
        let dir = Directory::new(sb.lines, 4, Placement::Assoc, Policy::Clock);
        let data = vec![9u8; BLOCK];
        let it = |lba| Item { lba, gen: lba, form: Form::Raw, codec: 0, data: &data };
        let mut lba = 0;
        while log.append(&dir, it(lba), false, |loc| loc).0.is_some() {
            lba += 1;
        }
        assert_eq!(log.free(), RESERVE, "ordinary appends stop at the reserve");
        log.recycling(true);
        assert!(log.append(&dir, it(lba), true, |loc| loc).0.is_some(), "a copy takes the reserve");
        assert_eq!(log.free(), 0);
        assert!(log.append(&dir, it(lba + 1), false, |loc| loc).0.is_none(), "a fill took the copies' room");
        log.recycling(false);
        assert!(
            log.append(&dir, it(lba + 1), false, |loc| loc).0.is_some(),
            "the open segment's room refused after"
        );
    }
}
