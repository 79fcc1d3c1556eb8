//! # ztier-preload — the library `ztier run` preloads into a program
//!
//! Loaded with `LD_PRELOAD` (by `ztier run`, which sets `ZTIER_BUDGET` and
//! the other `ZTIER_*` variables; without `ZTIER_BUDGET` the library only
//! forwards to glibc, or with `ZTIER_ALLOC_ONLY=1` runs its allocator
//! alone: [`alloconly`]), it gives the program's heap to a **managed arena**:
//!
//! - `malloc` and friends are replaced ([`small`] size classes up to
//!   32 KiB, page ranges above — glibc's own malloc gets its memory with
//!   internal `mmap`/`brk` calls that cannot be interposed, so it is not
//!   used for the program);
//! - the program's private anonymous read-write `mmap`s without a fixed
//!   address are carved from the arena, and `munmap`, `mremap`, `madvise`
//!   and `mprotect` on arena memory are handled here;
//! - the arena is one big mapping registered with userfaultfd; the
//!   [`manager`] keeps at most the budget of it resident and the rest
//!   compressed in the page store, and a handler thread serves faults.
//!
//! Three library threads per process: `ztier-handler` (serves faults,
//! pinned next to the main thread; answers the control socket),
//! `ztier-evictor` (compresses pages in the background to keep a reserve
//! below the budget) and `ztier-watchdog` (aborts with a message if faults
//! wait and the handler has been stuck for `ZTIER_WATCHDOG_S` seconds).
//! They block every asynchronous signal (the program's signals must
//! reach the program's threads), and a thread of the program blocks them
//! while it holds the manager's lock ([`Held`]).
//! With `ZTIER_FAULT_PATH=signal` (`ztier run --fault-path signal`), or
//! `auto` (the default) under a user-mode-only userfaultfd, each fault is
//! served in the thread that took it, from a `SIGBUS` handler
//! ([`serve_in_thread`], see [`sud`]); the handler thread then only
//! answers the control socket and evicts when idle. A program with a
//! `malloc` of its own takes that path whatever was asked
//! ([`manager::signal_path`]: its allocator's fork handlers fault in a
//! child that cannot start a handler thread yet).
//!
//! ```text
//!  arena (64 GiB of address space, MAP_NORESERVE, uffd missing + wp)
//!  ┌──────────────────────────────┬──────────────────────────────────────────┐
//!  │ span region (16 GiB)         │ page region (48 GiB)                     │
//!  │ 256 KiB spans of small blocks│ large blocks and mmaps, best-fit ranges  │
//!  └──────────────────────────────┴──────────────────────────────────────────┘
//! ```
//!
//! Under an address-space or data limit (`RLIMIT_AS`, `RLIMIT_DATA`),
//! which count the reservation though nothing is committed, the arena is smaller
//! ([`arena_bytes`]), its span region a quarter of it as above. When the
//! arena has no room left for a request, the memory comes from glibc or
//! the kernel instead, unmanaged (said once in the log).
//!
//! **The handler must never fault on arena memory** (it would wait for
//! itself). Threads of the library (the handler, and any thread while it
//! runs library code such as start-up or fork preparation) are marked;
//! their `malloc`/`mmap` calls go to glibc, and the library's own Rust
//! allocations use glibc's `__libc_malloc` directly. Memory from glibc
//! (blocks allocated before start-up) is freed back to glibc: `free`
//! tells the two apart by address.
//!
//! **Start-up** waits until the process has asked for
//! `ZTIER_START_AFTER` bytes (default 1 MiB) or creates a thread: a
//! process that never does (a shell, a helper) makes no arena, thread or
//! userfaultfd (see [`START_AFTER`]). It never comes before the library's
//! constructor has run, and a program with a `malloc` of its own starts
//! it there ([`library_loaded`]).
//!
//! **fork**: a child gets a copy of the memory — the compressed store
//! included — but not of the handler thread, and the kernel drops the
//! userfaultfd registration in the child (stored pages would read as
//! zeros). Before `fork` (a `pthread_atfork` handler; see
//! [`__register_atfork`] for where it runs among the program's) all allocator locks
//! and the store's are taken, and only pages in the spill file (which
//! parent and child would share) are brought back; in the child, before
//! the program runs on, the library registers the arena with a
//! userfaultfd of its own, takes a spill file of its own and starts its
//! own threads (their descriptors made first: see [`spawn_handlers`]). So
//! stored pages stay stored: the child serves them from its copy of the
//! store (shared with the parent's memory until one of them changes it),
//! a fork costs no decompression or compression, and both stay within the
//! budget. (Before, every stored page came back for each fork: 200 forks
//! of a 64 MiB heap at a 16 MiB budget took 71 s against 2.7 s now.)
//! `vfork`/`posix_spawn` children share the parent's memory and handler
//! (under dispatch, what they read before and in their `exec` is brought
//! back first: see [`spawn`]). `exec` starts over (the environment
//! carries `LD_PRELOAD`).
//!
//! **Core dumps** leave out the arena's unused parts and hold every
//! stored page where cores are written (see [`coredump`]).
//!
//! **Stats**: at exit each process writes `PID.json` (`PID-N.json` if
//! another process of the command had its PID) into
//! `ZTIER_STATS_DIR`, through a descriptor opened when it started (or was
//! forked: [`STATS_FD`], so that dropping root meanwhile does not lose
//! them); while it runs, the abstract unix datagram socket
//! `@ztier-PID` answers every request with the same JSON, in one
//! datagram (`ztier stats PID`). With `ZTIER_FAULT_LOG_DIR` (`ztier run --fault-log DIR`) each
//! process also writes one row per page-in as `PID.csv` there (see
//! [`ztier_run_core::faultlog`]).
//!
//! **Notices**: what the library says that the program did not cause (a
//! request the arena cannot hold, a full store, a call refused in this
//! mode) goes to the log `ZTIER_LOG` names (`ztier run --log FILE`, or a
//! file in `ztier run`'s folder whose lines end up in `--stats`), opened
//! at start-up ([`open_log`]) and written by [`notice`]; the program's
//! stderr is its own. Without `ZTIER_LOG` (`--log -`), stderr. Messages
//! that end the program (an abort of the library's) are said on stderr.

// The library's interface is C symbols; these docs are read with
// `cargo doc --document-private-items`, so they link its private modules.
#![allow(rustdoc::private_intra_doc_links)]

mod alloconly;
mod coredump;
mod cpus;
mod direct;
mod dl;
mod fds;
mod manager;
mod near;
mod pages;
mod remote;
mod shim;
mod sigstack;
mod small;
mod spawn;
mod sud;
mod sudstate;
mod sys;
mod threads;

#[cfg(test)]
mod lock_tests;

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use cpus::{allowed_cpus, pick_cpu, pin, server_cpu, Spread};
use manager::{Config, Manager, Stats, PAGE};
use pages::PageAlloc;
use small::{Class, CLASSES, SPAN};
use ztier_run_core::names::{control, env, stats};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut libc::c_void;
    fn __libc_free(p: *mut libc::c_void);
    fn __libc_realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut libc::c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut libc::c_void;
}

/// The library's own allocations: glibc's malloc, never the arena.
struct LibcAlloc;

// SAFETY: forwards to glibc's allocator, which meets GlobalAlloc's contract
// for the alignments it is asked for (memalign above 16 bytes).
unsafe impl GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator.
        let p: *mut u8 = unsafe {
            if l.align() <= 16 {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        };
        if p.is_null() {
            library_out_of_memory(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: p came from this allocator.
        unsafe { __libc_free(p.cast()) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as in alloc.
        let p: *mut u8 = unsafe {
            if l.align() <= 16 {
                __libc_calloc(1, l.size()).cast()
            } else {
                let p: *mut u8 = __libc_memalign(l.align(), l.size()).cast();
                if !p.is_null() {
                    std::ptr::write_bytes(p, 0, l.size());
                }
                p
            }
        };
        if p.is_null() {
            library_out_of_memory(l.size());
        }
        p
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: p came from this allocator with layout l.
        let q: *mut u8 = unsafe {
            if l.align() <= 16 {
                __libc_realloc(p.cast(), new).cast()
            } else {
                let q: *mut u8 = __libc_memalign(l.align(), new).cast();
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                    __libc_free(p.cast());
                }
                q
            }
        };
        if q.is_null() {
            library_out_of_memory(new);
        }
        q
    }
}

#[global_allocator]
static ALLOC: LibcAlloc = LibcAlloc;

/// The library's own allocation of `size` bytes failed; Rust aborts the
/// process next ("memory allocation of N bytes failed"). Says why first,
/// without allocating: the usual cause is an address-space limit, under
/// which ztier needs room for its arena and its compressed store besides
/// the program's own mappings.
#[cold]
fn library_out_of_memory(size: usize) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct.
    let mut limited =
        unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0 && lim.rlim_cur != libc::RLIM_INFINITY;
    if !limited {
        // SAFETY: as above.
        limited = unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut lim) } == 0
            && lim.rlim_cur != libc::RLIM_INFINITY;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if limited {
        say_unallocated(format_args!(
            "ztier: process {pid}: the library cannot allocate {size} bytes under the address-space \
             or data limit (ulimit -v, ulimit -d) of {} MiB: ztier needs address space for its arena \
             and its compressed store besides the program's; raise the limit or lower --store\n",
            lim.rlim_cur >> 20
        ))
    } else {
        say_unallocated(format_args!(
            "ztier: process {pid}: the library cannot allocate {size} bytes: out of memory\n"
        ))
    }
}

/// Writes `args` to stderr from a buffer on the stack (cut at 512
/// bytes), by a raw system call: for code that must not allocate (the
/// allocator failed; the dispatch handler; a thread that may hold
/// glibc's allocator's lock).
pub(crate) fn say_unallocated(args: std::fmt::Arguments) {
    let mut buf = [0u8; 512];
    let mut w = std::io::Cursor::new(&mut buf[..]);
    let _ = std::io::Write::write_fmt(&mut w, args);
    let n = w.position();
    sys::raw(libc::SYS_write, [2, buf.as_ptr() as u64, n, 0, 0, 0]);
}

/// The descriptor notices are written to ([`notice`]): the log
/// `ZTIER_LOG` names, opened at start-up ([`open_log`]; a forked child
/// keeps its parent's), else 2, stderr.
static LOG_FD: AtomicI32 = AtomicI32::new(2);

/// Opens the log `ZTIER_LOG` names, for appending, once when the library
/// starts (before anything it says), its descriptor kept (see [`fds`]);
/// an `exec`'d image opens it again. Where it cannot be opened, notices
/// go to stderr, and the first says why.
fn open_log() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::IntoRawFd;
    let Some(path) = std::env::var_os(env::LOG).filter(|p| !p.is_empty()) else { return };
    match std::fs::OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path) {
        Ok(f) => LOG_FD.store(fds::keep(f.into_raw_fd()), Ordering::Relaxed),
        Err(e) => eprintln!(
            "ztier: process {}: cannot open the log {} ({e}): ztier's notices go to stderr",
            std::process::id(),
            std::path::Path::new(&path).display()
        ),
    }
}

/// Says `args` (one line, without its newline) in the log ([`LOG_FD`]),
/// from a buffer on the stack (cut at 1 KiB), by a raw system call:
/// nothing allocated, so from anywhere (the dispatch handler, a thread
/// that may hold glibc's allocator's lock, a crashing one). One `write`
/// per line, so lines of several processes appending to the log never
/// mix.
pub(crate) fn notice(args: std::fmt::Arguments) {
    let mut buf = [0u8; 1024];
    let mut w = std::io::Cursor::new(&mut buf[..1023]);
    let _ = std::io::Write::write_fmt(&mut w, args);
    let n = w.position() as usize;
    buf[n] = b'\n';
    let fd = LOG_FD.load(Ordering::Relaxed);
    sys::raw(libc::SYS_write, [fd as u64, buf.as_ptr() as u64, n as u64 + 1, 0, 0, 0]);
}

/// Address space of the arena (less under an address-space limit:
/// [`arena_bytes`]).
pub const ARENA_BYTES: usize = 64 << 30;
/// The smallest arena made under an address-space limit.
pub const ARENA_LEAST: usize = 64 << 20;

thread_local! {
    /// This thread runs library code (or is the handler): its allocations
    /// and mappings go to glibc and the kernel, never to the arena.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Is the library up in this process?
fn ready() -> bool {
    STATE.load(Ordering::Acquire) == READY
}

pub(crate) fn inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(true)
}

/// Runs `f` marked as library code (off the program's stack if that
/// lies in the arena: see [`sigstack::on_library_stack`]).
fn as_inside<R>(f: impl FnOnce() -> R) -> R {
    let was = inside();
    let _ = INSIDE.try_with(|c| c.set(true));
    let r = sigstack::on_library_stack(|sp| GLOBAL.get().is_some_and(|g| g.in_arena(sp)), sud::hook_exit, f);
    let _ = INSIDE.try_with(|c| c.set(was));
    r
}

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
const OFF: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static GLOBAL: OnceLock<Global> = OnceLock::new();

/// Everything the interposers share.
pub struct Global {
    base: usize,
    /// The arena's size ([`arena_bytes`]).
    arena_bytes: usize,
    /// The span region's, a quarter of it.
    span_bytes: usize,
    classes: Vec<std::sync::Mutex<Class>>,
    /// Which thread holds each class's lock (its `pthread_self`, 0 for
    /// none, set just after taking it and cleared just before letting it
    /// go: [`shim`]'s `ClassGuard`): a `_Fork` from a signal handler
    /// tells by it whether the thread it interrupted holds the lock
    /// (small blocks are not counted as library code, see
    /// [`sud::Allow::hot`]) or another thread does, which will let it go.
    class_owner: Vec<AtomicUsize>,
    span_next: AtomicUsize,
    granule_class: Vec<AtomicU8>,
    /// How far each region is dumped in a core ([`coredump`]).
    dump_spans: coredump::DumpFront,
    dump_pages: coredump::DumpFront,
    pages: std::sync::Mutex<PageAlloc>,
    mgr: std::sync::Mutex<Manager>,
    stats: Stats,
    cfg: Config,
}

impl Global {
    fn in_arena(&self, p: usize) -> bool {
        p.wrapping_sub(self.base) < self.arena_bytes
    }
    fn in_spans(&self, p: usize) -> bool {
        p.wrapping_sub(self.base) < self.span_bytes
    }
    fn page_of(&self, p: usize) -> usize {
        (p - self.base) / PAGE
    }
}

