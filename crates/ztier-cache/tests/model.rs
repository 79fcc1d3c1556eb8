//! The cache against a model of the backing's contents: random reads,
//! writes (whole and partial blocks), flushes, trims, zeroing,
//! maintenance, checkpoints and crashes of three kinds (clean stop, a
//! killed process, a power loss with torn writes), over every placement,
//! the raw and a compressing codec, with and without the RAM cache, in
//! the three write modes. Every read must equal the model: no stale
//! block, ever. In write-back, a crash may lose what was written since the
//! last flush (NBD's promise): after one, each block written since must
//! read as the flushed version or one written after it, and the backing
//! must equal the model once every dirty block is written back. Small
//! caches, so lines are evicted and segments recycled all the time.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use ztier_blk::backing::CrashBacking;
use ztier_cache::backend::MemBackend;
use ztier_cache::format::{Placement, Policy};
use ztier_cache::{Admission, Cache, Mode, Pick};
use ztier_codec::CodecId;

#[path = "model/block40.rs"]
mod block40;
#[path = "model/wb71.rs"]
mod wb71;

/// Blocks of the backing (4 MiB); the cache holds ~1 MiB of them raw.
const BLOCKS: u64 = 1024;

#[derive(Debug, Clone)]
enum Op {
    Read {
        block: u64,
        n: u64,
        skew: u64,
    },
    Write {
        block: u64,
        n: u64,
        seed: u64,
        kind: u8,
        skew: u64,
    },
    Trim {
        block: u64,
        n: u64,
    },
    Zero {
        block: u64,
        n: u64,
    },
    Flush,
    Drain,
    Maintain,
    Checkpoint,
    /// 0: clean stop, 1: killed process, 2: power loss.
    Crash {
        kind: u8,
        keep: u64,
    },
}

fn hot_block() -> impl Strategy<Value = u64> {
    // Skewed: most ops on a working set a little larger than the cache.
    prop_oneof![4 => 0..400u64, 1 => 0..BLOCKS]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (hot_block(), 1..4u64, 0..3u64).prop_map(|(block, n, skew)| Op::Read { block, n, skew }),
        20 => (hot_block(), 1..4u64, any::<u64>(), 0..5u8, 0..4u64)
            .prop_map(|(block, n, seed, kind, skew)| Op::Write { block, n, seed, kind, skew }),
        2 => (hot_block(), 1..40u64).prop_map(|(block, n)| Op::Trim { block, n }),
        2 => (hot_block(), 1..40u64).prop_map(|(block, n)| Op::Zero { block, n }),
        2 => Just(Op::Flush),
        6 => Just(Op::Drain),
        3 => Just(Op::Maintain),
        1 => Just(Op::Checkpoint),
        2 => (0..3u8, any::<u64>()).prop_map(|(kind, keep)| Op::Crash { kind, keep }),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Config {
    direct: bool,
    policy_lru: bool,
    raw: bool,
    ram: bool,
    around: bool,
    /// Write-back (instead of `around`'s mode).
    back: bool,
    sync: bool,
    /// `Admission::Seen`.
    seen: bool,
}

fn config() -> impl Strategy<Value = Config> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(direct, policy_lru, raw, ram, around, sync, seen, back)| Config {
            direct,
            policy_lru,
            raw,
            ram,
            around: around && !back,
            back,
            sync,
            seen,
        })
}

fn check(cache: &Cache, model: &[u8], off: u64, len: usize, what: &str) {
    let mut got = vec![0u8; len];
    // The server's two ways: at once when cached, else the ordinary read
    // with its fills left to this thread (run after the next op: see `run_with`).
    match cache.read_fast(off, &mut got) {
        Some(r) => r.unwrap(),
        None => cache.read_deferring_fills(off, &mut got).unwrap(),
    }
    let want = &model[off as usize..off as usize + len];
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: stale or wrong data at byte {} (block {})",
            off as usize + first,
            (off as usize + first) / B
        );
    }
}

/// What a run saw, to check the run exercised what it should.
#[derive(Debug, Default)]
struct Seen {
    ssd_hits: u64,
    ram_hits: u64,
    recycled: u64,
    reinserted: u64,
    warm_restarts: u64,
    lines_reloaded: u64,
    invalidated_at_recovery: u64,
    races: u64,
    dirty_writes: u64,
    written_back: u64,
    dirty_reloaded: u64,
}

