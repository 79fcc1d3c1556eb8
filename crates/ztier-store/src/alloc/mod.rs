//! Allocators for variable-size compressed pages, behind one trait.
//!
//! The three designs the seeds argued about, so they can be compared on the
//! same pages and chosen at run time:
//!
//! * [`cells::Cells`] — de Castro et al. 2003: memory in *cells* of N
//!   contiguous pages; a compressed page goes to the cell whose free space
//!   after placing it would be smallest (best fit); a cell whose total free
//!   space fits but whose contiguous free space does not is compacted
//!   first; shrinking relocates fragments to free whole cells.
//! * [`chunks::Chunks`] — CCache (2007): memory in pages, a compressed page
//!   stored as one or more variable *chunks*, none crossing a page
//!   boundary; free neighbours merge; a fully free page is released.
//! * [`classes::Classes`] — size classes as in zsmalloc: objects rounded up
//!   to a class size and kept in slabs of 1–4 pages chosen to waste least;
//!   compaction moves objects out of sparse slabs.
//!
//! Every allocation carries an *owner* (the store's entry id) so that an
//! allocator can move data during compaction and tell the store where it
//! went. All memory an allocator holds, including its own metadata, is
//! reported by [`Allocator::memory_used`]; the store's budget counts it.

pub mod cells;
pub mod chunks;
pub mod classes;

/// Where an allocation lives; meaningful only to the allocator that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc(pub u64);

/// A move made by compaction: the data of `owner` now lives at `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// The owner given at allocation.
    pub owner: u64,
    /// The new location.
    pub to: Loc,
}

/// An allocator of variable-size byte strings (compressed pages).
pub trait Allocator: Send {
    /// A short name for reports (`cells2`, `chunks`, `classes`).
    fn name(&self) -> String;

    /// Stores `data` (1..=4096 bytes), remembering `owner`. Returns `None`
    /// only if `limit` bytes of total memory would be exceeded (the
    /// allocator grows on its own below that). An allocator that moves
    /// other data to make room reports each move through `moved` before
    /// returning.
    fn alloc(&mut self, data: &[u8], owner: u64, limit: usize, moved: &mut dyn FnMut(Moved)) -> Option<Loc>;

    /// Copies the `len` bytes stored at `loc` into `out[..len]`.
    fn read(&self, loc: Loc, len: usize, out: &mut [u8]);

    /// The `len` bytes stored at `loc`, in place, if the allocator keeps
    /// them in one piece (`None`: use [`Self::read`]).
    fn bytes(&self, loc: Loc, len: usize) -> Option<&[u8]> {
        let _ = (loc, len);
        None
    }

    /// Flips bits of the stored bytes (for corruption tests only).
    #[doc(hidden)]
    fn corrupt(&mut self, loc: Loc, byte: usize);

    /// Frees the `len` bytes at `loc`.
    fn free(&mut self, loc: Loc, len: usize);

    /// Bytes of memory held: backing pages plus the allocator's metadata.
    ///
    /// It should never grow on [`Self::free`], and a free that undoes an
    /// [`Self::alloc`] should give back all the alloc took: a store whose
    /// remaining entries cannot be evicted (pinned) has nothing else to
    /// make up for it with. So every allocator charges what a free pushes
    /// on at a bound fixed when it allocated. Chunks: one free extent per
    /// chunk and per page, and its tables by their slots. Cells and
    /// classes: their lists of released (and partly used) cells or slabs
    /// at the capacity of their records, reserved when the records grow
    /// (by an eighth, which an alloc counts against `limit`). The store
    /// test `one_shard_stays_within_its_share` checks it for all of them.
    fn memory_used(&self) -> usize;

    /// Of [`Self::memory_used`], the allocator's own metadata.
    fn metadata_bytes(&self) -> usize;

    /// Compacts, reporting every move through `moved`, and releases what
    /// it can. Returns the bytes of memory released.
    fn compact(&mut self, moved: &mut dyn FnMut(Moved)) -> usize;
}

/// Which allocator a store uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorKind {
    /// de Castro's cells of this many pages.
    Cells(usize),
    /// CCache's chunks.
    Chunks,
    /// zsmalloc-style size classes.
    Classes,
}

impl AllocatorKind {
    /// A new allocator of this kind.
    pub fn build(self) -> Box<dyn Allocator> {
        match self {
            AllocatorKind::Cells(n) => Box::new(cells::Cells::new(n)),
            AllocatorKind::Chunks => Box::new(chunks::Chunks::new()),
            AllocatorKind::Classes => Box::new(classes::Classes::new()),
        }
    }

    /// The name used on command lines: `cells` (2 pages), `cellsN`,
    /// `chunks`, `classes`.
    pub fn name(self) -> String {
        match self {
            AllocatorKind::Cells(n) => format!("cells{n}"),
            AllocatorKind::Chunks => "chunks".into(),
            AllocatorKind::Classes => "classes".into(),
        }
    }
}

impl std::str::FromStr for AllocatorKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cells" => Ok(AllocatorKind::Cells(2)),
            "chunks" => Ok(AllocatorKind::Chunks),
            "classes" => Ok(AllocatorKind::Classes),
            _ => match s.strip_prefix("cells").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if (1..=16).contains(&n) => Ok(AllocatorKind::Cells(n)),
                _ => Err(format!("unknown allocator '{s}' (cells, cells1..cells16, chunks, classes)")),
            },
        }
    }
}

/// Heap bytes of a `Vec`'s buffer (its capacity, not its length).
pub(crate) fn vec_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

#[cfg(test)]
pub(crate) mod testing {
    //! A generic workout every allocator must pass.
    use super::*;
    use std::collections::HashMap;

    pub fn workout(mut a: Box<dyn Allocator>) {
        let mut live: HashMap<u64, (Loc, Vec<u8>)> = HashMap::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let limit = 1 << 30;
        for owner in 0..3000u64 {
            let r = rnd();
            if r % 3 == 0 && !live.is_empty() {
                let k = *live.keys().nth((r as usize / 3) % live.len()).unwrap();
                let (loc, data) = live.remove(&k).unwrap();
                a.free(loc, data.len());
                continue;
            }
            let len = 1 + (rnd() % 4096) as usize;
            let data: Vec<u8> = (0..len).map(|i| (owner as usize * 31 + i) as u8).collect();
            let mut moves = Vec::new();
            let loc = a.alloc(&data, owner, limit, &mut |m| moves.push(m)).expect("room");
            for m in moves {
                live.get_mut(&m.owner).expect("moved a live owner").0 = m.to;
            }
            live.insert(owner, (loc, data));
            if owner % 500 == 499 {
                let mut moves = Vec::new();
                a.compact(&mut |m| moves.push(m));
                for m in moves {
                    live.get_mut(&m.owner).expect("moved a live owner").0 = m.to;
                }
            }
        }
        let mut buf = vec![0u8; 4096];
        for (loc, data) in live.values() {
            a.read(*loc, data.len(), &mut buf);
            assert_eq!(&buf[..data.len()], &data[..], "{}", a.name());
        }
        let used = a.memory_used();
        let stored: usize = live.values().map(|v| v.1.len()).sum();
        assert!(used >= stored, "{}: memory_used {used} < stored {stored}", a.name());
        for (_, (loc, data)) in live.drain() {
            a.free(loc, data.len());
        }
        a.compact(&mut |_| panic!("nothing live to move"));
        assert!(a.memory_used() - a.metadata_bytes() == 0, "{}: pages left after freeing all", a.name());
        // The limit is honoured.
        assert!(a.alloc(&[1u8; 100], 1, 10, &mut |_| {}).is_none());
    }
}
