//! Cells, as in de Castro et al. 2003 ("Adaptive compressed caching").
//!
//! Memory is taken in *cells* of N contiguous pages (N = 2 by default; the
//! paper found 2-page cells best on poorly compressible data). Compressed
//! pages are packed into a cell one after another:
//!
//! ```text
//!  cell of 2 pages (8192 B)
//! +----------+------+-------------+---------+------------------------+
//! | frag A   | hole | frag C      | frag D  |   tail (contiguous     |
//! | 1800 B   | (B   | 2100 B      | 1500 B  |   free space)          |
//! |          | freed)|            |         |                        |
//! +----------+------+-------------+---------+------------------------+
//!  fragments: [(offset, len, owner)] sorted by offset
//! ```
//!
//! * **Placement — best fit by final free space**: a page goes to the cell
//!   whose tail, after placing it, would be smallest.
//! * **Compaction on demand**: if no tail fits but some cell's *total* free
//!   space (tail + holes) does, that cell is compacted — its fragments slid
//!   to the front, closing the holes — and the page placed at its tail.
//! * **Relocation to free cells** ([`Allocator::compact`], used when the
//!   budget shrinks): the emptiest cells' fragments are moved into other
//!   cells so that whole cells can be released.
//! * A cell whose last fragment is freed is released.
//!
//! Metadata per fragment: 16 bytes (offset, length, owner); per cell ~80
//! bytes plus two index entries.
//!
//! A location packs the cell number (high 32 bits) and the offset.

use std::collections::BTreeSet;

use super::{vec_bytes, Allocator, Loc, Moved};

const PAGE: usize = 4096;

#[derive(Clone, Copy)]
struct Frag {
    off: u32,
    len: u32,
    owner: u64,
}

struct Cell {
    buf: Vec<u8>,
    frags: Vec<Frag>,
    used: usize,
}

impl Cell {
    fn tail(&self) -> usize {
        self.frags.last().map_or(0, |f| (f.off + f.len) as usize)
    }
}

/// The cells allocator.
pub struct Cells {
    pages: usize,
    cells: Vec<Option<Cell>>,
    holes: Vec<usize>,
    /// (tail free bytes, cell) for best fit on contiguous space.
    by_tail: BTreeSet<(usize, usize)>,
    /// (total free bytes, cell) for compaction candidates.
    by_free: BTreeSet<(usize, usize)>,
    data_bytes: usize,
    frag_count: usize,
}

fn loc(cell: usize, off: usize) -> Loc {
    Loc(((cell as u64) << 32) | off as u64)
}

fn unloc(l: Loc) -> (usize, usize) {
    ((l.0 >> 32) as usize, (l.0 & 0xffff_ffff) as usize)
}

impl Cells {
    /// An allocator with cells of `pages` pages (1..=16).
    pub fn new(pages: usize) -> Self {
        assert!((1..=16).contains(&pages), "cells are 1 to 16 pages");
        Cells {
            pages,
            cells: Vec::new(),
            holes: Vec::new(),
            by_tail: BTreeSet::new(),
            by_free: BTreeSet::new(),
            data_bytes: 0,
            frag_count: 0,
        }
    }

    fn cell_bytes(&self) -> usize {
        self.pages * PAGE
    }

    fn unindex(&mut self, i: usize) {
        let c = self.cells[i].as_ref().expect("cell");
        let size = self.cell_bytes();
        self.by_tail.remove(&(size - c.tail(), i));
        self.by_free.remove(&(size - c.used, i));
    }

    fn index(&mut self, i: usize) {
        let size = self.cell_bytes();
        let c = self.cells[i].as_ref().expect("cell");
        let (t, f) = (size - c.tail(), size - c.used);
        self.by_tail.insert((t, i));
        self.by_free.insert((f, i));
    }

    /// Slides the fragments of cell `i` to its front.
    fn compact_cell(&mut self, i: usize, moved: &mut dyn FnMut(Moved)) {
        self.unindex(i);
        let c = self.cells[i].as_mut().expect("cell");
        let mut at = 0usize;
        for f in c.frags.iter_mut() {
            let (off, len) = (f.off as usize, f.len as usize);
            if off != at {
                c.buf.copy_within(off..off + len, at);
                f.off = at as u32;
                moved(Moved { owner: f.owner, to: loc(i, at) });
            }
            at += len;
        }
        self.index(i);
    }

