//! Faults, eviction (inline and in batches, clean pages), pins and holds.

use super::*;
use crate::manager::evict::runs_of;

#[test]
fn demoted_pages_that_fault_back_are_regretted() {
    let (mut m, base) = test_manager(2048);
    let stats = Stats::new();
    // Fill the protected segment, then push it over its share.
    fill_pages(&mut m, base, 2048, &stats, |i| 1 + i as u8 % 250);
    assert_eq!(m.resident(), 2048);
    seg(&mut m).set_protected_max(100);
    let v = m.take_victims(32, 0, 0).unwrap().expect("victims");
    let demoted: Vec<usize> = (0..2048).filter(|&i| seg(&mut m).demoted(i)).collect();
    assert!(!demoted.is_empty(), "over its share, the protected segment sheds pages");
    evict_batch(&mut m, &v, &stats);
    // Evict a demoted page, then fault it back: one regret, mark gone.
    let i = demoted[0];
    seg(&mut m).set_protected_max(2048);
    let mut gone = false;
    for _ in 0..64 {
        let v = m.take_victims(64, 0, 0).unwrap().expect("victims");
        evict_batch(&mut m, &v, &stats);
        if m.st(i) & STATE != RESIDENT {
            gone = true;
            break;
        }
    }
    assert!(gone, "the demoted page was evicted");
    assert_eq!((m.st(i) & STATE, seg(&mut m).demoted(i)), (STORED, true), "the mark stays while it is out");
    let before = stats.regretted.load(Ordering::Relaxed);
    let _ = m.serve(base + i * PAGE, &stats).unwrap();
    assert_eq!((m.st(i) & STATE, seg(&mut m).demoted(i)), (RESIDENT, false));
    // (Its stored neighbours may come with it, demoted ones too.)
    assert!(stats.regretted.load(Ordering::Relaxed) > before);
    // SAFETY: page i is resident again.
    assert_eq!(unsafe { *((base + i * PAGE) as *const u8) }, 1 + i as u8 % 250);
}

#[test]
fn a_fault_at_the_budget_evicts_inline_and_counts_it() {
    let (mut m, base) = test_manager(1024);
    let stats = Stats::new();
    m.budget = 128;
    m.repl.set_budget(m.budget);
    for f in (0..128).step_by(16) {
        let _ = m.install(f, 16, true, false, &stats).unwrap();
    }
    for i in 0..128 {
        // SAFETY: resident, writable pages of our mapping.
        unsafe { std::ptr::write_bytes((base + i * PAGE) as *mut u8, 7, PAGE) };
    }
    assert_eq!(stats.evicted_inline.load(Ordering::Relaxed), 0);
    // No background evictor here: the fault itself must make room,
    // what its run needs (INLINE_RUN at most: `inline_room`) and
    // INLINE_LEAST pages at least, not a batch below the budget.
    let _ = m.serve(base + 500 * PAGE, &stats).unwrap();
    let inline = stats.evicted_inline.load(Ordering::Relaxed);
    let installed = m.resident() - (128 - inline as usize);
    assert!((1..=INLINE_RUN).contains(&installed), "{installed} installed");
    assert_eq!(inline as usize, installed.max(INLINE_LEAST), "pages evicted inline");
    assert_eq!(inline, stats.pages_compressed.load(Ordering::Relaxed));
    assert_eq!(stats.inline_evictions.load(Ordering::Relaxed), 1);
    let ns = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let parts = ns(&stats.evict_take_ns)
        + ns(&stats.evict_protect_ns)
        + ns(&stats.evict_compress_ns)
        + ns(&stats.evict_release_ns);
    assert!(parts > 0 && parts <= ns(&stats.evict_ns), "{parts} of {}", ns(&stats.evict_ns));
    assert_eq!(ns(&stats.evict_tier_ns), 0, "no next tier");
    assert!(m.resident() <= 128, "{} resident", m.resident());
    assert_eq!(m.st(500) & STATE, RESIDENT);
    // A fault with room evicts nothing.
    m.budget = 256;
    let _ = m.serve(base + 600 * PAGE, &stats).unwrap();
    assert_eq!(stats.inline_evictions.load(Ordering::Relaxed), 1);
    assert_eq!(stats.evicted_inline.load(Ordering::Relaxed), inline);
}

#[test]
fn released_unreadable_pages_stay_out_of_zero_runs() {
    // V8 makes a guard page unreadable, then gives it back with
    // MADV_DONTNEED: it must stay unevictable, or a fault on a
    // neighbour installs it in a zero run and the evictor reads it.
    let (mut m, base) = test_manager(64);
    let stats = Stats::new();
    m.set_noevict(5, 1, true);
    m.release(5, 1, &stats);
    assert_ne!(m.st(5) & NOEVICT, 0);
    let _ = m.serve(base + 2 * PAGE, &stats).unwrap();
    assert_eq!(m.st(2) & STATE, RESIDENT);
    assert_eq!(m.st(4) & STATE, RESIDENT);
    assert_eq!(m.st(5) & STATE, ABSENT, "the zero run stops at the unreadable page");
    assert_eq!(m.st(6) & STATE, ABSENT);
}

/// A batch of dirty victims `pages` of `m`, protected in `protect`'s runs.
fn dirty_victims(m: &Manager, protect: Vec<(usize, usize)>, pages: &[usize]) -> Victims {
    Victims {
        protect,
        pages: pages.to_vec(),
        clean: vec![false; pages.len()],
        mode: m.clean,
        hashes: m.hashes.clone(),
        uffd: m.uffd.clone(),
        store: m.store.clone(),
        pool: m.pool,
        base: m.base,
        waiters: Default::default(),
        wakes: Default::default(),
        mincores: Default::default(),
    }
}

