//! The library's own file descriptors, kept out of the program's way.
//!
//! The library holds a few descriptors for as long as a process runs:
//! the userfaultfd, the evictor's eventfd, the control socket, the
//! spill file, and in a forked child with the tree scope its page map
//! and its parent's. A program that closes every descriptor it does not
//! know —
//! `close_range(3, ~0U, 0)`, `closefrom(3)` or a loop of `close`, as
//! daemons do at start-up and CPython's `os.closerange` does — closed them
//! too: the next fault then failed (`EBADF`), and the process was aborted
//! (`--fault-path signal`) or killed by `SIGSEGV` (the handler thread).
//! So:
//!
//! - each is moved up at creation ([`keep`]: `F_DUPFD_CLOEXEC` from
//!   [`low`], 960 under the usual limit of 1024), out of the numbers a
//!   program counts on: the lowest free one for its next `open`, the
//!   small ones it `dup2`s onto (a shell's 10 and 255);
//! - the program's `close` of one fails with `EBADF`, as it would
//!   natively, and leaves it open; its `close_range` and `closefrom`
//!   close around them; its `dup2`/`dup3` onto one fails with `EBADF`,
//!   said once in the log ([`guard`]). That holds for glibc's functions
//!   (exported in the `direct` module), `syscall(2)` with those numbers,
//!   and, where system calls are caught (the `sud` module), the raw calls
//!   too. A raw `close` system call in full mode is not seen;
//! - the program does not see them, as it would not natively: a probe of
//!   one (`fstat`, `fstatat` or `statx` on it, `fcntl`, `dup`, `dup2`
//!   or `dup3` from it) fails with `EBADF` ([`guard`]), and a listing of
//!   the process's own descriptors (`/proc/self/fd`, `/dev/fd`,
//!   `/proc/PID/fdinfo`, a thread's `task/TID/fd`) leaves them out, read
//!   by `readdir` or by `getdents64` ([`listed`], [`hidden_entry`]). CPython's
//!   `test_subprocess` (`test_pass_fds_redirected`) has an exec'd child
//!   `fstat` every number below its limit and found the child's own
//!   library's five descriptors besides those it was given. Still seen:
//!   a path through `/proc/self/fd/N` named without listing, and the
//!   raw calls of a program's own `syscall` instruction in full mode.
//!
//! The library's own calls (library threads, or library code on the
//! program's threads: [`crate::inside`]) are not guarded; its `close` of
//! a kept descriptor forgets it.
//!
//! ```text
//!   0 1 2 3 …  program's numbers            960 961 962 963   (RLIMIT_NOFILE 1024)
//!                                           uffd spill ctl evictor
//!   close_range(3, ~0U) ─► close_range(3, 959), close_range(964, ~0U)
//! ```

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Kept descriptors (-1: a free slot). More than the library keeps at
/// once, with room for a forked child's (it replaces its parent's).
static KEPT: [AtomicI32; 16] = [const { AtomicI32::new(-1) }; 16];

/// The lowest number a kept descriptor is moved to: 64 below the soft
/// `RLIMIT_NOFILE`, at most 960 (a larger limit would only grow the
/// descriptor table); 0 (not moved) under a limit of 128 or less.
pub fn low() -> i32 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur <= 128 {
        return 0;
    }
    (lim.rlim_cur.min(1024) - 64) as i32
}

/// Moves `fd` (the library's, just made) up to [`low`] or above,
/// close-on-exec, and keeps it from the program's `close`; returns its
/// number now. Left where it is (and still kept) if it cannot move.
pub fn keep(fd: i32) -> i32 {
    let min = low();
    let mut fd = fd;
    if min > 0 && fd < min {
        // SAFETY: duplicating a descriptor of ours.
        let up = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
        if up >= 0 {
            crate::sys::raw(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
            fd = up;
        }
    }
    register(fd);
    fd
}

/// No kept descriptor is below this (a bound, lowered as they are
/// kept): most of the program's calls are let through by one compare.
static LOWEST: AtomicI32 = AtomicI32::new(i32::MAX);

/// Keeps `fd` from the program's `close` (already where it should be).
pub fn register(fd: i32) {
    if fd >= 0 {
        LOWEST.fetch_min(fd, Ordering::AcqRel);
    }
    for s in &KEPT {
        if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return;
        }
    }
}