/// Locks a futex-based mutex (nothing made per thread when contended:
/// see `ztier_store::lock`), first spinning for it a while
/// ([`ztier_store::lock::spin_until`]). The threads that meet at the
/// manager's lock — the program's, serving a fault, and the background
/// evictor — run on different CPUs, and a waiter that sleeps costs the
/// holder a wake-up across CPUs when it lets go (`std`'s own spin, 100
/// loads, is over long before the evictor's batch bookkeeping is).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    let mut got = None;
    ztier_store::lock::spin_until(|| match m.try_lock() {
        Ok(g) => {
            got = Some(g);
            true
        }
        Err(std::sync::TryLockError::Poisoned(e)) => {
            got = Some(e.into_inner());
            true
        }
        Err(std::sync::TryLockError::WouldBlock) => false,
    });
    got.unwrap_or_else(|| m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The manager's lock held by a thread of the program, with its
/// asynchronous signals kept from the program's handlers until it is let
/// go: a handler run meanwhile could touch an evicted page, whose service
/// needs this lock (the handler thread would wait for it, or with
/// `--fault-path signal` the same thread would take it again) — a
/// deadlock that a profiler's `SIGPROF` handler reading its heap buffer
/// found. Under syscall user dispatch every handler of the program runs
/// through `sud::on_program_signal`, which puts a signal that finds the
/// lock held aside and sends it again when the lock is let go (no system
/// call on the way: this lock is taken twice for each system call with
/// memory in the arena). Otherwise the signals are blocked meanwhile
/// (two `rt_sigprocmask` calls).
pub struct Held<'a> {
    guard: Option<std::sync::MutexGuard<'a, Manager>>,
    /// The mask to put back (`None`: the signals were not blocked).
    mask: Option<u64>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Manager;
    fn deref(&self) -> &Manager {
        self.guard.as_ref().expect("held")
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Manager {
        self.guard.as_mut().expect("held")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        match self.mask {
            Some(mask) => {
                sys::sigprocmask(libc::SIG_SETMASK, mask);
            }
            None => sud::let_go(),
        }
    }
}

/// The manager's lock for a thread of the program (see [`Held`]).
fn lock_program(g: &Global) -> Held<'_> {
    sud::dtv_out_of_arena(g);
    let mask = if sud::active() {
        sud::hold();
        None
    } else {
        Some(sys::sigprocmask(libc::SIG_BLOCK, sys::ASYNC_SIGNALS))
    };
    Held { guard: Some(lock(&g.mgr)), mask }
}

/// The manager's lock, taken once no eviction in flight owns a page of
/// `[first, first + n)`. The background evictor reads and releases its
/// victims without the lock (see the manager's docs), so the program
/// must not release, remap or change the protection of such a page under
/// it: the evictor would fault on a page whose fault waits for the
/// evictor's own commit (a deadlock), or read a page it may not read.
/// The wait is short (one batch) and cannot deadlock: the evictor never
/// needs anything the caller holds, only this lock to commit.
fn lock_unowned(g: &Global, first: usize, n: usize) -> Held<'_> {
    let mut m = lock_program(g);
    while m.owned_in(first, n) {
        drop(m);
        std::thread::sleep(std::time::Duration::from_micros(50));
        m = lock_program(g);
    }
    m
}

/// Bytes the program asked for (malloc and friends, anonymous mmaps)
/// before the library started, counted until it starts.
static BEFORE_START: AtomicUsize = AtomicUsize::new(0);

/// Default of `ZTIER_START_AFTER`.
pub const START_AFTER: usize = 1 << 20;

/// The library starts once the program has asked for this many bytes
/// (`ZTIER_START_AFTER`, default [`START_AFTER`]; the request that
/// crosses it is served from the arena). Until then its memory is glibc's
/// and the kernel's, and no thread, userfaultfd or store is made: a
/// shell, a `readlink` or a `pyenv` helper that allocates a few hundred
/// KiB pays only the loading of the library (starting it cost each
/// process ~0.8 ms, and `python3` through pyenv's shim runs 41 processes).
fn start_after() -> usize {
    static AFTER: AtomicUsize = AtomicUsize::new(usize::MAX);
    match AFTER.load(Ordering::Relaxed) {
        usize::MAX => {
            let v = env_size(env::START_AFTER).unwrap_or(START_AFTER).min(usize::MAX - 1);
            AFTER.store(v, Ordering::Relaxed);
            v
        }
        v => v,
    }
}

/// The global state if the library is active. Before it has started, a
/// request for `bytes` starts it if the program's requests so far reach
/// [`start_after`] with this one (`usize::MAX`: start now).
fn global_for(bytes: usize) -> Option<&'static Global> {
    if inside() {
        return None;
    }
    let state = STATE.load(Ordering::Acquire);
    if state == READY {
        return GLOBAL.get();
    }
    if state == UNINIT
        && (BEFORE_START.fetch_add(bytes.min(1 << 40), Ordering::Relaxed).saturating_add(bytes)
            < start_after()
            || !LOADED.load(Ordering::Acquire))
    {
        return None;
    }
    let mut waited: Option<std::time::Instant> = None;
    loop {
        match STATE.load(Ordering::Acquire) {
            READY => return GLOBAL.get(),
            UNINIT => {
                if STATE.compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    let ok = as_inside(start);
                    STATE.store(if ok { READY } else { OFF }, Ordering::Release);
                    return if ok { GLOBAL.get() } else { None };
                }
            }
            // Another thread is starting the library: wait for it, or this
            // thread's memory would come from glibc for good (a program
            // whose threads allocate at once lost 3 of 4 24 MiB blocks so).
            // The starting thread waits for no other program thread, but
            // this one might hold a lock of glibc's that start-up needs
            // (a thread made by raw clone, in dlopen): after a second,
            // glibc's memory it is, as before.
            STARTING => {
                if waited.get_or_insert_with(std::time::Instant::now).elapsed().as_secs() >= 1 {
                    return None;
                }
                std::thread::yield_now();
            }
            _ => return None,
        }
    }
}

/// The library stays off for this process: the program's requests reached
/// the start threshold without `ZTIER_BUDGET` (see [`alloconly`]).
pub(crate) fn started_off() -> bool {
    STATE.load(Ordering::Acquire) == OFF
}

/// The library's constructor has run ([`library_loaded`]).
static LOADED: AtomicBool = AtomicBool::new(false);

/// The program's `malloc` is not the library's ([`program_has_own_malloc`],
/// told by the library's constructor): glibc's allocations (each
/// thread's DTV among them) go to it and are freed by it, so the library
/// never moves such a block into glibc's heap (`sud::moved_dtv`).
pub(crate) static OWN_MALLOC: AtomicBool = AtomicBool::new(false);

/// The library's constructor. Until it has run the library does not
/// start ([`global_for`]): constructors of the program's libraries run
/// before it (the dynamic linker orders a preloaded library after the
/// program's dependencies), and one that allocates may do so from
/// inside a lock of the program's own allocator. rustc has jemalloc
/// linked in, and libLLVM's constructor is its first `malloc`: jemalloc
/// maps its first memory while it holds its initialisation lock, that
/// `mmap` started the library, whose `pthread_create` allocates the new
/// thread's TLS with the program's `calloc` — jemalloc's, which waited
/// for that lock for ever (every rustc under `ztier run` hung before
/// `main`). Memory asked for before then is glibc's or the kernel's,
/// unmanaged.
///
/// Here, no lock of the program's is held. A program whose `malloc` is
/// not the library's (its executable has one of its own) starts the
/// library now, whatever it has allocated: later, its allocator's
/// `mmap` calls are made with its locks held, and the start-up's
/// thread creations would call back into it. Others start here if
/// what they asked for before already reaches the threshold.
extern "C" fn library_loaded() {
    // Function pointers dispatch needs, which their own constructors
    // may not have looked up yet (the order of one library's
    // constructors is the linker's).
    direct::look_up_all();
    dl::look_up();
    // Where glibc's code lies: what it allocates for itself stays glibc's.
    shim::note_libc();
    sud::find_jumps();
    // glibc's exec and spawn functions, and what a program started from
    // this one inherits (the environment is still the initial one).
    spawn::note_start();
    look_up_glibc_threads();
    let own_malloc = program_has_own_malloc();
    OWN_MALLOC.store(own_malloc, Ordering::Release);
    alloconly::note_start();
    LOADED.store(true, Ordering::Release);
    if STATE.load(Ordering::Acquire) == UNINIT
        && (own_malloc || BEFORE_START.load(Ordering::Relaxed) >= start_after())
    {
        let _ = global_for(usize::MAX);
        // Dispatch, if that start turned it on for this thread, is left
        // open until library code ends (as a shim's guard does at its end):
        // the program's calls from here on are caught.
        sud::rearm();
    }
}

#[used]
#[link_section = ".init_array"]
static LIBRARY_LOADED: extern "C" fn() = library_loaded;

/// Does `malloc` resolve to another object's than this library (an
/// allocator linked into the executable, which the dynamic linker finds
/// before any preloaded library)? Told by the object that holds it: the
/// address of the library's own exported `malloc`, taken here, is
/// itself resolved through that lookup.
///
/// An executable built without position independence (Debian's
/// `python3.11`, the official `node`) that takes `malloc`'s address
/// has a *canonical PLT entry* for it: its dynamic symbol is undefined
/// (`SHN_UNDEF`) but has a value, the address of its PLT stub, so that
/// `&malloc` is one address everywhere. The lookup returns that stub,
/// in the executable, though its calls go to the library's `malloc`.
/// Such a symbol defines nothing and is not counted (both programs were
/// taken for ones with an allocator of their own, and put on the signal
/// path whatever was asked).
pub(crate) fn program_has_own_malloc() -> bool {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches
    // the global scope, as a call from the program resolves.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    if found.is_null() {
        return false;
    }
    /// `dladdr1`'s request for the symbol table entry (`<dlfcn.h>`).
    const RTLD_DL_SYMENT: libc::c_int = 1;
    /// An undefined symbol's section index (`<elf.h>`).
    const SHN_UNDEF: u16 = 0;
    // (the object's base, whether the symbol matched is a definition)
    let object = |addr: *const libc::c_void| {
        // SAFETY: a zeroed Dl_info is valid (null pointers), and dladdr1
        // only writes it and the pointer.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let mut sym: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: as above; any address may be asked about, and with
        // RTLD_DL_SYMENT the extra argument receives a pointer to the
        // matched symbol's ElfW(Sym) (or null), which lives as long as
        // the object is loaded.
        let known = unsafe { libc::dladdr1(addr, &mut info, &mut sym, RTLD_DL_SYMENT) } != 0;
        let sym = sym as *const libc::Elf64_Sym;
        // SAFETY: non-null, it points into the object's symbol table.
        let defines = sym.is_null() || unsafe { (*sym).st_shndx } != SHN_UNDEF;
        known.then_some((info.dli_fbase as usize, defines))
    };
    let ours = object(library_loaded as *const () as *const libc::c_void).map(|(base, _)| base);
    match (ours, object(found)) {
        (Some(ours), Some((base, defines))) => base != ours && defines,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

fn env_size(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok()
}

/// The `ZTIER_*` settings read after start-up ([`knob`]).
const KNOBS: [&str; 9] = [
    env::CPUS,
    env::PIN,
    env::SERVER_CPU,
    env::SPIN_US,
    env::WATCHDOG_S,
    env::TEST_HANG_AFTER,
    env::TEST_EVICTOR_HANG_AFTER,
    env::UFFD_USER_MODE_ONLY,
    env::TEST_NO_UFFD_DEVICE,
];
static KNOB_VALUES: OnceLock<Vec<Option<String>>> = OnceLock::new();

/// A setting of [`KNOBS`], as the environment had it at start-up (read
/// there, all at once). Never read later: the program's `environ` may
/// by then lie in the arena, and a library thread must not read arena
/// memory (a cold page would leave the handler waiting on itself: a
/// forked node child hung so, its threads in `getenv`), nor may a forked
/// child before it has registered the arena (a cold page would read as
/// zeros, and stay so).
pub(crate) fn knob(name: &str) -> Option<String> {
    let v = KNOB_VALUES.get_or_init(|| KNOBS.iter().map(|k| std::env::var(k).ok()).collect());
    let i = KNOBS.iter().position(|k| *k == name).expect("a name in KNOBS");
    v[i].clone()
}

/// [`knob`] as a number.
fn knob_size(name: &str) -> Option<usize> {
    knob(name)?.parse().ok()
}

/// Start-up: reads the environment, maps and registers the arena, opens
/// the store, starts the handler. `false` (library stays off) without
/// `ZTIER_BUDGET`; any other failure is fatal: the program was asked to
/// run under a budget, and silently running without one would lie.
fn start() -> bool {
    manager::set_host();
    let Some(budget) = env_size(env::BUDGET) else { return false };
    open_log();
    // Every setting read later, read now (see `knob`).
    let _ = knob(env::PIN);
    let codec =
        std::env::var(env::CODEC).ok().and_then(|c| c.parse().ok()).unwrap_or(ztier_codec::CodecId::Lz4);
    let total = physical_memory();
    let cfg = Config {
        budget_pages: budget / PAGE,
        codec,
        allocator: std::env::var(env::ALLOCATOR)
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or(ztier_store::alloc::AllocatorKind::Classes),
        store_bytes: env_size(env::STORE).unwrap_or(total / 2),
        spill_dir: std::env::var_os(env::SPILL_DIR).map(Into::into),
        spill_bytes: env_size(env::SPILL_MAX).unwrap_or(usize::MAX) as u64,
        stats_dir: std::env::var_os(env::STATS_DIR).map(Into::into),
        policy: std::env::var(env::POLICY).ok().filter(|p| !p.is_empty()),
    };
    match try_start(cfg) {
        Ok(g) => {
            let _ = GLOBAL.set(g);
            // SAFETY: registering plain extern "C" callbacks.
            unsafe {
                register_fork_handlers();
                register_late_child();
                libc::atexit(at_exit);
            }
            OWN_PID.store(std::process::id() as i32, Ordering::Relaxed);
            open_stats();
            spawn_handlers();
            let (user_mode_only, sigbus) = {
                let m = lock(&GLOBAL.get().expect("set").mgr);
                (m.uffd.user_mode_only, m.uffd.sigbus)
            };
            USER_MODE_ONLY.store(user_mode_only, Ordering::Relaxed);
            if user_mode_only || sigbus {
                if let Err(e) = sud::install(sigbus) {
                    let why = if sigbus {
                        "faults are served in the faulting thread (--fault-path signal)"
                    } else {
                        "userfaultfd is user-mode-only here (unprivileged; vm.unprivileged_userfaultfd=0)"
                    };
                    eprintln!(
                        "ztier: cannot manage this program's memory: {why}, so system calls that read or \
                         write evicted memory would fail with EFAULT, and catching them needs syscall user \
                         dispatch (Linux 5.11): {e}"
                    );
                    std::process::abort();
                }
            }
            // Every page in a core dump, where cores are written.
            coredump::install();
            // The thread that starts the library (the main thread, since
            // it starts before a second one) gets the exit hook that new
            // threads get in `pthread_create`: one that leaves by
            // `pthread_exit` may hold robust mutexes too.
            sud::hook_exit();
            true
        }
        Err(e) => {
            eprintln!("ztier: cannot manage this program's memory: {e}");
            std::process::abort();
        }
    }
}

fn physical_memory() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages.max(1) as usize) * (size.max(1) as usize)
}

/// The arena's size: [`ARENA_BYTES`], or under an address-space or data
/// limit (`RLIMIT_AS`, `ulimit -v`; `RLIMIT_DATA`, `ulimit -d`, which
/// counts private writable mappings) half of what the tighter one leaves
/// the process now, a multiple of four spans: the reservation counts
/// against both though it is `MAP_NORESERVE` (before, a 64 GiB
/// reservation under `ulimit -v 4000000` or `ulimit -d 4000000` failed,
/// and the program was aborted at start-up). The other half is left to
/// the program's own mappings outside the arena, the manager's per-page
/// tables (21 bytes a page, 0.5%), the library's threads and the store.
/// An error if that is under [`ARENA_LEAST`].
fn arena_bytes() -> std::io::Result<usize> {
    let limit = |res| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit fills the struct.
        (unsafe { libc::getrlimit(res, &mut lim) } == 0 && lim.rlim_cur != libc::RLIM_INFINITY)
            .then_some(lim.rlim_cur)
    };
    let (space, data) = (limit(libc::RLIMIT_AS), limit(libc::RLIMIT_DATA));
    if space.is_none() && data.is_none() {
        return Ok(ARENA_BYTES);
    }
    // What each counts now (VmSize, VmData: kB in /proc/self/status).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            << 10
    };
    let mut tightest = (u64::MAX, 0, "");
    for (lim, used, what) in [
        (space, kb("VmSize:"), "address-space limit (RLIMIT_AS, ulimit -v)"),
        (data, kb("VmData:"), "data limit (RLIMIT_DATA, ulimit -d)"),
    ] {
        if let Some(l) = lim {
            let room = l.saturating_sub(used);
            if room < tightest.0 {
                tightest = (room, l, what);
            }
        }
    }
    let (room, lim, what) = tightest;
    // glibc's allocator serves only the library here (and what the arena
    // cannot take), but it reserves 64 MiB of address space for each
    // thread that allocates: under the limit, the library's threads took
    // enough to make its own allocations fail (`pyapp.py 300000` under
    // `ulimit -v 400000` at `--budget 32M` aborted with any `--store`
    // above 16M; with one arena it ran with 96M).
    // SAFETY: mallopt has no memory-safety preconditions.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let arena = ((room / 2).min(ARENA_BYTES as u64) as usize) / (4 * SPAN) * (4 * SPAN);
    if arena < ARENA_LEAST {
        return Err(std::io::Error::other(format!(
            "the {what} of {} MiB leaves this process {} MiB, too little for ztier's arena (at least {} \
             MiB, half of what is left)",
            lim >> 20,
            room >> 20,
            ARENA_LEAST >> 20
        )));
    }
    Ok(arena)
}