#[test]
fn victims_are_protected_run_by_run_and_their_neighbours_are_not() {
    let pages = 2048;
    let (mut m, base) = test_manager(pages);
    let stats = Stats::new();
    // Pages 0..40 resident (installed through the handler's path).
    let _ = m.install(0, 16, true, false, &stats).unwrap();
    let _ = m.install(16, 16, true, false, &stats).unwrap();
    let _ = m.install(32, 8, true, false, &stats).unwrap();
    let victims = [3, 4, 5, 20, 39];
    for &i in &victims {
        m.set(i, (m.st(i) & !STATE) | EVICTING);
    }
    let runs = runs_of(victims);
    assert_eq!(runs, vec![(3, 3), (20, 1), (39, 1)]);
    let v = dirty_victims(&m, runs.clone(), &victims);
    v.protect(&stats).unwrap();
    assert_eq!(stats.wp_calls.load(Ordering::Relaxed), 3, "one call per run");
    for i in 0..40 {
        let victim = victims.contains(&i);
        assert_eq!(write_protected(base + i * PAGE), victim, "page {i} (victim: {victim})");
    }
    // The resident neighbours stay writable: writing one does not
    // fault (a fault would wait forever: no handler runs here).
    // SAFETY: page 6 is resident, readable and writable, and ours.
    unsafe { *((base + 6 * PAGE) as *mut u8) = 1 };
    // SAFETY: as above.
    assert_eq!(unsafe { *((base + 6 * PAGE) as *const u8) }, 1);
    // The three runs are looked up in memory by one `mincore`: all in
    // memory (zeros: nothing stored), each in its place.
    let outcome = v.compress_protected(&stats).unwrap();
    assert_eq!(v.mincores.load(Ordering::Relaxed), 1, "one mincore for runs close together");
    assert_eq!(outcome, vec![Outcome::Zero; victims.len()]);
}

#[test]
fn victims_out_of_memory_are_gone_and_runs_far_apart_get_a_mincore_each() {
    let (mut m, base) = test_manager(4096);
    let stats = Stats::new();
    let _ = m.install(0, 4, true, false, &stats).unwrap();
    let _ = m.install(3000, 2, true, false, &stats).unwrap();
    for i in [0, 1, 3, 3000, 3001] {
        // SAFETY: resident, writable pages of our mapping.
        unsafe { std::ptr::write_bytes((base + i * PAGE) as *mut u8, 7, PAGE) };
    }
    // Page 1 leaves memory behind the manager's back; pages 1 and 2
    // between the victims 0 and 3 are looked at by the same call.
    sys::madvise((base + PAGE) as *mut libc::c_void, PAGE, libc::MADV_DONTNEED);
    let victims = [0, 1, 3, 3000, 3001];
    for &i in &victims {
        m.set(i, (m.st(i) & !STATE) | EVICTING);
    }
    let v = dirty_victims(&m, runs_of(victims), &victims);
    let outcome = v.compress(&stats).unwrap();
    assert_eq!(v.mincores.load(Ordering::Relaxed), 2, "a call per cluster of runs");
    let s = Outcome::Stored;
    assert_eq!(outcome, vec![s, Outcome::Gone, s, s, s]);
}

fn present(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore of one page of our mapping into one byte.
    assert_eq!(unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) }, 0);
    v & 1 != 0
}

#[test]
fn faults_on_pages_an_eviction_released_wait_for_its_commit() {
    let (mut m, base) = test_manager(64);
    let stats = Stats::new();
    let _ = m.install(0, 16, true, false, &stats).unwrap();
    for i in 0..16 {
        // SAFETY: resident, writable pages of our mapping.
        unsafe { std::ptr::write_bytes((base + i * PAGE) as *mut u8, 0x40 + i as u8, PAGE) };
    }
    let v = m.take_victims(4, 0, 0).unwrap().expect("victims");
    assert_eq!(v.pages.len(), 4);
    let outcome = v.compress(&stats).unwrap();
    assert!(outcome.iter().all(|&o| o == Outcome::Stored), "{outcome:?}");
    // The evictor releases the memory without the lock, before the commit.
    v.release(&outcome).unwrap();
    let (a, b) = (v.pages[0], v.pages[1]);
    assert!(!present(base + a * PAGE));
    assert_eq!(m.st(a) & (STATE | OWNED), EVICTING | OWNED);
    // A fault now is left waiting (not served from the store, not zeros).
    assert_eq!(m.serve(base + a * PAGE, &stats).unwrap(), None);
    assert!(!present(base + a * PAGE));
    assert_eq!(stats.deferred.load(Ordering::Relaxed), 1);
    // The program releases another victim meanwhile: it stays OWNED, so
    // nothing can be installed there before the commit.
    m.release(b, 1, &stats);
    assert_eq!(m.st(b) & (STATE | OWNED), ABSENT | OWNED);
    assert_eq!(m.serve(base + b * PAGE, &stats).unwrap(), None);
    assert!(!present(base + b * PAGE));
    v.unprotect_kept(&outcome).unwrap();
    m.commit(&v, &outcome, &stats);
    // The commit hands over the two faults left waiting, and only those
    // are woken: one call for a and b if adjacent, else two.
    let mut waiting = vec![a, b];
    waiting.sort_unstable();
    assert_eq!(v.waiters(), waiting);
    v.wake_released(&outcome).unwrap();
    assert_eq!(v.wakes(), if b == a + 1 { 1 } else { 2 });
    assert!(v.waiters().is_empty());
    assert_eq!(m.st(a) & (STATE | OWNED), STORED);
    assert_eq!(m.st(b) & (STATE | OWNED), ABSENT);
    assert!(!m.store.contains(m.key(b)), "the released page's copy is dropped");
    // The retried faults: the page from the store, the released one zeros.
    let _ = m.serve(base + a * PAGE, &stats).unwrap();
    // SAFETY: page a is resident again.
    let back = unsafe { std::slice::from_raw_parts((base + a * PAGE) as *const u8, PAGE) };
    assert!(back.iter().all(|&x| x == 0x40 + a as u8));
    let _ = m.serve(base + b * PAGE, &stats).unwrap();
    // SAFETY: page b is resident again.
    assert_eq!(unsafe { *((base + b * PAGE) as *const u8) }, 0);
    assert_eq!(m.evicting(), 0);
}

