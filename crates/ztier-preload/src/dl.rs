//! `dlopen` without `RTLD_DEEPBIND`.
//!
//! A library opened with `RTLD_DEEPBIND` binds its references to its own
//! dependencies before the global scope, so its `malloc` and `free` are
//! glibc's, not this library's, while the blocks it is handed and hands
//! back are the program's. PHP opens every extension so (Debian's php
//! 8.2: `tokenizer`, `pdo` and `phar` in its default set free blocks the
//! interpreter allocated), and `php -r 'echo 1;'` aborted at start-up
//! ("free(): invalid pointer", "double free or corruption") at any
//! budget. The flag is taken off: the library's references then bind in
//! the global scope first, as for a library opened without it (how most
//! programs load their plugins). Memory allocators that are preloaded
//! meet the same flag the same way.
//!
//! glibc's `dlopen` looks at its caller (the return address) for the
//! caller's `RPATH`/`RUNPATH`, which decide where a name without a slash
//! is found, and for its link namespace: the call goes on to glibc's as a
//! tail call, so glibc sees the program's caller, not this library.
//!
//! ```text
//!  program: dlopen(file, mode)
//!    └─► dlopen (here, naked): mode &= !RTLD_DEEPBIND; jmp [NEXT]
//!          └─► glibc's dlopen, returning straight to the program
//! ```

use libc::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// glibc's `dlopen` (0 until looked up: [`look_up`]).
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Looks glibc's `dlopen` up (from the library's constructor, and on a
/// call before it); its address.
pub fn look_up() -> usize {
    // SAFETY: dlsym with a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) } as usize;
    if p == 0 {
        // SAFETY: a static message to stderr.
        unsafe { libc::write(2, c"ztier: glibc's dlopen not found\n".as_ptr().cast(), 32) };
        std::process::abort();
    }
    NEXT.store(p, Ordering::Release);
    p
}

/// `dlopen(3)`: glibc's, without `RTLD_DEEPBIND` (module docs).
///
/// # Safety
/// The C contract of `dlopen`.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    // NEXT is a plain aligned word (AtomicUsize's layout), read once; if
    // it is not looked up yet (a call before the library's constructor),
    // the first call goes through `dlopen_first` instead.
    std::arch::naked_asm!(
        "and esi, {keep}",
        "mov rax, qword ptr [rip + {next}]",
        "test rax, rax",
        "jz {first}",
        "jmp rax",
        keep = const !libc::RTLD_DEEPBIND,
        next = sym NEXT,
        first = sym dlopen_first,
    )
}

/// `dlopen` before [`look_up`] has run (the mode already without the
/// flag): not a tail call, so glibc sees this library as the caller.
extern "C" fn dlopen_first(file: *const c_char, mode: c_int) -> *mut c_void {
    let next = look_up();
    // SAFETY: glibc's dlopen, by its address, with the caller's arguments.
    unsafe {
        let f: unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void = std::mem::transmute(next);
        f(file, mode)
    }
}
