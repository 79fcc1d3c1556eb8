//! System calls that touch evicted memory, under a user-mode-only
//! userfaultfd or with faults served in the faulting thread
//! (`--fault-path signal`).
//!
//! An unprivileged user gets userfaultfd only with `UFFD_USER_MODE_ONLY`
//! (unless `vm.unprivileged_userfaultfd` is 1). In that mode only faults
//! taken in user mode reach the handler; a fault the *kernel* takes on
//! the program's behalf — `read()` into a heap buffer whose page was
//! evicted, `write()` from one, a path, an `iovec`, a futex word — fails
//! the system call with `EFAULT`. Unprotected, `sort` of a large file
//! under a tight budget stops with "read failed: Bad address".
//!
//! So in that mode every system call of the program's threads is caught
//! first, with Syscall User Dispatch (`PR_SET_SYSCALL_USER_DISPATCH`,
//! Linux 5.11): a system call made from outside a small code region of
//! this library, while the thread's selector byte says BLOCK, is not run
//! but raises `SIGSYS` in the thread. The handler makes the call's memory
//! arguments resident and pins them ([`crate::manager::Manager::pin`]),
//! runs the call from inside the region, unpins, and returns its result
//! in `rax`:
//!
//! ```text
//!  program thread                      SIGSYS handler (same thread)
//!  ──────────────                      ─────────────────────────────
//!  read(fd, buf, n) ── syscall ──►  selector ALLOW
//!   (selector BLOCK,                  buf ∩ arena: stored pages back, pinned
//!    outside the region)              ztier_sud_syscall6(read, …)  (in region)
//!                                     unpin; rax = result; selector BLOCK
//!  continues after the syscall ◄──  return through ztier_sud_sigaction_return (in region)
//! ```
//!
//! Which arguments are memory is known per call (below: buffers with a
//! length, paths, `iovec`s, `msghdr`s, argument vectors, fixed-size
//! structures). A call not in the table runs as is; if it fails with
//! `EFAULT` and an argument points into the arena, the pages there are
//! pinned and it runs again (up to three times, 2, 32 and 512 pages).
//! A `read`, `write`, `pread64` or `pwrite64` of more than a quarter of
//! the budget into the arena runs as several calls of at most that size
//! (stopping at a short one), so that what is pinned stays within the
//! budget.
//!
//! Calls the handler cannot run in its place:
//!
//! - `rt_sigreturn` (a signal handler of the program returning): the
//!   thread is sent to the region's own `rt_sigreturn` with its stack as
//!   it was.
//! - `clone`, `clone3`, `fork`, `vfork`: the new task must start where the
//!   program's code expects it, on its own stack. A fork (a new process
//!   on the caller's stack) that glibc's `fork` did not make, so that no
//!   fork handler ran, is made here inside the library's handlers
//!   ([`crate::fork_unseen`]; its child returns through this handler as
//!   the parent does). Otherwise the thread is sent back
//!   to its `syscall` instruction with the selector at ALLOW, so the call
//!   runs there; the selector goes back to BLOCK at the thread's next call
//!   into the library (`malloc` and friends, `pthread_create`, the fork
//!   handlers), which a program makes all the time. A `vfork`-like
//!   child (`posix_spawn`, `system`) runs without dispatch until its
//!   exec, so the environment it will pass is brought back first. A
//!   clone caught here that shares the memory and is not `vfork`-like
//!   starts a thread that did not come through the library's
//!   `pthread_create` (which runs glibc's with the selector at ALLOW, so
//!   its clones are never caught): glibc starting a thread by its
//!   internal `pthread_create` (`SIGEV_THREAD` timers, POSIX AIO,
//!   `mq_notify`), or the program's own `clone()`. A `clone3` with
//!   thread-local storage of its own and a stack outside the arena is
//!   made by the handler itself, so that the thread enables dispatch
//!   before anything else ([`clone_with_dispatch`], drawn there); any
//!   other runs as above, without dispatch in the child, which is said
//!   once in the log ([`warn_raw_thread`] has what such a thread loses).
//! - `execve` runs with the program's signal mask, not the handler's
//!   (the new program would start with `SIGSYS` blocked).
//! - `rt_sigprocmask` is applied to the mask the handler returns to, and
//!   `rt_sigaction` runs with `SIGSYS` taken out of the handler's mask:
//!   `SIGSYS` must never be blocked (a blocked dispatch signal kills the
//!   process). The program's own `SIGSYS` action is kept aside and called
//!   for `SIGSYS` that does not come from dispatch.
//!
//! **Entered directly.** The calls programs make most through glibc's
//! functions — `read`, `write`, the positioned and vectored ones,
//! `lseek`, `close`, `open`, the `stat` family, the socket calls,
//! `poll`, `select`, `epoll_wait`, sleeps, `syscall` itself (see
//! the `direct` module for the list) — are also exported by the library,
//! so a program (or a library such as CPython, SQLite or the JVM)
//! calling glibc's function reaches ours first: on a thread whose
//! selector says BLOCK, [`fast`] does the handler's work — the call's
//! memory pinned — and calls glibc's own function with the selector at
//! ALLOW, with no signal (a `SIGSYS` round trip is ~3–4 µs):
//!
//! ```text
//!  program: read(fd, buf, n) ──► ztier's read ──► selector BLOCK? ── no ─► glibc's read
//!                                                      │ yes
//!                                 pin buf ∩ arena; selector ALLOW; glibc's read
//!                                 unpin; selector BLOCK; errno kept
//! ```
//!
//! glibc's own internal calls (`fread` → `__read`, `pthread_mutex_lock`
//! → `futex`) bypass the exports and still take the signal; so do a read
//! or write long enough to be split into parts, and, through `syscall`,
//! the calls the handler runs itself (below).
//!
//! **The program's signal handlers.** Under dispatch every handler the
//! program installs (for a signal not of ours) is installed as
//! [`on_program_signal`], which calls it; `rt_sigaction` shows the
//! program its own. A signal can come while the selector is at ALLOW:
//! in a blocking call the library runs for the thread (the dispatch
//! handler's, or glibc's function entered directly), or in the library's
//! own code. The program's handler then runs at the program's level
//! ([`ProgramLevel`]): the selector at BLOCK, so that its own calls are
//! caught (the dispatch handler is `SA_NODEFER`, so such a call nests
//! inside it), and the thread's library state (guards, dispatch depth,
//! inside) as in the program's code; all of it is put back when it
//! returns. A signal that finds the thread holding the manager's lock
//! (`crate::Held`: a handler could touch an evicted page, whose service
//! needs that lock) is put aside and queued again with its siginfo when
//! the lock is let go ([`hold`], [`let_go`]). A one-shot handler
//! (`SA_RESETHAND`) is put aside too: the kernel is not told it is one
//! shot, and the default action is put back when the handler is run
//! ([`reset_one_shot`]), not when the signal is delivered.
//!
//! The library's own code runs with the selector at ALLOW ([`Allow`], at
//! every exported entry point): it must not wait for a pin (it may hold
//! the manager's lock). Threads of the library never enable dispatch. A
//! new thread does not inherit it, so `pthread_create`'s start routine
//! enables it, and a forked child's fork handler.
//!
//! **`--fault-path signal`.** The userfaultfd is opened with
//! `UFFD_FEATURE_SIGBUS`: a missing page raises `SIGBUS` in the thread
//! that touched it, and [`on_sigbus`] serves it there
//! ([`crate::serve_in_thread`]: the manager's lock, the store, the
//! install) and returns, so the instruction runs again — no handler
//! thread and no two wake-ups per fault. The kernel's own faults fail
//! with `EFAULT` in that mode exactly as under a user-mode-only
//! userfaultfd, so dispatch is on as well, and `SIGBUS` joins `SIGSYS`
//! wherever `SIGSYS` is kept from the program:
//!
//! ```text
//!  program thread                         SIGBUS handler (same thread)
//!  ──────────────                         ───────────────────────────
//!  load from an evicted page ── fault ─► si_addr in the arena?
//!                                           yes: manager lock, serve (decode,
//!                                                UFFDIO_COPY), unlock
//!                                           no:  the program's own SIGBUS
//!                                                action (kept aside), with
//!                                                the selector as it was
//!  the load again, now a hit  ◄────────  return through ztier_sud_sigaction_return
//! ```
//!
//! - The program's `SIGBUS` action (the JVM's, for faults in mapped
//!   files) is kept aside: `rt_sigaction` reads and sets the kept one,
//!   and a `SIGBUS` outside the arena (or not `BUS_ADRERR`) is passed to
//!   it with its mask applied, as the kernel would; it may leave by
//!   `siglongjmp`, since it runs with the selector the interrupted code
//!   had.
//! - `SIGBUS` is never blocked (a blocked synchronous `SIGBUS` kills the
//!   process): masks set with `rt_sigprocmask` and handler masks set with
//!   `rt_sigaction` lose it, and at start-up so do the masks of handlers
//!   the program installed before. The handler is `SA_NODEFER`, so a
//!   program's handler chained from it may fault on the arena too.
//! - A page owned by an eviction in flight is not served: the thread
//!   waits (a futex, at most 10 ms) for the evictor's next commit and the
//!   retried access faults again (counted `deferred`) — unless the page
//!   is still in memory (`mincore`: the fault was a write to it) and its
//!   batch is not sealed, when the write takes it back at once
//!   (`Manager::take_back`).
//! - A fault inside the service itself (which must never touch arena
//!   memory it does not know resident) aborts with a message at once;
//!   a service that stops making progress is caught by the watchdog.
//!
//! **Memory the kernel writes outside a system call.** A signal frame
//! goes below the interrupted stack pointer, or on the alternate signal
//! stack; in the arena, a missing page there would fail the kernel's
//! write and kill the process with `SIGSEGV` (measured: at the first
//! signal). So every handler is `SA_ONSTACK` and the kernel's alternate
//! stack is always one of the library's, outside the arena; the
//! program's own (`sigaltstack`) is emulated, and the program's handlers
//! run where the kernel would have run them ([`crate::sigstack`]). An
//! `rseq` area gets the CPU number on the way back to user space: it is
//! set by a system call, so the call's handler keeps the new range
//! pinned for that thread ([`crate::manager::Manager::keep_pinned`]) —
//! before the call runs, through it and after it — until the thread
//! replaces or drops it, the memory is released, or the thread is gone
//! (checked at the next such call); a forked child keeps the forking
//! thread's. A stack the program gives a thread from the arena is kept
//! pinned the same way (see `pthread_create` in the shim).
//!
//! **Jumps out of a signal handler.** A program's signal handler that
//! ran while the dispatch handler made a blocking call for it (a
//! timeout: `alarm`, then `poll`) may leave by `siglongjmp` or
//! `longjmp`, past the dispatch handler's frame, which then never
//! lowers its nesting count or sets the selector back: every later call
//! of that thread would run unprotected. So the library exports the
//! `longjmp` family too ([`jump`]): each level of the dispatch handler
//! records the stack pointer the program had when it was entered; a
//! jump whose target (glibc's `jmp_buf`, its stack pointer demangled
//! with the thread's pointer guard) lies above it leaves that level,
//! which is dropped. Left at the outermost level, `SIGSYS` (and
//! `SIGBUS`) is unblocked before glibc's own function jumps — a plain
//! `longjmp` keeps the handler's mask, and a blocked dispatch signal
//! kills the process — and the selector goes back to BLOCK. The pins of
//! the calls a jump leaves end with it: each call that pinned memory is
//! recorded on a small per-thread stack ([`Flight`]) with the address
//! of its frame; a thread that exits inside one (cancelled) has its
//! pins ended by a thread-specific key's destructor. `pinned_bytes` in
//! the stats says what was still pinned at exit.
//!
//! **Asynchronous I/O.** `io_uring_setup` and `io_setup` fail with
//! `ENOSYS` (said once in the log): the kernel reads and writes their
//! buffers after the call that submits them, where no pin can reach, so
//! a transfer on an evicted page would fail. Programs fall back to
//! ordinary calls (libuv and liburing users do).
//!
//! Left out: a jump out of the dispatch handler that does not go through
//! glibc's exported functions (a program's own assembly) still leaves
//! that thread unprotected.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

pub use crate::sudstate::{active, allow, in_library, rearm, sigbus_on, Allow};
use crate::sudstate::{
    bit, in_vfork_child, keep, kept, kept_slot, library_action, ours, selector, set_default, set_selector,
    KSigaction, ACTIVE, ALLOW, BLOCK, DEPTH, ENABLED, GUARDS, OVER_LIBRARY, PROGRAM_SIGBUS, PROGRAM_SIGSYS,
    SA_RESTORER, SIGBUS_ON, TID,
};
use crate::sys::{raw, ztier_sud_begin, ztier_sud_end, ztier_sud_sigaction_return};

const PR_SET_SYSCALL_USER_DISPATCH: libc::c_int = 59;
const PR_SYS_DISPATCH_ON: libc::c_ulong = 1;
/// `si_code` of a dispatch `SIGSYS`.
const SYS_USER_DISPATCH: libc::c_int = 2;
const EFAULT: i64 = -(libc::EFAULT as i64);

/// `si_code` of a fault on an address the kernel cannot back (what a
/// userfaultfd with `UFFD_FEATURE_SIGBUS` raises).
const BUS_ADRERR: libc::c_int = 2;