#[test]
fn a_write_takes_back_a_victim_until_its_batch_is_sealed() {
    let (mut m, base) = test_manager(64);
    let stats = Stats::new();
    fill_pages(&mut m, base, 64, &stats, |i| 0x40 + i as u8);
    let v = m.take_background_victims(8).unwrap().expect("victims");
    assert_eq!(v.pages.len(), 8);
    let (a, b) = (v.pages[0], v.pages[1]);
    // Not before the batch's protections are all made: a fault that
    // comes late (taken when the page was out) would otherwise take
    // back a page the job then protects.
    assert!(!m.take_back(a, true, &stats).unwrap());
    v.protect(&stats).unwrap();
    assert!(!m.take_back(a, true, &stats).unwrap());
    m.background_protected();
    let outcome = v.compress_protected(&stats).unwrap();
    assert!(outcome.iter().all(|&o| o == Outcome::Stored), "{outcome:?}");
    // Not in memory: nothing to take back (the fault waits).
    assert!(!m.take_back(a, false, &stats).unwrap());
    assert!(write_protected(base + a * PAGE));
    // A write to a (the handler thread's write-protect fault): it goes
    // back to the program, writable, at once.
    m.write_fault(base + a * PAGE, &stats).unwrap();
    assert!(!write_protected(base + a * PAGE));
    assert_eq!(m.st(a) & (STATE | OWNED), RESIDENT | OWNED);
    // SAFETY: page a is resident and writable (a fault here would
    // wait forever: no handler runs in this test).
    unsafe { std::ptr::write_bytes((base + a * PAGE) as *mut u8, 0x99, PAGE) };
    // Still OWNED: no other eviction takes it before the commit.
    while let Some(w) = m.take_victims(64, 0, 0).unwrap() {
        assert!(!w.pages.contains(&a), "a page taken back is evicted again before its commit");
        let wo = w.compress(&stats).unwrap();
        w.release(&wo).unwrap();
        w.unprotect_kept(&wo).unwrap();
        m.commit(&w, &wo, &stats);
        w.wake_released(&wo).unwrap();
        assert_eq!(w.wakes(), 0, "a batch no fault waited for wakes nobody");
    }
    // Sealed: b stays with its batch.
    assert_eq!(m.seal_background(&v.pages, &outcome), vec![a]);
    assert!(!m.take_back(b, true, &stats).unwrap());
    // A write to b now waits for the commit, which wakes it.
    m.write_fault(base + b * PAGE, &stats).unwrap();
    let mut release = outcome.clone();
    release[0] = Outcome::Kept;
    v.release(&release).unwrap();
    v.unprotect_kept(&outcome).unwrap();
    m.commit_background(&v, &outcome, &stats);
    assert_eq!(v.waiters(), vec![b], "the writer of b waits; a was given back at once");
    v.wake_released(&outcome).unwrap();
    assert_eq!(v.wakes(), 1);
    assert_eq!(stats.taken_back.load(Ordering::Relaxed), 1);
    assert_eq!(m.st(a) & (STATE | OWNED), RESIDENT);
    assert!(present(base + a * PAGE));
    assert!(!write_protected(base + a * PAGE), "a page taken back is left write-protected");
    assert!(!m.store.contains(m.key(a)), "what the evictor stored of a page taken back is dropped");
    // SAFETY: page a is resident.
    let back = unsafe { std::slice::from_raw_parts((base + a * PAGE) as *const u8, PAGE) };
    assert!(back.iter().all(|&x| x == 0x99), "the write to the page taken back is kept");
    assert_eq!(m.st(b) & (STATE | OWNED), STORED);
    assert!(!present(base + b * PAGE));
    let left: Vec<(usize, u8)> =
        (0..64).map(|i| (i, m.st(i))).filter(|&(_, s)| s & STATE == RESIDENT).collect();
    let queues = format!("{:?}", seg(&mut m).queues());
    assert_eq!(m.resident, 1, "only the page taken back stays resident: {left:?} queues {queues}");
    assert_eq!(m.evicting(), 0);
    // a is a victim like any other again.
    let again = m.take_victims(64, 0, 0).unwrap().expect("a again");
    assert_eq!(again.pages, vec![a]);
}

