//! The store's raw system calls, typed: each one's `// SAFETY:` is here,
//! and a failure comes back as the [`io::Error`] of its errno. The store
//! makes only the futex calls of its lock (the `lock` module): process
//! private, on a word of the caller's.

use std::io;
use std::sync::atomic::AtomicU32;

/// `syscall(2)`'s result: `Err` with the errno when it is -1.
fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `FUTEX_WAIT` (process-private), no timeout: sleeps while `word` reads
/// `expected`, until woken. `Err` with `WouldBlock` (EAGAIN) when it
/// read otherwise at the call, `Interrupted` (EINTR) after a signal.
pub fn futex_wait(word: &AtomicU32, expected: u32) -> io::Result<()> {
    // SAFETY: FUTEX_WAIT on a live, aligned u32 with no timeout; the
    // kernel only reads the word.
    check(unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    })
    .map(drop)
}

/// `FUTEX_WAKE` (process-private): wakes up to `n` threads sleeping on
/// `word`; how many it woke.
pub fn futex_wake(word: &AtomicU32, n: u32) -> io::Result<usize> {
    let n = n.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: FUTEX_WAKE on a live, aligned u32; the kernel only looks
    // the address up.
    check(unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, n)
    })
    .map(|r| r as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// A wait on a word that reads otherwise returns at once with EAGAIN;
    /// a wake with nobody asleep wakes none.
    #[test]
    fn a_wait_on_a_changed_word_returns_eagain_and_a_wake_of_none_wakes_none() {
        let w = AtomicU32::new(5);
        let e = futex_wait(&w, 4).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(futex_wake(&w, 1).unwrap(), 0);
        assert_eq!(w.load(Ordering::Relaxed), 5);
    }

    /// A thread asleep on a word is woken by a wake (which says it woke
    /// one), and only by it: nothing changes the word.
    #[test]
    fn a_sleeping_thread_is_woken_and_counted() {
        let w = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let w = w.clone();
            std::thread::spawn(move || futex_wait(&w, 0))
        };
        // Until it is asleep, a wake finds nobody.
        while futex_wake(&w, 1).unwrap() == 0 {
            std::thread::yield_now();
        }
        sleeper.join().unwrap().unwrap();
    }
}
