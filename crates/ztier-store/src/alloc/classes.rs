//! Size classes, as in zsmalloc.
//!
//! An object of `len` bytes is rounded up to the next multiple of
//! [`GRANULE`] (32 bytes) — its *class* — and stored in a slot of a *slab*
//! of that class. A slab is 1 to [`MAX_SLAB_PAGES`] (16) contiguous pages
//! cut into equal slots:
//!
//! ```text
//!  class 1504 B in a 3-page slab (12288 B): 8 slots, 256 B tail (2.1%)
//! +--------+--------+--------+--------+--------+--------+--------+--------+----+
//! | slot 0 | slot 1 | slot 2 | slot 3 | slot 4 | slot 5 | slot 6 | slot 7 |tail|
//! +--------+--------+--------+--------+--------+--------+--------+--------+----+
//!   owners: [u64; 8] (who is in each slot), free: stack of free slot numbers
//! ```
//!
//! # Slab size
//!
//! Two costs pull against each other. The unused *tail* of a slab is lost
//! for every slab of the class, so a populous class wants the slab size
//! whose tail is smallest (class 1504 B: 7 pages, 96 B tail, 0.3%). But each
//! class also keeps about half a slab of free slots (its partly used
//! slab), and with ~100 classes in use that half-slab floor is what
//! dominates a small store (measured: 6% of memory with every slab chosen
//! for least tail, at 17 MiB per shard). So each **new slab** is sized for
//! the class as it is now: the k pages (1..=16) minimising
//! `(tail(k) + slab metadata) × slabs the class needs + k pages / 2`. A sparse class gets
//! small slabs, a populous one long slabs with little tail. Slabs of one
//! class may thus differ in size; slots are the same.
//!
//! Memory lost: on average half a granule per object plus the slab tails,
//! plus free slots in partly used slabs, which [`Allocator::compact`]
//! recovers by moving objects from the emptiest slabs of a class into the
//! fullest and releasing the emptied slabs. An empty slab is released at
//! once.
//!
//! Metadata per object: 4 bytes (owner; owners must fit in 32 bits) + 2
//! bytes (free-stack entry) per slot, and ~120 bytes per slab (record and
//! heap blocks), which the slab-size rule also weighs; kept as running totals so that
//! [`Allocator::memory_used`] is O(1) (the store asks on every put).
//!
//! A location packs class (8 bits), slab (40 bits) and slot (16 bits).

use super::{vec_bytes, Allocator, Loc, Moved};

/// Class granularity in bytes.
pub const GRANULE: usize = 32;
/// Largest slab, in pages.
pub const MAX_SLAB_PAGES: usize = 16;
const CLASSES: usize = 4096 / GRANULE;
const PAGE: usize = 4096;

struct Slab {
    buf: Box<[u8]>,
    /// Owner of each slot (the store's entry ids fit in 32 bits).
    owners: Box<[u32]>,
    free: Vec<u16>,
    slots: usize,
}

struct Class {
    size: usize,
    slabs: Vec<Option<Slab>>,
    /// The slabs with a free slot, each once; the last is used first.
    partial: Vec<usize>,
    /// Released slab numbers, reused first.
    holes: Vec<usize>,
    /// Pages of the live slabs.
    pages: usize,
    /// Metadata of the live slabs (owners, free stacks, slab records).
    slab_meta: usize,
}

impl Class {
    /// The class's metadata. `partial` and `holes` each hold a slab
    /// number at most once, so neither outgrows `slabs`: both are charged
    /// (and reserved, see [`Class::fit_lists`]) at `slabs`' capacity, so
    /// that a free, which may push on either, never grows the count.
    fn meta(&self) -> usize {
        let lists = self.slabs.capacity().max(self.partial.capacity())
            + self.slabs.capacity().max(self.holes.capacity());
        self.slab_meta + vec_bytes(&self.slabs) + lists * std::mem::size_of::<usize>()
    }

    /// Gives `partial` and `holes` room for one entry per slab record.
    fn fit_lists(&mut self) {
        let cap = self.slabs.capacity();
        for list in [&mut self.partial, &mut self.holes] {
            if list.capacity() < cap {
                list.reserve_exact(cap - list.len());
            } else {
                list.shrink_to(cap);
            }
        }
    }

    /// Pages of the next slab: the k minimising the class's expected loss
    /// `(tail(k) + per-slab metadata) × slabs needed + half a slab`.
    fn next_slab_pages(&self) -> usize {
        let held = (self.pages * PAGE).max(PAGE) as u128;
        (1..=MAX_SLAB_PAGES)
            .filter(|&k| k * PAGE >= self.size)
            .min_by_key(|&k| {
                let bytes = (k * PAGE) as u128;
                let per_slab = (bytes % self.size as u128) + SLAB_FIXED as u128;
                per_slab * held / bytes + bytes / 2
            })
            .expect("a 16-page slab holds any class")
    }
}

