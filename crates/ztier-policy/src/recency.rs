//! Exact LRU stack distances in O(log n) per reference.
//!
//! The *stack distance* of a reference is the page's depth in the LRU stack
//! just before the reference: 1 if it is the most recently used page, d if
//! d − 1 other distinct pages were referenced since its last use. A memory
//! of m pages managed by LRU hits exactly the references with distance ≤ m,
//! so one pass gives the hit count for every memory size, and a policy can
//! split the stack into regions (uncompressed, compressed, ghost) by depth.
//!
//! # Method (Bennett & Kruskal 1975; Olken 1981)
//!
//! Every reference gets the next *time slot*. Each tracked page has one mark
//! in a Fenwick tree at the slot of its last reference:
//!
//! ```text
//!  slot:   0  1  2  3  4  5  6  7        page at slot (`at`)
//!  mark:   .  1  .  1  1  .  1  ·        now = 7 (next slot)
//!               A     B  C     D         reference to B (last at slot 3):
//!                                        distance = marks after slot 3 + 1 = 3
//! ```
//!
//! The distance of a page last used at slot t is 1 + (marks after t) =
//! 1 + live − prefix(t): two Fenwick walks, O(log n). The mark then moves to
//! the new slot. When slots run out (`capacity` = 2 × the tracking limit),
//! the live marks are renumbered 0..live in order and the tree is rebuilt in
//! O(n), so the cost stays O(log n) amortised. The oldest tracked page is
//! found by a Fenwick search for the first mark, also O(log n); pages
//! beyond the tracking limit are forgotten (their next reference has no
//! distance, like a first reference).

use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashMap;

const EMPTY: u64 = u64::MAX;

/// A multiplicative hasher for page numbers (no DoS concern: keys are
/// page numbers of the program being traced or managed).
#[derive(Default)]
pub struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

type PageMap<V> = HashMap<u64, V, BuildHasherDefault<PageHasher>>;

/// Adds `delta` at 0-based `slot` of a 1-based Fenwick tree.
#[inline]
fn fenwick_add(tree: &mut [u32], slot: usize, delta: i32) {
    let mut i = slot + 1;
    while i < tree.len() {
        tree[i] = tree[i].wrapping_add_signed(delta);
        i += i & i.wrapping_neg();
    }
}

/// Sum over 0-based slots 0..=slot.
#[inline]
fn fenwick_prefix(tree: &[u32], slot: usize) -> usize {
    let mut i = slot + 1;
    let mut s = 0usize;
    while i > 0 {
        s += tree[i] as usize;
        i &= i - 1;
    }
    s
}

/// The 0-based slot of the k-th mark (k ≥ 1, oldest first).
fn fenwick_kth(tree: &[u32], mut k: usize) -> usize {
    let n = tree.len() - 1;
    let mut pos = 0usize;
    let mut step = 1usize << (usize::BITS - 1 - n.leading_zeros());
    while step > 0 {
        let next = pos + step;
        if next <= n && (tree[next] as usize) < k {
            pos = next;
            k -= tree[next] as usize;
        }
        step >>= 1;
    }
    pos // the mark is at 1-based index pos + 1
}

/// Exact LRU stack distances over at most `limit` tracked pages.
pub struct Recency {
    limit: usize,
    last: PageMap<u32>,
    /// Page whose last reference is at each slot, or `EMPTY`.
    at: Vec<u64>,
    /// Fenwick tree (1-based) over slots: 1 where a mark is.
    tree: Vec<u32>,
    now: usize,
    live: usize,
    /// The most recently referenced page (`EMPTY` if none).
    top: u64,
}

