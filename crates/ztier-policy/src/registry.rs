//! Policy names: what `ztier sim --policy`, `ztier run --policy` and
//! every other place that takes a policy by name accept, and the
//! policies they build. Kept apart from the trait ([`crate::policy`]) so
//! that the policies' modules, which implement the trait, and this one,
//! which names them, do not import each other.

use crate::policy::{Costs, Policy};

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
