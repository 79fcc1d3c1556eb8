//! The measurement behind `ztier bench codecs`.
//!
//! For each codec, on the same pages:
//!
//! * **ratio** — uncompressed bytes / stored bytes, where a page costs its
//!   compressed size, capped at the page size (a page never costs more than
//!   storing it raw);
//! * **compress / decompress MB/s** — 10^6 bytes of *uncompressed* data per
//!   second; each pass runs over every page once, passes repeat until
//!   about `min_seconds` have elapsed (at least `min_passes`), and the
//!   **median** pass is reported (the machines are shared and noisy). The
//!   passes are spread over up to 5 rounds, and in each round every codec
//!   and memcpy take their turn, so that a change in the machine's speed
//!   during the run slows them all alike (with each codec timed in one go,
//!   one after another, WKdm's decompression against LZ4's on
//!   `python-dict.pages` ranged over 0.45–0.77× in five runs of one build
//!   on a shared VM);
//! * **×memcpy** — codec time / time to `memcpy` the same pages page by page
//!   (the CCache paper's Table 2 view);
//! * **histogram** — compressed sizes in the buckets 0–512, 512–1K, 1–2K,
//!   2–3K, 3–4K bytes, and `raw` for pages the codec could not shrink below
//!   the page size (the CCache paper's Figure 7 view);
//! * **stored_raw_pages** — pages the [`crate::page::PageEncoder`] would keep
//!   uncompressed under the default 3/4 threshold.
//!
//! Codecs run as the page store runs them: [`crate::Codec::compress_tagged`]
//! and [`crate::Codec::decompress_tagged`], the codec tag kept beside each
//! page (so hybrid's pages cost their inner codec's bytes, no trailer).
//!
//! Zero and same-filled pages are counted and left out of the codec runs:
//! they never reach a codec ([`crate::samefill`]). Every page is round-tripped
//! and compared with the original; a mismatch is an error, not a number.

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

use crate::corpus::Corpus;
use crate::samefill::{self, Fill};
use crate::{new_codec, Codec, CodecId, PAGE_SIZE};

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Codecs to measure, in report order.
    pub codecs: Vec<CodecId>,
    /// Minimum time per codec and direction, in seconds.
    pub min_seconds: f64,
    /// Minimum passes over the corpus per codec and direction.
    pub min_passes: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig { codecs: CodecId::MEASURED.to_vec(), min_seconds: 0.5, min_passes: 5 }
    }
}

/// Compressed-size histogram; field names are the JSON keys.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Histogram {
    /// Compressed to fewer than 512 bytes.
    #[serde(rename = "0-512")]
    pub b0_512: u64,
    /// 512 to 1023 bytes.
    #[serde(rename = "512-1024")]
    pub b512_1024: u64,
    /// 1024 to 2047 bytes.
    #[serde(rename = "1024-2048")]
    pub b1024_2048: u64,
    /// 2048 to 3071 bytes.
    #[serde(rename = "2048-3072")]
    pub b2048_3072: u64,
    /// 3072 to 4095 bytes.
    #[serde(rename = "3072-4096")]
    pub b3072_4096: u64,
    /// Not smaller than the page.
    pub raw: u64,
}

impl Histogram {
    fn add(&mut self, size: usize, page: usize) {
        // Buckets are for 4 KiB pages; scale other sizes to that.
        let s = size * PAGE_SIZE / page;
        let slot = match s {
            _ if size >= page => &mut self.raw,
            0..=511 => &mut self.b0_512,
            512..=1023 => &mut self.b512_1024,
            1024..=2047 => &mut self.b1024_2048,
            2048..=3071 => &mut self.b2048_3072,
            _ => &mut self.b3072_4096,
        };
        *slot += 1;
    }