fn add(seen: &mut Seen, s: &ztier_cache::CacheStats) {
    seen.ssd_hits += s.ssd_hits;
    seen.ram_hits += s.ram_hits;
    seen.recycled += s.log.recycled;
    seen.reinserted += s.reinserted;
    seen.races += s.fills_dropped_race;
    seen.dirty_writes += s.dirty_writes;
    seen.written_back += s.written_back;
}

fn run(cfg: Config, ops: Vec<Op>) -> Seen {
    run_with(cfg, ztier_cache::cache::RECYCLE_PICK, ops)
}

fn run_with(cfg: Config, pick: Pick, ops: Vec<Op>) -> Seen {
    let mut seen = Seen::default();
    let shape = Shape {
        placement: if cfg.direct { Placement::Direct } else { Placement::Assoc },
        ways: if cfg.direct { 1 } else { 4 },
        policy: if cfg.policy_lru { Policy::Lru } else { Policy::Clock },
        codec: if cfg.raw { CodecId::Raw } else { CodecId::Lz4 },
        // Small enough to fill (free segments are not recycled), so
        // segments are recycled in every configuration: write-around
        // caches only what reads missed (text, ~4x with lz4).
        size: match (cfg.around, cfg.raw) {
            (true, false) => 320 << 10,
            (true, true) => 640 << 10,
            (false, _) => 1 << 20,
        },
        ..Shape::default()
    };
    let backing = Arc::new(MemBackend::new(BLOCKS * B as u64));
    let mut model = vec![0u8; (BLOCKS * B as u64) as usize];
    let o = || ztier_cache::CacheOptions {
        ram_cache: if cfg.ram { 256 << 10 } else { 0 },
        mode: match (cfg.back, cfg.around) {
            (true, _) => Mode::Writeback,
            (false, true) => Mode::Writearound,
            (false, false) => Mode::Writethrough,
        },
        journal_sync: cfg.sync,
        sequential_cutoff: 64 << 10,
        admission: if cfg.seen { Admission::Seen } else { Admission::All },
        recycle_pick: pick,
        ..opts()
    };
    let mut dev = shape.device();
    let mut cache = open(dev.clone(), backing.clone(), o());
    let mut boot = 1u8;
    // Write-back: for each block changed since the last flush, the
    // versions a crash may leave (the flushed one first).
    let mut pending: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
    for (i, op) in ops.into_iter().enumerate() {
        let what = format!("op {i} {op:?} ({cfg:?})");
        // The fills a read left run after the next op when it changes
        // blocks (a write of the block may come between, as on a server),
        // else before it (a read leaves its own; a drain waits for them).
        let late = !matches!(op, Op::Read { .. } | Op::Drain | Op::Crash { .. });
        if !late {
            cache.run_deferred_fills();
        }
        match op {
            Op::Read { block, n, skew } => {
                let n = n.min(BLOCKS - block);
                let off = block * B as u64 + skew * 100;
                let len = (n * B as u64).saturating_sub(skew * 200).max(1) as usize;
                let len = len.min((BLOCKS * B as u64 - off) as usize);
                check(&cache, &model, off, len, &what);
            }
            Op::Write { block, n, seed, kind, skew } => {
                let n = n.min(BLOCKS - block);
                let mut data = Vec::new();
                for k in 0..n {
                    data.extend(block_data(seed + k, kind));
                }
                // skew 3: a partial write inside the first block.
                let (off, data) = if skew == 3 {
                    (block * B as u64 + 777, data[..1000].to_vec())
                } else {
                    (block * B as u64, data)
                };
                let fua = seed % 5 == 0;
                // The server's two ways: at once when it needs no waiting.
                match cache.write_fast(off, &data, fua) {
                    Some(r) => r.unwrap(),
                    None => cache.write(off, &data, fua).unwrap(),
                }
                changed(&mut pending, &mut model, off, &data, fua);
            }
            Op::Trim { block, n } => {
                let n = n.min(BLOCKS - block);
                cache.trim(block * B as u64, n * B as u64, false).unwrap();
                changed(&mut pending, &mut model, block * B as u64, &vec![0u8; n as usize * B], false);
            }
            Op::Zero { block, n } => {
                let n = n.min(BLOCKS - block);
                cache.write_zeroes(block * B as u64, n * B as u64, false, false).unwrap();
                changed(&mut pending, &mut model, block * B as u64, &vec![0u8; n as usize * B], false);
            }
            Op::Flush => {
                cache.flush().unwrap();
                pending.clear();
            }
            Op::Drain => cache.drain(),
            Op::Maintain => cache.maintain(),
            Op::Checkpoint => cache.checkpoint().unwrap(),
            Op::Crash { kind, keep } => {
                add(&mut seen, &cache.stats());
                let img = match kind {
                    0 => {
                        cache.drain();
                        cache.close().unwrap();
                        dev.image()
                    }
                    1 => {
                        cache.abandon();
                        dev.image()
                    }
                    _ => {
                        cache.abandon();
                        boot += 1;
                        let mut x = keep | 1;
                        dev.crash(|_, sectors| match rng(&mut x) % 4 {
                            0 => 0,
                            1 => (rng(&mut x) as usize) % (sectors + 1),
                            _ => sectors,
                        })
                    }
                };
                drop(cache);
                dev = Arc::new(CrashBacking::from_image(img));
                let oo = ztier_cache::CacheOptions { boot_id: Some([boot; 16]), ..o() };
                cache = open(dev.clone(), backing.clone(), oo);
                let r = cache.recovery();
                if r.kind != "cold" {
                    seen.warm_restarts += 1;
                    seen.lines_reloaded += r.lines_loaded;
                    seen.invalidated_at_recovery += r.lines_invalidated;
                }
                if kind == 2 && !cfg.sync && !cfg.back {
                    assert_eq!(r.kind, "cold", "{what}: {r:?}");
                }
                if kind == 0 {
                    assert_eq!(r.kind, "clean", "{what}: {r:?}");
                }
                seen.dirty_reloaded += r.lines_dirty;
                if cfg.back {
                    // Never cold: dirty blocks would be lost.
                    assert_ne!(r.kind, "cold", "{what}: {r:?}");
                }
                if cfg.back && kind != 0 {
                    // What was written since the last flush may be lost,
                    // block by block: the flushed version or a later one.
                    let mut blocks: Vec<u64> = pending.keys().copied().collect();
                    blocks.sort_unstable();
                    for b in blocks {
                        let mut got = vec![0u8; B];
                        cache.read(b * B as u64, &mut got).unwrap();
                        assert!(
                            pending[&b].contains(&got),
                            "{what}: block {b} after the crash is neither its flushed version nor a later one"
                        );
                        model[(b * B as u64) as usize..((b + 1) * B as u64) as usize].copy_from_slice(&got);
                    }
                    // What was read is what the model expects from now on.
                    cache.flush().unwrap();
                }
                pending.clear();
            }
        }
        assert_eq!(backing.contents().len(), model.len());
        if late {
            cache.run_deferred_fills();
        }
    }
    cache.run_deferred_fills();
    cache.drain();
    // Everything, block by block, then the backing itself.
    for b in 0..BLOCKS {
        check(&cache, &model, b * B as u64, B, "final sweep");
    }
    if cfg.back {
        cache.write_back_all().unwrap();
        assert_eq!(cache.stats().dirty_blocks, 0);
    }
    assert!(backing.contents() == model, "the backing differs from the model");
    let s = cache.stats();
    assert_eq!(s.errors, 0, "{s:?}");
    add(&mut seen, &s);
    seen
}

