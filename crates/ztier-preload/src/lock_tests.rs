//! Unit tests of the library's lock ([`crate::lock`]).

use super::*;

/// `lock` excludes (a non-atomic count by three threads ends exact,
/// with holds long enough that waiters outlast their spin and sleep),
/// and takes a poisoned lock as a held one.
#[test]
fn lock_excludes_and_takes_a_poisoned_lock() {
    let m = std::sync::Arc::new(std::sync::Mutex::new(0u64));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..5_000 {
                    let mut g = lock(&m);
                    let v = std::hint::black_box(*g);
                    if i % 500 == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(300));
                    }
                    *g = v + 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*lock(&m), 15_000);
    let m2 = m.clone();
    let _ = std::thread::spawn(move || {
        let _g = m2.lock().unwrap();
        panic!("poisoning the lock on purpose");
    })
    .join();
    assert!(m.is_poisoned());
    *lock(&m) += 1;
    assert_eq!(*lock(&m), 15_001);
}
