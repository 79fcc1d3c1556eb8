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
//! - the program's `close` of one returns 0 and leaves it open; its
//!   `close_range` and `closefrom` close around them; its `dup2`/`dup3`
//!   onto one fails with `EBADF`, said once on stderr ([`guard`]). That
//!   holds for glibc's functions (exported in [`crate::direct`]),
//!   `syscall(2)` with those numbers, and, where system calls are caught
//!   (`crate::sud`), the raw calls too. A raw `close` system call in full
//!   mode is not seen.
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
            crate::sud::raw(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
            fd = up;
        }
    }
    register(fd);
    fd
}

/// Keeps `fd` from the program's `close` (already where it should be).
pub fn register(fd: i32) {
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
    if !matches!(nr, libc::SYS_close | libc::SYS_close_range | libc::SYS_dup2 | libc::SYS_dup3) {
        return None;
    }
    guard_slow(nr, a)
}

#[cold]
fn guard_slow(nr: i64, a: [u64; 6]) -> Option<i64> {
    if crate::inside() {
        if nr == libc::SYS_close {
            forget(a[0] as i32);
        }
        return None;
    }
    match nr {
        libc::SYS_close if is_kept(a[0] as i32) => Some(0),
        libc::SYS_dup2 | libc::SYS_dup3 if is_kept(a[1] as i32) => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                // No allocation: this may run in the dispatch handler.
                crate::say_unallocated(format_args!(
                    "ztier: process {}: dup2 onto descriptor {}, which ztier's library uses: refused (EBADF)\n",
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
                let r = crate::sud::raw(nr, [u32::MAX as u64, u32::MAX as u64, flags, 0, 0, 0]);
                if r < 0 {
                    return Some(r);
                }
                flags &= !(libc::CLOSE_RANGE_UNSHARE as u64);
            }
            let mut from = first;
            for &k in &kept[..n] {
                if k > from {
                    let r = crate::sud::raw(nr, [from as u64, (k - 1) as u64, flags, 0, 0, 0]);
                    if r < 0 {
                        return Some(r);
                    }
                }
                from = k + 1;
            }
            if from <= last {
                let r = crate::sud::raw(nr, [from as u64, last as u64, flags, 0, 0, 0]);
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
