//! The exported C symbols: the malloc family and the memory-mapping calls.
//! Each one forwards to glibc (or the kernel) when the library is off, when
//! the calling thread runs library code, or when the memory is not the
//! arena's.

use libc::{c_int, c_void, off_t};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::manager::PAGE;
use crate::small::{bad_pointer, class_of, class_size, MAX_SMALL, SPAN};
use crate::{
    __libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc, global_for, sys, Global,
};

const RW: c_int = libc::PROT_READ | libc::PROT_WRITE;

/// Class `c`'s lock, held with the holder recorded ([`Global::class_owner`]).
struct ClassGuard<'a> {
    cl: std::sync::MutexGuard<'a, crate::small::Class>,
    owner: &'a AtomicUsize,
}

impl std::ops::Deref for ClassGuard<'_> {
    type Target = crate::small::Class;
    fn deref(&self) -> &crate::small::Class {
        &self.cl
    }
}

impl std::ops::DerefMut for ClassGuard<'_> {
    fn deref_mut(&mut self) -> &mut crate::small::Class {
        &mut self.cl
    }
}

impl Drop for ClassGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Cleared before the lock is let go (the field drops after this).
        self.owner.store(0, Ordering::Relaxed);
    }
}

/// This thread's identity for [`ClassGuard`] (nonzero).
#[inline]
pub(crate) fn thread_id() -> usize {
    // SAFETY: pthread_self has no preconditions (it reads the thread's
    // control block: no system call, async-signal-safe in practice).
    unsafe { libc::pthread_self() as usize }
}

fn lock_class(g: &Global, c: usize) -> ClassGuard<'_> {
    let cl = crate::lock(&g.classes[c]);
    let owner = &g.class_owner[c];
    owner.store(thread_id(), Ordering::Relaxed);
    ClassGuard { cl, owner }
}

fn small_alloc(g: &Global, c: usize) -> *mut c_void {
    let mut cl = lock_class(g, c);
    let new_span = || {
        let span = g.span_next.fetch_add(SPAN, std::sync::atomic::Ordering::Relaxed);
        if span + SPAN > g.base + g.span_bytes {
            g.span_next.fetch_sub(SPAN, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        g.granule_class[(span - g.base) / SPAN].store(c as u8, std::sync::atomic::Ordering::Release);
        g.dump_spans.reach(span + SPAN);
        Some(span)
    };
    // SAFETY: the class's free list holds its objects freed by
    // small_free. Reading a link may fault; the handler never takes
    // class locks.
    unsafe { cl.take(class_size(c), new_span) }.map_or(std::ptr::null_mut(), |p| p as *mut c_void)
}

/// The page region is used up to `pa.high`: dumped in a core that far.
fn grown(g: &Global, pa: &crate::pages::PageAlloc) {
    g.dump_pages.reach(g.base + pa.high * PAGE);
}

fn small_class(g: &Global, p: usize) -> usize {
    let c = g.granule_class[(p - g.base) / SPAN].load(std::sync::atomic::Ordering::Acquire);
    if c as usize >= crate::small::CLASSES {
        bad_pointer("free", p);
    }
    c as usize
}

fn small_free(g: &Global, p: usize) {
    let c = small_class(g, p);
    // SAFETY: p is a live object of class c being freed.
    unsafe { lock_class(g, c).give(p) };
}

/// Large block of `n` pages aligned to `align` pages; `zeroed` says
/// whether the memory must read as zeros.
fn large_alloc(g: &Global, n: usize, align: usize, zeroed: bool) -> *mut c_void {
    let mut pa = crate::lock(&g.pages);
    if align == 1 {
        if let Some(first) = pa.cache_pop(n) {
            pa.large.insert(first, n);
            drop(pa);
            let p = (g.base + first * PAGE) as *mut c_void;
            if zeroed {
                // SAFETY: the block is ours, n pages long.
                unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, n * PAGE) };
            }
            return p;
        }
    }
    match pa.alloc(n, align) {
        Some(first) => {
            pa.large.insert(first, n);
            grown(g, &pa);
            drop(pa);
            if make_usable(g, first, n) != 0 {
                // Lost to the arena rather than handed out inaccessible.
                crate::lock(&g.pages).large.remove(&first);
                return std::ptr::null_mut();
            }
            (g.base + first * PAGE) as *mut c_void
        }
        None => std::ptr::null_mut(),
    }
}

/// Releases pages `[first, first + n)` of the page region back to the
/// free ranges (memory returned, copies dropped).
fn release_range(g: &Global, first: usize, n: usize) {
    crate::as_inside(|| crate::lock_unowned(g, first, n).release(first, n, &g.stats));
    crate::lock(&g.pages).free(first, n);
}

fn large_free(g: &Global, p: usize) {
    let first = g.page_of(p);
    let mut pa = crate::lock(&g.pages);
    let Some(n) = pa.large.remove(&first) else { bad_pointer("free", p) };
    if p % PAGE != 0 {
        bad_pointer("free", p);
    }
    if crate::manager::WIPE_RANGES.load(std::sync::atomic::Ordering::Relaxed) > 0
        || crate::manager::LOCKED_RANGES.load(std::sync::atomic::Ordering::Relaxed) > 0
    {
        // A freed block is unmapped natively: its next owner's pages are
        // neither wiped in a forked child nor locked.
        drop(pa);
        crate::as_inside(|| {
            let mut m = crate::lock_program(g);
            m.wipe_on_fork(first, n, crate::manager::OnFork::Keep);
            m.unlock_pages(first, n);
        });
        pa = crate::lock(&g.pages);
    }
    if is_reprotected(first, n) {
        // Read-write again, as a new mapping would be.
        drop(pa);
        let a = (g.base + first * PAGE) as *mut c_void;
        if change_protection(a, n * PAGE, RW, 0, || sys::mprotect(a, n * PAGE, RW)) != 0 {
            // Its pages are lost to the arena rather than handed out so.
            return;
        }
        pa = crate::lock(&g.pages);
    }
    if pa.cache_push(first, n) {
        return;
    }
    drop(pa);
    release_range(g, first, n);
}

fn usable(g: &Global, p: usize) -> usize {
    if g.in_spans(p) {
        class_size(small_class(g, p))
    } else {
        let n = crate::lock(&g.pages).large.get(&g.page_of(p)).copied();
        match n {
            Some(n) => n * PAGE,
            None => bad_pointer("malloc_usable_size", p),
        }
    }
}

fn alloc(g: &Global, size: usize, zeroed: bool) -> *mut c_void {
    let p = if size <= MAX_SMALL {
        let p = small_alloc(g, class_of(size));
        if zeroed && !p.is_null() {
            // SAFETY: p is a fresh block of at least `size` bytes.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, size) };
        }
        p
    } else {
        counted(|| large_alloc(g, size.div_ceil(PAGE), 1, zeroed))
    };
    if !p.is_null() {
        return p;
    }
    counted(|| {
        arena_full(g, size);
        // SAFETY: glibc's allocator (its blocks are freed back to it:
        // `free` tells them apart by address).
        unsafe {
            if zeroed {
                __libc_calloc(1, size)
            } else {
                __libc_malloc(size)
            }
        }
    })
}

/// `f`, counted as library code: the paths of the malloc family that
/// are not a small block's (see [`crate::sudstate::Allow::hot`]). Kept out of
/// line, so that the small blocks' path stays as short as before.
#[inline(never)]
fn counted<R>(f: impl FnOnce() -> R) -> R {
    let _sud = crate::sudstate::Allow::new();
    f()
}

/// The arena has no room for a request of `bytes`: it is served by
/// glibc or the kernel instead, unmanaged (as natively), and the log says
/// so once. A small arena (under `ulimit -v`) fills; before, `malloc`
/// then failed where it would have succeeded natively. A request of
/// over a quarter of the arena (a 64 GiB reservation, a `malloc(64 GiB)`
/// that fails natively too) is said apart, once: the arena need not be
/// full, and later requests are still managed (before, it said "full").
pub(crate) fn arena_full(g: &Global, bytes: usize) {
    static SAID_FULL: AtomicBool = AtomicBool::new(false);
    static SAID_LARGE: AtomicBool = AtomicBool::new(false);
    // Over a quarter of the arena at once: the request is the odd one out.
    let large = bytes > g.arena_bytes / 4;
    if !(if large { &SAID_LARGE } else { &SAID_FULL }).swap(true, Ordering::Relaxed) {
        crate::as_inside(|| {
            if large {
                crate::notice(format_args!(
                    "ztier: process {}: {} MiB asked at once does not fit in the arena ({} MiB of address \
                     space): it comes from glibc or the kernel, unmanaged, as other such requests may; \
                     smaller ones are still managed",
                    std::process::id(),
                    bytes >> 20,
                    g.arena_bytes >> 20
                ))
            } else {
                crate::notice(format_args!(
                    "ztier: process {}: the arena ({} MiB of address space) is full: further memory comes \
                     from glibc and the kernel, unmanaged",
                    std::process::id(),
                    g.arena_bytes >> 20
                ))
            }
        });
    }
}

