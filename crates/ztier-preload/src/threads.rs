//! The program's threads as the library sees them start and jump:
//! `pthread_create` (a new thread's stack and DTV kept out of the
//! evictor's way, dispatch enabled in it, its exit hooked) and the
//! `longjmp` family (a jump out of a signal handler leaves the dispatch
//! handler's state behind it). Above `sud`, whose thread machinery these
//! call; the allocator and the memory-mapping calls are `shim`'s.

use libc::{c_int, c_void};

use crate::manager::PAGE;
use crate::shim::arena_pages;
use crate::{global_for, Global};

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;

/// The pages of the arena in the stack `attr` gives a new thread, if any.
///
/// # Safety
/// `attr` is null or the program's initialised attributes.
unsafe fn arena_stack(attr: *const libc::pthread_attr_t) -> Option<(usize, usize)> {
    let g = crate::GLOBAL.get()?;
    if attr.is_null() {
        return None;
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: as the caller promises; glibc reports a null address when
    // no stack was set.
    if unsafe { libc::pthread_attr_getstack(attr, &mut p, &mut len) } != 0 || p.is_null() || len == 0 {
        return None;
    }
    let (p, end) = (p as usize, p as usize + len);
    if !g.in_arena(p) || !g.in_arena(end - 1) {
        return None;
    }
    let first = g.page_of(p);
    Some((first, g.page_of(end - 1) + 1 - first))
}
type CreateFn =
    unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartFn, *mut c_void) -> c_int;

struct Start {
    f: StartFn,
    arg: *mut c_void,
    /// The pages of a stack the program gave it from the arena, pinned
    /// (`(first, n)`; n = 0: none).
    stack: (usize, usize),
    /// Held until the creator has moved its DTV out of the arena.
    gate: std::sync::Arc<crate::sud::ThreadGate>,
}

extern "C" fn start_unpinned(a: *mut c_void) -> *mut c_void {
    // SAFETY: `a` is the Box<Start> leaked by pthread_create below.
    let s = unsafe { Box::from_raw(a.cast::<Start>()) };
    // First: nothing before it may read a thread-local of the library.
    s.gate.enter();
    if s.stack.1 > 0 {
        crate::sud::note_thread_stack(s.stack.0, s.stack.1);
    }
    if let Some(cpus) = crate::ALLOWED.get() {
        crate::pin(cpus);
    }
    if let Err(e) = crate::sud::enable_thread() {
        eprintln!("ztier: a new thread cannot protect its system calls: {e}: aborting");
        std::process::abort();
    }
    // In every mode: at its exit, the robust mutexes it holds are brought
    // back for the kernel (`sud::keep_robust_list`).
    crate::sud::hook_exit();
    if s.stack.1 > 0 {
        crate::as_inside(|| crate::sud::keep_thread_stack(s.stack.0, s.stack.1));
    }
    // Before the program's code runs: what faults served in this thread
    // need per thread (`keep_thread_vector`).
    crate::sud::keep_thread_vector();
    s.gate.end_pin();
    crate::sud::rearm();
    (s.f)(s.arg)
}

/// `pthread_create(3)`: while the main thread is pinned next to the fault
/// handler, new threads start with the whole allowed CPU set instead of
/// inheriting the pin.
///
/// # Safety
/// The C contract of `pthread_create`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    t: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    f: StartFn,
    arg: *mut c_void,
) -> c_int {
    let _sud = crate::sud::Allow::new();
    static NEXT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let next = *NEXT.get_or_init(|| {
        crate::as_inside(|| {
            // SAFETY: dlsym with a NUL-terminated name.
            unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) as usize }
        })
    });
    if next == 0 {
        return libc::EAGAIN;
    }
    // SAFETY: the symbol is glibc's pthread_create.
    let real = unsafe { std::mem::transmute::<usize, CreateFn>(next) };
    // The library starts before the program's second thread, whatever
    // the program has allocated so far (a program may create threads
    // before it allocates anything).
    let _ = global_for(usize::MAX);
    // That start may have just turned dispatch on for this thread (the
    // guard above was taken before it and set no selector): glibc's
    // clone below is library code too, not the program's own.
    let _started = crate::sud::Allow::new();
    // glibc's own allocations for the new thread go to glibc's malloc
    // (`as_inside`), never to the arena: among them is the thread's DTV,
    // which every access to the library's thread-locals reads (through
    // `__tls_get_addr`), also while the manager's lock is held — e.g. our
    // `malloc` checking its mark, or a contended store lock. In the arena,
    // the DTV could be evicted, and that read would fault while holding
    // the lock the handler needs to serve it (seen: `free` of a large
    // block deadlocked the handler).
    // A stack the program gives from the arena (`pthread_attr_setstack`
    // on memory from malloc) holds, besides the frames, the thread's
    // control block and thread-locals — the library's among them, read
    // under the manager's lock, and the dispatch selector, which the
    // kernel reads at each system call. It stays resident while the
    // thread runs: pinned from before the thread starts, then kept for
    // it (until the memory is released or the thread is gone).
    // SAFETY: the program's attributes, as glibc reads them.
    let stack = unsafe { arena_stack(attr) };
    if crate::inside() {
        // SAFETY: forwarding.
        return crate::as_inside(|| unsafe { real(t, attr, f, arg) });
    }
    let stack = stack.unwrap_or((0, 0));
    if stack.1 > 0 {
        crate::as_inside(|| crate::sud::pin_thread_stack(stack.0, stack.1));
    }
    if crate::sud::sigbus_on() {
        if let Some(g) = crate::GLOBAL.get() {
            crate::as_inside(|| keep_locale_resident(g));
        }
    }
    let gate = std::sync::Arc::new(crate::sud::ThreadGate::new());
    let s = crate::as_inside(|| Box::into_raw(Box::new(Start { f, arg, stack, gate: gate.clone() })));
    // SAFETY: forwarding with our trampoline, which takes ownership of `s`.
    let r = crate::as_inside(|| unsafe { real(t, attr, start_unpinned, s.cast()) });
    if r == 0 {
        // SAFETY: glibc's `pthread_t` is the new thread's thread pointer.
        gate.creator(unsafe { *t } as usize);
    } else {
        // SAFETY: the thread was not created; `s` is still ours.
        crate::as_inside(|| drop(unsafe { Box::from_raw(s) }));
        if stack.1 > 0 {
            crate::as_inside(|| crate::sud::unpin_thread_stack(stack.0, stack.1));
        }
    }
    r
}

