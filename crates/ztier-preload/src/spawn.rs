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
//! **What a started program inherits.** A program runs under the
//! library only if its environment names it in `LD_PRELOAD` and carries
//! the `ZTIER_*` settings; one started with an environment of its
//! caller's making (`env -i`, `env -u LD_PRELOAD`, Python's
//! `subprocess.run(..., env={})`, a build tool's clean environment) ran
//! unmanaged, silently, outside the budget. So the constructor keeps
//! this library's path and the `ZTIER_*` entries the process started
//! with, and every `exec` and `posix_spawn` export hands the kernel an
//! environment completed with what it lacks:
//!
//! ```text
//!  envp: PATH=…  LD_PRELOAD=libx.so  HOME=…  (no ZTIER_*)
//!   ──► LD_PRELOAD=<this library>:libx.so  PATH=…  HOME=…  ZTIER_BUDGET=…  ZTIER_STATS_DIR=…  …
//! ```
//!
//! An entry the caller set is kept as it is (a nested `ztier run` sets
//! its own), and an environment that lacks nothing is passed on
//! untouched. The completed copy is built on the stack (no allocation
//! in a `vfork` child; up to [`ON_STACK_PTRS`] entries and
//! [`ON_STACK_TEXT`] bytes of `LD_PRELOAD`, then the library's heap).
//! `execv` and `execvp` complete `environ` and call `execve` and
//! `execvpe`. Not completed: `system` and `popen`, which read the
//! program's own `environ` while the program goes on (a program that
//! removed `LD_PRELOAD` from its own environment), `execl`, `execlp`
//! and `execle` (variadic: glibc's call `execve` inside, out of reach),
//! and raw `execve` system calls.
//!
//! Left out: a `vfork` child's reads of its own (CPython's
//! `_posixsubprocess` walks its arguments in the child) are served by
//! the `SIGBUS` handler or the handler thread as any fault, but not if
//! the child has set `SIGBUS` to its default action or blocked it, as a
//! child that resets every handler before its `exec` may.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::atomic::AtomicUsize;
use std::sync::OnceLock;

use crate::sud::{self, Ranges};

extern "C" {
    static environ: *const *const c_char;
}

/// glibc's functions, looked up at their first call (see
/// [`crate::direct`]).
static REAL: [AtomicUsize; 7] = [const { AtomicUsize::new(0) }; 7];
const NAMES: [&str; 7] =
    ["posix_spawn\0", "posix_spawnp\0", "system\0", "popen\0", "execve\0", "execvpe\0", "fexecve\0"];
const POSIX_SPAWN: usize = 0;
const POSIX_SPAWNP: usize = 1;
const SYSTEM: usize = 2;
const POPEN: usize = 3;
const EXECVE: usize = 4;
const EXECVPE: usize = 5;
const FEXECVE: usize = 6;

fn real(slot: usize) -> usize {
    crate::direct::real(&REAL, slot, NAMES[slot])
}

/// What a program started from this one needs in its environment to
/// run under the library too (see the module docs).
struct Inherit {
    /// This library's path, as the dynamic linker loaded it.
    lib: Vec<u8>,
    /// Every `ZTIER_*=value` entry the process started with.
    vars: Vec<CString>,
}

static INHERIT: OnceLock<Inherit> = OnceLock::new();

/// At most this many `ZTIER_*` entries are carried over (`ztier run`
/// sets about 20).
const MAX_VARS: usize = 64;
/// Entries of a completed environment built on the stack.
const ON_STACK_PTRS: usize = 1024;
/// Bytes of a completed `LD_PRELOAD=` entry built on the stack.
const ON_STACK_TEXT: usize = 4096;

