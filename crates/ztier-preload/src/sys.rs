//! Raw system calls. Inside this library `mmap`, `munmap`, `madvise`, …
//! name our own interposers (symbol interposition applies to the library
//! itself), so every call that must reach the kernel goes through
//! `syscall(2)` here. (`syscall` is exported by the library too, see
//! `direct`; called from library code it goes straight to glibc's.)
//!
//! The library's own system-call entry is here too: the code region
//! Syscall User Dispatch always lets through (`ztier_sud_begin` ..
//! `ztier_sud_end`: a six-argument `syscall` and `rt_sigreturn`), and
//! [`raw`], which calls through it. The dispatch itself is `sud`'s.

use libc::{c_int, c_long, c_void};

/// The plain calls (`syscall(2)`, caught by the dispatch like the
/// program's) live with the manager's crate; the library uses them
/// through here.
pub use ztier_run_core::sys::{errno, madvise, mmap, mprotect, tgkill, PAGE};

// The region system calls are always allowed from: a six-argument
// system call (the number in rdi, as `syscall(2)`'s C signature), and
// `rt_sigreturn` (the restorer of our handler, and where a program's
// signal return is sent). The restorer is glibc's `__restore_rt` to a
// debugger: gdb takes a return address for a signal frame only in a
// function whose name has "sigaction" in it (or is `__restore_rt`) and
// whose code is `mov rax, 15; syscall` with that encoding
// (48 c7 c0 0f 00 00 00 0f 05). With `mov eax, 15` a backtrace of a
// thread in a dispatched call ended at the handler ("?? ()"): the
// program's frames under it — which futex a waiting thread waits on —
// were out of sight.
std::arch::global_asm!(
    ".pushsection .text.ztier_sud,\"ax\",@progbits",
    ".balign 64",
    ".globl ztier_sud_begin",
    ".hidden ztier_sud_begin",
    "ztier_sud_begin:",
    ".globl ztier_sud_syscall6",
    ".hidden ztier_sud_syscall6",
    "ztier_sud_syscall6:",
    "mov rax, rdi",
    "mov rdi, rsi",
    "mov rsi, rdx",
    "mov rdx, rcx",
    "mov r10, r8",
    "mov r8, r9",
    "mov r9, [rsp + 8]",
    "syscall",
    "ret",
    ".balign 16",
    ".globl ztier_sud_sigaction_return",
    ".hidden ztier_sud_sigaction_return",
    "ztier_sud_sigaction_return:",
    // `mov rax, 15`, spelled out so no assembler shortens it.
    ".byte 0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00",
    "syscall",
    "ud2",
    ".globl ztier_sud_end",
    ".hidden ztier_sud_end",
    "ztier_sud_end:",
    ".popsection",
);

extern "C" {
    pub(crate) fn ztier_sud_begin();
    pub(crate) fn ztier_sud_end();
    pub(crate) fn ztier_sud_sigaction_return();
    pub(crate) fn ztier_sud_syscall6(nr: i64, a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64;
}

/// Runs a system call from inside the region (never dispatched).
pub(crate) fn raw(nr: i64, a: [u64; 6]) -> i64 {
    // SAFETY: the arguments are the program's own for this call (or ours,
    // valid for it); the kernel checks them.
    unsafe { ztier_sud_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// `munmap(2)` by syscall.
pub fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: as above; unmapping memory nobody uses is the caller's contract.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

/// `mremap(2)` by syscall.
pub fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new: *mut c_void,
) -> *mut c_void {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags as c_long, new) as *mut c_void }
}

/// `pkey_mprotect(2)` by syscall.
pub fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, pkey: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_pkey_mprotect, addr, len, prot as c_long, pkey as c_long) as c_int }
}

/// Sends `sig` to the calling thread (delivered once it is unblocked,
/// e.g. when the signal handler running now returns).
pub fn signal_this_thread(sig: c_int) {
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    tgkill(pid, tid, sig);
}

/// Writes `msg` to stderr by `write(2)` (no buffering, no lock: usable
/// before the library is set up and where Rust's stderr is not).
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: writes a live buffer of that length to fd 2.
    unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
}