#[test]
fn a_fault_on_a_victim_the_sealed_batch_has_released_is_served_once_the_release_returns() {
    let (mut m, base) = test_manager(64);
    let stats = Stats::new();
    fill_pages(&mut m, base, 64, &stats, |i| 0x40 + i as u8);
    let v = m.take_background_victims(8).unwrap().expect("victims");
    assert_eq!(v.pages.len(), 8);
    let (a, b, c) = (v.pages[0], v.pages[1], v.pages[2]);
    v.protect(&stats).unwrap();
    m.background_protected();
    let outcome = v.compress_protected(&stats).unwrap();
    assert!(outcome.iter().all(|&o| o == Outcome::Stored), "{outcome:?}");
    // Not sealed yet: nothing is committed early.
    assert!(!m.commit_early(a, &stats));
    // A write takes c back before the seal.
    m.write_fault(base + c * PAGE, &stats).unwrap();
    assert_eq!(m.seal_background(&v.pages, &outcome), vec![c]);
    // Sealed but a still in memory: its fault waits for the commit
    // (the evictor's release of it is still to come).
    assert!(present(base + a * PAGE));
    assert_eq!(m.serve(base + a * PAGE, &stats).unwrap(), None);
    assert_eq!(stats.deferred.load(Ordering::Relaxed), 1);
    assert_eq!(m.st(a) & (STATE | OWNED), EVICTING | OWNED);
    let mut release = outcome.clone();
    release[v.pages.binary_search(&c).unwrap()] = Outcome::Kept;
    v.release(&release).unwrap();
    // Out of memory, but until the evictor says its release has
    // returned (its TLB flushes done) the fault still waits.
    assert!(!present(base + a * PAGE));
    assert_eq!(m.serve(base + a * PAGE, &stats).unwrap(), None);
    assert_eq!(stats.deferred.load(Ordering::Relaxed), 2);
    assert_eq!(m.st(a) & (STATE | OWNED), EVICTING | OWNED);
    // Released: a fault on a is served from the store at once.
    m.background_released();
    let _ = m.serve(base + a * PAGE, &stats).unwrap();
    assert_eq!(stats.committed_early.load(Ordering::Relaxed), 1);
    assert_eq!(stats.deferred.load(Ordering::Relaxed), 2, "served, not left waiting");
    assert_eq!(m.st(a) & (STATE | OWNED), RESIDENT);
    // SAFETY: page a is resident again.
    let back = unsafe { std::slice::from_raw_parts((base + a * PAGE) as *const u8, PAGE) };
    assert!(back.iter().all(|&x| x == 0x40 + a as u8));
    // The page taken back is not the store's to give: never early.
    assert!(!m.commit_early(c, &stats));
    assert_eq!(m.st(c) & (STATE | OWNED), RESIDENT | OWNED);
    v.unprotect_kept(&outcome).unwrap();
    m.commit_background(&v, &outcome, &stats);
    v.wake_released(&outcome).unwrap();
    assert_eq!(m.evicting(), 0);
    assert_eq!(m.st(a) & (STATE | OWNED), RESIDENT, "the commit leaves the early page alone");
    assert_eq!(m.st(b) & (STATE | OWNED), STORED);
    assert_eq!(m.st(c) & (STATE | OWNED), RESIDENT);
    let resident = (0..64).filter(|&i| m.st(i) & STATE == RESIDENT).count();
    assert_eq!(resident, 64 - 8 + 2);
    assert_eq!(m.resident, resident, "the early page is counted once");
    // b, committed with its batch, comes back as before.
    let _ = m.serve(base + b * PAGE, &stats).unwrap();
    // SAFETY: page b is resident again.
    let back = unsafe { std::slice::from_raw_parts((base + b * PAGE) as *const u8, PAGE) };
    assert!(back.iter().all(|&x| x == 0x40 + b as u8));
    // A batch not sealed through the background path (an inline
    // eviction) is never committed early.
    let w = m.take_victims(4, 0, 0).unwrap().expect("victims");
    let wo = w.compress(&stats).unwrap();
    w.release(&wo).unwrap();
    m.background_released();
    assert!(!m.commit_early(w.pages[0], &stats));
    w.unprotect_kept(&wo).unwrap();
    m.commit(&w, &wo, &stats);
    w.wake_released(&wo).unwrap();
    assert_eq!(m.evicting(), 0);
}

/// Evicts every resident page of `m` (background steps, one batch at
/// a time).
fn evict_all(m: &mut Manager, stats: &Stats) {
    while let Some(v) = m.take_victims(64, 0, 0).unwrap() {
        evict_batch(m, &v, stats);
    }
}

/// Makes pages 0..`pages` resident (zero runs of 16) and fills page i
/// with the byte `fill(i)`.
fn fill_pages(m: &mut Manager, base: usize, pages: usize, stats: &Stats, fill: impl Fn(usize) -> u8) {
    for f in (0..pages).step_by(16) {
        let _ = m.install(f, 16, true, false, stats).unwrap();
    }
    for i in 0..pages {
        // SAFETY: resident, writable pages of our mapping.
        unsafe { std::ptr::write_bytes((base + i * PAGE) as *mut u8, fill(i), PAGE) };
    }
}