impl Recency {
    /// A tracker remembering at most `limit` pages (resident plus ghosts).
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        let cap = (2 * limit).max(1024);
        Recency {
            limit,
            last: PageMap::with_capacity_and_hasher(limit.min(1 << 20), Default::default()),
            at: vec![EMPTY; cap],
            tree: vec![0; cap + 1],
            now: 0,
            live: 0,
            top: EMPTY,
        }
    }

    /// Pages tracked.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True if no page is tracked.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The tracking limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn add(&mut self, slot: usize, delta: i32) {
        fenwick_add(&mut self.tree, slot, delta);
    }

    /// Marks at slots 0..=slot.
    fn prefix(&self, slot: usize) -> usize {
        fenwick_prefix(&self.tree, slot)
    }

    fn renumber(&mut self) {
        let mut j = 0;
        for i in 0..self.now {
            let p = self.at[i];
            if p != EMPTY {
                self.at[i] = EMPTY;
                self.at[j] = p;
                *self.last.get_mut(&p).expect("tracked page") = j as u32;
                j += 1;
            }
        }
        debug_assert_eq!(j, self.live);
        // Linear Fenwick build over marks at 0..j.
        self.tree.iter_mut().for_each(|t| *t = 0);
        let n = self.tree.len() - 1;
        for i in 1..=n {
            if i <= j {
                self.tree[i] += 1;
            }
            let parent = i + (i & i.wrapping_neg());
            if parent <= n {
                let v = self.tree[i];
                self.tree[parent] += v;
            }
        }
        self.now = j;
    }

    /// Records a reference to `page`; returns its stack distance (1-based),
    /// or `None` for a page not tracked (first reference, or forgotten).
    /// `forgotten` receives a page dropped to respect the limit.
    pub fn access_evicting(&mut self, page: u64, forgotten: &mut Option<u64>) -> Option<usize> {
        // Most references of real programs repeat the previous page: it is
        // already on top of the stack, and stays there.
        if page == self.top && self.live > 0 {
            return Some(1);
        }
        self.top = page;
        if self.now == self.at.len() {
            self.renumber();
        }
        let slot = self.now;
        self.now += 1;
        // One hash lookup on the hot path: a hit moves the page's slot in place.
        let Recency { last, at, tree, live, limit, .. } = self;
        let d = match last.get_mut(&page) {
            Some(t) => {
                let old = *t as usize;
                *t = slot as u32;
                let d = *live - fenwick_prefix(tree, old) + 1;
                fenwick_add(tree, old, -1);
                at[old] = EMPTY;
                Some(d)
            }
            None => {
                if *live == *limit {
                    let oldest = fenwick_kth(tree, 1);
                    let p = at[oldest];
                    fenwick_add(tree, oldest, -1);
                    at[oldest] = EMPTY;
                    last.remove(&p);
                    *forgotten = Some(p);
                } else {
                    *live += 1;
                }
                last.insert(page, slot as u32);
                None
            }
        };
        fenwick_add(tree, slot, 1);
        at[slot] = page;
        d
    }

    /// Records a reference to `page`; returns its stack distance.
    pub fn access(&mut self, page: u64) -> Option<usize> {
        let mut f = None;
        self.access_evicting(page, &mut f)
    }

    /// The depth of `page` in the LRU stack (1 = most recent), without
    /// referencing it.
    pub fn depth(&self, page: u64) -> Option<usize> {
        self.last.get(&page).map(|&t| self.live - self.prefix(t as usize) + 1)
    }

    /// The page at depth `d` (1 = most recent).
    pub fn page_at(&self, d: usize) -> Option<u64> {
        if d == 0 || d > self.live {
            return None;
        }
        Some(self.at[fenwick_kth(&self.tree, self.live - d + 1)])
    }

    /// Forgets `page` (e.g. freed by the program). Returns whether it was tracked.
    pub fn remove(&mut self, page: u64) -> bool {
        if page == self.top {
            self.top = EMPTY;
        }
        match self.last.remove(&page) {
            Some(t) => {
                self.add(t as usize, -1);
                self.at[t as usize] = EMPTY;
                self.live -= 1;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook O(n) LRU stack.
    struct Naive {
        stack: Vec<u64>,
        limit: usize,
    }

    impl Naive {
        fn access(&mut self, p: u64) -> (Option<usize>, Option<u64>) {
            let d = self.stack.iter().position(|&x| x == p).map(|i| i + 1);
            let mut forgotten = None;
            match d {
                Some(i) => {
                    self.stack.remove(i - 1);
                }
                None if self.stack.len() == self.limit => forgotten = self.stack.pop(),
                None => {}
            }
            self.stack.insert(0, p);
            (d, forgotten)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn matches_the_naive_stack(
            refs in prop::collection::vec(0..64u64, 1..3000),
            limit in 1..80usize,
            removals in prop::collection::vec((0..3000usize, 0..64u64), 0..20),
        ) {
            let mut r = Recency::new(limit);
            let mut n = Naive { stack: Vec::new(), limit };
            for (i, &p) in refs.iter().enumerate() {
                for &(at, q) in &removals {
                    if at == i {
                        let was = n.stack.iter().position(|&x| x == q);
                        if let Some(k) = was {
                            n.stack.remove(k);
                        }
                        prop_assert_eq!(r.remove(q), was.is_some());
                    }
                }
                let mut f = None;
                let d = r.access_evicting(p, &mut f);
                let (nd, nf) = n.access(p);
                prop_assert_eq!(d, nd, "reference {} to page {}", i, p);
                prop_assert_eq!(f, nf);
                prop_assert_eq!(r.len(), n.stack.len());
                if i % 97 == 0 {
                    for (k, &q) in n.stack.iter().enumerate() {
                        prop_assert_eq!(r.page_at(k + 1), Some(q));
                        prop_assert_eq!(r.depth(q), Some(k + 1));
                    }
                    prop_assert_eq!(r.page_at(n.stack.len() + 1), None);
                }
            }
        }
    }

    #[test]
    fn renumbering_keeps_distances_over_many_slot_generations() {
        // 10 slot generations of a 300-page loop: every distance is 300.
        let mut r = Recency::new(1000);
        for i in 0..300u64 {
            assert_eq!(r.access(i), None);
        }
        for k in 0..20_000u64 {
            assert_eq!(r.access(k % 300), Some(300));
        }
        assert_eq!(r.len(), 300);
    }
}