/// The library closes `fd`: no longer kept.
pub fn forget(fd: i32) {
    for s in &KEPT {
        let _ = s.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Is `fd` one the library keeps?
pub fn is_kept(fd: i32) -> bool {
    fd >= 0 && KEPT.iter().any(|s| s.load(Ordering::Acquire) == fd)
}

/// Kept descriptors in `[first, last]`, ascending.
fn kept_in(first: u32, last: u32) -> ([u32; 16], usize) {
    let mut out = [0u32; 16];
    let mut n = 0;
    for s in &KEPT {
        let fd = s.load(Ordering::Acquire);
        if fd >= 0 && (first..=last).contains(&(fd as u32)) {
            out[n] = fd as u32;
            n += 1;
        }
    }
    out[..n].sort_unstable();
    (out, n)
}

/// A system call of the program's on descriptors (`nr`, `a`): `Some`
/// (its result, -errno on failure) when it concerns a kept descriptor
/// and is answered here, `None` to make it as asked. The library's own
/// calls pass (a `close` of a kept one forgets it).
#[inline]
pub fn guard(nr: i64, a: [u64; 6]) -> Option<i64> {
    match nr {
        libc::SYS_close | libc::SYS_close_range | libc::SYS_dup2 | libc::SYS_dup3 => guard_slow(nr, a),
        libc::SYS_dup | libc::SYS_fcntl | libc::SYS_fstat | libc::SYS_newfstatat | libc::SYS_statx
            if a[0] as i32 >= LOWEST.load(Ordering::Relaxed) =>
        {
            guard_slow(nr, a)
        }
        _ => None,
    }
}

/// Does the path argument `p` (of `newfstatat` or `statx`) make the call
/// use its directory descriptor: empty (`AT_EMPTY_PATH`, or null for
/// `statx`) or relative? An absolute path ignores the descriptor, even
/// one that is not open. A path in the arena is not read (it may be
/// evicted, and this may run in the dispatch handler): `false`.
fn uses_dir(p: u64) -> bool {
    if p == 0 {
        return true;
    }
    if crate::GLOBAL.get().is_some_and(|g| g.in_arena(p as usize)) {
        return false;
    }
    // SAFETY: a C string the program passed to the call (non-null, out
    // of the arena): its first byte is readable.
    unsafe { *(p as *const u8) != b'/' }
}

#[cold]
fn guard_slow(nr: i64, a: [u64; 6]) -> Option<i64> {
    if crate::inside() {
        if nr == libc::SYS_close {
            forget(a[0] as i32);
        }
        return None;
    }
    let ebadf = Some(-(libc::EBADF as i64));
    match nr {
        // Not open, to the program: what a probe of a number it never
        // opened gets natively.
        libc::SYS_close | libc::SYS_dup | libc::SYS_fcntl | libc::SYS_fstat if is_kept(a[0] as i32) => ebadf,
        libc::SYS_dup2 | libc::SYS_dup3 if is_kept(a[0] as i32) => ebadf,
        libc::SYS_newfstatat | libc::SYS_statx if is_kept(a[0] as i32) && uses_dir(a[1]) => ebadf,
        libc::SYS_dup2 | libc::SYS_dup3 if is_kept(a[1] as i32) => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                // No allocation: this may run in the dispatch handler.
                crate::notice(format_args!(
                    "ztier: process {}: dup2 onto descriptor {}, which ztier's library uses: refused (EBADF)",
                    std::process::id(),
                    a[1]
                ));
            }
            Some(-(libc::EBADF as i64))
        }
        libc::SYS_close_range => {
            let (first, last, flags) = (a[0] as u32, a[1] as u32, a[2]);
            let (kept, n) = kept_in(first, last);
            if n == 0 || first > last {
                return None;
            }
            let mut flags = flags;
            if flags & libc::CLOSE_RANGE_UNSHARE as u64 != 0 {
                // Unshare the table first (closing nothing), then close
                // around the kept ones in the new table.
                let r = crate::sys::raw(nr, [u32::MAX as u64, u32::MAX as u64, flags, 0, 0, 0]);
                if r < 0 {
                    return Some(r);
                }
                flags &= !(libc::CLOSE_RANGE_UNSHARE as u64);
            }
            let mut from = first;
            for &k in &kept[..n] {
                if k > from {
                    let r = crate::sys::raw(nr, [from as u64, (k - 1) as u64, flags, 0, 0, 0]);
                    if r < 0 {
                        return Some(r);
                    }
                }
                from = k + 1;
            }
            if from <= last {
                let r = crate::sys::raw(nr, [from as u64, last as u64, flags, 0, 0, 0]);
                if r < 0 {
                    return Some(r);
                }
            }
            Some(0)
        }
        _ => None,
    }
}

/// [`guard`] for a C function: `Some` of its return value (-1 with
/// `errno` set on failure).
pub fn guard_c(nr: i64, a: [u64; 6]) -> Option<i64> {
    guard(nr, a).map(crate::sys::c_ret)
}

/// A program's call `nr` (`a`: its arguments), made by `call`: for
/// `getdents64` on a listing of the process's own descriptors, the
/// library's are taken out of what it read (and if they were all it
/// read, the call is made again: 0 would end the listing); any other
/// call is `call` itself.
#[inline]
pub fn listed(nr: i64, a: [u64; 6], call: impl Fn() -> isize) -> isize {
    if nr != libc::SYS_getdents64 {
        return call();
    }
    loop {
        let n = call();
        if n <= 0 || LOWEST.load(Ordering::Relaxed) == i32::MAX || crate::inside() {
            return n;
        }
        // SAFETY: the kernel wrote `n` bytes of `linux_dirent64` records
        // there (the caller's buffer, pinned around `call` where the
        // dispatch handler or `sud::fast` makes it).
        let left = unsafe { unlist(a[0] as i32, a[1] as *mut u8, n as usize) };
        if left > 0 {
            return left as isize;
        }
    }
}

