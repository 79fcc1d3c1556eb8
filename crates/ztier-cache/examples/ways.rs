//! Hit ratio of the SSD cache by set width, in process and independent
//! of the machine's load: a 32 MiB cache on a memory device over a
//! memory backing of 1x, 2x, 4x its size (blocks half random, half
//! zeros: ~1.94x with lz4), uniform random 4 KiB requests, reads only
//! or with a share of write-through writes (WRITES, in %: 30 is the
//! bench's 70/30 mix; written blocks are as compressible as the rest).
//! The read hit ratio is measured over the last third of the requests,
//! after two thirds warm the cache (and, in brackets, over the second
//! third: how fast the full cache settles). KEEP: `CacheOptions::recycle_keep`
//! (% of a recycled segment still cached up to which all its lines are
//! copied); copies/fill is what recycling copied per block filled.
//! ZIPF: requests drawn from a zipf distribution of that theta (fio's
//! `--random_distribution=zipf:THETA`, the bench's 0.5) over the blocks
//! in a random order, instead of uniformly (0). LINES: the directory's
//! lines per 4 KiB of segment space (`create --lines-per-block`, 2.0).
//! ADMIT: `all` or `seen` (`serve --admission`); not admitted: fills kept
//! out of the full cache. PICKS: which segment recycling takes
//! (`oldest`, `greedy`, `cost-benefit`: `CacheOptions::recycle_pick`);
//! the lines used and the metadata per cached block are the averages of
//! the measured third (sampled every 1/64 of it). FILE: the backing's
//! blocks are the first WS × 32 MiB of this file instead (an image of
//! real data, e.g. `bench cache --data real`'s ext4 image; `{ws}` in the
//! name is replaced by the working set); writes still write half-random
//! blocks, as fio's 50%-compressible buffers in the bench.
//!
//! ```text
//! cargo run --release -p ztier-cache --example ways [-- CODECS WS WAYS WRITES KEEP ZIPF LINES ADMIT PICKS FILE]
//! cargo run --release -p ztier-cache --example ways -- lz4,raw 1,2,4 8,16,32,64 0,30 50,80
//! cargo run --release -p ztier-cache --example ways -- lz4,raw 4 32 30 80 0.5
//! ```

use std::sync::Arc;

use ztier_blk::backing::CrashBacking;
use ztier_cache::backend::MemBackend;
use ztier_cache::cache::{self, CacheOptions};
use ztier_cache::format::{Geometry, Placement, Policy, BLOCK};
use ztier_cache::{Admission, Cache, Pick};
use ztier_codec::CodecId;

fn rng(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Block numbers drawn uniformly (theta 0) or from a zipf distribution
/// whose ranks are the blocks in a random order.
struct Draw {
    blocks: u64,
    /// Cumulative weights of the ranks (empty: uniform).
    cdf: Vec<f64>,
    order: Vec<u64>,
}

impl Draw {
    fn new(blocks: u64, theta: f64, x: &mut u64) -> Draw {
        if theta == 0.0 {
            return Draw { blocks, cdf: Vec::new(), order: Vec::new() };
        }
        let mut sum = 0.0;
        let cdf = (1..=blocks)
            .map(|r| {
                sum += 1.0 / (r as f64).powf(theta);
                sum
            })
            .collect();
        let mut order: Vec<u64> = (0..blocks).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (rng(x) % (i as u64 + 1)) as usize);
        }
        Draw { blocks, cdf, order }
    }

    fn block(&self, x: &mut u64) -> u64 {
        if self.cdf.is_empty() {
            return rng(x) % self.blocks;
        }
        let total = self.cdf[self.cdf.len() - 1];
        let u = (rng(x) >> 11) as f64 / (1u64 << 53) as f64 * total;
        let r = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
        self.order[r]
    }
}

