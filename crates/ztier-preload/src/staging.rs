//! The staging area: pages evicted by moving them out of the arena
//! (`UFFDIO_MOVE`), and recycled to bring pages back in.
//!
//! ```text
//!  staging area (a private mapping of SLOTS pages, registered with the
//!  userfaultfd for write protection only: a move needs its destination
//!  registered, and a stray touch of an empty slot gets a zero page
//!  instead of a fault for the handler)
//!
//!  slot  ┌───────┬──────────┬──────┬──────┬───────┬─────┐
//!        │ EMPTY │ INFLIGHT │ FREE │ FREE │ EMPTY │ ... │
//!        └───────┴──────────┴──────┴──────┴───────┴─────┘
//!
//!   EMPTY ──evictor: UFFDIO_MOVE arena page → slot──► INFLIGHT
//!   INFLIGHT ──compressed, committed──► FREE (pool, FIFO)
//!   FREE ──fault: decompress into it, UFFDIO_MOVE slot → arena──► EMPTY
//!   FREE ──pool over its cap (or fork): MADV_DONTNEED──► EMPTY
//! ```
//!
//! Why: evicting by write protection, read, `MADV_DONTNEED` changes the
//! program's page tables twice per run (two TLB shootdowns on the
//! program's CPU) and makes writers wait for the eviction; a move takes
//! the page out atomically in one change, and the program's next touch
//! is a missing-page fault like any other. Installing by `UFFDIO_COPY`
//! allocates a page, charges it to the memory cgroup, puts it on an LRU
//! list and copies 4 KiB into it; moving in a page the evictor freed
//! does none of that (`scripts/uffd-move-vs-copy.c` measures both).
//!
//! The pool's pages are memory the program's budget pays for: the
//! manager counts them with the resident pages.

use std::collections::VecDeque;
use std::io;

use crate::sys;

/// Page size.
const PAGE: usize = 4096;
/// Slots in the staging area (16 MiB of address space, reserved only
/// as pages arrive).
pub const SLOTS: usize = 4096;
/// Largest pool of free pages kept for recycling; more are released.
pub const POOL_MAX: usize = 1024;

const EMPTY: u8 = 0;
const INFLIGHT: u8 = 1;
const FREE: u8 = 2;

/// The staging area's slots and its pool of free pages.
pub struct Staging {
    /// First slot's address.
    pub base: usize,
    state: Vec<u8>,
    pool: VecDeque<u32>,
    cursor: usize,
}

impl Staging {
    /// Maps a staging area of `slots` pages.
    pub fn new(slots: usize) -> io::Result<Staging> {
        let p = sys::mmap(
            std::ptr::null_mut(),
            slots * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // A huge page here would make every move into it fail (EEXIST).
        sys::madvise(p, slots * PAGE, libc::MADV_NOHUGEPAGE);
        Ok(Staging { base: p as usize, state: vec![EMPTY; slots], pool: VecDeque::new(), cursor: 0 })
    }

    /// Bytes of address space.
    pub fn bytes(&self) -> usize {
        self.state.len() * PAGE
    }

    /// Address of a slot.
    pub fn addr(&self, slot: u32) -> usize {
        self.base + slot as usize * PAGE
    }

    /// Free pages in the pool.
    pub fn pooled(&self) -> usize {
        self.pool.len()
    }

    /// Takes `n` adjacent empty slots (for a run of victims), the first
    /// found from where the last search ended; `None` if there are none.
    pub fn alloc(&mut self, n: usize) -> Option<u32> {
        let total = self.state.len();
        if n == 0 || n > total {
            return None;
        }
        let mut run = 0;
        for look in 0..total + n {
            let j = (self.cursor + look) % total;
            if j == 0 {
                // A run cannot wrap around the end.
                run = 0;
            }
            if self.state[j] != EMPTY {
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                let first = j + 1 - n;
                self.state[first..=j].fill(INFLIGHT);
                self.cursor = (j + 1) % total;
                return Some(first as u32);
            }
        }
        None
    }

    /// A slot whose page left (moved into the arena, or never came).
    pub fn set_empty(&mut self, slot: u32) {
        self.state[slot as usize] = EMPTY;
    }

    /// A slot whose page is free for recycling: to the back of the pool.
    pub fn free(&mut self, slot: u32) {
        debug_assert_ne!(self.state[slot as usize], FREE);
        self.state[slot as usize] = FREE;
        self.pool.push_back(slot);
    }

    /// Takes `n` free pages from the pool (oldest first), if it has them;
    /// they are the caller's until [`Staging::set_empty`] or
    /// [`Staging::free`].
    pub fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.pool.len() < n {
            return None;
        }
        let slots: Vec<u32> = self.pool.drain(..n).collect();
        for &s in &slots {
            self.state[s as usize] = INFLIGHT;
        }
        Some(slots)
    }