fn try_start(cfg: Config) -> std::io::Result<Global> {
    let arena = arena_bytes()?;
    // Reserve a span more to align the arena to a span.
    let p = sys::mmap(
        std::ptr::null_mut(),
        arena + SPAN,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::other(format!(
            "reserving {} MiB of address space: {}",
            arena >> 20,
            std::io::Error::last_os_error()
        )));
    }
    let raw = p as usize;
    let base = raw.next_multiple_of(SPAN);
    if base > raw {
        sys::munmap(raw as *mut _, base - raw);
    }
    let tail = raw + arena + SPAN - (base + arena);
    if tail > 0 {
        sys::munmap((base + arena) as *mut _, tail);
    }
    let pages = arena / PAGE;
    let spans = arena / 4;
    // Out of core dumps but for what is used (`coredump`).
    coredump::exclude(base, arena);
    let locked = shim::locked_at_start(base, arena);
    let mut mgr = Manager::new(base, pages, cfg.clone())?;
    if locked {
        mgr.lock_all(true, &[], &Stats::new())?;
    }
    Ok(Global {
        base,
        arena_bytes: arena,
        span_bytes: spans,
        classes: (0..CLASSES).map(|_| std::sync::Mutex::new(Class::default())).collect(),
        class_owner: (0..CLASSES).map(|_| AtomicUsize::new(0)).collect(),
        span_next: AtomicUsize::new(base),
        dump_spans: coredump::DumpFront::new(base, base + spans),
        dump_pages: coredump::DumpFront::new(base + spans, base + arena),
        granule_class: (0..spans / SPAN).map(|_| AtomicU8::new(u8::MAX)).collect(),
        pages: std::sync::Mutex::new(PageAlloc::new(spans / PAGE, (arena - spans) / PAGE)),
        mgr: std::sync::Mutex::new(mgr),
        stats: Stats::new(),
        cfg,
    })
}

/// Is this process's userfaultfd user-mode-only (set when it starts or
/// is forked)? For [`filtered`], which may run with the manager's lock
/// held.
static USER_MODE_ONLY: AtomicBool = AtomicBool::new(false);

/// Why pages could not be brought back in a thread of the program (a
/// fault served in it with `--fault-path signal`, or a system call's
/// memory under a user-mode-only userfaultfd), where the reason is the
/// program's: a seccomp filter on the thread (a sandbox's allow-list)
/// that forbids the library's calls (`ioctl` for `UFFDIO_COPY`). Empty
/// otherwise. The library's own threads started before any filter and
/// are not under it.
pub(crate) fn filtered(e: &std::io::Error) -> &'static str {
    let denied = e.kind() == std::io::ErrorKind::PermissionDenied;
    let status = if denied {
        std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default()
    } else {
        String::new()
    };
    if !status.lines().any(|l| l.starts_with("Seccomp:") && l.split_whitespace().nth(1) != Some("0")) {
        ""
    } else if sud::sigbus_on() && !USER_MODE_ONLY.load(Ordering::Relaxed) {
        // (Under a user-mode-only userfaultfd the faulting thread brings
        // back its system calls' memory on either path.)
        " in this thread, which runs under a seccomp filter of the program that forbids the library's calls \
         (with --fault-path thread faults are served by the library's own thread, which is not under it)"
    } else {
        " in this thread, which runs under a seccomp filter of the program that forbids the library's calls \
         (as root, or with vm.unprivileged_userfaultfd=1, the library's own thread serves them)"
    }
}

/// Starts the fault handler. A fault costs ~10 µs when the handler runs
/// on the faulting thread's CPU and several times that across CPUs (two
/// cross-CPU wake-ups per fault, and the TLB shootdowns of eviction).
/// So by default (`ZTIER_PIN` unset or `main`) the handler and the thread
/// that started the library (the main thread) share one CPU, picked by
/// pid among the allowed ones (or, in the run's first process, where a
/// remote server bound to one CPU answers: [`cpus::server_cpu`]); threads the program creates later get the
/// whole allowed set back (see `pthread_create`). With `ZTIER_PIN=off`
/// nothing is pinned.
fn spawn_handlers() {
    // The threads' descriptors are made here, before the program runs
    // on: one a thread made at its start was, until it moved it up
    // (`fds::keep`), a low number the program could close meanwhile — a
    // shell's subshell, forked, did, and its handler failed with EBADF.
    make_ctl_socket();
    // SAFETY: creating an eventfd; its descriptor is ours.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        eprintln!(
            "ztier: the evictor's eventfd cannot be made ({}); pages cannot be evicted: aborting",
            std::io::Error::last_os_error()
        );
        std::process::abort();
    }
    EVICTOR_FD.store(fds::keep(fd), Ordering::Relaxed);
    let cpus = allowed_cpus();
    let pin_main = knob(env::PIN).is_none_or(|v| v != "off") && cpus.len() > 1;
    if pin_main {
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        let cpu = pick_cpu(&cpus, server_cpu(knob(env::SERVER_CPU).as_deref(), parent), std::process::id());
        HANDLER_CPU.store(cpu as i64, Ordering::Relaxed);
        pin(&[cpu]);
        // The evictor compresses on the other CPUs: on the handler's it
        // would take turns with the program and the handler, the
        // critical path of every fault.
        let others: Vec<usize> = cpus.iter().copied().filter(|&c| c != cpu).collect();
        let _ = ALLOWED.set(cpus);
        spawn_handler(Some(vec![cpu]), Role::Handler { ctl: true });
        spawn_handler(Some(others), Role::Evictor);
    } else {
        spawn_handler(None, Role::Handler { ctl: true });
        spawn_handler(None, Role::Evictor);
    }
    spawn_handler(None, Role::Watchdog);
}

/// The CPU the handler and the main thread were pinned to (-1: none).
static HANDLER_CPU: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);

/// The background evictor sleeps on this eventfd.
static EVICTOR_FD: AtomicI32 = AtomicI32::new(-1);
/// The evictor is between taking a batch of victims and waking them:
/// faults on those pages wait for it (watched by the watchdog).
static EVICTOR_BUSY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Batches the evictor has finished.
static EVICTOR_BATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The evictor is asleep (a wake-up costs a write).
static EVICTOR_IDLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn wake_evictor() {
    if EVICTOR_IDLE.swap(false, Ordering::AcqRel) {
        let word = manager::TREE_WAKE.load(Ordering::Acquire);
        if !word.is_null() {
            // SAFETY: a word of the shared segment, mapped for good.
            ztier_uffd::tree::wake(unsafe { &*word });
            return;
        }
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(EVICTOR_FD.load(Ordering::Relaxed), one.as_ptr().cast(), 8) };
    }
}

/// The background evictor: keeps the resident count a reserve below the
/// budget by compressing the oldest pages on whatever CPU is free, so the
/// fault handler (next to the program) mostly just installs pages.
fn evictor_loop(g: &Global) -> std::io::Result<()> {
    // Made by `spawn_handlers`.
    let fd = EVICTOR_FD.load(Ordering::Relaxed);
    // For the tests of the watchdog only: stop after taking this many
    // batches, holding the last one (sealed, not released, so writes to
    // its pages wait for its commit), as a stuck evictor would. (Once its
    // release has returned, faults on its pages no longer wait for the
    // commit: `Manager::commit_early`.)
    let hang_after = knob_size(env::TEST_EVICTOR_HANG_AFTER);
    loop {
        // In a forked child with the tree scope, every so often: which
        // pages inherited from the parent are no longer shared, planned
        // with the batch (one lock), looked up in the page map without
        // the lock (the faults would wait for it), then applied.
        let (look, batch) = {
            let mut m = lock(&g.mgr);
            (m.adopt_look(), m.take_background_victims(manager::BACKGROUND_BATCH)?)
        };
        if let Some(look) = look {
            let gone = look.read();
            lock(&g.mgr).adopt_unshared(&gone, &g.stats)?;
        }
        let Some(v) = batch else {
            // With the tree scope the evictor sleeps on its word in the
            // shared segment, where other processes can wake it too.
            let word = manager::TREE_WAKE.load(Ordering::Acquire);
            // SAFETY: a word of the shared segment, mapped for good.
            let word = (!word.is_null()).then(|| unsafe { &*word });
            let seen = word.map(|w| w.load(Ordering::Acquire));
            EVICTOR_IDLE.store(true, Ordering::Release);
            // Re-check after announcing sleep (a wake-up may have been missed).
            if lock(&g.mgr).evict_wanted() {
                EVICTOR_IDLE.store(false, Ordering::Release);
                continue;
            }
            if let (Some(w), Some(seen)) = (word, seen) {
                ztier_uffd::tree::sleep(w, seen, std::time::Duration::from_millis(100));
                EVICTOR_IDLE.store(false, Ordering::Release);
                continue;
            }
            let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, 100) };
            let mut buf = [0u8; 8];
            // SAFETY: draining the eventfd into 8 bytes.
            unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 8) };
            EVICTOR_IDLE.store(false, Ordering::Release);
            continue;
        };
        EVICTOR_BUSY.store(true, Ordering::Release);
        // Without the lock: the victims are OWNED (see manager's docs).
        // The write protections on the program's CPU (see `near`). The
        // thread that made them says so at once, before it goes back to
        // the program: from then on a write to a victim takes it back
        // instead of waiting for the commit, and the program's first
        // writes come right after the job (the evictor, woken across
        // CPUs, would say so tens of microseconds later).
        let job = || {
            v.protect(&g.stats)?;
            lock(&g.mgr).background_protected();
            Ok(())
        };
        let counter = match near::run_near(&job)? {
            true => &g.stats.wp_batches_near,
            false => &g.stats.wp_batches_far,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let outcome = v.compress_protected(&g.stats)?;
        // Victims written meanwhile were taken back: not released.
        let mut release = outcome.clone();
        let look = {
            let mut m = lock(&g.mgr);
            for i in m.seal_background(&v.pages, &outcome) {
                if let Ok(k) = v.pages.binary_search(&i) {
                    release[k] = manager::Outcome::Kept;
                }
            }
            m.victims_look(&v.pages)
        };
        // In a forked child: victims that are its own already, though
        // still counted as shared with its parent, are adopted as they
        // leave (read while they are in memory, without the lock).
        if let Some(look) = look {
            let own = look.read();
            lock(&g.mgr).victims_own(own);
        }
        if hang_after.is_some_and(|n| EVICTOR_BATCHES.load(Ordering::Relaxed) + 1 >= n as u64) {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        v.release(&release)?;
        // Only now, with every CPU's TLB flushed, may a fault on a
        // released victim be served before the commit.
        lock(&g.mgr).background_released();
        // Pages the store refused are unprotected while still OWNED (see
        // `unprotect_kept`); a refusal pauses evictions (`refusing`).
        v.unprotect_kept(&outcome)?;
        lock(&g.mgr).commit_background(&v, &outcome, &g.stats);
        v.wake_released(&outcome)?;
        batch_committed();
        EVICTOR_BATCHES.fetch_add(1, Ordering::Release);
        EVICTOR_BUSY.store(false, Ordering::Release);
    }
}

/// The CPUs new threads get back when the main thread is pinned.
static ALLOWED: OnceLock<Vec<usize>> = OnceLock::new();

/// What a library thread does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Serves faults (and the control socket if `ctl`).
    Handler { ctl: bool },
    /// Compresses the oldest pages in the background.
    Evictor,
    /// Aborts the process if the handler stops making progress.
    Watchdog,
}

struct HandlerArg {
    /// CPUs to run on; `None`: the whole allowed set.
    cpus: Option<Vec<usize>>,
    role: Role,
    /// Set by the new thread once it has made its per-thread data.
    ready: std::sync::Arc<AtomicBool>,
}

/// Blocks the evictor takes from its own glibc arena when it starts
/// ([`prime_heap_check`]).
static PRIME: [std::sync::atomic::AtomicPtr<u8>; 3] =
    [const { std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()) }; 3];
/// Each below glibc's mmap threshold (128 KiB), so that they come from
/// the arena's heap; together over its trim threshold (128 KiB).
const PRIME_BYTES: usize = 120 << 10;

/// Frees, on the thread that started the evictor, the blocks it took from
/// its own glibc arena ([`PRIME`]). glibc gives the top of a thread
/// arena back then, and the first time it does so in a process it opens
/// `/proc/sys/vm/overcommit_memory` (`check_may_shrink_heap`), which takes
/// the lowest free descriptor for a moment. Here that is the program's
/// thread, at start-up or in a forked child's handler, before the program
/// runs on. Otherwise it happened the first time the evictor, or a
/// program thread serving a fault, freed the store's memory enough to
/// shrink an arena: from the evictor, beside the program, whose `open`
/// then got another number than the one it was owed (CI once saw 8 of
/// `lowfd`'s opens get another; `strace -ff` showed the evictor's open in
/// 4 of 6 runs). Keeping glibc to its main arena (`M_ARENA_MAX` 1, which
/// shrinks by `sbrk` and opens nothing) also avoided it, but would put
/// the program's thread and the evictor behind one arena lock (measured
/// on the corpus builder at 256M: within this host's noise either way,
/// see docs/run.md, "Descriptors made while the program runs"); this leaves the arenas as they were.
fn prime_heap_check() {
    for b in &PRIME {
        let p = b.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: null, or a block from `__libc_malloc` not yet freed
        // (swapped out, so freed once).
        unsafe { __libc_free(p.cast()) };
    }
}

/// glibc's count of the process's live threads (`__nptl_nthreads`,
/// exported to `libthread_db` as `GLIBC_PRIVATE`), or null where this
/// glibc has none ([`look_up_glibc_threads`]).
static GLIBC_THREADS: std::sync::atomic::AtomicPtr<u32> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Finds [`GLIBC_THREADS`], once, when the library is loaded (the
/// dynamic linker's lookup is not for a fork handler).
fn look_up_glibc_threads() {
    // SAFETY: dlvsym with NUL-terminated name and version; the symbol,
    // when found, is glibc's `unsigned int`, which lives as long as the
    // process.
    let p =
        unsafe { libc::dlvsym(libc::RTLD_DEFAULT, c"__nptl_nthreads".as_ptr(), c"GLIBC_PRIVATE".as_ptr()) };
    GLIBC_THREADS.store(p.cast(), Ordering::Release);
}

/// Takes a thread just made by glibc's `pthread_create` for the library
/// out of glibc's count of live threads. glibc ends the process, by
/// `exit(0)`, when the last thread it counts ends (`start_thread`, or
/// `pthread_exit` in the main thread): the library's threads, which
/// never end, kept a program whose last thread leaves by `pthread_exit`
/// alive for ever. CPython's forked child of a thread other than the
/// main one ends so (the thread's function returns, the thread exits,
/// and it is the child's only thread): the child stayed a zombie leader
/// with the library's three threads, and its parent waited for it for
/// ever (CPython's `test_threading`). The library's threads are not the
/// program's: with them uncounted the process ends where it would
/// natively. (glibc sets the count to 1 in a forked child, whose library
/// threads are then made anew and taken out again.)
///
/// The count is glibc's from its increment in `pthread_create` to here:
/// if the program's last thread left meanwhile (only the watchdog makes
/// library threads while the program runs), it found the count above one
/// and did not end the process; this ends it as that thread would have.
fn uncount_library_thread() {
    let p = GLIBC_THREADS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: glibc's counter, an aligned `unsigned int` it changes
        // only with atomic operations; the thread counted lives.
        let count = unsafe { AtomicU32::from_ptr(p) };
        if count.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: exit as glibc's last thread calls it.
            unsafe { libc::exit(0) };
        }
    }
}

