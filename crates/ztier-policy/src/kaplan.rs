//! `kaplan`: adaptive sizing by cost/benefit (Wilson, Kaplan & Smaragdakis,
//! "The Case for Compressed Caching in Virtual Memory Systems", USENIX
//! 1999, §3).
//!
//! The policy keeps a recency histogram of *interesting* references — those
//! deep enough in the LRU stack that the size of the compressed region
//! decides whether they hit, hit compressed, or fault — and, for a few
//! candidate sizes of the compressed region, what those references would
//! have cost. It picks the cheapest candidate.
//!
//! For a memory of M pages and a candidate C (pages of memory given to
//! compressed pages), U = M − C pages stay uncompressed and the compressed
//! region holds K = C × r pages, r being the current compression-ratio
//! estimate. A reference at depth d costs:
//!
//! ```text
//!   d ≤ U            0                               (uncompressed hit)
//!   U < d ≤ U + K    decompress + compress           (compressed hit; the
//!                                                     displaced page is compressed)
//!   d > U + K        disk (+ compress if C > 0)      (fault)
//! ```
//!
//! Choices where the paper is vague, made here and kept:
//!
//! * Candidates: C ∈ {0, 10%, 23%, 37%, 50%} of memory. 0 is included so
//!   that the policy can turn compression off for programs it cannot help.
//! * Interesting events: references at depth > M − C_max (shallower ones
//!   hit in every candidate). First references (no depth) fault in every
//!   candidate and are ignored.
//! * Decay: each interesting event's weight grows by 1/α with
//!   α^H = 0.2, so the H-th most recent interesting event weighs 20% of the
//!   newest; "time" advances only on interesting events. A second
//!   histogram decays 16 times more slowly, and a candidate's cost is the
//!   worse of the two (per event): deep references that come in bursts
//!   (a python3 program walking all its data once in a while) faded from
//!   the paper's single histogram before they came back, and each return
//!   cost faults while the size grew again. With both, kaplan on a 0.1 ms
//!   disk went from 0.965 to 0.821 × none at 60% of the footprint (best
//!   fixed size 0.800) and from 1.053 to 1.019 at 80%. H = M as in the
//!   paper, but at least 1024: with small memories (tens of pages) M events
//!   were too few to estimate anything, and kaplan lost up to 50% against
//!   no compression on a 38-page sqlite3 run (1.5 → 1.05 with the floor).
//! * r is 4096 over the mean compressed size of the pages actually
//!   compressed into the region (decayed over the last 1024 compressions),
//!   capped at 8 (zero-filled pages would make it infinite). Before 64
//!   compressions it is estimated from the sizes of the interesting
//!   references instead. The reference-weighted estimate alone was
//!   optimistic (often-touched pages compress better than the ones that
//!   fall into the region): on a python3 trace it said 2.9 where the
//!   region held 2.5, and kaplan settled on 37% where 50% was needed.
//! * The histogram has M/64-page buckets up to depth M/2 + 8 · M/2; within
//!   a bucket references are taken as evenly spread.
//! * Adjust on demand: the choice is re-evaluated every 16 interesting
//!   events, not on a timer, and changed only when the best candidate is
//!   at least 5% cheaper than the current one (each change costs
//!   compressions or discards that the histogram does not see; without
//!   this margin the size flip-flopped on a 0.1 ms disk and lost up to 17%
//!   against no compression on a `sort` trace).
//! * Growing the region compresses the pages it takes at once (U shrinks),
//!   and shrinking it sends the compressed pages that no longer fit to the
//!   backing store; the histogram sees neither. A growth must also save,
//!   over the next H interesting events at the modelled rate, more than
//!   those compressions cost; a shrink, over the next 16·H, more than a
//!   quarter of the discarded pages refaulting. The first kept kaplan from switching compression on
//!   for a handful of late references on a fast disk; the second from
//!   shrinking to nothing on a gnuplot trace at a 5 ms disk, where the
//!   discarded pages came back as faults (1.098 × none before).

