//! The trace-driven simulator: replay a page trace through a memory of M
//! pages split by a policy into an uncompressed and a compressed region.
//!
//! # Model (Wilson, Kaplan & Smaragdakis 1999, §4)
//!
//! Memory is one LRU stack. Its top `u` pages are uncompressed (`u` ≤
//! U = M − C, C being the policy's target for the compressed region, in
//! pages); the next K pages are held compressed, K being as many as fit in
//! C × 4096 bytes at their compressed sizes; deeper pages are on the
//! backing store. A reference at stack depth d:
//!
//! ```text
//!   d ≤ u             hit             no cost
//!   u < d ≤ u + K     compressed hit  decompress the page
//!   otherwise         fault           disk_ms
//! ```
//!
//! Either miss puts the page on top; when that pushes `u` above U the page
//! at depth U + 1 is compressed into the region (a compression), and the
//! region's deepest pages go to the backing store while it holds more than
//! C × 4096 bytes. When the policy shrinks U, pages are compressed until
//! `u` ≤ U; when it grows U, later misses fill the room. Paging time =
//! disk_ms × faults + compressions × compress cost + decompressions ×
//! decompress cost, with the codec costs measured when the trace was
//! recorded. Write-backs of dirty pages to the backing store are not
//! charged (as in the 1999 study's main results); the compressed region's
//! allocator overhead is not modelled (see `ztier bench store` for it).
//!
//! Policies that treat clean pages apart (`+clean-disable`, de Castro
//! §2.3.4) may have a clean page — read from the backing store and not
//! written since, by the trace's load/store flags — dropped instead of
//! compressed when it leaves the uncompressed region. The compressed
//! region is then not one segment of the stack: it is kept as its own
//! FIFO (pages enter it in stack order, so its oldest page is its deepest)
//! and a reference below the uncompressed region hits compressed only if
//! the page is in it. Without clean drops this is exactly the segment
//! model above (a test checks it against a naive two-list LRU).
//!
//! A page's compressed size is its latest compression record in the trace;
//! pages without any record yet take the mean of all the trace's records
//! for the codec, and such compressions are counted (`unsized_compressions`).

use std::collections::VecDeque;
use std::fs::File;
use std::hash::BuildHasherDefault;
use std::io::BufReader;
use std::path::Path;
use std::time::Instant;

use hashbrown::HashMap;
use serde::Serialize;
use ztier_codec::CodecId;
use ztier_policy::kaplan::Kaplan;
use ztier_policy::recency::{PageHasher, Recency};
use ztier_policy::{Costs, Frontend, Outcome, Reference, Spec};

use crate::pager::{self, Layout, PagerOptions};
use crate::trace::{Event, TraceReader};

type PageMap<V> = HashMap<u64, V, BuildHasherDefault<PageHasher>>;

pub use crate::replay::{summarize, Counts, SimError, TraceSummary};

/// One replay of `path` through a memory of `memory_pages` pages under
/// `policy` (built from its name), with `costs` given to the policy.
/// Returns the counts and the references per second achieved.
pub fn replay(
    path: &Path,
    summary: &TraceSummary,
    memory_pages: usize,
    policy: &str,
    costs: Costs,
) -> Result<(Counts, f64), SimError> {
    let spec = Spec::parse(policy, Frontend::Sim).map_err(SimError::Policy)?;
    if spec.fault_driven() {
        let layout = Layout::of_trace(path)?;
        return pager::replay(path, summary, &layout, memory_pages, &spec, costs, PagerOptions::default());
    }
    replay_lru(path, summary, memory_pages, &spec, costs)
}

