//! When a fault-driven pager evicts, and how many pages at a time: the
//! pacing `ztier run` uses and the simulator's model of it follows.
//!
//! ```text
//!   resident ▲
//!     budget ┤─────────── a fault that would go over evicts at once, inline:
//!            │             what it needs, INLINE_LEAST pages at least
//!   − ½ reserve ┤········· the background evictor wakes
//!   − reserve   ┤········· …and evicts down to here, BACKGROUND_BATCH at a time
//! ```
//!
//! The background evictor keeps a reserve of free pages below the budget
//! ([`reserve_of`]) so that faults rarely wait for an eviction; a fault
//! that finds no room evicts for itself, as few pages as it can
//! ([`INLINE_LEAST`] at least).

/// Pages evicted per round of an inline eviction (the handler making
/// room while idle, or after a fork).
pub const EVICT_BATCH: usize = 32;

/// Fewest pages a fault that finds no room evicts itself (it evicts
/// what it needs, at least these): the rest is the background
/// evictor's. A fault that evicted a whole [`EVICT_BATCH`] waited
/// ~300 µs for it; with 4, faults evicted 5 times as often and pyapp
/// at 40M took ~15% more CPU (8: ~2%).
pub const INLINE_LEAST: usize = 8;

/// Longest run (the faulting page and those the prefetch brings along)
/// a fault installs when it must evict for it: what fits under the
/// budget now, or this many (a fault evicts for its whole run). Store
/// runs reach 64 pages; a zero run (16) is never shortened.
pub const INLINE_RUN: usize = 16;

/// Victims the background evictor takes at a time. Fewer write-protect
/// calls (TLB shootdowns on the program's CPU) per page than smaller
/// batches: pyapp at 256M, against 256: same wall time, fault p99 77 µs
/// instead of 110-150 µs; against 64: 8% slower.
pub const BACKGROUND_BATCH: usize = EVICT_BATCH * 16;

/// Fewest victims the background evictor takes while eviction is not
/// wanted yet (at most half the reserve). Without it the evictor, never
/// idle under a steady stream of faults, took whatever had come in since
/// its last batch: ~18 pages a batch on the corpus builder at 256M, and
/// each batch waits for a fault service to write-protect it and costs a
/// shootdown to release.
pub const BACKGROUND_LEAST: usize = 256;

/// Resident pages kept free below a budget of `budget` pages by the
/// background evictor.
pub fn reserve_of(budget: usize) -> usize {
    (budget / 16).clamp(EVICT_BATCH * 2, 4096).min(budget / 2)
}

/// Largest run of pages one victim takes along: its resident neighbours
/// the replacement lets go with it ([`crate::replacement::Replacement::clusters`]),
/// so that a run costs one write-protect call and one release.
pub const CLUSTER: usize = 16;

/// How long the background evictor waits for a fault service to make its
/// batch's write protections before it makes them itself (the run
/// library's near path; the simulator's pipeline uses the same wait).
pub const NEAR_WAIT: std::time::Duration = std::time::Duration::from_millis(2);