/// Called by the library's constructor: looks up glibc's functions
/// (none is looked up later, in a `vfork` child) and, when the library
/// runs (`ZTIER_BUDGET` is set), keeps what children inherit: the
/// environment is still the one the process started with.
pub(crate) fn note_start() {
    for slot in 0..NAMES.len() {
        real(slot);
    }
    if std::env::var_os(ztier_run_core::names::env::BUDGET).is_none() {
        return;
    }
    // SAFETY: a zeroed Dl_info is valid (null pointers); dladdr only
    // writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; any address may be asked about.
    if unsafe { libc::dladdr(note_start as *const () as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return;
    }
    // SAFETY: dladdr's file name, a NUL-terminated string of the
    // dynamic linker's.
    let lib = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes().to_vec();
    let vars = std::env::vars_os()
        .filter(|(k, _)| k.as_encoded_bytes().starts_with(ztier_run_core::names::env::PREFIX.as_bytes()))
        .filter_map(|(k, v)| {
            let mut e = k.into_encoded_bytes();
            e.push(b'=');
            e.extend_from_slice(v.as_encoded_bytes());
            CString::new(e).ok()
        })
        .take(MAX_VARS)
        .collect();
    let _ = INHERIT.set(Inherit { lib, vars });
}

/// Does an `LD_PRELOAD` value name `lib` (the dynamic linker splits it
/// at colons and spaces)?
fn names(value: &[u8], lib: &[u8]) -> bool {
    value.split(|&c| c == b':' || c == b' ').any(|e| e == lib)
}

/// Calls `f` with `envp`, or, if it lacks this library in `LD_PRELOAD`
/// or a `ZTIER_*` entry the process started with, with a completed copy
/// (see the module docs). A null `envp` is an empty environment.
fn completed<R>(envp: *const *const c_char, f: impl FnOnce(*const *const c_char) -> R) -> R {
    let Some(inh) = INHERIT.get() else { return f(envp) };
    let mut n = 0;
    let mut preload: Option<&[u8]> = None;
    let mut present = [false; MAX_VARS];
    while !envp.is_null() && n < 1 << 20 {
        // SAFETY: the caller's environment, a null-terminated array of
        // strings (its pages brought back by the caller when stored).
        let s = unsafe { *envp.add(n) };
        if s.is_null() {
            break;
        }
        // SAFETY: as above.
        let e = unsafe { CStr::from_ptr(s) }.to_bytes();
        if let Some(v) = e.strip_prefix(b"LD_PRELOAD=") {
            // The dynamic linker takes the last.
            preload = Some(v);
        } else if e.starts_with(ztier_run_core::names::env::PREFIX.as_bytes()) {
            for (k, var) in inh.vars.iter().enumerate() {
                let var = var.as_bytes();
                let name = &var[..=var.iter().position(|&c| c == b'=').unwrap_or(var.len() - 1)];
                present[k] |= e.starts_with(name);
            }
        }
        n += 1;
    }
    let has_lib = preload.is_some_and(|v| names(v, &inh.lib));
    let missing = inh.vars.len() - present[..inh.vars.len()].iter().filter(|&&p| p).count();
    if has_lib && missing == 0 {
        return f(envp);
    }
    let text = if has_lib { 0 } else { 12 + inh.lib.len() + preload.map_or(0, |v| v.len() + 1) };
    let ptrs = n + missing + 2;
    let scan = Scan { envp, n, old: preload, preload_entry: !has_lib, present };
    if ptrs <= ON_STACK_PTRS && text <= ON_STACK_TEXT {
        build_on_stack(inh, &scan, f)
    } else {
        let mut p = vec![std::ptr::null(); ptrs];
        let mut t = vec![0u8; text.max(1)];
        f(build(inh, &scan, &mut p, &mut t))
    }
}

/// What [`completed`] found in a caller's environment that lacks
/// something.
struct Scan<'a> {
    envp: *const *const c_char,
    /// Its entries.
    n: usize,
    /// The value of its last `LD_PRELOAD`.
    old: Option<&'a [u8]>,
    /// That does not name the library: a new entry goes first.
    preload_entry: bool,
    /// Which of [`Inherit::vars`] it has.
    present: [bool; MAX_VARS],
}

/// [`build`] into buffers on the stack (a frame of its own, so that
/// calls that lack nothing do not reserve it).
#[inline(never)]
fn build_on_stack<R>(inh: &Inherit, scan: &Scan, f: impl FnOnce(*const *const c_char) -> R) -> R {
    let mut p = [std::ptr::null(); ON_STACK_PTRS];
    let mut t = [0u8; ON_STACK_TEXT];
    f(build(inh, scan, &mut p, &mut t))
}