fn nomem<T>(p: *mut T) -> *mut T {
    if p.is_null() {
        sys::set_errno(libc::ENOMEM);
    }
    p
}

/// Where the dynamic linker's code lies, `[start, end)`: its allocations
/// never go to the arena ([`from_ldso`]). (0, 0) if it is not known.
static LDSO_TEXT: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

/// Is `ret` (the return address of a call into the malloc family) in the
/// dynamic linker?
///
/// The dynamic linker allocates, among other things, each thread's DTV
/// (its table of thread-local storage blocks) when glibc's
/// `pthread_create` makes the thread. Every access to the library's
/// thread-locals reads it, also while the manager's lock is held, so an
/// evicted DTV would fault where the handler cannot serve it. Our
/// `pthread_create` makes glibc's allocations with the mark that keeps
/// them out of the arena, but glibc's is also reached without ours:
/// glibc's own threads (`SIGEV_THREAD` timers, POSIX AIO) and libraries
/// that look it up after ours (jemalloc's background thread, through
/// `dlsym(RTLD_NEXT)` from libjemalloc, in redis). redis's `BGSAVE`
/// child hung on that thread's evicted DTV, reading it while starting its
/// fault handler. So whatever the dynamic linker allocates comes from
/// glibc's malloc, whoever made the thread.
fn from_ldso(ret: usize) -> bool {
    let (lo, hi) = *LDSO_TEXT.get_or_init(ldso_text);
    ret >= lo && ret < hi
}

/// The executable segment of the dynamic linker, from its ELF headers at
/// the base the kernel gave it (`AT_BASE`).
fn ldso_text() -> (usize, usize) {
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_BASE) } as usize;
    if base == 0 {
        // Run as `ld.so PROGRAM`: the linker is the main program.
        return (0, 0);
    }
    // SAFETY: the kernel maps the dynamic linker's first segment, with its
    // ELF header and program headers, at AT_BASE; they stay mapped.
    unsafe { text_of(base) }
}

/// Where glibc's own code lies (`libc.so.6`'s executable segment),
/// `[start, end)`, found when the library is loaded ([`note_libc`]);
/// (0, 0) before, or if it was not found.
static LIBC_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Finds [`LIBC_TEXT`] (from the library's constructor: `dladdr` takes
/// the dynamic linker's lock, not for inside `malloc`).
pub(crate) fn note_libc() {
    // SAFETY: a zeroed Dl_info is valid (null pointers); dladdr only
    // writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about.
    if unsafe { libc::dladdr(__libc_malloc as *const c_void, &mut info) } == 0 || info.dli_fbase.is_null() {
        return;
    }
    // SAFETY: the base of a loaded object: its first segment, with the
    // ELF header and program headers, stays mapped while it is loaded
    // (libc always is).
    let (lo, hi) = unsafe { text_of(info.dli_fbase as usize) };
    LIBC_TEXT[1].store(hi, Ordering::Relaxed);
    LIBC_TEXT[0].store(lo, Ordering::Release);
}

/// Is `ret` (the return address of a call into the malloc family) in
/// glibc's own code: a block glibc allocates for itself?
///
/// glibc keeps some of its state in blocks from `malloc` and touches them
/// inside `fork` after the fork handlers have run, when the library's
/// `prepare` handler holds the manager's lock until its `parent` or
/// `child` one: the NSS configuration's state (locked and copied by
/// `__nss_database_fork_prepare_parent`, written again in the child) and
/// every open `FILE` (`fopen`'s, whose locks the child resets). Evicted,
/// such a block faulted in the parent with the lock held, and nothing
/// could serve the fault: CPython's `test_os` (`test_waitpid`: a program
/// that had looked up a user, then `os.spawnv`) hung at `--budget 16M`
/// in every run. In the child, before its `child` handler registers the
/// arena with its own userfaultfd, a write to an evicted block lands on
/// a fresh page of zeros, which the child then keeps: the rest of that
/// page silently lost. So small blocks glibc allocates for itself (up to
/// [`GLIBC_GROW_MAX`]: its bookkeeping, and the short strings of
/// `getline`, `asprintf` and the like, unmanaged) are glibc's; larger ones
/// (a `qsort` buffer, a long line) are the arena's, as before, and so are
/// `strdup`'s and `strndup`'s copies, made by the library ([`copy_out`]).
fn from_libc(ret: usize) -> bool {
    let lo = LIBC_TEXT[0].load(Ordering::Acquire);
    ret >= lo && ret < LIBC_TEXT[1].load(Ordering::Relaxed)
}

/// The executable segment `[start, end)` of the ELF object loaded at
/// `base`, from its program headers; (0, 0) if it has none.
///
/// # Safety
/// `base` is the address where an ELF object's first segment, with its
/// headers, is mapped.
unsafe fn text_of(base: usize) -> (usize, usize) {
    // SAFETY: the caller's contract: the headers are mapped at `base`.
    unsafe {
        let eh = &*(base as *const libc::Elf64_Ehdr);
        if eh.e_ident[..4] != *b"\x7fELF" {
            return (0, 0);
        }
        for i in 0..eh.e_phnum as usize {
            let ph =
                &*((base + eh.e_phoff as usize + i * eh.e_phentsize as usize) as *const libc::Elf64_Phdr);
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let lo = base + ph.p_vaddr as usize;
                return (lo, lo + ph.p_memsz as usize);
            }
        }
    }
    (0, 0)
}

/// `malloc(3)`: passes its return address on to [`malloc_from`].
///
/// # Safety
/// The C contract of `malloc`.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    // The return address, at the top of the stack on entry, becomes the
    // second argument; the tail call returns straight to the caller.
    std::arch::naked_asm!("mov rsi, [rsp]", "jmp {f}", f = sym malloc_from)
}

/// `malloc`, called from `ret`.
extern "C" fn malloc_from(size: usize, ret: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::hot();
    // SAFETY: glibc's malloc (its lock taken: counted).
    let glibc = |size| counted(|| unsafe { __libc_malloc(size) });
    if from_ldso(ret) || (size <= GLIBC_GROW_MAX && from_libc(ret)) {
        return glibc(size);
    }
    match global_for(size) {
        None => crate::alloconly::alloc(size, false).unwrap_or_else(|| glibc(size)),
        Some(g) => nomem(alloc(g, size, false)),
    }
}

/// `calloc(3)`: passes its return address on to [`calloc_from`].
///
/// # Safety
/// The C contract of `calloc`.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    // As `malloc`: the return address becomes the third argument.
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {f}", f = sym calloc_from)
}

/// `calloc`, called from `ret`.
extern "C" fn calloc_from(n: usize, size: usize, ret: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::hot();
    // SAFETY: glibc's calloc (its lock taken: counted).
    let glibc = |n, size| counted(|| unsafe { __libc_calloc(n, size) });
    if from_ldso(ret) || (n.saturating_mul(size) <= GLIBC_GROW_MAX && from_libc(ret)) {
        return glibc(n, size);
    }
    match global_for(n.saturating_mul(size)) {
        None => match n.checked_mul(size).and_then(|t| crate::alloconly::alloc(t, true)) {
            Some(p) => p,
            None => glibc(n, size),
        },
        Some(g) => match n.checked_mul(size) {
            Some(t) => nomem(alloc(g, t, true)),
            None => nomem(std::ptr::null_mut()),
        },
    }
}

/// `free(3)`.
///
/// # Safety
/// The C contract of `free`.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    let _sud = crate::sudstate::Allow::hot();
    if p.is_null() {
        return;
    }
    match crate::GLOBAL.get() {
        Some(g) if g.in_arena(p as usize) => {
            if g.in_spans(p as usize) {
                small_free(g, p as usize)
            } else {
                counted(|| large_free(g, p as usize))
            }
        }
        _ if crate::alloconly::owns(p) => crate::alloconly::free(p),
        // SAFETY: not arena memory: it came from glibc's malloc (its
        // lock taken: counted).
        _ => counted(|| unsafe { __libc_free(p) }),
    }
}

/// `realloc(3)`: passes its return address on to [`realloc_from`].
///
/// # Safety
/// The C contract of `realloc`.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // As `malloc`: the return address becomes the third argument.
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {f}", f = sym realloc_from)
}

