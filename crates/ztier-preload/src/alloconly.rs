//! Allocation-only mode (`ZTIER_ALLOC_ONLY=1`, which `ztier trace record`
//! sets): the program's `malloc` family gets `ztier run`'s layout — small
//! blocks from the [`small`](crate::small) size classes in 256 KiB spans,
//! larger ones as page ranges (best fit, freed blocks of up to 64 pages
//! cached) — and nothing else of the library runs: no arena registered
//! with userfaultfd, no store, no library threads, no syscall user
//! dispatch. Valgrind emulates none of those; it does run a preloaded
//! allocator, so a program traced under lackey this way touches the
//! pages it touches under `ztier run`, not glibc's.
//!
//! What differs from a run: the program's anonymous `mmap`s stay the
//! kernel's (in a run they are carved from the arena's page region), and
//! a fork while another thread allocates may find a class's lock held in
//! the child (lackey traces no forked child anyway). Ignored under
//! `ZTIER_BUDGET` (a run). The mode starts where a run would start the
//! library (`ZTIER_START_AFTER`): until then, and for the blocks glibc and
//! the dynamic linker allocate for themselves, memory is glibc's, as in a
//! run.
//!
//! Which anonymous memory a run would manage cannot be told from
//! `/proc/PID/maps` (the dynamic linker's and glibc's own mappings look
//! like the program's), so with `ZTIER_ALLOC_ONLY_MAPS=FILE` the mode
//! appends to FILE one line per range that a run would manage, as it is
//! mapped or unmapped: `PID m LO HI` for the heap and each of the
//! program's own private anonymous `mmap`s (those a run carves from its
//! arena), `PID u LO HI` for each of the program's `munmap`s, `PID r LO
//! HI` for each large block a `free` (or a moving `realloc`) released
//! (hex, `HI` exclusive). `ztier trace record` reads it to mark every
//! other anonymous page unmanaged, and to release the pages of unmapped
//! ranges and released blocks in the trace, as a run drops them from
//! memory and the store. (A program's `mremap` of such a range is not
//! followed.)
//!
//! ```text
//!  heap (HEAP_BYTES of address space, MAP_NORESERVE, plain anonymous)
//!  ┌──────────────────────┬──────────────────────────────────────────┐
//!  │ span region (1/4)    │ page region: blocks over 32 KiB          │
//!  └──────────────────────┴──────────────────────────────────────────┘
//! ```

use libc::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::manager::PAGE;
use crate::pages::PageAlloc;
use crate::small::{bad_pointer, class_of, class_size, Class, CLASSES, MAX_SMALL, SPAN};
use crate::sys;

/// The heap's address space: far more than a traced program uses (valgrind
/// slows programs ~100x), and well within what valgrind lets a client map.
const HEAP_BYTES: usize = 8 << 30;

/// The mode is on (`ZTIER_ALLOC_ONLY=1` without `ZTIER_BUDGET`).
static ON: AtomicBool = AtomicBool::new(false);
static HEAP: OnceLock<Heap> = OnceLock::new();
/// Where the managed ranges are logged (`ZTIER_ALLOC_ONLY_MAPS`), -1: not.
static MAPS_FD: AtomicI32 = AtomicI32::new(-1);

/// The mode's allocator state.
struct Heap {
    base: usize,
    span_bytes: usize,
    classes: Vec<Mutex<Class>>,
    span_next: AtomicUsize,
    granule_class: Vec<AtomicU8>,
    pages: Mutex<PageAlloc>,
}

/// Reads `ZTIER_ALLOC_ONLY` (from the library's constructor: the
/// environment is the initial one).
pub(crate) fn note_start() {
    let on = std::env::var_os(ztier_run_core::names::env::ALLOC_ONLY).is_some_and(|v| v == "1")
        && std::env::var_os(ztier_run_core::names::env::BUDGET).is_none();
    ON.store(on, Ordering::Release);
    if let Some(path) = std::env::var_os(ztier_run_core::names::env::ALLOC_ONLY_MAPS).filter(|_| on) {
        use std::os::fd::IntoRawFd;
        if let Ok(f) = std::fs::OpenOptions::new().append(true).open(path) {
            MAPS_FD.store(f.into_raw_fd(), Ordering::Release);
        }
    }
}

