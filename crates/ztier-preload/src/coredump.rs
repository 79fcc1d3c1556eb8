//! Core dumps of a program run under `ztier run`: every page of its heap
//! in the core, and nothing of the arena it never used.
//!
//! Two things would make a crashing program's core wrong:
//!
//! - **The arena's reservation.** The kernel dumps a mapping whole: what
//!   was never touched is a hole in the file, but the file is as long as
//!   the mapping. A 64 MiB program that aborted left a core of 69 GB
//!   (13 MB on disk), took 2 s of system time to dump, and a
//!   `core_pattern` pipe (systemd-coredump, apport) would have read all
//!   of it, zeros included. So the arena is `MADV_DONTDUMP` but for what
//!   was ever handed out: each region (spans, pages) is dumped up to its
//!   high-water mark, rounded up to [`STEP`] (8 MiB) ([`DumpFront`]), so the
//!   arena is four mappings to the kernel:
//!
//! ```text
//!  arena: [ spans used | spans never used ][ pages used | pages never used ]
//!          dumped        MADV_DONTDUMP      dumped       MADV_DONTDUMP
//!                      ^ front, in  8 MiB steps     ^ front, in  8 MiB steps
//! ```
//!
//! - **Evicted pages.** A page kept compressed is missing from the
//!   mapping, and a dumping task's fault on a userfaultfd range is not
//!   served (the kernel gives up at once for a task that dumps core): the
//!   page is a hole, zeros in the core. So where cores are written
//!   (`RLIMIT_CORE` above zero, or a `core_pattern` pipe, which the limit
//!   does not stop unless it is 1), the library installs a handler for
//!   each signal whose default action dumps core and whose action is
//!   still the default when the library starts ([`install`]):
//!
//! ```text
//!  program thread: SIGSEGV, abort()'s SIGABRT, Ctrl-\ …
//!    └─► on_core_signal (the library's signal stack where it has one)
//!          crash inside ztier's own code?  then no: said in the log
//!          the manager's lock (waited for at most 2 s), no eviction from now on
//!          an eviction in flight commits; every stored page back (spill file too)
//!          the default action back; the same signal and siginfo sent again
//!    ◄── return: the kernel takes the default action: a core with every page
//! ```
//!
//! With `--fault-path signal` or a user-mode-only userfaultfd, `SIGBUS`
//! and `SIGSYS` are the library's already; one that is the program's and
//! finds its default action does the same before the default is taken
//! (`sud::chain`). Where bringing the pages back would not fit in the
//! memory available, or the manager's lock is not had in time, the core
//! is written without them and the log says how much it misses.
//!
//! The program's own actions come first: a handler it installs replaces
//! the library's, and decides. The program is shown `SIG_DFL` where the
//! library's handler is, and a default it puts back is the library's
//! handler again — under syscall user dispatch (`--fault-path signal`, a
//! user-mode-only userfaultfd) by `sud`'s `rt_sigaction`, in the default
//! thread path by the exported [`sigaction`] and [`signal`] (glibc's
//! `sigset`, `bsd_signal` and a raw `rt_sigaction` are not seen there).
//! Shown its own handler, a program that chains to the action it found
//! would call it for a crash of its own: the JVM does that before it
//! writes its `hs_err` report, which would then never be written.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::sys::raw;

/// The signals whose default action dumps core (signal(7)).
const CORE_SIGNALS: [libc::c_int; 10] = [
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGSEGV,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
];

/// How far a region is made dumpable at a time: each step is one
/// `madvise`, and the part past the high-water mark it leaves dumpable
/// is at most this (holes in the core file).
pub const STEP: usize = 8 << 20;

/// The dumpable part of one region of the arena: `[start, mark)`, grown
/// as the region's high-water mark passes it.
pub struct DumpFront {
    mark: AtomicUsize,
    end: usize,
}

impl DumpFront {
    /// A region `[start, end)`, nothing of it dumpable yet.
    pub fn new(start: usize, end: usize) -> DumpFront {
        DumpFront { mark: AtomicUsize::new(start), end }
    }

    /// The region is used up to `upto` (an address): make it dumpable
    /// that far. One atomic load when it already is.
    #[inline]
    pub fn reach(&self, upto: usize) {
        let mut mark = self.mark.load(Ordering::Relaxed);
        while upto > mark {
            let next = (upto - mark).next_multiple_of(STEP).saturating_add(mark).min(self.end);
            match self.mark.compare_exchange_weak(mark, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    // Failure leaves that part out of a core, no more.
                    raw(
                        libc::SYS_madvise,
                        [mark as u64, (next - mark) as u64, libc::MADV_DODUMP as u64, 0, 0, 0],
                    );
                    return;
                }
                Err(m) => mark = m,
            }
        }
    }
}