/// Fixed metadata of one slab: its record in `Class::slabs` and ~16 bytes
/// of malloc overhead for each of its three heap blocks.
const SLAB_FIXED: usize = std::mem::size_of::<Option<Slab>>() + 3 * 16;

/// Heap metadata of a slab with `slots` slots: owner and free-stack
/// entries plus malloc overhead. (Records are counted by the capacity of
/// `Class::slabs`.)
fn slab_meta(slots: usize) -> usize {
    slots * (4 + 2) + 3 * 16
}

/// The size-class allocator.
pub struct Classes {
    classes: Vec<Class>,
    data_bytes: usize,
    /// Sum of the classes' `meta()`.
    meta_bytes: usize,
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
        let classes: Vec<Class> = (0..CLASSES)
            .map(|c| Class {
                size: (c + 1) * GRANULE,
                slabs: Vec::new(),
                partial: Vec::new(),
                holes: Vec::new(),
                pages: 0,
                slab_meta: 0,
            })
            .collect();
        let meta_bytes = vec_bytes(&classes);
        Classes { classes, data_bytes: 0, meta_bytes }
    }

    fn class_of(len: usize) -> usize {
        len.div_ceil(GRANULE).max(1) - 1
    }

    /// Runs `f` on class `ci`, keeping the metadata total up to date.
    fn with_class<R>(&mut self, ci: usize, f: impl FnOnce(&mut Class, &mut usize) -> R) -> R {
        let c = &mut self.classes[ci];
        let before = c.meta();
        let r = f(c, &mut self.data_bytes);
        self.meta_bytes = self.meta_bytes - before + c.meta();
        r
    }

    fn take_slot(c: &mut Class, owner: u64) -> Option<(usize, usize)> {
        let &s = c.partial.last()?;
        let slab = c.slabs[s].as_mut().expect("a partial slab is live");
        let slot = slab.free.pop().expect("a partial slab has a free slot");
        slab.owners[slot as usize] = u32::try_from(owner).expect("owner ids fit in 32 bits");
        if slab.free.is_empty() {
            c.partial.pop();
        }
        Some((s, slot as usize))
    }

    fn release(c: &mut Class, s: usize, data_bytes: &mut usize) {
        let slab = c.slabs[s].take().expect("slab in use");
        // An empty slab is on the partial list (once): take it off.
        c.partial.retain(|&p| p != s);
        c.holes.push(s);
        c.pages -= slab.buf.len() / PAGE;
        c.slab_meta -= slab_meta(slab.slots);
        *data_bytes -= slab.buf.len();
    }
}

impl Allocator for Classes {
    fn name(&self) -> String {
        "classes".into()
    }

