//! userfaultfd's floor: every page of every timing is served by the
//! measuring handler (`measure` checks each page's content and the count
//! of faults it served, and fails otherwise), the costs are plausible, and
//! the caller's CPU affinity is left as it was.

use ztier_uffd::floor::{measure, FloorError};

fn affinity() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the calling thread, a set of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(r, 0);
    // SAFETY: CPU_ISSET reads a live set; i < CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&i| unsafe { libc::CPU_ISSET(i, &set) }).collect()
}

#[test]
fn every_page_comes_from_the_handler_and_the_costs_are_plausible() {
    let before = affinity();
    let f = measure(2048, 8).expect("userfaultfd must work here (root or user-mode-only)");
    assert_eq!(affinity(), before, "the caller's affinity must come back");
    assert_eq!((f.pages, f.run), (2048, 8));
    assert!(before.contains(&f.cpu), "{f:?} not on one of {before:?}");
    for (what, v) in [("anon", f.anon_fault_us), ("fault", f.fault_us)] {
        // A fault costs more than nothing and less than a millisecond.
        assert!(v.is_finite() && v > 0.01 && v < 1000.0, "{what}: {f:?}");
    }
    assert!(f.page_us.is_finite() && f.page_us >= 0.0 && f.page_us < 1000.0, "{f:?}");
    // A page more of a run costs less than a whole round trip more.
    assert!(f.page_us < f.fault_us, "{f:?}");
    assert!((f.service_floor_s(1_000_000, 0) - f.fault_us).abs() < 1e-9);
    assert!((f.service_floor_s(0, 2_000_000) - 2.0 * f.page_us).abs() < 1e-9);
}

#[test]
fn runs_of_one_page_and_tiny_timings_are_refused() {
    assert!(matches!(measure(2048, 1), Err(FloorError::Arguments { run: 1, pages: 2048 })));
    let e = measure(10, 8).unwrap_err();
    assert!(e.to_string().contains("at least 64 pages"), "{e}");
}
