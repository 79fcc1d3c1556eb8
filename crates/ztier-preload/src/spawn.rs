//! Programs started from the arena's memory: `posix_spawn`,
//! `posix_spawnp`, `system` and `popen`, and the `exec` family in a
//! `vfork` child.
//!
//! Under syscall user dispatch (user-mode-only mode, `--fault-path
//! signal`; see [`crate::sud`]) a `vfork`-like child — glibc's
//! `posix_spawn`, and `system` and `popen` through it, or the program's
//! own `vfork` — runs without dispatch until its `exec`: the kernel does
//! not keep dispatch across a `clone`, and the child shares the parent's
//! thread-local state, so it cannot be given its own. What its `exec`
//! hands the kernel (the path, `argv`, the environment) and the file
//! actions glibc's child reads with every signal blocked (the paths of
//! `open` and `chdir` actions are `strdup`ed, into the arena) are often
//! as old as the program's heap: a daemon's job, built at start-up. In
//! an evicted page the kernel's read failed the `exec` with `EFAULT` —
//! `posix_spawn` returned "Bad address", `system` and `popen` got a
//! shell that exited 127, a `vfork` child's `execv` failed.
//!
//! So the library exports those functions too:
//!
//! ```text
//!  program ─ posix_spawn(pid, path, fa, attr, argv, envp) ─► ztier's posix_spawn
//!      pin: path, argv and envp (each string), environ (posix_spawnp's PATH),
//!           the file actions (their array, each open/chdir path), attr
//!      glibc's posix_spawn (its own system calls caught as usual; the
//!           vfork-like child reads only pinned, resident memory)
//!      unpin; EFAULT after all (more than 64 separate ranges): again, up to 3 times
//!
//!  vfork child ─ execv(path, argv) ─► ztier's execv
//!      bring back path, argv, environ (pinned and let go: a child that
//!           execs cannot end pins; pages just brought back are the newest,
//!           the last an eviction picks)
//!      glibc's execv; EFAULT: bring back again and retry, up to 3 times
//! ```
//!
//! `system` and `popen` keep the command and the environment pinned
//! through glibc's call. Without dispatch (the default thread path,
//! where the handler thread serves the kernel's faults too) each export
//! calls glibc's function at once.
//!
//! glibc's `posix_spawn_file_actions_t` is read as glibc lays it out
//! (`spawn.h`, `spawn_int.h`): the count of actions used at offset 4,
//! the array at 8, 32 bytes an action, its tag first; an `open`
//! action's path at 16, a `chdir` action's at 8. A path is read only
//! where it lies in the arena (the only place a pin is needed, and
//! always mapped there), so a different layout would pin the wrong
//! pages, never read outside the program's memory.
//!
//! Left out: a `vfork` child's reads of its own (CPython's
//! `_posixsubprocess` walks its arguments in the child) are served by
//! the `SIGBUS` handler or the handler thread as any fault, but not if
//! the child has set `SIGBUS` to its default action or blocked it, as a
//! child that resets every handler before its `exec` may.

use std::ffi::{c_char, c_int};
use std::sync::atomic::AtomicUsize;

use crate::sud::{self, Ranges};

extern "C" {
    static environ: *const *const c_char;
}

/// glibc's functions, looked up at their first call (see
/// [`crate::direct`]).
static REAL: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];
const NAMES: [&str; 8] = [
    "posix_spawn\0",
    "posix_spawnp\0",
    "system\0",
    "popen\0",
    "execve\0",
    "execv\0",
    "execvp\0",
    "execvpe\0",
];
const POSIX_SPAWN: usize = 0;
const POSIX_SPAWNP: usize = 1;
const SYSTEM: usize = 2;
const POPEN: usize = 3;
const EXECVE: usize = 4;
const EXECV: usize = 5;
const EXECVP: usize = 6;
const EXECVPE: usize = 7;

fn real(slot: usize) -> usize {
    crate::direct::real(&REAL, slot, NAMES[slot])
}

/// The environment as it is now.
fn env() -> u64 {
    // SAFETY: glibc's environment pointer, read once.
    unsafe { environ as u64 }
}

/// Is `p` a pointer into the arena?
fn in_arena(p: u64) -> bool {
    crate::GLOBAL.get().is_some_and(|g| g.in_arena(p as usize))
}

/// The memory glibc's child reads in a file-actions object (see the
/// module docs for the layout).
fn file_actions(r: &mut Ranges, fa: *const libc::posix_spawn_file_actions_t) {
    const ACTION: usize = 32;
    const OPEN: c_int = 2;
    const CHDIR: c_int = 3;
    if fa.is_null() {
        return;
    }
    r.push(fa as u64, std::mem::size_of::<libc::posix_spawn_file_actions_t>() as u64);
    let base = fa.cast::<u8>();
    // SAFETY: the program's file actions, as glibc lays them out: the
    // count of actions used at 4, the array at 8.
    let (used, actions) =
        unsafe { (base.add(4).cast::<c_int>().read_unaligned(), base.add(8).cast::<u64>().read_unaligned()) };
    if actions == 0 || !(0..=1 << 16).contains(&used) {
        return;
    }
    r.push(actions, used as u64 * ACTION as u64);
    for k in 0..used as usize {
        let a = (actions as usize + k * ACTION) as *const u8;
        // SAFETY: action `k` of the array glibc allocated, its tag first
        // and its path (for `open` and `chdir`) where the layout says.
        let path = unsafe {
            match a.cast::<c_int>().read_unaligned() {
                OPEN => a.add(16).cast::<u64>().read_unaligned(),
                CHDIR => a.add(8).cast::<u64>().read_unaligned(),
                _ => 0,
            }
        };
        if in_arena(path) {
            r.cstr(path);
        }
    }
}