/// Appends `PID KIND LO HI` to the maps log, if there is one (one
/// `write`, so lines of several threads do not interleave).
fn log_range(kind: u8, lo: usize, len: usize) {
    let fd = MAPS_FD.load(Ordering::Acquire);
    if fd < 0 || len == 0 {
        return;
    }
    let mut buf = [0u8; 64];
    let mut n = 0;
    let mut put = |buf: &mut [u8; 64], field: Field| {
        match field {
            Field::Hex(v) => {
                let digits = (64 - v.leading_zeros()).div_ceil(4).max(1) as usize;
                for i in 0..digits {
                    buf[n + digits - 1 - i] = b"0123456789abcdef"[(v >> (4 * i)) as usize & 15];
                }
                n += digits;
            }
            Field::Byte(b) => {
                buf[n] = b;
                n += 1;
            }
        }
        buf[n] = b' ';
        n += 1;
        n
    };
    // SAFETY: getpid has no preconditions.
    put(&mut buf, Field::Hex(unsafe { libc::getpid() } as u64));
    put(&mut buf, Field::Byte(kind));
    put(&mut buf, Field::Hex(lo as u64));
    let n = put(&mut buf, Field::Hex(lo.saturating_add(len.next_multiple_of(PAGE)) as u64));
    buf[n - 1] = b'\n';
    let _ = sys::raw(libc::SYS_write, [fd as u64, buf.as_ptr() as u64, n as u64, 0, 0, 0]);
}

/// The program mapped `[p, p + len)` private and anonymous, memory a run
/// would manage (its arena's): logged if the mode is on and a run would
/// have started by now.
pub(crate) fn note_map(p: *mut c_void, len: usize) {
    if ON.load(Ordering::Acquire) && crate::started_off() && !crate::inside() {
        log_range(KIND_MAP, p as usize, len);
    }
}

/// The program unmapped `[p, p + len)`: logged if the mode is on.
pub(crate) fn note_unmap(p: *mut c_void, len: usize) {
    if ON.load(Ordering::Acquire) && !crate::inside() {
        log_range(KIND_UNMAP, p as usize, len);
    }
}

/// A field of a maps log line.
enum Field {
    Hex(u64),
    Byte(u8),
}

/// The maps log's kinds: mapped (managed), unmapped, released.
const KIND_MAP: u8 = b'm';
const KIND_UNMAP: u8 = b'u';
/// The maps log's kind for a freed large block whose pages were released
/// (`MADV_DONTNEED`): still managed, but out of memory and the store.
const KIND_RELEASE: u8 = b'r';

/// The heap, when the mode is on and a run would have started the library
/// by now (the caller asked [`crate::global_for`] first, which counts the
/// program's requests and turned the library off for want of a budget).
fn heap() -> Option<&'static Heap> {
    if !ON.load(Ordering::Acquire) || !crate::started_off() || crate::inside() {
        return None;
    }
    Some(HEAP.get_or_init(make_heap))
}

fn make_heap() -> Heap {
    let p = sys::mmap(
        std::ptr::null_mut(),
        HEAP_BYTES + SPAN,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        // A trace of glibc's layout, said to be the run's, would mislead.
        eprintln!(
            "ztier: allocation-only mode: reserving {} MiB of address space: {}",
            HEAP_BYTES >> 20,
            std::io::Error::last_os_error()
        );
        std::process::abort();
    }
    log_range(KIND_MAP, p as usize, HEAP_BYTES + SPAN);
    // Aligned to a span, as the run's arena is.
    let base = (p as usize).next_multiple_of(SPAN);
    let span_bytes = HEAP_BYTES / 4;
    Heap {
        base,
        span_bytes,
        classes: (0..CLASSES).map(|_| Mutex::new(Class::default())).collect(),
        span_next: AtomicUsize::new(base),
        granule_class: (0..span_bytes / SPAN).map(|_| AtomicU8::new(u8::MAX)).collect(),
        pages: Mutex::new(PageAlloc::new(span_bytes / PAGE, (HEAP_BYTES - span_bytes) / PAGE)),
    }
}

