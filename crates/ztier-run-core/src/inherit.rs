//! Fork bookkeeping of `ztier run`'s tree budget: the resident pages a
//! forked child shares copy-on-write with its parent, and how a look at
//! the page maps tells which of them are no longer shared.
//!
//! Under `--budget-scope tree` every process of the command holds a page
//! of the shared budget per resident page, except a forked child's pages
//! still shared with its parent, which the parent holds: counted twice,
//! the command would evict for nothing. The child keeps a bit per such
//! page ([`Shared`]); a page leaves the set when it leaves memory
//! ([`Shared::take`]) or when a look at `/proc/self/pagemap` and the
//! parent's page map finds it no longer shared ([`not_shared`]), and then
//! the child holds it.

use std::time::{Duration, Instant};

/// A forked child's resident pages shared with its parent: a bit per
/// arena page (up to the last page in use at the fork), and where the
/// next look starts.
#[derive(Debug, Default)]
pub struct Shared {
    bits: Vec<u64>,
    /// Bits set.
    count: usize,
    /// The page the next look starts from.
    cursor: usize,
    /// When the last look was made.
    looked: Option<Instant>,
}

impl Shared {
    /// None shared yet, of pages `[0, end)`.
    pub fn new(end: usize) -> Shared {
        Shared { bits: vec![0; end.div_ceil(64)], ..Shared::default() }
    }

    /// Counts page `i` (below `end`) as shared.
    pub fn insert(&mut self, i: usize) {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        if self.bits[w] & b == 0 {
            self.bits[w] |= b;
            self.count += 1;
        }
    }

    /// Is page `i` still shared with the parent?
    #[inline]
    pub fn has(&self, i: usize) -> bool {
        self.bits.get(i / 64).is_some_and(|x| x & (1u64 << (i % 64)) != 0)
    }

    /// Clears page `i`'s bit; `true` if it was set.
    pub fn take(&mut self, i: usize) -> bool {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        match self.bits.get_mut(w) {
            Some(x) if *x & b != 0 => {
                *x &= !b;
                self.count -= 1;
                true
            }
            _ => false,
        }
    }

    /// Pages still shared.
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }

    /// The next look, at `now`, unless the last one was less than `every`
    /// ago: the words with a bit set, (index, bits), from where the last
    /// look stopped on, wrapping round, until at least `most` pages' words
    /// (or all of them); the next look starts after them.
    pub fn look(&mut self, now: Instant, every: Duration, most: usize) -> Option<Vec<(usize, u64)>> {
        if self.looked.is_some_and(|t| now.duration_since(t) < every) {
            return None;
        }
        self.looked = Some(now);
        let n = self.bits.len();
        let (mut w, mut words) = (self.cursor / 64 % n.max(1), Vec::new());
        for _ in 0..n {
            if words.len() * 64 >= most {
                break;
            }
            if self.bits[w] != 0 {
                words.push((w, self.bits[w]));
            }
            w = (w + 1) % n;
        }
        self.cursor = w * 64;
        Some(words)
    }
}

/// A page map (`/proc/PID/pagemap`): 8 bytes per page of the address
/// space.
pub trait PageMap {
    /// Reads the entries of `bytes / 8` pages from page number `first`
    /// into `map`; whether all of them were read.
    fn read(&self, map: &mut [u64], first: usize, bytes: usize) -> bool;
}

/// A page map entry: the page is present.
pub const PRESENT: u64 = 1 << 63;
/// A page map entry: the page is mapped by this process alone.
pub const EXCLUSIVE: u64 = 1 << 56;
/// A page map entry: the frame number (0 unless `CAP_SYS_ADMIN`).
pub const PFN: u64 = (1 << 55) - 1;

