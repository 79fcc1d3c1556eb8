//! The waits a process makes for the tree budget: when the pool cannot
//! give it the pages it needs, it wakes the other processes' evictors
//! (each gives back its share of the shortfall) and waits for the pool
//! ([`wait`]). The pool is reached through [`Pool`] (the library's
//! member of the shared segment) and time through [`Clock`], so that the
//! state machine is tested here with a scripted pool and a clock that
//! only moves when told.

use std::time::{Duration, Instant};

/// How long a process waits for the others to give back pages (when the
/// budget counts resident pages only), and how often it wakes them again
/// under `--budget-covers all`.
pub const TREE_WAIT: Duration = Duration::from_millis(5);

/// Under `--budget-covers all`: the longest a process waits for pages of
/// the pool before it takes them past the budget.
pub const TREE_WAIT_MOST: Duration = Duration::from_millis(100);

/// After a wait in which no process gave a page back, the time during
/// which a process does not wait again (they may have none they can
/// give: all pinned, say, or their stores full).
pub const TREE_BACKOFF: Duration = Duration::from_millis(100);

/// How often a waiting process looks at the pool.
pub const TREE_POLL: Duration = Duration::from_micros(50);

/// What a wait sees of the shared budget: this process's member of it.
pub trait Pool {
    /// The budget covers the stores and tables too (`--budget-covers all`).
    fn covers_all(&self) -> bool;
    /// Pages all processes hold together.
    fn reserved(&self) -> usize;
    /// Pages this process holds.
    fn held(&self) -> usize;
    /// What the stores and tables take of the pool (`--budget-covers all`).
    fn charged(&self) -> usize;
    /// Holds `want` pages if the pool has them; whether it holds them now.
    fn ensure(&mut self, want: usize) -> bool;
    /// Wakes the other processes' evictors.
    fn wake_others(&self);
}

/// The time a wait reads, and its pause between looks.
pub trait Clock {
    /// Now.
    fn now(&self) -> Instant;
    /// Lets `d` pass.
    fn pause(&mut self, d: Duration);
}