use crate::policy::{Costs, Outcome, Policy, Reference};

/// Candidate fractions of memory for the compressed region.
pub const FRACTIONS: [f64; 5] = [0.0, 0.10, 0.23, 0.37, 0.50];
/// Largest compression ratio the estimate may reach.
pub const MAX_RATIO: f64 = 8.0;
const BUCKETS_PER_MEMORY: usize = 64;
const DECIDE_EVERY: u32 = 16;
/// Fewest interesting events over which the statistics decay to 20%.
const MIN_HORIZON: usize = 1024;
/// Relative gain needed to change the size.
const HYSTERESIS: f64 = 0.05;
/// How many times longer the second histogram remembers.
const LONG_FACTOR: f64 = 16.0;
/// Compressions seen before their sizes replace the reference estimate.
const MIN_COMPRESSIONS: u32 = 64;
/// Per-compression decay of the compressed-size mean (1024 compressions to 20%).
const COMP_DECAY_EVENTS: f64 = 1024.0;

/// The cost/benefit policy.
pub struct Kaplan {
    m: usize,
    costs: Costs,
    candidates: Vec<usize>,
    width: usize,
    hist: Vec<f64>,
    weight: f64,
    grow: f64,
    /// The same histogram decayed LONG_FACTOR times more slowly.
    long: Vec<f64>,
    long_weight: f64,
    long_grow: f64,
    size_sum: f64,
    size_w: f64,
    /// Decayed sum and count of sizes of pages compressed into the region.
    comp_sum: f64,
    comp_n: f64,
    comp_seen: u32,
    since: u32,
    current: usize,
}

impl Kaplan {
    /// The policy for a memory of `memory_pages` pages.
    pub fn new(memory_pages: usize, costs: Costs) -> Self {
        let m = memory_pages.max(2);
        let candidates: Vec<usize> =
            FRACTIONS.iter().map(|f| ((f * m as f64).round() as usize).min(m - 1)).collect();
        let width = (m / BUCKETS_PER_MEMORY).max(1);
        let reach = Self::reach(m);
        let buckets = reach.div_ceil(width) + 1; // the last one: beyond reach
        Kaplan {
            m,
            costs,
            candidates,
            width,
            hist: vec![0.0; buckets],
            weight: 1.0,
            grow: 1.0 / 0.2f64.powf(1.0 / m.max(MIN_HORIZON) as f64),
            long: vec![0.0; buckets],
            long_weight: 1.0,
            long_grow: 1.0 / 0.2f64.powf(1.0 / (m.max(MIN_HORIZON) as f64 * LONG_FACTOR)),
            size_sum: 0.0,
            size_w: 0.0,
            comp_sum: 0.0,
            comp_n: 0.0,
            comp_seen: 0,
            since: 0,
            current: 0,
        }
    }

    /// Deepest depth any candidate can hold in memory.
    pub fn reach(memory_pages: usize) -> usize {
        let cmax = (FRACTIONS[FRACTIONS.len() - 1] * memory_pages as f64) as usize;
        memory_pages - cmax + (cmax as f64 * MAX_RATIO) as usize + 1
    }

    fn ratio(&self) -> f64 {
        if self.comp_seen >= MIN_COMPRESSIONS && self.comp_sum > 0.0 {
            return (4096.0 * self.comp_n / self.comp_sum).clamp(1.0, MAX_RATIO);
        }
        if self.size_sum <= 0.0 {
            return MAX_RATIO;
        }
        (4096.0 * self.size_w / self.size_sum).clamp(1.0, MAX_RATIO)
    }

    /// Expected cost per interesting event under candidate `c`: the worse
    /// of the recent and the long-remembered histograms (a size must suit
    /// both what the program does now and the deep references it made
    /// less recently).
    fn cost(&self, c: usize, r: f64) -> f64 {
        let per = |h: &[f64]| {
            let w: f64 = h.iter().sum();
            if w > 0.0 {
                self.cost_of(h, c, r) / w
            } else {
                0.0
            }
        };
        per(&self.hist).max(per(&self.long))
    }