/// [`replay`] of an `lru` spec (the 1999 model).
fn replay_lru(
    path: &Path,
    summary: &TraceSummary,
    memory_pages: usize,
    spec: &Spec,
    costs: Costs,
) -> Result<(Counts, f64), SimError> {
    let m = memory_pages.max(2);
    // No sizing: the compressed region is beside the memory, unbounded
    // (every page pushed out is kept compressed).
    let beside = spec.sizing.is_none();
    let mut pol =
        ztier_policy::build(spec.sizing.as_deref().unwrap_or("none"), m, costs).map_err(SimError::Policy)?;
    let interest = pol.interest_depth();
    let tracks_clean = pol.tracks_clean();
    let mut rec = Recency::new(Kaplan::reach(m) + 1);
    let mut sizes: PageMap<u16> = PageMap::default();
    // The compressed region: page → (size, stamp), and its pages oldest
    // first; a FIFO entry whose stamp differs from the map's is stale.
    let mut region: PageMap<(u16, u64)> = PageMap::default();
    let mut fifo: VecDeque<(u64, u64)> = VecDeque::new();
    let mut stamp = 0u64;
    // Pages written since they were last read from the backing store
    // (kept only for policies that treat clean pages apart).
    let mut dirty: PageMap<()> = PageMap::default();
    let (mut u, mut bytes) = (0usize, 0usize);
    let mut c = Counts::default();
    let mut target_sum = 0f64;
    let mut misses = 0u64;
    let mut t = TraceReader::new(BufReader::with_capacity(1 << 20, File::open(path)?))?;
    let col = summary.column;
    // Evicts the oldest compressed page; false if the region is empty.
    let evict_oldest = |region: &mut PageMap<(u16, u64)>,
                        fifo: &mut VecDeque<(u64, u64)>,
                        bytes: &mut usize,
                        dirty: &PageMap<()>,
                        pol: &mut Box<dyn ztier_policy::Policy>|
     -> bool {
        while let Some((p, st)) = fifo.pop_front() {
            if let Some(&(size, cur)) = region.get(&p) {
                if cur == st {
                    region.remove(&p);
                    *bytes -= size as usize;
                    if tracks_clean && !dirty.contains_key(&p) {
                        pol.clean_dropped(p, true, region.len());
                    }
                    return true;
                }
            }
        }
        false
    };
    let start = Instant::now();
    while let Some(e) = t.next_event()? {
        let (page, write) = match e {
            Event::Sizes { page, sizes: s } => {
                sizes.insert(page, s[col]);
                continue;
            }
            // The 1999 model pages all of a program's memory.
            // The 1999 model keeps every page it has seen.
            Event::Unmanaged { .. } | Event::Released { .. } => continue,
            Event::Ref { page, write } => (page, write),
        };
        c.references += 1;
        let d = rec.access(page);
        if d.is_some_and(|d| d > u) {
            c.store_faults += 1;
        }
        let outcome = match d {
            Some(d) if d <= u => Outcome::Hit,
            // Beyond the uncompressed region: compressed if the region has it
            // (with clean pages dropped the region is not one stack segment).
            _ if region.contains_key(&page) => Outcome::CompressedHit,
            _ => Outcome::Fault,
        };
        if d.is_none_or(|d| d > interest) {
            let size = sizes.get(&page).copied().unwrap_or(summary.mean_size);
            pol.reference(&Reference { depth: d, outcome, size });
        }
        if outcome == Outcome::Hit {
            if tracks_clean && write {
                dirty.insert(page, ());
            }
            continue;
        }
        match outcome {
            Outcome::CompressedHit => {
                c.compressed_hits += 1;
                c.decompressions += 1;
                let (size, _) = region.remove(&page).expect("a compressed hit is in the region");
                bytes -= size as usize;
                if tracks_clean && !dirty.contains_key(&page) {
                    pol.clean_reclaimed();
                }
            }
            _ => {
                c.disk_faults += 1;
                if tracks_clean {
                    dirty.remove(&page);
                    pol.faulted(page);
                }
            }
        }
        if tracks_clean && write {
            dirty.insert(page, ());
        }
        u += 1;
        let target = if beside { usize::MAX } else { pol.target().min(m - 1) };
        target_sum += if beside { 0.0 } else { target as f64 };
        misses += 1;
        let cap_u = if beside { m } else { m - target };
        if target == 0 {
            // No compressed region: it empties, and the page pushed out of
            // memory goes to the backing store uncompressed.
            while evict_oldest(&mut region, &mut fifo, &mut bytes, &dirty, &mut pol) {}
            fifo.clear();
            u = u.min(cap_u);
            continue;
        }
        // Compress from the bottom of the uncompressed region down to U
        // (or drop clean pages, when the policy says so).
        while u > cap_u {
            let p = rec.page_at(u).expect("depth within the stack");
            u -= 1;
            if tracks_clean && !pol.compress_clean() && !dirty.contains_key(&p) {
                pol.clean_dropped(p, false, region.len());
                continue;
            }
            let s = match sizes.get(&p) {
                Some(&s) => s,
                None => {
                    c.unsized_compressions += 1;
                    summary.mean_size
                }
            };
            stamp += 1;
            region.insert(p, (s, stamp));
            fifo.push_back((p, stamp));
            bytes += s as usize;
            c.compressions += 1;
            pol.compressed(s);
        }
        // The region's oldest pages go to the backing store.
        let cap_bytes = target.saturating_mul(4096);
        while bytes > cap_bytes {
            evict_oldest(&mut region, &mut fifo, &mut bytes, &dirty, &mut pol);
        }
        if fifo.len() > 4 * region.len() + 64 {
            fifo.retain(|(p, st)| region.get(p).is_some_and(|&(_, cur)| cur == *st));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    c.mean_target_pages = if misses == 0 { 0.0 } else { target_sum / misses as f64 };
    Ok((c.clone(), c.references as f64 / secs.max(1e-9)))
}

/// One result row (DESIGN.md's fields plus counts).
#[derive(Debug, Clone, Serialize)]
pub struct SimRow {
    /// Memory size in 4 KiB pages.
    pub memory_pages: usize,
    /// Policy as given.
    pub policy: String,
    /// Disk cost per fault, ms.
    pub disk_ms: f64,
    /// Faults.
    pub disk_faults: u64,
    /// Compressed hits.
    pub compressed_hits: u64,
    /// Compressions.
    pub compressions: u64,
    /// Decompressions.
    pub decompressions: u64,
    /// disk_ms × faults + codec costs, in seconds.
    pub paging_time_s: f64,
    /// paging time / `none`'s at the same memory and disk cost.
    pub normalized: f64,
    /// Compressions of pages without a compression record yet.
    pub unsized_compressions: u64,
    /// Mean compressed-region target over misses, pages.
    pub mean_target_pages: f64,
    /// Faults on evicted pages (see [`Counts::store_faults`]): what
    /// `ztier run --stats` reports as `store_faults`, for a fault-driven
    /// policy.
    pub store_faults: u64,
    /// Victims of the background evictor taken back by a write before
    /// they left memory (fault-driven policies; `ztier run --stats`'
    /// `taken_back`): `ztier run` counts no fault for those.
    pub taken_back: u64,
    /// Page-ins of a fault-driven pager (0 for `lru`).
    pub faults: u64,
    /// Zero faults of a fault-driven pager (0 for `lru`).
    pub zero_faults: u64,
    /// Pages brought in by prefetch besides the faulting ones.
    pub prefetched: u64,
    /// Pages a fault evicted itself for want of room (`ztier run
    /// --stats`' `evicted_inline`; all of them with `--no-background`);
    /// 0 for `lru`.
    pub evicted_inline: u64,
    /// Share of `none`'s run time spent on non-compulsory paging at this
    /// memory size and disk cost (see [`paging_share`]).
    pub none_paging_share: f64,
    /// Whether this memory size is in the interesting range at this disk
    /// cost: `none` spends between 1% and 90% of its time paging.
    pub interesting: bool,
}

/// Share of the run time that `none` spends on paging beyond the
/// compulsory faults (the first touch of every page, the same under every
/// policy): `excess / (excess + references × ref_ns)`. The run time
/// without paging is estimated at `ref_ns` per traced data reference
/// (default 1 ns: about three instructions per data reference at one
/// instruction per cycle and 3 GHz) — the trace holds no native timing.
/// The 1999 study's interesting range runs from about 90% paging time
/// down to little paging; here "little" is 1%.
pub fn paging_share(
    none_time_s: f64,
    faults_compulsory: u64,
    disk_ms: f64,
    references: u64,
    ref_ns: f64,
) -> f64 {
    let excess = (none_time_s - faults_compulsory as f64 * disk_ms / 1e3).max(0.0);
    let compute = references as f64 * ref_ns / 1e9;
    if excess + compute <= 0.0 {
        0.0
    } else {
        excess / (excess + compute)
    }
}

/// Bounds of the interesting range, as shares of run time spent paging.
pub const INTERESTING: std::ops::RangeInclusive<f64> = 0.01..=0.90;

/// Paging time in seconds for `counts` at `disk_ms`.
pub fn paging_time(c: &Counts, disk_ms: f64, s: &TraceSummary) -> f64 {
    c.disk_faults as f64 * disk_ms / 1e3
        + c.compressions as f64 * s.compress_ns / 1e9
        + c.decompressions as f64 * s.decompress_ns / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{CodecColumn, TraceWriter};

    fn write_trace(path: &Path, refs: &[u64], size: u16) {
        let refs: Vec<(u64, bool)> = refs.iter().map(|&p| (p, false)).collect();
        write_trace_rw(path, &refs, size)
    }

    fn write_trace_rw(path: &Path, refs: &[(u64, bool)], size: u16) {
        let cols = [CodecColumn { codec: CodecId::Lz4, compress_ns: 10_000, decompress_ns: 2_000 }];
        let mut w = TraceWriter::new(std::io::BufWriter::new(File::create(path).unwrap()), &cols).unwrap();
        let mut seen = std::collections::HashSet::new();
        for &(p, write) in refs {
            if seen.insert(p) {
                w.sizes(p, &[size]).unwrap();
            }
            w.reference(p, write).unwrap();
        }
        w.finish().unwrap();
    }

    fn costs() -> Costs {
        Costs { disk_ns: 5e6, compress_ns: 10_000.0, decompress_ns: 2_000.0 }
    }

    /// The naive model of the same thing: an LRU list of uncompressed
    /// pages and an LRU list of compressed ones, fixed sizes.
    fn naive(refs: &[u64], m: usize, c: usize, size: usize) -> Counts {
        let mut unc: Vec<u64> = Vec::new();
        let mut comp: Vec<u64> = Vec::new();
        let mut out = Counts::default();
        let u_cap = m - c;
        let k_cap = if c == 0 { 0 } else { c * 4096 / size };
        for &p in refs {
            out.references += 1;
            if let Some(i) = unc.iter().position(|&x| x == p) {
                unc.remove(i);
                unc.insert(0, p);
                continue;
            }
            if let Some(i) = comp.iter().position(|&x| x == p) {
                comp.remove(i);
                out.compressed_hits += 1;
                out.decompressions += 1;
            } else {
                out.disk_faults += 1;
            }
            unc.insert(0, p);
            while unc.len() > u_cap {
                let q = unc.pop().unwrap();
                if c > 0 {
                    comp.insert(0, q);
                    out.compressions += 1;
                }
            }
            comp.truncate(k_cap);
        }
        out
    }

    #[test]
    fn replay_matches_a_naive_two_list_model() {
        let dir = std::env::temp_dir().join(format!("ztier-sim-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.trace");
        let mut x = 12345u64;
        let refs: Vec<u64> = (0..30_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                (u * u * 400.0) as u64
            })
            .collect();
        write_trace(&path, &refs, 1024);
        let s = summarize(&path, CodecId::Lz4).unwrap();
        assert_eq!(s.mean_size, 1024);
        for (m, policy, c) in
            [(100, "none", 0), (100, "static:0.25", 25), (150, "static:0.5", 75), (50, "static:0.1", 5)]
        {
            let (got, _) = replay(&path, &s, m, policy, costs()).unwrap();
            let want = naive(&refs, m, c, 1024);
            assert_eq!(
                (got.disk_faults, got.compressed_hits, got.compressions, got.decompressions),
                (want.disk_faults, want.compressed_hits, want.compressions, want.decompressions),
                "{policy} at {m} pages"
            );
        }
        assert!(matches!(summarize(&path, CodecId::Wkdm), Err(SimError::Unusable(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// de Castro §2.3.4 in the replay: a read-only scan (clean pages never
    /// read again) pushes a written working set out of the compressed
    /// region; `clean-disable` stops compressing the scan and the working
    /// set stays compressed. A clean working set that is read back keeps
    /// compression on.
    #[test]
    fn clean_disable_keeps_a_scan_out_of_the_compressed_region() {
        let dir = std::env::temp_dir().join(format!("ztier-sim-clean-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("scan.trace");
        let mut refs = Vec::new();
        let mut scan = 1_000_000u64;
        for i in 0..20_000u64 {
            refs.push((i % 120, true)); // working set, written
            for _ in 0..2 {
                refs.push((scan, false)); // streamed, read once
                scan += 1;
            }
        }
        write_trace_rw(&path, &refs, 1024);
        let s = summarize(&path, CodecId::Lz4).unwrap();
        let (plain, _) = replay(&path, &s, 100, "static:0.5", costs()).unwrap();
        let (cd, _) = replay(&path, &s, 100, "static:0.5+clean-disable", costs()).unwrap();
        let scanned = scan - 1_000_000;
        assert!(plain.disk_faults > scanned + 10_000, "the scan should evict the working set: {plain:?}");
        assert!(cd.disk_faults < scanned + 1_000, "{cd:?}");
        assert!(cd.compressions < plain.compressions / 2, "{cd:?} vs {plain:?}");
        assert!(cd.compressed_hits > 19_000, "{cd:?}");

        // Clean pages read back from the compressed region: keep compressing.
        let path = dir.join("clean.trace");
        let refs: Vec<(u64, bool)> = (0..40_000u64).map(|i| (i % 150, false)).collect();
        write_trace_rw(&path, &refs, 1024);
        let s = summarize(&path, CodecId::Lz4).unwrap();
        let (plain, _) = replay(&path, &s, 100, "static:0.5", costs()).unwrap();
        let (cd, _) = replay(&path, &s, 100, "static:0.5+clean-disable", costs()).unwrap();
        assert_eq!(plain.disk_faults, 150, "{plain:?}");
        assert!(cd.disk_faults <= plain.disk_faults + 200, "{cd:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A sweep over memory sizes, policies and disk costs.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// Memory sizes in pages.
    pub memory_pages: Vec<usize>,
    /// Policy names as given (`none`, `static:0.25`, `kaplan`).
    pub policies: Vec<String>,
    /// Disk costs per fault, ms.
    pub disk_ms: Vec<f64>,
    /// Codec column.
    pub codec: CodecId,
    /// Replays run in parallel.
    pub threads: usize,
    /// Estimated run time per data reference without paging, ns (for the
    /// interesting range; see [`paging_share`]).
    pub ref_ns: f64,
    /// Settings of the model of `ztier run`'s pager (fault-driven policies).
    pub pager: PagerOptions,
}

/// The result of a sweep (DESIGN.md's JSON plus context).
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// Trace file.
    pub trace: String,
    /// References in the trace.
    pub references: u64,
    /// Footprint in pages.
    pub distinct_pages: u64,
    /// Mean references per second of the replays (one core each).
    pub refs_per_s: f64,
    /// Mean references per second of the `kaplan` replays (0 if none ran).
    pub kaplan_refs_per_s: f64,
    /// Codec.
    pub codec: String,
    /// Its measured costs per page.
    pub compress_ns: f64,
    /// Decompress cost per page.
    pub decompress_ns: f64,
    /// Mean compressed size of the trace's records.
    pub mean_compressed_size: u16,
    /// One row per memory size × policy × disk cost.
    pub results: Vec<SimRow>,
    /// Adaptive policies over the interesting sizes, per disk cost.
    pub summaries: Vec<PolicySummary>,
}

/// Whether a policy's counts do not depend on the disk cost (no sizing
/// policy, or a fixed one).
fn disk_independent(policy: &str) -> bool {
    Spec::parse(policy, Frontend::Sim)
        .map(|s| s.sizing.as_deref().is_none_or(|z| z == "none" || z.starts_with("static:")))
        .unwrap_or(false)
}

/// Whether a policy is one of the fixed sizes adaptive ones are measured
/// against: `none` or `static:F` over `lru` (the 1999 model).
fn baseline(policy: &str) -> bool {
    Spec::parse(policy, Frontend::Sim).is_ok_and(|s| {
        !s.fault_driven() && s.sizing.as_deref().is_some_and(|z| z == "none" || z.starts_with("static:"))
    })
}

/// Runs every replay of the sweep; `progress(done, total)` after each.
pub fn sweep(
    path: &Path,
    cfg: &SweepConfig,
    progress: impl Fn(usize, usize) + Sync,
) -> Result<SweepReport, SimError> {
    if cfg.memory_pages.is_empty() || cfg.policies.is_empty() || cfg.disk_ms.is_empty() {
        return Err(SimError::Unusable("give at least one memory size, policy and disk cost".into()));
    }
    let mut specs = Vec::new();
    for p in &cfg.policies {
        specs.push(Spec::parse(p, Frontend::Sim).map_err(SimError::Policy)?);
    }
    if let Some(&d) = cfg.disk_ms.iter().find(|&&d| !(d > 0.0 && d.is_finite())) {
        return Err(SimError::Unusable(format!("disk cost {d} ms: must be a positive number")));
    }
    if !(cfg.ref_ns > 0.0 && cfg.ref_ns.is_finite()) {
        return Err(SimError::Unusable(format!("--ref-ns {}: must be a positive number", cfg.ref_ns)));
    }
    if let Some(&m) = cfg.memory_pages.iter().find(|&&m| m < 2) {
        return Err(SimError::Unusable(format!("memory of {m} pages: at least 2 pages")));
    }
    let s = summarize(path, cfg.codec)?;
    // Fault-driven policies need the trace's layout: found once.
    let layout = if specs.iter().any(Spec::fault_driven) { Some(Layout::of_trace(path)?) } else { None };
    let mut policies = cfg.policies.clone();
    if !policies.iter().any(|p| p == "none") {
        policies.insert(0, "none".into());
    }
    // Jobs: (memory, policy, disk index or None when the counts do not depend on it).
    let mut jobs: Vec<(usize, String, Option<usize>)> = Vec::new();
    for &m in &cfg.memory_pages {
        for p in &policies {
            if disk_independent(p) {
                jobs.push((m, p.clone(), None));
            } else {
                for d in 0..cfg.disk_ms.len() {
                    jobs.push((m, p.clone(), Some(d)));
                }
            }
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    type Out = Result<(Counts, f64), SimError>;
    let results: Vec<std::sync::Mutex<Option<Out>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..cfg.threads.clamp(1, jobs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((m, p, d)) = jobs.get(i) else { break };
                let disk = cfg.disk_ms[d.unwrap_or(0)];
                let costs =
                    Costs { disk_ns: disk * 1e6, compress_ns: s.compress_ns, decompress_ns: s.decompress_ns };
                let r = match Spec::parse(p, Frontend::Sim) {
                    Ok(spec) if spec.fault_driven() => pager::replay(
                        path,
                        &s,
                        layout.as_ref().expect("a layout for fault-driven policies"),
                        *m,
                        &spec,
                        costs,
                        cfg.pager,
                    ),
                    Ok(spec) => replay_lru(path, &s, *m, &spec, costs),
                    Err(e) => Err(SimError::Policy(e)),
                };
                *results[i].lock().expect("result slot") = Some(r);
                progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1, jobs.len());
            });
        }
    });
    let mut counts = Vec::with_capacity(jobs.len());
    for r in results {
        counts.push(r.into_inner().expect("result slot").expect("every job ran")?);
    }
    let find = |m: usize, p: &str, d: usize| -> &(Counts, f64) {
        let i = jobs
            .iter()
            .position(|(jm, jp, jd)| *jm == m && jp == p && jd.is_none_or(|x| x == d))
            .expect("job for every combination");
        &counts[i]
    };
    let mut rows = Vec::new();
    for &m in &cfg.memory_pages {
        for (di, &disk) in cfg.disk_ms.iter().enumerate() {
            let base = paging_time(&find(m, "none", di).0, disk, &s);
            let share = paging_share(base, s.distinct_pages, disk, s.references, cfg.ref_ns);
            for p in &cfg.policies {
                let c = &find(m, p, di).0;
                let t = paging_time(c, disk, &s);
                rows.push(SimRow {
                    memory_pages: m,
                    policy: p.clone(),
                    disk_ms: disk,
                    disk_faults: c.disk_faults,
                    compressed_hits: c.compressed_hits,
                    compressions: c.compressions,
                    decompressions: c.decompressions,
                    paging_time_s: t,
                    normalized: if base > 0.0 {
                        t / base
                    } else if t > 0.0 {
                        f64::INFINITY
                    } else {
                        1.0
                    },
                    unsized_compressions: c.unsized_compressions,
                    mean_target_pages: c.mean_target_pages,
                    store_faults: c.store_faults,
                    taken_back: c.taken_back,
                    faults: c.faults,
                    zero_faults: c.zero_faults,
                    prefetched: c.prefetched,
                    evicted_inline: c.evicted_inline,
                    none_paging_share: share,
                    interesting: INTERESTING.contains(&share),
                });
            }
        }
    }
    let mean = |it: Vec<f64>| if it.is_empty() { 0.0 } else { it.iter().sum::<f64>() / it.len() as f64 };
    let refs_per_s = mean(counts.iter().map(|c| c.1).collect());
    let kaplan_refs_per_s =
        mean(jobs.iter().zip(&counts).filter(|(j, _)| j.1 == "kaplan").map(|(_, c)| c.1).collect());
    let mut report = SweepReport {
        trace: path.display().to_string(),
        references: s.references,
        distinct_pages: s.distinct_pages,
        refs_per_s,
        kaplan_refs_per_s,
        codec: cfg.codec.name().to_string(),
        compress_ns: s.compress_ns,
        decompress_ns: s.decompress_ns,
        mean_compressed_size: s.mean_size,
        results: rows,
        summaries: Vec::new(),
    };
    report.summaries = disk_costs(&report).into_iter().flat_map(|d| summarize_policies(&report, d)).collect();
    Ok(report)
}

/// How an adaptive policy fared over the interesting sizes at one disk cost.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    /// Policy as given.
    pub policy: String,
    /// Disk cost, ms.
    pub disk_ms: f64,
    /// Memory sizes in the interesting range.
    pub interesting_sizes: usize,
    /// Largest normalized paging time over them (1 = as good as `none`).
    pub worst_vs_none: f64,
    /// Sizes where the policy is within 10% of the best fixed size given
    /// (`static:*` and `none`).
    pub within_10pct_of_best_static: usize,
    /// All memory sizes simulated.
    pub all_sizes: usize,
    /// [`Self::worst_vs_none`] over all sizes.
    pub all_worst_vs_none: f64,
    /// [`Self::within_10pct_of_best_static`] over all sizes.
    pub all_within_10pct_of_best_static: usize,
}

/// One [`PolicySummary`] per policy but the fixed sizes over `lru`
/// (`none`, `static:*`), which are what the others are measured against.
pub fn summarize_policies(r: &SweepReport, disk_ms: f64) -> Vec<PolicySummary> {
    let rows: Vec<&SimRow> = r.results.iter().filter(|x| x.disk_ms == disk_ms).collect();
    let mut out: Vec<PolicySummary> = Vec::new();
    for x in &rows {
        if baseline(&x.policy) {
            continue;
        }
        let best = rows
            .iter()
            .filter(|y| y.memory_pages == x.memory_pages && baseline(&y.policy))
            .map(|y| y.normalized)
            .fold(1.0f64, f64::min);
        let i = match out.iter().position(|s| s.policy == x.policy) {
            Some(i) => i,
            None => {
                out.push(PolicySummary {
                    policy: x.policy.clone(),
                    disk_ms,
                    interesting_sizes: 0,
                    worst_vs_none: 0.0,
                    within_10pct_of_best_static: 0,
                    all_sizes: 0,
                    all_worst_vs_none: 0.0,
                    all_within_10pct_of_best_static: 0,
                });
                out.len() - 1
            }
        };
        let s = &mut out[i];
        let good = usize::from(x.normalized <= best * 1.1);
        s.all_sizes += 1;
        s.all_worst_vs_none = s.all_worst_vs_none.max(x.normalized);
        s.all_within_10pct_of_best_static += good;
        if x.interesting {
            s.interesting_sizes += 1;
            s.worst_vs_none = s.worst_vs_none.max(x.normalized);
            s.within_10pct_of_best_static += good;
        }
    }
    out
}

/// The disk costs of a report, in the order given.
pub fn disk_costs(r: &SweepReport) -> Vec<f64> {
    let mut disks: Vec<f64> = Vec::new();
    for x in &r.results {
        if !disks.contains(&x.disk_ms) {
            disks.push(x.disk_ms);
        }
    }
    disks
}

/// A fixed-width table of a sweep, one block per disk cost.
pub fn render_table(r: &SweepReport) -> String {
    let mut out = format!(
        "{}: {} references, {} distinct pages; codec {} ({:.0} ns compress, {:.0} ns decompress per page, mean {} B)\n",
        r.trace, r.references, r.distinct_pages, r.codec, r.compress_ns, r.decompress_ns, r.mean_compressed_size
    );
    for d in disk_costs(r) {
        out += &format!(
            "\ndisk {d} ms\n{:>8} {:>6} {:<22} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}\n",
            "memory",
            "paging",
            "policy",
            "faults",
            "comp.hits",
            "store flt",
            "compress",
            "paging s",
            "normalized"
        );
        for x in r.results.iter().filter(|x| x.disk_ms == d) {
            out += &format!(
                "{:>8} {:>5.0}%{} {:<22} {:>10} {:>10} {:>10} {:>10} {:>12.4} {:>10.3}\n",
                x.memory_pages,
                x.none_paging_share * 100.0,
                if x.interesting { ' ' } else { '-' },
                x.policy,
                x.disk_faults,
                x.compressed_hits,
                x.store_faults,
                x.compressions,
                x.paging_time_s,
                x.normalized
            );
        }
        for sm in summarize_policies(r, d) {
            out += &format!(
                "{}: worst {:.3} × none over the {} interesting sizes ({:.3} over all {}); within 10% of the best \
                 static size (or none) at {}/{} interesting sizes ({}/{} of all)\n",
                sm.policy,
                sm.worst_vs_none,
                sm.interesting_sizes,
                sm.all_worst_vs_none,
                sm.all_sizes,
                sm.within_10pct_of_best_static,
                sm.interesting_sizes,
                sm.all_within_10pct_of_best_static,
                sm.all_sizes
            );
        }
    }
    if r.results.iter().any(|x| !x.interesting) {
        out += "\n\"paging\" = share of no-compression run time spent on non-compulsory paging (run time \
                estimated at --ref-ns per reference); '-' marks sizes outside the interesting range (1%..90%)\n";
    }
    out += &format!("\nreplay speed: {:.1} M references/s per core", r.refs_per_s / 1e6);
    if r.kaplan_refs_per_s > 0.0 {
        out += &format!(" (kaplan: {:.1} M/s)", r.kaplan_refs_per_s / 1e6);
    }
    out.push('\n');
    out
}
