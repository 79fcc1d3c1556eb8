//! The page-state byte of `ztier run`'s arena: one per page, kept by the
//! preload library's manager, and the transitions between its states.
//!
//! ```text
//!  ┌────────┬─────────┬────────┬───────┬───────┬───────┬─────────────────────────────┐
//!  │ bit 7  │ bit 6   │ bit 5  │ bit 4 │ bit 3 │ bit 2 │ bits 0..1                   │
//!  │ (free) │ NOEVICT │ (free) │ CLEAN │(free) │ OWNED │ ABSENT 0 · RESIDENT 1 ·     │
//!  │        │         │        │       │       │       │ STORED 2 · EVICTING 3       │
//!  └────────┴─────────┴────────┴───────┴───────┴───────┴─────────────────────────────┘
//!
//!   ABSENT   ──fault (zeros)──────────────────────────► RESIDENT      [resident]
//!   STORED   ──fault (its copy)───────────────────────► RESIDENT      [resident]
//!   RESIDENT ──picked by the evictor───────────────────► EVICTING+OWNED [picked]
//!   EVICTING+OWNED ──a write before the seal──────────► RESIDENT+OWNED [taken_back]
//!   EVICTING+OWNED ──commit (or commit early)─────────► EVICTING      [disowned], then
//!   EVICTING ──stored / all zero or gone──────────────► STORED / ABSENT [evicted]
//!   EVICTING ──the store refused it───────────────────► RESIDENT      [resident]
//!   any      ──munmap / MADV_DONTNEED / free──────────► ABSENT        [released]
//!                (NOEVICT and OWNED stay: an unreadable page stays out of
//!                 zero runs; an OWNED page stays so until its commit)
//! ```
//!
//! CLEAN (a resident page whose stored copy is still the store's) is set
//! when a store fault keeps the copy ([`clean`]) and cleared by a write
//! ([`written`]), a take-back, an eviction or a release. NOEVICT (the
//! page is not readable: never a victim) is set and cleared by the
//! program's `mprotect` ([`noevict`]). OWNED is the evictor's, from the
//! pick to the commit: no fault is served on such a page and no other
//! eviction picks it.
//!
//! The transitions are functions of the old byte, so that each keeps or
//! drops each flag in one place; the manager writes their results.

/// No data: the next touch gets zeros.
pub const ABSENT: u8 = 0;
/// In memory, uncompressed.
pub const RESIDENT: u8 = 1;
/// Compressed in the store (or its spill file).
pub const STORED: u8 = 2;
/// Being evicted by the background evictor (still in memory,
/// write-protected).
pub const EVICTING: u8 = 3;
/// Mask of the state bits.
pub const STATE: u8 = 3;
/// Resident with its stored copy still in the store, unwritten since
/// (or, in verify mode, possibly written: its hash tells).
pub const CLEAN: u8 = 0x10;
/// Picked by an eviction that has not committed yet: its memory may be
/// released without the manager's lock, so faults on it wait for the
/// commit (or the victim's early commit).
pub const OWNED: u8 = 0x04;
/// Not readable (mprotect'ed): never evicted.
pub const NOEVICT: u8 = 0x40;

/// The bits a page-state byte may have set.
pub const USED_BITS: u8 = STATE | CLEAN | OWNED | NOEVICT;

/// The state of byte `s`: [`ABSENT`], [`RESIDENT`], [`STORED`] or
/// [`EVICTING`].
#[inline]
pub const fn state(s: u8) -> u8 {
    s & STATE
}

/// Is `s` a victim of an eviction in flight (EVICTING and OWNED)?
#[inline]
pub const fn in_flight(s: u8) -> bool {
    s & (STATE | OWNED) == EVICTING | OWNED
}

/// May a page in state `s` be picked as a victim: resident, readable,
/// not owned by an eviction (pins and the policy are asked besides)?
#[inline]
pub const fn evictable(s: u8) -> bool {
    s & (STATE | NOEVICT | OWNED) == RESIDENT
}

/// Installed by a fault (from ABSENT or STORED), or kept resident by a
/// commit whose victim the store refused: RESIDENT, every flag kept.
#[inline]
pub const fn resident(s: u8) -> u8 {
    (s & !STATE) | RESIDENT
}

/// Installed with its stored copy kept: CLEAN besides.
#[inline]
pub const fn clean(s: u8) -> u8 {
    s | CLEAN
}

/// Written (or its copy dropped): no longer CLEAN.
#[inline]
pub const fn written(s: u8) -> u8 {
    s & !CLEAN
}

/// Picked by the evictor: EVICTING and OWNED, its other flags kept (a
/// CLEAN victim is only released if its copy is still good).
#[inline]
pub const fn picked(s: u8) -> u8 {
    (s & !STATE) | EVICTING | OWNED
}

/// A victim taken back by a write before its batch was sealed (or, in a
/// forked child, a victim of the parent's evictor): RESIDENT, its copy
/// dropped (not CLEAN); OWNED stays until the batch's commit.
#[inline]
pub const fn taken_back(s: u8) -> u8 {
    (s & !(STATE | CLEAN)) | RESIDENT
}

/// At the commit of its eviction: no longer OWNED.
#[inline]
pub const fn disowned(s: u8) -> u8 {
    s & !OWNED
}

/// A committed victim: STORED if its content went to the store, else
/// ABSENT (all zero, or gone); no longer CLEAN.
#[inline]
pub const fn evicted(s: u8, stored: bool) -> u8 {
    (s & !(STATE | CLEAN)) | if stored { STORED } else { ABSENT }
}