    /// Expected cost of the references in histogram `hist` under candidate `c`.
    fn cost_of(&self, hist: &[f64], c: usize, r: f64) -> f64 {
        let u = (self.m - c) as f64;
        let k = (c as f64 * r).floor();
        let comp = self.costs.decompress_ns + self.costs.compress_ns;
        let fault = self.costs.disk_ns + if c > 0 { self.costs.compress_ns } else { 0.0 };
        let w = self.width as f64;
        let last = hist.len() - 1;
        let mut total = hist[last] * fault;
        for (b, &h) in hist[..last].iter().enumerate() {
            if h == 0.0 {
                continue;
            }
            // Depths (lo, hi] of this bucket, references spread evenly.
            let (lo, hi) = (b as f64 * w, (b + 1) as f64 * w);
            let overlap = |a: f64, z: f64| ((hi.min(z) - lo.max(a)).max(0.0)) / w;
            let in_comp = overlap(u, u + k);
            let beyond = overlap(u + k, f64::INFINITY);
            total += h * (in_comp * comp + beyond * fault);
        }
        total
    }

    fn decide(&mut self) {
        let r = self.ratio();
        let mut best = (f64::INFINITY, 0);
        for &c in &self.candidates {
            let cost = self.cost(c, r);
            if cost < best.0 {
                best = (cost, c);
            }
        }
        // Hysteresis: every change of size costs compressions (growing) or
        // throws compressed pages away (shrinking), which the histogram does
        // not see; move only for a clear gain.
        let now = self.cost(self.current, r);
        if best.0 >= now * (1.0 - HYSTERESIS) {
            return;
        }
        // Saving per event × events in the horizon vs what the move costs
        // at once: a growth compresses the pages it takes; a shrink sends
        // the compressed pages that no longer fit to the backing store,
        // and about half of them come back as faults.
        let horizon = self.m.max(MIN_HORIZON) as f64;
        let (saving, switch) = if best.1 > self.current {
            ((now - best.0) * horizon, (best.1 - self.current) as f64 * self.costs.compress_ns)
        } else {
            // A smaller region pays back over the long histogram's horizon.
            (
                (now - best.0) * horizon * LONG_FACTOR,
                (self.current - best.1) as f64 * r * 0.25 * self.costs.disk_ns,
            )
        };
        if saving <= switch {
            return;
        }
        self.current = best.1;
    }

    /// The candidate sizes, in pages.
    pub fn candidates(&self) -> &[usize] {
        &self.candidates
    }
}

impl Policy for Kaplan {
    fn name(&self) -> String {
        "kaplan".into()
    }

    fn interest_depth(&self) -> usize {
        self.m - self.candidates[self.candidates.len() - 1]
    }

    fn reference(&mut self, r: &Reference) {
        let Some(d) = r.depth else { return };
        if d <= self.interest_depth() {
            return;
        }
        let _ = Outcome::Hit; // every outcome counts the same way: by depth
        self.weight *= self.grow;
        self.long_weight *= self.long_grow;
        if self.weight > 1e200 {
            let s = 1.0 / self.weight;
            self.hist.iter_mut().for_each(|h| *h *= s);
            self.size_sum *= s;
            self.size_w *= s;
            self.weight = 1.0;
        }
        if self.long_weight > 1e200 {
            let s = 1.0 / self.long_weight;
            self.long.iter_mut().for_each(|h| *h *= s);
            self.long_weight = 1.0;
        }
        let b = ((d - 1) / self.width).min(self.hist.len() - 1);
        self.hist[b] += self.weight;
        self.long[b] += self.long_weight;
        self.size_sum += self.weight * r.size as f64;
        self.size_w += self.weight;
        self.since += 1;
        if self.since >= DECIDE_EVERY {
            self.since = 0;
            self.decide();
        }
    }

    fn target(&self) -> usize {
        self.current
    }

