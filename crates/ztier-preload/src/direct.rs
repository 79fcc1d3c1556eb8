//! glibc's system-call wrappers, entered directly.
//!
//! Under syscall user dispatch (user-mode-only mode, `--fault-path
//! signal`; see [`crate::sud`]) every system call the program's code
//! makes raises `SIGSYS`, a round trip of ~3–4 µs. The calls programs
//! make most through glibc's exported functions are exported here too,
//! under the same names, so the program (or a library such as CPython,
//! SQLite or the JVM) reaches ours first. Each one hands glibc's own
//! function to [`crate::sud::fast`], which pins the call's memory as the
//! dispatch handler would and runs glibc's function with the selector
//! at ALLOW, no signal. Outside those modes, or on a thread that does not
//! dispatch, glibc's function is simply called.
//!
//! ```text
//!   program ─ recv(fd, buf, n, 0) ─► ztier's recv ─► sud::fast(SYS_recvfrom, [fd, buf, n, 0, 0, 0])
//!                                                         │ pin buf ∩ arena, selector ALLOW
//!                                                         ▼
//!                                                    glibc's recv (errno, restarts, cancellation)
//! ```
//!
//! glibc's functions are looked up with `dlsym(RTLD_NEXT)` when the
//! library is loaded (an `.init_array` entry), since such a call may come
//! from a signal handler, where `dlsym` is not safe; a call made before
//! that (another library's constructor) looks its function up then.
//!
//! Each export names the system call whose memory table entry
//! ([`crate::sud`]'s `memory_of`) describes what glibc's function hands
//! the kernel, with the arguments in that call's order: `recv` is
//! `recvfrom` with no address, `stat` is `stat`'s path and buffer even
//! though glibc makes it a `newfstatat`. The exports are `extern
//! "C-unwind"` and keep no destructors across glibc's call: a thread
//! cancelled inside one (`read`, `recv`, `poll`, … are cancellation
//! points) unwinds through them.
//!
//! `syscall(2)` itself is exported too (the JVM asks for its thread ids
//! with `syscall(SYS_gettid)` thousands of times a second); calls that
//! the dispatch handler must run itself (signals, `clone`, `exec`,
//! `sigaltstack`, `rseq`) still go to it. Without dispatch (the handler
//! thread in full mode), a fork made through it (`SYS_fork`, a `clone`
//! without `CLONE_VM` on the caller's stack) is made inside the library's
//! fork handlers here ([`crate::fork_unseen`]), as the dispatch handler
//! makes it otherwise.

use std::ffi::{c_int, c_long, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{
    epoll_event, iovec, mode_t, msghdr, nfds_t, off_t, pollfd, sigset_t, sockaddr, socklen_t, timespec,
};

/// glibc's function `name` (NUL-terminated), or 0 if this glibc has none
/// (`stat`, `gettid` and `statx` are younger than some glibc releases).
fn lookup(name: &str) -> usize {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) as usize }
}