/// The pages of a look (`words` from [`Shared::look`], relative to the
/// arena's first page `base`, a page number) that are no longer shared
/// with the parent: mapped here alone, or not at all, or shared only with
/// other processes (the parent maps no page there, or a page of its own);
/// all of them if `mine` cannot be read, and all those of a span whose
/// entries in `parents` cannot (the parent is gone). Words near each other
/// are read together, up to `span` pages per read (a multiple of 64).
///
/// A page that several children share after the parent dropped it counts
/// in each of them (so more than once, where a memory cgroup charges it
/// once), as none of them can tell which of the others still maps it (a
/// page map shows the frame number only to `CAP_SYS_ADMIN`; where it
/// shows it, a frame the parent does not map there is not the parent's
/// either). Counting it nowhere let the command's processes keep that much
/// more than the budget resident.
pub fn not_shared(
    words: &[(usize, u64)],
    base: usize,
    span: usize,
    mine: &impl PageMap,
    parents: &impl PageMap,
) -> Vec<usize> {
    let mut map = vec![0u64; span];
    let mut theirs = vec![0u64; span];
    let mut gone = Vec::new();
    let mut k = 0;
    while k < words.len() {
        // A span: the words from this one on, up to `span` pages (within
        // an ascending run).
        let first = words[k].0;
        let mut end = k + 1;
        while end < words.len() && words[end].0 > words[end - 1].0 && (words[end].0 - first + 1) * 64 <= span
        {
            end += 1;
        }
        let bytes = (words[end - 1].0 - first + 1) * 64 * 8;
        let ok = mine.read(&mut map, base + first * 64, bytes);
        // Only where a page still looks shared is the parent's entry
        // needed.
        let shared = |e: u64| e & PRESENT != 0 && e & EXCLUSIVE == 0;
        let asked = ok && map[..bytes / 8].iter().any(|&e| shared(e));
        let parent_ok = asked && parents.read(&mut theirs, base + first * 64, bytes);
        for &(w, x) in &words[k..end] {
            let mut y = x;
            while y != 0 {
                let b = y.trailing_zeros() as usize;
                y &= y - 1;
                let (e, p) = (map[(w - first) * 64 + b], theirs[(w - first) * 64 + b]);
                let not_parents =
                    !parent_ok || !shared(p) || (e & PFN != 0 && p & PFN != 0 && e & PFN != p & PFN);
                if !ok || !shared(e) || not_parents {
                    gone.push(w * 64 + b);
                }
            }
        }
        k = end;
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn pages_leave_the_set_once_and_the_count_follows() {
        let mut s = Shared::new(130);
        assert_eq!(s.count(), 0);
        for i in [0, 63, 64, 129, 64] {
            s.insert(i);
        }
        assert_eq!(s.count(), 4, "a page inserted twice counts once");
        assert!(s.has(0) && s.has(63) && s.has(64) && s.has(129));
        assert!(!s.has(1) && !s.has(128) && !s.has(10_000), "out of range: not shared");
        assert!(s.take(63));
        assert!(!s.take(63), "taken once");
        assert!(!s.take(10_000));
        assert_eq!(s.count(), 3);
        assert!(!s.has(63));
    }

    #[test]
    fn looks_are_spaced_and_go_round_the_set() {
        let t0 = Instant::now();
        let every = Duration::from_millis(50);
        let mut s = Shared::new(64 * 10);
        for w in [1, 3, 4, 8] {
            s.insert(w * 64 + 5);
        }
        // Two words' worth of pages per look.
        let first = s.look(t0, every, 128).expect("the first look is due");
        assert_eq!(first, [(1, 1 << 5), (3, 1 << 5)]);
        assert_eq!(s.look(t0 + every / 2, every, 128), None, "too soon");
        let second = s.look(t0 + every, every, 128).unwrap();
        assert_eq!(second, [(4, 1 << 5), (8, 1 << 5)]);
        // Round again from the start.
        let third = s.look(t0 + every * 2, every, 128).unwrap();
        assert_eq!(third, [(1, 1 << 5), (3, 1 << 5)]);
        // As many as there are, at most.
        let all = s.look(t0 + every * 3, every, 1 << 20).unwrap();
        assert_eq!(all.len(), 4);
        // None left: an empty look.
        let mut e = Shared::new(0);
        assert_eq!(e.look(t0, every, 128), Some(vec![]));
    }

    /// A page map of fixed entries by page number; counts its reads and
    /// the most pages one read asked for.
    struct Fake {
        entries: Vec<u64>,
        readable: bool,
        reads: RefCell<(usize, usize)>,
    }

    impl Fake {
        fn new(pages: usize, readable: bool) -> Fake {
            Fake { entries: vec![0; pages], readable, reads: RefCell::new((0, 0)) }
        }
    }

    impl PageMap for Fake {
        fn read(&self, map: &mut [u64], first: usize, bytes: usize) -> bool {
            let mut r = self.reads.borrow_mut();
            r.0 += 1;
            r.1 = r.1.max(bytes / 8);
            if !self.readable || bytes > map.len() * 8 || first + bytes / 8 > self.entries.len() {
                return false;
            }
            map[..bytes / 8].copy_from_slice(&self.entries[first..first + bytes / 8]);
            true
        }
    }

    const SHARED: u64 = PRESENT;
    const ALONE: u64 = PRESENT | EXCLUSIVE;

    #[test]
    fn a_look_finds_the_pages_no_longer_shared_with_the_parent() {
        let base = 1000;
        let (mut mine, mut parents) = (Fake::new(base + 256, true), Fake::new(base + 256, true));
        // Page 0: still shared (present, not exclusive, here and there).
        mine.entries[base] = SHARED;
        parents.entries[base] = SHARED;
        // 1: written here since: exclusive here.
        mine.entries[base + 1] = ALONE;
        parents.entries[base + 1] = ALONE;
        // 2: no longer mapped here.
        parents.entries[base + 2] = SHARED;
        // 3: shared here, but the parent dropped it (its siblings share it).
        mine.entries[base + 3] = SHARED;
        // 4: shared here, the parent has a page of its own there.
        mine.entries[base + 4] = SHARED;
        parents.entries[base + 4] = ALONE;
        // 5: shared in both, but other frames (the frame numbers show).
        mine.entries[base + 5] = SHARED | 77;
        parents.entries[base + 5] = SHARED | 78;
        // 6: shared in both, the same frame.
        mine.entries[base + 6] = SHARED | 77;
        parents.entries[base + 6] = SHARED | 77;
        // 200: a word further on, still shared.
        mine.entries[base + 200] = SHARED;
        parents.entries[base + 200] = SHARED;
        let words = [(0, 0b111_1111), (3, 1 << 8)];
        assert_eq!(not_shared(&words, base, 4096, &mine, &parents), [1, 2, 3, 4, 5]);
        // One read of each map covers both words (4 words' span).
        assert_eq!(mine.reads.borrow().0, 1);
        assert_eq!(parents.reads.borrow().0, 1);
        assert_eq!(mine.reads.borrow().1, 4 * 64);
    }

    #[test]
    fn unreadable_page_maps_make_the_pages_looked_at_this_processs() {
        let base = 0;
        let mut mine = Fake::new(256, true);
        mine.entries[..128].fill(SHARED);
        let words = [(0, u64::MAX), (1, 1)];
        // Its own map unreadable: every page looked at.
        let unreadable = Fake::new(256, false);
        let all = not_shared(&words, base, 4096, &unreadable, &mine);
        assert_eq!(all.len(), 65);
        assert_eq!(unreadable.reads.borrow().0, 1);
        assert_eq!(mine.reads.borrow().0, 0, "the parent's is not read then");
        // The parent's unreadable (the parent is gone): all of them too.
        let gone = Fake::new(256, false);
        assert_eq!(not_shared(&words, base, 4096, &mine, &gone).len(), 65);
        // Nothing looks shared here: the parent's map is not read.
        let alone = Fake::new(256, true);
        let parents = Fake::new(256, true);
        assert_eq!(not_shared(&words, base, 4096, &alone, &parents).len(), 65);
        assert_eq!(parents.reads.borrow().0, 0);
    }

    #[test]
    fn reads_stay_within_the_span_and_follow_ascending_runs() {
        let (mut mine, mut parents) = (Fake::new(64 * 200, true), Fake::new(64 * 200, true));
        mine.entries.fill(SHARED);
        parents.entries.fill(SHARED);
        // Words 0..10 and, after the look wrapped round, 2 again.
        let words: Vec<(usize, u64)> = (0..10).map(|w| (w, 1)).chain([(2, 1)]).collect();
        assert_eq!(not_shared(&words, 0, 4 * 64, &mine, &parents), []);
        let (reads, most) = *mine.reads.borrow();
        assert_eq!(most, 4 * 64, "at most a span per read");
        // 0..4, 4..8, 8..10, then 2 alone (not ascending).
        assert_eq!(reads, 4);
    }
}
