//! `clean-disable`: stop compressing clean pages while compressing them
//! does not pay, and start again when it would have (de Castro, Lago &
//! de Oliveira, SBAC-PAD 2003, §2.3.4). Composes with any sizing policy:
//! `kaplan+clean-disable`, `static:0.25+clean-disable`.
//!
//! A *clean* page has a valid copy on the backing store (it was read from
//! there and not written since). Evicting it from memory costs nothing;
//! compressing it costs a compression and room in the compressed region,
//! and pays only if the page is read back before the region evicts it.
//!
//! ```text
//!             compressed clean page read back: reclaimed ──┐
//!   enabled ─┤                                             ├─ decayed counts
//!             compressed clean page evicted unread: released┘
//!      │  released > 4 × reclaimed (and ≥ 64 released)        ▲
//!      ▼                                                      │ released ≤ 2 × reclaimed
//!   disabled: clean pages leaving memory are dropped and their numbers
//!             kept in a ghost FIFO as long as the region (pages);
//!             a fault on a ghost = a reclaim missed; a ghost falling
//!             out of the FIFO = a release avoided
//! ```
//!
//! Choices where the paper gives no numbers, made here: the factors 4
//! (disable) and 2 (re-enable) leave a band so the switch does not
//! flip-flop; counts halve whenever their sum passes 1024, so the
//! decision follows the last few thousand clean-page events; the ghost
//! FIFO holds as many pages as the compressed region holds now (at least
//! 16), since a dropped page would have stayed compressed about that long.
//! The paper's "released" is read as *evicted from the compressed cache
//! without being read*, and "reclaimed" as *read back from it*.

use std::collections::VecDeque;

use std::hash::BuildHasherDefault;

use hashbrown::HashMap;

use crate::policy::{Policy, Reference};
use crate::recency::PageHasher;

/// Disable when released > this × reclaimed.
pub const DISABLE_FACTOR: f64 = 4.0;
/// Re-enable when released ≤ this × reclaimed.
pub const ENABLE_FACTOR: f64 = 2.0;
/// Fewest releases that can disable.
pub const MIN_RELEASED: f64 = 64.0;
const HALVE_AT: f64 = 1024.0;
const MIN_GHOSTS: usize = 16;

/// A sizing policy with clean-page compression switched adaptively.
pub struct CleanDisable {
    inner: Box<dyn Policy>,
    enabled: bool,
    released: f64,
    reclaimed: f64,
    /// Ghost FIFO of (page, stamp); an entry whose stamp differs from the
    /// map's is stale (the page was read back or dropped again since).
    ghosts: VecDeque<(u64, u64)>,
    ghost_map: HashMap<u64, u64, BuildHasherDefault<PageHasher>>,
    stamp: u64,
    switches: u64,
}

impl CleanDisable {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn Policy>) -> Self {
        CleanDisable {
            inner,
            enabled: true,
            released: 0.0,
            reclaimed: 0.0,
            ghosts: VecDeque::new(),
            ghost_map: HashMap::default(),
            stamp: 0,
            switches: 0,
        }
    }

    /// Times compression of clean pages was switched off or on.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    fn count(&mut self, released: f64, reclaimed: f64) {
        self.released += released;
        self.reclaimed += reclaimed;
        if self.released + self.reclaimed > HALVE_AT {
            self.released /= 2.0;
            self.reclaimed /= 2.0;
        }
        let now = if self.enabled {
            !(self.released >= MIN_RELEASED && self.released > DISABLE_FACTOR * self.reclaimed)
        } else {
            self.released <= ENABLE_FACTOR * self.reclaimed
        };
        if now != self.enabled {
            self.enabled = now;
            self.switches += 1;
            if now {
                self.ghosts.clear();
                self.ghost_map.clear();
            }
        }
    }
}