/// glibc's function at `slot` of `table` (named `name`), looked up now
/// if the library's constructor has not run yet. Aborts with a message
/// if glibc has none (a program could not have been linked to it).
pub(crate) fn real(table: &[AtomicUsize], slot: usize, name: &str) -> usize {
    match table[slot].load(Ordering::Relaxed) {
        0 => {
            let p = lookup(name);
            if p == 0 {
                let msg = format!("ztier: glibc's {} not found\n", name.trim_end_matches('\0'));
                crate::sys::write_stderr(msg.as_bytes());
                std::process::abort();
            }
            table[slot].store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// Six system-call arguments from the first `N`, the rest zero.
fn args<const N: usize>(a: [u64; N]) -> [u64; 6] {
    let mut r = [0; 6];
    r[..N].copy_from_slice(&a);
    r
}

/// Defines each export: `fn name(args) -> ret = SYS_nr, [arguments of
/// that system call];`, with its glibc function's slot and name in
/// `REAL`/`NAMES`.
macro_rules! direct {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $nr:expr, [$($a:expr),*];
    )*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        enum Slot { $($name,)* }

        const NAMES: &[&str] = &[$(concat!(stringify!($name), "\0")),*];

        /// glibc's function for each export (0: not looked up yet).
        static REAL: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

        $(
            $(#[doc = $doc])*
            ///
            /// # Safety
            /// The C contract of glibc's function of the same name.
            #[no_mangle]
            pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
                // The library's own descriptors (`close`, `dup2`, `dup3`;
                // nothing for the other calls).
                if let Some(r) = crate::fds::guard_c($nr, args([$($a as u64),*])) {
                    return r as $ret;
                }
                let p = real(&REAL, Slot::$name as usize, NAMES[Slot::$name as usize]);
                // SAFETY: glibc's function of this name, which has this
                // signature.
                let f = unsafe { std::mem::transmute::<usize, unsafe extern "C-unwind" fn($($ty),*) -> $ret>(p) };
                let a = args([$($a as u64),*]);
                crate::sud::fast($nr, a, || {
                    // (`getdents64`: the library's descriptors left out.)
                    crate::fds::listed($nr, a, || {
                        // SAFETY: the caller's arguments, passed on.
                        unsafe { f($($arg),*) as isize }
                    })
                }) as $ret
            }
        )*
    };
}

direct! {
    /// `read(2)`.
    fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize = libc::SYS_read, [fd, buf, n];
    /// `write(2)`.
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize = libc::SYS_write, [fd, buf, n];
    /// `pread64(2)`.
    fn pread64(fd: c_int, buf: *mut c_void, n: usize, off: off_t) -> isize = libc::SYS_pread64, [fd, buf, n, off];
    /// `pread(2)`: the same call on x86-64.
    fn pread(fd: c_int, buf: *mut c_void, n: usize, off: off_t) -> isize = libc::SYS_pread64, [fd, buf, n, off];
    /// `pwrite64(2)`.
    fn pwrite64(fd: c_int, buf: *const c_void, n: usize, off: off_t) -> isize =
        libc::SYS_pwrite64, [fd, buf, n, off];
    /// `pwrite(2)`: the same call on x86-64.
    fn pwrite(fd: c_int, buf: *const c_void, n: usize, off: off_t) -> isize = libc::SYS_pwrite64, [fd, buf, n, off];
    /// `readv(2)`.
    fn readv(fd: c_int, iov: *const iovec, n: c_int) -> isize = libc::SYS_readv, [fd, iov, n];
    /// `writev(2)`.
    fn writev(fd: c_int, iov: *const iovec, n: c_int) -> isize = libc::SYS_writev, [fd, iov, n];
    /// `preadv(2)`.
    fn preadv(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> isize = libc::SYS_preadv, [fd, iov, n, off];
    /// `preadv64`: the same call on x86-64.
    fn preadv64(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> isize = libc::SYS_preadv, [fd, iov, n, off];
    /// `pwritev(2)`.
    fn pwritev(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> isize = libc::SYS_pwritev, [fd, iov, n, off];
    /// `pwritev64`: the same call on x86-64.
    fn pwritev64(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> isize =
        libc::SYS_pwritev, [fd, iov, n, off];
    /// `lseek(2)`.
    fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t = libc::SYS_lseek, [fd, off, whence];
    /// `lseek64`: the same call on x86-64.
    fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t = libc::SYS_lseek, [fd, off, whence];
    /// `close(2)`.
    fn close(fd: c_int) -> c_int = libc::SYS_close, [fd];
    /// `stat(2)`.
    fn stat(path: *const i8, st: *mut libc::stat) -> c_int = libc::SYS_stat, [path, st];
    /// `stat64`: the same call on x86-64.
    fn stat64(path: *const i8, st: *mut libc::stat) -> c_int = libc::SYS_stat, [path, st];
    /// `lstat(2)`.
    fn lstat(path: *const i8, st: *mut libc::stat) -> c_int = libc::SYS_lstat, [path, st];
    /// `lstat64`: the same call on x86-64.
    fn lstat64(path: *const i8, st: *mut libc::stat) -> c_int = libc::SYS_lstat, [path, st];
    /// `fstat(2)`.
    fn fstat(fd: c_int, st: *mut libc::stat) -> c_int = libc::SYS_fstat, [fd, st];
    /// `fstat64`: the same call on x86-64.
    fn fstat64(fd: c_int, st: *mut libc::stat) -> c_int = libc::SYS_fstat, [fd, st];
    /// `fstatat(2)`.
    fn fstatat(dir: c_int, path: *const i8, st: *mut libc::stat, flags: c_int) -> c_int =
        libc::SYS_newfstatat, [dir, path, st, flags];
    /// `fstatat64`: the same call on x86-64.
    fn fstatat64(dir: c_int, path: *const i8, st: *mut libc::stat, flags: c_int) -> c_int =
        libc::SYS_newfstatat, [dir, path, st, flags];
    /// `statx(2)`.
    fn statx(dir: c_int, path: *const i8, flags: c_int, mask: c_uint, buf: *mut c_void) -> c_int =
        libc::SYS_statx, [dir, path, flags, mask, buf];
    /// `recv(2)`: `recvfrom` with no address.
    fn recv(fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize = libc::SYS_recvfrom, [fd, buf, n, flags];
    /// `recvfrom(2)`.
    fn recvfrom(fd: c_int, buf: *mut c_void, n: usize, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t)
        -> isize = libc::SYS_recvfrom, [fd, buf, n, flags, addr, len];
    /// `recvmsg(2)`.
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> isize = libc::SYS_recvmsg, [fd, msg, flags];
    /// `send(2)`: `sendto` with no address.
    fn send(fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize = libc::SYS_sendto, [fd, buf, n, flags];
    /// `sendto(2)`.
    fn sendto(fd: c_int, buf: *const c_void, n: usize, flags: c_int, addr: *const sockaddr, len: socklen_t)
        -> isize = libc::SYS_sendto, [fd, buf, n, flags, addr, len];
    /// `sendmsg(2)`.
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> isize = libc::SYS_sendmsg, [fd, msg, flags];
    /// `accept(2)`.
    fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int = libc::SYS_accept, [fd, addr, len];
    /// `accept4(2)`.
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int =
        libc::SYS_accept4, [fd, addr, len, flags];
    /// `connect(2)`.
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int = libc::SYS_connect, [fd, addr, len];
    /// `poll(2)`.
    fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int = libc::SYS_poll, [fds, n, timeout];
    /// `ppoll(2)` (the signal mask's size is glibc's to pass).
    fn ppoll(fds: *mut pollfd, n: nfds_t, timeout: *const timespec, mask: *const sigset_t) -> c_int =
        libc::SYS_ppoll, [fds, n, timeout, mask, 8];
    /// `select(2)`.
    fn select(n: c_int, r: *mut c_void, w: *mut c_void, e: *mut c_void, timeout: *mut c_void) -> c_int =
        libc::SYS_select, [n, r, w, e, timeout];
    /// `epoll_wait(2)`.
    fn epoll_wait(fd: c_int, events: *mut epoll_event, n: c_int, timeout: c_int) -> c_int =
        libc::SYS_epoll_wait, [fd, events, n, timeout];
    /// `epoll_pwait(2)`.
    fn epoll_pwait(fd: c_int, events: *mut epoll_event, n: c_int, timeout: c_int, mask: *const sigset_t) -> c_int =
        libc::SYS_epoll_pwait, [fd, events, n, timeout, mask, 8];
    /// `epoll_ctl(2)`.
    fn epoll_ctl(fd: c_int, op: c_int, target: c_int, event: *mut epoll_event) -> c_int =
        libc::SYS_epoll_ctl, [fd, op, target, event];
    /// `nanosleep(2)`.
    fn nanosleep(req: *const timespec, rem: *mut timespec) -> c_int = libc::SYS_nanosleep, [req, rem];
    /// `clock_nanosleep(2)` (returns the error, as glibc's does).
    fn clock_nanosleep(clock: c_int, flags: c_int, req: *const timespec, rem: *mut timespec) -> c_int =
        libc::SYS_clock_nanosleep, [clock, flags, req, rem];
    /// `getdents64(2)`.
    fn getdents64(fd: c_int, buf: *mut c_void, n: usize) -> isize = libc::SYS_getdents64, [fd, buf, n];
    /// `getrandom(2)`.
    fn getrandom(buf: *mut c_void, n: usize, flags: c_uint) -> isize = libc::SYS_getrandom, [buf, n, flags];
    /// `sysinfo(2)` (the JVM asks for free memory often).
    fn sysinfo(info: *mut libc::sysinfo) -> c_int = libc::SYS_sysinfo, [info];
    /// `gettid(2)`.
    fn gettid() -> libc::pid_t = libc::SYS_gettid, [];
    /// `getpid(2)`.
    fn getpid() -> libc::pid_t = libc::SYS_getpid, [];
    /// `sched_yield(2)`.
    fn sched_yield() -> c_int = libc::SYS_sched_yield, [];
    /// `usleep(3)` (glibc's `nanosleep`, its time on glibc's stack).
    fn usleep(us: c_uint) -> c_int = libc::SYS_nanosleep, [];
    /// `access(2)`.
    fn access(path: *const i8, mode: c_int) -> c_int = libc::SYS_access, [path, mode];
    /// `unlink(2)`.
    fn unlink(path: *const i8) -> c_int = libc::SYS_unlink, [path];
    /// `mkdir(2)`.
    fn mkdir(path: *const i8, mode: mode_t) -> c_int = libc::SYS_mkdir, [path, mode];
    /// `rmdir(2)`.
    fn rmdir(path: *const i8) -> c_int = libc::SYS_rmdir, [path];
    /// `rename(2)`.
    fn rename(from: *const i8, to: *const i8) -> c_int = libc::SYS_rename, [from, to];
    /// `readlink(2)`.
    fn readlink(path: *const i8, buf: *mut i8, n: usize) -> isize = libc::SYS_readlink, [path, buf, n];
    /// `pipe(2)`.
    fn pipe(fds: *mut c_int) -> c_int = libc::SYS_pipe, [fds];
    /// `pipe2(2)`.
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int = libc::SYS_pipe2, [fds, flags];
    /// `dup(2)`.
    fn dup(fd: c_int) -> c_int = libc::SYS_dup, [fd];
    /// `dup2(2)`.
    fn dup2(fd: c_int, to: c_int) -> c_int = libc::SYS_dup2, [fd, to];
    /// `dup3(2)`.
    fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int = libc::SYS_dup3, [fd, to, flags];
    /// `fsync(2)`.
    fn fsync(fd: c_int) -> c_int = libc::SYS_fsync, [fd];
    /// `fdatasync(2)`.
    fn fdatasync(fd: c_int) -> c_int = libc::SYS_fdatasync, [fd];
    /// `ftruncate(2)`.
    fn ftruncate(fd: c_int, len: off_t) -> c_int = libc::SYS_ftruncate, [fd, len];
    /// `ftruncate64`: the same call on x86-64.
    fn ftruncate64(fd: c_int, len: off_t) -> c_int = libc::SYS_ftruncate, [fd, len];
    /// `sendfile(2)`.
    fn sendfile(out: c_int, from: c_int, off: *mut off_t, n: usize) -> isize = libc::SYS_sendfile, [out, from, off, n];
    /// `sendfile64`: the same call on x86-64.
    fn sendfile64(out: c_int, from: c_int, off: *mut off_t, n: usize) -> isize =
        libc::SYS_sendfile, [out, from, off, n];
    /// `wait4(2)`.
    fn wait4(pid: libc::pid_t, status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> libc::pid_t =
        libc::SYS_wait4, [pid, status, options, usage];
    /// `waitpid(2)`: `wait4` with no usage.
    fn waitpid(pid: libc::pid_t, status: *mut c_int, options: c_int) -> libc::pid_t =
        libc::SYS_wait4, [pid, status, options];
    /// `uname(2)`.
    fn uname(buf: *mut libc::utsname) -> c_int = libc::SYS_uname, [buf];
    /// `getrusage(2)`.
    fn getrusage(who: c_int, usage: *mut libc::rusage) -> c_int = libc::SYS_getrusage, [who, usage];
    /// `sched_getaffinity(2)`.
    fn sched_getaffinity(pid: libc::pid_t, n: usize, mask: *mut libc::cpu_set_t) -> c_int =
        libc::SYS_sched_getaffinity, [pid, n, mask];
    /// `socket(2)`.
    fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int = libc::SYS_socket, [domain, kind, protocol];
    /// `bind(2)`.
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int = libc::SYS_bind, [fd, addr, len];
    /// `listen(2)`.
    fn listen(fd: c_int, backlog: c_int) -> c_int = libc::SYS_listen, [fd, backlog];
    /// `shutdown(2)`.
    fn shutdown(fd: c_int, how: c_int) -> c_int = libc::SYS_shutdown, [fd, how];
    /// `getsockopt(2)`.
    fn getsockopt(fd: c_int, level: c_int, name: c_int, value: *mut c_void, len: *mut socklen_t) -> c_int =
        libc::SYS_getsockopt, [fd, level, name, value, len];
    /// `setsockopt(2)`.
    fn setsockopt(fd: c_int, level: c_int, name: c_int, value: *const c_void, len: socklen_t) -> c_int =
        libc::SYS_setsockopt, [fd, level, name, value, len];
    /// `getsockname(2)`.
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int =
        libc::SYS_getsockname, [fd, addr, len];
    /// `getpeername(2)`.
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int =
        libc::SYS_getpeername, [fd, addr, len];
    /// `eventfd_read(3)`.
    fn eventfd_read(fd: c_int, value: *mut u64) -> c_int = libc::SYS_read, [fd, value, 8];
    /// `eventfd_write(3)` (the value is written from glibc's stack).
    fn eventfd_write(fd: c_int, value: u64) -> c_int = libc::SYS_write, [fd, 0, 8];
    // What `_FORTIFY_SOURCE` makes of the calls above when the buffer's
    // size is known (Debian builds its packages so).
    /// `__read_chk`: `read` with the buffer's size checked.
    fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, size: usize) -> isize = libc::SYS_read, [fd, buf, n];
    /// `__pread64_chk`: `pread64` with the buffer's size checked.
    fn __pread64_chk(fd: c_int, buf: *mut c_void, n: usize, off: off_t, size: usize) -> isize =
        libc::SYS_pread64, [fd, buf, n, off];
    /// `__pread_chk`: the same call on x86-64.
    fn __pread_chk(fd: c_int, buf: *mut c_void, n: usize, off: off_t, size: usize) -> isize =
        libc::SYS_pread64, [fd, buf, n, off];
    /// `__recv_chk`: `recv` with the buffer's size checked.
    fn __recv_chk(fd: c_int, buf: *mut c_void, n: usize, size: usize, flags: c_int) -> isize =
        libc::SYS_recvfrom, [fd, buf, n, flags];
    /// `__recvfrom_chk`: `recvfrom` with the buffer's size checked.
    fn __recvfrom_chk(
        fd: c_int,
        buf: *mut c_void,
        n: usize,
        size: usize,
        flags: c_int,
        addr: *mut sockaddr,
        len: *mut socklen_t
    ) -> isize = libc::SYS_recvfrom, [fd, buf, n, flags, addr, len];
    /// `__poll_chk`: `poll` with the array's size checked.
    fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, size: usize) -> c_int =
        libc::SYS_poll, [fds, n, timeout];
    /// `__readlink_chk`: `readlink` with the buffer's size checked.
    fn __readlink_chk(path: *const i8, buf: *mut i8, n: usize, size: usize) -> isize =
        libc::SYS_readlink, [path, buf, n];
    /// `__open_2`: `open` without a mode, checked not to need one.
    fn __open_2(path: *const i8, flags: c_int) -> c_int = libc::SYS_openat, [libc::AT_FDCWD, path, flags];
    /// `__open64_2`: the same call on x86-64.
    fn __open64_2(path: *const i8, flags: c_int) -> c_int = libc::SYS_openat, [libc::AT_FDCWD, path, flags];
    /// `__openat_2`: `openat` without a mode, checked not to need one.
    fn __openat_2(dir: c_int, path: *const i8, flags: c_int) -> c_int = libc::SYS_openat, [dir, path, flags];
    /// `__openat64_2`: the same call on x86-64.
    fn __openat64_2(dir: c_int, path: *const i8, flags: c_int) -> c_int = libc::SYS_openat, [dir, path, flags];
}

/// glibc's `syscall`, looked up with the others.
static REAL_SYSCALL: [AtomicUsize; 1] = [AtomicUsize::new(0)];

/// `syscall(2)`: the call numbered `nr`, with up to six arguments.
///
/// Defined with six fixed arguments: on x86-64 a variadic call passes
/// integer arguments exactly as a fixed one does (the sixth on the stack,
/// which a caller passing fewer leaves as whatever its frame holds there;
/// the kernel ignores arguments a call does not take).
///
/// # Safety
/// The C contract of `syscall`, and that of the call numbered `nr`.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    nr: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    let args = [a as u64, b as u64, c as u64, d as u64, e as u64, f as u64];
    if let Some(r) = crate::fds::guard_c(nr, args) {
        return r as c_long;
    }
    // A fork by the program's own system call. Under dispatch the call
    // below raises `SIGSYS` and the dispatch handler makes it inside the
    // library's fork handlers; without dispatch (the handler thread in
    // full mode) it is made that way here, or its child would read zeros
    // from every evicted page.
    if !crate::sud::active() && crate::sud::program_fork(nr, args) {
        if let Some(r) = crate::fork_unseen(nr, args) {
            if (-4095..0).contains(&r) {
                crate::sys::set_errno(-r as c_int);
                return -1;
            }
            return r as c_long;
        }
    }
    let p = real(&REAL_SYSCALL, 0, "syscall\0");
    // SAFETY: glibc's `syscall`, a variadic function of this type.
    let real = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_long, ...) -> c_long>(p) };
    crate::sud::fast(nr, args, || {
        // (`getdents64`: the library's descriptors left out.)
        crate::fds::listed(nr, args, || {
            // SAFETY: the caller's arguments, passed on.
            unsafe { real(nr, a, b, c, d, e, f) as isize }
        })
    }) as c_long
}

/// glibc's `mincore` and `msync`, looked up when first called.
static REAL_RANGE: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// A call over `[addr, addr + len)` that fails with `ENOMEM` on a hole
/// of the arena (`shim::has_hole`: memory the program unmapped), once
/// the kernel's own checks pass (`valid`: a page-aligned start, known
/// flags; a zero length succeeds).
fn range_hole(addr: *mut c_void, len: usize, valid: bool) -> bool {
    // Library code from here (the allocator's lock may be waited for);
    // `sud::fast` after it needs the selector as the program had it.
    let _sud = crate::sud::Allow::new();
    let hole = valid
        && addr as usize % crate::manager::PAGE == 0
        && crate::GLOBAL.get().is_some_and(|g| crate::shim::has_hole(g, addr as usize, len));
    if hole {
        crate::sys::set_errno(libc::ENOMEM);
    }
    hole
}

/// `mincore(2)`: `ENOMEM` on a hole of the arena, as on any unmapped
/// memory (see `shim::has_hole`); else glibc's, its vector pinned.
///
/// # Safety
/// The C contract of `mincore`.
#[no_mangle]
pub unsafe extern "C" fn mincore(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int {
    if range_hole(addr, len, true) {
        return -1;
    }
    let p = real(&REAL_RANGE, 0, "mincore\0");
    // SAFETY: glibc's `mincore`, of this type.
    let f = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, *mut u8) -> c_int>(p)
    };
    let a = [addr as u64, len as u64, vec as u64, 0, 0, 0];
    // SAFETY: the caller's arguments, passed on.
    crate::sud::fast(libc::SYS_mincore, a, || unsafe { f(addr, len, vec) as isize }) as c_int
}

/// `msync(2)`: `ENOMEM` on a hole of the arena, as on any unmapped
/// memory (see `shim::has_hole`); else glibc's.
///
/// # Safety
/// The C contract of `msync`.
#[no_mangle]
pub unsafe extern "C-unwind" fn msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    let known = flags & !(libc::MS_ASYNC | libc::MS_SYNC | libc::MS_INVALIDATE) == 0
        && flags & (libc::MS_ASYNC | libc::MS_SYNC) != libc::MS_ASYNC | libc::MS_SYNC;
    if range_hole(addr, len, known) {
        return -1;
    }
    let p = real(&REAL_RANGE, 1, "msync\0");
    // SAFETY: glibc's `msync`, of this type.
    let f = unsafe {
        std::mem::transmute::<usize, unsafe extern "C-unwind" fn(*mut c_void, usize, c_int) -> c_int>(p)
    };
    let a = [addr as u64, len as u64, flags as u64, 0, 0, 0];
    // SAFETY: the caller's arguments, passed on.
    crate::sud::fast(libc::SYS_msync, a, || unsafe { f(addr, len, flags) as isize }) as c_int
}

/// glibc's `close_range` and `closefrom`, looked up when first called.
static REAL_CLOSE: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// `close_range(2)`: closes around the library's own descriptors
/// ([`crate::fds`]).
///
/// # Safety
/// The C contract of `close_range`.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let a = [first as u64, last as u64, flags as u64, 0, 0, 0];
    if let Some(r) = crate::fds::guard_c(libc::SYS_close_range, a) {
        return r as c_int;
    }
    let p = real(&REAL_CLOSE, 0, "close_range\0");
    // SAFETY: glibc's `close_range`, of this type.
    let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int>(p) };
    // SAFETY: the caller's arguments, passed on.
    crate::sud::fast(libc::SYS_close_range, a, || unsafe { f(first, last, flags) as isize }) as c_int
}