thread_local! {
    /// Inside glibc's function in [`fast`] (still set if the thread left
    /// it by `siglongjmp` from a signal handler).
    static FAST: Cell<bool> = const { Cell::new(false) };
    /// Inside the system call the dispatch handler makes for the program
    /// ([`dispatch_via`]), where the thread holds no lock.
    static CALLING: Cell<bool> = const { Cell::new(false) };
    /// The stack pointer the program had at each level of the dispatch
    /// handler (`DEPTH` - 1 is the innermost; 0: not recorded).
    static SAVED_SP: Cell<[u64; 8]> = const { Cell::new([0; 8]) };
    /// Calls in flight on this thread that pinned memory, innermost last
    /// (see [`Flight`]), and how many.
    static FLIGHTS: UnsafeCell<[Flight; 8]> = const { UnsafeCell::new([Flight::NONE; 8]) };
    static FLIGHTS_N: Cell<usize> = const { Cell::new(0) };
    /// This thread's exit runs [`flights_at_exit`].
    static EXIT_HOOKED: Cell<bool> = const { Cell::new(false) };
}

/// How many of a call's pinned ranges a [`Flight`] keeps (a `readv` of
/// up to 15 buffers and its `iovec` array).
const FLIGHT_PINS: usize = 16;

/// A call in flight that pinned memory: the address of a local of the
/// frame that will unpin it (a jump to a target above it leaves that
/// frame) and the page ranges it pinned (the first [`FLIGHT_PINS`]).
#[derive(Clone, Copy)]
struct Flight {
    frame: usize,
    pins: [(usize, usize); FLIGHT_PINS],
}

impl Flight {
    const NONE: Flight = Flight { frame: 0, pins: [(0, 0); FLIGHT_PINS] };
}

/// Records a call in flight with pins (`frame`: the address of a local
/// of the caller). Returns whether it was recorded (and so must be
/// ended with [`land`]).
fn take_off(frame: usize, pinned: &Ranges) -> bool {
    let n = FLIGHTS_N.with(Cell::get);
    if pinned.n == 0 || n == 8 {
        return false;
    }
    let mut f = Flight { frame, pins: [(0, 0); FLIGHT_PINS] };
    for (slot, &p) in f.pins.iter_mut().zip(&pinned.r[..pinned.n]) {
        *slot = p;
    }
    // SAFETY: this thread's own array, not borrowed elsewhere (a signal
    // handler that interrupts this adds its flights above `n`, and is
    // over before this goes on).
    FLIGHTS.with(|c| unsafe { (*c.get())[n] = f });
    FLIGHTS_N.with(|c| c.set(n + 1));
    hook_exit();
    true
}

/// Ends the innermost call recorded by [`take_off`] (its pins are
/// unpinned by the caller).
fn land() {
    FLIGHTS_N.with(|c| c.set(c.get().saturating_sub(1)));
}

/// Unpins the recorded pins of calls in flight whose frame lies below
/// `target` (all of them if `usize::MAX`): a jump leaves them, or the
/// thread exits inside them (cancelled).
fn abandon_flights(target: usize) {
    let Some(g) = crate::GLOBAL.get() else { return };
    if crate::inside() {
        // Jumping out of a handler that interrupted library code (which
        // may hold the manager's lock): the pins stay.
        return;
    }
    let mut n = FLIGHTS_N.with(Cell::get);
    while n > 0 {
        // SAFETY: this thread's own array, read by value.
        let f = FLIGHTS.with(|c| unsafe { (*c.get())[n - 1] });
        if target != usize::MAX && !(f.frame < target && target - f.frame < 64 << 20) {
            break;
        }
        crate::as_inside(|| {
            let mut m = crate::lock_program(g);
            for &(first, k) in f.pins.iter().filter(|p| p.1 > 0) {
                m.unpin(first, k);
            }
        });
        n -= 1;
    }
    FLIGHTS_N.with(|c| c.set(n));
}

/// The key whose destructor ends a thread's calls in flight at its exit
/// and puts its stack aside (`u32::MAX`: none).
static EXIT_KEY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// [`EXIT_KEY`], made when first wanted.
fn exit_key() -> u32 {
    static MADE: std::sync::Once = std::sync::Once::new();
    MADE.call_once(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a new key with a destructor of ours.
        if unsafe { libc::pthread_key_create(&mut key, Some(flights_at_exit)) } == 0 {
            EXIT_KEY.store(key, Ordering::Relaxed);
        }
    });
    EXIT_KEY.load(Ordering::Relaxed)
}

/// How many rounds glibc runs the thread-specific data destructors
/// (`PTHREAD_DESTRUCTOR_ITERATIONS`): while a destructor sets a value
/// again, up to this many.
const EXIT_ROUNDS: usize = 4;

/// At a thread's exit: its pins still in flight end (after a
/// cancellation inside a call), the robust mutexes it still holds are
/// brought back for the kernel ([`keep_robust_list`]), and its stack of
/// the library's is put aside (`crate::sigstack::detach`).
///
/// The key is the library's, made before any of the program's, so in
/// each round of destructors this one runs first. The program's run
/// after it and may still lock robust mutexes or call into the library.
/// So it sets its value again (`round`: 1, 2, …) and does the last two
/// steps only in glibc's last round, after every destructor of the
/// program that does not set its own value again:
///
/// ```text
///   round 1: ztier (flights; again) → program's destructors (lock, free…)
///   round 2: ztier (flights; again)
///   round 3: ztier (flights; again)
///   round 4: ztier (flights, robust mutexes, stack put aside)
/// ```
extern "C" fn flights_at_exit(round: *mut libc::c_void) {
    let _sud = Allow::new();
    abandon_flights(usize::MAX);
    let round = round as usize;
    let key = EXIT_KEY.load(Ordering::Relaxed);
    let again = round < EXIT_ROUNDS && {
        // SAFETY: the key whose destructor this is; the value only counts
        // the rounds.
        unsafe { libc::pthread_setspecific(key, (round + 1) as *const libc::c_void) == 0 }
    };
    if again {
        return;
    }
    crate::as_inside(keep_robust_list);
    crate::sigstack::detach();
}

/// The robust mutexes the exiting thread still holds, kept resident until
/// it is gone: after its last code has run, the kernel walks the thread's
/// robust list (`set_robust_list`, glibc's list through the mutexes
/// themselves) and marks each lock word `FUTEX_OWNER_DIED`, waking a
/// waiter, so that the next locker gets `EOWNERDEAD`. An exiting task's
/// fault on a missing page is never handed to the userfaultfd (the
/// kernel gives up on it, in every mode), so on an evicted mutex the walk
/// stopped there, and its lockers waited forever (`run_progs/robust.c`).
///
/// ```text
///   thread's control block          arena (the program's mutexes)
///   robust_list_head                pthread_mutex_t
///   ┌────────────────────┐          ┌──────────────────────────┐
///   │ list.next ─────────┼──┐       │ __lock   ◀─ entry+offset │
///   │ futex_offset (-32) │  │       │ …                        │
///   │ list_op_pending    │  └─────▶ │ __list.__next  (entry) ──┼─▶ next … ─▶ head
///   └────────────────────┘          └──────────────────────────┘
/// ```
///
/// Each entry's page(s), its lock word's among them, are pinned before
/// the entry is read, at most 2048 entries (the kernel's own limit).
fn keep_robust_list() {
    let Some(g) = crate::GLOBAL.get() else { return };
    let mut head = 0u64;
    let mut len = 0u64;
    let r = raw(
        libc::SYS_get_robust_list,
        [0, &mut head as *mut u64 as u64, &mut len as *mut u64 as u64, 0, 0, 0],
    );
    if r != 0 || head == 0 || len < 24 {
        return;
    }
    // The head lies in the thread's control block: outside the arena, or
    // on a stack from it, which is kept pinned for the thread
    // ([`KeptKind::Stack`]).
    let h = head as *const u64;
    // SAFETY: the head the kernel has for this thread (glibc's, in the
    // thread's control block), resident as above; three words.
    // The low bit of a link marks a priority-inheriting mutex; the
    // kernel masks it off, and so does this.
    let (mut entry, offset, pending) =
        unsafe { (h.read_volatile() & !1, h.add(1).read_volatile() as i64, h.add(2).read_volatile() & !1) };
    if (entry == head || entry == 0) && pending == 0 {
        // Holds none (the usual case): no lock taken.
        return;
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    use crate::manager::KeptKind;
    // Kept pins of threads gone since are dropped on the way.
    until_pinned(g, "a robust mutex", |m| m.keep_pinned(tid, KeptKind::Robust, 0, 0, &g.stats));
    // An entry and its lock word (`offset` from it): one kept pin over
    // both (one page, or two if the mutex straddles a page boundary).
    let keep = |entry: u64| {
        let word = entry.wrapping_add_signed(offset);
        let (lo, hi) = (entry.min(word) as usize, entry.max(word) as usize + 7);
        if g.in_arena(lo) && g.in_arena(hi) && hi - lo < 4096 {
            let first = g.page_of(lo);
            let n = g.page_of(hi) - first + 1;
            until_pinned(g, "a robust mutex", |m| m.keep_pinned(tid, KeptKind::Robust, first, n, &g.stats));
        }
    };
    if pending != 0 {
        keep(pending);
    }
    let mut walked = 0;
    while entry != head && entry != 0 && walked < 2048 {
        keep(entry);
        // SAFETY: a list entry glibc linked in, resident now (pinned
        // above if in the arena); its first word is the next entry.
        entry = unsafe { (entry as *const u64).read_volatile() } & !1;
        walked += 1;
    }
}

/// Marks the thread for [`flights_at_exit`] (once).
pub(crate) fn hook_exit() {
    if !EXIT_HOOKED.with(Cell::get) {
        EXIT_HOOKED.with(|c| c.set(true));
        let key = exit_key();
        if key != u32::MAX {
            // SAFETY: a key made by `exit_key`; the value marks the
            // thread (its destructor runs at the thread's exit) and counts
            // the destructor's rounds, from 1 (the dangling address).
            unsafe { libc::pthread_setspecific(key, std::ptr::dangling::<libc::c_void>()) };
        }
    }
}

/// The stack pointer a signal interrupted.
///
/// # Safety
/// `ctx` is the kernel's ucontext for a signal being handled.
unsafe fn interrupted_sp(ctx: *mut libc::c_void) -> usize {
    // SAFETY: as the caller promises.
    unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RSP as usize] as usize }
}

// A `clone3` made by the dispatch handler for the program (see
// [`clone_with_dispatch`]): `ztier_sud_clone3(args, size, frame)`. The
// parent gets the call's result. The child starts here on its new stack,
// runs [`ztier_sud_clone_child`] below the copied signal frame at
// `frame` (kept in r12, which the kernel gives the child as the parent
// had it), and then returns to the program through that frame's
// `rt_sigreturn`, in the region.
std::arch::global_asm!(
    ".pushsection .text.ztier_sud_clone,\"ax\",@progbits",
    ".globl ztier_sud_clone3",
    ".hidden ztier_sud_clone3",
    "ztier_sud_clone3:",
    "push r12",
    "mov r12, rdx",
    "mov eax, 435",
    "syscall",
    "test rax, rax",
    "jz 2f",
    "pop r12",
    "ret",
    "2:",
    "lea rsp, [r12 - 64]",
    "and rsp, -16",
    "mov rdi, r12",
    "call {child}",
    "mov rsp, r12",
    "jmp ztier_sud_sigaction_return",
    ".popsection",
    child = sym ztier_sud_clone_child,
);

extern "C" {
    fn ztier_sud_clone3(args: u64, size: u64, frame: *mut libc::ucontext_t) -> i64;
}

/// `struct clone_args` up to the fields read here (`clone3(2)`).
#[repr(C)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

/// The least stack a thread started by [`clone_with_dispatch`] must have
/// (glibc's own helper threads get about its minimum, `PTHREAD_STACK_MIN`
/// plus the static TLS), and the least that must be left below the copied
/// frame (a few KiB with AVX-512 state) for the setup code's stack.
const CLONE_STACK_MIN: u64 = 16 << 10;
const CLONE_SETUP_STACK: u64 = 8 << 10;