#[test]
fn pinned_pages_come_back_and_stay_until_unpinned() {
    let (mut m, base) = test_manager(1024);
    let stats = Stats::new();
    fill_pages(&mut m, base, 256, &stats, |i| 1 + (i % 200) as u8);
    evict_all(&mut m, &stats);
    assert_eq!(m.st(40) & STATE, STORED);
    // Stored pages 40..60 and never-touched ones 600..610.
    assert!(m.pin(40, 20, &stats).unwrap());
    assert!(m.pin(600, 10, &stats).unwrap());
    for i in (40..60).chain(600..610) {
        assert_eq!(m.st(i) & STATE, RESIDENT, "page {i}");
    }
    // SAFETY: resident pages of our mapping.
    let (b41, b605) = unsafe { (*((base + 41 * PAGE) as *const u8), *((base + 605 * PAGE) as *const u8)) };
    assert_eq!((b41, b605), (1 + 41, 0), "content back, zeros for new pages");
    assert_eq!(stats.pinned_in.load(Ordering::Relaxed), 20);
    // Eviction takes everything else, never a pinned page.
    evict_all(&mut m, &stats);
    for i in (40..60).chain(600..610) {
        assert_eq!(m.st(i) & STATE, RESIDENT, "pinned page {i} evicted");
    }
    assert_eq!(m.resident(), 30);
    // Unpinned, they are victims again.
    m.unpin(40, 20);
    m.unpin(600, 10);
    evict_all(&mut m, &stats);
    assert_eq!(m.resident(), 0);
    assert_eq!(m.st(41) & STATE, STORED);
}

/// Holds (`ztier hold`): no victim while any is in force, each ended
/// by its holder or by its lease; every stored page comes back.
#[test]
fn held_pages_stay_until_the_last_hold_ends_or_lapses() {
    let (mut m, base) = test_manager(1024);
    let stats = Stats::new();
    fill_pages(&mut m, base, 256, &stats, |i| 1 + (i % 200) as u8);
    m.budget = 128;
    evict_all(&mut m, &stats);
    let stored = (0..256).filter(|&i| m.st(i) & STATE == STORED).count();
    assert!(stored > 128, "{stored} stored");
    let now = std::time::Instant::now();
    let lease = std::time::Duration::from_secs(5);
    assert!(m.hold(7, now + lease), "the first hold is new");
    assert!(!m.hold(8, now + lease * 2), "a second one is not");
    assert!(!m.hold(7, now + lease), "nor a renewal");
    assert!(m.frozen() && !m.evict_wanted());
    m.bring_back(std::slice::from_ref(&(0..1024)), &stats).unwrap();
    assert_eq!(m.resident(), 256);
    // SAFETY: a resident page of our mapping.
    assert_eq!(unsafe { *((base + 150 * PAGE) as *const u8) }, 1 + 150);
    evict_all(&mut m, &stats);
    assert_eq!(m.resident(), 256, "held: nothing evicted");
    assert!(!m.release_holds(Some(7), now), "8 still holds");
    assert_eq!(m.holders(), vec![8]);
    assert!(!m.release_holds(None, now + lease), "8's lease runs on");
    assert!(m.release_holds(None, now + lease * 2), "8's lease lapsed");
    assert!(!m.frozen() && m.holders().is_empty());
    evict_all(&mut m, &stats);
    assert!(m.resident() <= 128, "{} resident", m.resident());
    assert!(!m.release_holds(None, now), "none was in force");
}

/// A store that is full (1 MiB, no next tier) refuses victims: they
/// stay resident, readable, writable and unprotected, nothing is
/// lost, and evictions pause until pages leave the store (or
/// [`REFUSED_PAUSE`] passes) instead of compressing in vain.
#[test]
fn a_full_store_keeps_victims_resident_and_pauses_evictions() {
    let (mut m, base) = test_manager(2048);
    let stats = Stats::new();
    // Incompressible pages: the 1 MiB store holds about 250 of them.
    fill_pages(&mut m, base, 1024, &stats, |_| 0);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut words = vec![0u64; 1024 * PAGE / 8];
    for w in words.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *w = x;
    }
    // SAFETY: pages 0..1024 are resident and writable, and `words`
    // is that many bytes.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr().cast::<u8>(), base as *mut u8, 1024 * PAGE) };
    m.budget = 64;
    assert!(!m.refusing() && m.evict_wanted());
    m.evict(&stats).unwrap();
    // The pause's clock runs out after REFUSED_PAUSE: this test is
    // about what ends it, so it lasts an hour here (a loaded machine
    // took more than 50 ms between two asserts); time ends it below.
    m.refusing =
        m.refusing.map(|(_, out)| (std::time::Instant::now() + std::time::Duration::from_secs(3600), out));
    let refused = stats.refused.load(Ordering::Relaxed);
    assert!(refused > 0, "the store refused victims");
    assert!(m.refusing(), "a refusal pauses evictions");
    assert!(m.resident() > m.budget, "refused victims stay resident");
    assert!(!m.evict_wanted(), "the background evictor is not woken meanwhile");
    assert!(m.take_background_victims(BACKGROUND_BATCH).unwrap().is_none());
    // Paused: a second round compresses nothing.
    let compressed = stats.pages_compressed.load(Ordering::Relaxed);
    m.evict(&stats).unwrap();
    assert_eq!(stats.pages_compressed.load(Ordering::Relaxed), compressed);
    assert_eq!(stats.refused.load(Ordering::Relaxed), refused);
    assert_eq!(m.evicting(), 0);
    // Resident victims are unprotected; stored ones are gone from memory.
    let stored: Vec<usize> = (0..1024).filter(|&i| m.st(i) & STATE == STORED).collect();
    assert!(!stored.is_empty());
    for i in 0..1024 {
        if m.st(i) & STATE == RESIDENT {
            assert!(!write_protected(base + i * PAGE), "page {i} the store refused is left protected");
        }
    }
    // Pages taken out of the store (a pin brings them back, making
    // room for itself over the budget) end the pause before its time:
    // not one page short of a batch, then at once (the next pin's
    // room is made by evicting, into the room the pins left).
    let (compressed, refused) =
        (stats.pages_compressed.load(Ordering::Relaxed), stats.refused.load(Ordering::Relaxed));
    for &i in &stored[..EVICT_BATCH - 1] {
        assert!(m.pin(i, 1, &stats).unwrap());
        m.unpin(i, 1);
    }
    assert!(m.refusing());
    assert_eq!(stats.pages_compressed.load(Ordering::Relaxed), compressed);
    assert_eq!(stats.refused.load(Ordering::Relaxed), refused);
    assert!(m.pin(stored[EVICT_BATCH - 1], 1, &stats).unwrap());
    m.unpin(stored[EVICT_BATCH - 1], 1);
    assert!(stats.pages_compressed.load(Ordering::Relaxed) > compressed, "evictions resumed");
    // So does time.
    m.store_refused();
    assert!(m.refusing());
    m.refusing = m.refusing.map(|(_, out)| (std::time::Instant::now(), out));
    assert!(!m.refusing());
    // Nothing was lost: every page reads as written, in memory or
    // brought back from the store.
    for i in 0..1024 {
        if m.st(i) & STATE == STORED {
            assert!(m.pin(i, 1, &stats).unwrap());
        }
        // SAFETY: page i is resident now.
        let got = unsafe { std::slice::from_raw_parts((base + i * PAGE) as *const u8, PAGE) };
        // SAFETY: the same bytes of `words`, as u8.
        let want = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>().add(i * PAGE), PAGE) };
        assert!(got == want, "page {i} changed");
    }
}