fn spawn_handler(cpus: Option<Vec<usize>>, role: Role) {
    // A raw pthread, not std::thread: std initialises thread-locals (with
    // destructors registered through calloc) before running the closure,
    // and the mark that keeps this thread's allocations out of the arena
    // must be set before anything allocates.
    extern "C" fn entry(arg: *mut libc::c_void) -> *mut libc::c_void {
        let _ = INSIDE.try_with(|c| c.set(true));
        // SAFETY: arg is the Box<HandlerArg> leaked by spawn_handler.
        let arg = unsafe { Box::from_raw(arg.cast::<HandlerArg>()) };
        // This thread's thread-local table kept resident
        // (`keep_thread_vector`).
        sud::keep_thread_vector();
        if arg.role == Role::Watchdog {
            // With the tree scope the watchdog, which lives as long as the
            // process, says in the shared segment that the process lives:
            // when it ends, the kernel marks the word, and the others take
            // back the pages this process held without a look at /proc.
            // Before the spawner goes on, so that no page is held while
            // the word is unset (at start-up, and in a forked child).
            let life = manager::TREE_LIFE.load(Ordering::Acquire);
            if !life.is_null() {
                // SAFETY: a word of the shared segment, mapped for good.
                ztier_uffd::tree::hold_life(unsafe { &*life });
            }
        }
        if arg.role == Role::Evictor {
            for b in &PRIME {
                // SAFETY: a plain allocation from glibc, freed by the
                // spawner (`prime_heap_check`).
                b.store(unsafe { __libc_malloc(PRIME_BYTES) }.cast(), Ordering::Release);
            }
        }
        arg.ready.store(true, Ordering::Release);
        match &arg.cpus {
            Some(cpus) => pin(cpus),
            // Not pinned: the whole allowed set, not the pin it inherited.
            None => {
                if let Some(cpus) = ALLOWED.get() {
                    pin(cpus);
                }
            }
        }
        let g = GLOBAL.get().expect("started");
        let r = match arg.role {
            Role::Handler { ctl } => handler_loop(g, ctl),
            Role::Evictor => evictor_loop(g),
            Role::Watchdog => watchdog_loop(),
        };
        if let Err(e) = r {
            // Threads waiting on a fault would sleep forever: stop loudly.
            let who = match arg.role {
                Role::Handler { .. } => "fault handler",
                Role::Evictor => "evictor",
                Role::Watchdog => "watchdog",
            };
            eprintln!("ztier: the {who} failed ({e}); pages cannot be served: aborting");
            std::process::abort();
        }
        std::ptr::null_mut()
    }
    if let Role::Handler { .. } = role {
        HANDLER_THREADS.fetch_add(1, Ordering::Relaxed);
    }
    let ready = std::sync::Arc::new(AtomicBool::new(false));
    let arg = Box::into_raw(Box::new(HandlerArg { cpus, role, ready: ready.clone() }));
    let mut t: libc::pthread_t = 0;
    // SAFETY: an all-zero pthread_attr_t is storage for pthread_attr_init.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: initialising the attribute object we own, then giving it a
    // stack of ours (mapped, THREAD_STACK bytes, used by no other thread).
    let r = unsafe {
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstack(&mut attr, library_stack(), THREAD_STACK)
    };
    if r != 0 {
        eprintln!("ztier: cannot give the fault handler a stack: {}", std::io::Error::from_raw_os_error(r));
        std::process::abort();
    }
    // The thread starts with (and keeps) every asynchronous signal
    // blocked: a signal sent to the process must reach a thread of the
    // program (a program that blocks SIGTERM and takes it with sigwait
    // would be killed if one of ours took it), and the program's
    // handlers must never run here. glibc's own signals stay open (see
    // `sys::LIBRARY_THREAD_SIGNALS`).
    let mask = sys::sigprocmask(libc::SIG_SETMASK, sys::LIBRARY_THREAD_SIGNALS);
    // SAFETY: creating a thread running `entry`, which owns `arg`.
    let r = unsafe { libc::pthread_create(&mut t, &attr, entry, arg.cast()) };
    sys::sigprocmask(libc::SIG_SETMASK, mask);
    // SAFETY: the attribute object was initialised above.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if r != 0 {
        eprintln!("ztier: cannot start the fault handler: {}", std::io::Error::from_raw_os_error(r));
        std::process::abort();
    }
    uncount_library_thread();
    // The new thread makes its per-thread data (glibc allocates for it
    // with the program's `calloc`) before the program runs on: a program
    // with an allocator of its own may take that allocator's lock and
    // fault with it held, and a handler that then needed the lock would
    // never serve the fault. Bounded: a spawn from a library thread while
    // the program holds that lock waits no longer than this.
    let t0 = std::time::Instant::now();
    while !ready.load(Ordering::Acquire) && t0.elapsed() < std::time::Duration::from_secs(1) {
        std::thread::yield_now();
    }
    if role == Role::Evictor {
        prime_heap_check();
    }
    // SAFETY: t is the thread just created; naming it is cosmetic.
    unsafe {
        libc::pthread_setname_np(
            t,
            match role {
                Role::Handler { .. } => c"ztier-handler",
                Role::Evictor => c"ztier-evictor",
                Role::Watchdog => c"ztier-watchdog",
            }
            .as_ptr(),
        )
    };
}

/// Bytes of a library thread's stack (a guard page lies below it).
const THREAD_STACK: usize = 8 << 20;
/// Most library stacks remembered for reuse in a forked child.
const STACKS_KEPT: usize = 64;
/// The library's thread stacks, in the order they were made (the first
/// `STACKS_KEPT`).
static STACKS: [AtomicUsize; STACKS_KEPT] = [const { AtomicUsize::new(0) }; STACKS_KEPT];
/// Stacks made (and recorded in `STACKS`, up to its size).
static STACKS_MADE: AtomicUsize = AtomicUsize::new(0);
/// Of `STACKS`, how many a new thread may take again: the parent's, in a
/// forked child, whose copies of them no thread uses.
static STACKS_FREE: AtomicUsize = AtomicUsize::new(0);
/// Stacks taken since the process (or the forked child) started.
static STACKS_TAKEN: AtomicUsize = AtomicUsize::new(0);

/// A stack for a library thread: one of the parent's in a forked child,
/// or a new mapping (by system call: never in the arena), `THREAD_STACK`
/// bytes above a guard page. Returns its lowest address.
///
/// Library threads never take a stack from glibc's cache of the stacks
/// of threads that ended. Taking one, glibc reads and frees the dynamic
/// thread vector (DTV) of the thread that had it: memory of the
/// program's. If that memory is arena memory and evicted, the thread
/// creating the new one faults: in a forked child, whose handler is what
/// is being started, nothing would serve that fault (redis's `BGSAVE`
/// child hung there for good), nor in a handler starting handlers on the
/// other CPUs. DTVs are kept out of the arena now (`shim::from_ldso`),
/// but not where the dynamic linker cannot be located; so starting a
/// library thread touches nothing of the program's at all. In a forked
/// child every thread of the parent is gone, so the parent's library
/// stacks are free again.
fn library_stack() -> *mut libc::c_void {
    let taken = STACKS_TAKEN.fetch_add(1, Ordering::AcqRel);
    if taken < STACKS_FREE.load(Ordering::Acquire) {
        // (Zero if the parent forked while another of its threads was
        // between making a stack and recording it: then a new one.)
        let s = STACKS[taken].load(Ordering::Acquire);
        if s != 0 {
            return s as *mut libc::c_void;
        }
    }
    let Some(stack) = map_stack(THREAD_STACK) else {
        eprintln!("ztier: cannot map a stack for the fault handler: {}", std::io::Error::last_os_error());
        std::process::abort();
    };
    let n = STACKS_MADE.fetch_add(1, Ordering::AcqRel);
    if n < STACKS_KEPT {
        STACKS[n].store(stack, Ordering::Release);
    }
    stack as *mut libc::c_void
}

/// Maps `len` bytes of stack for library code, out of the arena, above a
/// guard page (an overflow faults instead of writing below): its lowest
/// address, or `None` (errno set) if it could not be mapped.
fn map_stack(len: usize) -> Option<usize> {
    let p = sys::mmap(
        std::ptr::null_mut(),
        len + PAGE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        return None;
    }
    sys::mprotect(p, PAGE, libc::PROT_NONE);
    Some(p as usize + PAGE)
}

/// In a forked child (one thread): every library stack of the parent is
/// free to take again.
fn stacks_after_fork() {
    STACKS_FREE.store(STACKS_MADE.load(Ordering::Acquire).min(STACKS_KEPT), Ordering::Release);
    STACKS_TAKEN.store(0, Ordering::Release);
}

/// The userfaultfd the handler reads (for the watchdog's look).
static UFFD_FD: AtomicI32 = AtomicI32::new(-1);

/// The control socket's descriptor (-1: none yet).
static CTL_FD: AtomicI32 = AtomicI32::new(-1);

/// Handler threads that have read a fault they have not served yet (for
/// the watchdog).
static HANDLERS_BUSY: AtomicU32 = AtomicU32::new(0);

/// Handler threads this process has started (its `handlers` statistic).
static HANDLER_THREADS: AtomicU32 = AtomicU32::new(0);

/// Handlers on the other CPUs have been started ([`more_handlers`]).
static MORE_HANDLERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Has a handler started on each allowed CPU but `mine` (see
/// [`Spread`]), by the watchdog ([`MORE_HANDLERS_FOR`]).
///
/// Not by the handler itself: glibc's `pthread_create` allocates the new
/// thread's DTV with the program's `calloc`, and where that is an
/// allocator linked into the program (`run_progs/ownmalloc.c`, rustc's
/// jemalloc) it writes arena memory and may take that allocator's lock.
/// The handler faulted there on a page only it could serve, and every
/// thread of the program waited on it (`--fault-path thread`, seven
/// threads faulting on other CPUs; the watchdog saw no fault waiting,
/// since the handler had read them all). The watchdog's faults are
/// served as any library thread's.
fn more_handlers(mine: usize) {
    if MORE_HANDLERS.swap(true, Ordering::AcqRel) {
        return;
    }
    MORE_HANDLERS_FOR.store(mine as u32 + 1, Ordering::Release);
    sys::futex_wake(&MORE_HANDLERS_FOR, 1);
}

/// The CPU whose handler asked for more handlers, plus one (0: none
/// asked): the watchdog waits on it ([`watchdog_loop`]).
static MORE_HANDLERS_FOR: AtomicU32 = AtomicU32::new(0);

/// In the watchdog: starts the handlers [`more_handlers`] asked for.
fn start_more_handlers(mine: usize) {
    for &c in ALLOWED.get().map_or(&[][..], |v| &v[..]) {
        if c != mine {
            spawn_handler(Some(vec![c]), Role::Handler { ctl: false });
        }
    }
}
/// Threads inside the in-thread fault service (`--fault-path signal`),
/// for the watchdog.
static SIGNAL_BUSY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Batches the background evictor has committed and unprotected: a futex
/// word that threads of the in-thread service wait on while a page they
/// faulted on is owned by the batch in flight.
static COMMITS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Threads waiting on [`COMMITS`] (the evictor wakes them only if any).
static COMMIT_WAITERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The evictor committed a batch: wakes the threads waiting for one.
fn batch_committed() {
    COMMITS.fetch_add(1, Ordering::AcqRel);
    if COMMIT_WAITERS.load(Ordering::Acquire) > 0 {
        sys::futex_wake(&COMMITS, i32::MAX as u32);
    }
}

/// Waits until [`COMMITS`] is no longer `seen` (a batch was committed),
/// for at most 10 ms.
fn wait_for_commit(seen: u32) {
    COMMIT_WAITERS.fetch_add(1, Ordering::AcqRel);
    // Returns at once if the word is no longer `seen`.
    sys::futex_wait(&COMMITS, seen, Some(&libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 }));
    COMMIT_WAITERS.fetch_sub(1, Ordering::AcqRel);
}

thread_local! {
    /// This thread is serving a fault in its `SIGBUS` handler.
    static IN_SERVICE: Cell<bool> = const { Cell::new(false) };
}