/// The global locale's `LC_CTYPE` data that [`keep_locale_resident`]
/// keeps: (process, first page, pages).
static LOCALE_KEPT: std::sync::Mutex<(u32, usize, usize)> = std::sync::Mutex::new((0, 0, 0));

/// With `--fault-path signal`, keeps the global locale's `LC_CTYPE` data
/// resident (the library's `mlock`, one locale at a time). glibc's
/// `start_thread` runs `__ctype_init` in the new thread with every signal
/// blocked (glibc's `pthread_create` blocks them all around the `clone`;
/// the thread puts the creator's mask back only after): it reads that
/// data, which `setlocale` allocated with `malloc`, so arena memory. A
/// fault there is a blocked `SIGBUS`, and the kernel kills the process
/// with it. Seen: a JVM at `--budget 32M` died so, without a word, in
/// 5 runs of 13, once the data had gone cold between two thread
/// starts. The data read is the start of glibc's `struct __locale_data`
/// (its header and first values); the tables they point to are in the
/// locale's file mapping. Threads glibc starts by its internal
/// `pthread_create` (a `SIGEV_THREAD` timer's) need no keep: their
/// creator runs under dispatch, whose `rt_sigprocmask` never blocks
/// `SIGBUS` (`run_progs/locale.c` starts five with the data evicted).
fn keep_locale_resident(g: &Global) {
    // SAFETY: a copy of the global locale, whose first field is its
    // `__locales[LC_CTYPE]` (`LC_CTYPE` is 0); freed at once (the data is
    // shared and counted, so it lives on in the global locale).
    let data = unsafe {
        // glibc's `LC_GLOBAL_LOCALE`.
        let l = libc::duplocale(-1isize as libc::locale_t);
        if l.is_null() {
            return;
        }
        let d = *(l as *const usize);
        libc::freelocale(l);
        d
    };
    let Some((first, n)) = arena_pages(g, data & !(PAGE - 1), data % PAGE + 128) else { return };
    let pid = std::process::id();
    // Not waited for: in a child forked while another thread held it, it
    // stays taken (that child's thread starts go without, as before).
    let Ok(mut kept) = LOCALE_KEPT.try_lock() else { return };
    if *kept == (pid, first, n) {
        return;
    }
    loop {
        let mut m = crate::lock_unowned(g, first, n);
        match m.lock_pages(first, n, &g.stats) {
            Ok(true) => break,
            Ok(false) => continue,
            // Not kept: a thread start may still find it cold.
            Err(_) => return,
        }
    }
    let was = std::mem::replace(&mut *kept, (pid, first, n));
    // The locale before (same process: locks are not inherited by fork).
    if was.0 == pid && was.2 > 0 {
        crate::lock_program(g).unlock_pages(was.1, was.2);
    }
}

// The `longjmp` family: a jump out of a signal handler that ran while
// the dispatch handler made a call for the program must not leave that
// handler's state behind (see `sud::jump`). Elsewhere they are glibc's.

/// Exports glibc's jump `$name` (documented as `$doc`) through
/// [`crate::sud::jump`].
macro_rules! jump_export {
    ($name:ident, $which:ident, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The C contract of `longjmp`.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(env: *mut c_void, val: c_int) -> ! {
            // SAFETY: the caller's contract.
            unsafe { crate::sud::jump(crate::sud::Jump::$which, env, val) }
        }
    };
}

jump_export!(longjmp, Longjmp, "`longjmp(3)`.");
jump_export!(_longjmp, UnderscoreLongjmp, "`_longjmp(3)`.");
jump_export!(siglongjmp, Siglongjmp, "`siglongjmp(3)`.");
jump_export!(__longjmp_chk, LongjmpChk, "`__longjmp_chk`: `longjmp` under `_FORTIFY_SOURCE`.");