/// Leaves the whole arena out of core dumps (the fronts then bring the
/// used parts back in).
pub fn exclude(base: usize, len: usize) {
    raw(libc::SYS_madvise, [base as u64, len as u64, libc::MADV_DONTDUMP as u64, 0, 0, 0]);
}

/// `core_pattern` is a pipe (read at [`install`]).
static PIPE: AtomicBool = AtomicBool::new(false);

/// Would a core be written for this process now?
fn cores_written() -> bool {
    // Raw calls: this runs in a signal handler, where under dispatch
    // glibc's would each take a dispatch signal.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    let r = raw(libc::SYS_prlimit64, [0, libc::RLIMIT_CORE as u64, 0, &mut lim as *mut _ as u64, 0, 0]);
    if r != 0 {
        return false;
    }
    // A pipe ignores the limit, but for 1, which turns it off.
    let limit_allows = if PIPE.load(Ordering::Relaxed) { lim.rlim_cur != 1 } else { lim.rlim_cur > 0 };
    limit_allows && raw(libc::SYS_prctl, [libc::PR_GET_DUMPABLE as u64, 0, 0, 0, 0, 0]) > 0
}

/// Installs [`on_core_signal`] for each signal that dumps core, is not
/// the library's own (`sud::taken`) and still has its default action —
/// where cores are written at all. Called once the library is up (after
/// `sud::install`).
pub fn install() {
    let pattern = std::fs::read("/proc/sys/kernel/core_pattern").unwrap_or_default();
    PIPE.store(pattern.first() == Some(&b'|'), Ordering::Relaxed);
    if !cores_written() {
        return;
    }
    for sig in CORE_SIGNALS {
        if !crate::sudstate::taken(sig)
            && crate::sudstate::action_of(sig) == Some(libc::SIG_DFL as u64)
            && crate::sudstate::set_library_action(sig, on_core_signal, MASK)
        {
            INSTALLED.fetch_or(1 << sig, Ordering::Relaxed);
        }
    }
}

/// What [`on_core_signal`] blocks while it runs.
const MASK: u64 = crate::sys::ASYNC_SIGNALS;

/// The signals [`install`] took (bit `sig`).
static INSTALLED: AtomicU64 = AtomicU64::new(0);

/// Is `handler` the library's core handler (shown to the program as the
/// default)?
pub fn is_handler(handler: u64) -> bool {
    handler == on_core_signal as *const () as usize as u64
}

/// The library's core handler and its mask, if it stands for the default
/// action of `sig` (under syscall user dispatch a program that puts the
/// default back gets it).
pub fn handler_for(
    sig: libc::c_int,
) -> Option<(extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void), u64)> {
    ((1..64).contains(&sig) && INSTALLED.load(Ordering::Relaxed) & (1 << sig) != 0)
        .then_some((on_core_signal as extern "C" fn(_, _, _), MASK))
}

/// A signal that dumps core, with its default action: every stored page
/// back first, then the default action and the signal again.
extern "C" fn on_core_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's ucontext for this signal.
    let sp = unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RSP as usize] } as usize;
    let _entry = crate::sigstack::Entry::new(sp);
    before_core(sig);
    crate::sudstate::set_default(sig);
    // The same siginfo again, to this thread: delivered when this handler
    // returns and the signal is unblocked, with the default action (a
    // fault's signal would come again anyway when the access is retried).
    // `info` is the kernel's for this signal.
    let (pid, tid) = (raw(libc::SYS_getpid, [0; 6]), raw(libc::SYS_gettid, [0; 6]));
    raw(libc::SYS_rt_tgsigqueueinfo, [pid as u64, tid as u64, sig as u64, info as u64, 0, 0]);
}

/// Brings every stored page of this process back before a core is
/// dumped for `sig`, and stops evictions; says in the log what the core
/// will miss when it cannot.
pub fn before_core(sig: libc::c_int) {
    if !crate::ready() || !cores_written() {
        return;
    }
    if crate::sudstate::in_library() {
        // The library's own code (its locks, or glibc's allocator's, may
        // be held by this thread).
        say(sig, "the crash came inside ztier's own code");
        return;
    }
    let _allow = crate::sudstate::Allow::new();
    if let Err(why) = crate::as_inside(bring_back) {
        say(sig, &why);
    }
}

/// Says in the log ([`crate::notice`]) what the core will miss, and why — without allocating:
/// the crashing thread may hold glibc's allocator's lock.
fn say(sig: libc::c_int, why: &str) {
    let stored = crate::GLOBAL.get().and_then(|g| g.mgr.try_lock().ok().map(|m| crate::stored_bytes(&m)));
    let pid = raw(libc::SYS_getpid, [0; 6]);
    match stored {
        Some(b) => crate::notice(format_args!(
            "ztier: process {pid}: signal {sig}: the core dump will miss {} MiB of evicted pages: {why}",
            b >> 20
        )),
        None => crate::notice(format_args!(
            "ztier: process {pid}: signal {sig}: the core dump will miss its evicted pages: {why}"
        )),
    }
}

