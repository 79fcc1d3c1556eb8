//! The measurement behind `ztier bench store`.
//!
//! For one allocator, on the pages of a corpus, with a budget below what
//! the pages need (by default half their compressed size):
//!
//! 1. **fill** — every key is put once, in order (key k holds corpus page
//!    k mod pages; `scale` keys per page make a bigger store from a small
//!    corpus), into an ephemeral pool that keeps poorly compressible pages
//!    raw. The store goes past its budget and evicts.
//! 2. **pairs** — the cost the issue names: for every corpus page, a put of
//!    that page under a fresh key (the store is full, so each put also
//!    evicts) followed by a get of it, timed against the page codec alone
//!    encoding and decoding the same page (same-fill detection included).
//!    Three alternating passes; the median of each side is reported as
//!    `pair_ops_s` and `codec_pair_ops_s`.
//! 3. **mixed** — a skewed random workload over the corpus keys: 50% gets,
//!    45% puts (overwrites with another corpus page's content), 5%
//!    flushes; key = ⌊n·u³⌋ for uniform u (the hottest 10% of keys take
//!    46% of the operations). `put_ops_s` and `get_ops_s` are per-operation
//!    rates of puts and of gets that hit; the same workload on `threads`
//!    threads gives the aggregate `mixed_ops_s_n` against `mixed_ops_s_1`.
//! 4. **steady state** — after the workload: pages stored, bytes, memory
//!    used (everything), metadata and fragmentation; then one full
//!    compaction is timed.
//!
//! Every get that hits is compared with the page last put under its key;
//! a mismatch is an error, not a number.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use serde::Serialize;
use ztier_codec::corpus::Corpus;
use ztier_codec::page::PageEncoder;
use ztier_codec::{CodecId, PAGE_SIZE};

use crate::alloc::AllocatorKind;
use crate::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig, StoreError};

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct StoreBenchConfig {
    /// The allocator.
    pub allocator: AllocatorKind,
    /// The page codec.
    pub codec: CodecId,
    /// Store budget in bytes; `None` = half the corpus's compressed size.
    pub budget: Option<usize>,
    /// Threads for the scaling run.
    pub threads: usize,
    /// Operations of the mixed workload, per run (split over threads).
    pub mixed_ops: usize,
    /// Shards of the store (`None` = the store's default).
    pub shards: Option<usize>,
    /// Keys per corpus page: the key space is `scale` × pages, key k
    /// starting with page k mod pages (a larger store from a small corpus).
    pub scale: usize,
}

impl StoreBenchConfig {
    /// Defaults: LZ4, budget from the corpus, 2 threads, 4 × pages ops.
    pub fn new(allocator: AllocatorKind) -> Self {
        StoreBenchConfig {
            allocator,
            codec: CodecId::Lz4,
            budget: None,
            threads: 2,
            mixed_ops: 0,
            shards: None,
            scale: 1,
        }
    }
}

/// One result; field names are the JSON keys (DESIGN.md's plus more).
#[derive(Debug, Clone, Serialize)]
pub struct StoreReport {
    /// Where the pages came from.
    pub corpus: String,
    /// Allocator name (`cells2`, `chunks`, `classes`).
    pub allocator: String,
    /// Codec name.
    pub codec: String,
    /// Budget in bytes.
    pub budget: u64,
    /// Pages in the corpus.
    pub corpus_pages: u64,
    /// Keys of the workload (corpus pages × scale).
    pub keys: u64,
    /// Pages held at steady state.
    pub pages_stored: u64,
    /// Their uncompressed bytes.
    pub orig_bytes: u64,
    /// Their stored bytes.
    pub compressed_bytes: u64,
    /// All memory the store uses.
    pub memory_used_bytes: u64,
    /// Of which metadata (entries, tables, allocator metadata).
    pub metadata_bytes: u64,
    /// metadata_bytes / pages_stored.
    pub metadata_bytes_per_page: f64,
    /// Allocator bytes holding neither data nor metadata, / memory used.
    pub fragmentation: f64,
    /// (memory used − store entry metadata) / compressed bytes: the
    /// allocator's own overhead, zsmalloc-style.
    pub allocator_overhead: f64,
    /// memory used / compressed bytes: every overhead.
    pub memory_over_compressed: f64,
    /// orig_bytes / memory_used_bytes.
    pub effective_ratio: f64,
    /// Puts per second (mixed workload, 1 thread).
    pub put_ops_s: f64,
    /// Gets that hit, per second (mixed workload, 1 thread).
    pub get_ops_s: f64,
    /// Fraction of mixed-workload gets that hit.
    pub get_hit_ratio: f64,
    /// put+get pairs per second on a full store (median pass).
    pub pair_ops_s: f64,
    /// encode+decode pairs per second, the codec alone on the same pages.
    pub codec_pair_ops_s: f64,
    /// pair_ops_s / codec_pair_ops_s (target ≥ 0.8).
    pub store_vs_codec: f64,
    /// Mixed workload operations per second, 1 thread.
    pub mixed_ops_s_1: f64,
    /// Mixed workload operations per second, `threads` threads.
    pub mixed_ops_s_n: f64,
    /// Threads of the scaling run.
    pub threads: usize,
    /// Entries evicted during the whole run.
    pub evictions: u64,
    /// Compactions the store ran by itself.
    pub compactions: u64,
    /// Time of those, in milliseconds.
    pub compaction_ms: f64,
    /// Time of one full compaction at the end, in milliseconds.
    pub final_compaction_ms: f64,
    /// Bytes it released.
    pub final_compaction_freed: u64,
}