/// `realloc`, called from `ret`.
extern "C" fn realloc_from(p: *mut c_void, size: usize, ret: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    let ldso = from_ldso(ret);
    if p.is_null() {
        return malloc_from(size, ret);
    }
    let g = match crate::GLOBAL.get() {
        Some(g) if g.in_arena(p as usize) => g,
        // SAFETY: the dynamic linker's blocks stay glibc's (a DTV that grows).
        _ if ldso => return unsafe { __libc_realloc(p, size) },
        _ if crate::alloconly::owns(p) && size == 0 => {
            crate::alloconly::free(p);
            return std::ptr::null_mut();
        }
        _ if crate::alloconly::owns(p) => return nomem(crate::alloconly::realloc(p, size)),
        _ => return realloc_glibc(p, size),
    };
    if size == 0 {
        // SAFETY: forwarding (glibc frees and returns NULL).
        unsafe { free(p) };
        return std::ptr::null_mut();
    }
    let old = usable(g, p as usize);
    if size <= old && (size > MAX_SMALL || g.in_spans(p as usize)) {
        return p;
    }
    if !g.in_spans(p as usize) && size > MAX_SMALL {
        // Grow in place when the pages after the block are free.
        let first = g.page_of(p as usize);
        let (n, want) = (old / PAGE, size.div_ceil(PAGE));
        let mut pa = crate::lock(&g.pages);
        if pa.take(first + n, want - n) {
            grown(g, &pa);
            drop(pa);
            if make_usable(g, first + n, want - n) == 0 {
                crate::lock(&g.pages).large.insert(first, want);
                return p;
            }
            // (The pages taken are lost to the arena; the block moves.)
        }
    }
    let q = alloc(g, size, false);
    if q.is_null() {
        return nomem(q);
    }
    // SAFETY: both blocks are live and at least min(old, size) long.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size)) };
    // SAFETY: forwarding.
    unsafe { free(p) };
    q
}

/// Blocks of glibc's (allocated before the library started) at most this
/// big stay glibc's when they grow; bigger ones move to the arena.
const GLIBC_GROW_MAX: usize = 64 << 10;

/// `realloc` of a block of glibc's: glibc's while it stays small or the
/// library is off; else moved to the arena (the library starts first if
/// the move makes the program's requests reach the start threshold), so
/// that a block allocated before start-up cannot grow unmanaged.
fn realloc_glibc(p: *mut c_void, size: usize) -> *mut c_void {
    if size > GLIBC_GROW_MAX {
        if let Some(g) = global_for(size) {
            let old = glibc_usable_size(p);
            let q = alloc(g, size, false);
            if q.is_null() {
                return nomem(q);
            }
            // SAFETY: p is a live glibc block of `old` usable bytes, q a
            // new one of at least `size`.
            unsafe {
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
                __libc_free(p);
            }
            return q;
        }
        if let Some(q) = crate::alloconly::alloc(size, false) {
            // SAFETY: as above, q from the allocation-only heap.
            unsafe {
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), glibc_usable_size(p).min(size));
                __libc_free(p);
            }
            return q;
        }
    }
    // SAFETY: glibc memory stays glibc's.
    unsafe { __libc_realloc(p, size) }
}

/// A copy of the `len` bytes at `s` and a NUL, from the library's
/// `malloc` (called here, so the arena's like any block of the
/// program's); null with `ENOMEM` if there is no room.
///
/// glibc's `strdup` family allocates inside glibc, where blocks of up to
/// 64 KiB are glibc's ([`from_libc`]); but the copy is the program's
/// data, not glibc's state: GNU make keeps every variable's value so
/// (20 MiB of them in `cli_run_modes::make_runs_recipes_from_a_cold_heap`,
/// unmanaged until these were exported).
///
/// # Safety
/// `s` is readable for `len` bytes.
unsafe fn copy_out(s: *const u8, len: usize) -> *mut u8 {
    // SAFETY: the library's malloc, C contract.
    let p = unsafe { malloc(len + 1) }.cast::<u8>();
    if !p.is_null() {
        // SAFETY: `len` readable bytes into a new block of `len + 1`.
        unsafe {
            std::ptr::copy_nonoverlapping(s, p, len);
            *p.add(len) = 0;
        }
    }
    p
}

/// `strdup(3)`: see [`copy_out`].
///
/// # Safety
/// The C contract of `strdup`.
#[no_mangle]
pub unsafe extern "C" fn strdup(s: *const libc::c_char) -> *mut libc::c_char {
    // SAFETY: a NUL-terminated string (the caller's contract).
    unsafe { copy_out(s.cast(), libc::strlen(s)) }.cast()
}

/// `__strdup`: glibc's other name for `strdup`.
///
/// # Safety
/// The C contract of `strdup`.
#[no_mangle]
pub unsafe extern "C" fn __strdup(s: *const libc::c_char) -> *mut libc::c_char {
    // SAFETY: the caller's contract, passed on.
    unsafe { strdup(s) }
}

/// `strndup(3)`: see [`copy_out`].
///
/// # Safety
/// The C contract of `strndup`.
#[no_mangle]
pub unsafe extern "C" fn strndup(s: *const libc::c_char, n: usize) -> *mut libc::c_char {
    // SAFETY: a string readable up to its NUL or `n` bytes (the caller's
    // contract).
    unsafe { copy_out(s.cast(), libc::strnlen(s, n)) }.cast()
}

/// `__strndup`: glibc's other name for `strndup`.
///
/// # Safety
/// The C contract of `strndup`.
#[no_mangle]
pub unsafe extern "C" fn __strndup(s: *const libc::c_char, n: usize) -> *mut libc::c_char {
    // SAFETY: the caller's contract, passed on.
    unsafe { strndup(s, n) }
}

/// `reallocarray(3)`.
///
/// # Safety
/// The C contract of `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    match n.checked_mul(size) {
        // SAFETY: forwarding.
        Some(t) => unsafe { realloc(p, t) },
        None => nomem(std::ptr::null_mut()),
    }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    let Some(g) = global_for(size) else {
        // SAFETY: glibc's memalign.
        return crate::alloconly::aligned(align, size)
            .unwrap_or_else(|| unsafe { __libc_memalign(align, size) });
    };
    if align <= 16 {
        return nomem(alloc(g, size, false));
    }
    let s = size.max(1).next_power_of_two().max(align);
    let p = if s <= MAX_SMALL {
        small_alloc(g, class_of(s))
    } else {
        large_alloc(g, size.div_ceil(PAGE), align.div_ceil(PAGE), false)
    };
    if p.is_null() {
        arena_full(g, size);
        // SAFETY: glibc's memalign (see `alloc`).
        return nomem(unsafe { __libc_memalign(align, size) });
    }
    p
}

/// `memalign(3)`.
///
/// # Safety
/// The C contract of `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    if !align.is_power_of_two() {
        sys::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, size)
}

/// `aligned_alloc(3)`.
///
/// # Safety
/// The C contract of `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    // SAFETY: forwarding.
    unsafe { memalign(align, size) }
}

/// `posix_memalign(3)`.
///
/// # Safety
/// `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    if !align.is_power_of_two() || align % std::mem::size_of::<usize>() != 0 {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer.
    unsafe { *out = p };
    0
}

/// `valloc(3)`.
///
/// # Safety
/// The C contract of `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    aligned(PAGE, size)
}

/// `pvalloc(3)`.
///
/// # Safety
/// The C contract of `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    aligned(PAGE, size.max(1).next_multiple_of(PAGE))
}

/// `malloc_usable_size(3)`.
///
/// # Safety
/// `p` is NULL or a live block.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    let _sud = crate::sudstate::Allow::new();
    if p.is_null() {
        return 0;
    }
    match crate::GLOBAL.get() {
        Some(g) if g.in_arena(p as usize) => usable(g, p as usize),
        _ if crate::alloconly::owns(p) => crate::alloconly::usable(p),
        _ => glibc_usable_size(p),
    }
}

fn glibc_usable_size(p: *mut c_void) -> usize {
    type F = unsafe extern "C" fn(*mut c_void) -> usize;
    static NEXT: std::sync::OnceLock<Option<F>> = std::sync::OnceLock::new();
    let f = NEXT.get_or_init(|| {
        crate::as_inside(|| {
            // SAFETY: dlsym with a NUL-terminated name; the symbol has the
            // signature of malloc_usable_size.
            unsafe {
                let s = libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr());
                (!s.is_null()).then(|| std::mem::transmute::<*mut c_void, F>(s))
            }
        })
    });
    // SAFETY: glibc's malloc_usable_size on a glibc block.
    f.map_or(0, |f| unsafe { f(p) })
}