/// Writes the completed environment into `p` (and its `LD_PRELOAD=`
/// entry into `t` when one is needed): that entry first, the caller's
/// entries (less its `LD_PRELOAD` ones, then), the missing `ZTIER_*`
/// ones, a null.
fn build(inh: &Inherit, scan: &Scan, p: &mut [*const c_char], t: &mut [u8]) -> *const *const c_char {
    let Scan { envp, n, old, preload_entry, ref present } = *scan;
    let mut k = 0;
    if preload_entry {
        let mut w = 0;
        for part in [b"LD_PRELOAD=".as_slice(), &inh.lib] {
            t[w..w + part.len()].copy_from_slice(part);
            w += part.len();
        }
        if let Some(v) = old.filter(|v| !v.is_empty()) {
            t[w] = b':';
            t[w + 1..w + 1 + v.len()].copy_from_slice(v);
            w += 1 + v.len();
        }
        t[w] = 0;
        p[k] = t.as_ptr().cast();
        k += 1;
    }
    for j in 0..n {
        // SAFETY: the first `n` entries of the caller's environment.
        let s = unsafe { *envp.add(j) };
        // SAFETY: as above.
        if preload_entry && unsafe { CStr::from_ptr(s) }.to_bytes().starts_with(b"LD_PRELOAD=") {
            continue;
        }
        p[k] = s;
        k += 1;
    }
    for (var, _) in inh.vars.iter().zip(present).filter(|(_, &here)| !here) {
        p[k] = var.as_ptr();
        k += 1;
    }
    p[k] = std::ptr::null();
    p.as_ptr()
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
    completed(envp.cast(), |e| {
        let e = e.cast();
        // SAFETY: the caller's arguments, passed on, the environment
        // completed.
        spawn(|r| spawn_memory(r, path, fa, attr, argv, e), || unsafe { f(pid, path, fa, attr, argv, e) })
    })
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
    completed(envp.cast(), |e| {
        let e = e.cast();
        // SAFETY: the caller's arguments, passed on, the environment
        // completed.
        spawn(|r| spawn_memory(r, file, fa, attr, argv, e), || unsafe { f(pid, file, fa, attr, argv, e) })
    })
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
        // SAFETY: the caller's arguments, passed on, the environment
        // completed.
        || completed(envp.cast(), |e| unsafe { f(path, argv, e.cast()) }),
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
        // SAFETY: the caller's arguments, passed on, the environment
        // completed.
        || completed(envp.cast(), |e| unsafe { f(file, argv, e.cast()) }),
    )
}

/// `execv`, what it hands the kernel brought back first: glibc's
/// `execve` with `environ`, completed.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *mut c_char) -> c_int {
    type ExecveFn = unsafe extern "C" fn(*const c_char, *const *mut c_char, *const *const c_char) -> c_int;
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, ExecveFn>(real(EXECVE)) };
    exec(
        |r| {
            r.cstr(path as u64);
            r.strvec(argv as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's arguments, passed on, with the
        // environment completed.
        || completed(env() as *const *const c_char, |e| unsafe { f(path, argv, e) }),
    )
}

/// `execvp`, what it hands the kernel (and `PATH`) brought back first:
/// glibc's `execvpe` with `environ`, completed (it searches `PATH` of
/// `environ` all the same).
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *mut c_char) -> c_int {
    type ExecvpeFn = unsafe extern "C" fn(*const c_char, *const *mut c_char, *const *const c_char) -> c_int;
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, ExecvpeFn>(real(EXECVPE)) };
    exec(
        |r| {
            r.cstr(file as u64);
            r.strvec(argv as u64);
            r.strvec(env());
        },
        // SAFETY: the caller's arguments, passed on, with the
        // environment completed.
        || completed(env() as *const *const c_char, |e| unsafe { f(file, argv, e) }),
    )
}