    /// Appends at the tail of cell `i` (which must have room).
    fn place(&mut self, i: usize, data: &[u8], owner: u64) -> Loc {
        self.unindex(i);
        let c = self.cells[i].as_mut().expect("cell");
        let at = c.tail();
        c.buf[at..at + data.len()].copy_from_slice(data);
        c.frags.push(Frag { off: at as u32, len: data.len() as u32, owner });
        c.used += data.len();
        self.frag_count += 1;
        self.index(i);
        loc(i, at)
    }

    /// Cell with the smallest tail that fits `len`, compacting a cell whose
    /// total free space fits if needed; `avoid` is never chosen.
    fn find_room(&mut self, len: usize, avoid: Option<usize>, moved: &mut dyn FnMut(Moved)) -> Option<usize> {
        if let Some(&(_, i)) = self.by_tail.range((len, 0)..).find(|(_, i)| Some(*i) != avoid) {
            return Some(i);
        }
        let &(_, i) = self.by_free.range((len, 0)..).find(|(_, i)| Some(*i) != avoid)?;
        self.compact_cell(i, moved);
        Some(i)
    }

    fn release_if_empty(&mut self, i: usize) {
        if self.cells[i].as_ref().is_some_and(|c| c.frags.is_empty()) {
            self.unindex(i);
            self.cells[i] = None;
            self.holes.push(i);
            self.data_bytes -= self.cell_bytes();
        }
    }
}

impl Allocator for Cells {
    fn name(&self) -> String {
        format!("cells{}", self.pages)
    }

    fn alloc(&mut self, data: &[u8], owner: u64, limit: usize, moved: &mut dyn FnMut(Moved)) -> Option<Loc> {
        assert!(!data.is_empty() && data.len() <= PAGE);
        let found = self.find_room(data.len(), None, moved);
        let i = match found {
            Some(i) => i,
            None => {
                let size = self.cell_bytes();
                // Room for the cell, its metadata, the fragment and, if the
                // records must grow, their growth (a record and a hole entry
                // each, by an eighth).
                let records = if self.holes.is_empty() && self.cells.len() == self.cells.capacity() {
                    (self.cells.len() / 8 + 4)
                        * (std::mem::size_of::<Option<Cell>>() + std::mem::size_of::<usize>())
                } else {
                    0
                };
                let meta = std::mem::size_of::<Cell>() + 2 * 48 + std::mem::size_of::<Frag>();
                if self.memory_used() + size + meta + records > limit {
                    return None;
                }
                let cell = Cell { buf: vec![0u8; size], frags: Vec::new(), used: 0 };
                let i = match self.holes.pop() {
                    Some(h) => {
                        self.cells[h] = Some(cell);
                        h
                    }
                    None => {
                        if self.cells.len() == self.cells.capacity() {
                            self.cells.reserve_exact(self.cells.len() / 8 + 4);
                        }
                        self.cells.push(Some(cell));
                        let cap = self.cells.capacity();
                        if self.holes.capacity() < cap {
                            self.holes.reserve_exact(cap - self.holes.len());
                        }
                        self.cells.len() - 1
                    }
                };
                self.data_bytes += size;
                self.index(i);
                i
            }
        };
        Some(self.place(i, data, owner))
    }

    fn read(&self, l: Loc, len: usize, out: &mut [u8]) {
        let (i, off) = unloc(l);
        let c = self.cells[i].as_ref().expect("read of a released cell");
        out[..len].copy_from_slice(&c.buf[off..off + len]);
    }

    fn bytes(&self, l: Loc, len: usize) -> Option<&[u8]> {
        let (i, off) = unloc(l);
        let c = self.cells[i].as_ref().expect("read of a released cell");
        Some(&c.buf[off..off + len])
    }

    fn corrupt(&mut self, l: Loc, byte: usize) {
        let (i, off) = unloc(l);
        self.cells[i].as_mut().expect("cell").buf[off + byte] ^= 0x40;
    }

    fn free(&mut self, l: Loc, len: usize) {
        let (i, off) = unloc(l);
        self.unindex(i);
        let c = self.cells[i].as_mut().expect("free in a released cell");
        let k = c.frags.binary_search_by_key(&(off as u32), |f| f.off).expect("free of an unknown fragment");
        debug_assert_eq!(c.frags[k].len as usize, len);
        c.frags.remove(k);
        c.used -= len;
        self.frag_count -= 1;
        self.index(i);
        self.release_if_empty(i);
    }