/// Read-write private anonymous mappings the program made before the
/// library started (the kernel's memory): (address, page-rounded length).
/// A growing `mremap` of one moves it to the arena, as `realloc` moves a
/// block of glibc's, so memory mapped before start-up cannot grow
/// unmanaged. Requests before start-up total under 1 MiB, so there are
/// few; past the table's size they are not remembered (and stay the
/// kernel's). Any `munmap`, fixed `mmap` or protection change over one
/// forgets it.
static EARLY_MAPS: std::sync::Mutex<[(usize, usize); 32]> = std::sync::Mutex::new([(0, 0); 32]);
/// Entries in [`EARLY_MAPS`] (so that the common case takes no lock).
static EARLY_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn remember_early(p: usize, len: usize) {
    let mut t = crate::lock(&EARLY_MAPS);
    if let Some(e) = t.iter_mut().find(|e| e.1 == 0) {
        *e = (p, len.next_multiple_of(PAGE));
        EARLY_COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Forgets the early mappings that overlap `[a, a + len)`.
fn forget_early(a: usize, len: usize) {
    if EARLY_COUNT.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return;
    }
    let end = a.saturating_add(len.max(1));
    let mut t = crate::lock(&EARLY_MAPS);
    for e in t.iter_mut().filter(|e| e.1 != 0 && e.0 < end && a < e.0 + e.1) {
        *e = (0, 0);
        EARLY_COUNT.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `mremap` of an early mapping growing past [`GLIBC_GROW_MAX`] (and
/// allowed to move): moved to the arena (the library starts first if the
/// move makes the program's requests reach the start threshold). `None`:
/// not such a case, or no room; the kernel does it.
fn mremap_early(old: usize, old_len: usize, new_len: usize, flags: c_int) -> Option<*mut c_void> {
    if EARLY_COUNT.load(std::sync::atomic::Ordering::Relaxed) == 0
        || new_len <= GLIBC_GROW_MAX
        || new_len <= old_len
        || flags != libc::MREMAP_MAYMOVE
    {
        return None;
    }
    let len = old_len.next_multiple_of(PAGE);
    if !crate::lock(&EARLY_MAPS).contains(&(old, len)) || !crate::as_inside(|| private_anon_rw(old, len)) {
        return None;
    }
    let g = global_for(new_len)?;
    let q = large_alloc_mmap(g, new_len, 0);
    if q.is_null() {
        return None;
    }
    // SAFETY: old is a live private anonymous read-write mapping of `len`
    // bytes (checked just now in /proc/self/maps; the table forgets any
    // mapping unmapped, replaced or reprotected through libc), q a new
    // arena block of at least new_len > len bytes.
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, q.cast::<u8>(), len) };
    forget_early(old, len);
    sys::munmap(old as *mut c_void, len);
    Some(q)
}

/// Is `[a, a + len)` inside one private anonymous read-write mapping, by
/// `/proc/self/maps`? (An early mapping could have been replaced without
/// libc, by a raw system call.)
fn private_anon_rw(a: usize, len: usize) -> bool {
    mapping_prot(a, len, false) == Some(RW)
}

/// The protection of the one private anonymous mapping (named ones too,
/// with `named`) that holds all of `[a, a + len)`, by `/proc/self/maps`.
fn mapping_prot(a: usize, len: usize, named: bool) -> Option<c_int> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let m = maps
        .lines()
        .filter_map(|l| crate::manager::MapsLine::parse(l, named))
        .find(|m| m.lo <= a && a.checked_add(len).is_some_and(|end| end <= m.hi))?;
    let p = m.perms.as_bytes();
    if !m.anonymous || p.len() != 4 {
        return None;
    }
    let bit = |k: usize, c: u8, v: c_int| if p[k] == c { v } else { 0 };
    Some(bit(0, b'r', libc::PROT_READ) | bit(1, b'w', libc::PROT_WRITE) | bit(2, b'x', libc::PROT_EXEC))
}

/// Pages of the page region covered by `[addr, addr + len)` (page-rounded),
/// or `None` if the range is not entirely in the page region.
fn page_range(g: &Global, addr: usize, len: usize) -> Option<(usize, usize)> {
    let end = addr.checked_add(len.next_multiple_of(PAGE))?;
    if addr % PAGE != 0 || !g.in_arena(addr) || g.in_spans(addr) || !g.in_arena(end - 1) {
        return None;
    }
    Some((g.page_of(addr), (end - addr) / PAGE))
}

/// Does `[a, a + len)` (rounded out to pages) take in a hole of the
/// arena's page region: pages the program unmapped, or that were never
/// handed out? The arena keeps those mapped, inaccessible, but to the
/// program they are unmapped memory, where the kernel fails `mincore`,
/// `msync`, `mprotect`, `madvise` and `mlock` with `ENOMEM` and `mremap`
/// with `EFAULT` (they succeeded on the arena's mapping: a collector or
/// an unwinder that probes addresses this way took a hole for memory,
/// and an `mprotect` made the hole usable). `false` if the allocator's
/// lock stays taken 10 ms, as when this call comes from a signal
/// handler that interrupted its holder on this thread: the call then
/// goes on as on mapped memory. `false` for the library's own calls
/// (the evictor's victims may be free pages).
pub(crate) fn has_hole(g: &Global, a: usize, len: usize) -> bool {
    if crate::inside() {
        return false;
    }
    let Some(end) = a.checked_add(len).and_then(|e| e.checked_next_multiple_of(PAGE)) else { return false };
    let lo = (a & !(PAGE - 1)).max(g.base + g.span_bytes);
    let hi = end.min(g.base + g.arena_bytes);
    if len == 0 || lo >= hi {
        return false;
    }
    let pa = match g.pages.try_lock() {
        Ok(pa) => Some(pa),
        Err(_) => {
            crate::lock_until(&g.pages, std::time::Instant::now() + std::time::Duration::from_millis(10))
        }
    };
    pa.is_some_and(|pa| pa.any_free(g.page_of(lo), (hi - lo) / PAGE))
}

/// `ENOMEM` for an `mprotect` of a range with a hole of the arena in it
/// ([`has_hole`]), after the kernel's own checks (an unaligned start, an
/// unknown protection: `None`, the kernel answers those).
fn protect_hole(a: *mut c_void, len: usize, prot: c_int) -> Option<c_int> {
    let g = crate::GLOBAL.get()?;
    let known = prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == 0;
    if a as usize % PAGE != 0 || !known || !has_hole(g, a as usize, len) {
        return None;
    }
    sys::set_errno(libc::ENOMEM);
    Some(-1)
}

/// `mmap(2)`.
///
/// # Safety
/// The C contract of `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    a: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    // Private anonymous memory is ours, whatever its protection:
    // read-write, inaccessible (a reservation, made usable later with
    // mprotect or a fixed mapping — how the JVM and V8 reserve their
    // heaps), or read-only or executable (a JIT's code), made so with
    // mprotect in the arena (pages the library cannot read are never
    // evicted: see `unreadable`). An address hint (without
    // MAP_FIXED) is only a hint: the memory comes from the arena wherever
    // it has room (at the hint if that is a hole the program unmapped:
    // `large_alloc_mmap`). Runtimes hint at random addresses (V8, for every
    // mapping) or at ones they would like (HotSpot's zero-based
    // compressed pointers, JIT code near the binary), and check what they
    // got: HotSpot gives the range back and tries other addresses, then
    // takes any; V8 takes any address and aligns within what it got.
    // A program that gives back such mappings over and over wants the
    // addresses it asks for (ZGC: see `note_refused`); from then on a
    // hint the kernel can grant is granted, by the kernel. MAP_32BIT
    // (memory below 2 GiB, as LuaJIT asks for it) is the kernel's too.
    let managed = flags & (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
        == libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
        && flags
            & (libc::MAP_FIXED
                | libc::MAP_FIXED_NOREPLACE
                | libc::MAP_GROWSDOWN
                | libc::MAP_HUGETLB
                | libc::MAP_STACK
                | libc::MAP_32BIT)
            == 0
        && prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == 0
        && len > 0;
    if managed && !a.is_null() && HINTS_GRANTED.load(Ordering::Relaxed) {
        let p = sys::mmap(a, len, prot, flags, fd, off);
        if p == a {
            return p;
        }
        if p != libc::MAP_FAILED {
            sys::munmap(p, len);
        }
    }
    if managed {
        if let Some(g) = global_for(len) {
            let p = large_alloc_mmap(g, len, a as usize);
            if p == a {
                // Granted (a hole of the arena): nothing to refuse.
                LAST_HINTED.store(0, Ordering::Relaxed);
                REFUSED_RUN.store(0, Ordering::Relaxed);
            } else if !p.is_null() && !a.is_null() {
                // Given back at once, this is a refusal (`note_refused`).
                let last_len = LAST_HINTED_LEN.swap(len, Ordering::Relaxed);
                // The last one kept, or another length: a new run.
                if LAST_HINTED.swap(p as usize, Ordering::Relaxed) != 0 || last_len != len {
                    REFUSED_RUN.store(0, Ordering::Relaxed);
                }
            }
            if p.is_null() {
                // Served by the kernel below.
                arena_full(g, len);
            } else {
                if prot != RW {
                    // Free pages may be resident (a fault's run of zero
                    // pages reaches past the block it faulted in) and so
                    // the evictor's victims: like any protection change,
                    // it waits for the eviction that owns them.
                    let n = len.div_ceil(PAGE);
                    if change_protection(p, n * PAGE, prot, 0, || sys::mprotect(p, n * PAGE, prot)) != 0 {
                        let e = sys::errno();
                        unmap_arena(g, g.page_of(p as usize), n);
                        sys::set_errno(e);
                        return libc::MAP_FAILED;
                    }
                }
                return p;
            }
        }
    }
    let mut flags = flags;
    if flags & libc::MAP_FIXED_NOREPLACE != 0 && len > 0 {
        if let Some((g, (first, n))) =
            crate::GLOBAL.get().and_then(|g| Some((g, page_range(g, a as usize, len)?)))
        {
            // A hole of the arena is unmapped memory to the program: a
            // mapping there that replaces nothing is made as a fixed one.
            // Anything else in the way is, as the kernel says.
            if !crate::lock(&g.pages).used_within(first, n).is_empty() {
                sys::set_errno(libc::EEXIST);
                return libc::MAP_FAILED;
            }
            flags = flags & !libc::MAP_FIXED_NOREPLACE | libc::MAP_FIXED;
        }
    }
    if flags & libc::MAP_FIXED != 0 && len > 0 {
        forget_early(a as usize, len);
        if let Some(g) = crate::GLOBAL.get() {
            if let Some((first, n)) = page_range(g, a as usize, len) {
                // Whatever of the range was a hole is the program's now:
                // never handed out again while it is mapped (it was, and
                // two mappings shared their pages).
                let mut pa = crate::lock(&g.pages);
                pa.take_within(first, n);
                grown(g, &pa);
                drop(pa);
                let anon = flags & (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_SHARED)
                    == libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
                let done = crate::as_inside(|| {
                    // An eviction in flight releases its pages' memory
                    // later: not over a mapping of something else.
                    let mut m = crate::lock_unowned(g, first, n);
                    m.release(first, n, &g.stats);
                    if anon && fd == -1 && prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == 0
                    {
                        // A fresh anonymous mapping over arena memory (how a
                        // runtime commits or uncommits parts of a reservation,
                        // HotSpot its code cache read-write-execute): the
                        // same thing as zeroing it and setting protections,
                        // which keeps it managed.
                        if sys::mprotect(a, n * PAGE, prot) != 0 {
                            return Some(libc::MAP_FAILED);
                        }
                        m.set_noevict(first, n, unreadable(prot, 0));
                        reprotected(first, n, prot != RW);
                        return Some(a);
                    }
                    // Something else (a file, shared memory): no longer ours to
                    // evict; munmap gives the range back.
                    m.set_noevict(first, n, true);
                    None
                });
                if let Some(r) = done {
                    return r;
                }
            }
        }
    }
    let p = sys::mmap(a, len, prot, flags, fd, off);
    if managed && prot == RW && p != libc::MAP_FAILED && crate::GLOBAL.get().is_none() && !crate::inside() {
        remember_early(p as usize, len);
    }
    if managed && p != libc::MAP_FAILED {
        // Allocation-only mode: memory a run would have carved from its arena.
        crate::alloconly::note_map(p, len);
    }
    p
}

/// Hinted mappings given back in a row, each of the same length as the
/// last, before hints are granted ([`HINTS_GRANTED`]).
///
/// HotSpot's G1 gives back 9 at start-up (its heap tried at 3 addresses
/// for each of 3 compressed-pointer modes: it then takes any, and its
/// heap stays managed); ZGC reserves the same length at thousands of
/// addresses, one after the other, and takes no other (it failed after
/// 24 s: "Failed to reserve enough address space for Java heap");
/// LuaJIT tries 30 random low addresses.
const REFUSALS: u32 = 16;

/// Are hints granted by the kernel where it can (a program gave back
/// [`REFUSALS`] hinted mappings in a row)?
static HINTS_GRANTED: AtomicBool = AtomicBool::new(false);

/// The arena mapping last given for a hinted `mmap` (0: none, or given
/// back), its length, and how many such were given back in a row.
static LAST_HINTED: AtomicUsize = AtomicUsize::new(0);
static LAST_HINTED_LEN: AtomicUsize = AtomicUsize::new(0);
static REFUSED_RUN: AtomicU32 = AtomicU32::new(0);

/// `munmap(a, len)` of arena memory: if it is the mapping last given for
/// a hint, whole, the program refused it (it was not where it asked); at
/// [`REFUSALS`] in a row of one length, hints are granted from then on,
/// and the log says so once.
fn note_refused(a: usize, len: usize) {
    if a == 0 || len != LAST_HINTED_LEN.load(Ordering::Relaxed) {
        return;
    }
    if LAST_HINTED.compare_exchange(a, 0, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        return;
    }
    let run = REFUSED_RUN.fetch_add(1, Ordering::Relaxed) + 1;
    if run >= REFUSALS && !HINTS_GRANTED.swap(true, Ordering::Relaxed) {
        crate::notice(format_args!(
            "ztier: process {}: the program gave back {run} mappings in a row that were not at the \
             address it asked for (as a runtime that needs fixed addresses does, ZGC): from now on such \
             memory comes from the kernel at that address where it can, unmanaged",
            std::process::id()
        ));
    }
}

/// `len` bytes of the arena's page region for a mapping: at `hint` if
/// that lies wholly in a hole the program unmapped (the kernel grants a
/// hint at unmapped memory, and a program that unmaps a range and maps
/// it again may count on getting it back), else wherever there is room;
/// null if there is none. A hint past what the arena ever handed out
/// (a runtime's random one) is not granted: it would spread the arena's
/// used part, which forks and core dumps walk.
fn large_alloc_mmap(g: &Global, len: usize, hint: usize) -> *mut c_void {
    let n = len.div_ceil(PAGE);
    let mut pa = crate::lock(&g.pages);
    let at = page_range(g, hint, len)
        .filter(|&(first, k)| first + k <= pa.high)
        .and_then(|(first, k)| pa.take(first, k).then_some(first));
    match at.or_else(|| pa.alloc(n, 1)) {
        Some(first) => {
            grown(g, &pa);
            drop(pa);
            if make_usable(g, first, n) != 0 {
                return std::ptr::null_mut();
            }
            (g.base + first * PAGE) as *mut c_void
        }
        None => std::ptr::null_mut(),
    }
}

/// `mmap64`: the same call.
///
/// # Safety
/// The C contract of `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    a: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    // SAFETY: forwarding.
    unsafe { mmap(a, len, prot, flags, fd, off) }
}

