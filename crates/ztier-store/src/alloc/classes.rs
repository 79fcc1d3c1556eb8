//! Size classes, as in zsmalloc.
//!
//! An object of `len` bytes is rounded up to the next multiple of
//! [`GRANULE`] (32 bytes) — its *class* — and stored in a slot of a *slab*
//! of that class. A slab is 1 to 4 contiguous pages cut into equal slots;
//! for each class the slab size that wastes least is chosen once:
//!
//! ```text
//!  class 1504 B, slab of 3 pages (12288 B): 8 slots, 256 B unused tail
//! +--------+--------+--------+--------+--------+--------+--------+--------+----+
//! | slot 0 | slot 1 | slot 2 | slot 3 | slot 4 | slot 5 | slot 6 | slot 7 |tail|
//! +--------+--------+--------+--------+--------+--------+--------+--------+----+
//!   owners: [u64; 8] (who is in each slot), free: stack of free slot numbers
//! ```
//!
//! Memory lost: on average half a granule per object plus the slab tails,
//! plus free slots in partly used slabs, which [`Allocator::compact`]
//! recovers by moving objects from the emptiest slabs of a class into the
//! fullest and releasing the emptied slabs. An empty slab is released at
//! once.
//!
//! Metadata per object: 8 bytes (owner) + 2 bytes (free-stack entry) per
//! slot, and ~64 bytes per slab.
//!
//! A location packs class (8 bits), slab (40 bits) and slot (16 bits).

use super::{vec_bytes, Allocator, Loc, Moved};

/// Class granularity in bytes.
pub const GRANULE: usize = 32;
const CLASSES: usize = 4096 / GRANULE;
const PAGE: usize = 4096;

struct Slab {
    buf: Vec<u8>,
    owners: Vec<u64>,
    free: Vec<u16>,
}

struct Class {
    size: usize,
    slab_pages: usize,
    slots: usize,
    slabs: Vec<Option<Slab>>,
    /// Slabs that may have a free slot (checked on use).
    partial: Vec<usize>,
    /// Released slab numbers, reused first.
    holes: Vec<usize>,
}

/// The size-class allocator.
pub struct Classes {
    classes: Vec<Class>,
    data_bytes: usize,
}

impl Default for Classes {
    fn default() -> Self {
        Self::new()
    }
}

fn loc(class: usize, slab: usize, slot: usize) -> Loc {
    Loc(((class as u64) << 56) | ((slab as u64) << 16) | slot as u64)
}

fn unloc(l: Loc) -> (usize, usize, usize) {
    ((l.0 >> 56) as usize, ((l.0 >> 16) & ((1 << 40) - 1)) as usize, (l.0 & 0xffff) as usize)
}

impl Classes {
    /// An empty allocator.
    pub fn new() -> Self {
        let classes = (0..CLASSES)
            .map(|c| {
                let size = (c + 1) * GRANULE;
                // The slab size (1..=4 pages) that wastes the smallest share.
                let slab_pages = (1..=4)
                    .min_by_key(|&k| {
                        let bytes = k * PAGE;
                        (bytes % size) * 1000 / bytes
                    })
                    .expect("non-empty range");
                Class {
                    size,
                    slab_pages,
                    slots: slab_pages * PAGE / size,
                    slabs: Vec::new(),
                    partial: Vec::new(),
                    holes: Vec::new(),
                }
            })
            .collect();
        Classes { classes, data_bytes: 0 }
    }

    fn class_of(len: usize) -> usize {
        len.div_ceil(GRANULE).max(1) - 1
    }

    fn slab_meta(c: &Class) -> usize {
        c.slots * (8 + 2) + std::mem::size_of::<Option<Slab>>()
    }

    fn take_slot(c: &mut Class, owner: u64) -> Option<(usize, usize)> {
        while let Some(&s) = c.partial.last() {
            if let Some(slab) = c.slabs[s].as_mut() {
                if let Some(slot) = slab.free.pop() {
                    slab.owners[slot as usize] = owner;
                    if slab.free.is_empty() {
                        c.partial.pop();
                    }
                    return Some((s, slot as usize));
                }
            }
            c.partial.pop();
        }
        None
    }
}

impl Allocator for Classes {
    fn name(&self) -> String {
        "classes".into()
    }

    fn alloc(&mut self, data: &[u8], owner: u64, limit: usize, _moved: &mut dyn FnMut(Moved)) -> Option<Loc> {
        assert!(!data.is_empty() && data.len() <= PAGE);
        let ci = Self::class_of(data.len());
        let (s, slot) = match Self::take_slot(&mut self.classes[ci], owner) {
            Some(x) => x,
            None => {
                let c = &self.classes[ci];
                let grow = c.slab_pages * PAGE + Self::slab_meta(c);
                if self.memory_used() + grow > limit {
                    return None;
                }
                let c = &mut self.classes[ci];
                let slab = Slab {
                    buf: vec![0u8; c.slab_pages * PAGE],
                    owners: vec![0; c.slots],
                    free: (0..c.slots as u16).rev().collect(),
                };
                let s = match c.holes.pop() {
                    Some(h) => {
                        c.slabs[h] = Some(slab);
                        h
                    }
                    None => {
                        c.slabs.push(Some(slab));
                        c.slabs.len() - 1
                    }
                };
                self.data_bytes += c.slab_pages * PAGE;
                c.partial.push(s);
                Self::take_slot(c, owner).expect("a new slab has free slots")
            }
        };
        let c = &mut self.classes[ci];
        let slab = c.slabs[s].as_mut().expect("slab in use");
        let at = slot * c.size;
        slab.buf[at..at + data.len()].copy_from_slice(data);
        Some(loc(ci, s, slot))
    }

