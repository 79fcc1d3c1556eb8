//! The page-range allocator of the arena's page region: large `malloc`
//! blocks and the program's anonymous `mmap`s. Free ranges are kept by
//! start (for merging) and by (length, start) (best fit). Every free range
//! holds zero pages: a range is returned only after its memory was
//! released (`MADV_DONTNEED`) and its compressed copies dropped.
//!
//! ```text
//!  page region: [ used ][ free ........ ][ used ][ free ][ untouched ... ]
//!  by_start: start -> len          by_len: (len, start)
//! ```
//!
//! Large `malloc` blocks up to [`CACHE_MAX_PAGES`] are not released when
//! freed but kept, contents and all, in per-length stacks (bounded by
//! [`CACHE_TOTAL_PAGES`]) and handed out again: a program that frees and
//! allocates blocks of the same size does not pay a fault per page again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Largest block (pages) kept in the reuse cache.
pub const CACHE_MAX_PAGES: usize = 64;
/// Pages the reuse cache may hold in total.
pub const CACHE_TOTAL_PAGES: usize = 16384;

/// Free ranges, large-block sizes and the reuse cache; page numbers are
/// absolute arena page indices.
pub struct PageAlloc {
    by_start: BTreeMap<usize, usize>,
    by_len: BTreeSet<(usize, usize)>,
    /// Live large `malloc` blocks: first page -> pages.
    pub large: HashMap<usize, usize>,
    cache: Vec<Vec<usize>>,
    cached: usize,
    /// Highest page index ever handed out + 1.
    pub high: usize,
}

impl PageAlloc {
    /// One free range `[first, first + pages)`.
    pub fn new(first: usize, pages: usize) -> PageAlloc {
        let mut a = PageAlloc {
            by_start: BTreeMap::new(),
            by_len: BTreeSet::new(),
            large: HashMap::new(),
            cache: vec![Vec::new(); CACHE_MAX_PAGES + 1],
            cached: 0,
            high: first,
        };
        a.insert(first, pages);
        a
    }