/// Gives a range of the page region back after the program unmapped it;
/// if the program had mapped something else over it (MAP_FIXED), the
/// arena mapping is restored first.
/// `mremap(old, .., new_len, MREMAP_MAYMOVE | MREMAP_FIXED, new)` of the
/// `n` arena pages at `old`: what the kernel does, by hand. `new` may be
/// in the arena (the program's own reservation, typically: its pages
/// become a fresh managed mapping) or wholly outside it (a mapping of the
/// kernel's, unmanaged); the contents are copied (evicted pages fault
/// back as they are read), the protection kept, the old pages unmapped.
/// The kernel's errors: `EINVAL` without `MREMAP_MAYMOVE`, for an
/// unaligned or overlapping `new`, and here for a `new` straddling the
/// arena's end or its `malloc` spans; `EFAULT` if `old` is not one
/// mapping (or takes in a hole: [`has_hole`]).
fn remap_fixed(g: &Global, old: usize, n: usize, new_len: usize, flags: c_int, new: usize) -> *mut c_void {
    let fail = |e| {
        sys::set_errno(e);
        libc::MAP_FAILED
    };
    let (old_end, want) = (old + n * PAGE, new_len.div_ceil(PAGE));
    let Some(new_end) = new.checked_add(want * PAGE) else { return fail(libc::EINVAL) };
    if flags & libc::MREMAP_MAYMOVE == 0 || new % PAGE != 0 || (new < old_end && old < new_end) {
        return fail(libc::EINVAL);
    }
    if has_hole(g, old, n * PAGE) {
        return fail(libc::EFAULT);
    }
    let Some(prot) = crate::as_inside(|| mapping_prot(old, n * PAGE, true)) else {
        return fail(libc::EFAULT);
    };
    let inside = page_range(g, new, new_len);
    if inside.is_none() && (new_end > g.base && new < g.base + g.arena_bytes) {
        return fail(libc::EINVAL);
    }
    if readable_for_move(old, n, prot) != 0 {
        return libc::MAP_FAILED;
    }
    let q = match inside {
        Some((first, k)) => {
            // Whatever of the range the arena still had free is the
            // program's now; all of it becomes a fresh mapping.
            crate::lock(&g.pages).take_within(first, k);
            if fresh_arena(g, first, k) != 0 {
                return libc::MAP_FAILED;
            }
            new as *mut c_void
        }
        None => {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
            let q = sys::mmap(new as *mut c_void, want * PAGE, RW, flags, -1, 0);
            if q == libc::MAP_FAILED {
                return q;
            }
            q
        }
    };
    move_pages(g, old, n, q, want, prot, inside.is_some(), flags & libc::MREMAP_DONTUNMAP != 0)
}