/// Serves a fault at `addr` in the thread that took it, from the `SIGBUS`
/// handler of `--fault-path signal` (see `sud`): the same service as the
/// handler thread's, without the round trip to it (two wake-ups, often
/// across CPUs). `false` if `addr` is not the arena's (the program's own
/// `SIGBUS`). A page owned by an eviction in flight is not served: the
/// thread waits for the evictor's next commit ([`wait_for_commit`]) and
/// the retried access faults again.
fn serve_in_thread(addr: usize) -> bool {
    if STATE.load(Ordering::Acquire) != READY {
        return false;
    }
    let Some(g) = GLOBAL.get() else { return false };
    if !g.in_arena(addr) {
        return false;
    }
    if IN_SERVICE.try_with(Cell::get).unwrap_or(false) {
        eprintln!(
            "ztier: the fault handler faulted on managed memory ({addr:#x}) while serving a fault \
             in process {}: aborting",
            std::process::id()
        );
        std::process::abort();
    }
    let _ = IN_SERVICE.try_with(|c| c.set(true));
    SIGNAL_BUSY.fetch_add(1, Ordering::AcqRel);
    as_inside(|| {
        let page = addr & !(PAGE - 1);
        let t = std::time::Instant::now();
        let mut m = lock(&g.mgr);
        // For the tests of the watchdog only: stop serving after this
        // many faults, holding the lock, as a deadlocked service would.
        static HANG_AFTER: OnceLock<Option<usize>> = OnceLock::new();
        if let Some(n) = *HANG_AFTER.get_or_init(|| knob_size(env::TEST_HANG_AFTER)) {
            while g.stats.faults.load(Ordering::Relaxed) >= n as u64 {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        let t_log = m.log_clock();
        let owned = m.owned_in(g.page_of(page), 1);
        // A write to a victim of the batch in flight takes it back if it
        // is still in memory (a SIGBUS does not tell a write from a
        // missing page: mincore does).
        let present = owned && sys::present(page);
        let back = owned
            && m.take_back(g.page_of(page), present, &g.stats).unwrap_or_else(|e| {
                eprintln!("ztier: taking back a page from eviction failed: {e}: aborting");
                std::process::abort();
            });
        // A victim of the sealed batch whose release has returned is in
        // the store already: committed now, it is served below.
        let early = owned && !back && m.commit_early(g.page_of(page), &g.stats);
        if back {
            m.log_fault(t_log, ztier_run_core::faultlog::Kind::Wp, page);
            drop(m);
        } else if owned && !early {
            // Read under the lock: the batch that owns the page commits
            // (under the lock) after this.
            let seen = COMMITS.load(Ordering::Acquire);
            m.log_fault(t_log, ztier_run_core::faultlog::Kind::Deferred, page);
            drop(m);
            g.stats.deferred.fetch_add(1, Ordering::Relaxed);
            let waited = std::time::Instant::now();
            wait_for_commit(seen);
            g.stats.deferred_wait_ns.fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
        } else {
            g.stats.lock_wait_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if let Err(e) = m.serve(page, &g.stats) {
                eprintln!(
                    "ztier: serving a fault failed: {e}; pages cannot be served{}: aborting",
                    filtered(&e)
                );
                std::process::abort();
            }
            let wanted = m.evict_wanted();
            // No room, this process's batch in flight: the access is
            // retried after its commit (`Manager::take_room_wait`).
            let room = m.take_room_wait().then(|| COMMITS.load(Ordering::Acquire));
            // Timed under the lock that counted the fault, so that the
            // statistics, read under it, count each fault in the
            // histogram too.
            if room.is_none() {
                g.stats.record(t.elapsed().as_nanos() as u64);
            }
            drop(m);
            if wanted || room.is_some() {
                wake_evictor();
            }
            if let Some(seen) = room {
                wait_for_commit(seen);
            }
        }
        near::take_posted();
    });
    manager::PROGRESS.fetch_add(1, Ordering::Relaxed);
    SIGNAL_BUSY.fetch_sub(1, Ordering::AcqRel);
    let _ = IN_SERVICE.try_with(|c| c.set(false));
    true
}

/// Watches the two threads faults depend on, and aborts with a message
/// if either is stuck for `ZTIER_WATCHDOG_S` seconds (default 30) — a
/// deadlock, or a fault on memory it serves itself — since the threads
/// waiting on those faults would otherwise sleep forever:
///
/// - the handler, when faults wait to be read and neither the handler
///   nor the manager (`manager::PROGRESS`: every turn of the handler's
///   loop, at least every 100 ms while it waits, and the long manager
///   operations such as bringing spilled pages back before a fork) has moved;
/// - the evictor, when it holds a batch of victims (faults on them wait
///   for its commit) and has not finished a batch since.
///
/// With `--fault-path signal` there is no handler thread between a fault
/// and its service: the first check watches the program's threads inside
/// the service instead (some are, and none has finished a fault, nor the
/// manager moved).
///
/// Time is counted in its own one-second ticks, so a stopped process
/// (SIGSTOP, a debugger) does not count as stuck.
///
/// It also starts the handlers that the first handler asks for
/// ([`more_handlers`]), as soon as asked.
fn watchdog_loop() -> std::io::Result<()> {
    let signal = manager::signal_path();
    let limit = knob_size(env::WATCHDOG_S).unwrap_or(30).max(1);
    let mut seen = manager::PROGRESS.load(Ordering::Relaxed);
    let mut batches = EVICTOR_BATCHES.load(Ordering::Acquire);
    let (mut still, mut evictor_still) = (0, 0);
    loop {
        // A second, or until a handler asks for more handlers.
        sys::futex_wait(&MORE_HANDLERS_FOR, 0, Some(&libc::timespec { tv_sec: 1, tv_nsec: 0 }));
        let asked = MORE_HANDLERS_FOR.swap(0, Ordering::AcqRel);
        if asked > 0 {
            start_more_handlers(asked as usize - 1);
            // Not a second of watching: the next wait is.
            continue;
        }
        let now = manager::PROGRESS.load(Ordering::Relaxed);
        let mut p = libc::pollfd { fd: UFFD_FD.load(Ordering::Relaxed), events: libc::POLLIN, revents: 0 };
        let waiting = if signal {
            SIGNAL_BUSY.load(Ordering::Acquire) > 0
        } else {
            HANDLERS_BUSY.load(Ordering::Acquire) > 0
                // SAFETY: one live pollfd, no waiting.
                || (p.fd >= 0 && unsafe { libc::poll(&mut p, 1, 0) } > 0)
        };
        if now != seen || !waiting {
            seen = now;
            still = 0;
        } else {
            still += 1;
        }
        let done = EVICTOR_BATCHES.load(Ordering::Acquire);
        if done != batches || !EVICTOR_BUSY.load(Ordering::Acquire) {
            batches = done;
            evictor_still = 0;
        } else {
            evictor_still += 1;
        }
        let stuck = if still >= limit {
            Some((if signal { "fault handler (in the faulting threads)" } else { "fault handler" }, still))
        } else if evictor_still >= limit {
            Some(("evictor", evictor_still))
        } else {
            None
        };
        if let Some((who, secs)) = stuck {
            eprintln!(
                "ztier: the {who} of process {} has made no progress for {secs} s: threads \
                 waiting on page faults would hang forever: aborting",
                std::process::id()
            );
            std::process::abort();
        }
    }
}

/// Makes the control socket `@ztier-PID` (a datagram socket,
/// non-blocking, its descriptor moved up and kept: see `fds`) into
/// `CTL_FD`; without it (the name taken, no sockets) `ztier stats PID`
/// gets no answer, and nothing else changes.
///
/// PID is the process's PID as `/proc` shows it ([`proc_pid`]), the one
/// `ztier stats` is given: a process in a PID namespace of its own
/// (`clone(CLONE_NEWPID)`, `unshare --pid --fork`) is PID 1 there, and
/// several at once would all want `@ztier-1` (abstract names belong to
/// the network namespace), while `/proc`, unless the namespace mounted
/// one of its own, still shows the PID the rest of the machine sees.
///
/// A datagram socket, not a listening one: each request is answered from
/// this one descriptor ([`answer_ctl`]), where an `accept` would take the
/// program's lowest free descriptor number for the connection's life, so
/// that the program's `open` on another thread could get another number
/// than the one it is owed (`cli_run::live_stats_take_none_of_the_programs_descriptor_numbers`).
fn make_ctl_socket() {
    use std::os::fd::{AsRawFd, IntoRawFd};
    use std::os::linux::net::SocketAddrExt;
    let s = std::os::unix::net::SocketAddr::from_abstract_name(control::socket_name(proc_pid()))
        .and_then(|a| std::os::unix::net::UnixDatagram::bind_addr(&a))
        .and_then(|s| s.set_nonblocking(true).map(|()| s));
    if let Ok(s) = s {
        // Room for the largest answer in one datagram (the kernel caps it
        // at twice `net.core.wmem_max`, 416 KiB by default; an answer is
        // at most ~60 KiB: the fixed fields and 2,000 histogram buckets).
        let size: libc::c_int = CTL_ANSWER_MAX as libc::c_int;
        // SAFETY: a valid option value of its own size, on our socket.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        // Each request comes with its sender ([`answer_ctl`] answers only
        // the program's user and root). Without it, every request is
        // refused.
        let _ = ztier_uffd::ctl::pass_credentials(s.as_raw_fd());
        CTL_FD.store(fds::keep(s.into_raw_fd()), Ordering::Relaxed);
    }
}

/// This process's PID in the PID namespace of the `/proc` mount (what
/// `/proc/self` links to; no descriptor is made), or, without `/proc`,
/// its PID in its own namespace.
fn proc_pid() -> u32 {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(std::process::id)
}

/// The send buffer asked for the control socket.
const CTL_ANSWER_MAX: usize = 1 << 20;

/// Answers every request waiting on the control socket: each datagram,
/// whatever it holds, from a client bound to a name is sent one JSON
/// datagram. Nothing waits: a client whose queue is full, or that is
/// gone, gets no answer. No descriptor is made.
///
/// The name is abstract, so anyone on the machine can send to it: the
/// kernel tells who sent each request (`SO_PASSCRED`, set when the socket
/// is made), and only the program's own user (its real or effective
/// user ID) and root are sent the statistics. Anyone else is sent
/// `{"denied": "..."}` (a key the statistics do not have), so that `ztier stats` can say why.
fn answer_ctl(ctl: &std::os::unix::net::UnixDatagram, g: &Global) {
    use std::os::fd::AsRawFd;
    let fd = ctl.as_raw_fd();
    let mut req = [0u8; 64];
    // SAFETY: sockaddr_un is a plain C struct; all zeros is valid.
    let mut from: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    while let Ok(r) = ztier_uffd::ctl::recv(fd, &mut req, Some(&mut from), libc::MSG_DONTWAIT) {
        // An unnamed client (its name no longer than the family field)
        // cannot be answered.
        if (r.name_len as usize) <= std::mem::size_of::<libc::sa_family_t>() {
            continue;
        }
        // SAFETY: getuid and geteuid have no preconditions.
        let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
        let answer = match r.sender {
            Some(c) if c.uid == 0 || c.uid == uid || c.uid == euid => match &req[..r.len.min(req.len())] {
                control::HOLD => hold(g, c.pid),
                control::RELEASE => release(g, c.pid),
                _ => stats_json(g),
            },
            Some(c) => format!(
                "{{\"{}\": \"user {} asked; only the program's user ({euid}) and root may read its statistics or hold it\"}}",
                control::reply::DENIED,
                c.uid
            ),
            None => format!(
                "{{\"{}\": \"the request came without its sender's credentials\"}}",
                control::reply::DENIED
            ),
        };
        // SAFETY: the answer's bytes and the sender's address as recvmsg
        // filled it in (name_len bytes of `from`).
        unsafe {
            libc::sendto(
                fd,
                answer.as_ptr().cast(),
                answer.len(),
                libc::MSG_DONTWAIT,
                (&from as *const libc::sockaddr_un).cast(),
                r.name_len,
            )
        };
    }
}

/// The handler thread: reads fault events, serves them under the manager
/// lock, evicts when over budget, answers the control socket.
fn handler_loop(g: &Global, serve_ctl: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // Made by `spawn_handlers` (`make_ctl_socket`); this thread only
    // borrows it: the descriptor stays in `CTL_FD`.
    let ctl_fd = CTL_FD.load(Ordering::Relaxed);
    let ctl = (serve_ctl && ctl_fd >= 0).then(|| {
        use std::os::fd::FromRawFd;
        // SAFETY: the control socket's descriptor, kept open for the process's
        // life (the `ManuallyDrop` never closes it).
        std::mem::ManuallyDrop::new(unsafe { std::os::unix::net::UnixDatagram::from_raw_fd(ctl_fd) })
    });
    let uffd = lock(&g.mgr).uffd.clone();
    let spin = std::time::Duration::from_micros(knob_size(env::SPIN_US).unwrap_or(0) as u64);
    let mut last = std::time::Instant::now();
    // For the tests of the watchdog only: stop serving after this many
    // faults, as a stuck handler would.
    let hang_after = knob_size(env::TEST_HANG_AFTER);
    UFFD_FD.store(uffd.raw_fd(), Ordering::Relaxed);
    // With `--fault-path signal` no fault is read here (the watchdog
    // watches the in-thread service, whose progress this must not fake).
    let signal = manager::signal_path();
    let mut spread = Spread::new(serve_ctl);
    let mut busy = false;
    loop {
        if busy {
            HANDLERS_BUSY.fetch_sub(1, Ordering::AcqRel);
            busy = false;
        }
        if !signal {
            manager::PROGRESS.fetch_add(1, Ordering::Relaxed);
        }
        if !signal && hang_after.is_some_and(|n| g.stats.faults.load(Ordering::Relaxed) >= n as u64) {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        let ev = match uffd.try_read()? {
            Some(ev) => ev,
            None if last.elapsed() < spin => {
                std::hint::spin_loop();
                continue;
            }
            None => {
                {
                    let mut m = lock(&g.mgr);
                    if m.over_budget() {
                        m.evict(&g.stats)?;
                    }
                }
                let mut fds = [
                    libc::pollfd { fd: uffd.raw_fd(), events: libc::POLLIN, revents: 0 },
                    libc::pollfd {
                        fd: ctl.as_ref().map_or(-1, |l| l.as_raw_fd()),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two live pollfds.
                unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
                if let Some(c) = &ctl {
                    if fds[1].revents != 0 {
                        answer_ctl(c, g);
                    }
                    // Checked only after the requests waiting were read:
                    // renewals sent while the process was stopped (under a
                    // debugger) are in them.
                    if lock(&g.mgr).release_holds(None, std::time::Instant::now()) {
                        notice(format_args!(
                            "ztier: process {}: a hold (`ztier hold`) was not renewed for {} s: its \
                             holder is gone; pages are evicted again",
                            std::process::id(),
                            HOLD_LEASE.as_secs()
                        ));
                    }
                }
                continue;
            }
        };
        last = std::time::Instant::now();
        if ev.kind != ztier_uffd::uffd::EVENT_PAGEFAULT {
            continue;
        }
        // A fault read and not yet served: the watchdog counts it as
        // waiting (the descriptor no longer shows it) until the loop
        // comes round again.
        HANDLERS_BUSY.fetch_add(1, Ordering::AcqRel);
        busy = true;
        spread.fault(ev.tid);
        let addr = (ev.address as usize) & !(PAGE - 1);
        if ev.flags & ztier_uffd::uffd::PAGEFAULT_FLAG_WP != 0 {
            // A write hit a write-protected page: one being evicted (the
            // evictor wakes the writer when done) or, under `--clean wp`, a
            // clean one (it becomes dirty); see `Manager::write_fault`.
            g.stats.wp_faults.fetch_add(1, Ordering::Relaxed);
            if g.in_arena(addr) {
                lock(&g.mgr).write_fault(addr, &g.stats)?;
            } else {
                uffd.wake(addr, PAGE)?;
            }
            continue;
        }
        let t = std::time::Instant::now();
        let mut m = lock(&g.mgr);
        g.stats.lock_wait_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if !g.in_arena(addr) {
            uffd.wake(addr, PAGE)?;
            continue;
        }
        let wake = m.serve(addr, &g.stats)?;
        // Under `--budget-covers all`, a fault with no room that waits for
        // this process's batch in flight (`Manager::take_room_wait`): its
        // thread is woken after the next commit, and its retry faults
        // again.
        let room = m.take_room_wait().then(|| COMMITS.load(Ordering::Acquire));
        // A page an eviction in flight still owns was not served (its
        // fault waits for the commit, and its retry is counted), so it is
        // not timed either.
        let deferred = room.is_some() || m.owned_in(g.page_of(addr), 1);
        let wanted = m.evict_wanted();
        // Service time: from reading the fault to the page in place,
        // taken under the lock that counted the fault (the statistics,
        // read under it, count each fault in the histogram too). The
        // wake that follows is not counted: the woken thread usually runs
        // on this CPU and preempts the handler inside the ioctl, which
        // then returns only at the program's next fault (counting it
        // added the program's own run time between faults: measured
        // 3.5 s of 12 s in pyapp at 256M).
        if !deferred {
            g.stats.record(t.elapsed().as_nanos() as u64);
        }
        drop(m);
        if let Some(seen) = room {
            wake_evictor();
            wait_for_commit(seen);
        }
        if let Some((at, len)) = wake {
            uffd.wake(at, len)?;
        }
        near::take_posted();
        if wanted {
            wake_evictor();
        }
    }
}

/// Statistics of this process as JSON (the `--stats` fields of DESIGN.md
/// plus counters and the latency histogram, for merging).
fn stats_json(g: &Global) -> String {
    let s = &g.stats;
    // Made before the lock, and only filled under it: the copy adds no
    // allocation to the time the lock is held.
    let mut lat = vec![0u64; manager::LAT_BUCKETS];
    let (
        faults,
        timing,
        now_orig,
        now_stored,
        spilled,
        spill_reads,
        policy,
        names,
        resident_budget,
        user_mode_only,
        tree,
        store_share,
        holders,
    ) = {
        let mut m = lock_program(g);
        // A fault is counted and timed under this lock: read here, the
        // histogram and the service time and its parts hold every fault
        // counted.
        let faults = s.faults.load(Ordering::Relaxed);
        for (l, c) in lat.iter_mut().zip(&s.latency) {
            *l = c.load(Ordering::Relaxed);
        }
        let timing = [&s.service_ns, &s.lock_wait_ns, &s.store_read_ns, &s.install_ns]
            .map(|c| c.load(Ordering::Relaxed));
        // Pins kept for threads gone since (a robust mutex's until its
        // owner is gone) are not pins any more.
        m.drop_kept_of_gone();
        let st = m.store().stats();
        let tree = m.tree_now();
        (
            faults,
            timing,
            st.orig_bytes,
            st.memory_used,
            st.tier_bytes,
            st.tier_hits,
            m.sizing(),
            m.policy_names(),
            m.budget() * PAGE,
            m.uffd.user_mode_only,
            tree,
            m.tree_store_budget(),
            m.holders(),
        )
    };
    let q = |f: f64| ztier_run_core::counters::quantile_us(&lat, f);
    let tree = |f: fn((usize, usize, usize)) -> usize| {
        tree.map_or("null".to_string(), |t| (f(t) * PAGE).to_string())
    };
    let orig = s.peak_store_orig.load(Ordering::Relaxed);
    let stored = s.peak_store_bytes.load(Ordering::Relaxed);
    let hist: Vec<String> = lat
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, c)| format!("[{},{c}]", manager::lat_upper_ns(i)))
        .collect();
    let ld = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed).to_string();
    let quoted = |v: &str| format!("\"{v}\"");
    // In the order of `stats::ALL` (what the names test checks).
    let fields: [(&str, String); stats::ALL.len()] = [
        (stats::PID, std::process::id().to_string()),
        (stats::BUDGET_BYTES, (g.cfg.budget_pages * PAGE).to_string()),
        (stats::FAULTS, faults.to_string()),
        (stats::FAULT_P50_US, q(0.5).to_string()),
        (stats::FAULT_P99_US, q(0.99).to_string()),
        (stats::PAGES_COMPRESSED, ld(&s.pages_compressed)),
        (stats::ORIG_BYTES, orig.to_string()),
        (stats::STORED_BYTES, stored.to_string()),
        (stats::STORE_ORIG_BYTES_NOW, now_orig.to_string()),
        (stats::STORE_BYTES_NOW, now_stored.to_string()),
        (stats::SPILLED_BYTES, spilled.to_string()),
        (stats::SPILL_READS, spill_reads.to_string()),
        (stats::PEAK_RESIDENT_BYTES, (s.peak_resident.load(Ordering::Relaxed) * PAGE).to_string()),
        (stats::RESIDENT_BYTES, (s.resident.load(Ordering::Relaxed) * PAGE).to_string()),
        (stats::PINNED_BYTES, (manager::PINNED_PAGES.load(Ordering::Relaxed) * PAGE).to_string()),
        (stats::ZERO_FAULTS, ld(&s.zero_faults)),
        (stats::STORE_FAULTS, ld(&s.store_faults)),
        (stats::LONE_FAULTS, ld(&s.lone_faults)),
        (stats::USER_MODE_ONLY, user_mode_only.to_string()),
        (stats::FAULT_PATH, quoted(if manager::signal_path() { "signal" } else { "thread" })),
        (stats::HANDLER_CPU, {
            let c = HANDLER_CPU.load(Ordering::Relaxed);
            if c < 0 {
                "null".into()
            } else {
                c.to_string()
            }
        }),
        (stats::PINNED_CALLS, ld(&s.pinned_calls)),
        (stats::PINNED_IN, ld(&s.pinned_in)),
        (stats::DISPATCHED_CALLS, ld(&s.dispatched_calls)),
        (stats::DIRECT_CALLS, ld(&s.direct_calls)),
        (stats::PREFETCHED, ld(&s.prefetched)),
        (stats::EVICTED_ZERO, ld(&s.evicted_zero)),
        (stats::REFUSED, ld(&s.refused)),
        (stats::WP_FAULTS, ld(&s.wp_faults)),
        (stats::WP_CALLS, ld(&s.wp_calls)),
        (stats::WP_BATCHES_NEAR, ld(&s.wp_batches_near)),
        (stats::WP_BATCHES_FAR, ld(&s.wp_batches_far)),
        (stats::DEFERRED, ld(&s.deferred)),
        (stats::TAKEN_BACK, ld(&s.taken_back)),
        (stats::COMMITTED_EARLY, ld(&s.committed_early)),
        (stats::PROMOTED, ld(&s.promoted)),
        (stats::DEMOTED, ld(&s.demoted)),
        (stats::REGRETTED, ld(&s.regretted)),
        (stats::EVICTED_INLINE, ld(&s.evicted_inline)),
        (stats::AGE_EVERY, s.age_every.load(Ordering::Relaxed).to_string()),
        (stats::HOT_DISTANCE, s.hot_distance.load(Ordering::Relaxed).to_string()),
        (stats::CLEAN_EVICTED, ld(&s.clean_evicted)),
        (stats::DIRTIED, ld(&s.dirtied)),
        (stats::RESIDENT_BUDGET_BYTES, resident_budget.to_string()),
        (stats::POLICY, policy.as_ref().map_or("null".to_string(), |(n, _)| quoted(n))),
        (stats::REPLACEMENT, quoted(names.0)),
        (stats::PREFETCH, quoted(names.1)),
        (stats::ALLOCATOR, quoted(&g.cfg.allocator.name())),
        (
            stats::STORE_BUDGET_BYTES,
            policy.as_ref().map(|(_, b)| *b).or(store_share).map_or("null".to_string(), |b| b.to_string()),
        ),
        (stats::FORKS, ld(&s.forks)),
        (stats::FORKED_CHILD, ld(&s.forked_child)),
        (stats::HANDLERS, HANDLER_THREADS.load(Ordering::Relaxed).to_string()),
        (stats::HELD_BY, format!("{holders:?}")),
        (stats::TREE_HELD_BYTES, tree(|t| t.0)),
        (stats::TREE_RESERVED_BYTES, tree(|t| t.1)),
        (stats::TREE_INHERITED_BYTES, tree(|t| t.2)),
        (stats::FAULT_SERVICE_NS, timing[0].to_string()),
        (stats::FAULT_LOCK_WAIT_NS, timing[1].to_string()),
        (stats::FAULT_STORE_READ_NS, timing[2].to_string()),
        (stats::FAULT_INSTALL_NS, timing[3].to_string()),
        (stats::INLINE_EVICTIONS, ld(&s.inline_evictions)),
        (stats::FAULT_EVICT_NS, ld(&s.evict_ns)),
        (stats::FAULT_EVICT_TAKE_NS, ld(&s.evict_take_ns)),
        (stats::FAULT_EVICT_PROTECT_NS, ld(&s.evict_protect_ns)),
        (stats::FAULT_EVICT_COMPRESS_NS, ld(&s.evict_compress_ns)),
        (stats::FAULT_EVICT_TIER_NS, ld(&s.evict_tier_ns)),
        (stats::FAULT_EVICT_RELEASE_NS, ld(&s.evict_release_ns)),
        (stats::DEFERRED_WAIT_NS, ld(&s.deferred_wait_ns)),
        (stats::LATENCY_NS, format!("[{}]", hist.join(","))),
    ];
    debug_assert!(fields.iter().zip(stats::ALL).all(|((k, _), want)| *k == want));
    let mut json = String::with_capacity(4096);
    json.push('{');
    for (n, (k, v)) in fields.iter().enumerate() {
        if n > 0 {
            json.push(',');
        }
        json.push('"');
        json.push_str(k);
        json.push_str("\":");
        json.push_str(v);
    }
    json.push_str("}\n");
    remote::add_stats(json)
}

/// This process's `--stats` file, opened when the library starts and
/// in a forked child (-1: none, or it could not be made then): a process
/// that drops root later, as a daemon does, can no longer create a file
/// in `ztier run`'s folder, but still writes through this at exit. Empty
/// until then (`ztier run` passes over an empty one: the process ended
/// without its exit handlers, by a signal or a raw `exit_group`; `_exit`
/// and `_Exit` write it first).
static STATS_FD: AtomicI32 = AtomicI32::new(-1);

/// Opens [`STATS_FD`] for this process, closing one inherited from the
/// parent (a forked child's statistics are its own).
fn open_stats() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::IntoRawFd;
    FILE_PID.store(proc_pid(), Ordering::Relaxed);
    let Some(dir) = GLOBAL.get().and_then(|g| g.cfg.stats_dir.as_ref()) else { return };
    // A file no other process of the command has: `PID.json`, or
    // `PID-N.json` if that is taken (the children `clone` starts in new
    // PID namespaces are each PID 1 there, and a long command may see a
    // PID again). Each process holds a lock on its file while it lives:
    // a file left empty and unlocked is an earlier image's of this very
    // process (its descriptor closed at `exec`, before it wrote
    // anything), taken over so that an exec'd program keeps `PID.json`.
    let lock = |f: &std::fs::File| {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    };
    let mut fd = -1;
    for n in 0..MAX_SAME_PID {
        STATS_SUFFIX.store(n, Ordering::Relaxed);
        let path = dir.join(own_file_name("json"));
        let open = |new: bool| {
            std::fs::OpenOptions::new().write(true).create_new(new).custom_flags(libc::O_CLOEXEC).open(&path)
        };
        let f = match open(true) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match open(false) {
                Ok(f) if f.metadata().is_ok_and(|m| m.len() == 0) => f,
                _ => continue,
            },
            Err(_) => break,
        };
        // Not locked: another process took it first (it is live).
        if lock(&f) && f.metadata().is_ok_and(|m| m.len() == 0) {
            fd = fds::keep(f.into_raw_fd());
            break;
        }
    }
    let old = STATS_FD.swap(fd, Ordering::Relaxed);
    if old >= 0 {
        fds::forget(old);
        sys::raw(libc::SYS_close, [old as u64, 0, 0, 0, 0, 0]);
    }
}