    fn insert(&mut self, start: usize, len: usize) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
    }

    fn remove(&mut self, start: usize, len: usize) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
    }

    /// Allocates `n` pages whose first page index is a multiple of `align`
    /// (pages, a power of two). Best fit; `None` when the region is full.
    pub fn alloc(&mut self, n: usize, align: usize) -> Option<usize> {
        let want = n + align - 1;
        let &(len, start) = self.by_len.range((want, 0)..).next()?;
        self.remove(start, len);
        let first = start.next_multiple_of(align);
        if first > start {
            self.insert(start, first - start);
        }
        let end = start + len;
        if first + n < end {
            self.insert(first + n, end - first - n);
        }
        self.high = self.high.max(first + n);
        Some(first)
    }

    /// Takes exactly `[first, first + n)` if it is all free.
    pub fn take(&mut self, first: usize, n: usize) -> bool {
        let Some((&start, &len)) = self.by_start.range(..=first).next_back() else { return false };
        if start + len < first + n {
            return false;
        }
        self.remove(start, len);
        if first > start {
            self.insert(start, first - start);
        }
        if first + n < start + len {
            self.insert(first + n, start + len - first - n);
        }
        self.high = self.high.max(first + n);
        true
    }

    /// The free ranges that overlap `[first, first + n)`, as `(start,
    /// len)`, last first.
    fn free_overlapping(&self, first: usize, n: usize) -> Vec<(usize, usize)> {
        self.by_start
            .range(..first + n)
            .rev()
            .take_while(|&(&s, &l)| s + l > first)
            .map(|(&s, &l)| (s, l))
            .collect()
    }

    /// Takes whatever of `[first, first + n)` is free (the rest is in use
    /// already): all of it is in use after.
    pub fn take_within(&mut self, first: usize, n: usize) {
        let end = first + n;
        for (s, l) in self.free_overlapping(first, n) {
            self.remove(s, l);
            if s < first {
                self.insert(s, first - s);
            }
            if s + l > end {
                self.insert(end, s + l - end);
            }
        }
        self.high = self.high.max(end);
    }

    /// Returns `[first, first + n)` (already released) to the free ranges,
    /// merged with every free range it overlaps or touches: part or all
    /// of it may be free already (a program may unmap a range twice, or
    /// one that spans holes it unmapped before, as the kernel allows).
    pub fn free(&mut self, first: usize, n: usize) {
        let (mut lo, mut hi) = (first, first + n);
        // Free ranges are disjoint and never touch, so those that overlap
        // or touch `[lo, hi)` are the last ones starting at or before
        // `hi`, back to the first that ends before `lo`: each merged in
        // turn (no allocation: this runs in the program's `munmap`).
        while let Some((s, l)) = self.by_start.range(..=hi).next_back().map(|(&s, &l)| (s, l)) {
            if s + l < lo {
                break;
            }
            self.remove(s, l);
            lo = lo.min(s);
            hi = hi.max(s + l);
        }
        self.insert(lo, hi - lo);
    }

    /// Is any page of `[first, first + n)` free: unmapped by the program,
    /// or never handed out?
    pub fn any_free(&self, first: usize, n: usize) -> bool {
        self.by_start.range(..first + n).next_back().is_some_and(|(&s, &l)| s + l > first)
    }

    /// The parts of `[first, first + n)` in use (not free), in order, as
    /// `(first, pages)`.
    pub fn used_within(&self, first: usize, n: usize) -> Vec<(usize, usize)> {
        let end = first + n;
        let mut out = Vec::new();
        let mut at = first;
        for (s, l) in self.free_overlapping(first, n).into_iter().rev() {
            if s > at {
                out.push((at, s - at));
            }
            at = at.max(s + l);
        }
        if at < end {
            out.push((at, end - at));
        }
        out
    }

    /// A cached block of exactly `n` pages (old contents), if any.
    pub fn cache_pop(&mut self, n: usize) -> Option<usize> {
        let p = self.cache.get_mut(n)?.pop()?;
        self.cached -= n;
        Some(p)
    }

    /// Keeps a freed block of `n` pages for reuse; `false` if it must be
    /// released instead (too large, or the cache is full).
    pub fn cache_push(&mut self, first: usize, n: usize) -> bool {
        if n > CACHE_MAX_PAGES || self.cached + n > CACHE_TOTAL_PAGES {
            return false;
        }
        self.cache[n].push(first);
        self.cached += n;
        true
    }

    /// Free pages (ranges only, not the cache).
    #[cfg(test)]
    pub fn free_pages(&self) -> usize {
        self.by_start.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_merge_and_alignment() {
        let mut a = PageAlloc::new(100, 1000);
        let x = a.alloc(10, 1).unwrap();
        let y = a.alloc(20, 16).unwrap();
        assert_eq!(y % 16, 0);
        assert!(y >= x + 10 || y + 20 <= x);
        assert_eq!(a.free_pages(), 970);
        a.free(x, 10);
        a.free(y, 20);
        assert_eq!(a.free_pages(), 1000);
        assert_eq!(a.by_start.len(), 1, "neighbours merge back into one range");
        assert!(a.take(500, 10));
        assert!(!a.take(505, 10), "taking a used range fails");
        assert!(a.alloc(2000, 1).is_none());
    }

    /// `take_within` takes the free parts of a range that is partly in
    /// use (`mremap` to a fixed address in the arena), and only those.
    #[test]
    fn take_within_takes_only_the_free_parts() {
        let mut a = PageAlloc::new(0, 1000);
        assert!(a.take(100, 50) && a.take(300, 50));
        // Free: [0, 100), [150, 300), [350, 1000).
        a.take_within(120, 300);
        assert_eq!(a.by_start.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(0, 100), (420, 580)]);
        assert_eq!(a.free_pages(), 680);
        a.take_within(420, 580);
        a.take_within(0, 1);
        assert_eq!(a.by_start.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(1, 99)]);
        assert_eq!(a.by_len.len(), 1);
    }

    /// A range freed twice, or over free ranges and used ones at once (a
    /// program unmapping across holes it made), leaves the free ranges
    /// disjoint, merged and consistent in both indexes.
    #[test]
    fn freeing_over_free_ranges_merges_them() {
        let mut a = PageAlloc::new(0, 1000);
        assert!(a.take(0, 400));
        a.free(100, 10);
        a.free(100, 10);
        a.free(105, 2);
        assert_eq!(a.by_start.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(100, 10), (400, 600)]);
        a.free(200, 10);
        // Across two free ranges and the used pages between and around.
        a.free(90, 130);
        assert_eq!(a.by_start.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(90, 130), (400, 600)]);
        // Touching the last one merges with it.
        a.free(220, 180);
        assert_eq!(a.by_start.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(90, 910)]);
        assert_eq!(a.by_len.iter().copied().collect::<Vec<_>>(), [(910, 90)]);
        assert_eq!(a.free_pages(), 910);
    }

    /// `any_free` and `used_within` see exactly the free pages of a range.
    #[test]
    fn free_and_used_parts_of_a_range() {
        let mut a = PageAlloc::new(0, 1000);
        assert!(a.take(0, 1000));
        a.free(100, 10);
        a.free(200, 10);
        assert!(!a.any_free(0, 100));
        assert!(a.any_free(0, 101));
        assert!(a.any_free(109, 1));
        assert!(!a.any_free(110, 90));
        assert!(a.any_free(150, 51));
        assert!(a.any_free(205, 500));
        assert_eq!(a.used_within(50, 200), [(50, 50), (110, 90), (210, 40)]);
        assert_eq!(a.used_within(100, 10), []);
        assert_eq!(a.used_within(105, 100), [(110, 90)]);
        assert_eq!(a.used_within(300, 5), [(300, 5)]);
    }

    #[test]
    fn cache_bounds() {
        let mut a = PageAlloc::new(0, 1 << 20);
        assert!(a.cache_push(10, 4));
        assert!(!a.cache_push(20, CACHE_MAX_PAGES + 1));
        assert_eq!(a.cache_pop(4), Some(10));
        assert_eq!(a.cache_pop(4), None);
    }
}
