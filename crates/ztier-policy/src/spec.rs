//! Policies by name, as `ztier run --policy` and `ztier sim --policy`
//! take them: a replacement, a prefetch and a sizing policy joined by
//! `+` ([`Spec`]; the sizing policies' own names are
//! [`crate::registry`]'s).
//!
//! ```text
//!   segmented+walk+kaplan      replacement + prefetch + sizing, any order
//!   shipped                    = segmented+walk: what `ztier run` does by default
//!   kaplan   static:0.25       a sizing alone: in `ztier sim` over `lru` (the 1999
//!                              model, which sees every reference); in `ztier run`
//!                              over the shipped replacement and prefetch
//!   castro+clean-disable       de Castro's clean-page switch around a sizing
//! ```
//!
//! | part | names | default |
//! |---|---|---|
//! | replacement | `segmented` (shipped), `fifo`; `lru` in `ztier sim` only | `segmented` (`lru` in `ztier sim` when only a sizing is named) |
//! | prefetch | `walk` (shipped), `single` | `walk` (none over `lru`) |
//! | sizing | `none`, `static:F`, `kaplan`, `castro`, `castro-aggressive`, `castro-sluggish`, `pressure`, each with `+clean-disable` | none: the budget bounds resident pages and the store is beside it, sized on its own (`ztier run --store`) |
//!
//! With a sizing policy, the budget bounds resident pages and the
//! compressed store together, and the policy splits it
//! ([`crate::split::Split`] live); `none` splits it all to resident
//! pages (no compression: evicted pages go to the backing store).

use crate::fifo::Fifo;
use crate::policy::Costs;
use crate::prefetch::Prefetch;
use crate::registry::build;
use crate::replacement::{Replacement, Slots};
use crate::segmented::Segmented;
use crate::single::Single;
use crate::split::Split;
use crate::walk::WalkPrefetch;

/// The replacements [`Spec`] knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplacementKind {
    /// [`crate::segmented`]: the shipped one.
    Segmented,
    /// [`crate::fifo`]: oldest first.
    Fifo,
    /// Exact LRU over every reference ([`crate::recency`]): the
    /// simulator's 1999 model; a pager that sees faults only cannot run it.
    Lru,
}

/// The prefetches [`Spec`] knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchKind {
    /// [`crate::walk`]: the shipped one.
    Walk,
    /// [`crate::single`]: none.
    Single,
    /// None at all (over `lru`, which has no faults to prefetch on).
    Off,
}

/// Which frontend a spec is for: what a spec that names only a sizing
/// policy means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frontend {
    /// `ztier run`: faults only; `lru` is refused.
    Run,
    /// `ztier sim`: a sizing alone runs over `lru` (the 1999 model).
    Sim,
}

/// The parts of a fault-driven policy, built ([`Spec::parts`]).
pub struct Parts {
    /// Which resident pages go.
    pub replacement: Box<dyn Replacement>,
    /// What a fault brings in.
    pub prefetch: Box<dyn Prefetch>,
    /// The split of the budget, with a sizing policy.
    pub sizing: Option<Split>,
}

/// The shipped combination (`shipped`).
pub const SHIPPED: &str = "segmented+walk";

/// A policy spec, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// As given.
    pub text: String,
    /// The replacement.
    pub replacement: ReplacementKind,
    /// The prefetch.
    pub prefetch: PrefetchKind,
    /// The sizing policy's name for [`build`] (`kaplan+clean-disable`),
    /// `None` when the store is beside the budget.
    pub sizing: Option<String>,
}