/// Processes of one command with the same PID whose statistics are kept
/// apart ([`open_stats`]).
const MAX_SAME_PID: u32 = 1000;

/// This process's number among those of its command with its PID (0:
/// the first), chosen by [`open_stats`].
static STATS_SUFFIX: AtomicU32 = AtomicU32::new(0);

/// The PID that names this process's files ([`own_file_name`]): its PID
/// as `/proc` shows it ([`proc_pid`]), taken by [`open_stats`] (0:
/// not yet).
static FILE_PID: AtomicU32 = AtomicU32::new(0);

/// The name of this process's statistics (`ext` "json") or fault log
/// ("csv") file: `PID.ext`, or `PID-N.ext` when N live or finished
/// processes of the command had this PID first (an `exec` keeps the
/// name: see [`open_stats`]). PID is the one `ztier stats` takes, also
/// for a process in a PID namespace of its own ([`proc_pid`]).
fn own_file_name(ext: &str) -> String {
    let pid = match FILE_PID.load(Ordering::Relaxed) {
        0 => proc_pid(),
        pid => pid,
    };
    match STATS_SUFFIX.load(Ordering::Relaxed) {
        0 => format!("{pid}.{ext}"),
        n => format!("{pid}-{n}.{ext}"),
    }
}

/// Writes this process's statistics: through [`STATS_FD`], else by path.
fn write_stats(path: &std::path::Path, json: &str) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::FromRawFd;
    let fd = STATS_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return std::fs::write(path, json);
    }
    // SAFETY: the library's own descriptor, borrowed (not closed here).
    let f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    f.set_len(0)?;
    f.write_all_at(json.as_bytes(), 0)
}

/// The process whose library this is: set at start-up and in a forked
/// child. A `vfork` child, which shares the memory, has another PID.
static OWN_PID: AtomicI32 = AtomicI32::new(0);

/// Has this process written its statistics and fault log ([`at_exit`])?
static EXITED: AtomicBool = AtomicBool::new(false);

/// `_exit(2)`: the process's statistics and fault log written first, as
/// at a normal exit, then the process ends. Forked children often end
/// so, their exit handlers being the parent's business: redis's `BGSAVE`
/// child, CPython's `os._exit` (its `multiprocessing` workers), and
/// their figures were missing from `--stats` and `bench pressure`
/// (`forks.py`'s 20 children and redis's snapshots counted no fault).
/// Not in a `vfork` child (its memory and descriptors are its parent's),
/// nor from inside the library's own code on this thread (which may
/// hold the lock the statistics are read under).
///
/// # Safety
/// The C contract of `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: libc::c_int) -> ! {
    end(status)
}

/// `_Exit(3)`: as [`_exit`].
///
/// # Safety
/// The C contract of `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: libc::c_int) -> ! {
    end(status)
}

fn end(status: libc::c_int) -> ! {
    if ready() && !inside() && sys::raw(libc::SYS_getpid, [0; 6]) == OWN_PID.load(Ordering::Relaxed) as i64 {
        at_exit();
    }
    // As glibc's `_exit`: the whole process, else (never seen) this thread.
    loop {
        sys::raw(libc::SYS_exit_group, [status as u64, 0, 0, 0, 0, 0]);
        sys::raw(libc::SYS_exit, [status as u64, 0, 0, 0, 0, 0]);
    }
}

extern "C" fn at_exit() {
    if EXITED.swap(true, Ordering::AcqRel) {
        return;
    }
    as_inside(|| {
        let Some(g) = GLOBAL.get() else { return };
        if let Some(dir) = &g.cfg.stats_dir {
            let path = dir.join(own_file_name("json"));
            if let Err(e) = write_stats(&path, &stats_json(g)) {
                // Said, not lost silently: a process that dropped root
                // before it was forked cannot write into `ztier run`'s
                // folder.
                notice(format_args!(
                    "ztier: process {}: its statistics are left out of --stats: writing {}: {e}",
                    std::process::id(),
                    path.display()
                ));
            }
        }
        // Taken under the lock, written after it is let go: threads still
        // running may fault meanwhile (their rows are not written).
        let log = {
            let mut m = lock_program(g);
            // With `--budget-scope tree`, this process's pages go back to
            // the command's budget.
            m.leave_tree();
            m.take_fault_log()
        };
        if let Some(log) = log {
            match log.write_file(&own_file_name("csv")) {
                Ok(path) => {
                    let (dropped, max) = log.unlogged();
                    if dropped > 0 {
                        notice(format_args!(
                            "ztier: fault log {}: {dropped} page-ins after the first {max} were not logged",
                            path.display()
                        ));
                    }
                }
                Err(e) => {
                    notice(format_args!("ztier: writing the fault log into {}: {e}", log.dir.display()))
                }
            }
        }
    });
}

type ForkGuards = (
    Vec<std::sync::MutexGuard<'static, Class>>,
    std::sync::MutexGuard<'static, Manager>,
    std::sync::MutexGuard<'static, PageAlloc>,
);

/// The locks [`fork_prepare`] took, released after the fork (futex
/// mutexes: a child can release them; nobody else in it waits).
///
/// A static, not a thread-local: a thread-local with a destructor
/// registers it with glibc at its first use in a thread, and glibc
/// allocates for that with the program's `calloc`. With `--fault-path
/// signal`, [`fork_prepare`] runs after the program's own `prepare`
/// handlers, and an allocator's holds its lock then: the first fork
/// from a thread waited on that lock for ever (`ownmalloc.c`).
struct ForkSlot(std::cell::RefCell<Option<ForkGuards>>);

// SAFETY: only the forking thread uses it, from its fork's `prepare`
// handler to its `parent` or `child` handler, and forks do not overlap
// there: glibc runs one fork's handlers at a time (under its lock for
// them), and the manager's lock, held in between, is taken by no other.
unsafe impl Sync for ForkSlot {}