/// A thread started by a caught `clone3` — not the library's
/// `pthread_create` (whose clone is never caught) but glibc's internal one
/// (`SIGEV_THREAD` timers, POSIX AIO, `mq_notify`) or a program's own with
/// its own thread-local storage — gets dispatch from its first
/// instruction: the handler makes the call itself (`ztier_sud_clone3`),
/// the child enables dispatch ([`ztier_sud_clone_child`]) and continues in
/// the program's code with the program's registers, FPU state and signal
/// mask, put back by `rt_sigreturn` of a copy of this handler's frame laid
/// just below the top of the child's stack (`rax` 0, `rsp` the top):
///
/// ```text
///  child stack  top ┬──────────────────────────┐
///                   │ the creator's DTV pin    │ 16 B: first page, pages
///                   │ 240 B unused             │
///                   │ FPU/xsave state (64-B    │ ◄─ frame's fpregs
///                   │ aligned, as the kernel   │
///                   │ wrote it)                │
///                   │ ucontext (the kernel's)  │ ◄─ frame (r12); rt_sigreturn from here
///                   │ setup code's stack ↓     │
///             stack └──────────────────────────┘
/// ```
///
/// `None` (the caller lets the program's own `syscall` run it, and the
/// thread runs without dispatch) for anything else: `clone`, no
/// `CLONE_SETTLS` (the child would share this thread's thread-locals), no
/// stack or less than [`CLONE_STACK_MIN`], a stack in the arena.
fn clone_with_dispatch(nr: i64, a: [u64; 6], uc: &mut libc::ucontext_t) -> Option<i64> {
    if nr != libc::SYS_clone3 || a[0] == 0 || a[1] < std::mem::size_of::<CloneArgs>() as u64 {
        return None;
    }
    // SAFETY: the program's clone_args, at least as large as read (the
    // kernel reads it too; a bad pointer faults here as it would fail there).
    let ca = unsafe { (a[0] as *const CloneArgs).read_unaligned() };
    let want = (libc::CLONE_VM | libc::CLONE_SETTLS) as u64;
    if ca.flags & want != want || ca.flags & libc::CLONE_VFORK as u64 != 0 || ca.stack == 0 {
        return None;
    }
    let (stack, top) = (ca.stack, ca.stack.checked_add(ca.stack_size)?);
    if ca.stack_size < CLONE_STACK_MIN {
        return None;
    }
    let g = crate::GLOBAL.get()?;
    if g.in_arena(stack as usize) || g.in_arena(top as usize - 1) || g.in_arena(ca.tls as usize) {
        return None;
    }
    relocate_dtv(g, ca.tls, true);
    let fp = uc.uc_mcontext.fpregs as u64;
    if fp == 0 {
        return None;
    }
    // The size of the state the kernel saved: `struct _fpx_sw_bytes` in the
    // legacy area's software-reserved bytes (offset 464) says it when the
    // frame has extended state (magic1); else the 512-byte legacy area.
    // SAFETY: the kernel's FPU frame of this signal, at least 512 bytes.
    let (magic1, extended) =
        unsafe { ((fp as *const u32).add(116).read(), (fp as *const u32).add(117).read()) };
    let fp_len = if magic1 == 0x4650_5853 { extended as u64 } else { 512 };
    let fp_dst = (top - 256 - fp_len) & !63;
    let uc_len = (std::mem::offset_of!(libc::ucontext_t, uc_sigmask) + 8) as u64;
    let uc_dst = (fp_dst - uc_len) & !15;
    if uc_dst < stack + CLONE_SETUP_STACK {
        return None;
    }
    // A program with a `malloc` of its own frees the DTV itself, so it
    // stays where glibc put it ([`moved_dtv`]): pinned now, before the
    // thread can read it, until the thread keeps it pinned for itself
    // ([`ztier_sud_clone_child`], which finds this pin in the top 16
    // bytes of its stack). Before, the `SIGBUS` handler of such a
    // program's `SIGEV_THREAD` timer thread faulted on its DTV for ever
    // (`SIGSEGV`, every run of `sigev_thread.c` with `ownalloc.c`).
    let pinned =
        if crate::OWN_MALLOC.load(Ordering::Acquire) { pin_new_dtv(g, ca.tls as usize) } else { (0, 0) };
    // SAFETY: [stack, top) is the child's stack, which the program gives
    // the kernel to use and nothing uses before the child runs (checked
    // outside the arena, so no fault); the sources are this handler's
    // frame.
    unsafe {
        ((top - 16) as *mut [usize; 2]).write_unaligned([pinned.0, pinned.1]);
        std::ptr::copy_nonoverlapping(fp as *const u8, fp_dst as *mut u8, fp_len as usize);
        std::ptr::copy_nonoverlapping(
            (uc as *const libc::ucontext_t).cast::<u8>(),
            uc_dst as *mut u8,
            uc_len as usize,
        );
        let frame = &mut *(uc_dst as *mut libc::ucontext_t);
        frame.uc_mcontext.gregs[libc::REG_RAX as usize] = 0;
        frame.uc_mcontext.gregs[libc::REG_RSP as usize] = top as i64;
        frame.uc_mcontext.fpregs = fp_dst as *mut libc::_libc_fpstate;
        let r = ztier_sud_clone3(a[0], a[1], frame);
        if r < 0 {
            end_creator_pin(pinned.0, pinned.1);
        }
        Some(r)
    }
}

/// A copy, in glibc's allocator, of the DTV at `dtv` if that lies in the
/// arena (else `None`): the value for the thread's DTV pointer (glibc's
/// `tcbhead_t`, second word), which points one 16-byte entry into the
/// DTV's block, whose first entry holds the count of the entries after
/// the two headers. glibc allocates the DTV with `calloc` before the
/// clone: in the library's own `pthread_create` that goes to glibc's
/// allocator, but in glibc's internal one (`SIGEV_THREAD` timers, POSIX
/// AIO) it comes from the arena, and every access to the library's
/// thread-locals reads it — in `--fault-path signal` from the `SIGBUS`
/// handler itself, which then faulted on it for ever
/// (`run_progs/sigev_thread.c`: the timer's helper thread, killed by
/// `SIGSEGV` once its signal stack ran out). The old block is freed if
/// `free_old`; glibc frees or grows the new one later with
/// `free`/`realloc`, which send memory outside the arena to glibc.
///
/// Never for a program with a `malloc` of its own ([`crate::OWN_MALLOC`]):
/// glibc frees the DTV with the program's `free` (when it trims its
/// cache of thread stacks), which would get a block of glibc's heap
/// (`ownmalloc.c` with a `free` that checks its blocks aborted at its
/// fourth `pthread_join`; jemalloc would take it for its own). Such a
/// DTV is pinned instead ([`ThreadGate`], [`keep_thread_vector`]).
fn moved_dtv(g: &crate::Global, dtv: u64, free_old: bool) -> Option<u64> {
    if dtv < 16 || !g.in_arena(dtv as usize) || crate::OWN_MALLOC.load(Ordering::Acquire) {
        return None;
    }
    let block = dtv - 16;
    // SAFETY: the DTV's block (arena memory: a fault here is served, as
    // for any argument the dispatch handler reads).
    let entries = unsafe { (block as *const u64).read() };
    if entries > 1 << 16 {
        return None;
    }
    let len = (entries as usize + 2) * 16;
    // SAFETY: glibc's allocator, then a copy between two blocks of `len`
    // bytes; the old block is our arena's, freed by our `free`.
    unsafe {
        let new = crate::__libc_malloc(len) as u64;
        if new == 0 {
            return None;
        }
        std::ptr::copy_nonoverlapping(block as *const u8, new as *mut u8, len);
        if free_old {
            crate::shim::free(block as *mut libc::c_void);
        }
        Some(new + 16)
    }
}

/// Moves the DTV of the new thread whose thread pointer is `tp` out of
/// the arena ([`moved_dtv`]), before it runs. The caller makes sure the
/// thread exists and does not run code that reads its DTV meanwhile
/// (before its clone, or held at its [`ThreadGate`]), and that its
/// control block is outside the arena or pinned.
fn relocate_dtv(g: &crate::Global, tp: u64, free_old: bool) {
    let slot = (tp + 8) as *mut u64;
    // SAFETY: the new thread's TCB, which glibc filled in before the
    // clone (as the caller promises).
    if let Some(new) = moved_dtv(g, unsafe { slot.read() }, free_old) {
        // SAFETY: as above.
        unsafe { slot.write(new) };
    }
}

/// Where a thread the program starts with `pthread_create` waits, at
/// the first instruction of the library's start routine, until its
/// creator has moved its DTV out of the arena ([`relocate_dtv`]) — or,
/// for a program with a `malloc` of its own, which frees that block
/// itself ([`moved_dtv`]), pinned it, until the thread keeps it pinned
/// for itself ([`keep_thread_vector`], then [`ThreadGate::end_pin`]).
///
/// glibc allocates the DTV with the program's `calloc` just before the
/// clone. Our `pthread_create` sends that call to glibc's malloc, but a
/// `calloc` linked into the program (`run_progs/ownmalloc.c`, rustc's
/// jemalloc) gives it arena memory, which the evictor may take at once.
/// Every access to a thread-local of this library reads the DTV, the
/// `SIGBUS` handler's first among them: with `--fault-path signal`, a
/// new thread whose DTV page was out of memory faulted again inside the
/// handler, for ever, until its signal stack ran out (`SIGSEGV`, in one
/// run of ten of `ownmalloc` at `--budget 16M`; seen when the DTV
/// straddled two pages and the second was out, in the copy that
/// [`dtv_out_of_arena`] makes). The creator's own DTV is outside the
/// arena or pinned (it went through this gate), so its faults on the new
/// thread's DTV are served as any.
///
/// ```text
///   NEW ──child: DTV outside the arena──► PASSED   (creator: nothing)
///    │ └─child: DTV in the arena──► WAITING ─creator moves/pins it─► OPEN
///    └─creator first──► CHECKING ─creator moves/pins it if there─► OPEN
/// ```
///
/// The creator reads the thread's control block only while the thread
/// cannot have gone past the gate (NEW, WAITING), so never after the
/// thread could have ended. The gate is shared (`Arc`): either side may
/// be the last to let it go.
pub struct ThreadGate {
    state: AtomicU32,
    /// The DTV's pages the creator pinned (first, count; 0 pages: none),
    /// written before OPEN.
    pinned: [AtomicUsize; 2],
}

impl ThreadGate {
    const NEW: u32 = 0;
    const PASSED: u32 = 1;
    const WAITING: u32 = 2;
    const CHECKING: u32 = 3;
    const OPEN: u32 = 4;

    pub fn new() -> ThreadGate {
        ThreadGate { state: AtomicU32::new(Self::NEW), pinned: [AtomicUsize::new(0), AtomicUsize::new(0)] }
    }

    /// In the new thread, before anything that may read one of the
    /// library's thread-locals: reads no thread-local (only the thread
    /// pointer's DTV word, the library's global state, and a futex wait
    /// through [`raw`]).
    pub fn enter(&self) {
        let dtv: u64;
        // SAFETY: reads the second word at the thread pointer (glibc's
        // `tcbhead_t.dtv`).
        unsafe { std::arch::asm!("mov {}, fs:8", out(reg) dtv, options(nostack, readonly, preserves_flags)) };
        let in_arena = dtv >= 16 && crate::GLOBAL.get().is_some_and(|g| g.in_arena(dtv as usize));
        let want = if in_arena { Self::WAITING } else { Self::PASSED };
        match self.state.compare_exchange(Self::NEW, want, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) if !in_arena => return,
            Err(Self::OPEN) => return,
            _ => {}
        }
        loop {
            let v = self.state.load(Ordering::Acquire);
            if v == Self::OPEN {
                return;
            }
            crate::sys::futex_wait(&self.state, v, None);
        }
    }

    /// In the creator, once glibc's `pthread_create` has made the thread
    /// whose thread pointer (its `pthread_t`) is `tp`.
    pub fn creator(&self, tp: usize) {
        let seen =
            self.state.compare_exchange(Self::NEW, Self::CHECKING, Ordering::AcqRel, Ordering::Acquire);
        if seen == Err(Self::PASSED) {
            return;
        }
        if let Some(g) = crate::GLOBAL.get() {
            if crate::OWN_MALLOC.load(Ordering::Acquire) {
                let (first, n) = pin_new_dtv(g, tp);
                self.pinned[0].store(first, Ordering::Relaxed);
                self.pinned[1].store(n, Ordering::Relaxed);
            } else {
                // Not freed: the block is the program's `calloc`'s.
                relocate_dtv(g, tp as u64, false);
            }
        }
        self.state.store(Self::OPEN, Ordering::Release);
        crate::sys::futex_wake(&self.state, 1);
    }

    /// In the new thread, once it keeps its DTV pinned for itself
    /// ([`keep_thread_vector`]): the creator's pin ends.
    pub fn end_pin(&self) {
        end_creator_pin(self.pinned[0].load(Ordering::Relaxed), self.pinned[1].load(Ordering::Relaxed));
    }
}

/// In a thread's creator, before the thread can run: pins the pages of
/// the DTV of the thread whose control block is at `tp` if it lies in
/// the arena (its length read in its block's first entry, as
/// [`keep_thread_vector`] reads it). The pages pinned (first, count; 0
/// pages: none), for [`end_creator_pin`] once the thread keeps them
/// pinned itself.
fn pin_new_dtv(g: &crate::Global, tp: usize) -> (usize, usize) {
    // SAFETY: the new thread's control block, filled in by glibc before
    // the clone (outside the arena, or in a stack pinned for the thread).
    let dtv = unsafe { ((tp + 8) as *const usize).read() };
    let start = dtv.wrapping_sub(16);
    if dtv < 16 || !g.in_arena(start) {
        return (0, 0);
    }
    // SAFETY: the DTV's first entry, written by glibc's `calloc` just now
    // (arena memory: a fault here is served, as any of this thread's).
    let len = unsafe { (start as *const usize).read_volatile() };
    let (first, n) = arena_pages(g, start, len.saturating_add(2).saturating_mul(16));
    if n > 0 {
        until_pinned(g, "a new thread's thread-local table", |m| m.pin(first, n, &g.stats));
    }
    (first, n)
}

/// Ends a pin of [`pin_new_dtv`] (`n` 0: there was none).
fn end_creator_pin(first: usize, n: usize) {
    if n > 0 {
        if let Some(g) = crate::GLOBAL.get() {
            crate::lock_program(g).unpin(first, n);
        }
    }
}

/// Moves this thread's DTV out of the arena if it is there
/// ([`moved_dtv`]): a thread glibc started by its internal
/// `pthread_create` where no clone is caught (full mode). Called before
/// the manager's lock is taken for the program ([`crate::lock_program`]),
/// since a thread-local read under that lock whose DTV page was evicted
/// would wait for a handler that needs the lock. One load when there is
/// nothing to do; the old block is left (freeing it could need an
/// allocator lock the caller holds: one per such thread, a few hundred
/// bytes).
pub(crate) fn dtv_out_of_arena(g: &crate::Global) {
    let dtv: u64;
    // SAFETY: reads the second word at the thread pointer (glibc's
    // `tcbhead_t.dtv`).
    unsafe { std::arch::asm!("mov {}, fs:8", out(reg) dtv, options(nostack, readonly, preserves_flags)) };
    if let Some(new) = moved_dtv(g, dtv, false) {
        // SAFETY: this thread's own DTV pointer, read just above; only
        // this thread reads it.
        unsafe { std::arch::asm!("mov fs:8, {}", in(reg) new, options(nostack, preserves_flags)) };
    }
}

