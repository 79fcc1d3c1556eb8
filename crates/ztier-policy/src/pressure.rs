//! `pressure` (new): feedback from measured costs, in the spirit of Meta's
//! TMO/Senpai and the kernel's zswap shrinker.
//!
//! Instead of modelling every candidate size (kaplan), the policy watches
//! what the current size costs and nudges it, like a controller that keeps
//! refaults and compression stalls in balance:
//!
//! * **refault pressure** — faults on pages seen before whose depth a
//!   region one step larger would have reached (`depth ≤ M − C' + C'·r`,
//!   C' = C + step): disk time a bigger region would have saved;
//! * **compression stall** — compressed hits deep enough that a region one
//!   step smaller would have held them uncompressed (`depth ≤ M − C +
//!   step`): decompress + compress time a smaller region would have saved.
//!
//! Every window of W misses (W = max(64, M/16)) the policy compares the two
//! costs: if refaults cost more it grows the region by a step (M/32), if
//! stalls cost more it shrinks it, otherwise it holds. No history beyond a
//! window, no model of the whole stack: cheap, reactive, and blind to
//! references far from the current size (the price of being simple).
//! The ratio r comes from the mean compressed size of the window's misses
//! so far (capped at 8, as in `kaplan`).

use crate::kaplan::MAX_RATIO;
use crate::policy::{Costs, Outcome, Policy, Reference};

/// The feedback policy.
pub struct Pressure {
    m: usize,
    max: usize,
    step: usize,
    window: u32,
    costs: Costs,
    target: usize,
    misses: u32,
    refault_ns: f64,
    stall_ns: f64,
    size_sum: f64,
    sizes: f64,
    ratio: f64,
}

impl Pressure {
    /// The policy for a memory of `memory_pages` pages.
    pub fn new(memory_pages: usize, costs: Costs) -> Self {
        let m = memory_pages.max(2);
        Pressure {
            m,
            max: m / 2,
            step: (m / 32).max(1),
            window: (m / 16).max(64) as u32,
            costs,
            target: 0,
            misses: 0,
            refault_ns: 0.0,
            stall_ns: 0.0,
            size_sum: 0.0,
            sizes: 0.0,
            ratio: 2.0,
        }
    }
}

impl Policy for Pressure {
    fn name(&self) -> String {
        "pressure".into()
    }

    fn interest_depth(&self) -> usize {
        self.m - self.max
    }

    fn reference(&mut self, r: &Reference) {
        if r.outcome == Outcome::Hit {
            return;
        }
        self.size_sum += r.size as f64;
        self.sizes += 1.0;
        if self.size_sum > 0.0 {
            self.ratio = (4096.0 * self.sizes / self.size_sum).clamp(1.0, MAX_RATIO);
        }
        match (r.outcome, r.depth) {
            (Outcome::Fault, Some(d)) => {
                let bigger = (self.target + self.step).min(self.max);
                let reach = self.m - bigger + (bigger as f64 * self.ratio) as usize;
                if bigger > self.target && d <= reach {
                    self.refault_ns += self.costs.disk_ns;
                }
            }
            (Outcome::CompressedHit, Some(d)) if d <= self.m - self.target + self.step => {
                self.stall_ns += self.costs.decompress_ns + self.costs.compress_ns;
            }
            _ => {}
        }
        self.misses += 1;
        if self.misses >= self.window {
            if self.refault_ns > self.stall_ns {
                self.target = (self.target + self.step).min(self.max);
            } else if self.stall_ns > self.refault_ns {
                self.target = self.target.saturating_sub(self.step);
            }
            self.misses = 0;
            self.refault_ns = 0.0;
            self.stall_ns = 0.0;
            self.size_sum = 0.0;
            self.sizes = 0.0;
        }
    }

    fn target(&self) -> usize {
        self.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(disk_ms: f64) -> Costs {
        Costs { disk_ns: disk_ms * 1e6, compress_ns: 10_000.0, decompress_ns: 5_000.0 }
    }

    fn feed(p: &mut Pressure, depth: usize, outcome: Outcome, n: usize) {
        for _ in 0..n {
            p.reference(&Reference { depth: Some(depth), outcome, size: 1024 });
        }
    }

    #[test]
    fn refaults_within_reach_grow_the_region_step_by_step() {
        let mut p = Pressure::new(1000, costs(5.0));
        feed(&mut p, 1050, Outcome::Fault, 64);
        assert_eq!(p.target(), p.step);
        feed(&mut p, 1050, Outcome::Fault, 64 * 100);
        assert_eq!(p.target(), 500, "bounded by half of memory");
    }

    #[test]
    fn stalls_shrink_it_and_faults_out_of_reach_do_not_grow_it() {
        let mut p = Pressure::new(1000, costs(5.0));
        feed(&mut p, 1050, Outcome::Fault, 64 * 4);
        let t = p.target();
        assert!(t > 0);
        // Compressed hits a smaller region would have served uncompressed.
        feed(&mut p, 1000 - t + 1, Outcome::CompressedHit, 64);
        assert_eq!(p.target(), t - p.step);
        // Faults far beyond any reach: no pressure either way.
        let t = p.target();
        feed(&mut p, 100_000, Outcome::Fault, 64 * 3);
        assert_eq!(p.target(), t);
    }

    #[test]
    fn a_cheap_disk_tips_the_balance_towards_shrinking() {
        let mut slow = Pressure::new(1000, costs(5.0));
        let mut fast = Pressure::new(1000, costs(0.001));
        for p in [&mut slow, &mut fast] {
            feed(p, 1050, Outcome::Fault, 64 * 4);
            for _ in 0..64 {
                feed(p, 1040, Outcome::Fault, 1);
                feed(p, 1000 - p.target() + 1, Outcome::CompressedHit, 1);
            }
        }
        assert!(slow.target() > fast.target(), "{} vs {}", slow.target(), fast.target());
    }
}
