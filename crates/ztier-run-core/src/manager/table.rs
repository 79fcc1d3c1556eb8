//! The per-page tables: page states, policy flags and stamps, hashes of
//! stored copies.

use super::*;
/// A per-page table: a private anonymous mapping of `len` zeroed `T`s,
/// backed only where touched (the arena is 64 GiB of address space), and
/// left out of core dumps ([`Host::exclude_from_core`](crate::host::Host::exclude_from_core)), seen as a slice: every
/// index is bounds-checked. Never unmapped: it lives as long as the
/// manager, which lives as long as the process (a forked child has its
/// copy).
pub struct Table<T: Zeroed> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
}

/// Types for which all-zero bytes are a value (what a fresh mapping
/// holds) and that need no drop (the table never drops its elements).
///
/// # Safety
/// An implementor must be valid when all its bytes are zero, have no
/// drop glue and an alignment of at most a page.
pub unsafe trait Zeroed {}
// SAFETY: integers and atomics: zero is a value, no drop, small alignment.
unsafe impl Zeroed for u8 {}
// SAFETY: as above.
unsafe impl Zeroed for u32 {}
// SAFETY: two `AtomicU64`s, as above.
unsafe impl Zeroed for CopyHash {}

/// The xxh3-128 hash of a page's stored copy ([`CleanMode::Verify`]), in
/// two halves read and written with relaxed atomics: an eviction batch
/// reads and writes its victims' hashes without the manager's lock
/// ([`Victims::compress_protected`]) while other batches work on theirs.
/// A victim is OWNED by one batch, and its ownership passes between
/// threads under the lock, so the halves of one page are never written
/// by two threads at once and a relaxed load sees the last store; the
/// atomics only make that sharing safe to write (a relaxed load or
/// store is a plain move).
#[derive(Default)]
pub struct CopyHash([AtomicU64; 2]);

impl CopyHash {
    /// The hash (zero: none was recorded).
    #[inline]
    pub(super) fn get(&self) -> u128 {
        (self.0[1].load(Ordering::Relaxed) as u128) << 64 | self.0[0].load(Ordering::Relaxed) as u128
    }

    /// Records `h`.
    #[inline]
    pub(super) fn set(&self, h: u128) {
        self.0[0].store(h as u64, Ordering::Relaxed);
        self.0[1].store((h >> 64) as u64, Ordering::Relaxed);
    }
}

impl<T: Zeroed> Table<T> {
    /// A table of `len` zeros.
    pub fn new(len: usize) -> io::Result<Table<T>> {
        let bytes = len.max(1) * std::mem::size_of::<T>();
        let p = sys::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // The library's own: out of the program's core dumps, which
        // would be as long as the tables.
        (host().exclude_from_core)(p as usize, bytes);
        let ptr =
            std::ptr::NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave a null table"))?;
        Ok(Table { ptr, len })
    }
}

impl<T: Zeroed> std::ops::Deref for Table<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is a live mapping of `len` Ts (page-aligned, so
        // aligned for T), zero-filled (a valid T) or written as Ts since,
        // never unmapped; `&self` excludes writers but through a `T`'s
        // own interior mutability (atomics).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroed> std::ops::DerefMut for Table<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the table owns its mapping (nothing else refers to it but
// through the table): moving it to another thread moves that, as for a
// `Box<[T]>`.
unsafe impl<T: Zeroed + Send> Send for Table<T> {}
// SAFETY: a shared table only gives `&[T]` (writes need `&mut`, or a `T`
// that is `Sync`), as a shared `Box<[T]>` does.
unsafe impl<T: Zeroed + Sync> Sync for Table<T> {}