impl Heap {
    fn owns(&self, p: usize) -> bool {
        p.wrapping_sub(self.base) < HEAP_BYTES
    }

    fn in_spans(&self, p: usize) -> bool {
        p.wrapping_sub(self.base) < self.span_bytes
    }

    fn small(&self, c: usize) -> usize {
        let mut cl = crate::lock(&self.classes[c]);
        let new_span = || {
            let span = self.span_next.fetch_add(SPAN, Ordering::Relaxed);
            if span + SPAN > self.base + self.span_bytes {
                self.span_next.fetch_sub(SPAN, Ordering::Relaxed);
                return None;
            }
            self.granule_class[(span - self.base) / SPAN].store(c as u8, Ordering::Release);
            Some(span)
        };
        // SAFETY: the class's free list holds its objects freed by `free`.
        unsafe { cl.take(class_size(c), new_span) }.unwrap_or(0)
    }

    fn class(&self, p: usize) -> usize {
        let c = self.granule_class[(p - self.base) / SPAN].load(Ordering::Acquire);
        if c as usize >= CLASSES {
            bad_pointer("free", p);
        }
        c as usize
    }

    /// `n` pages aligned to `align` pages, as the run's `large_alloc`.
    fn large(&self, n: usize, align: usize, zeroed: bool) -> usize {
        let mut pa = crate::lock(&self.pages);
        if align == 1 {
            if let Some(first) = pa.cache_pop(n) {
                pa.large.insert(first, n);
                let p = self.base + first * PAGE;
                if zeroed {
                    // SAFETY: the block is ours, n pages long.
                    unsafe { std::ptr::write_bytes(p as *mut u8, 0, n * PAGE) };
                }
                return p;
            }
        }
        match pa.alloc(n, align) {
            Some(first) => {
                pa.large.insert(first, n);
                self.base + first * PAGE
            }
            None => 0,
        }
    }

    fn alloc(&self, size: usize, zeroed: bool) -> usize {
        if size <= MAX_SMALL {
            let p = self.small(class_of(size));
            if zeroed && p != 0 {
                // SAFETY: p is a fresh block of at least `size` bytes.
                unsafe { std::ptr::write_bytes(p as *mut u8, 0, size) };
            }
            p
        } else {
            // Fresh pages and released ones read as zeros.
            self.large(size.div_ceil(PAGE), 1, zeroed)
        }
    }

    fn usable(&self, p: usize) -> usize {
        if self.in_spans(p) {
            return class_size(self.class(p));
        }
        match crate::lock(&self.pages).large.get(&((p - self.base) / PAGE)) {
            Some(&n) => n * PAGE,
            None => bad_pointer("malloc_usable_size", p),
        }
    }

    fn free(&self, p: usize) {
        if self.in_spans(p) {
            let c = self.class(p);
            // SAFETY: p is a live object of class c being freed.
            unsafe { crate::lock(&self.classes[c]).give(p) };
            return;
        }
        let first = (p - self.base) / PAGE;
        let mut pa = crate::lock(&self.pages);
        let Some(n) = pa.large.remove(&first) else { bad_pointer("free", p) };
        if p % PAGE != 0 {
            bad_pointer("free", p);
        }
        if !pa.cache_push(first, n) {
            // Released, as the run releases a freed range's pages (and
            // logged: the pages leave a run's memory and store here).
            let _ = sys::madvise(p as *mut c_void, n * PAGE, libc::MADV_DONTNEED);
            pa.free(first, n);
            drop(pa);
            log_range(KIND_RELEASE, p, n * PAGE);
        }
    }

