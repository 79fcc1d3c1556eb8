//! The engine against a byte-array model, with crashes at every step on a
//! device that drops and tears unflushed writes (the dm-vdo way).

use std::collections::BTreeSet;

use proptest::prelude::*;
use ztier_blk::backing::CrashBacking;
use ztier_blk::engine::{BlkError, CreateOptions, Engine};
use ztier_codec::CodecId;

const BS: usize = 4096;

fn opts(blocks: u64, extent: u32, physical: Option<u64>) -> CreateOptions {
    CreateOptions {
        logical_size: blocks * BS as u64,
        block_size: BS as u32,
        extent_size: extent,
        codec: CodecId::Lz4,
        physical,
    }
}

fn engine_on(dev: &std::sync::Arc<CrashBacking>, o: Option<&CreateOptions>) -> Engine {
    let b = Box::new(dev.clone());
    match o {
        Some(o) => Engine::create(b, o).unwrap(),
        None => Engine::open(b, false).unwrap(),
    }
}

/// Data of a kind: 0 text-like (compresses), 1 random (does not), 2 zeros.
fn fill(kind: u8, seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match kind {
        0 => {
            let words = ["block ", "extent ", "ztier ", "cleaner ", "checkpoint ", "\n", "log "];
            let mut v = Vec::with_capacity(len + 16);
            while v.len() < len {
                v.extend_from_slice(words[(next() % 7) as usize].as_bytes());
                v.extend_from_slice(format!("{} ", next() % 1000).as_bytes());
            }
            v.truncate(len);
            v
        }
        1 => (0..len).map(|_| next() as u8).collect(),
        _ => vec![0; len],
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        off: u64,
        len: usize,
        kind: u8,
        seed: u64,
        fua: bool,
    },
    Zero {
        off: u64,
        len: u64,
    },
    Trim {
        block: u64,
        n: u64,
    },
    Flush,
    Clean,
    Checkpoint,
    /// Crash: keep each unsynced write with this per-mille chance, tearing
    /// some of the kept ones.
    Crash {
        keep: u16,
        tear: bool,
        seed: u64,
    },
    Reopen,
}

fn op(blocks: u64) -> impl Strategy<Value = Op> {
    let size = blocks * BS as u64;
    prop_oneof![
        6 => (0..blocks, 1..4usize, 0..3u8, any::<u64>(), prop::bool::weighted(0.1)).prop_map(move |(b, n, kind, seed, fua)| {
            let n = n.min((blocks - b) as usize);
            Op::Write { off: b * BS as u64, len: n * BS, kind, seed, fua }
        }),
        2 => (0..size - 1, 1..9000usize, 0..2u8, any::<u64>()).prop_map(move |(off, len, kind, seed)| {
            let len = len.min((size - off) as usize);
            Op::Write { off, len, kind, seed, fua: false }
        }),
        1 => (0..size - 1, 1..20000u64).prop_map(move |(off, len)| Op::Zero { off, len: len.min(size - off) }),
        1 => (0..blocks, 1..8u64).prop_map(move |(b, n)| Op::Trim { block: b, n: n.min(blocks - b) }),
        2 => Just(Op::Flush),
        1 => Just(Op::Clean),
        1 => Just(Op::Checkpoint),
        1 => (0..1001u16, any::<bool>(), any::<u64>()).prop_map(|(keep, tear, seed)| Op::Crash { keep, tear, seed }),
        1 => Just(Op::Reopen),
    ]
}

struct Harness {
    dev: std::sync::Arc<CrashBacking>,
    eng: Engine,
    model: Vec<u8>,
    /// Blocks written since the last completed flush: after a crash their
    /// content may be old, new or (for partial writes) a mix of both.
    dirty: BTreeSet<u64>,
    blocks: u64,
}

impl Harness {
    fn new(blocks: u64, extent: u32, physical: Option<u64>) -> Harness {
        let dev = std::sync::Arc::new(CrashBacking::new());
        let eng = engine_on(&dev, Some(&opts(blocks, extent, physical)));
        Harness { dev, eng, model: vec![0; blocks as usize * BS], dirty: BTreeSet::new(), blocks }
    }

    fn mark(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        for b in off / BS as u64..=(off + len - 1) / BS as u64 {
            self.dirty.insert(b);
        }
    }