/// Benchmark errors.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The corpus has no pages.
    #[error("the corpus is empty")]
    EmptyCorpus,
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A get returned different bytes than were put.
    #[error("page {0} read back different from what was stored")]
    Mismatch(u64),
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Compressed size of the corpus under `codec` (same-fill and raw rules
/// as in the store).
pub fn compressed_size(corpus: &Corpus, codec: CodecId) -> usize {
    let mut enc = PageEncoder::new(codec);
    let mut buf = vec![0u8; PAGE_SIZE];
    corpus.pages().map(|p| enc.encode(p, &mut buf).map_or(PAGE_SIZE, |e| e.len)).sum()
}

#[derive(Default)]
struct Mixed {
    puts: u64,
    put_ns: u64,
    gets: u64,
    hits: u64,
    hit_ns: u64,
    ops: u64,
}

/// The mixed workload for `ops` operations as thread `me` of `threads`.
struct Workload<'a> {
    store: &'a Store,
    pool: u32,
    corpus: &'a Corpus,
    /// The corpus page last put under each key. Only the thread that owns
    /// a key (k % threads) writes it, so it can check its reads exactly.
    content: &'a [AtomicU32],
}

fn mixed(w: &Workload<'_>, ops: usize, seed: u64, me: usize, threads: usize) -> Result<Mixed, BenchError> {
    let (store, pool, corpus) = (w.store, w.pool, w.corpus);
    let n = w.content.len();
    let mut m = Mixed::default();
    let mut rng = Rng(seed | 1);
    let mut out = vec![0u8; PAGE_SIZE];
    for _ in 0..ops {
        let u = rng.unit();
        let mut k = ((u * u * u) * n as f64) as usize % n;
        let r = rng.next() % 100;
        if (50..95).contains(&r) {
            // Writes go to this thread's own keys so that reads can check them.
            k = k - k % threads + me;
            if k >= n {
                k -= threads;
            }
        }
        let key = Key { pool, object: 0, index: k as u32 };
        if r < 50 {
            let t = Instant::now();
            let hit = store.get(key, &mut out, false)?;
            let ns = t.elapsed().as_nanos() as u64;
            m.gets += 1;
            if hit {
                m.hits += 1;
                m.hit_ns += ns;
                if k % threads == me && out != corpus.page(w.content[k].load(Ordering::Relaxed) as usize) {
                    return Err(BenchError::Mismatch(k as u64));
                }
            }
        } else if r < 95 {
            let src = (k + 1 + (rng.next() % 64) as usize * 61) % corpus.len();
            let t = Instant::now();
            store.put(key, corpus.page(src), PutFlags::default())?;
            m.put_ns += t.elapsed().as_nanos() as u64;
            m.puts += 1;
            w.content[k].store(src as u32, Ordering::Relaxed);
        } else {
            store.flush_page(key)?;
        }
        m.ops += 1;
    }
    Ok(m)
}