#[test]
fn kept_pins_last_until_replaced_released_or_their_thread_is_gone() {
    let (mut m, base) = test_manager(1024);
    let stats = Stats::new();
    fill_pages(&mut m, base, 256, &stats, |i| 1 + (i % 200) as u8);
    evict_all(&mut m, &stats);
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    // A thread id that is no thread of this process.
    let gone = i32::MAX - 7;
    assert!(m.keep_pinned(me, KeptKind::Rseq, 10, 4, &stats).unwrap());
    assert!(m.keep_pinned(gone, KeptKind::Rseq, 30, 2, &stats).unwrap());
    evict_all(&mut m, &stats);
    for i in (10..14).chain([30, 31]) {
        assert_eq!(m.st(i) & STATE, RESIDENT, "kept page {i}");
    }
    // A new area replaces the old one; the pins of a thread that is
    // gone end with it.
    assert!(m.keep_pinned(me, KeptKind::Rseq, 100, 2, &stats).unwrap());
    evict_all(&mut m, &stats);
    assert_eq!(m.resident(), 2, "pages 100, 101 stay");
    for i in [10, 13, 30] {
        assert_eq!(m.st(i) & STATE, STORED, "page {i} no longer kept");
    }
    // Releasing the memory ends its pin; an unregistration (no
    // pages) leaves nothing kept.
    m.release(100, 2, &stats);
    assert!(m.keep_pinned(me, KeptKind::Rseq, 0, 0, &stats).unwrap());
    evict_all(&mut m, &stats);
    assert_eq!(m.resident(), 0);
    assert!(m.pins.kept().is_empty());
    // After fork: the forking thread's kept pins only, as the child's.
    assert!(m.keep_pinned(me, KeptKind::Rseq, 40, 1, &stats).unwrap());
    assert!(m.keep_pinned(gone - 1, KeptKind::Rseq, 50, 1, &stats).unwrap());
    assert!(m.pin(60, 1, &stats).unwrap());
    m.kept_after_fork(me, 4242);
    evict_all(&mut m, &stats);
    assert_eq!(m.resident(), 1);
    assert_eq!(m.st(40) & STATE, RESIDENT);
    assert_eq!(m.pins.kept().len(), 1);
    assert_eq!(m.pins.kept()[0].tid, 4242);
}

#[test]
fn faults_that_continue_no_walk_are_counted_lone() {
    let (mut m, base) = test_manager(1024);
    let stats = Stats::new();
    fill_pages(&mut m, base, 512, &stats, |i| 1 + (i % 200) as u8);
    evict_all(&mut m, &stats);
    let serve = |m: &mut Manager, i: usize| {
        let _ = m.serve(base + i * PAGE, &stats).unwrap();
    };
    // A first fault: no walk, one page.
    serve(&mut m, 300);
    assert_eq!(m.st(301) & STATE, STORED, "a lone fault prefetches nothing");
    // The next page: a walk, with its prefetch.
    serve(&mut m, 301);
    assert_eq!(m.st(302) & STATE, RESIDENT, "a walk prefetches");
    // Far away: lone again; then 10 pages after it: an interleaved
    // walk (within 16 pages after a recent fault).
    serve(&mut m, 100);
    serve(&mut m, 110);
    assert_eq!(m.st(111) & STATE, RESIDENT, "a walk within 16 pages prefetches");
    serve(&mut m, 450);
    assert_eq!(stats.store_faults.load(Ordering::Relaxed), 5);
    assert_eq!(stats.lone_faults.load(Ordering::Relaxed), 3);
}

