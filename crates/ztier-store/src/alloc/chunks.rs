//! Chunks, as in CCache (Briglia et al., 2007).
//!
//! Memory is taken one page at a time. A compressed page is stored as one or
//! more variable-size *chunks*; a chunk never crosses a page boundary, so a
//! compressed page may be spread over several pages, and a page may hold
//! chunks of several compressed pages:
//!
//! ```text
//!   page 7                                  page 9
//! +---------+---------------+------+      +-----------+---------------+
//! | X.0     | Y.0 (1900 B)  | free |      | X.1       | free          |
//! | (2200 B)|               | 0 B  |      | (900 B)   | (3196 B)      |
//! +---------+---------------+------+      +-----------+---------------+
//!  X = [(7, 0, 2200), (9, 0, 900)]    Y = [(7, 2200, 1900)]
//! ```
//!
//! * Allocation takes the smallest free extent that holds the whole page;
//!   if none does, the largest free extents are used, in pieces, and new
//!   pages are taken only for what is left.
//! * Freeing returns each chunk to its page's free list, merging it with
//!   free neighbours; a page with nothing left in it is released.
//! * [`Allocator::compact`] (used when the budget shrinks) re-places the
//!   data of the sparsest pages elsewhere so they can be released.
//!
//! Metadata: 8 bytes per chunk plus ~40 bytes per compressed page, and a
//! free list per page. It is counted as a function of what is stored, so
//! that freeing never makes it grow and undoing a put gives back all it
//! took (a store at its budget must not end over it): free extents are
//! charged at the most the free space can be split into (one per chunk
//! and one per page), the page and record tables by their slots (free
//! slots at their ends are dropped), not by their capacity; compaction
//! moves a record only whole, and a round that cannot move them all is
//! undone.

use std::collections::BTreeSet;

use super::{Allocator, Loc, Moved};

const PAGE: usize = 4096;
/// Free extents smaller than this are not used for new chunks (they would
/// cost more metadata than they hold); they still merge when neighbours
/// are freed.
pub const MIN_CHUNK: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Chunk {
    page: u32,
    off: u16,
    len: u16,
}

struct Page {
    buf: Vec<u8>,
    /// Free extents (offset, length), sorted by offset, never adjacent.
    free: Vec<(u16, u16)>,
    used: usize,
}

/// One stored page's chunks. The record's number is its location, which
/// stays the same when compaction moves the chunks, so no owner is kept.
struct Record {
    chunks: Vec<Chunk>,
}

/// The chunks allocator.
pub struct Chunks {
    pages: Vec<Option<Page>>,
    page_holes: Vec<usize>,
    records: Vec<Option<Record>>,
    record_holes: Vec<usize>,
    /// Usable free extents: (length, page, offset).
    extents: BTreeSet<(u16, u32, u16)>,
    /// Pages being emptied by compaction: never allocated from.
    draining: Option<usize>,
    data_bytes: usize,
    chunk_count: usize,
}

impl Default for Chunks {
    fn default() -> Self {
        Self::new()
    }
}

impl Chunks {
    /// An empty allocator.
    pub fn new() -> Self {
        Chunks {
            pages: Vec::new(),
            page_holes: Vec::new(),
            records: Vec::new(),
            record_holes: Vec::new(),
            extents: BTreeSet::new(),
            draining: None,
            data_bytes: 0,
            chunk_count: 0,
        }
    }

    fn index_extent(&mut self, page: usize, off: u16, len: u16) {
        if len as usize >= MIN_CHUNK && self.draining != Some(page) {
            self.extents.insert((len, page as u32, off));
        }
    }

    fn new_page(&mut self) -> usize {
        let p = Page { buf: vec![0u8; PAGE], free: vec![(0, PAGE as u16)], used: 0 };
        let i = match self.page_holes.pop() {
            Some(h) => {
                self.pages[h] = Some(p);
                h
            }
            None => {
                self.pages.push(Some(p));
                self.pages.len() - 1
            }
        };
        self.data_bytes += PAGE;
        self.extents.insert((PAGE as u16, i as u32, 0));
        i
    }

