//! Stacks of the library's own for the program's threads: where signal
//! frames go under dispatch, and where library code runs when the
//! program's stack lies in the arena.
//!
//! Under a user-mode-only or `SIGBUS` userfaultfd (see the `sud` module)
//! the kernel's own write to a missing page of the arena fails — and a
//! signal frame is such a write: the kernel puts it below the
//! interrupted stack pointer. A thread that runs on a stack *in the
//! arena* — a coroutine's stack from `malloc` (`makecontext`,
//! `boost::context`) — has pages below its stack pointer that are
//! evicted or were never touched, and the first signal that lands there
//! kills the process with `SIGSEGV` (measured with `run_progs/coro.c`: at
//! once, in both modes). And under dispatch every system call the
//! handler catches is a signal.
//!
//! So each dispatching thread gets a stack outside the arena (256 KiB
//! reserved, a guard page below, pages used only as touched), whose upper
//! part is its alternate signal stack, armed with `SS_AUTODISARM`, and
//! every handler the kernel runs under dispatch — `SIGSYS`'s, `SIGBUS`'s,
//! and the wrapper of each of the program's (the `sud` module's
//! `on_program_signal`) — is `SA_ONSTACK`. The kernel writes every frame
//! there. The program's own handler is then run where the kernel would
//! have run it ([`run`]):
//!
//! ```text
//!  program stack (maybe in the arena)        library's stack (never in the arena)
//!  ──────────────────────────────────        ───────────────────────────────────────
//!                                            ┌ signal part (192 KiB, the kernel's
//!  interrupted at sp ─── signal ──────────►  │ alternate stack): kernel frame,
//!                                            │ on_program_signal
//!  program's handler runs at sp − 128  ◄───  │ (arms the part below itself first
//!   (or at the top of the program's own      │  if that sp is in the arena)
//!    alternate stack, if SA_ONSTACK)         │
//!  returns ──────────────────────────────►  │ rt_sigreturn: the frame's saved
//!                                            │ stack setting comes back
//!                                            ├ library part (64 KiB): library code
//!                                            │ run off a stack in the arena
//!                                            └ guard page
//! ```
//!
//! - A signal that interrupts the library's own handler on this stack
//!   (a program's handler run during a blocking call made for it) runs
//!   the program's handler below the stack pointer the program had when
//!   it entered the library's handler: natively, the frame would be just
//!   there.
//! - A signal that comes while a program's handler runs gets its frame
//!   on the program's stack, as natively, unless that stack is in the
//!   arena or is the program's alternate stack (small: sized for its
//!   handler, not for the dispatch handler of each call made there):
//!   then the signal part below the running wrapper is armed first (one
//!   system call), so the frame lands here too.
//! - The program's own alternate stack (`sigaltstack`) is emulated: the
//!   call records it for the thread and reports it, `SS_ONSTACK` from
//!   the caller's stack pointer, `EPERM` to change it while on it,
//!   `SS_AUTODISARM` honoured; the kernel never writes there, so it may
//!   lie in the arena with nothing kept pinned. One the thread set up
//!   before dispatch began (Rust's runtime sets up the main thread's
//!   before the library starts) is taken over as the recorded one when
//!   the library's stack replaces it (`adopt_program_stack`).
//! - A handler that leaves by a jump (`siglongjmp`, see the `sud` module's
//!   `jump`) leaves its level here too: the stack is armed again as the
//!   innermost handler still running had it, or whole ([`leave`]).
//! - **Library code off the arena** ([`on_library_stack`], every
//!   `as_inside` stretch): code that may take the manager's lock must not
//!   run on a stack page that can be missing — the page's service needs
//!   that lock (measured: a coroutine's `write`, pinning its buffer, hung
//!   the process). When the stack pointer is in the arena, it runs on the
//!   library part of this stack instead (made when first needed, in
//!   every mode).
//! - A stack the program gives a thread from the arena
//!   (`pthread_attr_setstack`) holds the thread's control block and
//!   thread-locals too; it is kept resident for the thread instead (see
//!   `pthread_create` in the shim), and library code runs on it in place.
//!   (Before, such a thread took a library stack, put aside at its exit
//!   by the library's destructor; the program's destructors run after
//!   that one, and under dispatch the system calls glibc makes after the
//!   last destructor, took another that was never given back: two
//!   mappings left behind per thread, in every mode.)
//! - A thread's stack is put aside at its exit (a key's destructor), and
//!   taken by a new thread once the old one is gone.
//!
//! Left out: a handler that switches away with `swapcontext` and is
//! resumed out of order leaves its frame live below others.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::raw;

