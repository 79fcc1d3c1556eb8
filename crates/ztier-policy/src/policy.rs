//! The policy interface: a state machine fed references, answering how
//! much memory the compressed region should take.
//!
//! The simulator and the live frontends call it the same way: for every
//! reference deeper in the LRU stack than [`Policy::interest_depth`] (the
//! others cannot change any decision) they pass a [`Reference`], and after
//! every reference that was not a plain hit they read [`Policy::target`]
//! and resize the compressed region towards it.

/// Where a reference landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// In the uncompressed region.
    Hit,
    /// In the compressed region: decompressed (and another page compressed).
    CompressedHit,
    /// Not in memory: read from the backing store.
    Fault,
}

/// One reference as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    /// LRU stack depth before the reference (1 = most recent), `None` for
    /// a page not seen (or forgotten) before.
    pub depth: Option<usize>,
    /// What happened.
    pub outcome: Outcome,
    /// Compressed size of the page's content in bytes (current estimate).
    pub size: u16,
}

/// Costs the policy weighs, per page.
#[derive(Debug, Clone, Copy)]
pub struct Costs {
    /// Reading a page from the backing store (a fault), ns.
    pub disk_ns: f64,
    /// Compressing a page, ns.
    pub compress_ns: f64,
    /// Decompressing a page, ns.
    pub decompress_ns: f64,
}

/// A sizing policy.
pub trait Policy: Send {
    /// The name as given on the command line (`static:0.25`).
    fn name(&self) -> String;
    /// References at or above this depth are not passed (they cannot
    /// change the policy's view); `usize::MAX` = none are needed.
    fn interest_depth(&self) -> usize;
    /// Feeds one reference.
    fn reference(&mut self, r: &Reference);
    /// Pages of memory the compressed region should take now.
    fn target(&self) -> usize;

    /// A page was compressed into the region at `size` bytes (the
    /// compressibility of what the region really holds).
    fn compressed(&mut self, _size: u16) {}

    /// Whether the policy wants the clean-page events below (the caller
    /// then tracks which pages are clean: read from the backing store and
    /// not written since).
    fn tracks_clean(&self) -> bool {
        false
    }
    /// Whether a clean page leaving uncompressed memory is compressed
    /// (`true`) or dropped (its backing-store copy is valid).
    fn compress_clean(&self) -> bool {
        true
    }
    /// A clean page was read back from the compressed region.
    fn clean_reclaimed(&mut self) {}
    /// A clean page left memory: evicted unread from the compressed region
    /// (`was_compressed`), or dropped instead of compressed because
    /// [`Policy::compress_clean`] said no. `region_pages` = pages the
    /// compressed region holds now.
    fn clean_dropped(&mut self, _page: u64, _was_compressed: bool, _region_pages: usize) {}
    /// A page was read from the backing store (tracking policies only).
    fn faulted(&mut self, _page: u64) {}
}

/// The policies [`build`] knows by a plain name, in the order help texts
/// list them (besides `static:FRACTION`, and any of them followed by
/// `+clean-disable`).
pub const NAMES: [&str; 6] = ["none", "kaplan", "castro", "castro-aggressive", "castro-sluggish", "pressure"];

/// Builds a policy from its command-line name for a memory of
/// `memory_pages` pages: one of [`NAMES`], or `static:FRACTION`.
///
/// `POLICY+clean-disable` wraps any of them in
/// [`crate::clean_disable::CleanDisable`].
pub fn build(spec: &str, memory_pages: usize, costs: Costs) -> Result<Box<dyn Policy>, String> {
    if let Some(inner) = spec.strip_suffix("+clean-disable") {
        if inner.ends_with("+clean-disable") {
            return Err(format!("'{spec}': clean-disable given twice"));
        }
        return Ok(Box::new(crate::clean_disable::CleanDisable::new(build(inner, memory_pages, costs)?)));
    }
    match spec {
        "none" => Ok(Box::new(crate::none::NoCompression)),
        "kaplan" => Ok(Box::new(crate::kaplan::Kaplan::new(memory_pages, costs))),
        "castro" => Ok(Box::new(crate::castro::Castro::new(memory_pages))),
        "castro-aggressive" => Ok(Box::new(crate::castro::Castro::aggressive(memory_pages))),
        "castro-sluggish" => Ok(Box::new(crate::castro::Castro::sluggish(memory_pages))),
        "pressure" => Ok(Box::new(crate::pressure::Pressure::new(memory_pages, costs))),
        _ => {
            if let Some(f) = spec.strip_prefix("static:") {
                let f: f64 = f.parse().map_err(|_| format!("bad fraction in '{spec}' (e.g. static:0.25)"))?;
                if !(0.0..1.0).contains(&f) {
                    return Err(format!("'{spec}': the compressed fraction must be in [0, 1)"));
                }
                return Ok(Box::new(crate::static_size::Static::new(spec.to_string(), f, memory_pages)));
            }
            Err(format!(
                "unknown policy '{spec}' ({}, static:FRACTION; any of them followed by +clean-disable)",
                NAMES.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COSTS: Costs = Costs { disk_ns: 5e6, compress_ns: 10_000.0, decompress_ns: 2_000.0 };

    /// Every plain name builds the policy of that name, alone and wrapped
    /// in clean-disable; the name comes back as given.
    #[test]
    fn every_named_policy_builds_alone_and_with_clean_disable() {
        for n in NAMES.iter().copied().chain(["static:0.25"]) {
            assert_eq!(build(n, 1000, COSTS).unwrap().name(), n);
            let cd = format!("{n}+clean-disable");
            let p = build(&cd, 1000, COSTS).unwrap();
            assert_eq!(p.name(), cd);
            assert!(p.tracks_clean(), "{cd}");
        }
    }

    /// Unknown names, bad fractions and a doubled suffix are errors that
    /// say what is accepted.
    #[test]
    fn bad_names_are_errors_that_list_the_names() {
        let e = build("castro-lazy", 1000, COSTS).err().unwrap();
        assert!(e.contains("unknown policy 'castro-lazy'"), "{e}");
        for n in NAMES {
            assert!(e.contains(n), "{e} lacks {n}");
        }
        assert!(build("static:1", 1000, COSTS).err().unwrap().contains("[0, 1)"));
        assert!(build("static:x", 1000, COSTS).err().unwrap().contains("bad fraction"));
        assert!(build("castro+clean-disable+clean-disable", 1000, COSTS).err().unwrap().contains("twice"));
    }
}