    /// The buckets in order, with their labels.
    pub fn buckets(&self) -> [(&'static str, u64); 6] {
        [
            ("0-512", self.b0_512),
            ("512-1024", self.b512_1024),
            ("1024-2048", self.b1024_2048),
            ("2048-3072", self.b2048_3072),
            ("3072-4096", self.b3072_4096),
            ("raw", self.raw),
        ]
    }
}

/// One codec's results. Field names are the JSON keys of DESIGN.md.
#[derive(Debug, Clone, Serialize)]
pub struct CodecReport {
    /// Codec name.
    pub codec: String,
    /// Uncompressed bytes / stored bytes.
    pub ratio: f64,
    /// Compression speed, MB/s of uncompressed data.
    pub compress_mb_s: f64,
    /// Decompression speed, MB/s of uncompressed data.
    pub decompress_mb_s: f64,
    /// Compression time / memcpy time.
    pub compress_vs_memcpy: f64,
    /// Decompression time / memcpy time.
    pub decompress_vs_memcpy: f64,
    /// Compressed-size histogram.
    pub histogram: Histogram,
    /// Pages the page encoder would store raw (3/4 threshold).
    pub stored_raw_pages: u64,
    /// Passes timed in each direction.
    pub passes: usize,
}

/// The whole report (DESIGN.md's `bench codecs` JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where the pages came from.
    pub corpus: Vec<String>,
    /// Pages in the corpus, including zero and same-filled ones.
    pub pages: usize,
    /// All-zero pages (not given to codecs).
    pub zero_pages: usize,
    /// Same-filled, non-zero pages (not given to codecs).
    pub same_filled_pages: usize,
    /// memcpy speed on the codec pages, MB/s.
    pub memcpy_mb_s: f64,
    /// The WKdm kernel measured (wkdm and hybrid run it): the fastest this
    /// build and CPU run, or the one `ZTIER_WKDM_KERNEL` names.
    pub wkdm_kernel: String,
    /// One entry per codec.
    pub codecs: Vec<CodecReport>,
}

/// Why a benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The corpus holds no page a codec has to work on.
    #[error("the corpus has no pages other than zero or same-filled ones")]
    NothingToCompress,
    /// A codec failed to compress a page into a buffer of its own bound.
    #[error("{codec}: compressing page {page} failed: {source}")]
    Compress {
        /// Codec name.
        codec: String,
        /// Page index among the codec pages.
        page: usize,
        /// The codec's error.
        source: crate::CompressError,
    },
    /// A codec failed to decompress its own output.
    #[error("{codec}: decompressing page {page} failed: {source}")]
    Decompress {
        /// Codec name.
        codec: String,
        /// Page index among the codec pages.
        page: usize,
        /// The codec's error.
        source: crate::DecompressError,
    },
    /// A round trip returned different bytes.
    #[error("{codec}: page {page} did not round-trip (first difference at byte {byte})")]
    Mismatch {
        /// Codec name.
        codec: String,
        /// Page index among the codec pages.
        page: usize,
        /// First differing byte.
        byte: usize,
    },
}

/// Rounds the timed passes are spread over. In each round every codec
/// (and memcpy) takes its turn in each direction, so a machine whose speed
/// drifts slows all of them alike instead of whichever ran at the time.
const ROUNDS: usize = 5;

/// Median of a non-empty list of times (at least 1 ns).
fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2].max(1e-9)
}

/// One timed direction of one codec (or memcpy): passes of it run in
/// every round, as many as make its share of `min_seconds` (from a first,
/// untimed pass), and their times are kept.
struct Timed {
    per_round: usize,
    times: Vec<f64>,
}

impl Timed {
    /// `first` is the time of one untimed pass.
    fn new(cfg: &BenchConfig, rounds: usize, first: f64) -> Self {
        let want = cfg.min_seconds / rounds as f64;
        let min = cfg.min_passes.div_ceil(rounds);
        let lo = min.max(1);
        let per_round = ((want / first.max(1e-9)).ceil() as usize).clamp(lo, (1000 / rounds).max(lo));
        Timed { per_round, times: Vec::with_capacity(per_round * rounds) }
    }

    /// This round's passes of `pass`, each timed.
    fn round(&mut self, mut pass: impl FnMut()) {
        for _ in 0..self.per_round {
            let t = Instant::now();
            pass();
            self.times.push(t.elapsed().as_secs_f64());
        }
    }
}

/// Times one pass of `pass`.
fn once(pass: impl FnOnce()) -> f64 {
    let t = Instant::now();
    pass();
    t.elapsed().as_secs_f64()
}