/// Reserved per thread (pages are taken only as touched): the library's
/// own code at the bottom ([`LIB`]), signal frames above it.
const SIZE: usize = 256 << 10;
/// The part for library code run off a stack in the arena
/// ([`on_library_stack`]).
const LIB: usize = 64 << 10;
/// A `PROT_NONE` page below the stack.
const GUARD: usize = 4096;
/// Re-armed below a running handler only if this much is left.
const MIN_LEFT: usize = 32 << 10;
const SS_AUTODISARM: i32 = 1 << 31;
/// Nested levels of the program's handlers tracked for jumps.
const LEVELS_MAX: usize = 16;

thread_local! {
    /// The lowest byte of this thread's stack (0: none).
    static BASE: Cell<usize> = const { Cell::new(0) };
    /// Its signal part is the kernel's alternate stack (under dispatch).
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// The stack pointer of library code on [`LIB`] that a signal
    /// interrupted (0: none): library code run from that signal's handler
    /// goes below it.
    static LIB_LIMIT: Cell<usize> = const { Cell::new(0) };
    /// The program's own alternate stack: `(ss_sp, ss_size, ss_flags)`,
    /// `SS_DISABLE` when it has none.
    static PROGRAM: Cell<(usize, usize, i32)> = const { Cell::new((0, 0, libc::SS_DISABLE)) };
    /// The stack pointer of the program's code when it last entered a
    /// handler of the library from off this stack.
    static PROGRAM_SP: Cell<usize> = const { Cell::new(0) };
    /// The program's handlers running: the stack pointer each started
    /// at, and the top of this stack as armed for it (0: not armed).
    static LEVELS: Cell<[(usize, usize); LEVELS_MAX]> = const { Cell::new([(0, 0); LEVELS_MAX]) };
    static LEVELS_N: Cell<usize> = const { Cell::new(0) };
    /// This thread's own stack, `[lo, hi)`, when it lies in the arena and
    /// is kept resident for the thread (given by `pthread_attr_setstack`;
    /// see `pthread_create` in the shim): library code runs on it in place.
    static KEPT: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// Says that the calling thread's own stack `[lo, hi)` stays resident
/// while it runs (see [`KEPT`]).
pub fn kept_resident(lo: usize, hi: usize) {
    KEPT.with(|k| k.set((lo, hi)));
}

/// Stacks of threads that exited: `base >> 12 << 22 | tid` (0: free slot).
static RETIRED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Arms the signal part of the stack at `base` up to `top`.
fn arm(base: usize, top: usize) {
    let ss = libc::stack_t {
        ss_sp: (base + LIB) as *mut libc::c_void,
        ss_flags: SS_AUTODISARM,
        ss_size: top - base - LIB,
    };
    raw(libc::SYS_sigaltstack, [&ss as *const libc::stack_t as u64, 0, 0, 0, 0, 0]);
}

fn disarm() {
    let ss = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
    raw(libc::SYS_sigaltstack, [&ss as *const libc::stack_t as u64, 0, 0, 0, 0, 0]);
}

/// Gives the calling thread its stack (a forked child keeps the one it
/// inherited) and with `arm` makes its signal part the kernel's
/// alternate stack. Returns false if none could be mapped.
pub fn attach(arm_it: bool) -> bool {
    let mut base = BASE.with(Cell::get);
    if base == 0 {
        base = reuse().unwrap_or_else(|| {
            let p = raw(
                libc::SYS_mmap,
                [
                    0,
                    (SIZE + GUARD) as u64,
                    (libc::PROT_READ | libc::PROT_WRITE) as u64,
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK) as u64,
                    u64::MAX,
                    0,
                ],
            );
            if p < 0 {
                return 0;
            }
            raw(libc::SYS_mprotect, [p as u64, GUARD as u64, libc::PROT_NONE as u64, 0, 0, 0]);
            p as usize + GUARD
        });
        if base == 0 {
            return false;
        }
        BASE.with(|b| b.set(base));
    }
    if !arm_it {
        return true;
    }
    if !ARMED.with(Cell::get) {
        adopt_program_stack(base);
    }
    ARMED.with(|a| a.set(true));
    // A child forked from inside a handler of the program keeps its
    // level's setting.
    arm_for_levels(base, LEVELS_N.with(Cell::get));
    true
}