    /// `realloc` of a block of the heap, as the run's: in place when it
    /// fits or its pages can grow, else moved.
    fn realloc(&self, p: usize, size: usize) -> usize {
        let old = self.usable(p);
        if size <= old && (size > MAX_SMALL || self.in_spans(p)) {
            return p;
        }
        if !self.in_spans(p) && size > MAX_SMALL {
            let first = (p - self.base) / PAGE;
            let (n, want) = (old / PAGE, size.div_ceil(PAGE));
            let mut pa = crate::lock(&self.pages);
            if pa.take(first + n, want - n) {
                pa.large.insert(first, want);
                return p;
            }
        }
        let q = self.alloc(size, false);
        if q != 0 {
            // SAFETY: both blocks are live and at least min(old, size) long.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size)) };
            self.free(p);
        }
        q
    }
}

/// `malloc`/`calloc` of `size` bytes from the heap (`zeroed`: reading as
/// zeros); `None` when the mode is off, not started, or the heap is full
/// (the caller's glibc then).
pub(crate) fn alloc(size: usize, zeroed: bool) -> Option<*mut c_void> {
    let p = heap()?.alloc(size, zeroed);
    (p != 0).then_some(p as *mut c_void)
}

/// `memalign` from the heap, as the run's (`align` a power of two).
pub(crate) fn aligned(align: usize, size: usize) -> Option<*mut c_void> {
    let h = heap()?;
    if align <= 16 {
        return alloc(size, false);
    }
    let s = size.max(1).next_power_of_two().max(align);
    let p = if s <= MAX_SMALL {
        h.small(class_of(s))
    } else {
        h.large(size.div_ceil(PAGE), align.div_ceil(PAGE), false)
    };
    (p != 0).then_some(p as *mut c_void)
}

/// Is `p` a block of the heap?
pub(crate) fn owns(p: *mut c_void) -> bool {
    HEAP.get().is_some_and(|h| h.owns(p as usize))
}

/// `free` of a block of the heap ([`owns`]).
pub(crate) fn free(p: *mut c_void) {
    if let Some(h) = HEAP.get() {
        h.free(p as usize);
    }
}

/// `realloc` of a block of the heap ([`owns`]), `size` > 0; null if no
/// room.
pub(crate) fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    HEAP.get().map_or(0, |h| h.realloc(p as usize, size)) as *mut c_void
}

/// `malloc_usable_size` of a block of the heap ([`owns`]).
pub(crate) fn usable(p: *mut c_void) -> usize {
    HEAP.get().map_or(0, |h| h.usable(p as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_sit_where_the_runs_size_classes_put_them() {
        let h = make_heap();
        // Two 100-byte blocks: class 6 (112 bytes), one after the other
        // in the first span.
        let a = h.alloc(100, false);
        let b = h.alloc(100, true);
        assert_eq!((a, b), (h.base, h.base + 112));
        assert_eq!(h.usable(b), 112);
        // Another class opens the next span.
        let c = h.alloc(5000, false);
        assert_eq!((c, h.usable(c)), (h.base + SPAN, 5120));
        // A freed object is the next one handed out in its class.
        h.free(a);
        assert_eq!(h.alloc(97, false), a);
        // Large blocks are page ranges of the page region, grown in place.
        let l = h.alloc(40_000, true);
        assert_eq!((l, h.usable(l)), (h.base + h.span_bytes, 10 * PAGE));
        assert_eq!(h.realloc(l, 20 * PAGE), l);
        assert_eq!(h.usable(l), 20 * PAGE);
        // A small block that grows past its class moves, its bytes kept.
        // SAFETY: b is a live block of 112 bytes.
        unsafe { std::ptr::write_bytes(b as *mut u8, 7, 100) };
        let m = h.realloc(b, 300);
        assert_ne!(m, b);
        // SAFETY: m is a live block of at least 300 bytes.
        assert!(unsafe { std::slice::from_raw_parts(m as *const u8, 100) }.iter().all(|&x| x == 7));
        sys::munmap(h.base as *mut c_void, HEAP_BYTES);
    }
}