/// Runs the benchmark for one allocator on `corpus`. `progress` is called
/// with a phase name.
pub fn run(
    corpus: &Corpus,
    cfg: &StoreBenchConfig,
    mut progress: impl FnMut(&str),
) -> Result<StoreReport, BenchError> {
    if corpus.is_empty() {
        return Err(BenchError::EmptyCorpus);
    }
    let n = corpus.len();
    let scale = cfg.scale.max(1);
    let keys = n * scale;
    let budget = cfg.budget.unwrap_or_else(|| (compressed_size(corpus, cfg.codec) * scale / 2).max(1 << 20));
    let mut sc = StoreConfig { allocator: cfg.allocator, codec: cfg.codec, ..StoreConfig::new(budget) };
    if let Some(s) = cfg.shards {
        sc.shards = s;
    }
    let store = Store::new(sc);
    let pool = store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Ephemeral) })?;

    progress("fill");
    for k in 0..keys {
        store.put(Key { pool, object: 0, index: k as u32 }, corpus.page(k % n), PutFlags::default())?;
    }

    progress("pairs");
    let mut enc = PageEncoder::new(cfg.codec);
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut out = vec![0u8; PAGE_SIZE];
    let (mut codec_rates, mut store_rates) = (Vec::new(), Vec::new());
    for pass in 0..3u64 {
        let t = Instant::now();
        for (i, p) in corpus.pages().enumerate() {
            let e = enc.encode(p, &mut buf).expect("page encodes");
            enc.decode(e.form, &buf[..e.len], &mut out).expect("page decodes");
            // The same check as the store side makes.
            if out != p {
                return Err(BenchError::Mismatch(i as u64));
            }
        }
        codec_rates.push(n as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for (i, p) in corpus.pages().enumerate() {
            let key = Key { pool, object: 1 + pass, index: i as u32 };
            store.put(key, p, PutFlags::default())?;
            if !store.get(key, &mut out, false)? || out != p {
                return Err(BenchError::Mismatch(i as u64));
            }
        }
        store_rates.push(n as f64 / t.elapsed().as_secs_f64());
        store.flush_object(pool, 1 + pass)?;
    }
    let (codec_pair_ops_s, pair_ops_s) = (median(codec_rates), median(store_rates));

    progress("mixed");
    let ops = if cfg.mixed_ops == 0 { (4 * keys).max(20_000) } else { cfg.mixed_ops };
    let content: Vec<AtomicU32> = (0..keys).map(|k| AtomicU32::new((k % n) as u32)).collect();
    let w = Workload { store: &store, pool, corpus, content: &content };
    let t = Instant::now();
    let one = mixed(&w, ops, 0x5eed, 0, 1)?;
    let mixed_ops_s_1 = one.ops as f64 / t.elapsed().as_secs_f64();

    progress("threads");
    let threads = cfg.threads.clamp(1, keys);
    let t = Instant::now();
    let results: Vec<Result<Mixed, BenchError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|me| {
                let w = &w;
                s.spawn(move || mixed(w, ops / threads, 0x1234 + me as u64 * 77, me, threads))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    let secs = t.elapsed().as_secs_f64();
    let mut total = 0;
    for r in results {
        total += r?.ops;
    }
    let mixed_ops_s_n = total as f64 / secs;

    progress("compact");
    let s = store.stats();
    let t = Instant::now();
    let freed = store.compact();
    let final_compaction_ms = t.elapsed().as_secs_f64() * 1e3;

    let entry_meta = s.metadata_bytes.saturating_sub(s.allocator_metadata_bytes);
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Ok(StoreReport {
        corpus: corpus.sources.join(" + "),
        allocator: cfg.allocator.name(),
        codec: cfg.codec.name().to_string(),
        budget: budget as u64,
        corpus_pages: n as u64,
        keys: keys as u64,
        pages_stored: s.pages,
        orig_bytes: s.orig_bytes,
        compressed_bytes: s.compressed_bytes,
        memory_used_bytes: s.memory_used,
        metadata_bytes: s.metadata_bytes,
        metadata_bytes_per_page: ratio(s.metadata_bytes, s.pages),
        fragmentation: ratio(s.fragmentation_bytes, s.memory_used),
        allocator_overhead: ratio(s.memory_used - entry_meta, s.compressed_bytes),
        memory_over_compressed: ratio(s.memory_used, s.compressed_bytes),
        effective_ratio: s.effective_ratio(),
        put_ops_s: one.puts as f64 / (one.put_ns as f64 / 1e9),
        get_ops_s: one.hits as f64 / (one.hit_ns as f64 / 1e9),
        get_hit_ratio: ratio(one.hits, one.gets),
        pair_ops_s,
        codec_pair_ops_s,
        store_vs_codec: pair_ops_s / codec_pair_ops_s,
        mixed_ops_s_1,
        mixed_ops_s_n,
        threads,
        evictions: s.evicted_dropped + s.evicted_to_tier,
        compactions: s.compactions,
        compaction_ms: s.compaction_ns as f64 / 1e6,
        final_compaction_ms,
        final_compaction_freed: freed as u64,
    })
}

/// A fixed-width comparison table of reports (the de Castro cell1/cell2/
/// cell4 view, plus chunks and classes).
pub fn render_table(reports: &[StoreReport]) -> String {
    let mut s = String::new();
    let mut last = "";
    for r in reports {
        if r.corpus != last {
            last = &r.corpus;
            s += &format!(
                "\n{} — {} pages, {} keys, codec {}, budget {:.1} MiB\n",
                r.corpus,
                r.corpus_pages,
                r.keys,
                r.codec,
                r.budget as f64 / (1 << 20) as f64
            );
            s += &format!(
                "{:<9} {:>6} {:>7} {:>7} {:>7} {:>6} {:>6} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8}\n",
                "allocator",
                "pages",
                "eff.rat",
                "mem/cmp",
                "alloc/c",
                "meta/p",
                "frag%",
                "put/s",
                "get/s",
                "vs.cod",
                "mixed1/s",
                "mixedN/s",
                "cmpct.ms"
            );
        }
        s += &format!(
            "{:<9} {:>6} {:>7.3} {:>7.3} {:>7.3} {:>6.1} {:>6.2} {:>9.0} {:>9.0} {:>7.2} {:>9.0} {:>9.0} {:>8.2}\n",
            r.allocator,
            r.pages_stored,
            r.effective_ratio,
            r.memory_over_compressed,
            r.allocator_overhead,
            r.metadata_bytes_per_page,
            r.fragmentation * 100.0,
            r.put_ops_s,
            r.get_ops_s,
            r.store_vs_codec,
            r.mixed_ops_s_1,
            r.mixed_ops_s_n,
            r.final_compaction_ms
        );
    }
    s
}