/// Released by the program: ABSENT; NOEVICT and OWNED stay (see the
/// module docs), CLEAN goes.
#[inline]
pub const fn released(s: u8) -> u8 {
    s & (NOEVICT | OWNED)
}

/// Made unreadable (`on`) or readable again.
#[inline]
pub const fn noevict(s: u8, on: bool) -> u8 {
    if on {
        s | NOEVICT
    } else {
        s & !NOEVICT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte a page state can hold.
    fn all() -> impl Iterator<Item = u8> {
        (0..=255u8).filter(|s| s & !USED_BITS == 0)
    }

    fn flags(s: u8) -> u8 {
        s & !STATE
    }

    #[test]
    fn the_bits_are_distinct_and_the_states_fill_the_state_bits() {
        let bits = [STATE, CLEAN, OWNED, NOEVICT];
        for (k, a) in bits.iter().enumerate() {
            for b in &bits[k + 1..] {
                assert_eq!(a & b, 0, "{a:#x} and {b:#x} overlap");
            }
        }
        assert_eq!([ABSENT, RESIDENT, STORED, EVICTING].map(state), [0, 1, 2, 3]);
        assert_eq!(all().count(), 4 * 8);
    }

    #[test]
    fn a_fault_makes_a_page_resident_with_its_flags() {
        for s in all().filter(|s| matches!(state(*s), ABSENT | STORED)) {
            let r = resident(s);
            assert_eq!(state(r), RESIDENT);
            assert_eq!(flags(r), flags(s), "{s:#x}");
            let c = clean(r);
            assert_eq!(state(c), RESIDENT);
            assert_ne!(c & CLEAN, 0);
            assert_eq!(written(c), r & !CLEAN);
        }
    }

    #[test]
    fn only_readable_resident_unowned_pages_are_evictable() {
        for s in all() {
            let want = state(s) == RESIDENT && s & (NOEVICT | OWNED) == 0;
            assert_eq!(evictable(s), want, "{s:#x}");
        }
        assert!(evictable(RESIDENT));
        assert!(evictable(RESIDENT | CLEAN));
        assert!(!evictable(RESIDENT | NOEVICT));
        assert!(!evictable(RESIDENT | OWNED));
        assert!(!evictable(STORED));
        assert!(!evictable(EVICTING));
    }

    #[test]
    fn a_picked_victim_is_in_flight_and_keeps_clean() {
        for s in all().filter(|&s| evictable(s)) {
            let v = picked(s);
            assert!(in_flight(v), "{s:#x}");
            assert!(!evictable(v));
            assert_eq!(v & CLEAN, s & CLEAN);
        }
        for s in all() {
            assert_eq!(in_flight(s), state(s) == EVICTING && s & OWNED != 0, "{s:#x}");
        }
    }

    #[test]
    fn a_victim_taken_back_is_resident_written_and_still_owned() {
        for s in all().filter(|&s| in_flight(s)) {
            let t = taken_back(s);
            assert_eq!(state(t), RESIDENT);
            assert_eq!(t & CLEAN, 0, "its copy is dropped");
            assert_ne!(t & OWNED, 0, "owned until the commit");
            assert!(!evictable(t));
            assert!(!in_flight(t));
            // The commit disowns it: a victim again later.
            assert!(evictable(disowned(t)) || t & NOEVICT != 0);
        }
    }

    #[test]
    fn a_commit_makes_a_victim_stored_or_absent_or_resident_again() {
        for s in all().filter(|&s| in_flight(s)) {
            let d = disowned(s);
            assert_eq!(d & OWNED, 0);
            assert_eq!(state(d), EVICTING);
            let st = evicted(d, true);
            assert_eq!(state(st), STORED);
            assert_eq!(st & (CLEAN | OWNED), 0);
            assert_eq!(st & NOEVICT, s & NOEVICT);
            let ab = evicted(d, false);
            assert_eq!(state(ab), ABSENT);
            assert_eq!(ab & (CLEAN | OWNED), 0);
            // Refused by the store: resident, evictable again, the copy
            // it kept (if CLEAN) still good.
            let k = resident(d);
            assert_eq!(state(k), RESIDENT);
            assert_eq!(k & CLEAN, s & CLEAN);
            assert_eq!(evictable(k), s & NOEVICT == 0);
        }
    }

    #[test]
    fn a_release_leaves_an_absent_page_with_noevict_and_owned() {
        for s in all() {
            let r = released(s);
            assert_eq!(state(r), ABSENT, "{s:#x}");
            assert_eq!(r & CLEAN, 0);
            assert_eq!(r & (NOEVICT | OWNED), s & (NOEVICT | OWNED));
            // A released victim is no longer in flight, but stays owned:
            // nothing is installed there before its commit.
            assert!(!in_flight(r));
            assert!(!evictable(r));
        }
    }

    #[test]
    fn noevict_is_set_and_cleared_alone() {
        for s in all() {
            assert_eq!(noevict(s, true), s | NOEVICT);
            assert_eq!(noevict(noevict(s, true), false), s & !NOEVICT);
            assert_eq!(state(noevict(s, true)), state(s));
        }
    }

    #[test]
    fn every_transition_keeps_the_free_bits_clear() {
        for s in all() {
            let outs = [
                resident(s),
                clean(s),
                written(s),
                picked(s),
                taken_back(s),
                disowned(s),
                evicted(s, true),
                evicted(s, false),
                released(s),
                noevict(s, true),
                noevict(s, false),
            ];
            for t in outs {
                assert_eq!(t & !USED_BITS, 0, "{s:#x} -> {t:#x}");
            }
        }
    }
}
