//! The directory: which backing blocks the SSD cache holds, and where —
//! 6 bytes of RAM per line, and a byte per set.
//!
//! ```text
//!  line = set × ways + way          set = lba mod sets   (direct: ways = 1, FlaZ)
//!  locs[line]: u32   location of the item, in loc_unit bytes from the
//!                    first segment (u32::MAX: empty)
//!  tags[line]: u16   bit 15: referenced since inserted or reinserted
//!                    bits 0-14: a 15-bit hash of lba / sets (0: empty)
//!  policy[set]: u8   pseudo-LRU tree bits (ways − 1 ≤ 7 of them), or the
//!                    CLOCK hand (none for direct placement)
//!  live[segment]: u16 lines pointing into the segment (kept by every
//!                    change of a location; recycling picks by it)
//!  dirty[line]: 1 bit write-back: the line is newer than the backing
//!                    (never replaced by another block until written back)
//! ```
//!
//! A tag is a partial tag: the full block number is in the item's header
//! on the device, and every hit checks it there before the data is used.
//! At most one line of a set holds a tag ([`Directory::insert`] replaces
//! a line with the same tag), so a lookup reads at most one item.
//!
//! Lookups are lock-free (atomic loads); every change to a set is made
//! under that set's stripe lock in `cache.rs`, which also orders it with
//! the writes that invalidate blocks.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::format::{Placement, Policy, MAX_WAYS};

/// An empty line's location.
pub const EMPTY: u32 = u32::MAX;
const REF: u16 = 1 << 15;
const TAG: u16 = REF - 1;

/// The directory.
pub struct Directory {
    ways: usize,
    sets: u64,
    policy: Policy,
    locs: Box<[AtomicU32]>,
    tags: Box<[AtomicU16]>,
    state: Box<[AtomicU8]>,
    /// One bit per line: dirty (write-back), never replaced by another block.
    dirty: Box<[AtomicU64]>,
    count: AtomicU64,
    /// Lines pointing into each segment (empty: not counted).
    live: Box<[AtomicU16]>,
    /// Location units per segment (to find a location's segment).
    units_per_segment: u32,
}