impl ForkSlot {
    fn with<R>(&self, f: impl FnOnce(&std::cell::RefCell<Option<ForkGuards>>) -> R) -> R {
        f(&self.0)
    }
}

static FORK_GUARDS: ForkSlot = ForkSlot(std::cell::RefCell::new(None));

/// The page ranges of the arena ever handed out: the small-object spans
/// and the page region's used part. Everything else is ABSENT, so the
/// fork paths walk only these (the page region starts 4 Mi pages in:
/// walking from page 0 cost every fork of a shell ~3 ms).
fn used(g: &Global, pages: &PageAlloc) -> [std::ops::Range<usize>; 2] {
    let region = g.span_bytes / PAGE;
    [0..g.page_of(g.span_next.load(Ordering::Relaxed)).min(region), region..pages.high.max(region)]
}

/// The thread that forks (set in `fork_prepare`): in the child, its kept
/// pins are the child's.
static FORKING_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// [`fork_prepare`] holds the library's locks for a fork, until
/// [`fork_parent`] or [`fork_child`]: a fork that dispatch catches
/// meanwhile in the thread that prepared it ([`FORKING_TID`]) is the
/// one those handlers are for (glibc's `fork`, or the library's
/// `_Fork`); any other is the program's own ([`fork_unseen`]).
static FORK_PREPARED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The signal mask the forking thread had before `fork_prepare`
    /// blocked the asynchronous signals (see [`Held`]: the manager's lock
    /// is held across the fork).
    static FORK_MASK: Cell<u64> = const { Cell::new(0) };
}

type AtforkFn = Option<extern "C" fn()>;
type RegisterAtforkFn = unsafe extern "C" fn(AtforkFn, AtforkFn, AtforkFn, *mut libc::c_void) -> libc::c_int;

/// glibc's `__register_atfork`, 0 if not found.
fn real_register_atfork() -> usize {
    static REAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name (no allocation when
        // the symbol is found).
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"__register_atfork".as_ptr()) } as usize;
        REAL.store(f, Ordering::Relaxed);
    }
    f
}

/// Registers the library's fork handlers ([`fork_prepare`],
/// [`fork_parent`], [`fork_child`]) with glibc, once: at the library's
/// start, or before the first handler anything else registers, if that
/// comes first ([`__register_atfork`]). They do nothing before the
/// library has started.
fn register_fork_handlers() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    let f = real_register_atfork();
    if f == 0 {
        return;
    }
    // SAFETY: glibc's `__register_atfork`, with plain extern "C"
    // callbacks that live as long as the process (no DSO handle: never
    // unregistered).
    unsafe {
        std::mem::transmute::<usize, RegisterAtforkFn>(f)(
            Some(fork_prepare),
            Some(fork_parent),
            Some(fork_child),
            std::ptr::null_mut(),
        )
    };
}

/// Registrations of [`fork_child_late`]: one at the library's start,
/// and one more after each handler anyone registers later, so that one
/// of them is always the last `child` handler (glibc has no exported
/// way to remove a handler, and none to move one). The last to run does
/// the work ([`LATE_COUNTDOWN`]).
static LATE_INSTANCES: AtomicU32 = AtomicU32::new(0);
/// Registrations of fork handlers, one at a time.
static REGISTERING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Registers [`fork_child_late`] once more (the caller holds
/// [`REGISTERING`]).
fn register_late_child_locked() {
    let reg = real_register_atfork();
    if reg == 0 {
        return;
    }
    // SAFETY: glibc's `__register_atfork` with a plain callback that
    // lives as long as the process (no DSO handle: never unregistered).
    let r = unsafe {
        std::mem::transmute::<usize, RegisterAtforkFn>(reg)(
            None,
            None,
            Some(fork_child_late),
            std::ptr::null_mut(),
        )
    };
    if r == 0 {
        LATE_INSTANCES.fetch_add(1, Ordering::AcqRel);
    }
}

/// At the library's start: registers [`fork_child_late`].
fn register_late_child() {
    let _one = REGISTERING.lock().unwrap_or_else(|e| e.into_inner());
    register_late_child_locked();
}

/// `__register_atfork`, which `pthread_atfork` calls (from
/// `libc_nonshared.a`, linked into the caller). glibc runs the `prepare`
/// handlers last registered first, and the others in order.
///
/// The library's handlers are registered before the first of anyone
/// else's, so its `prepare` runs after every other and its `parent` and
/// `child` handlers before every other (but for [`fork_child_late`],
/// registered again after each other one).
///
/// - `prepare` last: [`fork_prepare`] holds the manager's lock until the
///   fork is done, so a `prepare` handler run after it that touched an
///   evicted page faulted, and the fault waited for that lock. jemalloc
///   registers its handlers when it starts, at the program's first
///   `malloc` (rustc's: in libLLVM's constructor, before this library
///   starts), and its `prepare` takes every mutex it has, in its own
///   metadata, arena memory: rustc under `ztier run --budget 32M` hung at
///   its first `fork` (to run the linker) until the watchdog ended it.
/// - `child` first: the child's memory is unregistered from the parent's
///   userfaultfd at the fork, and [`fork_child`] registers it with the
///   child's own. A `child` handler run before that read zeros from every
///   evicted page instead: with `--fault-path thread`, the default, a
///   handler registered in a library's constructor that checked the
///   program's blocks found 5,000 to 5,027 of the 6,144 words it read
///   wrong (three runs)
///   (`cli_run_modes::fork_handlers_registered_before_the_library_starts`).
///   Then the child's handler thread starts at once, and serves the later
///   handlers' faults — but for a program with a `malloc` of its own,
///   whose allocator's locks, held by its `prepare`, `pthread_create`
///   would need: its threads start in [`fork_child_late`], and meanwhile
///   the faults of the program's handlers are served in the faulting
///   thread (such a program always takes the signal path,
///   [`manager::signal_path`]).
///
/// # Safety
/// The C contract of `__register_atfork`.
#[no_mangle]
pub unsafe extern "C" fn __register_atfork(
    prepare: AtforkFn,
    parent: AtforkFn,
    child: AtforkFn,
    dso: *mut libc::c_void,
) -> libc::c_int {
    register_fork_handlers();
    let f = real_register_atfork();
    if f == 0 {
        return libc::ENOMEM;
    }
    let _one = REGISTERING.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: forwarding to glibc's, as the caller promises.
    let r = unsafe { std::mem::transmute::<usize, RegisterAtforkFn>(f)(prepare, parent, child, dso) };
    if r == 0 && LATE_INSTANCES.load(Ordering::Acquire) > 0 {
        register_late_child_locked();
    }
    r
}

extern "C" fn fork_prepare() {
    prepare_fork_by(false);
}

/// [`fork_prepare`]'s work: the library's locks taken and held for the
/// fork. With `unless_held_here` (for [`_Fork`], which a signal handler
/// may call over the library's code in the same thread), a small-block
/// class's lock that this thread holds is given up on (the only lock it
/// can hold outside what [`sud::in_library`] counts): `false`, nothing
/// held and the program's signal mask back (but calls still let
/// through, [`sud::allow`], so that the caller's fork is not caught as
/// one of the program's own). A lock another thread holds is waited for,
/// as `fork` waits: that thread lets it go. (Before, `_Fork` gave up on
/// any lock still taken after 100 ms, and on a loaded machine an
/// eviction batch in flight took longer: the child, made without the
/// handlers, read zeros from every evicted page.)
fn prepare_fork_by(unless_held_here: bool) -> bool {
    if STATE.load(Ordering::Acquire) != READY {
        return true;
    }
    let _ = INSIDE.try_with(|c| c.set(true));
    sud::allow();
    FORK_MASK.with(|c| c.set(sys::sigprocmask(libc::SIG_BLOCK, sys::ASYNC_SIGNALS)));
    // SAFETY: gettid has no preconditions.
    FORKING_TID.store(unsafe { libc::gettid() }, Ordering::Relaxed);
    let give_up = || {
        sys::sigprocmask(libc::SIG_SETMASK, FORK_MASK.with(Cell::get));
        let _ = INSIDE.try_with(|c| c.set(false));
        false
    };
    let g = GLOBAL.get().expect("ready");
    let mut classes = Vec::with_capacity(g.classes.len());
    for (c, owner) in g.classes.iter().zip(&g.class_owner) {
        let held = if unless_held_here { take_class_unless_held_here(c, owner) } else { Some(lock(c)) };
        match held {
            Some(held) => classes.push(held),
            None => return give_up(),
        }
    }
    let mut m = lock(&g.mgr);
    // An eviction in flight may have released memory it has not
    // committed: the child would lose those pages. Wait for its commit
    // (the evictor needs only the manager's lock).
    while m.evicting() > 0 {
        drop(m);
        // The evictor may be waiting for a fault service to protect its
        // victims (see `near`).
        near::take_posted();
        std::thread::sleep(std::time::Duration::from_micros(50));
        m = lock(&g.mgr);
    }
    let pages = lock(&g.pages);
    if let Err(e) = m.prepare_fork(&used(g, &pages), &g.stats) {
        eprintln!("ztier: preparing the store for fork failed: {e}: aborting");
        std::process::abort();
    }
    FORK_GUARDS.with(|f| *f.borrow_mut() = Some((classes, m, pages)));
    FORK_PREPARED.store(true, Ordering::Release);
    true
}

/// A small-block class's lock `c` (its holder recorded in `owner`), or
/// `None` if this thread holds it: for a `_Fork` from a signal handler
/// ([`prepare_fork_by`]). Polled every 50 µs while another thread holds
/// it. A lock taken with no holder recorded yet (the instant between
/// taking it and recording it) may be this thread's: given up on once
/// it has stayed so for [`FORK_LOCK_WAIT`].
fn take_class_unless_held_here<'a>(
    c: &'a std::sync::Mutex<Class>,
    owner: &AtomicUsize,
) -> Option<std::sync::MutexGuard<'a, Class>> {
    let me = shim::thread_id();
    let mut unrecorded_since: Option<std::time::Instant> = None;
    loop {
        match c.try_lock() {
            Ok(held) => return Some(held),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        match owner.load(Ordering::Relaxed) {
            o if o == me => return None,
            0 => {
                let since = *unrecorded_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= FORK_LOCK_WAIT {
                    return None;
                }
            }
            _ => unrecorded_since = None,
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// `m`'s lock if it is free by `until` (polled every 50 µs), else `None`:
/// for callers that may run where the lock's holder is their own thread,
/// interrupted (a signal handler: a crashing thread's core dump).
pub(crate) fn lock_until<T>(
    m: &std::sync::Mutex<T>,
    until: std::time::Instant,
) -> Option<std::sync::MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(held) => return Some(held),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// Why [`bring_all_back`] gave up: a lock not had by its deadline.
pub(crate) fn lock_stayed_taken() -> String {
    "the library's lock stayed taken (a thread of the program stopped in it)".into()
}

/// Bytes that bringing every stored page back would take.
pub(crate) fn stored_bytes(m: &Manager) -> u64 {
    let st = m.store().stats();
    (st.pages.saturating_sub(st.zero_pages) + st.tier_entries) * PAGE as u64
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (`u64::MAX` if unknown).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(u64::MAX)
}

/// Brings every stored page of the arena back into memory, the spill
/// file's too, once no eviction is in flight: for a core dump
/// ([`coredump`]) and a hold ([`hold`]). Eviction must be stopped first
/// ([`Manager::frozen`]). Each lock is waited for until `until`. Refused,
/// with nothing brought back, where that would take more than the memory
/// available (`MemAvailable`, and the store's own memory, freed as the
/// pages leave it). The bytes brought back.
pub(crate) fn bring_all_back(g: &Global, until: std::time::Instant) -> Result<u64, String> {
    let mut m = lock_until(&g.mgr, until).ok_or_else(lock_stayed_taken)?;
    // A batch in flight may have released pages it has not committed yet.
    while m.evicting() > 0 {
        drop(m);
        // The evictor may be waiting for a fault service to protect its
        // victims (see `near`).
        near::take_posted();
        std::thread::sleep(std::time::Duration::from_micros(50));
        m = lock_until(&g.mgr, until).ok_or_else(lock_stayed_taken)?;
    }
    let used = used(g, &*lock_until(&g.pages, until).ok_or_else(lock_stayed_taken)?);
    let need = stored_bytes(&m);
    let room = mem_available().saturating_add(m.store().stats().memory_used);
    if need > room {
        return Err(format!(
            "bringing the {} MiB of evicted pages back would take more than the {} MiB of memory available",
            need >> 20,
            room >> 20
        ));
    }
    m.bring_back(&used, &g.stats).map_err(|e| e.to_string())?;
    Ok(need)
}

/// How long a hold (`ztier hold`) lasts unless renewed. `ztier hold`
/// renews it every second, so eviction resumes at most this long after
/// its holder is gone, even one killed with `SIGKILL`.
pub const HOLD_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a hold's bring-back waits for the library's locks.
const HOLD_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A `"hold"` request from process `by` (see [`answer_ctl`]): no eviction
/// from now until its lease runs out ([`HOLD_LEASE`]), and every stored
/// page brought back first, so that a debugger or profiler reading the
/// process from outside (`ptrace`, `/proc/PID/mem`, `process_vm_readv`)
/// can read them: the kernel serves no userfaultfd fault of another
/// process's access, and such a read of an evicted page fails (`EIO`,
/// `EFAULT`). The answer is sent once the pages are back. A renewal, or
/// a hold beside another's, has nothing to bring back.
fn hold(g: &Global, by: i32) -> String {
    let new = lock(&g.mgr).hold(by, std::time::Instant::now() + HOLD_LEASE);
    let brought = if new {
        match bring_all_back(g, std::time::Instant::now() + HOLD_LOCK_WAIT) {
            Ok(bytes) => bytes,
            Err(why) => {
                lock(&g.mgr).release_holds(Some(by), std::time::Instant::now());
                return format!(
                    "{{\"{}\":\"{}\"}}\n",
                    control::reply::ERROR,
                    why.replace('\\', "\\\\").replace('"', "\\\"")
                );
            }
        }
    } else {
        0
    };
    held_json(g, control::HOLD, brought)
}

/// A `"release"` request from process `by`: its hold ends (eviction
/// resumes once no other is in force).
fn release(g: &Global, by: i32) -> String {
    lock(&g.mgr).release_holds(Some(by), std::time::Instant::now());
    held_json(g, control::RELEASE, 0)
}

/// The answer to a hold or release (`request`).
fn held_json(g: &Global, request: &[u8], brought: u64) -> String {
    let holders = lock(&g.mgr).holders();
    let request = String::from_utf8_lossy(request);
    format!(
        "{{\"{}\":\"{request}\",\"{}\":{},\"{}\":{},\"{}\":{holders:?},\"{}\":{brought},\"{}\":{},\"{}\":{}}}\n",
        control::reply::REQUEST,
        stats::PID,
        std::process::id(),
        control::reply::HELD,
        !holders.is_empty(),
        stats::HELD_BY,
        control::reply::BROUGHT_BACK_BYTES,
        stats::RESIDENT_BYTES,
        g.stats.resident.load(Ordering::Relaxed) * PAGE,
        stats::BUDGET_BYTES,
        g.cfg.budget_pages * PAGE,
    )
}

fn unlock_all() {
    FORK_GUARDS.with(|f| drop(f.borrow_mut().take()));
}

extern "C" fn fork_parent() {
    if STATE.load(Ordering::Acquire) != READY {
        return;
    }
    FORK_PREPARED.store(false, Ordering::Release);
    let g = GLOBAL.get().expect("ready");
    FORK_GUARDS.with(|f| f.borrow_mut().as_mut().expect("fork_prepare ran").1.parent_after_fork());
    unlock_all();
    g.stats.forks.fetch_add(1, Ordering::Relaxed);
    // Back under the budget at once (if the spill file could not be
    // copied for the child, its pages came back for the fork).
    let r = lock(&g.mgr).evict(&g.stats);
    if let Err(e) = r {
        eprintln!("ztier: evicting after fork failed: {e}: aborting");
        std::process::abort();
    }
    sys::sigprocmask(libc::SIG_SETMASK, FORK_MASK.with(Cell::get));
    let _ = INSIDE.try_with(|c| c.set(false));
    sud::rearm();
}

extern "C" fn fork_child() {
    if STATE.load(Ordering::Acquire) != READY {
        return;
    }
    FORK_PREPARED.store(false, Ordering::Release);
    let g = GLOBAL.get().expect("ready");
    FORK_GUARDS.with(|f| {
        let mut f = f.borrow_mut();
        let (_, m, pages) = f.as_mut().expect("fork_prepare ran");
        if let Err(e) = m.reopen_after_fork(&used(g, pages)) {
            eprintln!("ztier: the forked child cannot manage its memory: {e}: aborting");
            std::process::abort();
        }
        USER_MODE_ONLY.store(m.uffd.user_mode_only, Ordering::Relaxed);
        if m.uffd.user_mode_only && !sud::active() {
            // The parent had a full-mode userfaultfd, the child (forked
            // after the program dropped root, with no /dev/userfaultfd
            // kept) only a user-mode-only one: the kernel's own faults
            // fail there unless system calls are caught.
            if let Err(e) = sud::install(m.uffd.sigbus) {
                eprintln!(
                    "ztier: the forked child has only a user-mode-only userfaultfd and cannot catch its \
                     system calls ({e}): aborting"
                );
                std::process::abort();
            }
        }
        // SAFETY: gettid has no preconditions.
        m.kept_after_fork(FORKING_TID.load(Ordering::Relaxed), unsafe { libc::gettid() });
        m.wipe_after_fork(&g.stats);
        m.unlock_after_fork();
        shim::unlock_after_fork();
        g.stats.reset(m.resident());
        m.inherit_store(&g.stats);
        g.stats.forked_child.store(1, Ordering::Relaxed);
    });
    unlock_all();
    // The child starts with one handler, as a process does, on the
    // parent's library stacks.
    stacks_after_fork();
    MORE_HANDLERS.store(false, Ordering::Relaxed);
    HANDLER_THREADS.store(0, Ordering::Relaxed);
    // The parent's eventfd and control socket, which no thread of the
    // child uses (its own are made next).
    for fd in [EVICTOR_FD.swap(-1, Ordering::Relaxed), CTL_FD.swap(-1, Ordering::Relaxed)] {
        if fd >= 0 {
            fds::forget(fd);
            sys::raw(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
        }
    }
    // Its own statistics file (the parent's descriptor is closed).
    OWN_PID.store(std::process::id() as i32, Ordering::Relaxed);
    as_inside(open_stats);
    let late = LATE_INSTANCES.load(Ordering::Acquire);
    if OWN_MALLOC.load(Ordering::Acquire) && late > 0 {
        // The threads start after the program's handlers (its allocator's
        // among them) have run: see `fork_child_late`.
        LATE_COUNTDOWN.store(late, Ordering::Release);
        return;
    }
    child_threads(g, true);
}

/// In a forked child whose threads are still to start: the
/// [`fork_child_late`] registrations still to run (the last starts them).
static LATE_COUNTDOWN: AtomicU32 = AtomicU32::new(0);

/// The last `child` handler of a fork (see [`__register_atfork`]): for a
/// program with a `malloc` of its own, starts the child's threads,
/// which [`fork_child`] left for now. glibc's `pthread_create` allocates
/// with the program's `calloc`, whose locks the allocator's own `prepare`
/// handler took before the fork and only its `child` handler, run after
/// [`fork_child`], gives back: rustc's forked child waited on jemalloc's
/// lock for ever. Between the two, the program's handlers touch what
/// their `prepare` touched, which was resident at the fork (faults there
/// would wait for a handler thread not started yet).
extern "C" fn fork_child_late() {
    // The child has one thread: no other changes the count meanwhile.
    let left = LATE_COUNTDOWN.load(Ordering::Acquire);
    if left == 0 {
        return;
    }
    LATE_COUNTDOWN.store(left - 1, Ordering::Release);
    if left > 1 {
        return;
    }
    let _ = INSIDE.try_with(|c| c.set(true));
    let g = GLOBAL.get().expect("ready");
    child_threads(g, true);
}

/// glibc's `_Fork` (2.34 on): a `fork` that runs no `pthread_atfork`
/// handlers, for a program that forks where only async-signal-safe calls
/// may follow. The child's memory leaves the parent's userfaultfd at the
/// fork all the same, so the library runs its own handlers around it
/// ([`fork_prepare`], then [`fork_parent`] or [`fork_child`]): without
/// them the child read zeros from every evicted page, silently
/// (`cli_run_modes::a_child_of_fork_without_handlers_sees_its_memory`).
/// For a program with a `malloc` of its own the child's threads are not
/// started: their `pthread_create` would call that allocator, whose
/// locks another thread may have held at the fork (its own `prepare`
/// handler did not run); its faults are served in the faulting thread
/// (the signal path, which such a program takes), and it keeps to its
/// budget by evicting as it faults.
///
/// `_Fork` is async-signal-safe, and programs call it from signal
/// handlers (a crash handler starting a reporter). A handler that
/// interrupted the library's code in the same thread would wait for
/// ever for a lock that thread holds (`fork_in_handler.c`: `SIGALRM`
/// every 2 ms calling `_Fork` while the program allocates hung in every
/// mode). That lock may also be glibc's allocator's: the library's
/// `free` or `realloc` of a block glibc made before the library started
/// runs glibc's, and the handlers allocate — the parent waited for ever
/// in glibc's `malloc`, or the child did, on its copy of the lock taken
/// (one run in about a hundred of `fork_in_handler.c`'s first part,
/// every run of its second). So from a handler over library code
/// ([`sud::in_library`], or a small-block class's lock held by this
/// thread, see [`prepare_fork_by`]) the fork is made at once without the
/// library's handlers, as glibc's `_Fork` alone would; elsewhere the
/// library's locks are waited for as `fork` waits (they were waited for
/// 100 ms at most, and under load a child was made without the handlers
/// while an eviction was in flight: it read zeros). The log says once
/// that such a child reads zeros from evicted memory (one that only
/// calls `exec` or `_exit`, as such a child may, loses nothing).
/// Left: another thread inside glibc's allocator at the fork (`_Fork`
/// does not take its locks, as `fork` does) leaves the child's copy of
/// that lock taken, and the child's handlers allocate.
///
/// # Safety
/// The C contract of `_Fork`.
#[no_mangle]
pub unsafe extern "C" fn _Fork() -> libc::pid_t {
    static REAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"_Fork".as_ptr()) } as usize;
        REAL.store(f, Ordering::Relaxed);
    }
    if f == 0 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: glibc's `_Fork`, found above, which takes no arguments.
    let real = || unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> libc::pid_t>(f)() } as i64;
    if sud::in_library() || !prepare_fork_by(true) {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            let msg: &[u8] = b"ztier: _Fork was called from a signal handler that interrupted ztier's code \
                in the same thread: its child was made without ztier's fork handlers, and reads zeros from \
                evicted memory";
            notice(format_args!("{}", std::str::from_utf8(msg).unwrap_or("")));
        }
        // Not caught as a fork of the program's own (`fork_unseen` would
        // make it with the handlers after all).
        sud::allow();
        let pid = real();
        sud::rearm();
        return pid as libc::pid_t;
    }
    fork_around_prepared(real) as libc::pid_t
}

