//! The store keeps nothing per thread that glibc's thread-exit
//! destructors are told of. `ztier run` serves a fault in whichever
//! thread takes it, from its `SIGBUS` handler, and `__cxa_thread_atexit_impl`
//! allocates with the program's `calloc`, whose lock that thread (or the
//! one it waits for) may hold: see `ztier_store::lock`.
//!
//! This test binary defines `__cxa_thread_atexit_impl` itself, which
//! Rust's runtime then calls (it links the symbol weakly): it counts
//! registrations per thread and passes them on to glibc's.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig};

thread_local! {
    /// Destructors this thread registered (no destructor of its own).
    static REGISTERED: Cell<usize> = const { Cell::new(0) };
}

type AtexitFn = unsafe extern "C" fn(
    unsafe extern "C" fn(*mut libc::c_void),
    *mut libc::c_void,
    *mut libc::c_void,
) -> libc::c_int;

/// Counts, then registers with glibc's.
///
/// # Safety
///
/// As glibc's: called by the runtime with a destructor, its object and
/// the DSO handle.
#[no_mangle]
pub unsafe extern "C" fn __cxa_thread_atexit_impl(
    dtor: unsafe extern "C" fn(*mut libc::c_void),
    obj: *mut libc::c_void,
    dso: *mut libc::c_void,
) -> libc::c_int {
    REGISTERED.with(|r| r.set(r.get() + 1));
    // SAFETY: a symbol lookup with a NUL-terminated name.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"__cxa_thread_atexit_impl".as_ptr()) };
    assert!(!next.is_null(), "glibc's __cxa_thread_atexit_impl not found");
    // SAFETY: glibc's function of this type, called as the runtime would.
    unsafe { std::mem::transmute::<*mut libc::c_void, AtexitFn>(next)(dtor, obj, dso) }
}

fn page(seed: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i / 64) as u8 ^ seed).collect()
}

/// A thread new to the store puts and gets pages while every shard's
/// lock is held elsewhere (it waits, asleep, for them), and registers no
/// thread-exit destructor doing it. The store's parking_lot locks made
/// thread data on a thread's first wait, registered here: this failed
/// with 1 registration.
#[test]
fn waiting_for_the_stores_locks_registers_nothing_at_thread_exit() {
    // The hook is the one the runtime calls: a thread-local with a
    // destructor, first used on a new thread, counts 1.
    thread_local! { static PROBE: Vec<u8> = const { Vec::new() }; }
    let probe = std::thread::spawn(|| {
        let before = REGISTERED.with(Cell::get);
        PROBE.with(|p| assert!(p.is_empty()));
        REGISTERED.with(Cell::get) - before
    });
    assert_eq!(probe.join().unwrap(), 1, "the hook does not see the runtime's registrations");

    let store = Arc::new(Store::new(StoreConfig::new(8 << 20)));
    let pool = store.create_pool(PoolOptions::new(PoolKind::Persistent)).unwrap();
    // Every shard's lock taken here (what `ztier run` does around fork).
    store.lock_for_fork();
    let started = Arc::new(AtomicBool::new(false));
    let worker = {
        let (store, started) = (store.clone(), started.clone());
        std::thread::spawn(move || {
            let before = REGISTERED.with(Cell::get);
            started.store(true, Ordering::Release);
            let mut out = vec![0u8; 4096];
            for i in 0..64u32 {
                let key = Key { pool, object: 3, index: i };
                store.put(key, &page(i as u8), PutFlags::default()).unwrap();
                assert!(store.get(key, &mut out, false).unwrap());
                assert_eq!(out, page(i as u8));
            }
            REGISTERED.with(Cell::get) - before
        })
    };
    while !started.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    // Long past any spinning: the worker sleeps on a shard's lock.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!worker.is_finished(), "the worker did not wait for the shard's lock");
    // SAFETY: this thread took every shard's lock in `lock_for_fork`.
    unsafe { store.unlock_after_fork() };
    assert_eq!(worker.join().unwrap(), 0, "thread-exit destructors registered by the store");
    assert_eq!(store.stats().pages, 64);
}