/// `closefrom(3)`: every descriptor from `low` up but the library's own
/// ([`crate::fds`]).
///
/// # Safety
/// The C contract of `closefrom`.
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let a = [low.max(0) as u64, c_uint::MAX as u64, 0, 0, 0, 0];
    if crate::fds::guard_c(libc::SYS_close_range, a).is_some() {
        return;
    }
    let p = real(&REAL_CLOSE, 1, "closefrom\0");
    // SAFETY: glibc's `closefrom`, of this type.
    let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_int)>(p) };
    crate::sud::fast(libc::SYS_close_range, a, || {
        // SAFETY: the caller's argument, passed on.
        unsafe { f(low) };
        0
    });
}

/// glibc's `open`, `open64`, `openat` and `openat64` (variadic: the
/// mode is read only with `O_CREAT` or `O_TMPFILE`), looked up with the
/// others.
static REAL_OPEN: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
const OPEN_NAMES: [&str; 4] = ["open\0", "open64\0", "openat\0", "openat64\0"];

/// An `openat` (`dir` is `AT_FDCWD` for `open`) through glibc's function
/// at `slot` of [`REAL_OPEN`]. The mode is passed on whether or not the
/// flags use it (a caller that passes none leaves a register's value
/// there, which glibc then ignores as it would have).
fn open_via(slot: usize, dir: Option<c_int>, path: *const i8, flags: c_int, mode: mode_t) -> c_int {
    let p = real(&REAL_OPEN, slot, OPEN_NAMES[slot]);
    let at = dir.unwrap_or(libc::AT_FDCWD);
    crate::sud::fast(libc::SYS_openat, [at as u64, path as u64, flags as u64, mode as u64, 0, 0], || {
        // SAFETY: glibc's function of that name, variadic after the path
        // and flags (and the directory for openat), called with the
        // caller's arguments.
        unsafe {
            match dir {
                None => std::mem::transmute::<
                    usize,
                    unsafe extern "C-unwind" fn(*const i8, c_int, ...) -> c_int,
                >(p)(path, flags, mode as c_uint) as isize,
                Some(d) => std::mem::transmute::<
                    usize,
                    unsafe extern "C-unwind" fn(c_int, *const i8, c_int, ...) -> c_int,
                >(p)(d, path, flags, mode as c_uint) as isize,
            }
        }
    }) as c_int
}

