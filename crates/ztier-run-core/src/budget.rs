//! The arithmetic of a process's part of `ztier run`'s tree budget
//! (`--budget-scope tree`): how much of its resident memory it owes the
//! shared pool, how long a run a fault may install, and the budget its
//! replacement policy follows. The pool itself (the shared segment, its
//! slots and counters) is `ztier_uffd::tree`; the manager of the preload
//! library reads it and applies these.
//!
//! Page counts throughout: `held` is what this process holds of the
//! pool, `free` what no process holds, `reserved` what every process
//! holds together.

/// What a process should evict for the others when the pool has less
/// than `reserve` pages free (`overdrawn`: what the processes hold past
/// the pool, under `--budget-covers all`): its part of the shortfall, in
/// proportion to what it holds of the pool (`held` of `reserved`), and no
/// more than its `resident` pages. 0 while the pool has enough.
pub fn excess(
    free: usize,
    reserve: usize,
    overdrawn: usize,
    held: usize,
    reserved: usize,
    resident: usize,
) -> usize {
    let short = (reserve + overdrawn).saturating_sub(free);
    if short == 0 {
        return 0;
    }
    (short * held).div_ceil(reserved.max(1)).min(resident)
}

/// Pages this process can fill without evicting: those no process holds
/// (`free`) and, while it is alone in the pool (all that is `reserved`
/// is its `held`), those it holds beyond what its resident pages `need`
/// (its slack: the pool's `Member::ensure` takes a chunk more than
/// asked) — the room [`excess`] and the evictor's wake-up weigh against
/// the reserve. Not its slack while the pool is `overdrawn` (under
/// `--budget-covers all`: owed back), nor while another process holds
/// pages (their shortfall is real: the slack is not theirs to fill).
/// Counted as short, the slack had a process alone in the pool evict a
/// chunk (64 pages) below budget − reserve when its evictor had a CPU at
/// once, and not when it lagged (the faults evicted inline, at the
/// budget): `sort` at 1M faulted 44 k times idle against 23 k loaded.
pub fn room(free: usize, held: usize, need: usize, reserved: usize, overdrawn: usize) -> usize {
    if overdrawn > 0 || reserved > held {
        return free;
    }
    free + held.saturating_sub(need)
}

/// How many of the `lim` pages a fault may install as one run when the
/// pool could not give it them all: those it got (`held`, all it holds
/// now) and those it could evict of its own (`own` resident pages it
/// holds for, less the `evicting` ones in flight), past what it needs for
/// the pages it has (`need`); at least 1, at most `lim`.
pub fn run_room(held: usize, own: usize, evicting: usize, need: usize, lim: usize) -> usize {
    (held + own.saturating_sub(evicting)).saturating_sub(need).clamp(1, lim)
}

/// The budget a process's replacement policy may follow now: what it
/// holds, what no process holds and its pages its parent holds for it
/// (`shared`), up to the budget asked for (`cap`), and at least four
/// batches (`batch` pages each).
pub fn share_target(held: usize, free: usize, shared: usize, cap: usize, batch: usize) -> usize {
    (held + free + shared).min(cap).max(batch * 4)
}

/// What to do with a process's budget `share` given the `target` it may
/// have now ([`share_target`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Less than a batch apart: leave it.
    Stay,
    /// Shrink to the target, at once.
    Shrink(usize),
    /// Grow, by a 64th of the share or a batch, whichever is more (all
    /// the way once less than a batch would be left) — if the last
    /// growth was long enough ago (the caller's clock).
    Grow(usize),
}

