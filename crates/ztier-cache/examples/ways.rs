//! Hit ratio of the SSD cache by set width, in process and independent
//! of the machine's load: a 32 MiB cache on a memory device over a
//! memory backing of 1x, 2x, 4x its size (blocks half random, half
//! zeros: ~1.94x with lz4), uniform random 4 KiB reads. The hit ratio
//! is measured over the last third of the reads, after two thirds warm
//! the cache.
//!
//! ```text
//! cargo run --release -p ztier-cache --example ways [-- CODECS WS WAYS]
//! cargo run --release -p ztier-cache --example ways -- lz4,raw 1,2,4 8,16,32,64
//! ```

use std::sync::Arc;

use ztier_blk::backing::CrashBacking;
use ztier_cache::backend::MemBackend;
use ztier_cache::cache::{self, CacheOptions};
use ztier_cache::format::{Geometry, Placement, Policy, BLOCK};
use ztier_cache::Cache;
use ztier_codec::CodecId;

fn rng(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn list(arg: Option<String>, default: &str) -> Vec<String> {
    arg.unwrap_or_else(|| default.into()).split(',').map(String::from).collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let codecs = list(args.next(), "lz4,raw");
    let wss = list(args.next(), "1,2,4");
    let wayss = list(args.next(), "8,16,32,64");
    let size = 32u64 << 20;
    println!("codec  ws  ways  hit    lines used  conflict evictions  ratio  metadata B/block");
    for codec in &codecs {
        let codec = match codec.as_str() {
            "lz4" => CodecId::Lz4,
            "raw" => CodecId::Raw,
            c => panic!("codec {c}: lz4 or raw"),
        };
        for ws in &wss {
            let ws: u64 = ws.parse().expect("a working set multiple");
            for ways in &wayss {
                let ways: u16 = ways.parse().expect("ways");
                let sb = Geometry {
                    size,
                    segment_size: 128 << 10,
                    lines_per_block: 2.0,
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
                for b in 0..blocks {
                    let mut v: Vec<u8> = (0..BLOCK / 2).map(|_| rng(&mut x) as u8).collect();
                    v.resize(BLOCK, 0);
                    backing.poke(b * BLOCK as u64, &v);
                }
                let opts = CacheOptions {
                    pressure: None,
                    sequential_cutoff: 0,
                    seal_after: std::time::Duration::from_millis(50),
                    ..CacheOptions::default()
                };
                let c = Cache::open(dev, backing, opts).expect("opening the cache");
                let mut buf = vec![0u8; BLOCK];
                let n = 60_000 * ws;
                let mut mark = (0, 0);
                for i in 0..3 * n {
                    if i % 256 == 0 {
                        c.drain(); // every fill lands: no drop for a full queue
                    }
                    if i == 2 * n {
                        let s = c.stats();
                        mark = (s.ssd_hits, s.misses);
                    }
                    c.read(rng(&mut x) % blocks * BLOCK as u64, &mut buf).expect("a read");
                }
                c.drain();
                let s = c.stats();
                let (h, m) = (s.ssd_hits - mark.0, s.misses - mark.1);
                println!(
                    "{:<6} {ws}x {ways:>5}  {:.3}  {:>5} of {:<5}  {:>18}  {:.2}   {:.2}",
                    format!("{codec:?}").to_lowercase(),
                    h as f64 / (h + m) as f64,
                    s.lines_used,
                    s.lines,
                    s.conflict_evictions,
                    s.ratio,
                    s.metadata_bytes_per_cached_block
                );
            }
        }
    }
}
