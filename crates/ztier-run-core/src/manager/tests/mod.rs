//! The manager's tests over a real arena (registered with userfaultfd; no
//! handler thread): these, the tree budget and fork bookkeeping; `pages`,
//! faults, eviction, pins and holds.

use super::*;
use ztier_policy::segmented::probation;

/// The arena's anonymous runs, around node's own text mapped into it
/// (a line of a real node process's maps) and a shared mapping;
/// clipped to the arena, adjacent mappings merged.
#[test]
fn anonymous_runs_skip_mappings_of_files_and_shared_memory() {
    let maps = "\
7f9787000000-7f9787ebf000 rw-p 00000000 00:00 0 \n\
7f9787ebf000-7f9790000000 rw-p 00000000 00:00 0 \n\
7f9790000000-7f9790100000 ---p 00000000 00:00 0 \n\
7f9790100000-7f9790200000 rw-p 00000000 00:00 0                          [anon:v8]\n\
7f9790200000-7f9790392000 r-xp 014c4000 fe:00 247584                     /usr/bin/node\n\
7f9790392000-7f9790400000 rw-p 00000000 00:00 0 \n\
7f9790400000-7f9790500000 rw-s 00000000 00:01 1234                       /dev/zero (deleted)\n\
7f9790500000-7fa787f00000 rw-p 00000000 00:00 0 \n\
7fa787f00000-7fa787f01000 r--p 00000000 fe:00 99                         /usr/lib/x.so\n";
    let runs = anonymous_runs(maps, 0x7f9787ebf000, 0x7fa787f00000);
    assert_eq!(
        runs,
        vec![
            (0x7f9787ebf000, 0x7f9790200000),
            (0x7f9790392000, 0x7f9790400000),
            (0x7f9790500000, 0x7fa787f00000),
        ]
    );
}

/// Bit 57 of a /proc/self/pagemap entry: the page is uffd-wp protected.
fn write_protected(addr: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, (addr / PAGE * 8) as u64).unwrap();
    u64::from_le_bytes(e) & (1 << 57) != 0
}

