//! The userfaultfd API against the kernel: what the device makes for a
//! process that has given up root.

/// `/dev/userfaultfd` (Linux 6.1) makes full-mode userfaultfds for the
/// process that opened it, also after it gave up the privilege to make
/// one by the system call (here: a forked child that became `nobody`).
#[test]
fn the_device_makes_full_mode_userfaultfds_after_root_is_dropped() {
    use std::os::fd::AsRawFd;
    use ztier_uffd::uffd::Uffd;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (make test runs as root)");
    let dev = Uffd::open_device().expect("/dev/userfaultfd must exist here (Linux 6.1)");
    let u = Uffd::open_via(Some(dev.as_raw_fd()), false, |_| false).unwrap();
    assert!(!u.user_mode_only);
    // SAFETY: fork in a test process; the child only makes system calls
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain calls in the child.
        let code = unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                2
            } else {
                // (The system call would give a user-mode-only one here
                // while vm.unprivileged_userfaultfd is 0, the default.)
                match Uffd::open_via(Some(dev.as_raw_fd()), false, |_| false) {
                    Ok(d) if !d.user_mode_only => 0,
                    _ => 3,
                }
            }
        };
        // SAFETY: leaving the child without unwinding.
        unsafe { libc::_exit(code) };
    }
    let mut st = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "child status {st:#x}");
}