/// How long a crashing thread waits for the manager's lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn bring_back() -> Result<(), String> {
    let g = crate::GLOBAL.get().ok_or("not started")?;
    let until = std::time::Instant::now() + LOCK_WAIT;
    // No eviction from now on, as under `mlockall` (nothing brought back).
    crate::lock_until(&g.mgr, until)
        .ok_or_else(crate::lock_stayed_taken)?
        .lock_all(true, &[], &g.stats)
        .map_err(|e| e.to_string())?;
    crate::bring_all_back(g, until).map(|_| ())
}

/// glibc's `sigaction` and `signal`, looked up when the library is loaded
/// (`sigaction` is called from signal handlers, where `dlsym` is not
/// safe), or at the first call before that.
static REAL: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
const NAMES: [&std::ffi::CStr; 2] = [c"sigaction", c"signal"];

fn real(i: usize) -> usize {
    match REAL[i].load(Ordering::Relaxed) {
        0 => {
            // SAFETY: dlsym with a NUL-terminated name.
            let p = unsafe { libc::dlsym(libc::RTLD_NEXT, NAMES[i].as_ptr()) } as usize;
            if p == 0 {
                // SAFETY: a static message to stderr.
                unsafe { libc::write(2, c"ztier: glibc's sigaction not found\n".as_ptr().cast(), 35) };
                std::process::abort();
            }
            REAL[i].store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

extern "C" fn look_up() {
    real(0);
    real(1);
}

#[used]
#[link_section = ".init_array"]
static LOOK_UP: extern "C" fn() = look_up;

/// Does the library's core handler stand for the default of `sig`, with
/// no one else to show it (no dispatch)?
fn standing(sig: libc::c_int) -> bool {
    handler_for(sig).is_some() && !crate::sudstate::active()
}

/// `sigaction(2)`: glibc's, except for a signal whose default action the
/// library's core handler stands for ([`handler_for`], default thread
/// path): that handler is shown as `SIG_DFL`, and `SIG_DFL` installs it;
/// and in a `vfork` child, for a signal the library keeps from the
/// program ([`crate::sudstate::child_sigaction`]).
///
/// # Safety
/// The C contract of `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    type F = unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;
    // SAFETY: glibc's sigaction, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, F>(real(0)) };
    if let Some(r) = crate::sudstate::child_sigaction(sig, old) {
        return r;
    }
    if !standing(sig) {
        // SAFETY: the caller's arguments.
        return unsafe { f(sig, act, old) };
    }
    if !old.is_null() {
        // SAFETY: the caller's out-parameter.
        let r = unsafe { f(sig, std::ptr::null(), old) };
        if r != 0 {
            return r;
        }
        // SAFETY: filled just now.
        if is_handler(unsafe { (*old).sa_sigaction } as u64) {
            // SAFETY: as above; all zeros is SIG_DFL with no flags or mask.
            unsafe { old.write(std::mem::zeroed()) };
        }
    }
    if act.is_null() {
        return 0;
    }
    // SAFETY: the caller's action.
    if unsafe { (*act).sa_sigaction } == libc::SIG_DFL {
        let (h, mask) = handler_for(sig).expect("standing");
        return if crate::sudstate::set_library_action(sig, h, mask) { 0 } else { -1 };
    }
    // SAFETY: the caller's action.
    unsafe { f(sig, act, std::ptr::null_mut()) }
}

/// `signal(2)`: glibc's, except as for [`sigaction`] (with glibc's BSD
/// semantics: `SA_RESTART`, the signal blocked in its handler).
///
/// # Safety
/// The C contract of `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: all zeros is a valid sigaction.
    let mut kept: libc::sigaction = unsafe { std::mem::zeroed() };
    if crate::sudstate::child_sigaction(sig, &mut kept).is_some() {
        return kept.sa_sigaction;
    }
    if !standing(sig) {
        type F = unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
        // SAFETY: glibc's signal, which has this signature.
        return unsafe { std::mem::transmute::<usize, F>(real(1))(sig, handler) };
    }
    // SAFETY: all zeros is a valid sigaction; the set functions fill it.
    let (mut act, mut old): (libc::sigaction, libc::sigaction) = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: a set of ours; `sig` is in range (`standing`).
    unsafe { libc::sigaddset(&mut act.sa_mask, sig) };
    // SAFETY: pointers to the two locals.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