/// The first code of a thread started by [`clone_with_dispatch`], on its
/// own stack and thread-locals, before any of glibc's or the program's:
/// dispatch on, the library's stack for its signals (kept through the
/// `rt_sigreturn` that follows, by writing it into `frame`), the exit
/// hook, the CPUs a new thread of the program gets; selector at BLOCK.
#[no_mangle]
extern "C" fn ztier_sud_clone_child(frame: *mut libc::ucontext_t) {
    crate::as_inside(|| {
        if let Some(cpus) = crate::ALLOWED.get() {
            crate::pin(cpus);
        }
        if let Err(e) = enable_thread() {
            let msg = format!("ztier: a new thread cannot protect its system calls: {e}: aborting\n");
            raw(libc::SYS_write, [2, msg.as_ptr() as u64, msg.len() as u64, 0, 0, 0]);
            std::process::abort();
        }
        hook_exit();
        // SAFETY: the frame laid for this thread by `clone_with_dispatch`,
        // whose `rsp` is the top of this thread's stack, below which it
        // wrote its pin of this thread's DTV.
        let [first, n] = unsafe {
            let top = (*frame).uc_mcontext.gregs[libc::REG_RSP as usize] as usize;
            ((top - 16) as *const [usize; 2]).read_unaligned()
        };
        if n > 0 {
            keep_thread_vector();
            end_creator_pin(first, n);
        }
        let mut ss = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: 0, ss_size: 0 };
        raw(libc::SYS_sigaltstack, [0, &mut ss as *mut libc::stack_t as u64, 0, 0, 0, 0]);
        // SAFETY: the frame laid for this thread by `clone_with_dispatch`.
        unsafe { (*frame).uc_stack = ss };
    });
    rearm();
}

/// What the kernel gets for the default action of `sig`: the library's
/// core handler where it stands for the default ([`crate::coredump`]).
fn default_action(sig: libc::c_int) -> Option<KSigaction> {
    crate::coredump::handler_for(sig).map(|(h, mask)| library_action(h, mask))
}

/// The program's handlers for the other signals (handler, flags; 0: none),
/// which the kernel runs through [`on_program_signal`].
static PROGRAM_HANDLERS: [[AtomicU64; 2]; 65] = [const { [const { AtomicU64::new(0) }; 2] }; 65];
/// Their restorers (glibc's `__restore_rt`), shown back to the program.
static PROGRAM_RESTORERS: [AtomicU64; 65] = [const { AtomicU64::new(0) }; 65];

fn is_function(handler: u64) -> bool {
    !matches!(handler as usize, libc::SIG_DFL | libc::SIG_IGN)
}

/// What the kernel gets for the program's action `k` for `sig` (one not of
/// [`ours`]): a handler of the program goes through [`on_program_signal`]
/// (recorded first); never a mask that blocks ours.
fn wrapped(sig: libc::c_int, mut k: KSigaction) -> KSigaction {
    if k.handler == libc::SIG_DFL as u64 {
        if let Some(a) = default_action(sig) {
            return a;
        }
    }
    k.mask &= !ours();
    if is_function(k.handler) && k.handler != on_program_signal as *const () as usize as u64 {
        PROGRAM_HANDLERS[sig as usize][0].store(k.handler, Ordering::Relaxed);
        PROGRAM_HANDLERS[sig as usize][1].store(k.flags, Ordering::Relaxed);
        PROGRAM_RESTORERS[sig as usize].store(k.restorer, Ordering::Relaxed);
        k.handler = on_program_signal as *const () as usize as u64;
        // The frame on the library's stack; the handler itself runs
        // where the kernel would have run it (`crate::sigstack::run`).
        // The return is the region's own `rt_sigreturn`: glibc's restorer
        // would take a dispatch signal to make the same call.
        k.flags |= libc::SA_SIGINFO as u64 | libc::SA_ONSTACK as u64 | SA_RESTORER;
        // A one-shot handler is reset by `on_program_signal` when it is
        // run, not by the kernel when it delivers the signal: a delivery
        // put aside (see `hold`) must still find the handler.
        k.flags &= !(libc::SA_RESETHAND as u64);
        k.restorer = ztier_sud_sigaction_return as *const () as usize as u64;
    }
    k
}

/// The program's view of the kernel's action `k` for `sig`, with `was` the
/// handler and flags and `restorer` the restorer recorded for it when the
/// kernel's was set.
fn unwrapped(mut k: KSigaction, was: (u64, u64), restorer: u64) -> KSigaction {
    if k.handler == on_program_signal as *const () as usize as u64 {
        (k.handler, k.flags) = was;
        k.restorer = restorer;
    } else if crate::coredump::is_handler(k.handler) {
        // The library's core handler stands for the default action.
        k = KSigaction::default();
    }
    k
}

fn recorded(sig: libc::c_int) -> (u64, u64) {
    let r = &PROGRAM_HANDLERS[sig as usize];
    (r[0].load(Ordering::Relaxed), r[1].load(Ordering::Relaxed))
}

// SAFETY: siginfo_t is plain data; all zeros is a valid value.
const NO_INFO: libc::siginfo_t = unsafe { std::mem::zeroed() };

thread_local! {
    /// This thread holds the manager's lock (see [`hold`]).
    static HOLDING: Cell<u32> = const { Cell::new(0) };
    /// Signals that came while it did, put aside (their siginfo), and how
    /// many.
    static ASIDE: UnsafeCell<[libc::siginfo_t; 4]> = const { UnsafeCell::new([NO_INFO; 4]) };
    static ASIDE_N: Cell<usize> = const { Cell::new(0) };
}

/// The thread takes the manager's lock (`crate::Held`): a signal for a
/// handler of the program that comes before [`let_go`] is put aside.
pub fn hold() {
    HOLDING.with(|h| h.set(h.get() + 1));
}

/// The thread has let the manager's lock go: the signals put aside
/// meanwhile are sent to it again, each with its own siginfo.
pub fn let_go() {
    let left = HOLDING.with(|h| {
        h.set(h.get().saturating_sub(1));
        h.get()
    });
    if left > 0 || ASIDE_N.with(Cell::get) == 0 {
        return;
    }
    let n = ASIDE_N.with(|c| c.replace(0));
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    for k in 0..n.min(4) {
        // SAFETY: this thread's own array, read by value.
        let info = ASIDE.with(|a| unsafe { (*a.get())[k] });
        // The kernel allows a process to queue any siginfo to itself.
        raw(
            libc::SYS_rt_tgsigqueueinfo,
            [pid as u64, tid as u64, info.si_signo as u64, &info as *const _ as u64, 0, 0],
        );
    }
}

/// Every handler of the program for a signal not of [`ours`] (under
/// dispatch): put aside while the thread holds the manager's lock (see
/// [`hold`]); a one-shot handler is reset here ([`reset_one_shot`]); a
/// handler that interrupts the library runs at the program's level
/// ([`ProgramLevel`]). Elsewhere the handler runs as the kernel would run
/// it.
extern "C" fn on_program_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's ucontext for this signal.
    let _entry = crate::sigstack::Entry::new(unsafe { interrupted_sp(ctx) });
    let (h, flags) = recorded(sig);
    if HOLDING.with(Cell::get) > 0 && crate::sys::ASYNC_SIGNALS & bit(sig) != 0 {
        // The thread holds the manager's lock: later (see `hold`). A
        // standard signal pending twice is delivered once anyway.
        let n = ASIDE_N.with(Cell::get);
        let dup = sig < 32
            && (0..n.min(4)).any(|k| {
                // SAFETY: this thread's own array, read by value.
                ASIDE.with(|a| unsafe { (*a.get())[k].si_signo }) == sig
            });
        if n < 4 && !dup {
            // SAFETY: the kernel's siginfo for this signal, copied into
            // this thread's own array (a nested signal's store comes
            // wholly before or after this one).
            ASIDE.with(|a| unsafe { (*a.get())[n] = info.read() });
            ASIDE_N.with(|c| c.set(n + 1));
        }
        return;
    }
    if flags & libc::SA_RESETHAND as u64 != 0 && !reset_one_shot(sig, h, flags) {
        return;
    }
    if !is_function(h) || h == 0 {
        return;
    }
    // SAFETY: this thread's own selector byte.
    let sel = unsafe { selector().read_volatile() };
    if sel == ALLOW && ENABLED.with(Cell::get) {
        let _level = ProgramLevel::enter();
        crate::sigstack::run(sig, h, flags, info, ctx);
    } else {
        crate::sigstack::run(sig, h, flags, info, ctx);
    }
}

/// A handler of the program run where the selector is at ALLOW: in a call
/// the library makes for the thread (a blocking one run by the dispatch
/// handler, or glibc's function entered directly, [`fast`]), or in the
/// library's own code (an interposed function, the dispatch handler's
/// own work, a signal sent again by [`let_go`]). The handler is the
/// program's code all the same: it runs with the selector at BLOCK and
/// the thread's library state as at the program's level (no guards, no
/// dispatch handler, not inside), so that its calls are caught and
/// emulated where they must be. A `sigaction` made there and let through
/// would put the program's handler itself in the kernel, where it would
/// then run while this thread holds the manager's lock. The state comes
/// back when the handler returns; a handler that leaves by a jump leaves
/// the library code it interrupted, and stays at the program's level
/// (see [`jump`]).
///
/// Whether the code it interrupted may hold a lock (of the library's, or
/// glibc's allocator's through the library's `free` of one of glibc's
/// blocks) is kept for the handler: [`in_library`] says so, and `_Fork`
/// does not wait there for a lock this very thread holds. A handler that
/// leaves by a jump keeps that mark (a fork from a later handler is then
/// made without the library's handlers, as if it still might).
struct ProgramLevel {
    guards: u32,
    depth: u32,
    fast: bool,
    calling: bool,
    over: bool,
    saved_sp: [u64; 8],
    inside: bool,
}

impl ProgramLevel {
    fn enter() -> ProgramLevel {
        let l = ProgramLevel {
            guards: GUARDS.with(|c| c.replace(0)),
            depth: DEPTH.with(|c| c.replace(0)),
            fast: FAST.with(|c| c.replace(false)),
            calling: CALLING.with(|c| c.replace(false)),
            over: OVER_LIBRARY.with(Cell::get),
            saved_sp: SAVED_SP.with(Cell::get),
            inside: crate::INSIDE.try_with(|c| c.replace(false)).unwrap_or(true),
        };
        // Only a system call made for the program (no lock held), or the
        // library's code itself.
        let lib = (l.guards > 0 || l.depth > 0 || l.inside) && !l.fast && !l.calling;
        OVER_LIBRARY.with(|c| c.set(l.over || lib));
        set_selector(BLOCK);
        l
    }
}

impl Drop for ProgramLevel {
    fn drop(&mut self) {
        set_selector(ALLOW);
        GUARDS.with(|c| c.set(self.guards));
        DEPTH.with(|c| c.set(self.depth));
        FAST.with(|c| c.set(self.fast));
        CALLING.with(|c| c.set(self.calling));
        OVER_LIBRARY.with(|c| c.set(self.over));
        SAVED_SP.with(|c| c.set(self.saved_sp));
        let _ = crate::INSIDE.try_with(|c| c.set(self.inside));
    }
}

/// Puts the default action back for the one-shot handler `h` of `sig`
/// (with the program's `flags`), as the kernel does when it delivers such
/// a signal ([`wrapped`] leaves that to this). The signal is blocked here
/// unless the handler asked for `SA_NODEFER`, so no other delivery of it
/// comes to this thread meanwhile, and a delivery to another thread finds
/// the handler taken: false, and the default action is taken for it, as
/// the kernel would have (the signal is sent again, to be delivered once
/// this handler returns). A `sigaction` for `sig` made by another thread
/// during the few instructions between taking the handler and resetting
/// the kernel's action is overwritten by the reset.
fn reset_one_shot(sig: libc::c_int, h: u64, flags: u64) -> bool {
    let slot = &PROGRAM_HANDLERS[sig as usize][0];
    if h == 0 || slot.compare_exchange(h, 0, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        set_default(sig);
        // Delivered when this handler returns and the interrupted mask
        // comes back.
        crate::sys::signal_this_thread(sig);
        return false;
    }
    // The program's view of the action, as the kernel leaves it after a
    // delivery: the default, with the rest as the program set it.
    let mut k = KSigaction::default();
    raw(libc::SYS_rt_sigaction, [sig as u64, 0, &mut k as *mut _ as u64, 8, 0, 0]);
    let k = default_action(sig).unwrap_or(KSigaction {
        handler: libc::SIG_DFL as u64,
        flags,
        restorer: PROGRAM_RESTORERS[sig as usize].load(Ordering::Relaxed),
        mask: k.mask,
    });
    raw(libc::SYS_rt_sigaction, [sig as u64, &k as *const _ as u64, 0, 8, 0, 0]);
    true
}

/// Installs `handler` for `sig`, keeping the program's action in `slot`.
fn take_over(
    sig: libc::c_int,
    handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
    extra: u64,
    mask: u64,
    slot: &[AtomicU64; 4],
) -> std::io::Result<()> {
    let act = KSigaction {
        handler: handler as *const () as usize as u64,
        // SA_ONSTACK: frames on the library's stack (`crate::sigstack`).
        flags: libc::SA_SIGINFO as u64 | SA_RESTORER | libc::SA_ONSTACK as u64 | extra,
        restorer: ztier_sud_sigaction_return as *const () as usize as u64,
        mask,
    };
    let mut old = KSigaction::default();
    let r = raw(
        libc::SYS_rt_sigaction,
        [sig as u64, &act as *const _ as u64, &mut old as *mut _ as u64, 8, 0, 0],
    );
    if r < 0 {
        return Err(std::io::Error::from_raw_os_error(-r as i32));
    }
    keep(slot, &old);
    Ok(())
}