    /// Takes `len` bytes from the start of the free extent (page, off).
    fn carve(&mut self, page: usize, off: u16, len: usize) -> Chunk {
        let p = self.pages[page].as_mut().expect("page");
        let k = p.free.binary_search_by_key(&off, |e| e.0).expect("extent");
        let (_, elen) = p.free[k];
        self.extents.remove(&(elen, page as u32, off));
        p.used += len;
        if elen as usize == len {
            p.free.remove(k);
        } else {
            let rest = (off + len as u16, elen - len as u16);
            p.free[k] = rest;
            self.index_extent(page, rest.0, rest.1);
        }
        self.chunk_count += 1;
        Chunk { page: page as u32, off, len: len as u16 }
    }

    /// Returns a chunk to its page, merging free neighbours; releases the
    /// page if it becomes empty.
    fn give_back(&mut self, c: Chunk) {
        let page = c.page as usize;
        let p = self.pages[page].as_mut().expect("page");
        p.used -= c.len as usize;
        self.chunk_count -= 1;
        let k = p.free.partition_point(|e| e.0 < c.off);
        let (mut off, mut len) = (c.off, c.len);
        let mut drop = Vec::new();
        if k > 0 && p.free[k - 1].0 + p.free[k - 1].1 == off {
            let prev = p.free[k - 1];
            drop.push(prev);
            off = prev.0;
            len += prev.1;
        }
        if k < p.free.len() && c.off + c.len == p.free[k].0 {
            let next = p.free[k];
            drop.push(next);
            len += next.1;
        }
        for e in &drop {
            self.extents.remove(&(e.1, page as u32, e.0));
        }
        p.free.retain(|e| !drop.contains(e));
        let k = p.free.partition_point(|e| e.0 < off);
        p.free.insert(k, (off, len));
        if p.used == 0 {
            self.extents.remove(&(len, page as u32, off));
            self.pages[page] = None;
            self.page_holes.push(page);
            self.data_bytes -= PAGE;
            trim_tail(&mut self.pages, &mut self.page_holes);
        } else {
            self.index_extent(page, off, len);
        }
    }

    /// Places `data` in the smallest free extent that holds it all.
    fn place_whole(&mut self, data: &[u8]) -> Option<Chunk> {
        let &(_, page, off) = self.extents.range((data.len() as u16, 0, 0)..).next()?;
        let c = self.carve(page as usize, off, data.len());
        let p = self.pages[page as usize].as_mut().expect("page");
        p.buf[off as usize..off as usize + data.len()].copy_from_slice(data);
        Some(c)
    }