impl Spec {
    /// Parses `text` for `frontend`; the error says what is accepted.
    pub fn parse(text: &str, frontend: Frontend) -> Result<Spec, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("an empty policy".into());
        }
        let (mut replacement, mut prefetch, mut sizing, mut clean_disable) = (None, None, None, false);
        let tokens =
            text.split('+').flat_map(|t| if t == "shipped" { SHIPPED.split('+').collect() } else { vec![t] });
        for t in tokens {
            let twice = |what: &str| format!("'{text}': two {what}s ('{t}')");
            match t {
                "segmented" | "fifo" | "lru" => {
                    if replacement.is_some() {
                        return Err(twice("replacement"));
                    }
                    replacement = Some(match t {
                        "segmented" => ReplacementKind::Segmented,
                        "fifo" => ReplacementKind::Fifo,
                        _ => ReplacementKind::Lru,
                    });
                }
                "walk" | "single" => {
                    if prefetch.is_some() {
                        return Err(twice("prefetch"));
                    }
                    prefetch = Some(if t == "walk" { PrefetchKind::Walk } else { PrefetchKind::Single });
                }
                "clean-disable" => {
                    if clean_disable {
                        return Err(format!("'{text}': clean-disable given twice"));
                    }
                    clean_disable = true;
                }
                _ => {
                    if sizing.is_some() {
                        return Err(twice("sizing policie"));
                    }
                    build(t, 100, Costs { disk_ns: 1.0, compress_ns: 1.0, decompress_ns: 1.0 }).map_err(
                        |e| {
                            format!(
                                "{e}; or a replacement (segmented, fifo, lru) or prefetch (walk, single), \
                             joined by '+' (shipped = {SHIPPED})"
                            )
                        },
                    )?;
                    sizing = Some(t.to_string());
                }
            }
        }
        if clean_disable && sizing.is_none() {
            return Err(format!("'{text}': clean-disable needs a sizing policy (kaplan+clean-disable)"));
        }
        let replacement = replacement.unwrap_or(match (frontend, prefetch, &sizing) {
            (Frontend::Sim, None, Some(_)) => ReplacementKind::Lru,
            _ => ReplacementKind::Segmented,
        });
        if replacement == ReplacementKind::Lru {
            if frontend == Frontend::Run {
                return Err(format!(
                    "'{text}': lru needs every reference, and `ztier run` sees faults only \
                     (segmented or fifo)"
                ));
            }
            if prefetch.is_some() {
                return Err(format!("'{text}': lru sees every reference: it has no faults to prefetch on"));
            }
        }
        let prefetch = prefetch.unwrap_or(if replacement == ReplacementKind::Lru {
            PrefetchKind::Off
        } else {
            PrefetchKind::Walk
        });
        let sizing = sizing.map(|s| if clean_disable { format!("{s}+clean-disable") } else { s });
        Ok(Spec { text: text.to_string(), replacement, prefetch, sizing })
    }

    /// The parts of a fault-driven spec, for a pager whose budget is
    /// `budget` pages (resident pages, or with a sizing policy resident
    /// pages and the store), over zeroed per-page tables `bits` and
    /// `stamps` of the range it manages; a sequential walk brings in up
    /// to `prefetch` stored pages, and a sizing policy weighs `costs`.
    pub fn parts<B: Slots<u8> + 'static, C: Slots<u32> + 'static>(
        &self,
        budget: usize,
        bits: B,
        stamps: C,
        prefetch: usize,
        costs: Costs,
    ) -> Result<Parts, String> {
        let replacement: Box<dyn Replacement> = match self.replacement {
            ReplacementKind::Segmented => Box::new(Segmented::new(budget, bits, stamps)),
            ReplacementKind::Fifo => Box::new(Fifo::new(bits, stamps)),
            ReplacementKind::Lru => return Err(format!("'{}': lru needs every reference", self.text)),
        };
        let prefetch: Box<dyn Prefetch> = match self.prefetch {
            PrefetchKind::Walk => Box::new(WalkPrefetch::new(prefetch)),
            PrefetchKind::Single | PrefetchKind::Off => Box::new(Single),
        };
        let sizing = match &self.sizing {
            Some(s) => Some(Split::new(build(s, budget, costs)?, budget)),
            None => None,
        };
        Ok(Parts { replacement, prefetch, sizing })
    }

    /// Whether the replacement sees faults only (everything but `lru`).
    pub fn fault_driven(&self) -> bool {
        self.replacement != ReplacementKind::Lru
    }

    /// The replacement's name.
    pub fn replacement_name(&self) -> &'static str {
        match self.replacement {
            ReplacementKind::Segmented => "segmented",
            ReplacementKind::Fifo => "fifo",
            ReplacementKind::Lru => "lru",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> Result<Spec, String> {
        Spec::parse(s, Frontend::Run)
    }
    fn sim(s: &str) -> Result<Spec, String> {
        Spec::parse(s, Frontend::Sim)
    }

    #[test]
    fn parts_come_in_any_order_and_missing_ones_take_their_defaults() {
        let s = run("kaplan+fifo").unwrap();
        assert_eq!(
            (s.replacement, s.prefetch, s.sizing.as_deref()),
            (ReplacementKind::Fifo, PrefetchKind::Walk, Some("kaplan"))
        );
        let s = run("shipped").unwrap();
        assert_eq!(
            (s.replacement, s.prefetch, s.sizing),
            (ReplacementKind::Segmented, PrefetchKind::Walk, None)
        );
        assert_eq!(run("segmented+walk").unwrap().sizing, None);
        // A sizing alone: the shipped replacement live, lru in the simulator.
        assert_eq!(run("static:0.25").unwrap().replacement, ReplacementKind::Segmented);
        let s = sim("static:0.25").unwrap();
        assert_eq!((s.replacement, s.prefetch), (ReplacementKind::Lru, PrefetchKind::Off));
        assert!(!s.fault_driven());
        assert_eq!(sim("single+castro").unwrap().replacement, ReplacementKind::Segmented);
        assert_eq!(sim("shipped+pressure").unwrap().sizing.as_deref(), Some("pressure"));
        let s = sim("kaplan+clean-disable+segmented").unwrap();
        assert_eq!(s.sizing.as_deref(), Some("kaplan+clean-disable"));
        assert_eq!(s.text, "kaplan+clean-disable+segmented");
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let e = run("lru+kaplan").unwrap_err();
        assert!(e.contains("faults only"), "{e}");
        assert!(sim("lru+walk").unwrap_err().contains("no faults to prefetch"));
        assert!(run("fifo+segmented").unwrap_err().contains("two replacements"));
        assert!(run("kaplan+castro").unwrap_err().contains("two sizing"));
        assert!(run("walk+single").unwrap_err().contains("two prefetch"));
        assert!(run("segmented+clean-disable").unwrap_err().contains("needs a sizing"));
        let e = run("segmentd").unwrap_err();
        assert!(e.contains("unknown policy") && e.contains("segmented, fifo"), "{e}");
        assert!(run("").is_err());
    }
}