/// Offset of `d_reclen` and of `d_name` in a `linux_dirent64` record
/// (`u64 d_ino, i64 d_off, u16 d_reclen, u8 d_type, char d_name[]`).
const RECLEN_AT: usize = 16;
const NAME_AT: usize = 19;

/// Takes the records named by a kept descriptor out of the `len` bytes of
/// `getdents64` records at `buf`, if directory `dir` lists this
/// process's descriptors; the bytes left.
///
/// # Safety
/// `buf` holds `len` bytes of records as the kernel writes them.
unsafe fn unlist(dir: i32, buf: *mut u8, len: usize) -> usize {
    // SAFETY: (each record) within the `len` bytes, as the kernel laid
    // them out: a length, then a NUL-terminated name inside the record.
    let reclen = |at: usize| unsafe { (buf.add(at + RECLEN_AT) as *const u16).read_unaligned() } as usize;
    // SAFETY: as above.
    let ours = |at: usize| unsafe { kept_name(buf.add(at + NAME_AT)) };
    let mut at = 0;
    while at + NAME_AT < len && reclen(at) > 0 && !ours(at) {
        at += reclen(at);
    }
    if at + NAME_AT >= len || reclen(at) == 0 || !lists_own(dir) {
        return len;
    }
    let (mut from, mut to) = (at, at);
    while from + NAME_AT < len && reclen(from) > 0 {
        let n = reclen(from);
        if !ours(from) {
            // SAFETY: both within the buffer; `to` <= `from`, and copy
            // allows the ranges to overlap.
            unsafe { std::ptr::copy(buf.add(from), buf.add(to), n) };
            to += n;
        }
        from += n;
    }
    to
}

/// Is the NUL-terminated name at `name` a kept descriptor's number?
///
/// # Safety
/// `name` points to a NUL-terminated string.
unsafe fn kept_name(name: *const u8) -> bool {
    let mut fd: i64 = 0;
    for i in 0..11 {
        // SAFETY: within the string: the loop stops at its NUL.
        match unsafe { *name.add(i) } {
            0 => return i > 0 && is_kept(fd as i32),
            c @ b'0'..=b'9' => fd = fd * 10 + i64::from(c - b'0'),
            _ => return false,
        }
    }
    false
}

/// Does the directory open as `dir` list this process's descriptors:
/// `/proc/PID/fd` or `/proc/PID/fdinfo`, or a thread's
/// `/proc/PID/task/TID/fd` (all of them share the table), PID this
/// process's as `/proc` shows it? (`/dev/fd` and `/proc/self/fd` lead
/// there.) Two `readlink`s, nothing allocated, no descriptor made.
fn lists_own(dir: i32) -> bool {
    let mut path = [0u8; 32];
    let mut w = std::io::Cursor::new(&mut path[..]);
    if std::io::Write::write_fmt(&mut w, format_args!("/proc/self/fd/{dir}\0")).is_err() {
        return false;
    }
    let mut target = [0u8; 64];
    let mut me = [0u8; 16];
    let link = |p: *const u8, buf: &mut [u8]| {
        let n = crate::sys::raw(
            libc::SYS_readlink,
            [p as u64, buf.as_mut_ptr() as u64, buf.len() as u64, 0, 0, 0],
        );
        usize::try_from(n).ok().filter(|&n| n > 0 && n < buf.len())
    };
    let (Some(n), Some(m)) = (link(path.as_ptr(), &mut target), link(c"/proc/self".as_ptr().cast(), &mut me))
    else {
        return false;
    };
    let Some(rest) = target[..n].strip_prefix(b"/proc/").and_then(|r| r.strip_prefix(&me[..m])) else {
        return false;
    };
    let rest = match rest.strip_prefix(b"/task/") {
        Some(t) => {
            let digits = t.iter().take_while(|c| c.is_ascii_digit()).count();
            if digits == 0 {
                return false;
            }
            &t[digits..]
        }
        None => rest,
    };
    rest == b"/fd" || rest == b"/fdinfo"
}

/// Is the directory entry named `name` (NUL-terminated), read from the
/// directory open as `dir` by the program, one of the library's
/// descriptors in a listing of the process's own (to be skipped: see
/// `readdir` in the `direct` module)?
///
/// # Safety
/// `name` points to a NUL-terminated string.
pub unsafe fn hidden_entry(dir: i32, name: *const u8) -> bool {
    LOWEST.load(Ordering::Relaxed) != i32::MAX
        && !crate::inside()
        // SAFETY: the caller's contract.
        && unsafe { kept_name(name) }
        && lists_own(dir)
}