/// Before the library's stack becomes the kernel's alternate stack: an
/// alternate stack the program set up before dispatch began (with a real
/// `sigaltstack`: Rust's runtime does so at start, for its stack-overflow
/// handler, before the library starts) becomes the emulated one, as if
/// the call had come later. Replaced unseen, it was lost: the program's
/// `SA_ONSTACK` handler then ran on the overflowed stack itself, faulted
/// again and the process died by `SIGSEGV` without the runtime's "has
/// overflowed its stack". The library's own stack (a forked child
/// inherits it armed) is not the program's.
fn adopt_program_stack(base: usize) {
    // SAFETY: stack_t is plain data; all zeros is valid.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    if raw(libc::SYS_sigaltstack, [0, &mut old as *mut libc::stack_t as u64, 0, 0, 0, 0]) != 0 {
        return;
    }
    let sp = old.ss_sp as usize;
    let ours = (base - GUARD..base + SIZE).contains(&sp);
    if old.ss_flags & libc::SS_DISABLE == 0 && !ours && PROGRAM.with(Cell::get).2 & libc::SS_DISABLE != 0 {
        PROGRAM.with(|p| p.set((sp, old.ss_size, old.ss_flags & SS_AUTODISARM)));
    }
}

/// Arms the stack at `base` as the innermost of the first `n` levels of
/// the program's handlers had it, or whole if `n` is 0.
fn arm_for_levels(base: usize, n: usize) {
    match n {
        0 => arm(base, base + SIZE),
        _ => match LEVELS.with(Cell::get).get(n - 1).map_or(0, |l| l.1) {
            0 => disarm(),
            top => arm(base, top),
        },
    }
}

/// A stack put aside by a thread that is gone.
fn reuse() -> Option<usize> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for slot in &RETIRED {
        let v = slot.load(Ordering::Acquire);
        if v == 0 {
            continue;
        }
        let tid = (v & ((1 << 22) - 1)) as i64;
        // ESRCH: that thread has exited (signal 0 only checks).
        if raw(libc::SYS_tgkill, [pid as u64, tid as u64, 0, 0, 0, 0]) == -(libc::ESRCH as i64)
            && slot.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            return Some(((v >> 22) << 12) as usize);
        }
    }
    None
}