fn blk(m: &[u8], b: u64) -> Vec<u8> {
    m[(b * B as u64) as usize..((b + 1) * B as u64) as usize].to_vec()
}

/// `bytes` written at `off` in the model; `pending` keeps the versions a
/// write-back crash may leave of each block (none once `durable`).
fn changed(pending: &mut HashMap<u64, Vec<Vec<u8>>>, m: &mut [u8], off: u64, bytes: &[u8], durable: bool) {
    let (first, last) = (off / B as u64, (off + bytes.len() as u64).div_ceil(B as u64));
    for b in first..last {
        pending.entry(b).or_insert_with(|| vec![blk(m, b)]);
    }
    m[off as usize..off as usize + bytes.len()].copy_from_slice(bytes);
    for b in first..last {
        if durable {
            pending.remove(&b);
        } else {
            pending.get_mut(&b).expect("just added").push(blk(m, b));
        }
    }
}

fn block_data(seed: u64, kind: u8) -> Vec<u8> {
    block(seed, kind)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn never_stale(cfg in config(), ops in prop::collection::vec(op(), 1..300)) {
        run(Config { back: false, ..cfg }, ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Write-back under random operations.
    #[test]
    fn never_stale_write_back(cfg in config(), ops in prop::collection::vec(op(), 1..300)) {
        run(Config { back: true, around: false, ..cfg }, ops);
    }
}

/// A long deterministic run of each configuration (more recycling and
/// journal wraps than the random cases reach).
#[test]
fn long_runs_of_each_configuration() {
    // 8..12: write-back.
    for bits in 0..12u8 {
        let back = bits >= 8;
        let cfg = Config {
            direct: bits & 1 != 0,
            policy_lru: bits & 2 != 0,
            raw: if back { bits >= 10 } else { bits & 4 != 0 },
            ram: bits & 1 == 0,
            around: bits & 2 == 0 && !back,
            back,
            sync: bits & 4 == 0,
            seen: bits % 3 == 1,
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ bits as u64;
        let mut ops = Vec::new();
        for i in 0..6000u64 {
            let r = rng(&mut x);
            let block = if r % 5 == 0 { r % BLOCKS } else { r % 400 };
            if i % 250 == 249 {
                ops.push(Op::Crash { kind: ((i / 250) % 3) as u8, keep: r });
                continue;
            }
            ops.push(match r % 100 {
                0..=49 => Op::Read { block, n: 1 + r % 3, skew: 0 },
                50..=84 => Op::Write { block, n: 1 + r % 3, seed: r, kind: (r >> 8) as u8, skew: r % 4 },
                85..=86 => Op::Trim { block, n: 1 + r % 16 },
                87..=88 => Op::Zero { block, n: 1 + r % 16 },
                89..=95 => Op::Drain,
                96..=97 => Op::Maintain,
                98 => Op::Checkpoint,
                _ => Op::Flush,
            });
        }
        let seen = run(cfg, ops);
        // The run did what it is for: hits from the SSD cache, segments
        // recycled, warm restarts that reloaded lines and dropped some
        // the journal said were stale.
        assert!(seen.ssd_hits > 500, "{cfg:?}: {seen:?}");
        assert!(seen.recycled > 50, "{cfg:?}: {seen:?}");
        assert!(seen.warm_restarts >= 10 && seen.lines_reloaded > 1000, "{cfg:?}: {seen:?}");
        assert!(seen.invalidated_at_recovery > 0, "{cfg:?}: {seen:?}");
        if cfg.ram {
            assert!(seen.ram_hits > 100, "{cfg:?}: {seen:?}");
        }
        if back {
            // Blocks were written dirty, written back, and found dirty
            // again after crashes.
            assert!(seen.dirty_writes > 1000 && seen.written_back > 100, "{cfg:?}: {seen:?}");
            assert!(seen.dirty_reloaded > 0, "{cfg:?}: {seen:?}");
        }
        eprintln!("{cfg:?}: {seen:?}");
    }
}

/// The case that found a stale read of block 40, with each recycling
/// choice. Fills run on a thread, so it replays the race only sometimes:
/// before the fix (a write's generation drawn after its blocks' lines are
/// dropped) about 1 run in 8 failed, with every choice, so these 30 miss
/// it about 1 time in 50. `fill_during_a_writes_drops_is_invalidated_after_a_crash`
/// (tests/cache.rs) replays the race itself in one order.
#[test]
fn saved_case_of_block_40() {
    for pick in [Pick::Oldest, Pick::Greedy, Pick::CostBenefit] {
        for _ in 0..10 {
            let (cfg, ops) = block40::case();
            run_with(cfg, pick, ops);
        }
    }
}

/// The write-back case proptest shrank for issue 71: it failed, rarely,
/// with the final `write_back_all` giving up ("blocks kept being
/// written") while a write-back thread was mid-copy — a matter of
/// scheduling, so it is run 100 times;
/// `write_back_all_waits_for_a_copy_under_way` (tests/cache.rs) replays
/// that in one order.
#[test]
fn saved_write_back_case() {
    for _ in 0..100 {
        let (cfg, ops) = wb71::case();
        run(cfg, ops);
    }
}