/// A codec, the sizes of its compressed pages and its timings. Its pages
/// live in the one store all codecs share: each compresses into it right
/// before it decompresses from it, so one store's memory is enough.
struct Entry {
    name: String,
    codec: Box<dyn Codec>,
    bound: usize,
    sizes: Vec<usize>,
    tags: Vec<CodecId>,
    compress: Timed,
    decompress: Timed,
}

/// Compresses every page into its slot of `store`, recording the sizes;
/// the first error, with its page.
fn compress_all(
    codec: &mut dyn Codec,
    work: &[&[u8]],
    store: &mut [u8],
    bound: usize,
    sizes: &mut [usize],
    tags: &mut [CodecId],
) -> Result<(), (usize, crate::CompressError)> {
    let mut err = None;
    for (i, (p, slot)) in work.iter().zip(store.chunks_exact_mut(bound)).enumerate() {
        match codec.compress_tagged(p, slot) {
            Ok((n, tag)) => {
                sizes[i] = n;
                tags[i] = tag;
            }
            Err(e) => {
                err.get_or_insert((i, e));
            }
        }
    }
    err.map_or(Ok(()), Err)
}

/// Decompresses every page; the first error, with its page.
fn decompress_all(
    codec: &mut dyn Codec,
    store: &[u8],
    bound: usize,
    sizes: &[usize],
    tags: &[CodecId],
    back: &mut [u8],
) -> Result<(), (usize, crate::DecompressError)> {
    let mut err = None;
    for (i, (n, &tag)) in sizes.iter().zip(tags).enumerate() {
        if let Err(e) = codec.decompress_tagged(tag, black_box(&store[i * bound..i * bound + n]), back) {
            err.get_or_insert((i, e));
        }
        black_box(&mut *back);
    }
    err.map_or(Ok(()), Err)
}