fn list(arg: Option<String>, default: &str) -> Vec<String> {
    arg.unwrap_or_else(|| default.into()).split(',').map(String::from).collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let codecs = list(args.next(), "lz4,raw");
    let wss = list(args.next(), "1,2,4");
    let wayss = list(args.next(), "8,16,32,64");
    let writess = list(args.next(), "0");
    let keeps = list(args.next(), &cache::RECYCLE_KEEP.to_string());
    let theta: f64 = args.next().map_or(0.0, |z| z.parse().expect("a zipf theta"));
    let lines_per_block: f64 = args.next().map_or(2.0, |z| z.parse().expect("lines per block"));
    let admission: Admission = args.next().map_or(Admission::All, |a| a.parse().expect("all or seen"));
    let picks = list(args.next(), "cost-benefit");
    let file = args.next();
    let size = 32u64 << 20;
    println!(
        "codec  ws  ways  writes  keep  pick          hit    (2nd third)  lines used  conflict evictions  capacity evictions  ratio  metadata B/block  copies/fill  not admitted"
    );
    for codec in &codecs {
        let codec = match codec.as_str() {
            "lz4" => CodecId::Lz4,
            "raw" => CodecId::Raw,
            c => panic!("codec {c}: lz4 or raw"),
        };
        for ws in &wss {
            let ws: u64 = ws.parse().expect("a working set multiple");
            let keeps = &keeps;
            let picks = &picks;
            let points = wayss.iter().flat_map(|w| {
                writess.iter().flat_map(move |p| {
                    keeps.iter().flat_map(move |k| picks.iter().map(move |q| (w, p, k, q)))
                })
            });
            for (ways, writes, keep, pick) in points {
                let pick: Pick = pick.parse().expect("oldest, greedy or cost-benefit");
                let ways: u16 = ways.parse().expect("ways");
                let writes: u64 = writes.parse().expect("a write share in %");
                let keep: u8 = keep.parse().expect("a share in %");
                let sb = Geometry {
                    size,
                    segment_size: 128 << 10,
                    lines_per_block,
                    placement: Placement::Assoc,
                    ways,
                    policy: Policy::Clock,
                    codec: codec as u8,
                    journal_size: None,
                }
                .superblock(cache::random_u64(), 0)
                .expect("a geometry");
                let dev = Arc::new(CrashBacking::new());
                cache::create(&*dev, &sb).expect("creating the cache");
                let blocks = size / BLOCK as u64 * ws;
                let backing = Arc::new(MemBackend::new(blocks * BLOCK as u64));
                let mut x = 7;
                let block = |x: &mut u64| {
                    let mut v: Vec<u8> = (0..BLOCK / 2).map(|_| rng(x) as u8).collect();
                    v.resize(BLOCK, 0);
                    v
                };
                match &file {
                    None => {
                        for b in 0..blocks {
                            backing.poke(b * BLOCK as u64, &block(&mut x));
                        }
                    }
                    Some(f) => {
                        let f = f.replace("{ws}", &ws.to_string());
                        let data = std::fs::read(&f).unwrap_or_else(|e| panic!("reading {f}: {e}"));
                        let n = data.len().min((blocks * BLOCK as u64) as usize);
                        backing.poke(0, &data[..n]);
                    }
                }
                let opts = CacheOptions {
                    pressure: None,
                    sequential_cutoff: 0,
                    seal_after: std::time::Duration::from_millis(50),
                    recycle_keep: keep,
                    recycle_pick: pick,
                    admission,
                    ..CacheOptions::default()
                };
                let c = Cache::open(dev, backing, opts).expect("opening the cache");
                let draw = Draw::new(blocks, theta, &mut x);
                let mut buf = vec![0u8; BLOCK];
                let n = 60_000 * ws;
                let mut mark = (0, 0);
                let mut mark1 = (0, 0);
                let (mut used, mut meta, mut samples) = (0u64, 0.0, 0u64);
                for i in 0..3 * n {
                    if i >= 2 * n && (i - 2 * n) % (n / 64).max(1) == 0 {
                        let s = c.stats();
                        used += s.lines_used;
                        meta += s.metadata_bytes_per_cached_block;
                        samples += 1;
                    }
                    if i % 256 == 0 {
                        c.drain(); // every fill lands: no drop for a full queue
                    }
                    if i == n {
                        let s = c.stats();
                        mark1 = (s.ssd_hits, s.misses);
                    }
                    if i == 2 * n {
                        let s = c.stats();
                        mark = (s.ssd_hits, s.misses);
                    }
                    let off = draw.block(&mut x) * BLOCK as u64;
                    if rng(&mut x) % 100 < writes {
                        c.write(off, &block(&mut x), false).expect("a write");
                    } else {
                        c.read(off, &mut buf).expect("a read");
                    }
                }
                c.drain();
                let s = c.stats();
                let (h, m) = (s.ssd_hits - mark.0, s.misses - mark.1);
                println!(
                    "{:<6} {ws}x {ways:>5}  {writes:>5}%  {keep:>3}%  {:<12}  {:.3}  ({:.3})      {:>5} of {:<5}  {:>18}  {:>18}  {:.2}   {:.2}   {:.2}   {}",
                    format!("{codec:?}").to_lowercase(),
                    format!("{pick:?}").to_lowercase(),
                    h as f64 / (h + m) as f64,
                    (mark.0 - mark1.0) as f64 / ((mark.0 - mark1.0) + (mark.1 - mark1.1)) as f64,
                    used / samples.max(1),
                    s.lines,
                    s.conflict_evictions,
                    s.capacity_evictions,
                    s.ratio,
                    meta / samples.max(1) as f64,
                    s.reinserted as f64 / s.ssd_fills.max(1) as f64,
                    s.fills_not_admitted
                );
            }
        }
    }
}