    fn read(&self, l: Loc, len: usize, out: &mut [u8]) {
        let (ci, s, slot) = unloc(l);
        let c = &self.classes[ci];
        let slab = c.slabs[s].as_ref().expect("read of a released slab");
        let at = slot * c.size;
        out[..len].copy_from_slice(&slab.buf[at..at + len]);
    }

    fn corrupt(&mut self, l: Loc, byte: usize) {
        let (ci, s, slot) = unloc(l);
        let c = &mut self.classes[ci];
        let at = slot * c.size + byte;
        c.slabs[s].as_mut().expect("slab").buf[at] ^= 0x40;
    }

    fn free(&mut self, l: Loc, _len: usize) {
        let (ci, s, slot) = unloc(l);
        let c = &mut self.classes[ci];
        let slab = c.slabs[s].as_mut().expect("free in a released slab");
        debug_assert!(!slab.free.contains(&(slot as u16)), "double free");
        if slab.free.is_empty() {
            c.partial.push(s);
        }
        slab.free.push(slot as u16);
        if slab.free.len() == c.slots {
            // Empty: release it now.
            c.slabs[s] = None;
            c.holes.push(s);
            self.data_bytes -= c.slab_pages * PAGE;
        }
    }

    fn memory_used(&self) -> usize {
        self.data_bytes + self.metadata_bytes()
    }

    fn metadata_bytes(&self) -> usize {
        self.classes
            .iter()
            .map(|c| {
                let live = c.slabs.len() - c.holes.len();
                live * Self::slab_meta(c) + vec_bytes(&c.slabs) + vec_bytes(&c.partial) + vec_bytes(&c.holes)
            })
            .sum::<usize>()
            + vec_bytes(&self.classes)
    }

    fn compact(&mut self, moved: &mut dyn FnMut(Moved)) -> usize {
        let before = self.memory_used();
        for ci in 0..CLASSES {
            let c = &mut self.classes[ci];
            // Slabs in use, fullest first.
            let mut order: Vec<usize> = (0..c.slabs.len()).filter(|&s| c.slabs[s].is_some()).collect();
            if order.len() < 2 {
                continue;
            }
            order.sort_by_key(|&s| c.slabs[s].as_ref().map_or(0, |x| x.free.len()));
            let (mut dst_i, mut src_i) = (0usize, order.len() - 1);
            while dst_i < src_i {
                let (d, s) = (order[dst_i], order[src_i]);
                let dst_free = c.slabs[d].as_ref().map_or(0, |x| x.free.len());
                if dst_free == 0 {
                    dst_i += 1;
                    continue;
                }
                // Move one live object from slab s into slab d.
                let src = c.slabs[s].as_ref().expect("slab");
                let live_slot = (0..c.slots).find(|k| !src.free.contains(&(*k as u16)));
                let Some(k) = live_slot else {
                    src_i -= 1;
                    continue;
                };
                let owner = src.owners[k];
                let bytes = src.buf[k * c.size..(k + 1) * c.size].to_vec();
                let dslab = c.slabs[d].as_mut().expect("slab");
                let slot = dslab.free.pop().expect("free slot") as usize;
                dslab.owners[slot] = owner;
                dslab.buf[slot * c.size..(slot + 1) * c.size].copy_from_slice(&bytes);
                moved(Moved { owner, to: loc(ci, d, slot) });
                let sslab = c.slabs[s].as_mut().expect("slab");
                sslab.free.push(k as u16);
                if sslab.free.len() == c.slots {
                    c.slabs[s] = None;
                    c.holes.push(s);
                    self.data_bytes -= c.slab_pages * PAGE;
                    src_i -= 1;
                }
            }
            // Rebuild the partial list.
            c.partial = (0..c.slabs.len())
                .filter(|&s| c.slabs[s].as_ref().is_some_and(|x| !x.free.is_empty()))
                .collect();
            c.partial.shrink_to_fit();
            c.holes.shrink_to_fit();
        }
        before.saturating_sub(self.memory_used())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workout() {
        crate::alloc::testing::workout(Box::new(Classes::new()));
    }

    #[test]
    fn each_class_uses_its_least_wasteful_slab_size() {
        let c = Classes::new();
        for class in &c.classes {
            let waste = |k: usize| (k * PAGE) % class.size * 1000 / (k * PAGE);
            let best = (1..=4).map(waste).min().unwrap();
            assert_eq!(waste(class.slab_pages), best, "class {}", class.size);
            assert_eq!(class.slots, class.slab_pages * PAGE / class.size);
        }
        // Small and middle classes waste little; classes above ~3 KiB
        // cannot share pages in this design (objects never straddle slots).
        let small = &c.classes[Classes::class_of(1500)];
        assert!((small.slab_pages * PAGE) % small.size * 100 / (small.slab_pages * PAGE) <= 5);
    }

    #[test]
    fn compaction_releases_sparse_slabs() {
        let mut a = Classes::new();
        let mut locs = Vec::new();
        for o in 0..64u64 {
            locs.push(a.alloc(&[o as u8; 1000], o, usize::MAX, &mut |_| {}).unwrap());
        }
        // Free 3 of every 4: slabs become sparse.
        for (o, l) in locs.iter().enumerate() {
            if o % 4 != 0 {
                a.free(*l, 1000);
            }
        }
        let before = a.memory_used();
        let mut moves = std::collections::HashMap::new();
        let released = a.compact(&mut |m| {
            moves.insert(m.owner, m.to);
        });
        assert!(released > 0 && a.memory_used() < before);
        let mut buf = [0u8; 1000];
        for o in (0..64u64).step_by(4) {
            let l = moves.get(&o).copied().unwrap_or(locs[o as usize]);
            a.read(l, 1000, &mut buf);
            assert!(buf.iter().all(|&b| b == o as u8));
        }
    }
}