/// `open(2)`.
///
/// # Safety
/// The C contract of `open`.
#[no_mangle]
pub unsafe extern "C-unwind" fn open(path: *const i8, flags: c_int, mode: mode_t) -> c_int {
    open_via(0, None, path, flags, mode)
}

/// `open64`: the same call on x86-64.
///
/// # Safety
/// The C contract of `open`.
#[no_mangle]
pub unsafe extern "C-unwind" fn open64(path: *const i8, flags: c_int, mode: mode_t) -> c_int {
    open_via(1, None, path, flags, mode)
}

/// `openat(2)`.
///
/// # Safety
/// The C contract of `openat`.
#[no_mangle]
pub unsafe extern "C-unwind" fn openat(dir: c_int, path: *const i8, flags: c_int, mode: mode_t) -> c_int {
    open_via(2, Some(dir), path, flags, mode)
}

/// `openat64`: the same call on x86-64.
///
/// # Safety
/// The C contract of `openat`.
#[no_mangle]
pub unsafe extern "C-unwind" fn openat64(dir: c_int, path: *const i8, flags: c_int, mode: mode_t) -> c_int {
    open_via(3, Some(dir), path, flags, mode)
}

/// glibc's `fcntl` and `fcntl64` (variadic: the third argument is an
/// integer or a pointer, as the command says), looked up with the others.
static REAL_FCNTL: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
const FCNTL_NAMES: [&str; 2] = ["fcntl\0", "fcntl64\0"];