    fn place(&mut self, data: &[u8], limit: usize) -> Option<Vec<Chunk>> {
        // One extent that holds it all: the smallest such.
        if let Some(c) = self.place_whole(data) {
            return Some(vec![c]);
        }
        // Largest extents first, new pages for the rest.
        let len = data.len();
        let free_total: usize = self.extents.iter().map(|e| e.0 as usize).sum();
        let need_pages = len.saturating_sub(free_total).div_ceil(PAGE);
        if need_pages > 0 && self.memory_used() + need_pages * (PAGE + 64) > limit {
            return None;
        }
        let mut chunks = Vec::with_capacity(2);
        let mut left = len;
        while left > 0 {
            let (elen, page, off) = match self.extents.iter().next_back() {
                Some(&e) => e,
                None => {
                    let p = self.new_page();
                    (PAGE as u16, p as u32, 0)
                }
            };
            let take = left.min(elen as usize);
            chunks.push(self.carve(page as usize, off, take));
            left -= take;
        }
        let mut at = 0;
        for c in &chunks {
            let p = self.pages[c.page as usize].as_mut().expect("page");
            let n = c.len as usize;
            p.buf[c.off as usize..c.off as usize + n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        Some(chunks)
    }
}

/// Drops the free slots at the end of `slots` (and their hole entries):
/// the slot a put pushed goes again when that put is undone, so the
/// table is charged as before it.
fn trim_tail<T>(slots: &mut Vec<Option<T>>, holes: &mut Vec<usize>) {
    let before = slots.len();
    while let Some(None) = slots.last() {
        slots.pop();
    }
    if slots.len() < before {
        let n = slots.len();
        holes.retain(|&h| h < n);
    }
}

impl Allocator for Chunks {
    fn name(&self) -> String {
        "chunks".into()
    }

    fn alloc(
        &mut self,
        data: &[u8],
        _owner: u64,
        limit: usize,
        _moved: &mut dyn FnMut(Moved),
    ) -> Option<Loc> {
        assert!(!data.is_empty() && data.len() <= PAGE);
        let chunks = self.place(data, limit)?;
        let rec = Record { chunks };
        let id = match self.record_holes.pop() {
            Some(h) => {
                self.records[h] = Some(rec);
                h
            }
            None => {
                self.records.push(Some(rec));
                self.records.len() - 1
            }
        };
        Some(Loc(id as u64))
    }

    fn read(&self, l: Loc, len: usize, out: &mut [u8]) {
        let rec = self.records[l.0 as usize].as_ref().expect("read of a freed record");
        let mut at = 0;
        for c in &rec.chunks {
            let p = self.pages[c.page as usize].as_ref().expect("page");
            let n = c.len as usize;
            out[at..at + n].copy_from_slice(&p.buf[c.off as usize..c.off as usize + n]);
            at += n;
        }
        debug_assert_eq!(at, len);
    }

    fn corrupt(&mut self, l: Loc, byte: usize) {
        let rec = self.records[l.0 as usize].as_ref().expect("record");
        let mut at = byte;
        for c in &rec.chunks {
            if at < c.len as usize {
                self.pages[c.page as usize].as_mut().expect("page").buf[c.off as usize + at] ^= 0x40;
                return;
            }
            at -= c.len as usize;
        }
    }

    fn free(&mut self, l: Loc, _len: usize) {
        let rec = self.records[l.0 as usize].take().expect("free of a freed record");
        self.record_holes.push(l.0 as usize);
        trim_tail(&mut self.records, &mut self.record_holes);
        for c in rec.chunks {
            self.give_back(c);
        }
    }

    fn memory_used(&self) -> usize {
        self.data_bytes + self.metadata_bytes()
    }

    fn metadata_bytes(&self) -> usize {
        let live_pages = self.pages.len() - self.page_holes.len();
        let live_records = self.records.len() - self.record_holes.len();
        debug_assert!(self.extents.len() <= self.chunk_count + live_pages);
        self.chunk_count * std::mem::size_of::<Chunk>()
            + live_records * std::mem::size_of::<Record>()
            + live_pages * (std::mem::size_of::<Page>() + 4 * 4)
            // Free extents: at most one per chunk and one per page (each
            // page's free ranges lie between its chunks), charged at that
            // bound so that freeing a chunk never adds to the count.
            + (self.chunk_count + live_pages) * 16
            // The page and record tables by their slots, each with room
            // for its hole entry: freeing makes a slot a hole and changes
            // nothing here (their capacity, up to twice the slots after
            // amortized growth, is not charged: it would stay after a put
            // that was undone).
            + self.pages.len() * (std::mem::size_of::<Option<Page>>() + 8)
            + self.records.len() * (std::mem::size_of::<Option<Record>>() + 8)
    }

    fn compact(&mut self, _moved: &mut dyn FnMut(Moved)) -> usize {
        // Records keep their id (the location) when their chunks move, so
        // compaction reports no moves to the store.
        let before = self.memory_used();
        loop {
            let mut live: Vec<(usize, usize)> =
                self.pages.iter().enumerate().filter_map(|(i, p)| p.as_ref().map(|p| (p.used, i))).collect();
            if live.len() < 2 {
                break;
            }
            live.sort_unstable();
            let (used, victim) = live[0];
            if used * 4 > PAGE * 3 {
                break; // nothing sparse enough to be worth moving
            }
            let others_free: usize = live[1..].iter().map(|&(u, _)| PAGE - u).sum();
            if used + MIN_CHUNK * 4 > others_free {
                break;
            }
            // Stop allocating from the victim and re-place every record
            // with a chunk in it.
            let data_before = self.data_bytes;
            self.draining = Some(victim);
            let p = self.pages[victim].as_ref().expect("page");
            let free: Vec<(u16, u16)> = p.free.clone();
            for (off, len) in free {
                self.extents.remove(&(len, victim as u32, off));
            }
            let ids: Vec<usize> = (0..self.records.len())
                .filter(|&r| {
                    self.records[r]
                        .as_ref()
                        .is_some_and(|x| x.chunks.iter().any(|c| c.page as usize == victim))
                })
                .collect();
            // All or nothing: every record is placed anew before any old
            // chunk is given back, so a round that cannot place them all
            // gives back what it placed and leaves the allocator as it
            // was (moving some and stopping left them split in more
            // chunks, with more metadata, and the page still held).
            let mut placed: Vec<(usize, Vec<Chunk>)> = Vec::with_capacity(ids.len());
            let mut ok = true;
            for r in ids {
                let len: usize =
                    self.records[r].as_ref().expect("record").chunks.iter().map(|c| c.len as usize).sum();
                let mut tmp = vec![0u8; len];
                self.read(Loc(r as u64), len, &mut tmp);
                // Whole, in one free extent, never in new pages: a record
                // moved in pieces would keep chunks (metadata) beyond what
                // it had, after the page is released and refilled.
                let Some(chunk) = self.place_whole(&tmp) else {
                    ok = false;
                    break;
                };
                placed.push((r, vec![chunk]));
            }
            if ok {
                for (r, chunks) in placed {
                    let old =
                        std::mem::replace(&mut self.records[r].as_mut().expect("record").chunks, chunks);
                    for c in old {
                        self.give_back(c);
                    }
                }
            } else {
                // Every page a chunk was carved from held data before, so
                // giving the chunks back releases none.
                for c in placed.into_iter().flat_map(|(_, chunks)| chunks) {
                    self.give_back(c);
                }
            }
            self.draining = None;
            // (The victim's slot is gone if it was the last one, released.)
            let held = self.pages.get(victim).is_some_and(|p| p.is_some());
            if let Some(Some(p)) = self.pages.get(victim) {
                let free: Vec<(u16, u16)> = p.free.clone();
                for (off, len) in free {
                    self.index_extent(victim, off, len);
                }
            }
            if !ok || held || self.data_bytes >= data_before {
                break;
            }
        }
        self.pages.shrink_to_fit();
        self.records.shrink_to_fit();
        self.page_holes.shrink_to_fit();
        self.record_holes.shrink_to_fit();
        before.saturating_sub(self.memory_used())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workout() {
        crate::alloc::testing::workout(Box::new(Chunks::new()));
    }

    #[test]
    fn a_page_spans_chunks_and_neighbours_merge() {
        let mut a = Chunks::new();
        let x = a.alloc(&[1; 3000], 1, usize::MAX, &mut |_| {}).unwrap();
        let y = a.alloc(&[2; 3000], 2, usize::MAX, &mut |_| {}).unwrap(); // 1096 in page 0 + 1904 in page 1
        assert_eq!(a.records[y.0 as usize].as_ref().unwrap().chunks.len(), 2);
        assert_eq!(a.data_bytes, 2 * PAGE);
        let mut buf = [0u8; 3000];
        a.read(y, 3000, &mut buf);
        assert!(buf.iter().all(|&b| b == 2));
        a.free(x, 3000);
        // Page 0 now holds one free extent of 3000 bytes, merged.
        assert_eq!(a.pages[0].as_ref().unwrap().free, vec![(0, 3000)]);
        a.free(y, 3000);
        assert_eq!(a.data_bytes, 0, "empty pages are released");
    }
}