    fn alloc(&mut self, data: &[u8], owner: u64, limit: usize, _moved: &mut dyn FnMut(Moved)) -> Option<Loc> {
        assert!(!data.is_empty() && data.len() <= PAGE);
        let ci = Self::class_of(data.len());
        let used = self.memory_used();
        let (s, slot) = self.with_class(ci, |c, data_bytes| {
            if let Some(x) = Self::take_slot(c, owner) {
                return Some(x);
            }
            let pages = c.next_slab_pages();
            let slots = pages * PAGE / c.size;
            // Room for the slab, its metadata and, if the records must
            // grow, their growth (a record plus its two list entries each).
            let records = if c.holes.is_empty() && c.slabs.len() == c.slabs.capacity() {
                (c.slabs.len() / 8 + 4)
                    * (std::mem::size_of::<Option<Slab>>() + 2 * std::mem::size_of::<usize>())
            } else {
                0
            };
            let grow = pages * PAGE + slab_meta(slots) + records;
            if used + grow > limit {
                return None;
            }
            let slab = Slab {
                buf: vec![0u8; pages * PAGE].into_boxed_slice(),
                owners: vec![0; slots].into_boxed_slice(),
                free: (0..slots as u16).rev().collect(),
                slots,
            };
            let s = match c.holes.pop() {
                Some(h) => {
                    c.slabs[h] = Some(slab);
                    h
                }
                None => {
                    // Grow the records by an eighth, not by doubling
                    // (`records` above).
                    if c.slabs.len() == c.slabs.capacity() {
                        c.slabs.reserve_exact(c.slabs.len() / 8 + 4);
                    }
                    c.slabs.push(Some(slab));
                    c.fit_lists();
                    c.slabs.len() - 1
                }
            };
            c.pages += pages;
            c.slab_meta += slab_meta(slots);
            *data_bytes += pages * PAGE;
            c.partial.push(s);
            Some(Self::take_slot(c, owner).expect("a new slab has free slots"))
        })?;
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

    fn bytes(&self, l: Loc, len: usize) -> Option<&[u8]> {
        let (ci, s, slot) = unloc(l);
        let c = &self.classes[ci];
        let slab = c.slabs[s].as_ref().expect("read of a released slab");
        let at = slot * c.size;
        Some(&slab.buf[at..at + len])
    }

    fn corrupt(&mut self, l: Loc, byte: usize) {
        let (ci, s, slot) = unloc(l);
        let c = &mut self.classes[ci];
        let at = slot * c.size + byte;
        c.slabs[s].as_mut().expect("slab").buf[at] ^= 0x40;
    }

    fn free(&mut self, l: Loc, _len: usize) {
        let (ci, s, slot) = unloc(l);
        self.with_class(ci, |c, data_bytes| {
            let slab = c.slabs[s].as_mut().expect("free in a released slab");
            debug_assert!(!slab.free.contains(&(slot as u16)), "double free");
            if slab.free.is_empty() {
                c.partial.push(s);
            }
            slab.free.push(slot as u16);
            if slab.free.len() == slab.slots {
                // Empty: release it now.
                Self::release(c, s, data_bytes);
            }
        });
    }

    fn memory_used(&self) -> usize {
        self.data_bytes + self.meta_bytes
    }

    fn metadata_bytes(&self) -> usize {
        self.meta_bytes
    }

    fn compact(&mut self, moved: &mut dyn FnMut(Moved)) -> usize {
        let before = self.memory_used();
        for ci in 0..CLASSES {
            self.with_class(ci, |c, data_bytes| {
                // Slabs in use, fullest (fewest free slots) first.
                let mut order: Vec<usize> = (0..c.slabs.len()).filter(|&s| c.slabs[s].is_some()).collect();
                if order.len() < 2 && c.slabs.len() == order.len() {
                    return;
                }
                order.sort_by_key(|&s| c.slabs[s].as_ref().map_or(0, |x| x.free.len()));
                let (mut dst_i, mut src_i) = (0usize, order.len().saturating_sub(1));
                // Live slots of the slab being emptied, computed once per slab.
                let mut live: Vec<usize> = Vec::new();
                let mut live_of = usize::MAX;
                let size = c.size;
                let mut bytes = [0u8; PAGE];
                while dst_i < src_i {
                    let (d, s) = (order[dst_i], order[src_i]);
                    if c.slabs[d].as_ref().map_or(0, |x| x.free.len()) == 0 {
                        dst_i += 1;
                        continue;
                    }
                    if live_of != s {
                        let src = c.slabs[s].as_ref().expect("slab");
                        let mut is_free = vec![false; src.slots];
                        for &f in &src.free {
                            is_free[f as usize] = true;
                        }
                        live = (0..src.slots).filter(|&k| !is_free[k]).collect();
                        live_of = s;
                    }
                    // Move one live object from slab s into slab d.
                    let Some(k) = live.pop() else {
                        src_i -= 1;
                        continue;
                    };
                    let src = c.slabs[s].as_ref().expect("slab");
                    let owner = src.owners[k];
                    bytes[..size].copy_from_slice(&src.buf[k * size..(k + 1) * size]);
                    let dslab = c.slabs[d].as_mut().expect("slab");
                    let slot = dslab.free.pop().expect("free slot") as usize;
                    dslab.owners[slot] = owner;
                    dslab.buf[slot * size..(slot + 1) * size].copy_from_slice(&bytes[..size]);
                    moved(Moved { owner: owner as u64, to: loc(ci, d, slot) });
                    let sslab = c.slabs[s].as_mut().expect("slab");
                    sslab.free.push(k as u16);
                    if sslab.free.len() == sslab.slots {
                        Self::release(c, s, data_bytes);
                        src_i -= 1;
                    }
                }
                // Drop released records at the end, then rebuild the
                // partial list.
                while matches!(c.slabs.last(), Some(None)) {
                    c.slabs.pop();
                }
                let n = c.slabs.len();
                c.holes.retain(|&h| h < n);
                c.slabs.shrink_to_fit();
                c.partial = (0..c.slabs.len())
                    .filter(|&s| c.slabs[s].as_ref().is_some_and(|x| !x.free.is_empty()))
                    .collect();
                c.fit_lists();
            });
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
    fn slabs_grow_longer_as_a_class_fills() {
        let mut a = Classes::new();
        let ci = Classes::class_of(1500);
        assert_eq!(a.classes[ci].next_slab_pages(), 1, "an empty class starts small");
        for o in 0..2000u64 {
            a.alloc(&[1u8; 1500], o, usize::MAX, &mut |_| {}).unwrap();
        }
        let c = &a.classes[ci];
        let pages = c.next_slab_pages();
        let tail = |k: usize| (k * PAGE) % c.size * 1000 / (k * PAGE);
        assert!(pages > 1 && tail(pages) <= 5, "populous class: {pages} pages, tail {}‰", tail(pages));
        // Slots never straddle the end of a slab and memory adds up.
        let data: usize = c.slabs.iter().flatten().map(|s| s.buf.len()).sum();
        assert_eq!(data, a.data_bytes);
        let slab_slots: usize = c.slabs.iter().flatten().map(|s| s.slots).sum();
        assert!(slab_slots >= 2000);
        assert_eq!(a.meta_bytes, a.classes.iter().map(Class::meta).sum::<usize>() + vec_bytes(&a.classes));
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