/// Before the program's `n` arena pages at `old` (protection `prot`) are
/// copied to a new place: made readable if they are not (0, or -1 with
/// `errno`).
fn readable_for_move(old: usize, n: usize, prot: c_int) -> c_int {
    if prot & libc::PROT_READ != 0 {
        return 0;
    }
    change_protection(old as *mut c_void, n * PAGE, libc::PROT_READ, 0, || {
        sys::mprotect(old as *mut c_void, n * PAGE, libc::PROT_READ)
    })
}

/// The move of `mremap`: the program's `n` arena pages at `old` (of
/// protection `prot`, made readable by [`readable_for_move`]) copied to
/// `q`, `want` writable pages just made (arena pages if `in_arena`), which
/// then get `prot`. The old range is unmapped; with `dontunmap`
/// (`MREMAP_DONTUNMAP`) it stays mapped, its protection as it was and its
/// pages emptied, as the kernel leaves it: the next touch reads zeros.
#[allow(clippy::too_many_arguments)]
fn move_pages(
    g: &Global,
    old: usize,
    n: usize,
    q: *mut c_void,
    want: usize,
    prot: c_int,
    in_arena: bool,
    dontunmap: bool,
) -> *mut c_void {
    // SAFETY: `old` is `n` readable pages of the program's (one mapping),
    // `q` `want` writable ones, not overlapping (the callers check).
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, q.cast::<u8>(), n.min(want) * PAGE) };
    if prot != RW {
        let set = || sys::mprotect(q, want * PAGE, prot);
        let r = if in_arena { change_protection(q, want * PAGE, prot, 0, set) } else { set() };
        if r != 0 {
            return libc::MAP_FAILED;
        }
    }
    let first = g.page_of(old);
    if !dontunmap {
        unmap_arena(g, first, n);
        return q;
    }
    if prot & libc::PROT_READ == 0 {
        let a = old as *mut c_void;
        if change_protection(a, n * PAGE, prot, 0, || sys::mprotect(a, n * PAGE, prot)) != 0 {
            return libc::MAP_FAILED;
        }
    }
    crate::as_inside(|| crate::lock_unowned(g, first, n).release(first, n, &g.stats));
    q
}

/// Unmaps the program's arena pages `[first, first + n)`: released, made
/// a fresh inaccessible mapping ([`fresh_arena`]) and returned to the
/// free ranges. A touch there is a `SIGSEGV`, as on memory the kernel
/// unmapped (it read zeros: a use after `munmap` went unseen); whatever
/// hands the pages out again makes them read-write first ([`make_usable`]).
fn unmap_arena(g: &Global, first: usize, n: usize) -> c_int {
    let r = fresh_arena_as(g, first, n, libc::PROT_NONE);
    if r == 0 {
        crate::lock(&g.pages).free(first, n);
    }
    r
}

/// Arena pages `[first, first + n)` just taken from the free ranges, made
/// read-write if some were left otherwise (unmapped: [`unmap_arena`]); 0,
/// or -1 with `errno`.
fn make_usable(g: &Global, first: usize, n: usize) -> c_int {
    if !is_reprotected(first, n) {
        return 0;
    }
    let a = (g.base + first * PAGE) as *mut c_void;
    change_protection(a, n * PAGE, RW, 0, || sys::mprotect(a, n * PAGE, RW))
}

/// Makes arena pages `[first, first + n)` a fresh registered read-write
/// mapping of zero pages, their copies dropped.
fn fresh_arena(g: &Global, first: usize, n: usize) -> c_int {
    fresh_arena_as(g, first, n, RW)
}

/// [`fresh_arena`] with protection `prot` (read-write, or none).
fn fresh_arena_as(g: &Global, first: usize, n: usize, prot: c_int) -> c_int {
    crate::as_inside(|| {
        let addr = (g.base + first * PAGE) as *mut c_void;
        let mut m = crate::lock_unowned(g, first, n);
        m.release(first, n, &g.stats);
        // A new mapping here is not wiped in a forked child, nor locked.
        m.wipe_on_fork(first, n, crate::manager::OnFork::Keep);
        m.unlock_pages(first, n);
        // Restore a plain registered arena mapping over the range (undoes any
        // MAP_FIXED or mprotect the program did there).
        let p = sys::mmap(
            addr,
            n * PAGE,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return -1;
        }
        if m.reregister(first, n).is_err() {
            eprintln!("ztier: cannot register unmapped arena memory again: aborting");
            std::process::abort();
        }
        if LOCK_FUTURE.load(std::sync::atomic::Ordering::Relaxed) {
            // `mlockall(MCL_FUTURE)` locked the new mapping (on fault):
            // the arena's pages are the library's to keep (see `mlockall`).
            crate::sys::raw(libc::SYS_munlock, [addr as u64, (n * PAGE) as u64, 0, 0, 0, 0]);
        }
        m.set_noevict(first, n, prot != RW);
        reprotected(first, n, prot != RW);
        0
    })
}

/// `munmap(2)`.
///
/// # Safety
/// The C contract of `munmap`.
#[no_mangle]
pub unsafe extern "C" fn munmap(a: *mut c_void, len: usize) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    forget_early(a as usize, len);
    crate::alloconly::note_unmap(a, len);
    if let Some(g) = crate::GLOBAL.get() {
        if let Some((first, n)) = page_range(g, a as usize, len) {
            note_refused(a as usize, len);
            return unmap_arena(g, first, n);
        }
        if g.in_arena(a as usize) || g.in_arena((a as usize).wrapping_add(len).wrapping_sub(1)) {
            // Span memory (malloc's) or a range straddling the arena.
            sys::set_errno(libc::EINVAL);
            return -1;
        }
    }
    sys::munmap(a, len)
}

/// `mremap(2)` (the fifth argument is read only with `MREMAP_FIXED`).
///
/// # Safety
/// The C contract of `mremap`.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new: *mut c_void,
) -> *mut c_void {
    let _sud = crate::sudstate::Allow::new();
    // Not arena memory: an early mapping that grows moves to the arena;
    // anything else is the kernel's (and an early mapping it moves or
    // resizes is remembered no more).
    let outside = || {
        if let Some(q) = mremap_early(old as usize, old_len, new_len, flags) {
            return q;
        }
        let r = sys::mremap(old, old_len, new_len, flags, new);
        if r != libc::MAP_FAILED {
            forget_early(old as usize, old_len);
        }
        r
    };
    let Some(g) = crate::GLOBAL.get() else { return outside() };
    let Some((first, n)) = page_range(g, old as usize, old_len) else {
        if g.in_arena(old as usize) {
            sys::set_errno(libc::EINVAL);
            return libc::MAP_FAILED;
        }
        return outside();
    };
    let fail = |e| {
        sys::set_errno(e);
        libc::MAP_FAILED
    };
    let want = new_len.div_ceil(PAGE);
    let dontunmap = flags & libc::MREMAP_DONTUNMAP != 0;
    // The kernel's: `MREMAP_DONTUNMAP` moves, and only at the same length.
    if new_len == 0 || (dontunmap && (flags & libc::MREMAP_MAYMOVE == 0 || want != n)) {
        return fail(libc::EINVAL);
    }
    if flags & libc::MREMAP_FIXED != 0 {
        return remap_fixed(g, old as usize, n, new_len, flags, new as usize);
    }
    // Unmapped memory where a mapping should be (after the kernel's
    // `EINVAL` checks): at its start, or for a call that keeps or moves
    // the whole range (not one that shrinks it in place) anywhere in it
    // (`EFAULT`, as the kernel's check that the range is one mapping).
    let whole = new_len > old_len || dontunmap;
    if has_hole(g, old as usize, if whole { old_len } else { PAGE }) {
        return fail(libc::EFAULT);
    }
    if !dontunmap && want <= n {
        if want < n {
            unmap_arena(g, first + want, n - want);
        }
        return old;
    }
    // The mapping's protection, which its growth and its new place keep:
    // read-write unless the program changed it.
    let prot = if is_reprotected(first, n) {
        match crate::as_inside(|| mapping_prot(old as usize, n * PAGE, true)) {
            Some(p) => p,
            None => return fail(libc::EFAULT),
        }
    } else {
        RW
    };
    if !dontunmap {
        let mut pa = crate::lock(&g.pages);
        if pa.take(first + n, want - n) {
            grown(g, &pa);
            drop(pa);
            let a = (old as usize + n * PAGE) as *mut c_void;
            let len = (want - n) * PAGE;
            let set = || sys::mprotect(a, len, prot);
            let r = if prot == RW {
                make_usable(g, first + n, want - n)
            } else {
                change_protection(a, len, prot, 0, set)
            };
            if r != 0 {
                return libc::MAP_FAILED;
            }
            return old;
        }
        drop(pa);
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return fail(libc::ENOMEM);
    }
    let q = large_alloc_mmap(g, new_len, 0);
    if q.is_null() {
        return fail(libc::ENOMEM);
    }
    if readable_for_move(old as usize, n, prot) != 0 {
        let e = sys::errno();
        unmap_arena(g, g.page_of(q as usize), want);
        return fail(e);
    }
    // Evicted pages of the old range fault back in as they are read.
    move_pages(g, old as usize, n, q, want, prot, true, dontunmap)
}