/// At the thread's exit: its stack is disarmed and put aside for a later
/// thread (or unmapped if there is no room to keep it).
pub fn detach() {
    let base = BASE.with(|b| b.replace(0));
    if base == 0 {
        return;
    }
    if ARMED.with(|a| a.replace(false)) {
        disarm();
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    let v = ((base as u64) >> 12) << 22 | tid;
    if !RETIRED.iter().any(|s| s.compare_exchange(0, v, Ordering::AcqRel, Ordering::Relaxed).is_ok()) {
        raw(libc::SYS_munmap, [(base - GUARD) as u64, (SIZE + GUARD) as u64, 0, 0, 0, 0]);
    }
}

fn ours(sp: usize) -> bool {
    let base = BASE.with(Cell::get);
    base != 0 && sp > base && sp <= base + SIZE
}

/// A handler of the library entered with the interrupted stack pointer
/// `sp` (from the signal's context): the program's, remembered while it
/// runs, for the program's handlers run from inside it; or the library
/// code's on [`LIB`], which code run from inside it must stay below.
pub struct Entry(usize, usize);

impl Entry {
    pub fn new(sp: usize) -> Entry {
        let was = (PROGRAM_SP.with(Cell::get), LIB_LIMIT.with(Cell::get));
        let base = BASE.with(Cell::get);
        if !ours(sp) {
            PROGRAM_SP.with(|p| p.set(sp));
        } else if sp <= base + LIB {
            LIB_LIMIT.with(|p| p.set(sp));
        }
        Entry(was.0, was.1)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        PROGRAM_SP.with(|p| p.set(self.0));
        LIB_LIMIT.with(|p| p.set(self.1));
    }
}

/// Runs library code `f` off the program's stack when `in_arena` says
/// that stack lies in the arena: such code may take the manager's lock,
/// and a page of its stack found missing under that lock could not be
/// served (the service needs the lock). It runs on the bottom part of
/// this thread's stack instead, below any library code a signal
/// interrupted there. A stack made here for a thread that had none is
/// put aside at the thread's exit: `hook_exit` marks the thread for that
/// (the dispatch module's exit hook, which calls [`detach`]).
pub fn on_library_stack<R, F: FnOnce() -> R>(
    in_arena: impl FnOnce(usize) -> bool,
    hook_exit: impl FnOnce(),
    f: F,
) -> R {
    let Ok(mut base) = BASE.try_with(Cell::get) else { return f() };
    let sp = here();
    let (lo, hi) = KEPT.with(Cell::get);
    if ours(sp) || !in_arena(sp) || (lo..hi).contains(&sp) {
        return f();
    }
    if base == 0 {
        // A thread that does not dispatch (all of them in full mode):
        // its stack, made when first needed, with no signal part armed.
        if !attach(false) {
            return f();
        }
        hook_exit();
        base = BASE.with(Cell::get);
    }
    let top = match LIB_LIMIT.with(Cell::get) {
        0 => base + LIB,
        limit => limit.saturating_sub(512) & !15,
    };
    if top < base + (8 << 10) {
        return f();
    }
    let was = PROGRAM_SP.with(|p| p.replace(sp));
    let mut slot: (Option<F>, Option<R>) = (Some(f), None);
    extern "C" fn trampoline<R, F: FnOnce() -> R>(p: *mut libc::c_void) {
        // SAFETY: `p` is the slot below, live across the call.
        let s = unsafe { &mut *p.cast::<(Option<F>, Option<R>)>() };
        if let Some(f) = s.0.take() {
            s.1 = Some(f());
        }
    }
    // SAFETY: `top` is on this thread's own stack, below anything live
    // there; the trampoline takes the slot's address.
    unsafe {
        call_on_stack(
            top,
            trampoline::<R, F> as *const () as usize,
            (&mut slot as *mut (Option<F>, Option<R>)).cast(),
        )
    };
    PROGRAM_SP.with(|p| p.set(was));
    match slot.1 {
        Some(r) => r,
        None => unreachable!("the trampoline ran"),
    }
}

/// Calls the C function at `f` with `arg`, its stack pointer at `sp`
/// (aligned down to 16), and comes back to this stack after it returns:
/// what it left in `rax` (its `int` or pointer result, if it has one).
///
/// # Safety
/// `f` is a C function of one pointer argument; the memory below `sp` is
/// free for its frames.
pub unsafe fn call_on_stack(sp: usize, f: usize, arg: *mut libc::c_void) -> u64 {
    let r: u64;
    // SAFETY: the caller's contract; `r12` (callee-saved, so kept across
    // the call) holds this stack pointer meanwhile.
    unsafe {
        std::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {sp}",
            "and rsp, -16",
            "call {f}",
            "mov rsp, r12",
            sp = in(reg) sp,
            f = in(reg) f,
            in("rdi") arg,
            lateout("rax") r,
            out("r12") _,
            clobber_abi("C"),
        )
    };
    r
}

/// Whether `sp` lies on the program's alternate stack `(p, size, flags)`
/// as the kernel decides it (never, with `SS_AUTODISARM`).
fn on_program_stack(sp: usize, (p, size, flags): (usize, usize, i32)) -> bool {
    flags & (libc::SS_DISABLE | SS_AUTODISARM) == 0 && sp > p && sp - p <= size
}

