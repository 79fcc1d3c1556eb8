//! The store's lock: a futex word, and nothing kept per thread.
//!
//! ```text
//!   word: 0 free ── lock (CAS 0→1) ──► 1 held ── a waiter (swap 2) ──► 2 held, waiters
//!         ▲                                                                 │
//!         └──────────── unlock: swap 0; FUTEX_WAKE one if it was 2 ◄────────┘
//! ```
//!
//! Why not `parking_lot` (which the store used before): its slow path
//! keeps per-thread data, made on a thread's first wait for a lock, and a
//! Rust thread-local with a destructor is registered with glibc's
//! `__cxa_thread_atexit_impl`, which allocates with the program's
//! `calloc`. Under `ztier run` faults are served in whichever thread
//! takes them, from its `SIGBUS` handler, and that thread may be one the
//! library never saw start (glibc starts the helper threads of a
//! `SIGEV_THREAD` timer and of POSIX AIO itself). When such a thread
//! first waited for a shard's lock, with the manager's lock held, glibc
//! called the program's own `calloc` (a `malloc` linked into the program,
//! as rustc links jemalloc), whose lock was held by another thread that
//! was waiting for the manager's lock: both waited for ever, and the
//! watchdog aborted the program after 30 s. This lock's state is its one
//! word: waiting for it allocates nothing and calls nothing of glibc's
//! but the `futex` system call.
//!
//! It is not fair: a thread that comes while a woken waiter is on its
//! way may take the lock first (as `std::sync::Mutex`'s futex lock).
//!
//! A waiter spins for up to [`SPIN_CYCLES`] (tens of microseconds) before
//! it sleeps. The store's critical sections are a page run's bookkeeping
//! and decoding, and the two threads that meet here, the program's (a
//! fault served in it) and the background evictor, run on different
//! CPUs. A waiter that slept makes the holder wake it, and waking a
//! thread on an idle CPU is an interrupt to it: measured on the corpus
//! builder at 256M (`ztier run --fault-path signal`, `perf record -e
//! cpu-clock`), the program's thread spent ~6 µs in `try_to_wake_up` per
//! wake-up, ~40 k of them a run when waiters spun only 100 loads.
//!
//! It is a [`lock_api::RawMutex`], so [`Mutex`] has parking_lot's
//! interface: guards without poisoning, `try_lock`, `force_unlock` (the
//! store's fork handling), and `const` construction.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::sys;

/// A mutex over a [`RawFutexLock`]: `lock()` returns the guard itself (no
/// poisoning).
pub type Mutex<T> = lock_api::Mutex<RawFutexLock, T>;

/// A [`Mutex`] in a `static`.
pub const fn const_mutex<T>(value: T) -> Mutex<T> {
    Mutex::const_new(<RawFutexLock as lock_api::RawMutex>::INIT, value)
}

const FREE: u32 = 0;
const HELD: u32 = 1;
const CONTENDED: u32 = 2;