/// `madvise(2)`: releasing advice on arena memory drops our copies too.
///
/// # Safety
/// The C contract of `madvise`.
#[no_mangle]
pub unsafe extern "C" fn madvise(a: *mut c_void, len: usize, advice: c_int) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    if let Some(g) = crate::GLOBAL.get() {
        if g.in_arena(a as usize) {
            if matches!(advice, libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE) {
                let end = (a as usize + len).next_multiple_of(PAGE);
                if a as usize % PAGE != 0 || !g.in_arena(end - 1) {
                    sys::set_errno(libc::EINVAL);
                    return -1;
                }
                let (first, n) = (g.page_of(a as usize), (end - a as usize) / PAGE);
                crate::as_inside(|| crate::lock_unowned(g, first, n).release(first, n, &g.stats));
                return hole_error(g, a as usize, len, 0);
            }
            if matches!(advice, MADV_POPULATE_READ | MADV_POPULATE_WRITE) {
                // Served here: where faults are caught by signal or in
                // user mode only, the kernel's own faults fail, and the
                // call did (`EFAULT`).
                let Some((first, n)) = arena_pages(g, a as usize, len).filter(|_| a as usize % PAGE == 0)
                else {
                    sys::set_errno(libc::EINVAL);
                    return -1;
                };
                if has_hole(g, a as usize, len) {
                    sys::set_errno(libc::ENOMEM);
                    return -1;
                }
                return populate(g, first, n);
            }
            if matches!(
                advice,
                libc::MADV_DONTFORK | libc::MADV_WIPEONFORK | libc::MADV_DOFORK | libc::MADV_KEEPONFORK
            ) {
                // The arena must reach a forked child whole: the child
                // releases such pages instead (`Manager::wipe_on_fork`).
                let end = (a as usize).wrapping_add(len).next_multiple_of(PAGE);
                if a as usize % PAGE != 0 || end < a as usize || !g.in_arena(end - 1) {
                    sys::set_errno(libc::EINVAL);
                    return -1;
                }
                let (first, n) = (g.page_of(a as usize), (end - a as usize) / PAGE);
                let how = match advice {
                    libc::MADV_WIPEONFORK => crate::manager::OnFork::Wipe,
                    libc::MADV_DONTFORK => crate::manager::OnFork::Drop,
                    _ => crate::manager::OnFork::Keep,
                };
                // Only the parts still mapped: the holes' pages are
                // handed out again to mappings of their own.
                let parts = crate::lock(&g.pages).used_within(first, n);
                crate::as_inside(|| {
                    let mut m = crate::lock_program(g);
                    for &(f, k) in &parts {
                        m.wipe_on_fork(f, k, how);
                    }
                });
                return hole_error(g, a as usize, len, 0);
            }
            let r = sys::madvise(a, len, advice);
            return hole_error(g, a as usize, len, r);
        }
    }
    sys::madvise(a, len, advice)
}

/// The result `r` of a call over `[a, a + len)` that succeeded on the
/// arena's mapping, or -1 with `ENOMEM` if the range takes in a hole
/// ([`has_hole`]): the kernel does what it can with the rest and fails
/// the call so.
fn hole_error(g: &Global, a: usize, len: usize, r: c_int) -> c_int {
    if r == 0 && has_hole(g, a, len) {
        sys::set_errno(libc::ENOMEM);
        return -1;
    }
    r
}

/// `madvise` advice to fault a range in (Linux 5.14).
const MADV_POPULATE_READ: c_int = 22;
const MADV_POPULATE_WRITE: c_int = 23;

/// `MADV_POPULATE_READ`/`_WRITE` of arena pages `[first, first + n)`:
/// brought in (stored ones from the store, untouched ones as zeros) in
/// parts of a quarter of the budget, each a pin that ends at once, so
/// a range larger than the budget leaves its last part resident.
fn populate(g: &Global, first: usize, n: usize) -> c_int {
    let part = (g.cfg.budget_pages / 4).max(16);
    let mut at = first;
    while at < first + n {
        let k = part.min(first + n - at);
        let r = crate::as_inside(|| loop {
            let mut m = crate::lock_unowned(g, at, k);
            match m.pin(at, k, &g.stats) {
                Ok(true) => {
                    m.unpin(at, k);
                    return Ok(());
                }
                Ok(false) => continue,
                Err(e) => return Err(e),
            }
        });
        if let Err(e) = r {
            crate::notice(format_args!("ztier: madvise(MADV_POPULATE): bringing back {k} pages failed: {e}"));
            sys::set_errno(libc::ENOMEM);
            return -1;
        }
        at += k;
    }
    0
}

/// `mlockall(MCL_FUTURE)` is in force: each new mapping the library makes
/// in its arena is unlocked again.
static LOCK_FUTURE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The arena pages `[first, first + n)` of `[a, a + len)` as `mlock`
/// rounds it (`a` down, the end up, to pages); `None` if the range is not
/// all arena memory.
pub(crate) fn arena_pages(g: &Global, a: usize, len: usize) -> Option<(usize, usize)> {
    let start = a & !(PAGE - 1);
    let end = a.checked_add(len)?.next_multiple_of(PAGE);
    (len > 0 && g.in_arena(start) && g.in_arena(end - 1)).then(|| (g.page_of(start), (end - start) / PAGE))
}

/// A raw system call's result as a C function returns it.
fn c_result(r: i64) -> c_int {
    sys::c_ret(r) as c_int
}

/// `mlock(2)` and `mlock2(2)` on arena memory: the pages are brought back
/// and kept resident by the library (`Manager::lock_pages`), not by the
/// kernel, whose lock would make every later eviction and release of the
/// arena fail (`EINVAL`: the process was aborted). `MLOCK_ONFAULT` is
/// served as a plain lock (the pages are brought in at once). Anything
/// else goes to the kernel.
fn lock_range(a: *const c_void, len: usize, nr: i64, flags: u64) -> c_int {
    if let Some(g) = crate::GLOBAL.get() {
        if let Some((first, n)) = arena_pages(g, a as usize, len) {
            if has_hole(g, a as usize, len) {
                sys::set_errno(libc::ENOMEM);
                return -1;
            }
            return crate::as_inside(|| loop {
                let mut m = crate::lock_unowned(g, first, n);
                match m.lock_pages(first, n, &g.stats) {
                    Ok(true) => return 0,
                    Ok(false) => continue,
                    Err(e) => {
                        crate::notice(format_args!("ztier: mlock: bringing back {n} pages failed: {e}"));
                        sys::set_errno(libc::ENOMEM);
                        return -1;
                    }
                }
            });
        }
    }
    c_result(crate::sys::raw(nr, [a as u64, len as u64, flags, 0, 0, 0]))
}

/// `mlock(2)`: see [`lock_range`].
///
/// # Safety
/// The C contract of `mlock`.
#[no_mangle]
pub unsafe extern "C" fn mlock(a: *const c_void, len: usize) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    lock_range(a, len, libc::SYS_mlock, 0)
}

/// `mlock2(2)`: see [`lock_range`].
///
/// # Safety
/// The C contract of `mlock2`.
#[no_mangle]
pub unsafe extern "C" fn mlock2(a: *const c_void, len: usize, flags: libc::c_uint) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    lock_range(a, len, libc::SYS_mlock2, flags as u64)
}

/// `munlock(2)`: ends the library's lock of arena pages
/// (`Manager::unlock_pages`), or the kernel's of anything else.
///
/// # Safety
/// The C contract of `munlock`.
#[no_mangle]
pub unsafe extern "C" fn munlock(a: *const c_void, len: usize) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    if let Some(g) = crate::GLOBAL.get() {
        if let Some((first, n)) = arena_pages(g, a as usize, len) {
            crate::as_inside(|| crate::lock_program(g).unlock_pages(first, n));
            return hole_error(g, a as usize, len, 0);
        }
    }
    c_result(crate::sys::raw(libc::SYS_munlock, [a as u64, len as u64, 0, 0, 0, 0]))
}

/// The manager's lock once no eviction is in flight (they release pages
/// without the lock: see `lock_unowned`).
fn lock_quiet(g: &Global) -> crate::Held<'_> {
    let mut m = crate::lock_program(g);
    while m.evicting() > 0 {
        drop(m);
        std::thread::sleep(std::time::Duration::from_micros(50));
        m = crate::lock_program(g);
    }
    m
}