/// Whether the page at `addr` (page-aligned) is in memory, by
/// `mincore(2)`; false if the call fails.
pub fn present(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore over one page writes one byte into `v`.
    let r = unsafe { libc::syscall(libc::SYS_mincore, addr, PAGE, &mut v as *mut u8) };
    r == 0 && v & 1 != 0
}

/// Sets errno.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The signals the kernel raises for the instruction a thread runs (a
/// fault, a trap, a dispatched system call): never blocked by the
/// library, since a blocked one kills the process.
const SYNCHRONOUS: u64 = (1 << (libc::SIGSEGV - 1))
    | (1 << (libc::SIGBUS - 1))
    | (1 << (libc::SIGILL - 1))
    | (1 << (libc::SIGFPE - 1))
    | (1 << (libc::SIGTRAP - 1))
    | (1 << (libc::SIGSYS - 1));

/// Every signal but the synchronous ones: what a thread of the library
/// blocks for good, and a thread of the program while it holds the
/// manager's lock (a handler of the program that touched an evicted page
/// there would wait for a fault service that waits for that lock).
pub const ASYNC_SIGNALS: u64 = !SYNCHRONOUS;

/// glibc's own signals, which it never lets a program block: 32
/// (`SIGCANCEL`, `pthread_cancel`) and 33 (`SIGSETXID`: `setuid`,
/// `setgid`, `setgroups` and the like send it to every thread, each of
/// which makes the change for itself, and wait until all have).
const GLIBC_SIGNALS: u64 = (1 << 31) | (1 << 32);

/// What a thread of the library blocks for good: [`ASYNC_SIGNALS`] but
/// glibc's own. With 33 blocked too, a program's `setuid` waited for the
/// library's threads for ever (a daemon dropping root hung at start-up).
pub const LIBRARY_THREAD_SIGNALS: u64 = ASYNC_SIGNALS & !GLIBC_SIGNALS;

/// A raw system call's result (-errno on failure) as a C function
/// returns it: -1 with `errno` set.
pub fn c_ret(r: i64) -> i64 {
    if r < 0 {
        set_errno(-r as c_int);
        -1
    } else {
        r
    }
}

/// `FUTEX_WAIT` (process-private) on `word` while it holds `val`, for at
/// most `timeout` (`None`: until woken). Made through the library's own
/// system-call entry ([`raw`]): it reads no thread-local and
/// sets no `errno`, so a new thread may wait before it may read any
/// (the dispatch module's `ThreadGate`).
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, val: u32, timeout: Option<&libc::timespec>) {
    let ts = timeout.map_or(0, |t| t as *const libc::timespec as u64);
    let op = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64;
    raw(libc::SYS_futex, [word.as_ptr() as u64, op, val as u64, ts, 0, 0]);
}

/// `FUTEX_WAKE` (process-private): wakes up to `n` waiters on `word`
/// (as [`futex_wait`], through the library's own entry).
pub fn futex_wake(word: &std::sync::atomic::AtomicU32, n: u32) {
    let op = (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64;
    raw(libc::SYS_futex, [word.as_ptr() as u64, op, n as u64, 0, 0, 0]);
}

/// `rt_sigprocmask(how, set)` for the calling thread; returns the mask
/// it had.
pub fn sigprocmask(how: c_int, set: u64) -> u64 {
    let mut old = 0u64;
    // SAFETY: kernel-sized (8-byte) signal sets, ours.
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, how as c_long, &set as *const u64, &mut old as *mut u64, 8)
    };
    old
}

#[cfg(test)]
mod tests {
    /// A debugger must see the restorer as a signal trampoline (see the
    /// region above): gdb's test for one on x86-64 Linux is this code.
    #[test]
    fn the_restorer_is_the_code_a_debugger_knows_as_a_signal_return() {
        let at = super::ztier_sud_sigaction_return as *const () as *const [u8; 9];
        // SAFETY: the restorer's first nine bytes, in the region's code.
        let code = unsafe { at.read() };
        assert_eq!(code, [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05]);
    }
}