/// A line found by a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Line index.
    pub line: usize,
    /// Location of the item.
    pub loc: u32,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Directory {
    /// A directory of `lines` lines in sets of `ways` (1 for direct
    /// placement; at most 8 with LRU, [`MAX_WAYS`] with CLOCK).
    pub fn new(lines: u64, ways: usize, placement: Placement, policy: Policy) -> Directory {
        let ways = if placement == Placement::Direct { 1 } else { ways.max(1) };
        assert!(
            ways <= MAX_WAYS as usize && (policy == Policy::Clock || ways <= 8),
            "{ways} ways with {policy:?}"
        );
        let sets = lines / ways as u64;
        let n = (sets * ways as u64) as usize;
        Directory {
            ways,
            sets,
            policy,
            locs: (0..n).map(|_| AtomicU32::new(EMPTY)).collect(),
            tags: (0..n).map(|_| AtomicU16::new(0)).collect(),
            state: (0..if ways > 1 { sets as usize } else { 0 }).map(|_| AtomicU8::new(0)).collect(),
            dirty: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            live: Box::new([]),
            units_per_segment: 1,
        }
    }

    /// Counts the lines pointing into each of `segments` segments of
    /// `units_per_segment` location units ([`Directory::live_in`]).
    pub fn count_segments(mut self, segments: u32, units_per_segment: u32) -> Directory {
        assert_eq!(self.count(), 0, "segments are counted from an empty directory");
        self.live = (0..segments).map(|_| AtomicU16::new(0)).collect();
        self.units_per_segment = units_per_segment.max(1);
        self
    }

    /// Lines pointing into segment `idx` now (0 when not counted).
    pub fn live_in(&self, idx: u32) -> u32 {
        self.live.get(idx as usize).map_or(0, |c| c.load(Ordering::Relaxed) as u32)
    }

    /// A line's location changed from `old` to `new` (either EMPTY).
    fn moved(&self, old: u32, new: u32) {
        if self.live.is_empty() || old == new {
            return;
        }
        let seg = |loc: u32| self.live.get((loc / self.units_per_segment) as usize);
        if let Some(c) = (old != EMPTY).then(|| seg(old)).flatten() {
            // Never below 0: a segment reused while a line still pointed
            // into it (an unreadable segment's lines are left to fail
            // their checks) is counted again from its new items.
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
        if let Some(c) = (new != EMPTY).then(|| seg(new)).flatten() {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1));
        }
    }

    /// Lines.
    pub fn lines(&self) -> usize {
        self.locs.len()
    }

    /// Sets.
    pub fn sets(&self) -> u64 {
        self.sets
    }

    /// Ways per set.
    pub fn ways(&self) -> usize {
        self.ways
    }

    /// The set of a block.
    pub fn set_of(&self, lba: u64) -> u64 {
        lba % self.sets
    }

    /// The partial tag of a block (1..=32767).
    pub fn tag_of(&self, lba: u64) -> u16 {
        (mix(lba / self.sets) % TAG as u64) as u16 + 1
    }

    /// Lines holding a block now.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Bytes of RAM the directory takes.
    pub fn memory_bytes(&self) -> u64 {
        (self.locs.len() * 6 + self.state.len() + self.live.len() * 2 + self.dirty.len() * 8) as u64
    }

    fn set_lines(&self, lba: u64) -> std::ops::Range<usize> {
        let s = self.set_of(lba) as usize * self.ways;
        s..s + self.ways
    }

    /// The line holding `lba`'s tag, if any (lock-free).
    pub fn lookup(&self, lba: u64) -> Option<Found> {
        let t = self.tag_of(lba);
        for line in self.set_lines(lba) {
            if self.tags[line].load(Ordering::Acquire) & TAG == t {
                let loc = self.locs[line].load(Ordering::Acquire);
                if loc != EMPTY {
                    return Some(Found { line, loc });
                }
            }
        }
        None
    }

    /// The location held by `line` (EMPTY if none).
    pub fn loc(&self, line: usize) -> u32 {
        self.locs[line].load(Ordering::Acquire)
    }

    /// Records a hit on `line`: its reference bit, and the set's LRU order.
    pub fn touch(&self, line: usize) {
        let t = &self.tags[line];
        let cur = t.load(Ordering::Relaxed);
        if cur & REF == 0 && cur != 0 {
            let _ = t.compare_exchange(cur, cur | REF, Ordering::AcqRel, Ordering::Relaxed);
        }
        if self.policy == Policy::Lru && self.ways > 1 {
            let set = line / self.ways;
            let way = line % self.ways;
            let st = &self.state[set];
            let mut cur = st.load(Ordering::Relaxed);
            loop {
                let new = plru_touch(cur as u16, way, self.ways) as u8;
                if new == cur {
                    break;
                }
                match st.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(x) => cur = x,
                }
            }
        }
    }

    /// Whether `line` was referenced since it was (re)inserted.
    pub fn referenced(&self, line: usize) -> bool {
        self.tags[line].load(Ordering::Acquire) & REF != 0
    }

    /// Inserts `lba` at `loc` (under the set's stripe lock): into the line
    /// already holding its tag, else an empty line, else the policy's
    /// victim. Returns the line and the location it held before (EMPTY
    /// if none). Dirty lines are never replaced: use
    /// [`Directory::insert_with`] where any may be dirty.
    pub fn insert(&self, lba: u64, loc: u32) -> (usize, u32) {
        self.insert_with(lba, loc, &|_| false).expect("no line is pinned")
    }

    /// Whether [`Directory::insert_with`] would find a line for `lba`
    /// (`pinned`: lines that must not be replaced — dirty lines of other
    /// blocks). Changes nothing.
    pub fn can_insert(&self, lba: u64, pinned: &dyn Fn(usize) -> bool) -> bool {
        let t = self.tag_of(lba);
        let lines = self.set_lines(lba);
        if let Some(l) = lines.clone().find(|&l| self.tags[l].load(Ordering::Relaxed) & TAG == t) {
            return !pinned(l);
        }
        lines.clone().any(|l| self.tags[l].load(Ordering::Relaxed) == 0 || !pinned(l))
    }

    /// [`Directory::insert`], never replacing a `pinned` line: `None` if
    /// every candidate is pinned.
    pub fn insert_with(&self, lba: u64, loc: u32, pinned: &dyn Fn(usize) -> bool) -> Option<(usize, u32)> {
        let t = self.tag_of(lba);
        let lines = self.set_lines(lba);
        let line = match lines.clone().find(|&l| self.tags[l].load(Ordering::Relaxed) & TAG == t) {
            Some(l) if pinned(l) => return None,
            Some(l) => l,
            None => match lines.clone().find(|&l| self.tags[l].load(Ordering::Relaxed) == 0) {
                Some(l) => l,
                None => {
                    let v = self.victim(lba);
                    if pinned(v) {
                        lines.clone().find(|&l| !pinned(l))?
                    } else {
                        v
                    }
                }
            },
        };
        let old = self.locs[line].swap(loc, Ordering::AcqRel);
        self.moved(old, loc);
        self.tags[line].store(t, Ordering::Release);
        if old == EMPTY {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        if self.policy == Policy::Lru && self.ways > 1 {
            let set = line / self.ways;
            let st = &self.state[set];
            st.store(
                plru_touch(st.load(Ordering::Relaxed) as u16, line % self.ways, self.ways) as u8,
                Ordering::Relaxed,
            );
        }
        Some((line, old))
    }

    /// Whether `line` is dirty (lock-free).
    pub fn is_dirty(&self, line: usize) -> bool {
        self.dirty[line / 64].load(Ordering::Acquire) & (1 << (line % 64)) != 0
    }

    /// Marks `line` dirty or clean (under the set's stripe lock).
    pub fn set_dirty(&self, line: usize, dirty: bool) {
        let bit = 1u64 << (line % 64);
        if dirty {
            self.dirty[line / 64].fetch_or(bit, Ordering::AcqRel);
        } else {
            self.dirty[line / 64].fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// The line the policy would replace in `lba`'s full set.
    fn victim(&self, lba: u64) -> usize {
        let set = self.set_of(lba) as usize;
        let base = set * self.ways;
        if self.ways == 1 {
            return base;
        }
        match self.policy {
            Policy::Lru => base + plru_victim(self.state[set].load(Ordering::Relaxed) as u16, self.ways),
            Policy::Clock => {
                let st = &self.state[set];
                let mut hand = st.load(Ordering::Relaxed) as usize % self.ways;
                // At most two turns: the first clears reference bits.
                for _ in 0..2 * self.ways {
                    let l = base + hand;
                    let t = self.tags[l].load(Ordering::Relaxed);
                    if t & REF == 0 {
                        break;
                    }
                    self.tags[l].store(t & TAG, Ordering::Relaxed);
                    hand = (hand + 1) % self.ways;
                }
                st.store(((hand + 1) % self.ways) as u8, Ordering::Relaxed);
                base + hand
            }
        }
    }

    /// Empties the line holding `lba` (under the stripe lock). Returns the
    /// location it held.
    pub fn remove(&self, lba: u64) -> Option<u32> {
        let f = self.lookup(lba)?;
        self.clear(f.line);
        Some(f.loc)
    }

    /// Empties `line`.
    pub fn clear(&self, line: usize) {
        self.set_dirty(line, false);
        self.tags[line].store(0, Ordering::Release);
        let old = self.locs[line].swap(EMPTY, Ordering::AcqRel);
        if old != EMPTY {
            self.moved(old, EMPTY);
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The line of `lba` if it holds exactly `loc` (under the stripe lock).
    pub fn find_at(&self, lba: u64, loc: u32) -> Option<usize> {
        let t = self.tag_of(lba);
        self.set_lines(lba).find(|&l| {
            self.tags[l].load(Ordering::Relaxed) & TAG == t && self.locs[l].load(Ordering::Relaxed) == loc
        })
    }

    /// Moves `line` to `loc` and clears its reference bit (a reinsertion).
    pub fn relocate(&self, line: usize, loc: u32) {
        let old = self.locs[line].swap(loc, Ordering::AcqRel);
        self.moved(old, loc);
        let t = self.tags[line].load(Ordering::Relaxed);
        self.tags[line].store(t & TAG, Ordering::Release);
    }

    /// Every location held now, sorted (for a checkpoint).
    pub fn live_locs(&self) -> Vec<u32> {
        let mut v: Vec<u32> =
            self.locs.iter().map(|l| l.load(Ordering::Acquire)).filter(|&l| l != EMPTY).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Empties every line.
    pub fn clear_all(&self) {
        for l in 0..self.locs.len() {
            self.clear(l);
        }
    }
}

/// Pseudo-LRU: after an access to `way`, every tree node on its path
/// points away from it.
fn plru_touch(bits: u16, way: usize, ways: usize) -> u16 {
    let levels = ways.trailing_zeros();
    let mut node = 1usize;
    let mut b = bits;
    for l in (0..levels).rev() {
        let dir = (way >> l) & 1;
        // bit set = the victim is on the right
        if dir == 0 {
            b |= 1 << (node - 1);
        } else {
            b &= !(1 << (node - 1));
        }
        node = 2 * node + dir;
    }
    b
}

/// The way the tree points to.
fn plru_victim(bits: u16, ways: usize) -> usize {
    let levels = ways.trailing_zeros();
    let mut node = 1usize;
    for _ in 0..levels {
        let dir = ((bits >> (node - 1)) & 1) as usize;
        node = 2 * node + dir;
    }
    node - ways
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plru_never_picks_the_last_touched_and_cycles_all() {
        for ways in [2usize, 4, 8] {
            let mut b = 0u16;
            let mut seen = vec![false; ways];
            for _ in 0..ways {
                let v = plru_victim(b, ways);
                seen[v] = true;
                b = plru_touch(b, v, ways);
                assert_ne!(plru_victim(b, ways), v);
            }
            assert!(seen.iter().all(|&s| s), "{ways} ways: {seen:?}");
        }
    }

    #[test]
    fn direct_mapped_replaces_and_assoc_keeps_the_referenced() {
        let d = Directory::new(16, 1, Placement::Direct, Policy::Clock);
        d.insert(3, 100);
        assert_eq!(d.lookup(3).unwrap().loc, 100);
        d.insert(19, 200); // same line (19 mod 16), another block
        assert!(d.lookup(3).is_none());
        assert_eq!(d.lookup(19).unwrap().loc, 200);
        assert_eq!(d.count(), 1);

        let a = Directory::new(16, 4, Placement::Assoc, Policy::Clock);
        // 4 sets: blocks 0, 4, 8, 12, 16 share set 0.
        for (i, b) in [0u64, 4, 8, 12].iter().enumerate() {
            a.insert(*b, i as u32);
        }
        for b in [0u64, 8, 12] {
            a.touch(a.lookup(b).unwrap().line);
        }
        a.insert(16, 9);
        assert!(a.lookup(4).is_none(), "the unreferenced line goes");
        for b in [0u64, 8, 12, 16] {
            assert!(a.lookup(b).is_some(), "{b}");
        }
        assert_eq!(a.count(), 4);
        assert_eq!(a.remove(8), Some(2));
        assert_eq!(a.count(), 3);
        assert_eq!(a.live_locs(), vec![0, 3, 9]);
        let l = a.find_at(16, 9).unwrap();
        a.relocate(l, 42);
        assert_eq!(a.lookup(16).unwrap().loc, 42);
        assert_eq!(a.memory_bytes(), 16 * 6 + 4 + 8);
    }

    #[test]
    fn wide_clock_sets_fill_every_way_before_evicting() {
        // One 64-way set: 64 blocks fit, the 65th replaces an
        // unreferenced line, never a referenced one.
        let a = Directory::new(64, MAX_WAYS as usize, Placement::Assoc, Policy::Clock);
        assert_eq!((a.sets(), a.ways()), (1, 64));
        for b in 0..64u64 {
            let (_, old) = a.insert(b, b as u32);
            assert_eq!(old, EMPTY, "{b}");
        }
        assert_eq!(a.count(), 64);
        for b in (0..64u64).filter(|b| b % 2 == 0) {
            a.touch(a.lookup(b).unwrap().line);
        }
        let (_, old) = a.insert(1000, 1000);
        assert!(old != EMPTY && old % 2 == 1, "an unreferenced line goes: {old}");
        assert_eq!(a.count(), 64);
        for b in (0..64u64).filter(|b| b % 2 == 0) {
            assert!(a.lookup(b).is_some(), "{b}");
        }
        assert_eq!(a.memory_bytes(), 64 * 6 + 1 + 8);
    }

    #[test]
    fn pinned_lines_are_never_replaced() {
        // Direct-mapped: a pinned (dirty) line refuses every other block.
        let d = Directory::new(8, 1, Placement::Direct, Policy::Clock);
        let (line, _) = d.insert(3, 30);
        d.set_dirty(line, true);
        assert!(d.is_dirty(line));
        let pinned = |l: usize| d.is_dirty(l);
        assert!(!d.can_insert(11, &pinned));
        assert!(d.insert_with(11, 110, &pinned).is_none());
        assert_eq!(d.lookup(3).unwrap().loc, 30);
        // Two ways, one pinned: the other is replaced whatever the policy says.
        for policy in [Policy::Lru, Policy::Clock] {
            let a = Directory::new(2, 2, Placement::Assoc, policy);
            let (l0, _) = a.insert(0, 1);
            a.insert(1, 2);
            a.set_dirty(l0, true);
            let pinned = |l: usize| a.is_dirty(l);
            for (k, b) in (2..6u64).enumerate() {
                assert!(a.can_insert(b, &pinned));
                let (l, old) = a.insert_with(b, 10 + k as u32, &pinned).unwrap();
                assert_ne!(l, l0);
                assert_ne!(old, 1, "{policy:?}");
            }
            assert_eq!(a.lookup(0).unwrap().loc, 1);
            // Cleared, the line is no longer dirty.
            a.clear(l0);
            assert!(!a.is_dirty(l0));
        }
    }

    #[test]
    fn lru_evicts_the_least_recent() {
        // Two ways: pseudo-LRU is LRU.
        let a = Directory::new(2, 2, Placement::Assoc, Policy::Lru);
        a.insert(0, 0);
        a.insert(1, 1);
        a.touch(a.lookup(0).unwrap().line);
        a.insert(9, 9);
        assert!(a.lookup(1).is_none() && a.lookup(0).is_some());
        // Four ways: never the line just touched.
        let a = Directory::new(4, 4, Placement::Assoc, Policy::Lru);
        for b in 0..4u64 {
            a.insert(b, b as u32);
        }
        for k in 10..40u64 {
            let hot = 0;
            a.touch(a.lookup(hot).unwrap().line);
            a.insert(k, k as u32);
            assert!(a.lookup(hot).is_some(), "{k}");
            a.touch(a.lookup(k).unwrap().line);
        }
    }
}