    /// Adopts what the device now holds for blocks whose content is
    /// unspecified, checks everything else against the model.
    fn verify(&mut self, adopt: &BTreeSet<u64>) {
        let mut got = vec![0u8; self.model.len()];
        self.eng.read(0, &mut got).expect("every block reads back after recovery");
        for b in 0..self.blocks {
            let r = b as usize * BS..(b as usize + 1) * BS;
            if adopt.contains(&b) {
                self.model[r.clone()].copy_from_slice(&got[r]);
            } else {
                assert!(self.model[r.clone()] == got[r], "block {b} differs from the model");
            }
        }
        let problems = self.eng.check().unwrap();
        assert!(problems.is_empty(), "{problems:?}");
    }

    fn apply(&mut self, o: &Op) {
        match *o {
            Op::Write { off, len, kind, seed, fua } => {
                let data = fill(kind, seed, len);
                self.mark(off, len as u64);
                match self.eng.write(off, &data, fua) {
                    Ok(()) => {
                        self.model[off as usize..off as usize + len].copy_from_slice(&data);
                        if fua {
                            self.dirty.clear();
                        }
                    }
                    Err(BlkError::NoSpace) => {
                        // Unspecified content in the range; nothing else changed.
                        let adopt: BTreeSet<u64> =
                            (off / BS as u64..=(off + len as u64 - 1) / BS as u64).collect();
                        self.verify(&adopt);
                    }
                    Err(e) => panic!("write: {e}"),
                }
            }
            Op::Zero { off, len } => {
                self.mark(off, len);
                match self.eng.write_zeroes(off, len, false, false) {
                    Ok(()) => self.model[off as usize..(off + len) as usize].fill(0),
                    Err(BlkError::NoSpace) => {
                        let adopt: BTreeSet<u64> = (off / BS as u64..=(off + len - 1) / BS as u64).collect();
                        self.verify(&adopt);
                    }
                    Err(e) => panic!("zero: {e}"),
                }
            }
            Op::Trim { block, n } => {
                self.mark(block * BS as u64, n * BS as u64);
                match self.eng.trim(block * BS as u64, n * BS as u64, false) {
                    // This engine reads trimmed blocks as zeros.
                    Ok(()) => self.model[block as usize * BS..(block + n) as usize * BS].fill(0),
                    Err(BlkError::NoSpace) => {
                        let adopt: BTreeSet<u64> = (block..block + n).collect();
                        self.verify(&adopt);
                    }
                    Err(e) => panic!("trim: {e}"),
                }
            }
            Op::Flush => {
                self.eng.flush().unwrap();
                self.dirty.clear();
            }
            Op::Clean => {
                self.eng.clean(true).unwrap();
            }
            Op::Checkpoint => {
                self.eng.checkpoint().unwrap();
                self.dirty.clear();
            }
            Op::Crash { keep, tear, seed } => {
                let mut x = seed | 1;
                let img = self.dev.crash(|_, sectors| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if (x % 1000) as u16 >= keep {
                        0
                    } else if tear && x % 3 == 0 {
                        (x >> 20) as usize % sectors.max(1)
                    } else {
                        sectors
                    }
                });
                self.dev = std::sync::Arc::new(CrashBacking::from_image(img));
                self.eng = engine_on(&self.dev, None);
                let adopt = std::mem::take(&mut self.dirty);
                self.verify(&adopt);
            }
            Op::Reopen => {
                self.eng.close().unwrap();
                self.dirty.clear();
                let img = self.dev.crash(|_, _| 0); // nothing pending after close
                self.dev = std::sync::Arc::new(CrashBacking::from_image(img));
                self.eng = engine_on(&self.dev, None);
                self.verify(&BTreeSet::new());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Provisioned image: never ENOSPC, never wrong data, flushed data
    /// survives any crash, `check` is clean after every recovery.
    #[test]
    fn model_with_crashes(ops in prop::collection::vec(op(48), 1..80)) {
        let mut h = Harness::new(48, 16384, None);
        for o in &ops {
            h.apply(o);
        }
        h.apply(&Op::Crash { keep: 500, tear: true, seed: 7 });
    }

    /// A thin image (physical below logical): writes may fail with ENOSPC,
    /// and then nothing outside the failed request changes.
    #[test]
    fn thin_image_enospc_loses_nothing(ops in prop::collection::vec(op(64), 1..80)) {
        let mut h = Harness::new(64, 16384, Some(20 * 16384));
        for o in &ops {
            h.apply(o);
        }
        h.apply(&Op::Reopen);
    }
}

/// At least 200 crash points: after every step of a fixed workload, four
/// crashes (all unsynced writes lost, all kept, a random half, a random
/// half torn at 512-byte sectors), each recovered and checked.
#[test]
fn two_hundred_crash_points() {
    let mut h = Harness::new(96, 32768, None);
    let mut points = 0;
    let mut x = 12345u64;
    for step in 0..60u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let o = match step % 6 {
            0..=2 => Op::Write {
                off: (x % 90) * BS as u64,
                len: BS * (1 + (x >> 8) as usize % 6),
                kind: (x >> 16) as u8 % 3,
                seed: x,
                fua: false,
            },
            3 => Op::Flush,
            4 => Op::Write {
                off: x % (90 * BS as u64),
                len: 1 + (x >> 9) as usize % 7000,
                kind: 0,
                seed: x,
                fua: step % 12 == 4,
            },
            _ => {
                if step % 12 == 5 {
                    Op::Clean
                } else {
                    Op::Trim { block: x % 90, n: 1 + (x >> 7) % 5 }
                }
            }
        };
        h.apply(&o);
        for (keep, tear) in [(0u16, false), (1000, false), (500, false), (500, true)] {
            // Crash a copy; the run goes on on the original.
            let img = h.dev.crash({
                let mut y = x ^ keep as u64;
                move |_, sectors| {
                    y ^= y << 13;
                    y ^= y >> 7;
                    y ^= y << 17;
                    if (y % 1000) as u16 >= keep {
                        0
                    } else if tear {
                        (y >> 20) as usize % (sectors + 1)
                    } else {
                        sectors
                    }
                }
            });
            let dev = std::sync::Arc::new(CrashBacking::from_image(img));
            let eng = engine_on(&dev, None);
            let mut got = vec![0u8; h.model.len()];
            eng.read(0, &mut got).unwrap();
            for b in 0..h.blocks {
                if !h.dirty.contains(&b) {
                    let r = b as usize * BS..(b as usize + 1) * BS;
                    assert!(got[r.clone()] == h.model[r], "step {step}, crash ({keep}, {tear}): block {b}");
                }
            }
            assert!(eng.check().unwrap().is_empty());
            points += 1;
        }
    }
    assert!(points >= 200);
}

/// Corrupt stored data reads as an error, never as wrong data.
#[test]
fn corrupt_data_is_an_error() {
    let dev = std::sync::Arc::new(CrashBacking::new());
    let eng = engine_on(&dev, Some(&opts(16, 16384, None)));
    let data = fill(0, 1, 4 * BS);
    eng.write(0, &data, true).unwrap();
    eng.close().unwrap();
    let mut img = dev.image();
    // Flip one byte in every extent's data area (the back of the extent).
    let data_off = eng.geometry().data_offset() as usize;
    for e in 0..eng.geometry().extents as usize {
        let at = data_off + (e + 1) * 16384 - 100;
        if at < img.len() {
            img[at] ^= 0x55;
        }
    }
    let dev2 = std::sync::Arc::new(CrashBacking::from_image(img));
    let eng2 = engine_on(&dev2, None);
    let mut out = vec![0u8; 4 * BS];
    let r = eng2.read(0, &mut out);
    assert!(matches!(r, Err(BlkError::Corrupt { .. })), "{r:?}");
    assert!(!eng2.check().unwrap().is_empty());
}

/// Text compresses, and the cleaner reclaims the space of overwritten data.
#[test]
fn compresses_and_cleans() {
    let dev = std::sync::Arc::new(CrashBacking::new());
    let eng = engine_on(&dev, Some(&opts(1024, 32768, None)));
    for round in 0..6u64 {
        for b in (0..1024u64).step_by(16) {
            eng.write(b * BS as u64, &fill(0, round * 10_000 + b, 16 * BS), false).unwrap();
        }
        eng.flush().unwrap();
    }
    eng.clean(false).unwrap();
    let s = eng.stats();
    assert_eq!(s.data_blocks, 1024);
    assert!(s.ratio > 1.8, "{s:?}");
    // Six rounds of overwrites fit in a space smaller than one raw copy:
    // the cleaner reclaimed the dead extents and moved live blocks.
    assert!(s.used_extents as u64 * 32768 < 1024 * BS as u64 * 7 / 8, "{s:?}");
    assert!(s.extents_cleaned > 100 && s.blocks_relocated > 0, "{s:?}");
    assert_eq!(s.enospc, 0);
}