/// Runs the program's handler `h` (with its `flags`) for the signal
/// whose frame the kernel made on this stack, on the stack the kernel
/// would have chosen natively (see the module docs).
pub fn run(sig: libc::c_int, h: u64, flags: u64, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let base = BASE.with(Cell::get);
    // SAFETY: the kernel's ucontext for this signal.
    let uc = unsafe { &mut *ctx.cast::<libc::ucontext_t>() };
    let interrupted = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize;
    if base == 0 || !ARMED.with(Cell::get) || !ours(here()) {
        // No stack of ours (a thread that does not dispatch): the
        // kernel chose the program's stack already.
        call(h, flags, sig, info, ctx);
        return;
    }
    let sp = if ours(interrupted) { PROGRAM_SP.with(Cell::get) } else { interrupted };
    let prog = PROGRAM.with(Cell::get);
    if sp == 0 {
        call(h, flags, sig, info, ctx);
        return;
    }
    // As the kernel decides: the program's alternate stack if the handler
    // asks for it, it has one armed, and is not on it already.
    let onstack =
        flags & libc::SA_ONSTACK as u64 != 0 && prog.2 & libc::SS_DISABLE == 0 && !on_program_stack(sp, prog);
    let start = if onstack { (prog.0 + prog.1) & !15 } else { sp.saturating_sub(128) & !15 };
    // What the program's handler sees as the stack saved in its frame.
    let ours_saved = uc.uc_stack;
    uc.uc_stack = libc::stack_t { ss_sp: prog.0 as *mut libc::c_void, ss_size: prog.1, ss_flags: prog.2 };
    if onstack && prog.2 & SS_AUTODISARM != 0 {
        PROGRAM.with(|p| p.set((0, 0, libc::SS_DISABLE)));
    }
    // Signals that come while the handler runs get frames below this
    // one's — needed if the handler runs in the arena, or on the
    // program's alternate stack (sized for its handler alone: the
    // dispatch handler of a call made there, with its frame, overflowed
    // Rust's, and a stack overflow report ended in SIGSEGV instead of
    // its abort); on the program's own stack elsewhere they go on the
    // handler's stack, as natively (no system call).
    let top = here().saturating_sub(512) & !15;
    let in_arena = crate::GLOBAL.get().is_some_and(|g| g.in_arena(start.saturating_sub(1)));
    let top = if (in_arena || onstack) && top > base + LIB + MIN_LEFT { top } else { 0 };
    if top != 0 {
        arm(base, top);
    }
    let n = LEVELS_N.with(Cell::get);
    if n < LEVELS_MAX {
        LEVELS.with(|l| {
            let mut v = l.get();
            v[n] = (start, top);
            l.set(v);
        });
    }
    LEVELS_N.with(|c| c.set(n + 1));
    // SAFETY: `start` is on the program's stack (below the interrupted
    // stack pointer and its red zone) or at the top of the alternate
    // stack it gave; `h` is its handler for this signal.
    unsafe { call_on(start, h, sig, info, ctx) };
    LEVELS_N.with(|c| c.set(n));
    if onstack && prog.2 & SS_AUTODISARM != 0 && PROGRAM.with(Cell::get).2 & libc::SS_DISABLE != 0 {
        PROGRAM.with(|p| p.set(prog));
    }
    uc.uc_stack = ours_saved;
    // The return through the kernel's frame arms the stack as it was.
}