/// Runs the benchmark. `progress` is called with (codec name, step, steps)
/// as work advances, for a progress bar.
pub fn run(
    corpus: &Corpus,
    cfg: &BenchConfig,
    mut progress: impl FnMut(&str, usize, usize),
) -> Result<Report, BenchError> {
    let mut zero = 0;
    let mut same = 0;
    let mut work: Vec<&[u8]> = Vec::with_capacity(corpus.len());
    for p in corpus.pages() {
        match samefill::detect(p) {
            Some(Fill::Zero) => zero += 1,
            Some(Fill::Same(_)) => same += 1,
            None => work.push(p),
        }
    }
    if work.is_empty() {
        return Err(BenchError::NothingToCompress);
    }
    let bytes = (work.len() * PAGE_SIZE) as f64;
    let mb_s = |secs: f64| bytes / secs / 1e6;
    let rounds = ROUNDS.min(cfg.min_passes.max(1));
    let steps = cfg.codecs.len() + rounds;

    // memcpy baseline: page by page into one destination page, as a codec
    // writes one page at a time.
    let mut out = vec![0u8; PAGE_SIZE];
    let copy = |out: &mut Vec<u8>| {
        for p in &work {
            out.copy_from_slice(black_box(p));
            black_box(&mut *out);
        }
    };
    let mut memcpy = Timed::new(cfg, rounds, once(|| copy(&mut out)));

    // Each codec once, untimed: its output, the round-trip check, and the
    // time of a pass in each direction.
    let mut back = vec![0u8; PAGE_SIZE];
    let codecs: Vec<Box<dyn Codec>> = cfg.codecs.iter().map(|&id| new_codec(id)).collect();
    let max_bound = codecs.iter().map(|c| c.max_compressed_len(PAGE_SIZE)).max().unwrap_or(0);
    let mut store = vec![0u8; max_bound * work.len()];
    let mut entries = Vec::new();
    for (ci, mut codec) in codecs.into_iter().enumerate() {
        let name = codec.id().name().to_string();
        let bound = codec.max_compressed_len(PAGE_SIZE);
        let mut sizes = vec![0usize; work.len()];
        let mut tags = vec![codec.id(); work.len()];
        let mut res = Ok(());
        let c1 = once(|| res = compress_all(codec.as_mut(), &work, &mut store, bound, &mut sizes, &mut tags));
        res.map_err(|(page, source)| BenchError::Compress { codec: name.clone(), page, source })?;
        for (i, p) in work.iter().enumerate() {
            let src = &store[i * bound..i * bound + sizes[i]];
            codec.decompress_tagged(tags[i], src, &mut back).map_err(|source| BenchError::Decompress {
                codec: name.clone(),
                page: i,
                source,
            })?;
            if let Some(byte) = back.iter().zip(p.iter()).position(|(a, b)| a != b) {
                return Err(BenchError::Mismatch { codec: name, page: i, byte });
            }
        }
        let mut res = Ok(());
        let d1 = once(|| res = decompress_all(codec.as_mut(), &store, bound, &sizes, &tags, &mut back));
        res.map_err(|(page, source)| BenchError::Decompress { codec: name.clone(), page, source })?;
        progress(&name, ci + 1, steps);
        entries.push(Entry {
            name,
            codec,
            bound,
            sizes,
            tags,
            compress: Timed::new(cfg, rounds, c1),
            decompress: Timed::new(cfg, rounds, d1),
        });
    }

    // The timed passes, every codec in turn in each round. A codec is
    // deterministic, so a compression pass rewrites the same bytes.
    for round in 0..rounds {
        memcpy.round(|| copy(&mut out));
        for e in &mut entries {
            let Entry { codec, bound, sizes, tags, .. } = e;
            let mut cerr = None;
            e.compress.round(|| {
                if let Err(x) = compress_all(codec.as_mut(), &work, &mut store, *bound, sizes, tags) {
                    cerr.get_or_insert(x);
                }
            });
            if let Some((page, source)) = cerr {
                return Err(BenchError::Compress { codec: e.name.clone(), page, source });
            }
            let mut derr = None;
            e.decompress.round(|| {
                if let Err(x) = decompress_all(codec.as_mut(), &store, *bound, sizes, tags, &mut back) {
                    derr.get_or_insert(x);
                }
            });
            if let Some((page, source)) = derr {
                return Err(BenchError::Decompress { codec: e.name.clone(), page, source });
            }
        }
        progress("timing", cfg.codecs.len() + round + 1, steps);
    }

    let memcpy_s = median(memcpy.times);
    let mut reports = Vec::new();
    for e in entries {
        let (c_s, d_s) = (median(e.compress.times.clone()), median(e.decompress.times));
        let passes = e.compress.times.len();
        let mut hist = Histogram::default();
        let mut stored = 0usize;
        let limit = PAGE_SIZE * 3 / 4;
        let mut stored_raw = 0;
        for &n in &e.sizes {
            hist.add(n, PAGE_SIZE);
            stored += n.min(PAGE_SIZE);
            if n > limit {
                stored_raw += 1;
            }
        }
        reports.push(CodecReport {
            codec: e.name,
            ratio: bytes / stored as f64,
            compress_mb_s: mb_s(c_s),
            decompress_mb_s: mb_s(d_s),
            compress_vs_memcpy: c_s / memcpy_s,
            decompress_vs_memcpy: d_s / memcpy_s,
            histogram: hist,
            stored_raw_pages: stored_raw,
            passes,
        });
    }
    Ok(Report {
        corpus: corpus.sources.clone(),
        pages: corpus.len(),
        zero_pages: zero,
        same_filled_pages: same,
        memcpy_mb_s: mb_s(memcpy_s),
        wkdm_kernel: crate::wkdm::Kernel::selected().name().to_string(),
        codecs: reports,
    })
}