    fn compressed(&mut self, size: u16) {
        let keep = 0.2f64.powf(1.0 / COMP_DECAY_EVENTS);
        self.comp_sum = self.comp_sum * keep + size as f64;
        self.comp_n = self.comp_n * keep + 1.0;
        self.comp_seen = self.comp_seen.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(disk_ms: f64) -> Costs {
        Costs { disk_ns: disk_ms * 1e6, compress_ns: 10_000.0, decompress_ns: 5_000.0 }
    }

    fn feed(k: &mut Kaplan, depth: usize, size: u16, n: usize) {
        for _ in 0..n {
            k.reference(&Reference { depth: Some(depth), outcome: Outcome::Fault, size });
        }
    }

    /// §3: references just beyond memory, to pages that compress well, are
    /// what a compressed cache turns from faults into cheap hits: grow it.
    #[test]
    fn grows_when_references_fall_just_beyond_memory_and_compress_well() {
        let m = 1000;
        let mut k = Kaplan::new(m, costs(5.0));
        feed(&mut k, 1200, 1024, 2000); // ratio 4: 37% of memory holds the 1200th page
        assert!(k.target() > 0, "target {}", k.target());
        assert!(m - k.target() + (k.target() as f64 * 4.0) as usize >= 1200);
    }

    /// §3: references that would hit in uncompressed memory anyway are
    /// only slowed by a compressed region: keep it off.
    #[test]
    fn stays_off_when_references_fit_in_memory() {
        let m = 1000;
        let mut k = Kaplan::new(m, costs(5.0));
        feed(&mut k, 700, 1024, 2000); // would be compressed hits if C ≥ 30%
        feed(&mut k, 950, 1024, 10);
        assert_eq!(k.target(), 0);
    }

    /// Incompressible data brings no benefit: the region stays off even
    /// for references beyond memory.
    #[test]
    fn stays_off_for_incompressible_pages() {
        let mut k = Kaplan::new(1000, costs(5.0));
        feed(&mut k, 1100, 4096, 2000);
        assert_eq!(k.target(), 0);
    }

    /// Decay: after a phase change the old phase fades; the M-th most
    /// recent interesting event weighs 20% of the newest (the long
    /// histogram: the 16·M-th), and the size follows once both agree.
    #[test]
    fn adapts_to_a_phase_change_through_decay() {
        let m = 2000; // above the horizon floor: the horizon is M
                      // A 0.1 ms disk: shrinking (discarding compressed pages) is cheap
                      // enough to pay back; at 5 ms kaplan would keep the region.
        let mut k = Kaplan::new(m, costs(0.1));
        feed(&mut k, 2600, 1024, 6000);
        assert!(k.target() > 0);
        // Now every interesting reference would hit uncompressed without a
        // compressed region, and hit compressed with one.
        feed(&mut k, 1900, 1024, 5 * m);
        assert!(k.target() > 0, "the long histogram still remembers the deep references");
        feed(&mut k, 1900, 1024, 5 * 16 * m);
        assert_eq!(k.target(), 0, "the old phase must have faded");
        assert!((k.grow.powf(m as f64) - 5.0).abs() < 1e-6);
        assert!((k.long_grow.powf(LONG_FACTOR * m as f64) - 5.0).abs() < 1e-6);
        // Small memories decay over at least MIN_HORIZON events.
        let small = Kaplan::new(100, costs(5.0));
        assert!((small.grow.powf(MIN_HORIZON as f64) - 5.0).abs() < 1e-6);
    }

    /// With a cheap backing store (an SSD) compression pays less: the same
    /// references that justify a compressed region at 5 ms do not at 10 µs.
    #[test]
    fn a_cheap_disk_needs_more_benefit() {
        let mut slow = Kaplan::new(1000, costs(5.0));
        let mut fast = Kaplan::new(1000, costs(0.01));
        for k in [&mut slow, &mut fast] {
            feed(k, 600, 1024, 200);
            feed(k, 1100, 1024, 20);
            feed(k, 600, 1024, 200);
        }
        assert!(slow.target() > 0);
        assert_eq!(fast.target(), 0);
    }
}
