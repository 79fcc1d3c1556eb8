//! Write protections made on the program's CPU.
//!
//! Every protection change of a page the program may have in its TLB is
//! a TLB shootdown: made from another CPU, an interrupt on each CPU that
//! runs the program. On this machine (a nested VM) such an interrupt
//! costs the interrupted thread 5.6–7.2 µs (`scripts/ipi-cost.c`, two
//! runs), and the corpus builder at 256M took ~610 k of them, about one
//! per write-protect call of the background evictor: 3.4–4.4 s of the
//! program's CPU, a quarter of `ztier run`'s overhead over native. A
//! CPU whose threads of the process all sleep is lazy and gets none.
//!
//! So the evictor does not write-protect its victims itself: it posts
//! the job here and sleeps (a futex), and the next thread to finish a
//! fault service — the program's own thread with `--fault-path signal`,
//! or the handler, which runs next to it — makes the calls on its CPU,
//! then wakes the evictor. The evictor then reads and compresses on its
//! own CPU as before. The other half of its page-table work, releasing
//! the victims (`MADV_DONTNEED`, one batched call and one shootdown per
//! batch), stays on the evictor: done from the program's CPU too, it
//! removed the last shootdowns, but freeing the pages there cost more
//! than it saved (28.24 s against 26.64 s, one run each).
//!
//! ```text
//!   evictor (other CPU)                  program's CPU
//!   take victims ─► post job (POSTED) ─► sleeps
//!                                        fault served ─► TAKEN: signals
//!                                        blocked, UFFDIO_WRITEPROTECT
//!                                        per run ─► DONE / FAILED, wake
//!   ◄────────────────────────────────────
//!   read + compress, MADV_DONTNEED, commit, unprotect + wake writers
//! ```
//!
//! If no service takes the job within [`NEAR_WAIT`] (the program is not
//! faulting) the evictor takes it back and makes the calls itself; a job
//! that failed is made again by the evictor, which reports the error. A
//! thread runs the job with its asynchronous signals blocked, so no
//! handler of the program can leave it by a jump half done.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

const EMPTY: u32 = 0;
const POSTED: u32 = 1;
const TAKEN: u32 = 2;
const DONE: u32 = 3;
const FAILED: u32 = 4;

/// How long the evictor waits for a fault service to take its job.
pub use ztier_policy::pacing::NEAR_WAIT;

static STATE: AtomicU32 = AtomicU32::new(EMPTY);
/// The posted job: on the evictor's stack, live until it sees DONE or
/// FAILED, or takes the job back.
struct Job<'a>(&'a (dyn Fn() -> std::io::Result<()> + Sync));
static JOB: AtomicPtr<Job<'static>> = AtomicPtr::new(std::ptr::null_mut());

/// In the evictor: has `f` run by the next fault service on the
/// program's CPU (returns true), or runs it here after [`NEAR_WAIT`]
/// or if it failed there (false).
pub fn run_near(f: &(dyn Fn() -> std::io::Result<()> + Sync)) -> std::io::Result<bool> {
    let job = Job(f);
    JOB.store(&job as *const Job as *mut Job<'static>, Ordering::Release);
    STATE.store(POSTED, Ordering::Release);
    let start = std::time::Instant::now();
    let nap = libc::timespec { tv_sec: 0, tv_nsec: NEAR_WAIT.as_nanos() as i64 };
    loop {
        match STATE.load(Ordering::Acquire) {
            DONE => {
                STATE.store(EMPTY, Ordering::Release);
                return Ok(true);
            }
            FAILED => {
                STATE.store(EMPTY, Ordering::Release);
                return f().map(|()| false);
            }
            POSTED if start.elapsed() >= NEAR_WAIT => {
                if STATE.compare_exchange(POSTED, EMPTY, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    return f().map(|()| false);
                }
            }
            // TAKEN: a thread with its signals blocked is making the
            // calls; it wakes this one when done.
            seen => crate::sys::futex_wait(&STATE, seen, Some(&nap)),
        }
    }
}

/// After a fault service: runs the evictor's posted job, if any.
pub fn take_posted() {
    if STATE.load(Ordering::Relaxed) != POSTED
        || STATE.compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Relaxed).is_err()
    {
        return;
    }
    let mask = crate::sys::sigprocmask(libc::SIG_BLOCK, crate::sys::ASYNC_SIGNALS);
    // SAFETY: posted by the evictor, which keeps it live until it sees
    // the state this sets.
    let ok = (unsafe { &*JOB.load(Ordering::Acquire) }.0)().is_ok();
    STATE.store(if ok { DONE } else { FAILED }, Ordering::Release);
    crate::sys::futex_wake(&STATE, 1);
    crate::sys::sigprocmask(libc::SIG_SETMASK, mask);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;

    /// One test: the mailbox is process-wide.
    #[test]
    fn a_job_runs_where_it_is_taken_or_back_in_the_evictor() {
        // Nobody takes it: the evictor runs it after the wait.
        let runs = AtomicUsize::new(0);
        let t = std::time::Instant::now();
        let near = run_near(&|| {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert!(!near && runs.load(Ordering::Relaxed) == 1 && t.elapsed() >= NEAR_WAIT);
        assert_eq!(STATE.load(Ordering::Relaxed), EMPTY);
        take_posted(); // nothing posted: nothing happens

        // A "fault service" that takes jobs: they run on its thread.
        let stop = Arc::new(AtomicBool::new(false));
        let taker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    take_posted();
                    std::hint::spin_loop();
                }
            })
        };
        let here = std::thread::current().id();
        let mut taken = 0;
        for _ in 0..200 {
            let elsewhere = AtomicUsize::new(0);
            let near = run_near(&|| {
                elsewhere.fetch_add(usize::from(std::thread::current().id() != here), Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
            // Taken in time (the taker spins), or at worst back here.
            assert_eq!(elsewhere.load(Ordering::Relaxed), usize::from(near));
            taken += usize::from(near);
        }
        assert!(taken > 100, "{taken} of 200 jobs taken by the spinning taker");
        // A job that fails where it is taken runs again here, and its
        // error is the evictor's to report.
        let tries = AtomicUsize::new(0);
        let r = run_near(&|| {
            tries.fetch_add(1, Ordering::Relaxed);
            if std::thread::current().id() == here {
                Err(std::io::Error::other("refused here too"))
            } else {
                Err(std::io::Error::other("refused there"))
            }
        });
        stop.store(true, Ordering::Relaxed);
        taker.join().unwrap();
        let e = r.unwrap_err();
        assert_eq!(e.to_string(), "refused here too");
        assert!((1..=2).contains(&tries.load(Ordering::Relaxed)));
        assert_eq!(STATE.load(Ordering::Relaxed), EMPTY);
    }
}