/// The real clock: `Instant::now` and `thread::sleep`.
pub struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn pause(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// When the pool cannot give this process `want` pages: wakes the other
/// processes' evictors and waits for the pool, up to `wait`; whether it
/// holds them now. No wait when no other process holds any page, nor
/// for [`TREE_BACKOFF`] after a wait in which none gave any back
/// (`failed`: when the last such wait ended; set here).
///
/// Under `--budget-covers all`, where taking pages past the budget is
/// the last resort, it waits up to [`TREE_WAIT_MOST`] (or `wait` if
/// longer) in all, waking the others again every [`TREE_WAIT`], and a
/// wait counts as failed only if what all hold together with the stores
/// and tables did not shrink in it: their evictions shrink the pages
/// they hold and grow their stores.
pub fn wait<P: Pool>(
    pool: &mut P,
    clock: &mut impl Clock,
    want: usize,
    wait: Duration,
    failed: &mut Option<Instant>,
) -> bool {
    let now = clock.now();
    let backoff = failed.is_some_and(|f| now.duration_since(f) < TREE_BACKOFF);
    let all = pool.covers_all();
    let taken = |p: &P| p.reserved() + if all { p.charged() } else { 0 };
    let before = taken(pool);
    if backoff || pool.reserved() <= pool.held() {
        return false;
    }
    pool.wake_others();
    let (mut least, mut deadline) = (before, now + wait);
    // Counting resident pages only, the wait is `wait`.
    let most = now + if all { wait.max(TREE_WAIT_MOST) } else { wait };
    if all {
        deadline = most;
    }
    let mut woken = now;
    while clock.now() < deadline {
        clock.pause(TREE_POLL);
        if pool.ensure(want) {
            return true;
        }
        if all && clock.now().duration_since(woken) >= TREE_WAIT {
            woken = clock.now();
            pool.wake_others();
        }
        let r = taken(pool);
        if r < least {
            least = r;
            if !all {
                deadline = (clock.now() + wait).min(most);
            }
        }
    }
    if least >= before {
        *failed = Some(clock.now());
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A clock that moves only by the pauses.
    struct Fake(Instant);

    impl Clock for Fake {
        fn now(&self) -> Instant {
            self.0
        }

        fn pause(&mut self, d: Duration) {
            self.0 += d;
        }
    }

    /// A pool whose other processes give back `give` pages a look (of
    /// what they hold) and whose stores grow by `grow` pages a look.
    struct Scripted {
        all: bool,
        held: usize,
        others: usize,
        charged: usize,
        /// Pages no process holds.
        free: usize,
        give: usize,
        grow: usize,
        wakes: Cell<usize>,
        looks: usize,
    }

    impl Scripted {
        fn new(held: usize, others: usize) -> Scripted {
            Scripted {
                all: false,
                held,
                others,
                charged: 0,
                free: 0,
                give: 0,
                grow: 0,
                wakes: Cell::new(0),
                looks: 0,
            }
        }
    }

    impl Pool for Scripted {
        fn covers_all(&self) -> bool {
            self.all
        }
        fn reserved(&self) -> usize {
            self.held + self.others
        }
        fn held(&self) -> usize {
            self.held
        }
        fn charged(&self) -> usize {
            self.charged
        }
        fn ensure(&mut self, want: usize) -> bool {
            self.looks += 1;
            let given = self.give.min(self.others);
            self.others -= given;
            self.free += given;
            self.charged += self.grow;
            let more = want.saturating_sub(self.held);
            if more > self.free {
                return false;
            }
            self.free -= more;
            self.held += more;
            true
        }
        fn wake_others(&self) {
            self.wakes.set(self.wakes.get() + 1);
        }
    }

    /// Runs one wait; its result, the wakes in it and the time it took.
    fn run(
        pool: &mut Scripted,
        want: usize,
        wait_for: Duration,
        failed: &mut Option<Instant>,
        clock: &mut Fake,
    ) -> (bool, usize, Duration) {
        let (start, wakes) = (clock.0, pool.wakes.get());
        let r = wait(pool, clock, want, wait_for, failed);
        (r, pool.wakes.get() - wakes, clock.0 - start)
    }

    #[test]
    fn no_wait_when_no_other_process_holds_a_page() {
        let mut clock = Fake(Instant::now());
        let mut pool = Scripted::new(100, 0);
        let mut failed = None;
        let (ok, wakes, took) = run(&mut pool, 120, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!((wakes, took, pool.looks), (0, Duration::ZERO, 0), "nobody woken, no look");
        assert!(failed.is_none(), "not a failed wait: none was made");
    }

    #[test]
    fn the_others_giving_back_ends_the_wait_with_the_pages_held() {
        let mut clock = Fake(Instant::now());
        let mut pool = Scripted::new(100, 500);
        pool.give = 4;
        let mut failed = None;
        let (ok, wakes, took) = run(&mut pool, 120, TREE_WAIT, &mut failed, &mut clock);
        assert!(ok);
        assert_eq!(pool.held, 120);
        assert_eq!(wakes, 1, "woken once, at the start");
        assert_eq!(pool.looks, 5, "20 pages at 4 a look");
        assert_eq!(took, TREE_POLL * 5);
        assert!(failed.is_none());
    }

    #[test]
    fn a_wait_in_which_none_gave_back_fails_and_the_next_waits_are_skipped_for_a_while() {
        let mut clock = Fake(Instant::now());
        let mut pool = Scripted::new(100, 500);
        let mut failed = None;
        let (ok, wakes, took) = run(&mut pool, 120, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!(wakes, 1);
        assert_eq!(took, TREE_WAIT, "the whole wait, no longer");
        assert_eq!(failed, Some(clock.0));
        // Within the backoff: no wait, nobody woken.
        clock.pause(TREE_BACKOFF - TREE_POLL);
        let looks = pool.looks;
        let (ok, wakes, took) = run(&mut pool, 120, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!((wakes, took, pool.looks), (0, Duration::ZERO, looks));
        // After it: waits again, and the others give back now.
        clock.pause(TREE_POLL);
        pool.give = 20;
        let (ok, wakes, _) = run(&mut pool, 120, TREE_WAIT, &mut failed, &mut clock);
        assert!(ok);
        assert_eq!(wakes, 1);
    }

    #[test]
    fn pages_given_back_but_too_few_end_the_wait_at_its_length_without_a_failure() {
        let mut clock = Fake(Instant::now());
        let mut pool = Scripted::new(100, 500);
        // One page every look, for a want of 10,000 more: never enough.
        pool.give = 1;
        let mut failed = None;
        let (ok, wakes, took) = run(&mut pool, 10_100, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!(wakes, 1, "counting resident pages, the others are woken once");
        assert_eq!(took, TREE_WAIT, "progress does not stretch the wait past its length");
        assert!(failed.is_none(), "some were given back: the next wait is not skipped");
    }

    #[test]
    fn covering_all_it_waits_longer_and_wakes_the_others_again() {
        let mut clock = Fake(Instant::now());
        let mut pool = Scripted::new(100, 500);
        pool.all = true;
        let mut failed = None;
        let (ok, wakes, took) = run(&mut pool, 120, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!(took, TREE_WAIT_MOST);
        let every = (TREE_WAIT.as_micros() / TREE_POLL.as_micros()) as usize;
        assert_eq!(wakes, 1 + pool.looks / every, "at the start and every TREE_WAIT");
        assert!(wakes >= 20);
        assert_eq!(failed, Some(clock.0));
    }

    #[test]
    fn covering_all_a_wait_fails_only_if_the_pages_and_stores_together_did_not_shrink() {
        let mut clock = Fake(Instant::now());
        // The others give back a page a look while their stores grow by
        // a page a look: together nothing shrinks.
        let mut pool = Scripted::new(100, 5000);
        pool.all = true;
        pool.give = 1;
        pool.grow = 1;
        let mut failed = None;
        let (ok, _, _) = run(&mut pool, 10_000, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert!(failed.is_some(), "what they gave went into their stores");
        // Giving back more than the stores grow is progress.
        let mut pool = Scripted::new(100, 5000);
        pool.all = true;
        pool.give = 2;
        pool.grow = 1;
        let mut failed = None;
        let (ok, _, took) = run(&mut pool, 10_000, TREE_WAIT, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!(took, TREE_WAIT_MOST);
        assert!(failed.is_none());
    }

    #[test]
    fn a_longer_wait_than_the_most_is_kept_when_covering_all() {
        let mut clock = Fake(Instant::now());
        let mut pool = Scripted::new(100, 500);
        pool.all = true;
        let mut failed = None;
        let long = TREE_WAIT_MOST * 3;
        let (ok, _, took) = run(&mut pool, 120, long, &mut failed, &mut clock);
        assert!(!ok);
        assert_eq!(took, long);
    }
}