/// How long [`_Fork`] waits for a small-block class's lock taken with no
/// holder recorded (see [`take_class_unless_held_here`]).
const FORK_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A fork that no `pthread_atfork` handler sees, made by `fork` (which
/// returns what the fork returned: the child's pid, 0 in the child, or
/// a failure), with the library's own handlers around it. A program
/// with a `malloc` of its own starts none of the library's threads in
/// the child (see [`_Fork`]).
fn fork_around(fork: impl FnOnce() -> i64) -> i64 {
    fork_prepare();
    fork_around_prepared(fork)
}

/// The rest of [`fork_around`], once [`fork_prepare`]'s work is done.
fn fork_around_prepared(fork: impl FnOnce() -> i64) -> i64 {
    let r = fork();
    if r == 0 {
        in_forked_child();
    } else {
        // The parent, also when the fork failed.
        fork_parent();
    }
    r
}

/// The child's side of [`fork_around`]: [`fork_child`] and, for a
/// program with a `malloc` of its own, the threads that no `child`
/// handler starts here (`fork_child_late`), nor should any.
fn in_forked_child() {
    fork_child();
    if LATE_COUNTDOWN.swap(0, Ordering::AcqRel) > 0 {
        child_threads(GLOBAL.get().expect("ready"), false);
    }
}

/// The start of a child of [`clone`], on the stack the library mapped
/// for it: the program's function, argument and stack.
#[repr(C)]
struct CloneStart {
    f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
    stack: usize,
}

/// The stack a child of [`clone`] runs the library's fork handling on
/// before the program's function (which may have been given a small one).
const CLONE_START_STACK: usize = 256 << 10;

/// glibc's `clone(fn, stack, flags, arg, ...)`: the program's function
/// `fn` run in a new task on `stack`. Without `CLONE_VM` that task is a
/// new process with a copy of this memory — a fork no `pthread_atfork`
/// handler sees, and whose system call starts the child on another
/// stack, so that dispatch does not make it either (`fork_unseen` takes
/// forks in place only): its child read zeros from every evicted page,
/// in every mode. Here it is made inside the library's fork handlers: the
/// child starts on a stack the library maps (out of the arena, unmapped
/// again in the parent), runs [`in_forked_child`] there, then the
/// program's function on the program's stack, and ends the process with
/// what that returns (its statistics written), as glibc's child's `exit`
/// does natively (with `CLONE_VFORK` the parent waits in the kernel
/// meanwhile, holding the library's locks, until the child execs or
/// ends). A clone that shares memory (`CLONE_VM`: a thread, a `vfork`),
/// or a new process that shares this one's descriptors (`CLONE_FILES`: the child closes the parent's
/// descriptors of the library) or takes thread-local storage of its own
/// (`CLONE_SETTLS`: the library's per-thread state would not be there)
/// is passed to glibc as it is.
///
/// ```text
///   parent: prepare ─ glibc clone(start, library stack, flags) ─ parent handler ─ unmap
///   child:            start: fork_child ─► switch to the program's stack ─► fn(arg) ─► exit_group
/// ```
///
/// # Safety
/// The C contract of `clone`.
#[no_mangle]
pub unsafe extern "C" fn clone(
    f: Option<extern "C" fn(*mut libc::c_void) -> libc::c_int>,
    stack: *mut libc::c_void,
    flags: libc::c_int,
    arg: *mut libc::c_void,
    ptid: *mut libc::pid_t,
    tls: *mut libc::c_void,
    ctid: *mut libc::pid_t,
) -> libc::c_int {
    type Real = unsafe extern "C" fn(
        Option<extern "C" fn(*mut libc::c_void) -> libc::c_int>,
        *mut libc::c_void,
        libc::c_int,
        *mut libc::c_void,
        ...
    ) -> libc::c_int;
    static REAL: [AtomicUsize; 1] = [AtomicUsize::new(0)];
    let p = direct::real(&REAL, 0, "clone\0");
    // SAFETY: glibc's `clone`, a variadic function of this type.
    let real = unsafe { std::mem::transmute::<usize, Real>(p) };
    let shared = libc::CLONE_VM | libc::CLONE_FILES | libc::CLONE_SETTLS;
    let Some(program_fn) = f else {
        // SAFETY: the caller's arguments, passed on (glibc fails the call).
        return unsafe { real(f, stack, flags, arg, ptid, tls, ctid) };
    };
    if flags & shared != 0 || stack.is_null() || STATE.load(Ordering::Acquire) != READY {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real(f, stack, flags, arg, ptid, tls, ctid) };
    }
    let Some(base) = map_stack(CLONE_START_STACK) else {
        sys::set_errno(libc::ENOMEM);
        return -1;
    };
    let top = (base + CLONE_START_STACK - std::mem::size_of::<CloneStart>()) & !15;
    // SAFETY: `top` is in the mapping just made, aligned, with room above.
    unsafe { (top as *mut CloneStart).write(CloneStart { f: program_fn, arg, stack: stack as usize }) };
    extern "C" fn start(p: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the parent's `CloneStart`, in this child's copy of the
        // library's mapping.
        let s = unsafe { (p as *const CloneStart).read() };
        in_forked_child();
        // SAFETY: the program's function on the program's stack, as glibc
        // would have called it.
        let r = unsafe { sigstack::call_on_stack(s.stack, s.f as usize, s.arg) };
        // glibc's child would leave by `exit`, which ends the process
        // natively (its only thread) but here would leave the library's
        // threads running: the whole process ends, statistics written.
        end(r as libc::c_int)
    }
    fork_prepare();
    // SAFETY: glibc's clone with the library's start and stack; the rest
    // the caller's.
    let r = unsafe {
        real(Some(start), top as *mut libc::c_void, flags, top as *mut libc::c_void, ptid, tls, ctid)
    };
    // Only the parent comes back here (the child exits from glibc's
    // clone), also when the clone failed.
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    fork_parent();
    sys::munmap((base - PAGE) as *mut libc::c_void, CLONE_START_STACK + PAGE);
    if r < 0 {
        sys::set_errno(errno);
    }
    r
}

/// A fork the program makes by its own system call (`syscall(SYS_fork)`,
/// a `clone` without `CLONE_VM` on the caller's stack), caught by
/// dispatch (`sud`) or, without dispatch, by the library's `syscall`
/// export (`direct`): made here, the system call `nr` with `a`, inside
/// the library's fork handlers ([`fork_around`]), as `_Fork`'s is. Its
/// child read zeros from every evicted page before. `None` (the caller
/// lets the program's own instruction make it) for the fork of glibc's
/// `fork` or of the library's `_Fork`, whose handlers have run in this
/// thread ([`FORK_PREPARED`]), or before the library has started. Without
/// dispatch (the handler thread in full mode), a fork made by a
/// `syscall` instruction of the program's own (not through glibc's
/// `syscall` function) is still not seen.
pub(crate) fn fork_unseen(nr: i64, a: [u64; 6]) -> Option<i64> {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    let prepared = FORK_PREPARED.load(Ordering::Acquire) && FORKING_TID.load(Ordering::Relaxed) == me;
    if STATE.load(Ordering::Acquire) != READY || prepared {
        return None;
    }
    Some(fork_around(|| sys::raw(nr, a)))
}

/// The end of [`fork_child`]: the child's threads (if `threads`), back
/// under the budget, system calls caught again, the program's signal
/// mask.
fn child_threads(g: &Global, threads: bool) {
    if threads {
        spawn_handlers();
    }
    // Back under the budget at once (if the spill file could not be
    // copied for the child, its pages came back for the fork; the rest
    // the child inherited as the parent had them).
    let r = lock(&g.mgr).evict(&g.stats);
    if let Err(e) = r {
        eprintln!("ztier: evicting in a forked child failed: {e}: aborting");
        std::process::abort();
    }
    if let Err(e) = sud::enable_after_fork() {
        eprintln!("ztier: the forked child cannot protect its system calls: {e}: aborting");
        std::process::abort();
    }
    sys::sigprocmask(libc::SIG_SETMASK, FORK_MASK.with(Cell::get));
    let _ = INSIDE.try_with(|c| c.set(false));
    sud::rearm();
}