/// A manager over a fresh arena of `pages` pages (registered with
/// userfaultfd; no handler runs, so the test must not touch pages
/// that are not resident).
/// Spill files have no name, or none for long, and never one
/// another process has: two opened in one directory are two files
/// (the same PID opened one name twice, as PID-1 processes in PID
/// namespaces of their own did, and both wrote one file), and the
/// directory is left empty. A directory that is not one is named.
#[test]
fn spill_files_are_new_unnamed_files() {
    use std::io::{Read, Seek, Write};
    let dir = std::env::temp_dir().join(format!("ztier-spill-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    for open in [open_spill, open_spill_named] {
        // A name in the way, as another process's would be.
        let squatter = dir.join(format!("spill.{}.0", std::process::id()));
        std::fs::write(&squatter, b"someone else's").unwrap();
        let (mut a, mut b) = (open(&dir).unwrap(), open(&dir).unwrap());
        a.write_all(b"first").unwrap();
        b.write_all(b"second").unwrap();
        for (f, want) in [(&mut a, &b"first"[..]), (&mut b, &b"second"[..])] {
            let mut got = Vec::new();
            f.rewind().unwrap();
            f.read_to_end(&mut got).unwrap();
            assert_eq!(got, want);
        }
        assert_eq!(std::fs::read(&squatter).unwrap(), b"someone else's");
        std::fs::remove_file(&squatter).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
    let e = open_spill(&dir.join("missing")).unwrap_err().to_string();
    assert!(e.contains("spill directory") && e.contains("missing"), "{e}");
    std::fs::remove_dir(&dir).unwrap();
}

type Seg = ztier_policy::segmented::Segmented<Table<u8>, Table<u32>>;

/// The manager's replacement policy: the shipped one.
fn seg(m: &mut Manager) -> &mut Seg {
    m.repl.as_any_mut().downcast_mut::<Seg>().expect("the shipped replacement")
}

fn test_manager(pages: usize) -> (Manager, usize) {
    test_manager_with(pages, 1 << 20, None, 0)
}

/// A manager of `pages` fresh pages, a store of `store_bytes` and a
/// spill file of up to `spill_bytes` in `spill_dir` (if any).
fn test_manager_with(
    pages: usize,
    store_bytes: usize,
    spill_dir: Option<PathBuf>,
    spill_bytes: u64,
) -> (Manager, usize) {
    let base = sys::mmap(
        std::ptr::null_mut(),
        pages * PAGE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    ) as usize;
    let cfg = Config {
        budget_pages: pages,
        codec: CodecId::Lz4,
        allocator: AllocatorKind::Classes,
        store_bytes,
        spill_dir,
        spill_bytes,
        stats_dir: None,
        policy: None,
    };
    (Manager::new(base, pages, cfg).unwrap(), base)
}

/// A [`test_manager`] of `pages` that is the first member of a new
/// shared segment of `pages` and `store_limit` bytes (kept alive by
/// the returned [`ztier_uffd::tree::Shared`]).
fn test_manager_in_tree(
    pages: usize,
    store_limit: u64,
) -> (Manager, ztier_uffd::tree::Shared, &'static ztier_uffd::tree::Segment) {
    let (mut m, _) = test_manager(pages);
    let shared = ztier_uffd::tree::Shared::create(pages as u64, store_limit).unwrap();
    let seg = ztier_uffd::tree::open(&shared.path()).unwrap();
    m.tree = Some(Member::join(seg).unwrap());
    (m, shared, seg)
}

/// [`test_manager_in_tree`] under `--budget-covers all`.
fn test_manager_in_tree_all(
    pages: usize,
    store_limit: u64,
) -> (Manager, ztier_uffd::tree::Shared, &'static ztier_uffd::tree::Segment) {
    let (mut m, _) = test_manager(pages);
    let shared = ztier_uffd::tree::Shared::create(pages as u64, store_limit).unwrap().covering_all();
    let seg = ztier_uffd::tree::open(&shared.path()).unwrap();
    m.tree = Some(Member::join(seg).unwrap());
    (m, shared, seg)
}

/// Compresses, releases and commits the batch `v` of `m` (one eviction,
/// as the background evictor makes it, with nothing written meanwhile).
fn evict_batch(m: &mut Manager, v: &Victims, stats: &Stats) {
    let outcome = v.compress(stats).unwrap();
    v.release(&outcome).unwrap();
    v.unprotect_kept(&outcome).unwrap();
    m.commit(v, &outcome, stats);
    v.wake_released(&outcome).unwrap();
}

/// A forked child in a tree of 1024 pages: pages 0..64 resident, page i
/// filled with 1 + i, those of `inherited` counted as shared with its
/// parent (page maps that cannot be read: a look finds each its own).
fn child_with_inherited(
    inherited: std::ops::Range<usize>,
) -> (Manager, ztier_uffd::tree::Shared, &'static ztier_uffd::tree::Segment, Stats) {
    let (mut m, shared, seg) = test_manager_in_tree(1024, 0);
    let stats = Stats::new();
    for f in (0..64).step_by(16) {
        let _ = m.install(f, 16, true, false, &stats).unwrap();
    }
    for i in 0..64 {
        // SAFETY: resident, writable pages of our mapping.
        unsafe { std::ptr::write_bytes((m.base + i * PAGE) as *mut u8, 1 + i as u8, PAGE) };
    }
    let mut pages = Shared::new(64);
    inherited.for_each(|i| pages.insert(i));
    m.inherited = Some(Inherited { pages, pagemap: Arc::new(Pagemap(-1)), parent: Arc::new(Pagemap(-1)) });
    (m, shared, seg, stats)
}

/// Faults pages `0..n` in (fault by fault) and writes each.
fn fault_in(m: &mut Manager, n: usize, stats: &Stats) {
    for k in 0..n {
        if m.st(k) & STATE != RESIDENT {
            let _ = m.serve(m.base + k * PAGE, stats).unwrap();
        }
        // SAFETY: page k is resident now.
        unsafe { std::ptr::write_bytes((m.base + k * PAGE) as *mut u8, k as u8 | 1, 64) };
    }
}

/// Under `--budget-covers all`, once the stores have grown into the
/// pool, the pages an eviction takes out of memory go back to the
/// pool at its commit instead of staying the process's slack (which
/// its next faults would install into while the stores grow on).
#[test]
fn evicted_pages_go_back_to_an_overdrawn_pool() {
    let (mut m, _shared, seg) = test_manager_in_tree_all(256, 1 << 20);
    let stats = Stats::new();
    fault_in(&mut m, 64, &stats);
    assert_eq!(m.resident(), 64);
    let held = m.tree.as_ref().unwrap().held();
    assert!(held >= 64);
    // Another process's store grows: the pool is 256 - 224 = 32
    // pages (with this one's tables), fewer than this one holds.
    let other = seg.slots.len() - 1;
    seg.fake_member(other, 1, 0, 0);
    seg.fake_stored(other, (224 << 12) - seg.tables.load(Ordering::Acquire));
    assert_eq!(m.tree.as_ref().unwrap().overdrawn(), held - 32);
    assert!(m.evict_batch(32, &stats).unwrap());
    let t = m.tree.as_ref().unwrap();
    assert_eq!(m.resident(), 32);
    // All it evicted went back (the overdraft was more).
    assert_eq!((t.held(), m.tree_need()), (32, 32));
    assert_eq!(t.overdrawn(), 0, "it held {held}, now {}", t.held());
    m.leave_tree();
}

/// Under `--budget-covers all` the library's tables are held for before
/// the pages that grow them are installed, and said ahead of their
/// use: everything held stays within the budget from the first fill
/// on. Before, they were said only at an eviction's commit, with
/// nothing given back for them: a first fill of 16 runs of 256 pages
/// (the budget's 256 pages, 84 KiB of tables unsaid) went past it by
/// the tables' bytes at the first commit (a 16M program: 121 KiB).
#[test]
fn the_tables_are_held_for_before_they_grow() {
    let (mut m, _) = test_manager(64 * 256);
    let shared = ztier_uffd::tree::Shared::create(256, 192 << 12).unwrap().covering_all();
    let seg = ztier_uffd::tree::open(&shared.path()).unwrap();
    m.tree = Some(Member::join(seg).unwrap());
    let stats = Stats::new();
    // 16 pages in each of 40 runs of 256: past the budget after 16.
    for c in 0..40 {
        for k in (c * 256)..(c * 256 + 16) {
            if m.st(k) & STATE != RESIDENT {
                let _ = m.serve(m.base + k * PAGE, &stats).unwrap();
            }
            // SAFETY: page k is resident now.
            unsafe { std::ptr::write_bytes((m.base + k * PAGE) as *mut u8, k as u8 | 1, 64) };
            let total = seg.total_peak.load(Ordering::Acquire);
            assert!(total <= 256 << 12, "page {k}: {total} held at most, {} over", total - (256 << 12));
            let t = m.tree.as_ref().unwrap();
            let said = (t.tables_kib() as usize) << 10;
            assert!(said >= tables_bytes(m.table_chunks_used), "page {k}: said {said}");
        }
    }
    assert!(stats.evicted_inline.load(Ordering::Relaxed) > 0, "it evicted");
    assert_eq!(seg.over.load(Ordering::Acquire), 0);
    m.leave_tree();
}

/// Under `--budget-covers all`, a fault that finds no room while all
/// the pages its process could evict are in the batch in flight is
/// not served past the budget: it is left to wait for that batch's
/// commit (the caller retries it then), for [`TREE_WAIT_MOST`] at
/// most; then it is served as before (waiting for the others, then
/// past the budget).
#[test]
fn a_fault_with_its_own_pages_in_flight_waits_for_their_commit() {
    let (mut m, _shared, seg) = test_manager_in_tree_all(256, 1 << 20);
    let stats = Stats::new();
    // Another process holds all but 32 pages (and this one's tables,
    // said ahead as its first fault would); this one takes those.
    m.tree.as_mut().unwrap().publish_tables(tables_bytes(TABLES_AHEAD + 2));
    let tables = m.tree.as_ref().unwrap().charged() as u64;
    let other = seg.slots.len() - 1;
    seg.fake_member(other, 1, 0, 224 - tables);
    fault_in(&mut m, 32, &stats);
    assert_eq!((m.resident(), m.tree.as_ref().unwrap().held()), (32, 32));
    assert_eq!(seg.over.load(Ordering::Acquire), 0);
    // Its batch in flight takes all of them.
    let v = m.take_victims(64, 0, 0).unwrap().unwrap();
    assert_eq!(v.pages.len(), 32);
    let _ = m.serve(m.base + 100 * PAGE, &stats).unwrap();
    assert!(m.take_room_wait(), "left to wait for the commit");
    assert!(!m.take_room_wait(), "said once");
    assert_eq!(m.st(100) & STATE, ABSENT, "not served");
    assert_eq!(seg.over.load(Ordering::Acquire), 0);
    // A batch that does not commit for TREE_WAIT_MOST: served.
    m.room_since = Some(std::time::Instant::now() - TREE_WAIT_MOST);
    let _ = m.serve(m.base + 100 * PAGE, &stats).unwrap();
    assert!(!m.take_room_wait());
    assert_eq!(m.st(100) & STATE, RESIDENT);
    assert_eq!(seg.over.load(Ordering::Acquire), 1);
    m.leave_tree();
}

/// With the tree scope, a process alone in the pool keeps its reserve
/// below the budget, not its chunk further: the pages it holds beyond
/// its resident ones are room, not a shortfall its evictor must give
/// back (counted short, a prompt evictor took `sort` at 1M down to
/// ~140 of 256 pages).
#[test]
fn a_process_alone_in_the_pool_does_not_evict_for_its_own_slack() {
    // 4000 pages: a reserve of 250, more than its chunk of slack.
    let (mut m, _shared, seg) = test_manager_in_tree(4000, 0);
    let stats = Stats::new();
    // Faults in until fewer than a reserve are free but a reserve
    // with its slack, below the evictor's wake-up.
    let (mut n, wake) = (3584, 4000 - m.reserve() / 2);
    loop {
        fault_in(&mut m, n, &stats);
        let t = m.tree.as_ref().unwrap();
        let (slack, free) = (t.held() - m.tree_need(), t.free());
        assert!(m.resident() < wake, "no such point below {wake}: {n} pages");
        if free < m.reserve() && free + slack >= m.reserve() {
            break;
        }
        n += 16;
    }
    assert_eq!(m.tree_excess(), 0, "its slack counted short");
    assert!(!m.evict_wanted());
    assert!(m.take_background_victims(BACKGROUND_BATCH).unwrap().is_none());
    // Another process holds a page: the pool is short for it.
    seg.fake_member(seg.slots.len() - 1, 1, 0, 1);
    assert!(m.tree_excess() > 0);
    m.leave_tree();
}

/// With the tree scope, the budget the protected segment follows
/// drops at once to what the process can have, and grows back by a
/// 64th (a batch at least) per [`TREE_GROW_EVERY`].
#[test]
fn a_tree_share_shrinks_at_once_and_grows_back_a_little_at_a_time() {
    let (mut m, _shared, seg) = test_manager_in_tree(4096, 0);
    // Another process holds three quarters of it.
    seg.reserved.fetch_add(3072, Ordering::AcqRel);
    m.follow_tree();
    assert_eq!((m.budget, m.repl.gauges().protected_max), (1024, 1024 - probation(1024)));
    // It gives them back: nothing before TREE_GROW_EVERY has passed.
    seg.reserved.fetch_sub(3072, Ordering::AcqRel);
    m.tree_grown = std::time::Instant::now();
    m.follow_tree();
    assert_eq!(m.budget, 1024);
    let mut steps = 0;
    while m.budget < 4096 {
        let before = m.budget;
        m.tree_grown -= TREE_GROW_EVERY;
        m.follow_tree();
        let step = (before / 64).max(EVICT_BATCH);
        assert!(m.budget > before && m.budget - before < step + EVICT_BATCH, "{before} to {}", m.budget);
        assert_eq!(m.repl.gauges().protected_max, m.budget - probation(m.budget));
        steps += 1;
    }
    assert_eq!(m.budget, 4096);
    assert!((60..=100).contains(&steps), "{steps} steps from 1024 to 4096 pages");
    // Taken again: down at once.
    seg.reserved.fetch_add(2048, Ordering::AcqRel);
    m.follow_tree();
    assert_eq!(m.budget, 2048);
    m.leave_tree();
}

/// With the tree scope, a process that died holding pages (killed,
/// no exit hook) gives them back when the pool runs short and the
/// background evictor is called on, though no install ran short: the
/// others' evictors can keep the pool from running dry, and the pages
/// stayed held to the end (`workers.py ... kill` at 24M reclaimed
/// nothing now and then).
#[test]
fn the_background_evictor_takes_back_the_pages_of_a_dead_process() {
    let (mut m, _shared, seg) = test_manager_in_tree(4096, 0);
    // A process that is gone holds all but a few pages of the pool.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    seg.fake_member(seg.slots.len() - 1, dead.id() as i32, 0, 4000);
    assert!(m.tree.as_ref().unwrap().free() < m.reserve());
    assert!(m.take_background_victims(EVICT_BATCH).unwrap().is_none(), "nothing resident");
    assert_eq!(seg.reclaimed.load(Ordering::Acquire), 4000);
    assert_eq!(seg.reserved.load(Ordering::Acquire), 0);
    assert_eq!(m.budget, 4096, "reclaimed before the share was followed down");
    m.leave_tree();
}

/// With the tree scope, a process that has nothing of its own to
/// evict while another holds the whole pool wakes the other's evictor
/// and waits for it ([`TREE_WAIT`]) before it takes a page past the
/// budget, and then takes only the page of the fault, not the run
/// of 16 a zero fault installs when it can (before: 16 at once, and
/// no wait; 16 children of `sharedkids` went over by up to 68 pages).
/// With a page of its own, the next fault evicts it instead. After a
/// wait in which the others gave nothing back, it does not wait
/// again for a while.
#[test]
fn a_process_with_nothing_to_evict_waits_for_the_others_and_goes_over_by_one_page_at_most() {
    let (mut m, _shared, seg) = test_manager_in_tree(256, 0);
    let stats = Stats::new();
    let base = m.base;
    // Another process (a live one, as far as a look can tell) holds
    // every page.
    let other = seg.slots.len() - 1;
    seg.fake_member(other, 1, 0, 256);
    let woken = || seg.slots[other].wake.load(Ordering::Acquire);
    let before = woken();
    let t = std::time::Instant::now();
    let _ = m.serve(base + 10 * PAGE, &stats).unwrap();
    assert!(t.elapsed() >= TREE_WAIT, "it waited for the others: {:?}", t.elapsed());
    assert_ne!(woken(), before, "and woke them");
    assert_eq!(m.st(10) & STATE, RESIDENT);
    assert_eq!(m.st(11) & STATE, ABSENT, "the fault's page alone");
    assert_eq!(seg.over.load(Ordering::Acquire), 1);
    // SAFETY: page 10 is resident now.
    unsafe { std::ptr::write_bytes((base + 10 * PAGE) as *mut u8, 7, PAGE) };
    let _ = m.serve(base + 20 * PAGE, &stats).unwrap();
    assert_eq!(m.st(10) & STATE, STORED, "its own page went");
    assert_eq!(m.resident(), 1);
    assert_eq!(seg.over.load(Ordering::Acquire), 1);
    // Nothing it can evict again; the others gave nothing last time.
    m.set_noevict(20, 1, true);
    let before = woken();
    let _ = m.serve(base + 30 * PAGE, &stats).unwrap();
    assert_eq!(woken(), before, "no wait so soon after one that got nothing");
    assert_eq!(seg.over.load(Ordering::Acquire), 2);
    m.leave_tree();
}

/// With the tree scope, the pages the others give back while a
/// process with nothing to evict waits for them go to it: nothing is
/// taken past the budget.
#[test]
fn a_process_with_nothing_to_evict_gets_the_pages_the_others_give_back() {
    let (mut m, _shared, seg) = test_manager_in_tree(256, 0);
    let stats = Stats::new();
    let other = seg.slots.len() - 1;
    seg.fake_member(other, 1, 0, 256);
    // However late the thread below runs: the wait ends when the pool
    // can give the page.
    m.tree_wait = std::time::Duration::from_secs(10);
    // The other process's evictor: once woken, it gives back 64 pages.
    let giver = give_back_when_woken(seg, other, std::time::Duration::ZERO);
    let _ = m.serve(m.base + 10 * PAGE, &stats).unwrap();
    giver.join().unwrap();
    assert_eq!(m.st(10) & STATE, RESIDENT);
    assert_eq!(seg.over.load(Ordering::Acquire), 0);
    assert!(seg.reserved.load(Ordering::Acquire) <= 256);
    m.leave_tree();
}

/// The evictor of the fake member in `slot`: once woken, after
/// `delay`, it gives back 64 pages.
fn give_back_when_woken(
    seg: &'static ztier_uffd::tree::Segment,
    slot: usize,
    delay: std::time::Duration,
) -> std::thread::JoinHandle<()> {
    let seen = seg.slots[slot].wake.load(Ordering::Acquire);
    std::thread::spawn(move || {
        let t = std::time::Instant::now();
        while seg.slots[slot].wake.load(Ordering::Acquire) == seen && t.elapsed().as_secs() < 10 {
            std::thread::yield_now();
        }
        std::thread::sleep(delay);
        seg.slots[slot].held.fetch_sub(64, Ordering::AcqRel);
        seg.reserved.fetch_sub(64, Ordering::AcqRel);
    })
}

/// Under `--budget-covers all`, a process with nothing to evict waits
/// for the others past [`TREE_WAIT`] without a page given back (their
/// evictors, on a loaded machine, wait for a CPU): the page they give
/// back 30 ms later is its, none is taken past the budget. (Before,
/// the wait ended after 5 ms and the page went past the budget.)
#[test]
fn under_covers_all_a_process_with_nothing_to_evict_waits_for_slow_givers() {
    let (mut m, _shared, seg) = test_manager_in_tree_all(256, 0);
    let stats = Stats::new();
    let other = seg.slots.len() - 1;
    seg.fake_member(other, 1, 0, 256);
    let giver = give_back_when_woken(seg, other, TREE_WAIT * 6);
    let _ = m.serve(m.base + 10 * PAGE, &stats).unwrap();
    giver.join().unwrap();
    assert_eq!(m.st(10) & STATE, RESIDENT);
    assert_eq!(seg.over.load(Ordering::Acquire), 0);
    m.leave_tree();
}

/// A forked child does not take over inherited pages that are in an
/// eviction in flight: they leave memory at the commit (and so stop
/// counting as inherited). Before, a child whose resident pages were
/// all in flight took them over, had nothing to evict for them, and
/// took them past the budget (48 at once under `sharedkids`).
#[test]
fn pages_in_an_eviction_in_flight_are_not_taken_over_from_the_parent() {
    // All 64 inherited from a parent (the page maps are not read here).
    let (mut m, _shared, seg, stats) = child_with_inherited(0..64);
    let v = m.take_victims(16, 0, 0).unwrap().expect("victims");
    assert_eq!(v.pages.len(), 16);
    // A look finds all 64 no longer shared.
    let all: Vec<usize> = (0..64).collect();
    m.adopt_unshared(&all, &stats).unwrap();
    assert_eq!(seg.adopted.load(Ordering::Acquire), 48, "the 16 in flight stay the parent's");
    assert_eq!(m.inherited.as_ref().map(|h| h.pages.count()), Some(16));
    evict_batch(&mut m, &v, &stats);
    assert_eq!(m.inherited.as_ref().map_or(0, |h| h.pages.count()), 0, "gone with the commit");
    assert_eq!(seg.over.load(Ordering::Acquire), 0);
    m.leave_tree();
}

/// Victims a forked child still counts as shared with its parent, that
/// its page map shows as its own before they are released, count as
/// adopted when they leave; those it shares stay uncounted. Before, all
/// left uncounted: a child whose evictor took the pages it wrote before
/// a look found them its own was said to have taken over 13 MiB of 20.
#[test]
fn victims_already_a_childs_own_count_as_adopted_when_they_leave() {
    // Pages 8.. inherited (every page looked at is the child's own).
    let (mut m, _shared, seg, stats) = child_with_inherited(8..64);
    let v = m.take_victims(16, 0, 0).unwrap().expect("victims");
    let shared = v.pages.iter().filter(|&&i| i >= 8).count();
    assert!(shared > 0 && shared < v.pages.len(), "{:?}", v.pages);
    let look = m.victims_look(&v.pages).expect("inherited victims");
    let own = look.read();
    assert_eq!(own.len(), shared, "only the inherited victims are looked at: {own:?}");
    m.victims_own(own);
    evict_batch(&mut m, &v, &stats);
    assert_eq!(seg.adopted.load(Ordering::Acquire), shared as u64);
    assert_eq!(m.inherited.as_ref().map(|h| h.pages.count()), Some(56 - shared));
    assert!(m.left_own.is_empty(), "the commit forgets its victims");
    // Without the look, inherited victims leave uncounted.
    let v = m.take_victims(16, 0, 0).unwrap().expect("victims");
    evict_batch(&mut m, &v, &stats);
    assert_eq!(seg.adopted.load(Ordering::Acquire), shared as u64);
    assert_eq!(m.inherited.as_ref().map(|h| h.pages.count()), Some(56 - shared - 16));
    m.leave_tree();
}

/// A store's share of the command's `--store` is followed when it
/// moved by a 32nd of the limit, and at once when it shrank to near
/// what the store uses (the others grow into what it gave up: the
/// stores went past the limit now and then when that waited too).
#[test]
fn a_store_share_that_shrinks_near_what_the_store_uses_is_followed_at_once() {
    const K: usize = 1 << 10;
    let (mut m, _shared, seg) = test_manager_in_tree(64, 8 << 20);
    // Another process (a live one, as far as a look can tell).
    let other = seg.slots.len() - 1;
    seg.fake_member(other, 1, 0, 0);
    let say = |b: usize| seg.fake_stored(other, b as u64);
    // Far from what the store uses: a small shrink waits.
    say(2 << 20);
    m.follow_tree_store(1536 * K, 0);
    let first = 1536 * K + (8192 - 2048 - 1536) * K / 2;
    assert_eq!(m.store.budget(), first);
    say((2 << 20) + 100 * K);
    m.follow_tree_store(1536 * K, 0);
    assert_eq!(m.store.budget(), first, "50 KiB less, 2.2 MiB above what it uses");
    // Near it: followed at once.
    say(6348 * K);
    m.follow_tree_store(1536 * K, 0);
    assert_eq!(m.store.budget(), 1536 * K + 154 * K, "a move of a 32nd");
    say(6448 * K);
    m.follow_tree_store(1536 * K, 0);
    assert_eq!(m.store.budget(), 1536 * K + 104 * K, "50 KiB less, near what it uses");
    // Growing by less than a 32nd waits.
    say(6348 * K);
    m.follow_tree_store(1536 * K, 0);
    assert_eq!(m.store.budget(), 1536 * K + 104 * K);
    m.leave_tree();
}

/// A look at the page map ([`AdoptLook::read`]) finds the pages that
/// are no longer shared — mapped here alone, or not at all — across
/// spans of [`ADOPT_SPAN`] pages and a look that wraps around. The
/// shared pages are those of a memfd mapped twice (as a forked
/// child's inherited ones are mapped in two processes).
/// Held by the tests that read whether pages are mapped here alone,
/// and by the one that forks: while its children live, every private
/// page of this process is mapped by them too (a look in another
/// test, run at the same time, once found two pages of its own
/// shared).
static FORKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_look_at_the_page_map_finds_the_pages_no_longer_shared() {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let n = 2 * ADOPT_SPAN + 320;
    // SAFETY: a NUL-terminated name; sizing and mapping our own memfd.
    let (base, other) = unsafe {
        let fd = libc::memfd_create(c"look".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, (n * PAGE) as libc::off_t), 0);
        let map = |p| libc::mmap(p, n * PAGE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        let (a, b) = (map(std::ptr::null_mut()), map(std::ptr::null_mut()));
        assert!(a != libc::MAP_FAILED && b != libc::MAP_FAILED);
        libc::close(fd);
        (a as usize, b as usize)
    };
    let touch = |at: usize| {
        // SAFETY: a page of a mapping of ours.
        unsafe { std::ptr::write_volatile(at as *mut u8, 1) };
    };
    for i in 0..n {
        touch(base + i * PAGE);
    }
    for i in 0..n {
        // SAFETY: reading a page of the second mapping maps it there too.
        unsafe { std::ptr::read_volatile((other + i * PAGE) as *const u8) };
    }
    // Pages of our own (copy-on-write would give them one) and pages
    // not mapped at all, at span edges and in between.
    let own = [0, 63, 64, ADOPT_SPAN - 1, ADOPT_SPAN, ADOPT_SPAN + 5, n - 1];
    let unmapped = [1, 700, 2 * ADOPT_SPAN, n - 2];
    for (&i, fresh) in own.iter().map(|i| (i, true)).chain(unmapped.iter().map(|i| (i, false))) {
        let at = base + i * PAGE;
        let p = sys::mmap(
            at as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_eq!(p as usize, at);
        if fresh {
            touch(at);
        }
    }
    // Every page counted as shared, the look starting in the middle.
    let words = n.div_ceil(64);
    let start = words / 2 + 3;
    let words: Vec<(usize, u64)> = (start..words)
        .chain(0..start)
        .map(|w| (w, if (w + 1) * 64 <= n { u64::MAX } else { (1 << (n % 64)) - 1 }))
        .collect();
    // The parent's page map is ours here: the pages mapped twice are
    // still the parent's.
    let ours = std::sync::Arc::new(Pagemap::open());
    let look = AdoptLook { base: base / PAGE, words, pagemap: ours.clone(), parent: ours.clone() };
    let mut gone = look.read();
    gone.sort_unstable();
    let mut want: Vec<usize> = own.iter().chain(&unmapped).copied().collect();
    want.sort_unstable();
    assert_eq!(gone, want);
    // A page map that cannot be read: every page looked at.
    let blind = AdoptLook {
        base: look.base,
        words: look.words.clone(),
        pagemap: std::sync::Arc::new(Pagemap(-1)),
        parent: ours.clone(),
    };
    assert_eq!(blind.read().len(), n);
    // The parent's cannot (it is gone): every page as well.
    let orphan =
        AdoptLook { base: look.base, words: look.words.clone(), pagemap: ours, parent: blind.pagemap };
    assert_eq!(orphan.read().len(), n);
    // SAFETY: unmapping our own mappings.
    unsafe {
        libc::munmap(base as *mut libc::c_void, n * PAGE);
        libc::munmap(other as *mut libc::c_void, n * PAGE);
    }
}

/// Pages that two forked children share after their parent dropped
/// them, or wrote them (copy-on-write gave the parent a page of its
/// own), are no longer the parent's: a child's look finds them, and
/// still finds the pages the parent shares. Before the look read the
/// parent's page map too, it found neither kind: nobody counted them.
#[test]
fn pages_the_parent_dropped_while_two_children_share_them_are_no_longer_the_parents() {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let n = 256;
    let base = sys::mmap(
        std::ptr::null_mut(),
        n * PAGE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    ) as usize;
    assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
    let page = |i: usize| (base + i * PAGE) as *mut u8;
    for i in 0..n {
        // SAFETY: a page of our mapping.
        unsafe { std::ptr::write_volatile(page(i), i as u8 | 1) };
    }
    // Two children that wait, their pages as they were at the fork.
    let mut pipe = [0i32; 2];
    // SAFETY: a pipe into a two-element array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let mut kids = Vec::new();
    for _ in 0..2 {
        // SAFETY: the child makes only async-signal-safe calls.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: waiting for the pipe to close, then leaving.
            unsafe {
                libc::close(pipe[1]);
                libc::read(pipe[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        kids.push(pid);
    }
    // SAFETY: our end of the pipe.
    unsafe { libc::close(pipe[0]) };
    // This process is the parent: it drops some pages and writes others.
    let dropped = [0, 5, 64, 200, n - 1];
    let written = [1, 63, 100];
    for &i in &dropped {
        // SAFETY: dropping a page of our mapping.
        assert_eq!(unsafe { libc::madvise(page(i).cast(), PAGE, libc::MADV_DONTNEED) }, 0);
    }
    for &i in &written {
        // SAFETY: a page of our mapping.
        unsafe { std::ptr::write_volatile(page(i), 0xee) };
    }
    let open = |pid: i32| Pagemap::open_at(&std::ffi::CString::new(format!("/proc/{pid}/pagemap")).unwrap());
    let parent = std::sync::Arc::new(Pagemap::open());
    let words = (0..n / 64).map(|w| (w, u64::MAX)).collect::<Vec<_>>();
    let look = AdoptLook { base: base / PAGE, words, pagemap: std::sync::Arc::new(open(kids[0])), parent };
    let mut gone = look.read();
    gone.sort_unstable();
    let mut want: Vec<usize> = dropped.iter().chain(&written).copied().collect();
    want.sort_unstable();
    assert_eq!(gone, want, "the first child's look");
    // The same from the second child, and once the first is gone (the
    // second then maps those pages alone).
    let second = AdoptLook {
        base: look.base,
        words: look.words.clone(),
        pagemap: std::sync::Arc::new(open(kids[1])),
        parent: look.parent.clone(),
    };
    let mut gone = second.read();
    gone.sort_unstable();
    assert_eq!(gone, want, "the second child's look");
    // SAFETY: ending a child of ours.
    unsafe {
        libc::kill(kids[0], libc::SIGKILL);
        libc::waitpid(kids[0], std::ptr::null_mut(), 0);
    }
    let mut gone = second.read();
    gone.sort_unstable();
    assert_eq!(gone, want, "the second child's look, alone with its parent");
    // SAFETY: our end of the pipe; the other child; our mapping.
    unsafe {
        libc::close(pipe[1]);
        libc::waitpid(kids[1], std::ptr::null_mut(), 0);
        libc::munmap(base as *mut libc::c_void, n * PAGE);
    }
}

mod pages;
