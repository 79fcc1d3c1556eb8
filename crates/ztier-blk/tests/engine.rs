//! The engine against a byte-array model, with crashes at every step on a
//! device that drops and tears unflushed writes (the dm-vdo way).

mod common;

use std::collections::BTreeMap;

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

/// Data of a kind: 0 text-like (compresses), 1 random (does not), 2 zeros,
/// 3 one repeated 8-byte pattern (same-filled).
fn fill(kind: u8, seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || common::xorshift(&mut x);
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
        3 => {
            let p = next().to_le_bytes();
            (0..len).map(|i| p[i % 8]).collect()
        }
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
        6 => (0..blocks, 1..4usize, 0..4u8, any::<u64>(), prop::bool::weighted(0.1)).prop_map(move |(b, n, kind, seed, fua)| {
            let n = n.min((blocks - b) as usize);
            Op::Write { off: b * BS as u64, len: n * BS, kind, seed, fua }
        }),
        2 => (0..size - 1, 1..9000usize, 0..4u8, any::<u64>()).prop_map(move |(off, len, kind, seed)| {
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
    /// Blocks written since the last completed flush, with every content
    /// each may hold after a crash: the one it had at that flush, then the
    /// one after each write since. After a crash each 512-byte sector of
    /// such a block must be that sector of one of them (old, new, or a
    /// write torn at sectors); anything else is a failure.
    versions: BTreeMap<u64, Vec<Vec<u8>>>,
    blocks: u64,
}

const SECTOR: usize = 512;

impl Harness {
    fn new(blocks: u64, extent: u32, physical: Option<u64>) -> Harness {
        let dev = std::sync::Arc::new(CrashBacking::new());
        let eng = engine_on(&dev, Some(&opts(blocks, extent, physical)));
        Harness { dev, eng, model: vec![0; blocks as usize * BS], versions: BTreeMap::new(), blocks }
    }

    fn block(&self, b: u64) -> &[u8] {
        &self.model[b as usize * BS..(b as usize + 1) * BS]
    }

    fn range(off: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        off / BS as u64..=(off + len.max(1) - 1) / BS as u64
    }

    /// Before a change to `[off, off + len)`: remembers the blocks' flushed
    /// content.
    fn before(&mut self, off: u64, len: u64) {
        for b in Self::range(off, len) {
            if !self.versions.contains_key(&b) {
                let v = self.block(b).to_vec();
                self.versions.insert(b, vec![v]);
            }
        }
    }

    /// After a change: the blocks' new content is one they may hold.
    fn after(&mut self, off: u64, len: u64) {
        for b in Self::range(off, len) {
            let v = self.block(b).to_vec();
            self.versions.get_mut(&b).expect("before() ran").push(v);
        }
    }

    /// Whether `got` (the whole device after a crash) is one the crash
    /// model allows.
    fn allowed(&self, got: &[u8]) -> Result<(), String> {
        for b in 0..self.blocks {
            let r = b as usize * BS..(b as usize + 1) * BS;
            match self.versions.get(&b) {
                None => {
                    if got[r.clone()] != self.model[r] {
                        return Err(format!("block {b} (flushed) differs from the model"));
                    }
                }
                Some(vs) => {
                    for (s, sector) in got[r].chunks(SECTOR).enumerate() {
                        let sr = s * SECTOR..(s + 1) * SECTOR;
                        if !vs.iter().any(|v| v[sr.clone()] == *sector) {
                            return Err(format!(
                                "block {b} (unflushed) sector {s} is none of its {} versions",
                                vs.len()
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads the whole device, checks it against the crash model, adopts
    /// it, and audits the image.
    fn verify(&mut self) -> Result<(), String> {
        let mut got = vec![0u8; self.model.len()];
        self.eng.read(0, &mut got).map_err(|e| format!("every block reads back after recovery: {e}"))?;
        self.allowed(&got)?;
        self.model = got;
        self.versions.clear();
        let problems = self.eng.check().unwrap();
        if !problems.is_empty() {
            return Err(format!("{problems:?}"));
        }
        Ok(())
    }

    /// A request failed with ENOSPC: each block of its range holds its
    /// content from before or the one the request would have given it;
    /// nothing else changed.
    fn failed(&mut self, off: u64, len: u64, would: &[u8]) {
        let mut got = vec![0u8; self.model.len()];
        self.eng.read(0, &mut got).expect("reads after ENOSPC");
        for b in 0..self.blocks {
            let r = b as usize * BS..(b as usize + 1) * BS;
            let ok = got[r.clone()] == self.model[r.clone()]
                || (Self::range(off, len).contains(&b) && got[r.clone()] == would[r.clone()]);
            assert!(ok, "block {b} after ENOSPC is neither its old content nor the request's");
        }
        self.model = got;
        self.after(off, len);
        assert!(self.eng.check().unwrap().is_empty());
    }

    /// Crashes the device keeping each unsynced write with `keep` per
    /// mille, tearing some of the kept ones with `tear`, then recovers.
    fn crash(&mut self, keep: u16, tear: bool, seed: u64) {
        let mut x = seed | 1;
        let img = self.dev.crash(|_, sectors| {
            common::xorshift(&mut x);
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
    }

    fn apply(&mut self, o: &Op) {
        match *o {
            Op::Write { off, len, kind, seed, fua } => {
                let data = fill(kind, seed, len);
                self.before(off, len as u64);
                let mut would = self.model.clone();
                would[off as usize..off as usize + len].copy_from_slice(&data);
                match self.eng.write(off, &data, fua) {
                    Ok(()) => {
                        self.model = would;
                        self.after(off, len as u64);
                        if fua {
                            self.versions.clear();
                        }
                    }
                    Err(BlkError::NoSpace) => self.failed(off, len as u64, &would),
                    Err(e) => panic!("write: {e}"),
                }
            }
            Op::Zero { off, len } => {
                self.before(off, len);
                let mut would = self.model.clone();
                would[off as usize..(off + len) as usize].fill(0);
                match self.eng.write_zeroes(off, len, false, false) {
                    Ok(()) => {
                        self.model = would;
                        self.after(off, len);
                    }
                    Err(BlkError::NoSpace) => self.failed(off, len, &would),
                    Err(e) => panic!("zero: {e}"),
                }
            }
            Op::Trim { block, n } => {
                let (off, len) = (block * BS as u64, n * BS as u64);
                self.before(off, len);
                let mut would = self.model.clone();
                // This engine reads trimmed blocks as zeros.
                would[off as usize..(off + len) as usize].fill(0);
                match self.eng.trim(off, len, false) {
                    Ok(()) => {
                        self.model = would;
                        self.after(off, len);
                    }
                    Err(BlkError::NoSpace) => self.failed(off, len, &would),
                    Err(e) => panic!("trim: {e}"),
                }
            }
            Op::Flush => {
                self.eng.flush().unwrap();
                self.versions.clear();
            }
            Op::Clean => {
                self.eng.clean(true).unwrap();
            }
            Op::Checkpoint => {
                self.eng.checkpoint().unwrap();
                self.versions.clear();
            }
            Op::Crash { keep, tear, seed } => {
                self.crash(keep, tear, seed);
                self.verify().unwrap();
            }
            Op::Reopen => {
                self.eng.close().unwrap();
                self.versions.clear();
                let img = self.dev.crash(|_, _| 0); // nothing pending after close
                self.dev = std::sync::Arc::new(CrashBacking::from_image(img));
                self.eng = engine_on(&self.dev, None);
                self.verify().unwrap();
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
        common::xorshift(&mut x);
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
                    common::xorshift(&mut y);
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
            if let Err(e) = h.allowed(&got) {
                panic!("step {step}, crash ({keep}, {tear}): {e}");
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

/// The crash model catches what it must: garbage in a block written
/// since the last flush is none of its versions (a mutation of the
/// device after recovery), while the unmutated recovery passes.
#[test]
fn crash_model_rejects_garbage_in_an_unflushed_block() {
    for mutate in [false, true] {
        let mut h = Harness::new(32, 16384, None);
        h.apply(&Op::Write { off: 0, len: 8 * BS, kind: 0, seed: 1, fua: false });
        h.apply(&Op::Flush);
        // Block 3 is rewritten twice and block 5 partly, none flushed.
        h.apply(&Op::Write { off: 3 * BS as u64, len: BS, kind: 0, seed: 2, fua: false });
        h.apply(&Op::Write { off: 3 * BS as u64, len: BS, kind: 1, seed: 3, fua: false });
        h.apply(&Op::Write { off: 5 * BS as u64 + 700, len: 1000, kind: 1, seed: 4, fua: false });
        h.crash(500, true, 9);
        if mutate {
            // Sector 2 of block 3 becomes bytes no version of it holds.
            let garbage = fill(1, 12345, SECTOR);
            h.eng.write(3 * BS as u64 + 2 * SECTOR as u64, &garbage, true).unwrap();
        }
        let r = h.verify();
        if mutate {
            let e = r.expect_err("garbage in an unflushed block must fail the crash model");
            assert!(e.contains("block 3 (unflushed) sector 2"), "{e}");
        } else {
            r.unwrap();
        }
    }
}

fn mem_engine(blocks: u64, extent: u32) -> (std::sync::Arc<CrashBacking>, Engine) {
    let dev = std::sync::Arc::new(CrashBacking::new());
    let eng = engine_on(&dev, Some(&opts(blocks, extent, None)));
    (dev, eng)
}

fn reopened(dev: &std::sync::Arc<CrashBacking>) -> Engine {
    let img = dev.crash(|_, _| 0);
    engine_on(&std::sync::Arc::new(CrashBacking::from_image(img)), None)
}

/// 64 MiB of one repeated 8-byte pattern costs records, not data: under
/// 1 MiB physical, and it reads back (also after a reopen).
#[test]
fn same_filled_blocks_cost_a_record() {
    let blocks = 16384;
    let (dev, eng) = mem_engine(blocks, 32768);
    let data = fill(3, 77, 1 << 20);
    for i in 0..64u64 {
        eng.write(i << 20, &data, false).unwrap();
    }
    eng.close().unwrap();
    let s = eng.stats();
    assert_eq!(s.same_blocks, blocks, "{s:?}");
    assert!(s.physical_bytes_used < 1 << 20, "{s:?}");
    let e2 = reopened(&dev);
    let mut back = vec![0u8; 1 << 20];
    for i in [0u64, 31, 63] {
        e2.read(i << 20, &mut back).unwrap();
        assert!(back == data, "MiB {i}");
    }
    // A partial overwrite of a same-filled block reads back merged.
    e2.write(4096 + 100, b"hello", false).unwrap();
    let mut b = vec![0u8; 4096];
    e2.read(4096, &mut b).unwrap();
    assert_eq!(&b[100..105], b"hello");
    assert_eq!(b[..100], data[..100]);
    assert!(e2.check().unwrap().is_empty());
}

/// Incompressible data takes at most 101% of its size (raw extents hold
/// whole blocks, their records go to log extents); the cleaner moves raw
/// blocks too, and everything reads back after a reopen.
#[test]
fn incompressible_data_costs_its_size_and_cleans() {
    let blocks = 4096u64; // 16 MiB
    let (dev, eng) = mem_engine(blocks, 32768);
    let data = fill(1, 5, blocks as usize * BS);
    for (i, c) in data.chunks(1 << 20).enumerate() {
        eng.write((i as u64) << 20, c, false).unwrap();
    }
    eng.close().unwrap();
    let s = eng.stats();
    let fraction = s.used_extents as f64 * 32768.0 / (blocks * BS as u64) as f64;
    assert!(fraction <= 1.01, "{fraction} {s:?}");
    assert_eq!(s.raw_extents, blocks as u32 / 8, "{s:?}");
    // Rewrite every other block a few times: raw extents half dead get cleaned.
    for round in 0..4u64 {
        for b in (0..blocks).step_by(2) {
            eng.write(b * BS as u64, &fill(1, 100 + round * blocks + b, BS), false).unwrap();
        }
        eng.flush().unwrap();
        eng.clean(false).unwrap();
    }
    let s = eng.stats();
    assert!(s.extents_cleaned > 0 && s.blocks_relocated > 0, "{s:?}");
    assert!(eng.check().unwrap().is_empty());
    let mut want = data.clone();
    for b in (0..blocks).step_by(2) {
        want[b as usize * BS..(b as usize + 1) * BS].copy_from_slice(&fill(1, 100 + 3 * blocks + b, BS));
    }
    eng.close().unwrap();
    let e2 = reopened(&dev);
    let mut back = vec![0u8; want.len()];
    e2.read(0, &mut back).unwrap();
    assert!(back == want, "raw blocks read back after cleaning and a reopen");
    assert!(e2.check().unwrap().is_empty());
}

/// A device that counts the bytes written to it and keeps the ranges read.
struct Counting(
    std::sync::Arc<CrashBacking>,
    std::sync::atomic::AtomicU64,
    std::sync::Mutex<Vec<std::ops::Range<u64>>>,
);
impl ztier_blk::backing::Backing for Counting {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.2.lock().unwrap().push(off..off + buf.len() as u64);
        self.0.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.1.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.0.write_at(buf, off)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn allocated_bytes(&self) -> std::io::Result<u64> {
        self.0.allocated_bytes()
    }
}

/// Checkpoints write only the table pages that changed: after one block
/// changes, a checkpoint of a 1 GiB device (768 table pages, 3 MiB)
/// writes a few KiB; the image then recovers to the right data.
#[test]
fn checkpoints_write_only_changed_pages() {
    let dev = std::sync::Arc::new(CrashBacking::new());
    let counting = std::sync::Arc::new(Counting(dev.clone(), Default::default(), Default::default()));
    // Thin (64 extents), so the in-memory device stays small.
    let eng = Engine::create(Box::new(counting.clone()), &opts(1 << 18, 32768, Some(64 * 32768))).unwrap();
    // From the first checkpoint after create on (create writes both
    // areas, so no checkpoint reads one).
    counting.2.lock().unwrap().clear();
    for round in 0..4u64 {
        let lba = 1000 + round * 5000;
        eng.write(lba * BS as u64, &fill(0, round + 2, BS), false).unwrap();
        let before = counting.1.load(std::sync::atomic::Ordering::Relaxed);
        eng.checkpoint().unwrap();
        let wrote = counting.1.load(std::sync::atomic::Ordering::Relaxed) - before;
        // The extent holding the block, two table pages (one per change
        // since each area was written), a superblock.
        assert!(wrote <= 32768 + 2 * 4096 + 4096, "round {round}: a checkpoint wrote {wrote} bytes");
    }
    let areas = eng.geometry().area_offset(0)..eng.geometry().area_offset(2);
    let reads = std::mem::take(&mut *counting.2.lock().unwrap());
    assert!(reads.iter().all(|r| r.end <= areas.start || r.start >= areas.end), "{reads:?}");
    eng.close().unwrap();
    // The first checkpoint after an open too: the open reads only the
    // area in use, the checkpoint reads the one it writes.
    let dev = std::sync::Arc::new(CrashBacking::from_image(dev.crash(|_, _| 0)));
    let counting = std::sync::Arc::new(Counting(dev.clone(), Default::default(), Default::default()));
    let e2 = Engine::open(Box::new(counting.clone()), false).unwrap();
    let g = e2.geometry();
    let area_bytes = ztier_blk::format::Superblock::table_pages_for(1 << 18) as u64 * 4096;
    let other = g.area_offset(1 - g.generation % 2)..g.area_offset(1 - g.generation % 2) + area_bytes;
    let in_other = |reads: &[std::ops::Range<u64>]| {
        reads.iter().map(|r| r.end.min(other.end).saturating_sub(r.start.max(other.start))).sum::<u64>()
    };
    assert_eq!(
        in_other(&std::mem::take(&mut *counting.2.lock().unwrap())),
        0,
        "the open read the other area"
    );
    e2.write(77 * BS as u64, &fill(0, 99, BS), false).unwrap();
    e2.checkpoint().unwrap();
    assert_eq!(in_other(&counting.2.lock().unwrap()), area_bytes, "the first checkpoint reads its area once");
    // The extent, a superblock, two pages: block 77's and round 3's (the
    // close had nothing to checkpoint, so this area still misses it).
    let wrote = counting.1.load(std::sync::atomic::Ordering::Relaxed);
    assert!(wrote <= 32768 + 3 * 4096, "the first checkpoint after an open wrote {wrote} bytes");
    assert_eq!(e2.stats().checkpoint_pages_written, 2);
    let mut b = vec![0u8; BS];
    for round in 0..4u64 {
        e2.read((1000 + round * 5000) * BS as u64, &mut b).unwrap();
        assert!(b == fill(0, round + 2, BS), "round {round}");
    }
    e2.read(77 * BS as u64, &mut b).unwrap();
    assert!(b == fill(0, 99, BS));
    assert!(e2.check().unwrap().is_empty());
    e2.close().unwrap();
    // A restart that changes nothing reads one area and writes nothing.
    let counting = std::sync::Arc::new(Counting(dev.clone(), Default::default(), Default::default()));
    let e3 = Engine::open(Box::new(counting.clone()), false).unwrap();
    e3.read(77 * BS as u64, &mut b).unwrap();
    e3.close().unwrap();
    assert_eq!(counting.1.load(std::sync::atomic::Ordering::Relaxed), 0, "an idle restart wrote");
    let e4 = reopened(&dev);
    e4.read(77 * BS as u64, &mut b).unwrap();
    assert!(b == fill(0, 99, BS));
}

/// A device that keeps, before every write and sync (and when asked),
/// the images a crash there could leave: every unsynced write lost, all
/// kept, and every other one torn after half its sectors.
struct Snap(std::sync::Arc<CrashBacking>, std::sync::Mutex<Vec<Vec<u8>>>);
impl Snap {
    fn point(&self) {
        let d = &self.0;
        let mut v = self.1.lock().unwrap();
        v.push(d.crash(|_, _| 0));
        v.push(d.crash(|_, s| s));
        v.push(d.crash(|i, s| if i % 2 == 0 { s / 2 } else { s }));
    }
}
impl ztier_blk::backing::Backing for Snap {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.0.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.point();
        self.0.write_at(buf, off)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.point();
        self.0.sync()
    }
    fn allocated_bytes(&self) -> std::io::Result<u64> {
        self.0.allocated_bytes()
    }
}

/// The first checkpoint after a restart writes the pages that differ in
/// the area it overwrites — those changed since the restart and those the
/// area missed before it — and no more; a crash at any write or sync of
/// it (kill -9 mid-checkpoint, lost or torn writes) recovers every
/// flushed block, and so does the next restart's first checkpoint.
#[test]
fn first_checkpoint_after_a_restart_is_incremental_and_crash_safe() {
    const PAGE: u64 = 340; // table entries per 4 KiB page
    let blocks = 12 * PAGE;
    let dev = std::sync::Arc::new(CrashBacking::new());
    let eng = engine_on(&dev, Some(&opts(blocks, 32768, Some(64 * 32768))));
    let mut model = vec![0u8; blocks as usize * BS];
    let put = |eng: &Engine, model: &mut [u8], lba: u64, ver: u64| {
        let b = versioned(lba, ver);
        eng.write(lba * BS as u64, &b, false).unwrap();
        model[lba as usize * BS..(lba as usize + 1) * BS].copy_from_slice(&b);
    };
    let verify = |eng: &Engine, model: &[u8], what: &str| {
        let mut got = vec![0u8; model.len()];
        eng.read(0, &mut got).unwrap();
        for b in 0..blocks as usize {
            assert!(got[b * BS..(b + 1) * BS] == model[b * BS..(b + 1) * BS], "{what}: block {b}");
        }
        assert!(eng.check().unwrap().is_empty(), "{what}: check");
    };
    // Generation 2 (area 0) and 3 (area 1): every page; 4 (area 0):
    // pages 5 and 8 change, so area 1 is stale for them.
    for p in 0..12 {
        put(&eng, &mut model, p * PAGE + 7, 1);
    }
    eng.flush().unwrap();
    eng.checkpoint().unwrap();
    put(&eng, &mut model, 3 * PAGE + 9, 2);
    eng.flush().unwrap();
    eng.checkpoint().unwrap();
    put(&eng, &mut model, 5 * PAGE + 11, 3);
    put(&eng, &mut model, 8 * PAGE + 11, 4);
    eng.flush().unwrap();
    eng.checkpoint().unwrap();
    // kill -9 right after it; restart.
    let dev = std::sync::Arc::new(CrashBacking::from_image(dev.crash(|_, _| 0)));
    drop(eng);
    let snap = std::sync::Arc::new(Snap(dev.clone(), Default::default()));
    let eng = Engine::open(Box::new(snap.clone()), false).unwrap();
    verify(&eng, &model, "after the restart");
    put(&eng, &mut model, 10 * PAGE + 1, 5);
    eng.flush().unwrap();
    snap.1.lock().unwrap().clear(); // the crash points of the checkpoint only
    eng.checkpoint().unwrap();
    snap.point();
    // Pages 5 and 8 (missed by this area) and 10 (changed since the restart).
    assert_eq!(eng.stats().checkpoint_pages_written, 3);
    let images = std::mem::take(&mut *snap.1.lock().unwrap());
    assert!(images.len() >= 5 * 3, "{} crash images", images.len());
    for (i, img) in images.into_iter().enumerate() {
        let dev = std::sync::Arc::new(CrashBacking::from_image(img));
        let e = engine_on(&dev, None);
        verify(&e, &model, &format!("crash point {i}"));
        // Restarted after a crash mid-checkpoint: the first checkpoint of
        // this run, then one more kill -9.
        let mut m = model.clone();
        put(&e, &mut m, 2 * PAGE + 3, 6 + i as u64);
        e.flush().unwrap();
        e.checkpoint().unwrap();
        verify(&reopened(&dev), &m, &format!("crash point {i}, then a checkpoint and a crash"));
    }
}

/// A device that counts its reads.
struct CountReads(std::sync::Arc<CrashBacking>, std::sync::atomic::AtomicU64);
impl ztier_blk::backing::Backing for CountReads {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.0.write_at(buf, off)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn allocated_bytes(&self) -> std::io::Result<u64> {
        self.0.allocated_bytes()
    }
}

/// Version `ver` of block `lba`: its number and version, then text-like
/// (compresses) or random (stored raw) bytes derived from both.
fn versioned(lba: u64, ver: u64) -> Vec<u8> {
    let seed = lba.wrapping_mul(1_000_003).wrapping_add(ver);
    let mut b = fill(if ver % 3 == 2 { 1 } else { 0 }, seed, BS);
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&ver.to_le_bytes());
    b
}

/// Checks that each block of `buf` (read at block `first`) is some
/// version of itself; returns the versions.
fn versions_of(first: u64, buf: &[u8]) -> Vec<u64> {
    buf.chunks(BS)
        .enumerate()
        .map(|(i, b)| {
            let lba = first + i as u64;
            let ver = u64::from_le_bytes(b[8..16].try_into().unwrap());
            assert_eq!(
                u64::from_le_bytes(b[..8].try_into().unwrap()),
                lba,
                "block {lba}: another block's data"
            );
            assert!(b == versioned(lba, ver).as_slice(), "block {lba}: damaged version {ver}");
            ver
        })
        .collect()
}

/// A 1 MiB read of blocks written in sequence reads their neighbouring
/// extents in a few `pread`s (not one per extent), and large reads
/// stay right while writers overwrite, the cleaner moves blocks and
/// checkpoints run beside them.
#[test]
fn large_reads_span_neighbouring_extents_and_stay_right_under_writes() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let blocks = 4096u64; // 16 MiB
    let dev = std::sync::Arc::new(CrashBacking::new());
    let counting = std::sync::Arc::new(CountReads(dev.clone(), Default::default()));
    // 640 extents of 32 KiB (20 MiB) for 16 MiB of data: the cleaner has work.
    let eng = Engine::create(Box::new(counting.clone()), &opts(blocks, 32768, Some(640 * 32768))).unwrap();
    for chunk in 0..blocks / 256 {
        let data: Vec<u8> = (chunk * 256..(chunk + 1) * 256).flat_map(|l| versioned(l, 0)).collect();
        eng.write(chunk * 256 * BS as u64, &data, false).unwrap();
    }
    eng.flush().unwrap();
    // The blocks of a MiB lie in about 12 extents (one `pread` each
    // before spans); a few stragglers sit in extents opened earlier (best
    // fit), and a hole above 8 KiB ends a span.
    let mut buf = vec![0u8; 1 << 20];
    let before_all = counting.1.load(Relaxed);
    for mib in 0..blocks / 256 {
        let before = counting.1.load(Relaxed);
        eng.read(mib << 20, &mut buf).unwrap();
        let reads = counting.1.load(Relaxed) - before;
        assert!(reads <= 8, "MiB {mib}: {reads} reads of the image");
        assert!(versions_of(mib * 256, &buf).iter().all(|&v| v == 0));
    }
    let reads = counting.1.load(Relaxed) - before_all;
    assert!(reads <= 5 * blocks / 256, "{reads} reads for {} MiB", blocks / 256);
    // Two writers (even and odd blocks), two readers, cleaning and checkpoints.
    let done = AtomicBool::new(false);
    // A writer or the maintenance thread that panics lets the readers
    // stop, so that the test fails instead of waiting for them for ever.
    struct DoneOnPanic<'a>(&'a AtomicBool);
    impl Drop for DoneOnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.store(true, Relaxed);
            }
        }
    }
    let last: Vec<u64> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (eng, done) = (&eng, &done);
                s.spawn(move || {
                    let _guard = DoneOnPanic(done);
                    let mut ver = vec![0u64; blocks as usize];
                    let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ w;
                    for round in 0..300u64 {
                        common::xorshift(&mut x);
                        // A run of up to 64 of this writer's blocks.
                        let start = (x % blocks) & !1 | w;
                        let n = 1 + (x >> 32) % 64;
                        for lba in (start..(start + 2 * n).min(blocks)).step_by(2) {
                            ver[lba as usize] += 1;
                            // NoSpace only when the image is full (tests/space.rs):
                            // this thin image has room, so every write succeeds.
                            let data = versioned(lba, ver[lba as usize]);
                            eng.write(lba * BS as u64, &data, false).unwrap();
                        }
                        if round % 50 == 49 {
                            eng.flush().unwrap();
                        }
                    }
                    ver
                })
            })
            .collect();
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (eng, done) = (&eng, &done);
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ r;
                    let mut buf = vec![0u8; 512 * BS];
                    let mut n_reads = 0;
                    while !done.load(Relaxed) || n_reads < 20 {
                        common::xorshift(&mut x);
                        let first = x % blocks;
                        let n = (1 + (x >> 40) % 512).min(blocks - first);
                        let b = &mut buf[..n as usize * BS];
                        eng.read(first * BS as u64, b).unwrap();
                        versions_of(first, b);
                        n_reads += 1;
                    }
                })
            })
            .collect();
        let maint = s.spawn(|| {
            let _guard = DoneOnPanic(&done);
            while !done.load(Relaxed) {
                // The cleaner needs a free extent to move blocks into: with
                // the writers filling this thin image it may find none for a
                // while (a served image's maintenance lets that pass too).
                match eng.clean(true) {
                    Ok(_) | Err(BlkError::NoSpace) => {}
                    Err(e) => panic!("clean: {e}"),
                }
                eng.checkpoint().unwrap();
            }
        });
        let vers: Vec<Vec<u64>> = writers.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Relaxed);
        maint.join().unwrap();
        for h in readers {
            h.join().unwrap();
        }
        (0..blocks as usize).map(|l| vers[l % 2][l]).collect()
    });
    assert!(eng.stats().extents_cleaned > 0, "the cleaner ran: {:?}", eng.stats());
    // Quiet now: everything, also at unaligned offsets, is the last version.
    let mut all = vec![0u8; blocks as usize * BS];
    eng.read(0, &mut all).unwrap();
    assert_eq!(versions_of(0, &all), last);
    let mut odd = vec![0u8; (1 << 20) + 1000];
    eng.read(12345, &mut odd).unwrap();
    assert!(odd == all[12345..12345 + odd.len()]);
    assert!(eng.check().unwrap().is_empty());
}

/// With background checkpoints on (as a server runs its engine), FLUSH
/// does not take a due checkpoint; `checkpoint_if_due` does. Flushed data
/// survives a crash either way (the log after the last checkpoint is
/// replayed).
#[test]
fn flush_leaves_due_checkpoints_to_the_background() {
    // Random data fills the 1024 extents that make a checkpoint due in
    // 32 MiB; thin (2400 extents, 75 MiB), so no cleaning is needed.
    let dev = std::sync::Arc::new(CrashBacking::new());
    let eng = engine_on(&dev, Some(&opts(32768, 32768, Some(2400 * 32768))));
    eng.set_background_checkpoints(true);
    assert!(!eng.stats().maintenance_pending, "a new image has no background work");
    let data = fill(1, 9, 36 << 20);
    for (i, c) in data.chunks(1 << 20).enumerate() {
        eng.write((i as u64) << 20, c, false).unwrap();
        eng.flush().unwrap();
    }
    assert!(eng.checkpoint_due());
    assert_eq!(eng.stats().checkpoints, 0, "a FLUSH took a checkpoint");
    // The due checkpoint is background work the stats report.
    assert!(eng.stats().maintenance_pending);
    // Crash now: flushed data is all in the log.
    let e2 = engine_on(&std::sync::Arc::new(CrashBacking::from_image(dev.crash(|_, _| 0))), None);
    let mut back = vec![0u8; data.len()];
    e2.read(0, &mut back).unwrap();
    assert!(back == data, "flushed data after a crash with no checkpoint");
    drop(e2);
    assert!(eng.checkpoint_if_due().unwrap());
    assert_eq!(eng.stats().checkpoints, 1);
    assert!(!eng.checkpoint_due() && !eng.checkpoint_if_due().unwrap());
    assert!(!eng.stats().maintenance_pending, "nothing left after the checkpoint");
    // Off again: FLUSH takes a due checkpoint itself.
    eng.set_background_checkpoints(false);
    for (i, c) in data.chunks(1 << 20).enumerate() {
        eng.write((36 + i as u64) << 20, c, false).unwrap();
    }
    assert!(eng.checkpoint_due());
    eng.flush().unwrap();
    assert_eq!(eng.stats().checkpoints, 2);
    assert!(!eng.checkpoint_due());
}