fn fcntl_via(slot: usize, fd: c_int, cmd: c_int, arg: u64) -> c_int {
    let a = [fd as u64, cmd as u64, arg, 0, 0, 0];
    // The library's own descriptors are not the program's to see.
    if let Some(r) = crate::fds::guard_c(libc::SYS_fcntl, a) {
        return r as c_int;
    }
    let p = real(&REAL_FCNTL, slot, FCNTL_NAMES[slot]);
    crate::sud::fast(libc::SYS_fcntl, a, || {
        // SAFETY: glibc's function of that name, variadic after the
        // command, called with the caller's arguments (the third passed
        // in its register whether or not the command reads it).
        unsafe {
            std::mem::transmute::<usize, unsafe extern "C-unwind" fn(c_int, c_int, ...) -> c_int>(p)(
                fd, cmd, arg,
            ) as isize
        }
    }) as c_int
}

/// `fcntl(2)`.
///
/// # Safety
/// The C contract of `fcntl`.
#[no_mangle]
pub unsafe extern "C-unwind" fn fcntl(fd: c_int, cmd: c_int, arg: u64) -> c_int {
    fcntl_via(0, fd, cmd, arg)
}

/// `fcntl64`: the same call on x86-64.
///
/// # Safety
/// The C contract of `fcntl`.
#[no_mangle]
pub unsafe extern "C-unwind" fn fcntl64(fd: c_int, cmd: c_int, arg: u64) -> c_int {
    fcntl_via(1, fd, cmd, arg)
}