/// A clean page whose copy the store has since pushed on to its next
/// tier (a spill file here, the remote in `--remote` runs: a get that
/// keeps the copy leaves it there) is still told unwritten by its hash
/// and only released; a written one is compressed again. Before, such a
/// page was compressed and put again as if written: half the
/// compressions of a remote run that reads its pages back.
#[test]
fn verify_mode_trusts_a_copy_the_store_pushed_on_to_its_next_tier() {
    let dir = std::env::temp_dir().join(format!("ztier-run-core-clean-tier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pages = 1024;
    let (mut m, base) = test_manager_with(pages, 64 << 10, Some(dir.clone()), 1 << 30);
    m.clean = CleanMode::Verify;
    let stats = Stats::new();
    // 512 pages of 1 KiB of noise each (about 1 KiB compressed): eight
    // times what the 64 KiB store holds. (Half the budget: they come
    // back at a long refault distance, bound for probation.)
    let byte =
        |i: usize, j: usize| if j < 1024 { ((i * 7919 + j * 104_729) >> 3) as u8 ^ (j as u8) } else { 0 };
    for f in (0..512).step_by(16) {
        let _ = m.install(f, 16, true, false, &stats).unwrap();
    }
    for i in 0..512 {
        for j in 0..PAGE {
            // SAFETY: resident, writable pages of our mapping.
            unsafe { *((base + i * PAGE + j) as *mut u8) = byte(i, j) };
        }
    }
    evict_all(&mut m, &stats);
    assert_eq!(stats.pages_compressed.load(Ordering::Relaxed), 512);
    assert!(m.store.tier_entries() > 256, "{} in the tier", m.store.tier_entries());
    // Pages 0..32 went out first: their copies are in the tier. Bound for
    // probation, they come back keeping them.
    seg(&mut m).set_protected_max(0);
    for i in 0..32 {
        if m.st(i) & STATE == STORED {
            let _ = m.serve(base + i * PAGE, &stats).unwrap();
        }
    }
    let back: Vec<usize> = (0..pages).filter(|&i| m.st(i) & STATE == RESIDENT).collect();
    for &i in &back {
        assert_eq!(m.st(i) & CLEAN, CLEAN, "page {i}");
        assert!(!m.store.contains(m.key(i)) && m.store.holds(m.key(i)), "page {i}: its copy is the tier's");
    }
    // Page 3 changes.
    // SAFETY: a resident, writable page of our mapping.
    unsafe { *((base + 3 * PAGE + 2000) as *mut u8) = 0xee };
    let compressed = stats.pages_compressed.load(Ordering::Relaxed);
    evict_all(&mut m, &stats);
    assert_eq!(stats.pages_compressed.load(Ordering::Relaxed) - compressed, 1, "only page 3");
    assert_eq!(stats.clean_evicted.load(Ordering::Relaxed), back.len() as u64 - 1);
    assert_eq!(stats.dirtied.load(Ordering::Relaxed), 1);
    for &i in &back {
        if m.st(i) & STATE == STORED {
            let _ = m.serve(base + i * PAGE, &stats).unwrap();
        }
        for j in 0..PAGE {
            let want = if i == 3 && j == 2000 { 0xee } else { byte(i, j) };
            // SAFETY: page i is resident again.
            assert_eq!(unsafe { *((base + i * PAGE + j) as *const u8) }, want, "page {i} byte {j}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn verify_mode_drops_unchanged_pages_and_compresses_written_ones() {
    let (mut m, base) = test_manager(1024);
    m.clean = CleanMode::Verify;
    let stats = Stats::new();
    let fill = |i: usize| 1 + (i % 200) as u8;
    fill_pages(&mut m, base, 512, &stats, fill);
    evict_all(&mut m, &stats);
    assert_eq!(stats.pages_compressed.load(Ordering::Relaxed), 512);
    // Pages 0..64 went out first: they come back at a long refault
    // distance (not hot). While the protected segment has room, a page
    // comes back without its copy. (A first fault at page 40 is no
    // walk: it brings one page.)
    let _ = m.serve(base + 40 * PAGE, &stats).unwrap();
    assert_eq!((m.st(40) & (STATE | CLEAN), m.repl.protected(40)), (RESIDENT, true));
    assert_eq!(m.st(41) & STATE, STORED);
    assert!(!m.store.contains(m.key(40)), "a protected page does not keep its copy");
    // Bound for probation, pages keep their copies and come back
    // writable (no write-protect fault on their first write).
    seg(&mut m).set_protected_max(0);
    for i in 0..64 {
        if m.st(i) & STATE == STORED {
            let _ = m.serve(base + i * PAGE, &stats).unwrap();
        }
    }
    for i in (0..64).filter(|&i| i != 40) {
        assert_eq!((m.st(i) & (STATE | CLEAN), m.repl.protected(i)), (RESIDENT | CLEAN, false), "page {i}");
        assert!(m.store.contains(m.key(i)), "page {i} keeps its copy");
        assert!(!write_protected(base + i * PAGE), "page {i} is writable");
    }
    // Page 5 changes; page 9 is written with what it held already.
    // SAFETY: resident, writable pages of our mapping.
    unsafe {
        *((base + 5 * PAGE + 100) as *mut u8) = 0xee;
        std::ptr::write_bytes((base + 9 * PAGE) as *mut u8, fill(9), PAGE);
    }
    let compressed = stats.pages_compressed.load(Ordering::Relaxed);
    // Pages 0..64 and the prefetched neighbours of the last walk.
    let back = m.resident();
    assert!(back >= 64);
    evict_all(&mut m, &stats);
    // Page 40 had no copy, page 5 changed: two compressions. The
    // others (page 9 among them) matched their copies' hashes.
    assert_eq!(stats.pages_compressed.load(Ordering::Relaxed) - compressed, 2);
    assert_eq!(stats.clean_evicted.load(Ordering::Relaxed), back as u64 - 2);
    assert_eq!(stats.dirtied.load(Ordering::Relaxed), 1);
    assert_eq!(m.resident(), 0);
    for i in 0..64 {
        assert_eq!(m.st(i) & STATE, STORED, "page {i}");
    }
    for i in 0..64 {
        if m.st(i) & STATE == STORED {
            let _ = m.serve(base + i * PAGE, &stats).unwrap();
        }
    }
    for i in 0..64 {
        // SAFETY: page i is resident again.
        let back = unsafe { std::slice::from_raw_parts((base + i * PAGE) as *const u8, PAGE) };
        for (at, &x) in back.iter().enumerate() {
            let want = if i == 5 && at == 100 { 0xee } else { fill(i) };
            assert_eq!(x, want, "page {i} byte {at}");
        }
    }
    // A clean page the program releases loses its copy. (Page 20 just
    // came back hot, into the protected segment: once more, from far.)
    evict_all(&mut m, &stats);
    seg(&mut m).clock_mut().advance(10_000);
    let _ = m.serve(base + 20 * PAGE, &stats).unwrap();
    assert_eq!(m.st(20) & (STATE | CLEAN), RESIDENT | CLEAN);
    let key = m.key(20);
    assert!(m.store.contains(key));
    m.release(20, 1, &stats);
    assert!(!m.store.contains(key));
}

/// Faults pages `[first, end)` in (as a program writing them does)
/// and writes `v` to each, with the budget kept by inline eviction.
fn sweep(m: &mut Manager, base: usize, first: usize, end: usize, v: u8, stats: &Stats) {
    for i in first..end {
        if m.st(i) & STATE != RESIDENT {
            let _ = m.serve(base + i * PAGE, stats).unwrap();
        }
        // SAFETY: page i is resident (just installed if it was not),
        // a writable page of our mapping.
        unsafe { std::ptr::write_bytes((base + i * PAGE) as *mut u8, v, PAGE) };
    }
}

/// A program that loops over three times its budget ages its
/// protected segment slowly (each page aged out comes back). A page
/// touched once between two passes, at a moment the aging had just
/// freed a place in that segment, took the place, then stood behind
/// the whole segment at the slowest aging: resident through 16 more
/// passes, as spawn.c's command built between its writes sometimes
/// was. On trial there now, it leaves within a segment's worth of
/// evictions.
#[test]
fn a_page_touched_once_while_a_loop_ages_the_protected_segment_goes_cold() {
    let (mut m, base) = test_manager(4096);
    let stats = Stats::new();
    m.budget = 512;
    m.repl.set_budget(m.budget);
    let (lo, hi) = (0, 3 * 512);
    // Passes until the aging has slowed down to its slowest (each
    // page it ages out comes back on the next pass).
    let mut pass = 0;
    while seg(&mut m).aging().every() < ztier_policy::segmented::AGE_SLOWEST {
        assert!(pass < 64, "aging at {} after {pass} passes", seg(&mut m).aging().every());
        sweep(&mut m, base, lo, hi, 1 + pass, &stats);
        pass += 1;
    }
    // Evict one page at a time until the aging frees a place.
    let demoted = m.repl.gauges().demoted;
    while m.repl.gauges().demoted == demoted {
        let v = m.take_victims(1, 0, 0).unwrap().expect("a victim");
        evict_batch(&mut m, &v, &stats);
    }
    // The command: a page never touched before, faulted in now.
    let cmd = 3000;
    sweep(&mut m, base, cmd, cmd + 1, 9, &stats);
    // One pass over the loop's pages takes it out.
    sweep(&mut m, base, lo, hi, 10, &stats);
    assert_ne!(m.st(cmd) & STATE, RESIDENT, "the page touched once is still resident");
    // The loop keeps its protected part, at the slowest aging.
    let protected = (lo..hi).filter(|&i| m.st(i) & STATE == RESIDENT && m.repl.protected(i)).count();
    assert!(protected >= 512 - ztier_policy::segmented::probation(512) - 2, "{protected} protected");
    assert_eq!(seg(&mut m).aging().every(), ztier_policy::segmented::AGE_SLOWEST);
}

/// Pages of the first fill that nothing touches again leave memory
/// while the program writes new memory, whether or not the places
/// they free are taken (remap_fixed.c: an 8 MiB mapping filled
/// first, then 48 MiB of churn at 16M; with new pages kept out of
/// the protected segment after the first eviction, it stayed).
#[test]
fn pages_of_the_first_fill_leave_while_the_program_writes_new_memory() {
    let (mut m, base) = test_manager(4096);
    let stats = Stats::new();
    m.budget = 512;
    m.repl.set_budget(m.budget);
    sweep(&mut m, base, 0, 512, 7, &stats);
    assert!((0..384).all(|i| m.repl.protected(i)), "the first fill is protected");
    // Churn: three budgets of new pages, written once.
    sweep(&mut m, base, 512, 512 + 3 * 512, 1, &stats);
    let left: Vec<usize> = (0..512).filter(|&i| m.st(i) & STATE == RESIDENT).collect();
    assert!(left.is_empty(), "{} pages of the first fill resident: {left:?}", left.len());
}
