//! The state of Syscall User Dispatch that the rest of the library reads
//! (the dispatch itself, its handlers and the calls it makes are `sud`'s):
//! whether dispatch is on in this process and serves faults by `SIGBUS`,
//! each thread's selector byte and its nesting of library code
//! ([`Allow`], [`in_library`]), and the signal actions the library keeps
//! from the program (`SIGSYS`, `SIGBUS`: [`taken`], [`child_sigaction`])
//! or installs for itself ([`set_library_action`]). Below `sud` and
//! every module that only asks "is dispatch on", "am I in library code"
//! or sets an action of the library's (`coredump`).

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sys::{raw, ztier_sud_sigaction_return};

pub(crate) const ALLOW: u8 = 0;

pub(crate) const BLOCK: u8 = 1;

pub(crate) const SA_RESTORER: u64 = 0x0400_0000;

/// Dispatch is on for the program's threads (user-mode-only userfaultfd).
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Faults are served by our `SIGBUS` handler (`--fault-path signal`).
pub(crate) static SIGBUS_ON: AtomicBool = AtomicBool::new(false);

/// The program's own `SIGSYS` action (kernel layout: handler, flags,
/// restorer, mask), kept while ours is installed.
pub(crate) static PROGRAM_SIGSYS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// The program's own `SIGBUS` action, kept while ours is installed.
pub(crate) static PROGRAM_SIGBUS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

thread_local! {
    /// The selector byte the kernel reads at each system call.
    pub(crate) static SELECTOR: UnsafeCell<u8> = const { UnsafeCell::new(ALLOW) };
    /// Dispatch is enabled for this thread.
    pub(crate) static ENABLED: Cell<bool> = const { Cell::new(false) };
    /// Nesting of the dispatch handler on this thread.
    pub(crate) static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Nesting of [`Allow`] guards on this thread (counted in every
    /// mode: [`in_library`] reads it without dispatch too).
    pub(crate) static GUARDS: Cell<u32> = const { Cell::new(0) };
    /// A handler of the program runs on this thread over library code
    /// that may hold locks (`sud`'s `ProgramLevel`, [`in_library`]).
    pub(crate) static OVER_LIBRARY: Cell<bool> = const { Cell::new(false) };
    /// The thread id this thread enabled dispatch under (a `vfork` child,
    /// which shares the thread-local state, has another).
    pub(crate) static TID: Cell<i64> = const { Cell::new(0) };
}

/// The kernel's `struct sigaction` (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct KSigaction {
    pub(crate) handler: u64,
    pub(crate) flags: u64,
    pub(crate) restorer: u64,
    pub(crate) mask: u64,
}

pub(crate) fn bit(sig: libc::c_int) -> u64 {
    1 << (sig - 1)
}

pub(crate) fn selector() -> *mut u8 {
    SELECTOR.with(|s| s.get())
}

pub(crate) fn set_selector(v: u8) {
    // SAFETY: this thread's own selector byte.
    unsafe { selector().write_volatile(v) }
}

/// Are faults served by the `SIGBUS` handler (`--fault-path signal`)?
pub fn sigbus_on() -> bool {
    SIGBUS_ON.load(Ordering::Relaxed)
}

/// Is dispatch on (this process's userfaultfd is user-mode-only)?
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The signals that must never be blocked or taken over by the program:
/// `SIGSYS` (dispatch) and, with `--fault-path signal`, `SIGBUS` (a
/// blocked synchronous `SIGBUS` kills the process).
pub(crate) fn ours() -> u64 {
    bit(libc::SIGSYS) | if SIGBUS_ON.load(Ordering::Relaxed) { bit(libc::SIGBUS) } else { 0 }
}

/// Is `sig` one of the library's own here ([`ours`]: the program's action
/// for it is kept aside)?
pub(crate) fn taken(sig: libc::c_int) -> bool {
    kept_slot(sig).is_some()
}

/// The kernel's handler for `sig` now (`None` if it cannot be read).
pub(crate) fn action_of(sig: libc::c_int) -> Option<u64> {
    let mut a = KSigaction::default();
    (raw(libc::SYS_rt_sigaction, [sig as u64, 0, &mut a as *mut _ as u64, 8, 0, 0]) == 0).then_some(a.handler)
}

/// Installs a handler of the library for `sig` (not one of [`ours`]),
/// with its frames on the library's signal stack and its return through
/// the region (so under dispatch too), blocking `mask` while it runs
/// (never ours). The program's later `rt_sigaction` replaces it.
pub(crate) fn set_library_action(sig: libc::c_int, handler: Handler, mask: u64) -> bool {
    let act = library_action(handler, mask);
    raw(libc::SYS_rt_sigaction, [sig as u64, &act as *const _ as u64, 0, 8, 0, 0]) == 0
}

pub(crate) type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

pub(crate) fn library_action(handler: Handler, mask: u64) -> KSigaction {
    KSigaction {
        handler: handler as *const () as usize as u64,
        flags: libc::SA_SIGINFO as u64 | SA_RESTORER | libc::SA_ONSTACK as u64,
        restorer: ztier_sud_sigaction_return as *const () as usize as u64,
        mask: mask & !ours(),
    }
}

/// Puts the default action back for `sig`.
pub(crate) fn set_default(sig: libc::c_int) {
    let dfl = KSigaction::default();
    raw(libc::SYS_rt_sigaction, [sig as u64, &dfl as *const _ as u64, 0, 8, 0, 0]);
}