/// `fexecve`, what it hands the kernel brought back first, the
/// environment completed.
///
/// # Safety
/// The C contract of glibc's function of the same name.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int {
    type FexecveFn = unsafe extern "C" fn(c_int, *const *mut c_char, *const *const c_char) -> c_int;
    // SAFETY: glibc's function of this name, which has this signature.
    let f = unsafe { std::mem::transmute::<usize, FexecveFn>(real(FEXECVE)) };
    exec(
        |r| {
            r.strvec(argv as u64);
            r.strvec(envp as u64);
        },
        // SAFETY: the caller's arguments, passed on, the environment
        // completed.
        || completed(envp.cast(), |e| unsafe { f(fd, argv, e) }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inherit() -> &'static Inherit {
        INHERIT.get_or_init(|| Inherit {
            lib: b"/run/ztier/libztier_preload.so".to_vec(),
            vars: vec![c"ZTIER_BUDGET=1048576".into(), c"ZTIER_STATS_DIR=/tmp/s".into()],
        })
    }

    /// The environment `completed` hands on for `entries`, as strings,
    /// and whether it is the caller's own array.
    fn complete(entries: Option<&[&str]>) -> (Vec<String>, bool) {
        inherit();
        let owned: Vec<CString> = entries.unwrap_or(&[]).iter().map(|e| CString::new(*e).unwrap()).collect();
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let envp = if entries.is_some() { ptrs.as_ptr() } else { std::ptr::null() };
        completed(envp, |e| {
            let mut v = Vec::new();
            // SAFETY: the null-terminated array `completed` built or
            // passed on, alive during this call.
            unsafe {
                let mut k = 0;
                while !(*e.add(k)).is_null() {
                    v.push(CStr::from_ptr(*e.add(k)).to_str().unwrap().to_owned());
                    k += 1;
                }
            }
            (v, e == envp)
        })
    }

    #[test]
    fn an_environment_that_lacks_nothing_is_passed_on_untouched() {
        let env = [
            "PATH=/bin",
            "LD_PRELOAD=/run/ztier/libztier_preload.so",
            "ZTIER_BUDGET=1048576",
            "ZTIER_STATS_DIR=/x",
        ];
        let (v, same) = complete(Some(&env));
        assert!(same, "{v:?}");
        // Named among others, space- or colon-separated.
        let env = [
            "LD_PRELOAD=liba.so /run/ztier/libztier_preload.so:libb.so",
            "ZTIER_BUDGET=5",
            "ZTIER_STATS_DIR=/x",
        ];
        assert!(complete(Some(&env)).1);
    }

    #[test]
    fn the_library_goes_first_in_ld_preload_and_missing_settings_are_added() {
        let (v, same) = complete(Some(&["PATH=/bin", "LD_PRELOAD=libx.so", "HOME=/root"]));
        assert!(!same);
        assert_eq!(
            v,
            [
                "LD_PRELOAD=/run/ztier/libztier_preload.so:libx.so",
                "PATH=/bin",
                "HOME=/root",
                "ZTIER_BUDGET=1048576",
                "ZTIER_STATS_DIR=/tmp/s"
            ]
        );
        // A setting the caller made is kept; an empty LD_PRELOAD and a
        // null environment get the library alone.
        let (v, _) = complete(Some(&["ZTIER_BUDGET=7", "LD_PRELOAD="]));
        assert_eq!(
            v,
            ["LD_PRELOAD=/run/ztier/libztier_preload.so", "ZTIER_BUDGET=7", "ZTIER_STATS_DIR=/tmp/s"]
        );
        let (v, _) = complete(None);
        assert_eq!(
            v,
            ["LD_PRELOAD=/run/ztier/libztier_preload.so", "ZTIER_BUDGET=1048576", "ZTIER_STATS_DIR=/tmp/s"]
        );
        // A name that only starts like the library's is not it; the last
        // LD_PRELOAD is the one the dynamic linker reads.
        let (v, _) = complete(Some(&[
            "LD_PRELOAD=/run/ztier/libztier_preload.so",
            "LD_PRELOAD=/run/ztier/libztier_preload.so.old",
            "ZTIER_BUDGET=1",
            "ZTIER_STATS_DIR=/x",
        ]));
        assert_eq!(
            v,
            [
                "LD_PRELOAD=/run/ztier/libztier_preload.so:/run/ztier/libztier_preload.so.old",
                "ZTIER_BUDGET=1",
                "ZTIER_STATS_DIR=/x"
            ]
        );
    }

    #[test]
    fn environments_too_large_for_the_stack_are_completed_on_the_heap() {
        let many: Vec<String> = (0..3000).map(|k| format!("V{k}={k}")).collect();
        let long = format!("LD_PRELOAD={}", "a".repeat(2 * ON_STACK_TEXT));
        for env in [many.iter().map(String::as_str).collect::<Vec<_>>(), vec![long.as_str()]] {
            let (v, same) = complete(Some(&env));
            assert!(!same);
            assert_eq!(v.len(), env.len() + 2 + usize::from(env.len() > 1));
            assert!(v[0].starts_with("LD_PRELOAD=/run/ztier/libztier_preload.so"), "{}", &v[0][..60]);
            assert_eq!(v[v.len() - 1], "ZTIER_STATS_DIR=/tmp/s");
        }
    }
}