    fn memory_used(&self) -> usize {
        self.data_bytes + self.metadata_bytes()
    }

    fn metadata_bytes(&self) -> usize {
        let live = self.cells.len() - self.holes.len();
        self.frag_count * std::mem::size_of::<Frag>()
            + live * (std::mem::size_of::<Cell>() + 2 * 48)
            + vec_bytes(&self.cells)
            // `holes` holds a cell number at most once, so it never needs
            // more room than `cells` has; it is charged (and reserved) at
            // that, so that a free, which may push on it, never grows the count.
            + self.cells.capacity().max(self.holes.capacity()) * std::mem::size_of::<usize>()
    }

    fn compact(&mut self, moved: &mut dyn FnMut(Moved)) -> usize {
        let before = self.memory_used();
        // Relocate the emptiest cells' fragments into other cells.
        loop {
            let mut live: Vec<(usize, usize)> =
                self.cells.iter().enumerate().filter_map(|(i, c)| c.as_ref().map(|c| (c.used, i))).collect();
            if live.len() < 2 {
                break;
            }
            live.sort_unstable();
            let (_, victim) = live[0];
            let others_free: usize = live[1..].iter().map(|&(u, _)| self.cell_bytes() - u).sum();
            let victim_used = self.cells[victim].as_ref().expect("cell").used;
            if victim_used > others_free {
                break;
            }
            // Move fragments largest first (first-fit decreasing).
            let mut frags = self.cells[victim].as_ref().expect("cell").frags.clone();
            frags.sort_by_key(|f| std::cmp::Reverse(f.len));
            let mut ok = true;
            for f in frags {
                let Some(j) = self.find_room(f.len as usize, Some(victim), moved) else {
                    ok = false;
                    break;
                };
                let mut tmp = vec![0u8; f.len as usize];
                self.read(loc(victim, f.off as usize), f.len as usize, &mut tmp);
                let to = self.place(j, &tmp, f.owner);
                moved(Moved { owner: f.owner, to });
                self.free(loc(victim, f.off as usize), f.len as usize);
                if self.cells[victim].is_none() {
                    break;
                }
            }
            if !ok {
                break;
            }
        }
        before.saturating_sub(self.memory_used())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workout() {
        for n in [1, 2, 4] {
            crate::alloc::testing::workout(Box::new(Cells::new(n)));
        }
    }

    #[test]
    fn best_fit_picks_the_cell_left_fullest() {
        let mut a = Cells::new(1);
        let l1 = a.alloc(&[1; 3000], 1, usize::MAX, &mut |_| {}).unwrap(); // cell 0: 1096 left
        let _l2 = a.alloc(&[2; 2000], 2, usize::MAX, &mut |_| {}).unwrap(); // cell 1: 2096 left
        let l3 = a.alloc(&[3; 1000], 3, usize::MAX, &mut |_| {}).unwrap(); // fits both; cell 0 is left fuller
        assert_eq!(unloc(l3).0, unloc(l1).0);
    }

    #[test]
    fn holes_are_closed_by_compacting_the_cell() {
        let mut a = Cells::new(1);
        let la = a.alloc(&[1; 1500], 1, usize::MAX, &mut |_| {}).unwrap();
        let _lb = a.alloc(&[2; 1500], 2, usize::MAX, &mut |_| {}).unwrap();
        a.free(la, 1500); // hole of 1500 at the front, tail 1096
        let before = a.memory_used() - a.metadata_bytes();
        let mut moves = Vec::new();
        let lc = a.alloc(&[3; 2000], 3, usize::MAX, &mut |m| moves.push(m)).unwrap(); // fits only after compaction
        assert_eq!(a.memory_used() - a.metadata_bytes(), before, "no new cell");
        let lb = moves.iter().find(|m| m.owner == 2).expect("b moved").to;
        let mut buf = [0u8; 2000];
        a.read(lb, 1500, &mut buf);
        assert!(buf[..1500].iter().all(|&b| b == 2));
        a.read(lc, 2000, &mut buf);
        assert!(buf.iter().all(|&b| b == 3));
    }
}