/// The program's kept action for one of [`ours`].
pub(crate) fn kept_slot(sig: libc::c_int) -> Option<&'static [AtomicU64; 4]> {
    match sig {
        libc::SIGSYS => Some(&PROGRAM_SIGSYS),
        libc::SIGBUS if SIGBUS_ON.load(Ordering::Relaxed) => Some(&PROGRAM_SIGBUS),
        _ => None,
    }
}

pub(crate) fn kept(slot: &[AtomicU64; 4]) -> KSigaction {
    KSigaction {
        handler: slot[0].load(Ordering::Relaxed),
        flags: slot[1].load(Ordering::Relaxed),
        restorer: slot[2].load(Ordering::Relaxed),
        mask: slot[3].load(Ordering::Relaxed),
    }
}

pub(crate) fn keep(slot: &[AtomicU64; 4], a: &KSigaction) {
    for (s, v) in slot.iter().zip([a.handler, a.flags, a.restorer, a.mask]) {
        s.store(v, Ordering::Relaxed);
    }
}

/// Sets the selector back to BLOCK if this thread has dispatch on and is
/// not in library code or the dispatch handler.
pub fn rearm() {
    if ENABLED.with(Cell::get) && DEPTH.with(Cell::get) == 0 && GUARDS.with(Cell::get) == 0 {
        set_selector(BLOCK);
    }
}

/// Sets the selector to ALLOW for library code that runs outside an
/// [`Allow`] guard (the fork handlers) until [`rearm`].
pub fn allow() {
    if ENABLED.with(Cell::get) {
        set_selector(ALLOW);
    }
}

/// Library code: the selector is ALLOW while it lives; the last guard of
/// a thread sets it back to BLOCK (re-arming after a `clone`). Counted
/// in `GUARDS` with dispatch or without, for [`in_library`] — except a
/// [`hot`](Allow::hot) one without dispatch.
pub struct Allow {
    counted: bool,
}

impl Allow {
    /// Starts a stretch of library code.
    #[inline]
    pub fn new() -> Allow {
        let _ = GUARDS.try_with(|g| g.set(g.get() + 1));
        if active() && ENABLED.try_with(Cell::get).unwrap_or(false) {
            set_selector(ALLOW);
        }
        Allow { counted: true }
    }

    /// As [`new`](Allow::new), but counted only under dispatch: for the
    /// small blocks of `malloc` and `free`, which take a lock of the
    /// library's and nothing of glibc's (a `_Fork` from a handler over
    /// them, which would wait for that lock in vain, sees its holder
    /// recorded and forks without the library's handlers). Counting
    /// there without dispatch cost 8% of a `malloc`/`free` loop's time
    /// and 2–3% of the corpus builder's (`--budget 2G --fault-path
    /// thread`). Their other paths take a
    /// guard of [`new`](Allow::new) too.
    #[inline]
    pub fn hot() -> Allow {
        if active() {
            Allow::new()
        } else {
            Allow { counted: false }
        }
    }
}

impl Drop for Allow {
    #[inline]
    fn drop(&mut self) {
        if self.counted {
            let _ = GUARDS.try_with(|g| g.set(g.get().saturating_sub(1)));
        }
        if active() {
            rearm();
        }
    }
}

/// Does this thread run library code that may hold a lock — of the
/// library's, or of glibc's (its allocator's: the library's `free` of a
/// block glibc made before it started runs glibc's) — or a handler of
/// the program that interrupted such code (`sud`'s `ProgramLevel`)? With
/// dispatch or without (then not in the small blocks of `malloc` and
/// `free`: see [`Allow::hot`]). A signal handler that forks by `_Fork`
/// there must not wait for those locks (this thread holds them), nor
/// give the child work that allocates (glibc's lock stays taken in the
/// child's copy).
pub fn in_library() -> bool {
    GUARDS.try_with(Cell::get).unwrap_or(1) > 0
        || OVER_LIBRARY.try_with(Cell::get).unwrap_or(true)
        || crate::inside()
}

/// Is this task a `vfork` child of a thread with dispatch, in any
/// state of its selector (see `sud`'s `vfork_child`)?
pub(crate) fn in_vfork_child() -> bool {
    active() && ENABLED.with(Cell::get) && raw(libc::SYS_gettid, [0; 6]) != TID.with(Cell::get)
}

/// glibc's `sigaction` called in a `vfork` child for a signal the
/// library keeps from the program (`SIGSYS`; `SIGBUS` with `--fault-path
/// signal`): the child has no dispatch to show it the program's action,
/// and would see the library's handler. A child that resets every
/// handler it sees before its `exec` (CPython's `_posixsubprocess`) would
/// then set `SIGBUS` to its default, and its next read of an evicted
/// page would kill it. So the program's kept action is shown, and a new
/// one is not set (the kept actions are shared with the parent, and the
/// `exec` resets the child's anyway). `None` for any other signal or
/// task: glibc's function runs.
pub fn child_sigaction(sig: libc::c_int, old: *mut libc::sigaction) -> Option<libc::c_int> {
    let slot = kept_slot(sig)?;
    if !in_vfork_child() {
        return None;
    }
    if !old.is_null() {
        let k = kept(slot);
        // SAFETY: all zeros is a valid sigaction.
        let mut s: libc::sigaction = unsafe { std::mem::zeroed() };
        s.sa_sigaction = k.handler as usize;
        s.sa_flags = k.flags as libc::c_int;
        // SAFETY: the first word of a set of ours (the kernel's 64 signals).
        unsafe { (&mut s.sa_mask as *mut libc::sigset_t).cast::<u64>().write(k.mask) };
        // SAFETY: the caller's out-parameter.
        unsafe { old.write(s) };
    }
    Some(0)
}
