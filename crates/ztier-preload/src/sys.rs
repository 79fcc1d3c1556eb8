//! Raw system calls. Inside this library `mmap`, `munmap`, `madvise`, …
//! name our own interposers (symbol interposition applies to the library
//! itself), so every call that must reach the kernel goes through
//! `syscall(2)` here.

use libc::{c_int, c_long, c_void};

/// `mmap(2)` by syscall; `MAP_FAILED` and errno on failure.
pub fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void {
    // SAFETY: the kernel validates every argument; a bad one is an error return.
    let r = unsafe {
        libc::syscall(libc::SYS_mmap, addr, len, prot as c_long, flags as c_long, fd as c_long, off)
    };
    r as *mut c_void
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

/// `madvise(2)` by syscall.
pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice as c_long) as c_int }
}

/// `mprotect(2)` by syscall.
pub fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot as c_long) as c_int }
}

/// Sets errno.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}
