//! The crate's raw system calls, typed: each one's `// SAFETY:` is here,
//! and a failure comes back as the [`io::Error`] of its errno. They are
//! `userfaultfd(2)` (the `uffd` module opens one with it), and the
//! futex calls and the robust futex list of the tree budget (`tree`):
//! its futexes are words of a shared mapping, so not process-private.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// `syscall(2)`'s result: `Err` with the errno when it is -1.
fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `userfaultfd(flags)`: a new userfaultfd, owned (`flags`: `O_CLOEXEC`,
/// `O_NONBLOCK`, `UFFD_USER_MODE_ONLY`).
pub fn userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a system call with one integer argument.
    let fd = check(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    // SAFETY: a descriptor the kernel just made, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `FUTEX_WAKE` (shared: the sleepers may be other processes): wakes up
/// to `n` sleepers on `word`; how many it woke.
pub fn futex_wake(word: &AtomicU32, n: u32) -> io::Result<usize> {
    let n = n.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: a futex wake on a live, aligned u32; the kernel only looks
    // the address up.
    check(unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n, 0usize) })
        .map(|r| r as usize)
}

/// `FUTEX_WAIT` (shared): sleeps while `word` reads `expected`, until
/// woken or for at most `timeout`. `Err` with `TimedOut` (ETIMEDOUT) when
/// the time ran out, `WouldBlock` (EAGAIN) when it read otherwise at the
/// call, `Interrupted` (EINTR) after a signal.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> io::Result<()> {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: a futex wait on a live, aligned u32, with a relative
    // timeout that lives through the call; the kernel only reads both.
    check(unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    })
    .map(drop)
}

/// `set_robust_list(head, size_of::<H>())`: makes `head` the calling
/// thread's robust futex list (the one glibc registered is replaced).
///
/// # Safety
/// `head` is a `struct robust_list_head` whose list is well formed, and
/// it and every futex word it names stay live and writable as long as
/// the thread lives: the kernel walks the list, and writes those words,
/// when the thread ends.
pub unsafe fn set_robust_list<H>(head: *const H) -> io::Result<()> {
    // SAFETY: the caller's contract; the kernel reads only the size given.
    check(unsafe { libc::syscall(libc::SYS_set_robust_list, head, std::mem::size_of::<H>()) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// A userfaultfd made with `O_CLOEXEC` carries it; flags the kernel
    /// does not know are refused with EINVAL (`UFFD_USER_MODE_ONLY`
    /// with them, so that the refusal is not EPERM's).
    #[test]
    fn userfaultfd_makes_an_owned_descriptor_or_says_why_not() {
        let fd = userfaultfd(libc::O_CLOEXEC | libc::O_NONBLOCK | crate::uffd::USER_MODE_ONLY).unwrap();
        // SAFETY: F_GETFD on a descriptor we own.
        let fdflags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(fdflags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let e = userfaultfd(crate::uffd::USER_MODE_ONLY | 0x4000_0000).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    }

    /// A wait on a word that reads otherwise returns at once with EAGAIN,
    /// one nobody wakes ends with ETIMEDOUT, and a wake with nobody asleep
    /// wakes none.
    #[test]
    fn a_wait_ends_with_eagain_or_etimedout_and_a_wake_of_none_wakes_none() {
        let w = AtomicU32::new(5);
        let e = futex_wait(&w, 4, Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        let e = futex_wait(&w, 5, Duration::from_millis(1)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(futex_wake(&w, 1).unwrap(), 0);
        assert_eq!(w.load(Ordering::Relaxed), 5);
    }

    /// A thread asleep on a word is woken by a wake, which counts it.
    #[test]
    fn a_sleeping_thread_is_woken_and_counted() {
        let w = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let w = w.clone();
            std::thread::spawn(move || futex_wait(&w, 0, Duration::from_secs(600)))
        };
        while futex_wake(&w, u32::MAX).unwrap() == 0 {
            std::thread::yield_now();
        }
        sleeper.join().unwrap().unwrap();
    }

    /// A list head of another size than the kernel's is refused (EINVAL),
    /// and the thread's list is left as it was.
    #[test]
    fn a_robust_list_of_the_wrong_size_is_refused() {
        let head = [0u64; 2];
        // SAFETY: refused before the kernel takes the list (its size is
        // not `struct robust_list_head`'s).
        let e = unsafe { set_robust_list(&head) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