    /// Releases free pages until at most `keep` are left (the newest
    /// first); returns how many went.
    pub fn trim(&mut self, keep: usize) -> io::Result<usize> {
        let mut gone = Vec::new();
        while self.pool.len() > keep {
            gone.push(self.pool.pop_back().expect("non-empty"));
        }
        self.drop_slots(&gone)?;
        Ok(gone.len())
    }

    /// Releases the pages of `slots` (held by the caller, not in the
    /// pool): they become empty.
    pub fn drop_slots(&mut self, slots: &[u32]) -> io::Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &s in &sorted {
            self.state[s as usize] = EMPTY;
            let a = self.addr(s);
            match ranges.last_mut() {
                Some((start, l)) if *start + *l == a => *l += PAGE,
                _ => ranges.push((a, PAGE)),
            }
        }
        sys::madvise_many(&ranges, libc::MADV_DONTNEED)
    }
}

/// Runs of adjacent slots in `slots`: (position in `slots`, length).
pub fn slot_runs(slots: &[u32]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (k, &s) in slots.iter().enumerate() {
        match runs.last_mut() {
            Some((p, n)) if slots[*p] as usize + *n == s as usize => *n += 1,
            _ => runs.push((k, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_adjacent_empty_slots_and_never_wrap() {
        let mut s = Staging::new(16).unwrap();
        assert_eq!(s.alloc(5), Some(0));
        assert_eq!(s.alloc(5), Some(5));
        assert_eq!(s.alloc(5), Some(10));
        // Slots 15 is empty but a run of 2 cannot wrap to slot 0.
        assert_eq!(s.alloc(2), None);
        assert_eq!(s.alloc(1), Some(15));
        for k in 5..10 {
            s.free(k);
        }
        s.set_empty(2);
        s.set_empty(3);
        assert_eq!(s.alloc(2), Some(2));
        assert_eq!(s.alloc(1), None, "slots 5..10 are in the pool, not empty");
        assert_eq!(s.pooled(), 5);
        let taken = s.take(3).unwrap();
        assert_eq!(taken, vec![5, 6, 7]);
        assert_eq!(slot_runs(&taken), vec![(0, 3)]);
        assert!(s.take(3).is_none(), "two left");
        for &k in &taken {
            s.set_empty(k);
        }
        assert_eq!(s.alloc(3), Some(5));
        assert_eq!(slot_runs(&[7, 8, 3, 4, 9]), vec![(0, 2), (2, 2), (4, 1)]);
    }

    #[test]
    fn trimming_releases_the_newest_free_pages() {
        let mut s = Staging::new(8).unwrap();
        let first = s.alloc(4).unwrap();
        for k in 0..4 {
            // SAFETY: a slot of our own staging mapping, readable and writable.
            unsafe { *((s.addr(first + k)) as *mut u8) = 9 };
            s.free(first + k);
        }
        assert_eq!(s.trim(1).unwrap(), 3);
        assert_eq!(s.pooled(), 1);
        // SAFETY: as above; the released page reads as zero again.
        assert_eq!(unsafe { *(s.addr(first + 3) as *const u8) }, 0);
        // SAFETY: as above; the kept (oldest) page keeps its content.
        assert_eq!(unsafe { *(s.addr(first) as *const u8) }, 9);
        // From where the last search ended; then past the end, from the start.
        assert_eq!(s.alloc(3), Some(4));
        assert_eq!(s.alloc(3), Some(1));
    }
}
