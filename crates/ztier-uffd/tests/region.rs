//! Pages evicted into the compressed store come back, byte for byte, through
//! userfaultfd faults served by the handler thread; memory is really
//! released; untouched pages fault in as zeros.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_codec::corpus::synth;
use ztier_store::{Store, StoreConfig};
use ztier_uffd::region::{Region, PAGE};

fn wait_until(mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn evicted_pages_come_back_through_faults_from_several_threads() {
    let pages = 2048; // 8 MiB
    let store = Arc::new(Store::new(StoreConfig::new(64 << 20)));
    let region =
        Region::new(pages, store.clone()).expect("userfaultfd must work here (root or user-mode-only)");
    let base = region.as_mut_ptr() as usize;
    // Fill: every page of a synthetic kind (ints, pointers, text, random, sparse).
    let mut want = Vec::with_capacity(pages);
    for i in 0..pages {
        let kind = synth::KINDS[i % synth::KINDS.len()];
        let p = synth::page(kind, i as u64);
        // SAFETY: page i is inside the region; this thread is its only user now.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), (base + i * PAGE) as *mut u8, PAGE) };
        want.push(p);
    }
    // The first touches above faulted in zero pages through the handler
    // (it counts just after waking the faulting thread: wait for it).
    wait_until(|| region.stats().zero_filled.load(Relaxed) == pages as u64);
    assert_eq!(region.resident_pages().unwrap(), pages);
    for i in 0..pages {
        region.evict(i).unwrap();
    }
    assert_eq!(region.resident_pages().unwrap(), 0, "evicted memory is released");
    let st = store.stats();
    assert!(st.compressed_bytes < (pages * PAGE) as u64, "{st:?}");
    // Read everything back from 4 threads, each page by two of them.
    std::thread::scope(|s| {
        for t in 0..4usize {
            let want = &want;
            s.spawn(move || {
                for k in 0..pages / 2 {
                    let i = (k * 2 + t / 2 + t * 131) % pages;
                    let mut got = vec![0u8; PAGE];
                    // SAFETY: reading page i of the live region; faults are served by the handler.
                    unsafe {
                        std::ptr::copy_nonoverlapping((base + i * PAGE) as *const u8, got.as_mut_ptr(), PAGE)
                    };
                    assert!(got == want[i], "page {i} differs after the round trip");
                }
            });
        }
    });
    let s = region.stats();
    // Every stored page came back from the store exactly once (the get is
    // exclusive; a second thread's fault on the same page finds it mapped).
    let stored = want.iter().filter(|p| p.iter().any(|&b| b != 0)).count() as u64;
    wait_until(|| s.from_store.load(Relaxed) == stored);
    assert_eq!(region.resident_pages().unwrap(), pages);
    assert_eq!(store.stats().pages, 0, "exclusive gets leave nothing behind");
    let p50 = s.latency_quantile(0.5).unwrap();
    let p99 = s.latency_quantile(0.99).unwrap();
    eprintln!("fault service: p50 ≤ {p50} µs, p99 ≤ {p99} µs over {} faults", s.faults.load(Relaxed));
    assert!(p50 <= p99);
}

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