/// Installs the dispatch handler (and with `sigbus` the fault handler,
/// `--fault-path signal`) and enables dispatch for the calling thread.
/// The error says why dispatch is not available.
pub fn install(sigbus: bool) -> std::io::Result<()> {
    exit_key();
    // SA_NODEFER: a handler of the program run during a call made here
    // (see `on_program_signal`) has its own calls caught.
    take_over(libc::SIGSYS, on_sigsys, libc::SA_NODEFER as u64, 0, &PROGRAM_SIGSYS)?;
    if sigbus {
        // SA_NODEFER: a program's SIGBUS handler chained from ours, or a
        // fault in a signal handler, may fault on the arena again. The
        // asynchronous signals wait while a fault is served (under the
        // manager's lock: see `crate::Held`); a program's handler chained
        // from ours gets the mask it would have had.
        take_over(
            libc::SIGBUS,
            on_sigbus,
            libc::SA_NODEFER as u64,
            crate::sys::ASYNC_SIGNALS,
            &PROGRAM_SIGBUS,
        )?;
        SIGBUS_ON.store(true, Ordering::Relaxed);
    }
    // Handlers the program installed before: they must not block ours
    // while they run.
    for sig in 1..=64 {
        if matches!(sig, libc::SIGKILL | libc::SIGSTOP) || kept_slot(sig).is_some() {
            continue;
        }
        let mut a = KSigaction::default();
        if raw(libc::SYS_rt_sigaction, [sig as u64, 0, &mut a as *mut _ as u64, 8, 0, 0]) == 0
            && (a.mask & ours() != 0 || is_function(a.handler))
            && !crate::coredump::is_handler(a.handler)
        {
            let k = wrapped(sig, a);
            raw(libc::SYS_rt_sigaction, [sig as u64, &k as *const _ as u64, 0, 8, 0, 0]);
        }
    }
    ACTIVE.store(true, Ordering::Relaxed);
    enable_thread()
}

/// Enables dispatch for the calling thread (a new thread of the program,
/// a forked child) if it is on. The selector stays at ALLOW until the
/// thread leaves the library ([`Allow`]'s drop, [`rearm`]).
pub fn enable_thread() -> std::io::Result<()> {
    if !active() || ENABLED.with(Cell::get) {
        return Ok(());
    }
    set_selector(ALLOW);
    // SIGSYS (and SIGBUS in signal mode) must not be blocked (a blocked
    // dispatch or fault signal kills the process); a mask inherited
    // through exec may block it.
    let sys = ours();
    raw(libc::SYS_rt_sigprocmask, [libc::SIG_UNBLOCK as u64, &sys as *const u64 as u64, 0, 8, 0, 0]);
    let begin = ztier_sud_begin as *const () as usize;
    let end = ztier_sud_end as *const () as usize;
    // SAFETY: the region is this library's code; the selector is this
    // thread's own thread-local byte, live as long as the thread.
    let r = unsafe {
        libc::prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, begin, end - begin, selector())
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("syscall user dispatch: {e}")));
    }
    ENABLED.with(|c| c.set(true));
    TID.with(|c| c.set(raw(libc::SYS_gettid, [0; 6])));
    if crate::sigstack::attach(true) {
        hook_exit();
    }
    Ok(())
}

/// In a forked child: dispatch is off there (the kernel does not keep it
/// across `fork`), though this thread's copy of the flags says on.
pub fn enable_after_fork() -> std::io::Result<()> {
    ENABLED.with(|c| c.set(false));
    enable_thread()
}

/// Memory ranges a call reads or writes (fixed capacity: the handler
/// must not allocate — the interrupted code may be anywhere). A range
/// whose pages touch or overlap the last one's is merged into it (the
/// strings of an `argv` lie side by side), so what is pinned is the same
/// set of pages.
pub(crate) struct Ranges {
    r: [(usize, usize); 64],
    n: usize,
}

impl Ranges {
    pub(crate) fn new() -> Ranges {
        Ranges { r: [(0, 0); 64], n: 0 }
    }
    pub(crate) fn push(&mut self, p: u64, len: u64) {
        if p == 0 || len == 0 {
            return;
        }
        let (p, len) = (p as usize, len.min(1 << 40) as usize);
        let end = p.saturating_add(len);
        if let Some(last) = self.r[..self.n].last_mut() {
            let (q, qend) = (last.0, last.0 + last.1);
            let page = |a: usize| a / crate::PAGE;
            if page(p) <= page(qend - 1) + 1 && page(q) <= page(end - 1) + 1 {
                let lo = p.min(q);
                *last = (lo, end.max(qend) - lo);
                return;
            }
        }
        if self.n < self.r.len() {
            self.r[self.n] = (p, len);
            self.n += 1;
        }
    }
    /// A NUL-terminated string.
    pub(crate) fn cstr(&mut self, p: u64) {
        if p != 0 {
            // SAFETY: the program passed it to the kernel as a string;
            // reading it here faults as the kernel's read would not.
            let len = unsafe { libc::strlen(p as *const libc::c_char) };
            self.push(p, len as u64 + 1);
        }
    }
    /// An array of `n` `iovec`s and their buffers.
    fn iov(&mut self, p: u64, n: u64) {
        if p == 0 {
            return;
        }
        let n = n.min(1024);
        self.push(p, n * 16);
        for k in 0..n {
            // SAFETY: as for `cstr`: the program's iovec array.
            let v = unsafe { (p as *const libc::iovec).add(k as usize).read_unaligned() };
            self.push(v.iov_base as u64, v.iov_len as u64);
        }
    }
    /// A `msghdr`: its name, iovecs and control data.
    fn msg(&mut self, p: u64) {
        if p == 0 {
            return;
        }
        self.push(p, std::mem::size_of::<libc::msghdr>() as u64);
        // SAFETY: as for `cstr`: the program's msghdr.
        let m = unsafe { (p as *const libc::msghdr).read_unaligned() };
        self.push(m.msg_name as u64, m.msg_namelen as u64);
        self.iov(m.msg_iov as u64, m.msg_iovlen as u64);
        self.push(m.msg_control as u64, m.msg_controllen as u64);
    }
    /// A NULL-terminated array of strings (`argv`, `envp`).
    pub(crate) fn strvec(&mut self, p: u64) {
        if p == 0 {
            return;
        }
        let mut k = 0;
        loop {
            // SAFETY: as for `cstr`: the program's pointer array.
            let s = unsafe { (p as *const u64).add(k).read_unaligned() };
            if s == 0 || k >= 4096 {
                break;
            }
            self.cstr(s);
            k += 1;
        }
        self.push(p, (k as u64 + 1) * 8);
    }
    /// A `u32` length read from memory at `p` (an in-out `socklen_t`).
    fn len_at(p: u64) -> u64 {
        if p == 0 {
            return 0;
        }
        // SAFETY: as for `cstr`: the program's length word.
        unsafe { (p as *const u32).read_unaligned() as u64 }
    }
}

/// Fills `r` with the memory `nr` reads or writes; `false` if the call is
/// not in the table.
#[allow(non_upper_case_globals)]
fn memory_of(nr: i64, a: [u64; 6], r: &mut Ranges) -> bool {
    use libc::*;
    const STAT: u64 = std::mem::size_of::<libc::stat>() as u64;
    const STATFS: u64 = std::mem::size_of::<libc::statfs>() as u64;
    const RUSAGE: u64 = std::mem::size_of::<libc::rusage>() as u64;
    match nr {
        SYS_read | SYS_write | SYS_pread64 | SYS_pwrite64 | SYS_getdents64 | SYS_getdents => {
            r.push(a[1], a[2])
        }
        SYS_getrandom | SYS_getcwd => r.push(a[0], a[1]),
        SYS_readv | SYS_writev | SYS_preadv | SYS_pwritev | SYS_preadv2 | SYS_pwritev2 | SYS_vmsplice => {
            r.iov(a[1], a[2])
        }
        SYS_recvfrom | SYS_sendto => {
            r.push(a[1], a[2]);
            if nr == SYS_recvfrom {
                r.push(a[5], 4);
                r.push(a[4], Ranges::len_at(a[5]));
            } else {
                r.push(a[4], a[5]);
            }
        }
        SYS_recvmsg | SYS_sendmsg => r.msg(a[1]),
        SYS_recvmmsg | SYS_sendmmsg => {
            let n = a[2].min(64);
            let size = std::mem::size_of::<libc::mmsghdr>() as u64;
            r.push(a[1], n * size);
            for k in 0..n {
                r.msg(a[1] + k * size);
            }
        }
        SYS_fstat => r.push(a[1], STAT),
        SYS_stat | SYS_lstat => {
            r.cstr(a[0]);
            r.push(a[1], STAT);
        }
        SYS_newfstatat => {
            r.cstr(a[1]);
            r.push(a[2], STAT);
        }
        SYS_statx => {
            r.cstr(a[1]);
            r.push(a[4], 256);
        }
        SYS_statfs => {
            r.cstr(a[0]);
            r.push(a[1], STATFS);
        }
        SYS_fstatfs => r.push(a[1], STATFS),
        SYS_open | SYS_creat | SYS_access | SYS_unlink | SYS_rmdir | SYS_chdir | SYS_chmod | SYS_chown
        | SYS_lchown | SYS_truncate | SYS_mkdir | SYS_mknod | SYS_chroot | SYS_memfd_create => r.cstr(a[0]),
        SYS_openat
        | SYS_faccessat
        | SYS_faccessat2
        | SYS_unlinkat
        | SYS_mkdirat
        | SYS_fchmodat
        | SYS_fchownat
        | SYS_mknodat
        | SYS_inotify_add_watch => r.cstr(a[1]),
        SYS_openat2 => {
            r.cstr(a[1]);
            r.push(a[2], a[3]);
        }
        SYS_readlink => {
            r.cstr(a[0]);
            r.push(a[1], a[2]);
        }
        SYS_readlinkat => {
            r.cstr(a[1]);
            r.push(a[2], a[3]);
        }
        SYS_rename | SYS_link | SYS_symlink => {
            r.cstr(a[0]);
            r.cstr(a[1]);
        }
        SYS_renameat | SYS_renameat2 | SYS_linkat => {
            r.cstr(a[1]);
            r.cstr(a[3]);
        }
        SYS_symlinkat => {
            r.cstr(a[0]);
            r.cstr(a[2]);
        }
        SYS_utimensat => {
            r.cstr(a[1]);
            r.push(a[2], 32);
        }
        SYS_execve => {
            r.cstr(a[0]);
            r.strvec(a[1]);
            r.strvec(a[2]);
        }
        SYS_execveat => {
            r.cstr(a[1]);
            r.strvec(a[2]);
            r.strvec(a[3]);
        }
        SYS_pipe | SYS_pipe2 => r.push(a[0], 8),
        SYS_socketpair => r.push(a[3], 8),
        SYS_poll => r.push(a[0], a[1] * 8),
        SYS_ppoll => {
            r.push(a[0], a[1] * 8);
            r.push(a[2], 16);
            r.push(a[3], a[4]);
        }
        SYS_select | SYS_pselect6 => {
            let set = a[0].div_ceil(64) * 8;
            r.push(a[1], set);
            r.push(a[2], set);
            r.push(a[3], set);
            r.push(a[4], 16);
            if nr == SYS_pselect6 {
                r.push(a[5], 16);
            }
        }
        SYS_epoll_wait | SYS_epoll_pwait | SYS_epoll_pwait2 => r.push(a[1], a[2] * 12),
        SYS_epoll_ctl => r.push(a[3], 12),
        SYS_futex => {
            r.push(a[0], 4);
            // The operation (less the private and clock flags) decides
            // what the fourth and fifth arguments are.
            match a[1] & 127 {
                // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2:
                // a timeout.
                0 | 6 | 9 | 11 | 13 => r.push(a[3], 16),
                _ => {}
            }
            // REQUEUE, CMP_REQUEUE, WAKE_OP, WAIT_REQUEUE_PI,
            // CMP_REQUEUE_PI: a second futex word.
            if matches!(a[1] & 127, 3 | 4 | 5 | 11 | 12) {
                r.push(a[4], 4);
            }
        }
        SYS_fcntl => match a[1] as i32 {
            // struct flock
            F_GETLK | F_SETLK | F_SETLKW | F_OFD_GETLK | F_OFD_SETLK | F_OFD_SETLKW => r.push(a[2], 32),
            // F_SETOWN_EX, F_GETOWN_EX (struct f_owner_ex); the write
            // hints (a u64)
            15 | 16 | 1035..=1038 => r.push(a[2], 8),
            _ => {}
        },
        // No memory at all.
        SYS_close | SYS_lseek | SYS_gettid | SYS_getpid | SYS_getppid | SYS_sched_yield | SYS_dup
        | SYS_dup2 | SYS_dup3 | SYS_fsync | SYS_fdatasync | SYS_socket | SYS_listen | SYS_shutdown
        | SYS_kill | SYS_tgkill | SYS_tkill | SYS_getuid | SYS_geteuid | SYS_getgid | SYS_getegid
        | SYS_umask | SYS_ftruncate | SYS_fallocate | SYS_fadvise64 | SYS_fchmod | SYS_fchown
        | SYS_fchdir | SYS_flock | SYS_eventfd2 | SYS_epoll_create1 | SYS_timerfd_create => {}
        SYS_nanosleep => {
            r.push(a[0], 16);
            r.push(a[1], 16);
        }
        SYS_clock_nanosleep => {
            r.push(a[2], 16);
            r.push(a[3], 16);
        }
        SYS_clock_gettime | SYS_clock_getres => r.push(a[1], 16),
        SYS_gettimeofday => {
            r.push(a[0], 16);
            r.push(a[1], 8);
        }
        SYS_wait4 => {
            r.push(a[1], 4);
            r.push(a[3], RUSAGE);
        }
        SYS_waitid => {
            r.push(a[2], 128);
            r.push(a[4], RUSAGE);
        }
        SYS_accept | SYS_accept4 | SYS_getsockname | SYS_getpeername => {
            r.push(a[2], 4);
            r.push(a[1], Ranges::len_at(a[2]));
        }
        SYS_connect | SYS_bind => r.push(a[1], a[2]),
        SYS_getsockopt => {
            r.push(a[4], 4);
            r.push(a[3], Ranges::len_at(a[4]));
        }
        SYS_setsockopt => r.push(a[3], a[4]),
        SYS_sched_getaffinity | SYS_sched_setaffinity => r.push(a[2], a[1]),
        SYS_uname => r.push(a[0], std::mem::size_of::<libc::utsname>() as u64),
        SYS_sysinfo => r.push(a[0], std::mem::size_of::<libc::sysinfo>() as u64),
        SYS_times => r.push(a[0], 32),
        SYS_getrusage => r.push(a[1], RUSAGE),
        SYS_getrlimit | SYS_setrlimit => r.push(a[1], 16),
        SYS_prlimit64 => {
            r.push(a[2], 16);
            r.push(a[3], 16);
        }
        SYS_mincore => r.push(a[2], a[1].div_ceil(4096)),
        SYS_sendfile => r.push(a[2], 8),
        SYS_copy_file_range | SYS_splice => {
            r.push(a[1], 8);
            r.push(a[3], 8);
        }
        SYS_sigaltstack => {
            const STACK: u64 = std::mem::size_of::<libc::stack_t>() as u64;
            r.push(a[0], STACK);
            r.push(a[1], STACK);
        }
        SYS_rseq => r.push(a[0], a[1]),
        _ => return false,
    }
    true
}