/// `mlockall(2)`. The kernel locks everything but the arena: it is asked
/// with `MCL_ONFAULT` added (so the arena's reservation is not filled in)
/// and the arena unlocked right after, as is each mapping the library
/// makes in it later under `MCL_FUTURE`. The arena's pages stay resident
/// by the library instead: no eviction while it is in force, and stored
/// pages brought back (`Manager::lock_all`). Before, the first eviction
/// after it failed (`EINVAL`) and the process was aborted.
///
/// # Safety
/// The C contract of `mlockall`.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    let Some(g) = crate::GLOBAL.get() else {
        // Before the library starts: its arena, reserved later, must not
        // be filled in then (`MCL_FUTURE`), and it starts locked.
        let r = crate::sys::raw(libc::SYS_mlockall, [(flags | libc::MCL_ONFAULT) as u64, 0, 0, 0, 0, 0]);
        if r == 0 {
            LOCK_FUTURE.store(flags & libc::MCL_FUTURE != 0, std::sync::atomic::Ordering::Relaxed);
            LOCKED_BEFORE_START.store(flags & libc::MCL_FUTURE != 0, std::sync::atomic::Ordering::Relaxed);
        }
        return c_result(r);
    };
    crate::as_inside(|| {
        let mut m = lock_quiet(g);
        let r = crate::sys::raw(libc::SYS_mlockall, [(flags | libc::MCL_ONFAULT) as u64, 0, 0, 0, 0, 0]);
        crate::sys::raw(libc::SYS_munlock, [g.base as u64, g.arena_bytes as u64, 0, 0, 0, 0]);
        if r < 0 {
            return c_result(r);
        }
        LOCK_FUTURE.store(flags & libc::MCL_FUTURE != 0, std::sync::atomic::Ordering::Relaxed);
        let used = crate::used(g, &crate::lock(&g.pages));
        if let Err(e) = m.lock_all(true, &used, &g.stats) {
            crate::notice(format_args!("ztier: mlockall: bringing back stored pages failed: {e}"));
            sys::set_errno(libc::ENOMEM);
            return -1;
        }
        0
    })
}

/// `munlockall(2)`: the kernel's locks and the library's (every `mlock`
/// of arena pages too); evictions resume.
///
/// # Safety
/// The C contract of `munlockall`.
#[no_mangle]
pub unsafe extern "C" fn munlockall() -> c_int {
    let _sud = crate::sudstate::Allow::new();
    let r = crate::sys::raw(libc::SYS_munlockall, [0; 6]);
    if let Some(g) = crate::GLOBAL.get() {
        LOCK_FUTURE.store(false, std::sync::atomic::Ordering::Relaxed);
        crate::as_inside(|| {
            let _ = crate::lock_program(g).lock_all(false, &[], &g.stats);
        });
    }
    c_result(r)
}

/// `mlockall(MCL_FUTURE)` came before the library started: its arena
/// starts locked ([`locked_at_start`]).
static LOCKED_BEFORE_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// At start-up, the arena `[base, base + len)` just reserved: unlocked
/// (`MCL_FUTURE` locked it on fault), and whether the program asked for
/// its memory to be locked before (no eviction then).
pub(crate) fn locked_at_start(base: usize, len: usize) -> bool {
    if LOCK_FUTURE.load(std::sync::atomic::Ordering::Relaxed) {
        crate::sys::raw(libc::SYS_munlock, [base as u64, len as u64, 0, 0, 0, 0]);
    }
    LOCKED_BEFORE_START.load(std::sync::atomic::Ordering::Relaxed)
}

/// In a forked child: locks are not inherited.
pub(crate) fn unlock_after_fork() {
    LOCK_FUTURE.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Changes the protection of `[a, a + len)` with `call` (mprotect or
/// pkey_mprotect). On arena memory it happens under the manager's lock,
/// once no eviction in flight owns a page of the range (see
/// `lock_unowned`), and the pages become unevictable (`noevict`: the
/// handler must be able to read what it evicts; see [`unreadable`]) or
/// evictable again in the same step, so no eviction can pick a page the
/// program is making unreadable. Pages made other than read-write are
/// remembered ([`reprotected`]).
fn change_protection(
    a: *mut c_void,
    len: usize,
    prot: c_int,
    pkey: c_int,
    call: impl FnOnce() -> c_int,
) -> c_int {
    forget_early(a as usize, len);
    if let Some(g) = crate::GLOBAL.get() {
        let end = (a as usize).wrapping_add(len.next_multiple_of(PAGE));
        if len > 0 && g.in_arena(a as usize) && g.in_arena(end - 1) && end > a as usize {
            let (first, n) = (g.page_of(a as usize), (end - a as usize) / PAGE);
            return crate::as_inside(|| {
                let mut m = crate::lock_unowned(g, first, n);
                let r = call();
                if r == 0 {
                    m.set_noevict(first, n, unreadable(prot, pkey));
                    reprotected(first, n, prot != RW || pkey > 0);
                }
                r
            });
        }
    }
    call()
}

/// Arena page ranges `[first, end)` whose protection the program made
/// other than read-write (or tagged with a protection key), disjoint; and
/// how many there are. A `malloc` block among them that is freed gets
/// plain read-write memory back before it is handed out again
/// ([`large_free`]): glibc unmaps such a block, protection and all, and a
/// program that left a guard page in a block it freed had the next
/// `malloc` of those pages crash on it.
static REPROTECTED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
static REPROTECTED_RANGES: AtomicUsize = AtomicUsize::new(0);

/// Marks pages `[first, first + n)` other than read-write (`on`) or
/// read-write again in [`REPROTECTED`].
fn reprotected(first: usize, n: usize, on: bool) {
    if !on && REPROTECTED_RANGES.load(Ordering::Relaxed) == 0 {
        return;
    }
    let end = first + n;
    let mut set = crate::lock(&REPROTECTED);
    let overlapping: Vec<(usize, usize)> =
        set.range(..end).rev().take_while(|&(_, &e)| e > first).map(|(&f, &e)| (f, e)).collect();
    for (f, e) in overlapping {
        set.remove(&f);
        if f < first {
            set.insert(f, first);
        }
        if e > end {
            set.insert(end, e);
        }
    }
    if on {
        // Merged with the ranges it touches (each unmapped range is one).
        let mut range = (first, end);
        if let Some((&f, &e)) = set.range(..first).next_back() {
            if e == first {
                set.remove(&f);
                range.0 = f;
            }
        }
        if let Some(e) = set.remove(&end) {
            range.1 = e;
        }
        set.insert(range.0, range.1);
    }
    REPROTECTED_RANGES.store(set.len(), Ordering::Relaxed);
}

/// Does any page of `[first, first + n)` have a protection other than
/// read-write ([`REPROTECTED`])?
fn is_reprotected(first: usize, n: usize) -> bool {
    REPROTECTED_RANGES.load(Ordering::Relaxed) > 0
        && crate::lock(&REPROTECTED).range(..first + n).next_back().is_some_and(|(_, &e)| e > first)
}

/// `mprotect(2)`: arena pages the library cannot read ([`unreadable`])
/// are never evicted. Read-only and executable pages are evicted as
/// read-write ones are: a fault installs a page with its mapping's
/// protection. (They were once kept resident too: a JIT's 64 MiB of code
/// made read-only at an 8M budget sat over it, and the program's other
/// memory thrashed through what was left, 0.08 s natively against 13–49
/// s; `cli_run_modes::read_only_and_executable_memory_is_evicted_too`.)
///
/// # Safety
/// The C contract of `mprotect`.
#[no_mangle]
pub unsafe extern "C" fn mprotect(a: *mut c_void, len: usize, prot: c_int) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    if let Some(r) = protect_hole(a, len, prot) {
        return r;
    }
    change_protection(a, len, prot, 0, || sys::mprotect(a, len, prot))
}

/// Can the library not read (so evict) pages of protection `prot` and
/// protection key `pkey`? Without `PROT_READ`, or tagged with a key
/// other than the default, which the library's threads may have no
/// access to (keys are checked per thread). Read-only and executable
/// pages are read as others are, and a fault installs them with their
/// mapping's protection.
fn unreadable(prot: c_int, pkey: c_int) -> bool {
    prot & libc::PROT_READ == 0 || pkey > 0
}

/// `pkey_mprotect(2)`: pages tagged with a protection key other than the
/// default may be unreadable from the handler thread (keys are checked per
/// thread), so they are never evicted ([`unreadable`]).
///
/// # Safety
/// The C contract of `pkey_mprotect`.
#[no_mangle]
pub unsafe extern "C" fn pkey_mprotect(a: *mut c_void, len: usize, prot: c_int, pkey: c_int) -> c_int {
    let _sud = crate::sudstate::Allow::new();
    if let Some(r) = protect_hole(a, len, prot) {
        return r;
    }
    change_protection(a, len, prot, pkey, || sys::pkey_mprotect(a, len, prot, pkey))
}
