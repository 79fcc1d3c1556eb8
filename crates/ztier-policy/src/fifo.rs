//! `fifo`: resident pages leave oldest first, in the order they came in —
//! the trivial replacement, and the worst case the shipped one
//! ([`crate::segmented`]) is built against: a program that sweeps more
//! than the budget over and over faults on every page of every pass.
//! Victims take their resident neighbours along, as probation's do.

use std::collections::VecDeque;

use crate::replacement::{Admitted, Clock, Gauges, Refault, Replacement, Slots, Verdict};

/// Has an entry in the queue (possibly stale).
const QUEUED: u8 = 0x80;

/// Oldest-first replacement over per-page flags `B` and eviction stamps `C`.
pub struct Fifo<B = Vec<u8>, C = Vec<u32>> {
    queue: VecDeque<u32>,
    clock: Clock<C>,
    bits: B,
}

impl<B: Slots<u8>, C: Slots<u32>> Fifo<B, C> {
    /// The policy over zeroed per-page tables of the managed range.
    pub fn new(bits: B, stamps: C) -> Self {
        Fifo { queue: VecDeque::new(), clock: Clock::new(stamps), bits }
    }
}

impl<B: Slots<u8> + 'static, C: Slots<u32> + 'static> Replacement for Fifo<B, C> {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn set_budget(&mut self, _budget: usize) {}
    fn refault(&mut self, page: usize) -> Refault {
        Refault { distance: self.clock.distance(page), hot: false }
    }
    fn refault_done(&mut self) -> bool {
        false
    }
    fn stays_long(&self, _page: usize) -> bool {
        false
    }
    fn resident(&mut self, i: usize) -> Admitted {
        self.requeue(i);
        Admitted::default()
    }
    fn requeue(&mut self, i: usize) {
        if self.bits[i] & QUEUED == 0 {
            self.queue.push_back(i as u32);
            self.bits[i] |= QUEUED;
        }
    }
    fn evicted(&mut self, i: usize) {
        self.clock.tick(i);
    }
    fn released(&mut self, _i: usize, _was_resident: bool) {}
    fn queued(&self) -> usize {
        self.queue.len()
    }
    fn candidate(&mut self, _resident: &dyn Fn(usize) -> bool) -> Option<usize> {
        let i = self.queue.pop_front()? as usize;
        self.bits[i] &= !QUEUED;
        Some(i)
    }
    fn judge(&mut self, i: usize, verdict: Verdict) {
        if verdict == Verdict::Requeue {
            self.requeue(i);
        }
    }
    fn clusters(&self, _i: usize) -> bool {
        true
    }
    fn protected(&self, _i: usize) -> bool {
        false
    }
    fn distance(&self, i: usize) -> usize {
        self.clock.distance(i)
    }
    fn clock(&self) -> u32 {
        self.clock.now()
    }
    fn gauges(&self) -> Gauges {
        Gauges::default()
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_leave_in_the_order_they_came_and_stale_entries_are_dropped() {
        let mut f = Fifo::new(vec![0u8; 64], vec![0u32; 64]);
        for i in [5, 3, 9, 3] {
            f.resident(i);
        }
        assert_eq!(f.queued(), 3, "a page is queued once");
        let mut out = Vec::new();
        while let Some(i) = f.candidate(&|_| true) {
            f.judge(i, if i == 3 { Verdict::Stale } else { Verdict::Take });
            out.push(i);
        }
        assert_eq!(out, vec![5, 3, 9]);
        f.evicted(5);
        f.evicted(9);
        assert_eq!(f.refault(5), Refault { distance: 1, hot: false });
        assert_eq!(f.clock(), 2);
    }
}