/// Pins the pages of `r` that lie in the arena; returns the page ranges
/// pinned (to unpin), merged where they overlap.
fn pin(g: &crate::Global, r: &Ranges, out: &mut Ranges) {
    for &(p, len) in &r.r[..r.n] {
        let (p, end) = (p.max(g.base), p.saturating_add(len).min(g.base + g.arena_bytes));
        if p >= end {
            continue;
        }
        let first = g.page_of(p);
        let n = g.page_of(end - 1) + 1 - first;
        if out.r[..out.n].iter().any(|&(f, m)| f <= first && first + n <= f + m) {
            continue;
        }
        if out.n == out.r.len() {
            break;
        }
        until_pinned(g, "the memory of a system call", |m| m.pin(first, n, &g.stats));
        out.r[out.n] = (first, n);
        out.n += 1;
    }
}

fn unpin(g: &crate::Global, pinned: &Ranges) {
    if pinned.n > 0 {
        let mut m = crate::lock_program(g);
        for &(first, n) in &pinned.r[..pinned.n] {
            m.unpin(first, n);
        }
    }
}

/// Runs a dispatched call with its memory pinned.
fn dispatch(nr: i64, a: [u64; 6]) -> i64 {
    dispatch_via(nr, a, || raw(nr, a))
}

/// As [`dispatch`], with `call` making the call (or doing what the
/// library does in its place).
fn dispatch_via(nr: i64, a: [u64; 6], call: impl Fn() -> i64) -> i64 {
    let g = match crate::STATE.load(Ordering::Acquire) {
        crate::READY if !crate::inside() => crate::GLOBAL.get(),
        _ => None,
    };
    let Some(g) = g else { return call() };
    g.stats.dispatched_calls.fetch_add(1, Ordering::Relaxed);
    // A long read or write into the arena runs in parts of at most a
    // quarter of the budget, so that what it pins stays well within it.
    let part = (g.cfg.budget_pages / 4).max(16) * crate::PAGE;
    if matches!(nr, libc::SYS_read | libc::SYS_write | libc::SYS_pread64 | libc::SYS_pwrite64)
        && a[2] as usize > part
        && g.in_arena(a[1] as usize)
    {
        return in_parts(nr, a, part as u64);
    }
    let mut r = Ranges::new();
    let known = memory_of(nr, a, &mut r);
    let mut pinned = Ranges::new();
    // Library code from here: what it allocates (glibc's own, e.g. a
    // thread-local's destructor record) must not come from the arena
    // while the manager's lock is held.
    crate::as_inside(|| pin(g, &r, &mut pinned));
    if pinned.n > 0 {
        g.stats.pinned_calls.fetch_add(1, Ordering::Relaxed);
    }
    let frame = crate::sigstack::frame_for_jumps(&pinned as *const Ranges as usize);
    let mut flying = take_off(frame, &pinned);
    let call = || {
        let was = CALLING.with(|c| c.replace(true));
        let r = call();
        CALLING.with(|c| c.set(was));
        r
    };
    let mut ret = call();
    // A call not in the table: if the kernel met a missing page behind
    // one of its arguments, bring back more there and run it again.
    let mut tries = 0;
    while !known && ret == EFAULT && tries < 3 {
        let mut more = Ranges::new();
        for &p in &a {
            if g.in_arena(p as usize) {
                more.push(p, (2u64 << (4 * tries)) * crate::PAGE as u64);
            }
        }
        if more.n == 0 {
            break;
        }
        crate::as_inside(|| pin(g, &more, &mut pinned));
        g.stats.pinned_calls.fetch_add(1, Ordering::Relaxed);
        if flying {
            land();
        }
        flying = take_off(frame, &pinned);
        ret = call();
        tries += 1;
    }
    if ret == 0 {
        crate::as_inside(|| keep_kernel_memory(g, nr, a));
    }
    if flying {
        land();
    }
    crate::as_inside(|| unpin(g, &pinned));
    ret
}

/// Is this task a `vfork` child (`vfork`, `posix_spawn`) of a thread
/// with dispatch, before its `exec`? It shares that thread's
/// thread-local state (the selector still at ALLOW from the parent's
/// `clone`, run where the program made it) but not its dispatch: the
/// kernel does not keep dispatch across a `clone`. A system call it
/// makes through the library's exports ([`fast`]: an `open` or `dup2`
/// before its `exec`) gets its memory pinned as the parent's would, and
/// leaves the selector at BLOCK, which is where the parent's belongs
/// once the child has gone. Asks the kernel only in that state.
fn vfork_child(sel: u8) -> bool {
    sel == ALLOW && DEPTH.with(Cell::get) == 0 && GUARDS.with(Cell::get) == 0 && in_vfork_child()
}

/// Runs `call`, a glibc function that starts a program
/// (the `spawn` module: `posix_spawn`, `system`, `popen`), with the memory
/// that `named` names pinned around it, as the dispatch handler pins a
/// system call's memory; the function's own system calls are caught as
/// usual. `named` reads the program's memory (a cold page there is served
/// as any fault). Outside dispatch, or from library code, `call` runs as
/// is.
pub(crate) fn with_pinned<R>(named: impl FnOnce(&mut Ranges), call: impl FnOnce() -> R) -> R {
    let g = match crate::STATE.load(Ordering::Acquire) {
        crate::READY if active() && !crate::inside() => crate::GLOBAL.get(),
        _ => None,
    };
    let Some(g) = g else { return call() };
    let mut pinned = Ranges::new();
    let frame = crate::sigstack::frame_for_jumps(&pinned as *const Ranges as usize);
    let flying = {
        let _allow = Allow::new();
        let mut r = Ranges::new();
        named(&mut r);
        crate::as_inside(|| pin(g, &r, &mut pinned));
        if pinned.n > 0 {
            g.stats.pinned_calls.fetch_add(1, Ordering::Relaxed);
        }
        take_off(frame, &pinned)
    };
    let ret = call();
    let _allow = Allow::new();
    if flying {
        land();
    }
    crate::as_inside(|| unpin(g, &pinned));
    ret
}

/// Brings back the memory that `named` names, where dispatch is on (for
/// an `exec` in a `vfork` child, which has no dispatch and cannot keep
/// pins: the pages are pinned and let go at once). Returns whether any
/// of it lies in the arena (a call that still failed with `EFAULT` may
/// try again).
pub(crate) fn bring_back(named: impl FnOnce(&mut Ranges)) -> bool {
    let g = match crate::STATE.load(Ordering::Acquire) {
        crate::READY if active() && !crate::inside() => crate::GLOBAL.get(),
        _ => None,
    };
    let Some(g) = g else { return false };
    let _allow = Allow::new();
    let mut r = Ranges::new();
    named(&mut r);
    let mut pinned = Ranges::new();
    crate::as_inside(|| {
        pin(g, &r, &mut pinned);
        unpin(g, &pinned)
    });
    pinned.n > 0
}

/// A system call made through one of the library's own entry points for
/// glibc's wrappers (the `direct` module): the same work as the dispatch
/// handler — the call's memory pinned resident around it — without the
/// signal, so such a call costs what it costs natively plus the pin (a
/// `SIGSYS` round trip is ~3–4 µs a call). `nr` and `a` are the system
/// call whose memory table entry describes `real`'s. `real` is glibc's
/// own function for the call, run with the selector at ALLOW: errno,
/// restarts and cancellation are glibc's. Whenever the dispatch handler
/// would not have been involved (dispatch off, this thread not
/// dispatching, inside library code or the handler), or would do more (a
/// read or write long enough to be split, a call not in its table, one it
/// runs itself), `real` runs as is — and its call takes the signal.
///
/// A thread cancelled inside `real` (a forced unwind through here: no
/// destructors live across the call) keeps its pins until it exits (a
/// thread-specific key's destructor ends them); one that leaves by a
/// jump from a signal handler has them ended by the jump ([`jump`]),
/// or, if the jump bypasses glibc's exported functions, keeps the
/// selector at ALLOW until its next call here.
pub fn fast(nr: i64, a: [u64; 6], real: impl FnOnce() -> isize) -> isize {
    if !active() {
        return real();
    }
    // SAFETY: this thread's own selector byte.
    let sel = unsafe { selector().read_volatile() };
    // A thread that left an earlier call here by `siglongjmp` (a timeout
    // around a blocking read) kept the selector at ALLOW: this call
    // re-arms it.
    let left = sel == ALLOW
        && FAST.with(Cell::get)
        && ENABLED.with(Cell::get)
        && DEPTH.with(Cell::get) == 0
        && GUARDS.with(Cell::get) == 0;
    if sel != BLOCK && !left && !vfork_child(sel) {
        return real();
    }
    let g = match crate::STATE.load(Ordering::Acquire) {
        crate::READY if !crate::inside() => crate::GLOBAL.get(),
        _ => None,
    };
    let Some(g) = g else { return real() };
    let part = (g.cfg.budget_pages / 4).max(16) * crate::PAGE;
    let mut r = Ranges::new();
    let known = match nr {
        // Calls the dispatch handler runs itself (signals, new tasks,
        // exec, memory the kernel keeps writing), made through `syscall`.
        libc::SYS_rt_sigreturn
        | libc::SYS_rt_sigaction
        | libc::SYS_rt_sigprocmask
        | libc::SYS_sigaltstack
        | libc::SYS_rseq
        | libc::SYS_clone
        | libc::SYS_clone3
        | libc::SYS_fork
        | libc::SYS_vfork
        | libc::SYS_execve
        | libc::SYS_execveat => false,
        libc::SYS_read | libc::SYS_write | libc::SYS_pread64 | libc::SYS_pwrite64
            if a[2] as usize > part && g.in_arena(a[1] as usize) =>
        {
            false
        }
        _ => memory_of(nr, a, &mut r),
    };
    if !known {
        return real();
    }
    g.stats.direct_calls.fetch_add(1, Ordering::Relaxed);
    set_selector(ALLOW);
    let mut pinned = Ranges::new();
    crate::as_inside(|| pin(g, &r, &mut pinned));
    if pinned.n > 0 {
        g.stats.pinned_calls.fetch_add(1, Ordering::Relaxed);
    }
    let flying = take_off(&pinned as *const Ranges as usize, &pinned);
    // Saved and put back: a call made here by a handler of the program
    // that interrupted another (see `on_program_signal`) ends inside it.
    let was_fast = FAST.with(|f| f.replace(true));
    let ret = real();
    FAST.with(|f| f.set(was_fast));
    let e = crate::sys::errno();
    if flying {
        land();
    }
    crate::as_inside(|| unpin(g, &pinned));
    set_selector(BLOCK);
    crate::sys::set_errno(e);
    ret
}

/// glibc's `longjmp`, `_longjmp`, `siglongjmp` and `__longjmp_chk`,
/// looked up when the library is loaded (a jump is often made from a
/// signal handler, where `dlsym` is not safe to call).
static REAL_JUMPS: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

/// Which of glibc's jumps [`jump`] ends in.
#[derive(Clone, Copy)]
pub enum Jump {
    /// `longjmp`.
    Longjmp = 0,
    /// `_longjmp`.
    UnderscoreLongjmp = 1,
    /// `siglongjmp`.
    Siglongjmp = 2,
    /// `__longjmp_chk` (what `longjmp` becomes with `_FORTIFY_SOURCE`).
    LongjmpChk = 3,
}