/// Renders a report as an aligned, human-readable table.
pub fn render_table(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "corpus: {}\npages: {} ({} zero, {} same-filled; those are stored as metadata only)\nmemcpy: {:.0} MB/s\nwkdm kernel: {}\n",
        r.corpus.join(", "),
        r.pages,
        r.zero_pages,
        r.same_filled_pages,
        r.memcpy_mb_s,
        r.wkdm_kernel
    );
    let _ = writeln!(
        s,
        "{:<8} {:>6} {:>10} {:>10} {:>9} {:>9}   {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "codec",
        "ratio",
        "comp MB/s",
        "dec MB/s",
        "comp×cpy",
        "dec×cpy",
        "<512",
        "<1K",
        "<2K",
        "<3K",
        "<4K",
        "raw"
    );
    for c in &r.codecs {
        let h = &c.histogram;
        let _ = writeln!(
            s,
            "{:<8} {:>6.2} {:>10.0} {:>10.0} {:>9.1} {:>9.1}   {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
            c.codec,
            c.ratio,
            c.compress_mb_s,
            c.decompress_mb_s,
            c.compress_vs_memcpy,
            c.decompress_vs_memcpy,
            h.b0_512,
            h.b512_1024,
            h.b1024_2048,
            h.b2048_3072,
            h.b3072_4096,
            h.raw
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::synth;

    #[test]
    fn report_counts_and_round_trips_synthetic_pages() {
        let mut c = synth::corpus(40, 7);
        // Add 3 zero pages and 2 same-filled pages.
        let mut extra = vec![0u8; 5 * PAGE_SIZE];
        extra[3 * PAGE_SIZE..].fill(0xab);
        let mut data = c.bytes().to_vec();
        data.extend_from_slice(&extra);
        c = Corpus::from_bytes("t", data);
        let cfg = BenchConfig {
            codecs: vec![CodecId::Lz4, CodecId::Zstd, CodecId::Raw],
            min_seconds: 0.0,
            min_passes: 1,
        };
        let r = run(&c, &cfg, |_, _, _| {}).unwrap();
        assert_eq!((r.pages, r.zero_pages, r.same_filled_pages), (45, 3, 2));
        assert_eq!(r.codecs.len(), 3);
        let raw = &r.codecs[2];
        assert!((raw.ratio - 1.0).abs() < 1e-9, "raw ratio {}", raw.ratio);
        assert_eq!(raw.histogram.raw, 40);
        for cr in &r.codecs {
            let total: u64 = cr.histogram.buckets().iter().map(|b| b.1).sum();
            assert_eq!(total, 40, "{}", cr.codec);
        }
        // Random pages (1 in 5) do not compress; the rest do.
        let lz4 = &r.codecs[0];
        assert_eq!(lz4.histogram.raw, 8);
        assert!(lz4.ratio > 1.3, "lz4 ratio {}", lz4.ratio);
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["codecs"][0]["histogram"]["0-512"].is_u64());
        assert!(json["memcpy_mb_s"].as_f64().unwrap() > 0.0);
        assert!(json["wkdm_kernel"].as_str().unwrap().parse::<crate::wkdm::Kernel>().is_ok());
        let table = render_table(&r);
        assert!(table.contains("lz4") && table.contains("zstd"));
    }

    #[test]
    fn passes_are_spread_over_rounds() {
        let cfg = |min_seconds, min_passes| BenchConfig { codecs: vec![], min_seconds, min_passes };
        // 1 s over 5 rounds, a pass of 50 ms: 4 passes a round.
        assert_eq!(Timed::new(&cfg(1.0, 5), 5, 0.05).per_round, 4);
        // At least the minimum passes, spread over the rounds.
        assert_eq!(Timed::new(&cfg(0.0, 12), 5, 0.05).per_round, 3);
        // At most 1000 passes in all; a minimum above that wins.
        assert_eq!(Timed::new(&cfg(10.0, 1), 5, 1e-9).per_round, 200);
        assert_eq!(Timed::new(&cfg(0.0, 2000), 5, 1.0).per_round, 400);
        // The report counts every timed pass, every codec in each round.
        let c = synth::corpus(8, 3);
        let r = run(
            &c,
            &BenchConfig { codecs: vec![CodecId::Lz4, CodecId::Wkdm], min_seconds: 0.0, min_passes: 10 },
            |_, _, _| {},
        )
        .unwrap();
        assert!(r.codecs.iter().all(|c| c.passes == 10), "{:?}", r.codecs);
    }

    #[test]
    fn all_filled_corpus_is_an_error() {
        let c = Corpus::from_bytes("z", vec![0u8; 2 * PAGE_SIZE]);
        assert!(matches!(run(&c, &BenchConfig::default(), |_, _, _| {}), Err(BenchError::NothingToCompress)));
    }
}