/// [`Follow`] for `share` and `target`, with batches of `batch` pages.
pub fn follow(share: usize, target: usize, batch: usize) -> Follow {
    if target.abs_diff(share) < batch {
        return Follow::Stay;
    }
    if target < share {
        return Follow::Shrink(target);
    }
    let grown = share + (share / 64).max(batch);
    Follow::Grow(if grown + batch > target { target } else { grown })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_excess_while_the_pool_keeps_its_reserve() {
        assert_eq!(excess(100, 100, 0, 500, 1000, 500), 0);
        assert_eq!(excess(1000, 100, 0, 500, 1000, 500), 0);
        // Overdrawn: the reserve and the overdraft must be free.
        assert_eq!(excess(150, 100, 50, 500, 1000, 500), 0);
        assert_ne!(excess(149, 100, 50, 500, 1000, 500), 0);
    }

    #[test]
    fn the_shortfall_is_shared_by_what_each_holds() {
        // 100 short; this one holds a quarter of the pool.
        assert_eq!(excess(0, 100, 0, 250, 1000, 10_000), 25);
        // Rounded up: a holder of anything gives at least a page.
        assert_eq!(excess(0, 100, 0, 1, 1000, 10_000), 1);
        // The overdraft is short too.
        assert_eq!(excess(0, 100, 100, 500, 1000, 10_000), 100);
        // No more than it has resident.
        assert_eq!(excess(0, 100, 0, 1000, 1000, 30), 30);
        // Nothing reserved: no division by zero.
        assert_eq!(excess(0, 100, 0, 0, 0, 10_000), 0);
        assert_eq!(excess(0, 100, 0, 5, 0, 10_000), 500);
    }

    #[test]
    fn the_room_is_the_free_pages_and_the_own_slack_alone_and_not_overdrawn() {
        // A process alone in a pool of 256 holding 200 for 136 resident:
        // 56 free and 64 of its own to fill, 120 in all (not short of a
        // reserve of 64).
        assert_eq!(room(56, 200, 136, 200, 0), 120);
        assert_eq!(excess(room(56, 200, 136, 200, 0), 64, 0, 200, 200, 136), 0);
        assert_ne!(excess(56, 64, 0, 200, 200, 136), 0, "its slack counted as short");
        // Another process holds pages: only the free ones.
        assert_eq!(room(56, 200, 136, 201, 0), 56);
        // Holding less than it needs (pages shared with a parent): no slack.
        assert_eq!(room(10, 50, 80, 50, 0), 10);
        // Overdrawn: the slack is owed back, not room.
        assert_eq!(room(0, 200, 136, 200, 5), 0);
    }

    #[test]
    fn a_run_is_what_the_process_can_hold_at_least_one_page() {
        // Holds 3 past what it needs, nothing of its own to evict.
        assert_eq!(run_room(18, 0, 0, 15, 16), 3);
        // Its own pages can be evicted to make room.
        assert_eq!(run_room(15, 5, 0, 15, 16), 5);
        // Not those in flight.
        assert_eq!(run_room(15, 5, 3, 15, 16), 2);
        // Never more than asked for, never less than one.
        assert_eq!(run_room(100, 100, 0, 15, 16), 16);
        assert_eq!(run_room(0, 0, 0, 15, 16), 1);
        assert_eq!(run_room(0, 5, 10, 15, 16), 1);
    }

    #[test]
    fn the_followed_budget_is_bounded_by_the_cap_and_four_batches() {
        assert_eq!(share_target(100, 50, 10, 1000, 8), 160);
        assert_eq!(share_target(900, 500, 0, 1000, 8), 1000);
        assert_eq!(share_target(0, 0, 0, 1000, 8), 32);
    }

    #[test]
    fn the_budget_shrinks_at_once_and_grows_a_little_at_a_time() {
        let batch = 32;
        assert_eq!(follow(1000, 1000 + batch - 1, batch), Follow::Stay);
        assert_eq!(follow(1000, 1000 - batch + 1, batch), Follow::Stay);
        assert_eq!(follow(1000, 100, batch), Follow::Shrink(100));
        // A batch at a time while the share is small.
        assert_eq!(follow(1000, 5000, batch), Follow::Grow(1000 + batch));
        // A 64th of it when that is more.
        assert_eq!(follow(6400, 20_000, batch), Follow::Grow(6500));
        // All the way once less than a batch would be left.
        assert_eq!(follow(1000, 1000 + batch + batch / 2, batch), Follow::Grow(1000 + batch + batch / 2));
        assert_eq!(follow(1000, 1000 + 2 * batch - 1, batch), Follow::Grow(1000 + 2 * batch - 1));
        assert_eq!(follow(1000, 1000 + 2 * batch, batch), Follow::Grow(1000 + batch));
    }
}