/// glibc's `readdir` and `readdir64`, looked up with the others.
static REAL_READDIR: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
const READDIR_NAMES: [&str; 2] = ["readdir\0", "readdir64\0"];

/// glibc's `readdir` (`slot` 0) or `readdir64` (1), skipping the entries
/// of the library's descriptors in a listing of the process's own
/// ([`crate::fds::hidden_entry`]). glibc reads ahead with its own
/// `getdents64`, which only the dispatch handler sees.
///
/// # Safety
/// The C contract of `readdir`.
unsafe fn readdir_via(slot: usize, d: *mut libc::DIR) -> *mut libc::dirent64 {
    let p = real(&REAL_READDIR, slot, READDIR_NAMES[slot]);
    // SAFETY: glibc's `readdir`/`readdir64` (one function on x86-64), of
    // this type.
    let f = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut libc::DIR) -> *mut libc::dirent64>(p)
    };
    loop {
        // SAFETY: the caller's directory stream.
        let e = unsafe { f(d) };
        // SAFETY: glibc's entry, its name NUL-terminated; `d` is open.
        if e.is_null() || !unsafe { crate::fds::hidden_entry(libc::dirfd(d), (*e).d_name.as_ptr().cast()) } {
            return e;
        }
    }
}

/// `readdir(3)`: glibc's, the library's descriptors left out of a
/// listing of the process's own ([`crate::fds`]).
///
/// # Safety
/// The C contract of `readdir`.
#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut libc::DIR) -> *mut libc::dirent64 {
    // SAFETY: the caller's contract, passed on.
    unsafe { readdir_via(0, d) }
}

/// `readdir64(3)`: as [`readdir`].
///
/// # Safety
/// The C contract of `readdir64`.
#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut libc::DIR) -> *mut libc::dirent64 {
    // SAFETY: the caller's contract, passed on.
    unsafe { readdir_via(1, d) }
}

pub(crate) extern "C" fn look_up_all() {
    for (slot, name) in REAL.iter().zip(NAMES) {
        slot.store(lookup(name), Ordering::Relaxed);
    }
    REAL_SYSCALL[0].store(lookup("syscall\0"), Ordering::Relaxed);
    for (slot, name) in REAL_OPEN
        .iter()
        .zip(OPEN_NAMES)
        .chain(REAL_FCNTL.iter().zip(FCNTL_NAMES))
        .chain(REAL_READDIR.iter().zip(READDIR_NAMES))
    {
        slot.store(lookup(name), Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static LOOK_UP_ALL: extern "C" fn() = look_up_all;
