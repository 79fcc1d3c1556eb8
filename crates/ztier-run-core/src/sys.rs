//! Plain system calls by `syscall(2)` (no libc wrapper: inside the
//! preloaded library `mmap`, `madvise`, … name the library's own
//! interposers), for the manager and the library alike. Those that must
//! not be caught by Syscall User Dispatch go through the library's own
//! entry instead (the `host` module's `Host::raw`).

use libc::{c_int, c_long, c_void};

/// Page size.
pub const PAGE: usize = 4096;

/// `mmap(2)` by syscall; `MAP_FAILED` and errno on failure.
// The pointer is an address for the kernel, which checks it; this code
// never dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void {
    // SAFETY: the kernel validates every argument; a bad one is an error return.
    let r = unsafe {
        libc::syscall(libc::SYS_mmap, addr, len, prot as c_long, flags as c_long, fd as c_long, off)
    };
    r as *mut c_void
}

/// `madvise(2)` by syscall.
// The pointer is an address for the kernel, which checks it; this code
// never dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice as c_long) as c_int }
}

/// `mprotect(2)` by syscall.
// The pointer is an address for the kernel, which checks it; this code
// never dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot as c_long) as c_int }
}

/// `tgkill(2)`: sends `sig` to thread `tid` of process `pid` (signal 0
/// only checks that the thread exists); -1 and errno on failure.
pub fn tgkill(pid: libc::pid_t, tid: libc::pid_t, sig: c_int) -> c_int {
    // SAFETY: plain call; the kernel validates the arguments.
    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) as c_int }
}

/// This thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// `process_madvise(2)`'s "this process" descriptor
/// (`PIDFD_SELF_THREAD_GROUP`, kernels from 6.14).
const PIDFD_SELF: c_long = -10001;
/// 0: not tried yet, 1: `process_madvise` works here, 2: it does not.
static BATCHED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// `madvise(advice)` over many `(address, length)` ranges. One
/// `process_madvise(2)` call covers up to 512 of them — one TLB shootdown
/// for all on kernels that batch it (6.16 and later), where one `madvise`
/// per range costs a cross-CPU interrupt each. Falls back to one
/// `madvise` per range where that call is missing or refused.
pub fn madvise_many(ranges: &[(usize, usize)], advice: c_int) -> std::io::Result<()> {
    use std::sync::atomic::Ordering;
    for chunk in ranges.chunks(512) {
        // Bytes of the chunk advised already.
        let mut done = 0;
        if BATCHED.load(Ordering::Relaxed) != 2 {
            let iov: Vec<libc::iovec> =
                chunk.iter().map(|&(a, l)| libc::iovec { iov_base: a as *mut c_void, iov_len: l }).collect();
            let total: usize = chunk.iter().map(|&(_, l)| l).sum();
            // SAFETY: a live iovec array of iov.len() entries; the kernel
            // validates the ranges.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    PIDFD_SELF,
                    iov.as_ptr(),
                    iov.len(),
                    advice as c_long,
                    0 as c_long,
                )
            };
            if r >= 0 && r as usize == total {
                BATCHED.store(1, Ordering::Relaxed);
                continue;
            }
            if r > 0 {
                done = r as usize;
            } else if r < 0 && matches!(errno(), libc::EBADF | libc::EINVAL | libc::ENOSYS | libc::EPERM) {
                BATCHED.store(2, Ordering::Relaxed);
            }
        }
        // Not batched, or stopped part way: range by range, from where it
        // stopped. Not again over what was advised: between the two calls
        // a page released there may have been installed again (a fault
        // on a released victim is served before the eviction commits,
        // `Manager::commit_early`), and `MADV_DONTNEED` again would throw
        // away what the program has written to it since.
        for (a, l) in not_done(chunk, done) {
            if madvise(a as *mut c_void, l, advice) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// What is left of `ranges` once their first `done` bytes (in order)
/// have been advised.
fn not_done(ranges: &[(usize, usize)], mut done: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    ranges.iter().filter_map(move |&(a, l)| {
        let skip = done.min(l);
        done -= skip;
        (skip < l).then_some((a + skip, l - skip))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `process_madvise` that stopped part way is resumed where it
    /// stopped: no range, nor part of one, is advised twice.
    #[test]
    fn a_batch_stopped_part_way_resumes_where_it_stopped() {
        let r = [(0x1000, 0x2000), (0x8000, 0x1000), (0x10000, 0x3000)];
        let left = |done| not_done(&r, done).collect::<Vec<_>>();
        assert_eq!(left(0), r.to_vec());
        assert_eq!(left(0x1000), vec![(0x2000, 0x1000), (0x8000, 0x1000), (0x10000, 0x3000)]);
        assert_eq!(left(0x2000), vec![(0x8000, 0x1000), (0x10000, 0x3000)]);
        assert_eq!(left(0x4000), vec![(0x11000, 0x2000)]);
        assert_eq!(left(0x6000), vec![]);
    }

    /// The fallback really advises: pages released by `madvise_many`
    /// read as zeros again, those left out keep their content.
    #[test]
    fn madvise_many_releases_exactly_the_ranges() {
        // SAFETY: a fresh private anonymous mapping of 8 pages, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut c_void, libc::MAP_FAILED);
        // SAFETY: within the 8 pages mapped above.
        let page = |i: usize| unsafe { std::slice::from_raw_parts_mut(p.add(i * 4096), 4096) };
        for i in 0..8 {
            page(i).fill(i as u8 + 1);
        }
        let a = p as usize;
        madvise_many(&[(a + 4096, 2 * 4096), (a + 5 * 4096, 4096)], libc::MADV_DONTNEED).unwrap();
        for i in 0..8 {
            let want = if matches!(i, 1 | 2 | 5) { 0 } else { i as u8 + 1 };
            assert!(page(i).iter().all(|&b| b == want), "page {i}");
        }
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p.cast(), 8 * 4096) };
    }
}