impl Policy for CleanDisable {
    fn name(&self) -> String {
        format!("{}+clean-disable", self.inner.name())
    }
    fn interest_depth(&self) -> usize {
        self.inner.interest_depth()
    }
    fn reference(&mut self, r: &Reference) {
        self.inner.reference(r)
    }
    fn target(&self) -> usize {
        self.inner.target()
    }
    fn compressed(&mut self, size: u16) {
        self.inner.compressed(size)
    }
    fn tracks_clean(&self) -> bool {
        true
    }
    fn compress_clean(&self) -> bool {
        self.enabled
    }
    fn clean_reclaimed(&mut self) {
        self.count(0.0, 1.0);
    }
    fn clean_dropped(&mut self, page: u64, was_compressed: bool, region_pages: usize) {
        if was_compressed {
            self.count(1.0, 0.0);
            return;
        }
        // Dropped instead of compressed (only while disabled): remember it.
        self.stamp += 1;
        self.ghost_map.insert(page, self.stamp);
        self.ghosts.push_back((page, self.stamp));
        let cap = region_pages.max(MIN_GHOSTS);
        while self.ghost_map.len() > cap || self.ghosts.len() > 2 * cap {
            let Some((old, stamp)) = self.ghosts.pop_front() else { break };
            if self.ghost_map.get(&old) == Some(&stamp) {
                self.ghost_map.remove(&old);
                self.count(1.0, 0.0); // it would have been evicted unread
            }
        }
    }
    fn faulted(&mut self, page: u64) {
        if !self.enabled && self.ghost_map.remove(&page).is_some() {
            // Read back while it would still have been compressed.
            self.count(0.0, 1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::static_size::Static;

    fn cd() -> CleanDisable {
        CleanDisable::new(Box::new(Static::new("static:0.25".into(), 0.25, 1000)))
    }

    /// §2.3.4: many more clean pages released from the compressed cache
    /// than reclaimed from it → stop compressing clean pages.
    #[test]
    fn disables_when_clean_pages_are_released_much_more_than_reclaimed() {
        let mut p = cd();
        assert!(p.compress_clean());
        for i in 0..40 {
            p.clean_dropped(i, true, 250);
        }
        assert!(p.compress_clean(), "too few events to judge");
        for _ in 0..10 {
            p.clean_reclaimed();
        }
        for i in 0..160 {
            if i % 4 == 0 {
                p.clean_reclaimed();
            }
            p.clean_dropped(100 + i, true, 250);
        }
        assert!(p.compress_clean(), "4 released per reclaim is not more than 4×");
        for i in 0..100 {
            p.clean_dropped(200 + i, true, 250);
        }
        assert!(!p.compress_clean());
        assert_eq!(p.switches(), 1);
        assert_eq!(p.target(), 250, "the size is the inner policy's");
        assert_eq!(p.name(), "static:0.25+clean-disable");
    }

    /// §2.3.4: pages dropped while disabled are remembered; reading them
    /// back (a fault on a ghost) re-enables compression of clean pages.
    #[test]
    fn reenables_when_dropped_clean_pages_are_read_back() {
        let mut p = cd();
        for i in 0..200 {
            p.clean_dropped(i, true, 250);
        }
        assert!(!p.compress_clean());
        for i in 1000..1300 {
            p.clean_dropped(i, false, 250);
        }
        // Faults on pages never dropped, or dropped too long ago, count nothing.
        p.faulted(5);
        p.faulted(1000);
        assert!(!p.compress_clean());
        let mut read_back = 0;
        for i in (1100..1300).rev() {
            p.faulted(i);
            read_back += 1;
            if p.compress_clean() {
                break;
            }
        }
        assert!(p.compress_clean(), "ghost hits must re-enable");
        assert!(read_back > 10, "re-enabled after {read_back} ghost hits: too eager");
        assert_eq!(p.switches(), 2);
    }

    /// The decision follows recent events: old releases fade.
    #[test]
    fn counts_decay() {
        let mut p = cd();
        for i in 0..5000 {
            p.clean_dropped(i, true, 250);
            if i % 8 == 0 {
                p.clean_reclaimed();
            }
        }
        assert!(!p.compress_clean());
        assert!(p.released + p.reclaimed <= HALVE_AT + 1.0);
    }
}