/// Runs a `posix_spawn`-like call with its memory pinned; again (up to
/// three times) if the child's `exec` still met a missing page.
fn spawn(named: impl Fn(&mut Ranges), call: impl Fn() -> c_int) -> c_int {
    let mut tries = 0;
    loop {
        let r = sud::with_pinned(&named, &call);
        if r != libc::EFAULT || tries == 3 || !sud::active() {
            return r;
        }
        tries += 1;
    }
}

/// An `exec` in this task: what it hands the kernel brought back first,
/// and again if it failed with `EFAULT` (up to three times).
fn exec(named: impl Fn(&mut Ranges), call: impl Fn() -> c_int) -> c_int {
    let mut tries = 0;
    loop {
        let ours = sud::bring_back(&named);
        let r = call();
        if !(r == -1 && crate::sys::errno() == libc::EFAULT && ours && tries < 3) {
            return r;
        }
        tries += 1;
    }
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

/// The memory a `posix_spawn` call hands its child.
fn spawn_memory(
    r: &mut Ranges,
    path: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) {
    r.cstr(path as u64);
    r.strvec(argv as u64);
    r.strvec(envp as u64);
    r.strvec(env());
    file_actions(r, fa);
    r.push(attr as u64, std::mem::size_of::<libc::posix_spawnattr_t>() as u64);
}

/// `posix_spawn`, its child's memory pinned (see the module docs).
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, SpawnFn>(real(POSIX_SPAWN)) };
    // SAFETY: the caller's arguments, passed on.
    spawn(|r| spawn_memory(r, path, fa, attr, argv, envp), || unsafe { f(pid, path, fa, attr, argv, envp) })
}

/// `posix_spawnp`, its child's memory pinned (see the module docs).
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, SpawnFn>(real(POSIX_SPAWNP)) };
    // SAFETY: the caller's arguments, passed on.
    spawn(|r| spawn_memory(r, file, fa, attr, argv, envp), || unsafe { f(pid, file, fa, attr, argv, envp) })
}

/// `system`, the command and the environment pinned through it.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn system(line: *const c_char) -> c_int {
    // SAFETY: glibc's function of this name, which has this signature.
    let f =
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char) -> c_int>(real(SYSTEM)) };
    sud::with_pinned(
        |r| {
            r.cstr(line as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's argument, passed on.
        || unsafe { f(line) },
    )
}

/// `popen`, the command and the environment pinned through it.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    type PopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, PopenFn>(real(POPEN)) };
    sud::with_pinned(
        |r| {
            r.cstr(command as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's arguments, passed on.
        || unsafe { f(command, mode) },
    )
}

/// `execve`, what it hands the kernel brought back first.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    type ExecveFn = unsafe extern "C" fn(*const c_char, *const *mut c_char, *const *mut c_char) -> c_int;
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, ExecveFn>(real(EXECVE)) };
    exec(
        |r| {
            r.cstr(path as u64);
            r.strvec(argv as u64);
            r.strvec(envp as u64);
        },
        // SAFETY: the caller's arguments, passed on.
        || unsafe { f(path, argv, envp) },
    )
}

/// `execvpe`, what it hands the kernel (and `PATH`) brought back first.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    type ExecvpeFn = unsafe extern "C" fn(*const c_char, *const *mut c_char, *const *mut c_char) -> c_int;
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, ExecvpeFn>(real(EXECVPE)) };
    exec(
        |r| {
            r.cstr(file as u64);
            r.strvec(argv as u64);
            r.strvec(envp as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's arguments, passed on.
        || unsafe { f(file, argv, envp) },
    )
}

type ExecvFn = unsafe extern "C" fn(*const c_char, *const *mut c_char) -> c_int;

/// `execv`, what it hands the kernel brought back first.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *mut c_char) -> c_int {
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, ExecvFn>(real(EXECV)) };
    exec(
        |r| {
            r.cstr(path as u64);
            r.strvec(argv as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's arguments, passed on.
        || unsafe { f(path, argv) },
    )
}

/// `execvp`, what it hands the kernel (and `PATH`) brought back first.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *mut c_char) -> c_int {
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, ExecvFn>(real(EXECVP)) };
    exec(
        |r| {
            r.cstr(file as u64);
            r.strvec(argv as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's arguments, passed on.
        || unsafe { f(file, argv) },
    )
}