/// The current stack pointer.
fn here() -> usize {
    let sp: usize;
    // SAFETY: reads rsp.
    unsafe { std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

fn call(h: u64, flags: u64, sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if flags & libc::SA_SIGINFO as u64 != 0 {
        // SAFETY: the program installed this SA_SIGINFO handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h as usize) };
        f(sig, info, ctx)
    } else {
        // SAFETY: the program installed this handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h as usize) };
        f(sig)
    }
}

/// Calls the handler `h` with its stack pointer at `sp`.
///
/// # Safety
/// `sp` is stack memory the handler may use downwards; `h` is a C
/// function taking `(int, siginfo_t *, void *)` (a one-argument handler
/// ignores the rest).
unsafe fn call_on(sp: usize, h: u64, sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: r12 is callee-saved, so it holds our stack pointer across
    // the call; the new stack is 16-byte aligned at the call, as the ABI
    // wants; the handler's clobbers are declared by the C ABI.
    unsafe {
        std::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {sp}",
            "and rsp, -16",
            "call {h}",
            "mov rsp, r12",
            sp = in(reg) sp,
            h = in(reg) h,
            in("rdi") sig as i64,
            in("rsi") info,
            in("rdx") ctx,
            out("r12") _,
            clobber_abi("C"),
        )
    }
}

/// Where a call in flight recorded at `local` (the address of a local of
/// the frame that will end it) lies for a jump: on this stack (the
/// dispatch handler's frame), just below the program's stack pointer at
/// its entry, which a jump back to that frame or above it leaves.
pub fn frame_for_jumps(local: usize) -> usize {
    match PROGRAM_SP.with(Cell::get) {
        sp if sp != 0 && ours(local) => sp - 1,
        _ => local,
    }
}

/// Whether a handler of the program runs on this thread.
pub fn in_handler() -> bool {
    LEVELS_N.with(Cell::get) > 0
}

/// A jump (`longjmp`) to a frame whose stack pointer is `target`: the
/// program's handlers it leaves are over, and the stack is armed as the
/// innermost one still running had it, or whole.
pub fn leave(target: usize) {
    let n = LEVELS_N.with(Cell::get);
    if n == 0 {
        return;
    }
    let levels = LEVELS.with(Cell::get);
    let mut d = n;
    while d > 0 {
        let start = levels.get(d - 1).map_or(0, |l| l.0);
        // A handler's frames lie below where it started (on the same
        // stack, within 64 MiB): a target there keeps it running.
        if target < start && start - target < 64 << 20 {
            break;
        }
        d -= 1;
    }
    if d == n {
        return;
    }
    LEVELS_N.with(|c| c.set(d));
    let base = BASE.with(Cell::get);
    if base == 0 || !ARMED.with(Cell::get) {
        return;
    }
    arm_for_levels(base, d);
}

/// `sigaltstack(new, old)` of the program, made with stack pointer
/// `sp`: recorded and reported, never given to the kernel (whose
/// alternate stack stays the library's). Returns the call's result.
pub fn sigaltstack(new: u64, old: u64, sp: usize) -> i64 {
    if !ARMED.with(Cell::get) {
        return raw(libc::SYS_sigaltstack, [new, old, 0, 0, 0, 0]);
    }
    let prog = PROGRAM.with(Cell::get);
    let on = on_program_stack(sp, prog);
    let mut next = None;
    if new != 0 {
        // SAFETY: stack_t is plain data; all zeros is valid.
        let mut ss: libc::stack_t = unsafe { std::mem::zeroed() };
        if !copy(new as usize, &mut ss as *mut _ as usize, false) {
            return -(libc::EFAULT as i64);
        }
        let mode = ss.ss_flags & !SS_AUTODISARM;
        if on {
            return -(libc::EPERM as i64);
        }
        if mode != 0 && mode != libc::SS_ONSTACK && mode != libc::SS_DISABLE {
            return -(libc::EINVAL as i64);
        }
        next = Some(if mode == libc::SS_DISABLE {
            (0, 0, libc::SS_DISABLE)
        } else if ss.ss_size < libc::MINSIGSTKSZ {
            return -(libc::ENOMEM as i64);
        } else {
            (ss.ss_sp as usize, ss.ss_size, ss.ss_flags & SS_AUTODISARM)
        });
    }
    if old != 0 {
        let flags = if prog.2 & libc::SS_DISABLE != 0 {
            libc::SS_DISABLE
        } else {
            prog.2 | if on { libc::SS_ONSTACK } else { 0 }
        };
        let ss = libc::stack_t { ss_sp: prog.0 as *mut libc::c_void, ss_flags: flags, ss_size: prog.1 };
        if !copy(&ss as *const _ as usize, old as usize, true) {
            return -(libc::EFAULT as i64);
        }
    }
    if let Some(p) = next {
        PROGRAM.with(|c| c.set(p));
    }
    0
}

/// Copies a `stack_t` between the program's memory and ours, with the
/// kernel checking the program's address (`EFAULT`, not a crash, for a
/// bad one); `to_program` says which side is the program's.
fn copy(from: usize, to: usize, to_program: bool) -> bool {
    let len = std::mem::size_of::<libc::stack_t>();
    let local =
        libc::iovec { iov_base: (if to_program { from } else { to }) as *mut libc::c_void, iov_len: len };
    let remote =
        libc::iovec { iov_base: (if to_program { to } else { from }) as *mut libc::c_void, iov_len: len };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    let nr = if to_program { libc::SYS_process_vm_writev } else { libc::SYS_process_vm_readv };
    raw(nr, [pid, &local as *const _ as u64, 1, &remote as *const _ as u64, 1, 0]) == len as i64
}