pub(crate) extern "C" fn find_jumps() {
    for (slot, name) in REAL_JUMPS.iter().zip([c"longjmp", c"_longjmp", c"siglongjmp", c"__longjmp_chk"]) {
        // SAFETY: dlsym with a NUL-terminated name, at load time.
        slot.store(unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize, Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static FIND_JUMPS: extern "C" fn() = find_jumps;

/// A jump out of code the program runs (`longjmp` and friends, exported
/// by `shim`): if it leaves levels of the dispatch handler behind — a
/// signal handler of the program, run while the handler made a blocking
/// call for it, jumps out past it (a timeout around `poll`) — those
/// levels are dropped, so the thread's calls are caught again; then
/// glibc's own function jumps.
///
/// A level is left when the jump's target stack pointer lies at or above
/// the stack pointer the program had when that level was entered (glibc
/// keeps it in the `jmp_buf` mangled with the thread's pointer guard;
/// equal when the program made the call with its own `syscall`
/// instruction in the very frame that called `sigsetjmp`).
/// Left at the outermost level, `SIGSYS` (and `SIGBUS` with
/// `--fault-path signal`) is unblocked first: a jump that does not
/// restore a mask would keep the handler's, and a blocked dispatch
/// signal kills the process.
///
/// # Safety
/// `env` is a `jmp_buf` filled by `setjmp`/`sigsetjmp` in a frame still
/// live, as glibc's functions require.
pub unsafe fn jump(which: Jump, env: *mut libc::c_void, val: libc::c_int) -> ! {
    // SAFETY: the caller's jmp_buf.
    unsafe { leave_levels(env.cast::<u64>()) };
    let p = REAL_JUMPS[which as usize].load(Ordering::Relaxed);
    if p == 0 {
        let _ = raw(libc::SYS_write, [2, c"ztier: glibc's longjmp not found\n".as_ptr() as u64, 33, 0, 0, 0]);
        std::process::abort();
    }
    // SAFETY: glibc's function of that name, with the caller's arguments.
    let real = unsafe {
        std::mem::transmute::<usize, unsafe extern "C-unwind" fn(*mut libc::c_void, libc::c_int) -> !>(p)
    };
    // SAFETY: as above.
    unsafe { real(env, val) }
}

/// See [`jump`].
///
/// # Safety
/// `env` points to a `jmp_buf`.
unsafe fn leave_levels(env: *const u64) {
    if !active() || !ENABLED.with(Cell::get) {
        return;
    }
    let depth = DEPTH.with(Cell::get);
    let fast = FAST.with(Cell::get);
    if depth == 0 && !fast && FLIGHTS_N.with(Cell::get) == 0 && !crate::sigstack::in_handler() {
        return;
    }
    let guard: u64;
    // SAFETY: glibc's thread control block on x86-64 keeps the pointer
    // guard at fs:0x30; reading it has no effect.
    unsafe {
        std::arch::asm!("mov {}, fs:[0x30]", out(reg) guard, options(nostack, readonly, preserves_flags))
    };
    // SAFETY: the jmp_buf's saved rsp (index 6 of glibc's x86-64 layout),
    // mangled as glibc's PTR_MANGLE does: xor with the guard, rotate left 17.
    let target = unsafe { env.add(6).read() }.rotate_right(17) ^ guard;
    crate::sigstack::leave(target as usize);
    // Calls in flight the jump leaves: their pins end.
    abandon_flights(target as usize);
    let saved = SAVED_SP.with(Cell::get);
    let mut d = depth;
    while d > 0 {
        let at = saved.get(d as usize - 1).copied().unwrap_or(0);
        if at != 0 && at <= target && target - at < 64 << 20 {
            d -= 1;
        } else {
            break;
        }
    }
    DEPTH.with(|c| c.set(d));
    if d == 0 {
        FAST.with(|f| f.set(false));
        let sys = ours();
        raw(libc::SYS_rt_sigprocmask, [libc::SIG_UNBLOCK as u64, &sys as *const u64 as u64, 0, 8, 0, 0]);
        if GUARDS.with(Cell::get) == 0 {
            set_selector(BLOCK);
        }
    }
}

/// After a successful `sigaltstack` or `rseq`: memory the kernel will
/// write for this thread outside any system call (signal frames, the
/// CPU number) stays pinned while registered, since under a
/// user-mode-only or SIGBUS userfaultfd the kernel's write to a missing
/// page fails and kills the process ([`crate::manager::Manager::keep_pinned`]).
fn keep_kernel_memory(g: &crate::Global, nr: i64, a: [u64; 6]) {
    use crate::manager::KeptKind;
    let (kind, range) = match nr {
        // RSEQ_FLAG_UNREGISTER is 1.
        libc::SYS_rseq => (KeptKind::Rseq, (a[2] & 1 == 0).then_some((a[0], a[1]))),
        _ => return,
    };
    let (first, n) = range.map_or((0, 0), |(p, len)| arena_pages(g, p as usize, len as usize));
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let what = match kind {
        KeptKind::Rseq => "an rseq area",
        KeptKind::Stack => "a thread's stack",
        KeptKind::Robust => "a robust mutex",
        KeptKind::Dtv => "a thread's thread-local table",
    };
    until_pinned(g, what, |m| m.keep_pinned(tid, kind, first, n, &g.stats));
}

/// The arena's pages that bytes `[p, p + len)` touch: (first page,
/// pages), (0, 0) if none.
fn arena_pages(g: &crate::Global, p: usize, len: usize) -> (usize, usize) {
    let (lo, end) = (p.max(g.base), p.saturating_add(len).min(g.base + g.arena_bytes));
    if lo < end {
        (g.page_of(lo), g.page_of(end - 1) + 1 - g.page_of(lo))
    } else {
        (0, 0)
    }
}

/// In a new thread (the library's or the program's), before it runs
/// anything else: its dynamic thread vector stays resident while it runs
/// if it lies in the arena ([`crate::manager::KeptKind::Dtv`]). glibc allocates it in
/// `pthread_create` with the program's `calloc`; where that is the
/// library's, the dynamic linker's calls are sent to glibc's malloc, but
/// a program with an allocator of its own (rustc's jemalloc) gives it
/// arena memory. Each access to a thread-local of this library reads it:
/// a handler thread whose table went out of memory faulted on itself,
/// and under `--fault-path signal` the `SIGBUS` handler's first
/// thread-local faulted again inside the handler (the process died by
/// `SIGSEGV`). A program's thread reaches here with a table in the
/// arena already pinned by its creator ([`ThreadGate`]), so the read of
/// its length cannot fault. A table glibc moves later (a `dlopen`ed library with
/// thread-locals of its own grows it) is not followed.
///
/// x86-64 glibc: the thread's control block, at `%fs:0`, holds the
/// table's address at offset 8; the table's entry -1 (16 bytes before
/// that address, where its allocation starts) holds its length, and the
/// allocation has length + 2 entries of 16 bytes.
pub fn keep_thread_vector() {
    let Some(g) = crate::GLOBAL.get() else { return };
    let dtv: usize;
    // SAFETY: reads the thread pointer's word at offset 8 (glibc's
    // tcbhead_t.dtv), which every glibc thread has.
    unsafe { std::arch::asm!("mov {}, fs:[8]", out(reg) dtv, options(nostack, readonly, preserves_flags)) };
    let start = dtv.wrapping_sub(16);
    if dtv < 16 || !g.in_arena(start) {
        return;
    }
    // SAFETY: entry -1 of the table glibc made for this thread, just
    // allocated and written (calloc): mapped, and most likely still
    // resident (a page evicted since is faulted back as any access).
    let len = unsafe { *(start as *const usize) };
    let (first, n) = arena_pages(g, start, len.saturating_add(2).saturating_mul(16));
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    use crate::manager::KeptKind;
    until_pinned(g, "a thread's thread-local table", |m| {
        m.keep_pinned(tid, KeptKind::Dtv, first, n, &g.stats)
    });
}

/// Pins the pages of a stack the program gives a new thread, before
/// the thread starts (see `pthread_create` in the shim).
pub fn pin_thread_stack(first: usize, n: usize) {
    if let Some(g) = crate::GLOBAL.get() {
        until_pinned(g, "a thread's stack", |m| m.pin(first, n, &g.stats));
    }
}

/// In the new thread, first: its own stack, pages `[first, first + n)`
/// of the arena, is resident while it runs (pinned by its creator, then
/// kept for it by [`keep_thread_stack`]).
pub fn note_thread_stack(first: usize, n: usize) {
    if let Some(g) = crate::GLOBAL.get() {
        let lo = g.base + first * crate::PAGE;
        crate::sigstack::kept_resident(lo, lo + n * crate::PAGE);
    }
}

/// Ends [`pin_thread_stack`] (the thread was not created).
pub fn unpin_thread_stack(first: usize, n: usize) {
    if let Some(g) = crate::GLOBAL.get() {
        crate::lock_program(g).unpin(first, n);
    }
}

/// In the new thread: its stack stays pinned for it
/// ([`crate::manager::Manager::keep_pinned`]), and the pin made before
/// it started ends.
pub fn keep_thread_stack(first: usize, n: usize) {
    if let Some(g) = crate::GLOBAL.get() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        use crate::manager::KeptKind;
        until_pinned(g, "a thread's stack", |m| m.keep_pinned(tid, KeptKind::Stack, first, n, &g.stats));
        crate::lock_program(g).unpin(first, n);
    }
}

/// Runs a pin (`f`, under the manager's lock) until it is done: `false`
/// means a page is owned by an eviction in flight, so it lets go of the
/// lock and tries again shortly. An error (the store cannot give a page
/// back) aborts with a message naming `what`.
fn until_pinned(
    g: &crate::Global,
    what: &str,
    mut f: impl FnMut(&mut crate::manager::Manager) -> std::io::Result<bool>,
) {
    loop {
        let mut m = crate::lock_program(g);
        match f(&mut m) {
            Ok(true) => return,
            Ok(false) => {
                drop(m);
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            Err(e) => {
                eprintln!("ztier: bringing back {what} failed: {e}{}: aborting", crate::filtered(&e));
                std::process::abort();
            }
        }
    }
}

/// A `read`, `write`, `pread64` or `pwrite64` of `a[2]` bytes as calls of
/// at most `part` bytes each, until one comes back short: the result one
/// call would give (bytes done, or the first error if none were).
fn in_parts(nr: i64, a: [u64; 6], part: u64) -> i64 {
    let positioned = matches!(nr, libc::SYS_pread64 | libc::SYS_pwrite64);
    let mut done = 0u64;
    while done < a[2] {
        let n = part.min(a[2] - done);
        let mut b = a;
        b[1] = a[1] + done;
        b[2] = n;
        if positioned {
            b[3] = a[3] + done;
        }
        let r = dispatch(nr, b);
        if r < 0 {
            return if done > 0 { done as i64 } else { r };
        }
        done += r as u64;
        if (r as u64) < n {
            break;
        }
    }
    done as i64
}

/// A clone whose child shares this memory and runs before the parent
/// goes on (`vfork`, `CLONE_VFORK`): the child has no dispatch.
fn vfork_like(nr: i64, a: [u64; 6]) -> bool {
    let vfork = libc::CLONE_VFORK as u64;
    match nr {
        libc::SYS_vfork => true,
        libc::SYS_clone => a[0] & vfork != 0,
        // SAFETY: clone3's first argument is the program's clone_args,
        // whose first field is the flags.
        libc::SYS_clone3 if a[0] != 0 => (unsafe { (a[0] as *const u64).read_unaligned() } & vfork) != 0,
        _ => false,
    }
}

/// A clone whose child shares this memory (`CLONE_VM`).
fn shares_memory(nr: i64, a: [u64; 6]) -> bool {
    let vm = libc::CLONE_VM as u64;
    match nr {
        libc::SYS_clone => a[0] & vm != 0,
        // SAFETY: as in `vfork_like`.
        libc::SYS_clone3 if a[0] != 0 => (unsafe { (a[0] as *const u64).read_unaligned() } & vm) != 0,
        _ => false,
    }
}

/// A fork the program makes by its own system call: a new process (no
/// `CLONE_VM`; with `CLONE_VFORK` too, whose child has a copy of the
/// memory all the same) going on where the caller's stack is — the
/// forks the dispatch handler makes inside the library's fork handlers
/// ([`crate::fork_unseen`]), as `direct`'s `syscall` does without
/// dispatch.
pub(crate) fn program_fork(nr: i64, a: [u64; 6]) -> bool {
    forks_in_place(nr, a)
}

/// A `clone`, `clone3` or `fork` that makes a new process (no
/// `CLONE_VM`) going on where the caller's stack is (no new stack): a
/// fork, whose child returns through this handler as the parent does.
fn forks_in_place(nr: i64, a: [u64; 6]) -> bool {
    let vm = libc::CLONE_VM as u64;
    match nr {
        libc::SYS_fork => true,
        libc::SYS_clone => a[0] & vm == 0 && a[1] == 0,
        libc::SYS_clone3 if a[0] != 0 && a[1] >= std::mem::size_of::<CloneArgs>() as u64 => {
            // SAFETY: the program's clone_args, at least as large as read
            // (a bad pointer faults here as it would fail in the kernel).
            let ca = unsafe { (a[0] as *const CloneArgs).read_unaligned() };
            ca.flags & vm == 0 && ca.stack == 0
        }
        _ => false,
    }
}

/// Says once, in the log, that a thread the program started with its own
/// clone runs without dispatch: the kernel enables it per thread and
/// does not carry it over, and [`clone_with_dispatch`] could not start it
/// with dispatch (a `clone` rather than `clone3`, no thread-local storage
/// of its own, a stack under [`CLONE_STACK_MIN`] or in the arena). Such a
/// thread's faults are served, but its system calls are not caught, so
/// one that reads or writes evicted memory fails with `EFAULT` — unless
/// it is made through one of the glibc functions the library exports
/// by a thread that shares its creator's thread-local storage (as
/// `run_progs/rawclone.c`'s does: [`fast`] finds its thread id is not
/// the creator's and pins the call's memory, as for a `vfork` child;
/// before, none of its 16 writes from cold pages succeeded) — and its
/// `rt_sigprocmask` is not either: with `--fault-path signal`, a fault
/// while it blocks `SIGBUS` ends the process (what glibc's `SIGEV_THREAD`
/// timer did, whose helper thread blocks every signal, before its clone
/// was made with dispatch).
fn warn_raw_thread() {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        "ztier: a thread was started without pthread_create, by a clone() of the program's own that ztier cannot start with system-call catching (no thread-local storage of its own, a small stack or one from malloc, or clone rather than clone3): with --fault-path signal its system calls are not caught, so those on evicted memory may fail with EFAULT, and a fault in it while it blocks SIGBUS ends the process; --fault-path thread serves such threads",
        "ztier: a thread was started without pthread_create, by a clone() of the program's own that ztier cannot start with system-call catching (no thread-local storage of its own, a small stack or one from malloc, or clone rather than clone3): under a user-mode-only userfaultfd its system calls are not caught, so those on evicted memory may fail with EFAULT; as root, or with vm.unprivileged_userfaultfd=1, they are served",
    );
}

/// Says `signal` (with `--fault-path signal`) or `user_mode_only` (under
/// a user-mode-only userfaultfd) in the log ([`crate::notice`]), the
/// first time `said` is found unset.
fn say_once(said: &AtomicBool, signal: &str, user_mode_only: &str) {
    if !said.swap(true, Ordering::Relaxed) {
        let msg = if SIGBUS_ON.load(Ordering::Relaxed) { signal } else { user_mode_only };
        crate::notice(format_args!("{msg}"));
    }
}

/// `rt_sigprocmask`, applied to the mask the handler returns to (a mask
/// set inside a signal handler is undone by its return); `SIGSYS` is
/// never blocked.
fn sigprocmask(uc: &mut libc::ucontext_t, a: [u64; 6]) -> i64 {
    let (how, set, old, size) = (a[0] as libc::c_int, a[1] as *const u64, a[2] as *mut u64, a[3]);
    if size != 8 {
        return -(libc::EINVAL as i64);
    }
    let cur = (&mut uc.uc_sigmask as *mut libc::sigset_t).cast::<u64>();
    // SAFETY: the ucontext the kernel gave the handler; its mask is at
    // least 8 bytes.
    let prev = unsafe { cur.read() };
    if !set.is_null() {
        // SAFETY: the program's sigset, 8 bytes as `size` says.
        let s = unsafe { set.read_unaligned() };
        let new = match how {
            libc::SIG_BLOCK => prev | s,
            libc::SIG_UNBLOCK => prev & !s,
            libc::SIG_SETMASK => s,
            _ => return -(libc::EINVAL as i64),
        };
        // SAFETY: as above.
        unsafe { cur.write(new & !(ours() | bit(libc::SIGKILL) | bit(libc::SIGSTOP))) };
    }
    if !old.is_null() {
        // SAFETY: the program's out-parameter.
        unsafe { old.write_unaligned(prev) };
    }
    0
}

/// `rt_sigaction`: ours stays the `SIGSYS` action (the program's is kept
/// aside); other actions are installed without `SIGSYS` in their masks.
fn sigaction(a: [u64; 6]) -> i64 {
    let (sig, act, old) = (a[0] as libc::c_int, a[1] as *const KSigaction, a[2] as *mut KSigaction);
    if let Some(slot) = kept_slot(sig) {
        let was = kept(slot);
        if !act.is_null() {
            // SAFETY: the program's sigaction.
            keep(slot, &unsafe { act.read_unaligned() });
        }
        if !old.is_null() {
            // SAFETY: the program's out-parameter.
            unsafe { old.write_unaligned(was) };
        }
        return 0;
    }
    if !(1..=64).contains(&sig) {
        return raw(libc::SYS_rt_sigaction, a);
    }
    let was = recorded(sig);
    let was_restorer = PROGRAM_RESTORERS[sig as usize].load(Ordering::Relaxed);
    let mut prev = KSigaction::default();
    let k = (!act.is_null()).then(|| {
        // SAFETY: the program's sigaction.
        wrapped(sig, unsafe { act.read_unaligned() })
    });
    let r = raw(
        libc::SYS_rt_sigaction,
        [a[0], k.as_ref().map_or(0, |k| k as *const _ as u64), &mut prev as *mut _ as u64, a[3], 0, 0],
    );
    if r != 0 {
        PROGRAM_HANDLERS[sig as usize][0].store(was.0, Ordering::Relaxed);
        PROGRAM_HANDLERS[sig as usize][1].store(was.1, Ordering::Relaxed);
        PROGRAM_RESTORERS[sig as usize].store(was_restorer, Ordering::Relaxed);
        return r;
    }
    if !old.is_null() {
        // SAFETY: the program's out-parameter.
        unsafe { old.write_unaligned(unwrapped(prev, was, was_restorer)) };
    }
    r
}

/// A signal of [`ours`] that is not ours (a `SIGSYS` dispatch did not
/// raise, a `SIGBUS` outside the arena): the program's own action, kept
/// in `slot`.
fn chain(sig: libc::c_int, slot: &[AtomicU64; 4], info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let a = kept(slot);
    // A fault's SIGBUS cannot be ignored: the access would fault again
    // forever; the kernel ends the process then, and so does this.
    let ignore = a.handler as usize == libc::SIG_IGN && sig != libc::SIGBUS;
    match a.handler as usize {
        _ if ignore => {}
        libc::SIG_DFL | libc::SIG_IGN => {
            // Its default: end the process, as the kernel would have
            // (with every page in the core, if one is written).
            crate::coredump::before_core(sig);
            set_default(sig);
            // Delivered once the handler returns and unblocks it (a
            // fault's signal comes again anyway when the instruction is
            // retried).
            crate::sys::signal_this_thread(sig);
        }
        f => {
            if a.flags & libc::SA_RESETHAND as u64 != 0 {
                keep(slot, &KSigaction::default());
            }
            // The mask the kernel would have applied for it (never ours):
            // the interrupted one, its handler's and the signal itself;
            // the return through our frame restores the interrupted mask.
            let nodefer = a.flags & libc::SA_NODEFER as u64 != 0;
            // SAFETY: the kernel's ucontext for this signal.
            let was = unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_sigmask };
            // SAFETY: a sigset_t starts with the kernel's 64-bit set.
            let was = unsafe { (&was as *const libc::sigset_t).cast::<u64>().read() };
            let set = (was | a.mask | if nodefer { 0 } else { bit(sig) }) & !ours();
            raw(libc::SYS_rt_sigprocmask, [libc::SIG_SETMASK as u64, &set as *const u64 as u64, 0, 8, 0, 0]);
            crate::sigstack::run(sig, f as u64, a.flags, info, ctx);
        }
    }
}

/// Keeps the thread's `errno` across a signal handler: the handler's own
/// calls (a contended lock's futex, a sleep) must not change what the
/// program sees (a dispatched call reports through `rax`; its wrapper
/// sets `errno` from that).
struct KeepErrno(libc::c_int);

impl KeepErrno {
    fn new() -> KeepErrno {
        // SAFETY: this thread's errno.
        KeepErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// Says once, in the log, that `io_uring` and Linux AIO are not offered
/// (see [`on_sigsys`]).
fn refuse_async_io() {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        "ztier: io_uring and Linux AIO are not offered with --fault-path signal (the kernel would meet evicted buffers after the call): the program was told ENOSYS",
        "ztier: io_uring and Linux AIO are not offered under a user-mode-only userfaultfd (the kernel would meet evicted buffers after the call): the program was told ENOSYS; as root, or with vm.unprivileged_userfaultfd=1, they are",
    );
}

/// The dispatch handler (see the module docs).
extern "C" fn on_sigsys(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an
    // SA_SIGINFO handler.
    let (code, uc) = unsafe { ((*info).si_code, &mut *ctx.cast::<libc::ucontext_t>()) };
    let _errno = KeepErrno::new();
    let _entry = crate::sigstack::Entry::new(uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize);
    // SAFETY: this thread's own selector byte.
    let prev = unsafe { selector().read_volatile() };
    set_selector(ALLOW);
    let depth = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    let sp = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64;
    SAVED_SP.with(|s| {
        let mut v = s.get();
        if let Some(at) = v.get_mut(depth as usize - 1) {
            *at = sp;
        }
        s.set(v);
    });
    let mut after = BLOCK;
    if code != SYS_USER_DISPATCH {
        // The program's own (seccomp's, a kill): its handler runs with
        // calls let through, since SIGSYS is blocked while it runs.
        chain(sig, &PROGRAM_SIGSYS, info, ctx);
        after = prev;
    } else {
        // SAFETY: a dispatch siginfo: `si_syscall` is the int at byte 24.
        let nr = unsafe { info.cast::<u8>().add(24).cast::<i32>().read() } as i64;
        let reg = |r: libc::c_int| uc.uc_mcontext.gregs[r as usize] as u64;
        let a = [
            reg(libc::REG_RDI),
            reg(libc::REG_RSI),
            reg(libc::REG_RDX),
            reg(libc::REG_R10),
            reg(libc::REG_R8),
            reg(libc::REG_R9),
        ];
        let (rax, rip) = (libc::REG_RAX as usize, libc::REG_RIP as usize);
        match nr {
            libc::SYS_rt_sigreturn => {
                uc.uc_mcontext.gregs[rip] = ztier_sud_sigaction_return as *const () as usize as i64;
            }
            libc::SYS_clone | libc::SYS_clone3 | libc::SYS_fork | libc::SYS_vfork => {
                if vfork_like(nr, a) {
                    // The child (posix_spawn, system) runs without
                    // dispatch until it execs: bring back the
                    // environment its exec will read, the part of its
                    // memory most likely to be old enough to be out.
                    extern "C" {
                        static environ: *const *const libc::c_char;
                    }
                    // SAFETY: glibc's environment pointer, read once.
                    let env = unsafe { environ } as u64;
                    crate::as_inside(|| Ranges::new().strvec(env));
                }
                // A new thread not started through `pthread_create` (ours
                // runs glibc's with the selector at ALLOW, so its clone is
                // never caught): the program's own clone, or a thread
                // glibc starts by its internal call. Made here if it can
                // be given dispatch from its start.
                let made = if !vfork_like(nr, a) && shares_memory(nr, a) {
                    let r = clone_with_dispatch(nr, a, uc);
                    if r.is_none() {
                        warn_raw_thread();
                    }
                    r
                } else if program_fork(nr, a) {
                    // A fork: the library's handlers around it, unless it
                    // is glibc's own (they ran) — see `fork_unseen`.
                    crate::fork_unseen(nr, a)
                } else {
                    None
                };
                if let Some(r) = made {
                    uc.uc_mcontext.gregs[rax] = r;
                } else {
                    // Back to the `syscall` instruction (2 bytes), run there.
                    uc.uc_mcontext.gregs[rax] = nr;
                    uc.uc_mcontext.gregs[rip] -= 2;
                    after = ALLOW;
                }
            }
            libc::SYS_rt_sigprocmask => uc.uc_mcontext.gregs[rax] = sigprocmask(uc, a),
            libc::SYS_rt_sigaction => uc.uc_mcontext.gregs[rax] = sigaction(a),
            libc::SYS_sigaltstack => {
                // The program's alternate stack is the library's to keep
                // (see `crate::sigstack`); its two stack_t are pinned.
                let sp = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize;
                uc.uc_mcontext.gregs[rax] =
                    dispatch_via(nr, a, || crate::sigstack::sigaltstack(a[0], a[1], sp));
            }
            libc::SYS_io_uring_setup | libc::SYS_io_setup => {
                // Their buffers are read and written by the kernel after
                // the call that submits them, where no pin can reach:
                // each transfer on an evicted page would fail (measured:
                // `run_progs/uring.c`, every transfer in both modes). The
                // program is told they do not exist, and falls back.
                refuse_async_io();
                uc.uc_mcontext.gregs[rax] = -(libc::ENOSYS as i64);
            }
            libc::SYS_execve | libc::SYS_execveat => {
                // The new program starts with the signal mask of the
                // thread at exec: the program's, not this handler's
                // (which blocks SIGSYS). A failed exec returns here, and
                // the handler's return restores it anyway.
                let mask = (&uc.uc_sigmask as *const libc::sigset_t).cast::<u64>();
                raw(libc::SYS_rt_sigprocmask, [libc::SIG_SETMASK as u64, mask as u64, 0, 8, 0, 0]);
                uc.uc_mcontext.gregs[rax] = dispatch(nr, a);
            }
            _ => {
                // The library's own descriptors (see `crate::fds`): kept
                // from the program's calls, left out of its listings.
                uc.uc_mcontext.gregs[rax] = crate::fds::guard(nr, a).unwrap_or_else(|| {
                    dispatch_via(nr, a, || crate::fds::listed(nr, a, || raw(nr, a) as isize) as i64)
                });
            }
        }
    }
    DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    // Nested in an outer dispatch (a handler of the program ran during
    // its call, caught as the program's code is), back to that handler.
    set_selector(after);
}

/// The fault handler of `--fault-path signal`: a missing page of the
/// arena raises `SIGBUS` (`UFFD_FEATURE_SIGBUS`) in the thread that
/// touched it, which serves it here ([`crate::serve_in_thread`]) and
/// retries the instruction on return. Any other `SIGBUS` is the
/// program's.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this signal.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // SAFETY: the kernel's ucontext for this signal.
    let _entry = crate::sigstack::Entry::new(unsafe { interrupted_sp(ctx) });
    let ours = code == BUS_ADRERR && {
        let _errno = KeepErrno::new();
        // SAFETY: this thread's own selector byte.
        let prev = unsafe { selector().read_volatile() };
        set_selector(ALLOW);
        DEPTH.with(|d| d.set(d.get() + 1));
        let served = crate::serve_in_thread(addr);
        DEPTH.with(|d| d.set(d.get() - 1));
        set_selector(prev);
        served
    };
    if !ours {
        // The program's own (a file mapping past its end, …): its handler
        // runs as the interrupted code did, and may leave by longjmp.
        chain(sig, &PROGRAM_SIGBUS, info, ctx);
    }
}