/// How long a waiter spins before it sleeps, in time-stamp counter ticks
/// (x86-64; 46 µs on this machine's 2.6 GHz counter) or, elsewhere (and
/// under miri, which has no `rdtsc`), in nanoseconds.
pub const SPIN_CYCLES: u64 = 120_000;

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` reads the time-stamp counter; it has no
    // preconditions and touches no memory.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(any(not(target_arch = "x86_64"), miri))]
fn ticks() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

/// Spins until `done()` says so or about [`SPIN_CYCLES`] have passed;
/// returns whether it said so. `done` is asked every few spin-loop hints,
/// not on every one, so a waiter that writes (a `try_lock`) does not keep
/// the holder's cache line away from it. On x86-64 it calls nothing of
/// glibc's (elsewhere the clock is `clock_gettime`, which allocates
/// nothing).
pub fn spin_until(mut done: impl FnMut() -> bool) -> bool {
    let start = ticks();
    loop {
        if done() {
            return true;
        }
        for _ in 0..4 {
            std::hint::spin_loop();
        }
        if ticks().wrapping_sub(start) > SPIN_CYCLES {
            return done();
        }
    }
}

/// The lock word (see the module docs).
pub struct RawFutexLock {
    word: AtomicU32,
}

impl RawFutexLock {
    #[cold]
    fn lock_contended(&self) {
        let mut state = self.spin();
        if state == FREE {
            match self.word.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(s) => state = s,
            }
        }
        loop {
            // Say there is a waiter (unless already said), and take the
            // lock if it was free meanwhile: then it is taken as
            // CONTENDED, which at worst costs one wake-up with no one to
            // wake.
            if state != CONTENDED && self.word.swap(CONTENDED, Ordering::Acquire) == FREE {
                return;
            }
            // Woken, or the word changed first (EAGAIN), or a signal:
            // the loop looks again either way.
            let _ = sys::futex_wait(&self.word, CONTENDED);
            state = self.spin();
        }
    }

    /// Waits a little ([`spin_until`]) for the word to stop being HELD
    /// (no waiters): what it is then.
    fn spin(&self) -> u32 {
        let mut state = HELD;
        spin_until(|| {
            state = self.word.load(Ordering::Relaxed);
            state != HELD
        });
        state
    }
}

// SAFETY: the lock is held from a successful `lock`/`try_lock` (the word
// moved from FREE by this thread with Acquire) until `unlock` (swap to
// FREE with Release), so at most one holder at a time, and the holder's
// writes are seen by the next one.
unsafe impl lock_api::RawMutex for RawFutexLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawFutexLock { word: AtomicU32::new(FREE) };
    // A guard may be dropped on another thread: unlocking needs nothing of
    // the thread that locked.
    type GuardMarker = lock_api::GuardSend;

    #[inline]
    fn lock(&self) {
        if self.word.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.word.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    #[inline]
    unsafe fn unlock(&self) {
        if self.word.swap(FREE, Ordering::Release) == CONTENDED {
            // Nothing to do about a failed wake of a live word.
            let _ = sys::futex_wake(&self.word, 1);
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.word.load(Ordering::Relaxed) != FREE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Mutual exclusion under contention: a counter bumped with a
    /// non-atomic read-modify-write by four threads ends exact, and
    /// waiters slept (the word went CONTENDED) and were woken.
    #[test]
    fn excludes_and_wakes_its_waiters() {
        // Fewer rounds under miri, which runs this for undefined behaviour.
        const ITERS: u64 = if cfg!(miri) { 400 } else { 20_000 };
        let m = Arc::new(Mutex::new((0u64, 0usize)));
        let slept = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (m, slept) = (m.clone(), slept.clone());
                std::thread::spawn(move || {
                    for i in 0..ITERS {
                        let mut g = m.lock();
                        let v = std::hint::black_box(g.0);
                        if i % (ITERS / 20) == 0 {
                            // Long enough for the others to give up spinning.
                            std::thread::sleep(std::time::Duration::from_micros(200));
                            // SAFETY: only reads the word of a lock this thread holds.
                            let raw = unsafe { m.raw() };
                            if raw.word.load(Ordering::Relaxed) == CONTENDED {
                                slept.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        g.0 = v + 1;
                        g.1 += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let g = m.lock();
        assert_eq!((g.0, g.1), (4 * ITERS, 4 * ITERS as usize));
        assert!(slept.load(Ordering::Relaxed) > 0, "no waiter ever slept");
        drop(g);
        assert!(!m.is_locked());
    }

    /// `spin_until` returns as soon as its condition holds, and gives up
    /// (false) after a bounded spin when it never does.
    #[test]
    #[cfg_attr(miri, ignore = "timing: miri's virtual clock passes the bound within two asks")]
    fn spin_until_stops_at_the_condition_or_the_bound() {
        let mut asked = 0;
        assert!(spin_until(|| {
            asked += 1;
            asked == 3
        }));
        assert_eq!(asked, 3);
        let t = std::time::Instant::now();
        let start = ticks();
        let mut asked = 0;
        assert!(!spin_until(|| {
            asked += 1;
            false
        }));
        assert!(ticks().wrapping_sub(start) > SPIN_CYCLES, "gave up early");
        assert!(asked > 1);
        assert!(t.elapsed() < std::time::Duration::from_millis(100), "spun {:?}", t.elapsed());
    }

    #[test]
    fn try_lock_and_force_unlock() {
        static M: Mutex<u32> = const_mutex(5);
        let g = M.try_lock().expect("free");
        assert!(M.try_lock().is_none());
        std::mem::forget(g);
        assert!(M.is_locked());
        // SAFETY: this thread holds the lock (its guard forgotten above).
        unsafe { M.force_unlock() };
        assert_eq!(*M.try_lock().expect("free again"), 5);
    }
}
