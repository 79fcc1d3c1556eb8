//! What the cache tests share: devices, backings that fail or pause on
//! demand, data of every kind.
#![allow(dead_code)]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use ztier_blk::backing::{Backing, CrashBacking};
use ztier_cache::backend::{Backend, MemBackend};
use ztier_cache::cache::{self, CacheOptions};
use ztier_cache::format::{Geometry, Placement, Policy, Superblock};
use ztier_cache::Cache;
use ztier_codec::CodecId;

pub const B: usize = 4096;

/// A cache's shape for tests.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub size: u64,
    pub segment: u32,
    pub placement: Placement,
    pub ways: u16,
    pub policy: Policy,
    pub codec: CodecId,
    pub journal: Option<u64>,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            size: 2 << 20,
            segment: 16 << 10,
            placement: Placement::Assoc,
            ways: 4,
            policy: Policy::Clock,
            codec: CodecId::Lz4,
            journal: Some(64 << 10),
        }
    }
}

impl Shape {
    pub fn direct(self) -> Shape {
        Shape { placement: Placement::Direct, ways: 1, ..self }
    }
    pub fn superblock(&self) -> Superblock {
        Geometry {
            size: self.size,
            segment_size: self.segment,
            lines_per_block: 2.0,
            placement: self.placement,
            ways: self.ways,
            policy: self.policy,
            codec: self.codec as u8,
            journal_size: self.journal,
        }
        .superblock(cache::random_u64(), 0)
        .unwrap()
    }
    /// A new cache device in memory (crash-testable).
    pub fn device(&self) -> Arc<CrashBacking> {
        let dev = Arc::new(CrashBacking::new());
        cache::create(&*dev, &self.superblock()).unwrap();
        dev
    }
}

/// Options for tests: no pressure watcher, quick sealing.
pub fn opts() -> CacheOptions {
    CacheOptions {
        pressure: None,
        seal_after: std::time::Duration::from_millis(50),
        boot_id: Some([1; 16]),
        ..CacheOptions::default()
    }
}

pub fn open(dev: Arc<dyn Backing>, backing: Arc<dyn Backend>, o: CacheOptions) -> Cache {
    Cache::open(dev, backing, o).unwrap()
}

/// xorshift.
pub fn rng(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A block of data of kind `k`: 0 text (compresses ~3x), 1 random, 2
/// zeros, 3 same-filled, 4 half random half zeros (compresses ~2x).
pub fn block(seed: u64, k: u8) -> Vec<u8> {
    let mut x = seed | 1;
    match k % 5 {
        0 => {
            let mut v = Vec::with_capacity(B + 64);
            while v.len() < B {
                let r = rng(&mut x);
                v.extend_from_slice(format!("block {seed} line {} value {}\n", r % 97, r % 13).as_bytes());
            }
            v.truncate(B);
            v
        }
        1 => (0..B).map(|_| rng(&mut x) as u8).collect(),
        2 => vec![0u8; B],
        3 => [seed as u8, 7, 7, 9, 1, 2, 3, 4].repeat(B / 8),
        _ => {
            let mut v: Vec<u8> = (0..B / 2).map(|_| rng(&mut x) as u8).collect();
            v.resize(B, 0);
            v
        }
    }
}

/// A cache device that fails reads or writes on demand, past an offset.
pub struct Faulty {
    pub inner: Arc<CrashBacking>,
    pub fail_reads: AtomicBool,
    pub fail_writes: AtomicBool,
    pub from: AtomicU64,
}

impl Faulty {
    pub fn new(inner: Arc<CrashBacking>) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner,
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            from: AtomicU64::new(0),
        })
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc_eio())
}
fn libc_eio() -> i32 {
    5
}

impl Backing for Faulty {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if self.fail_reads.load(Ordering::Acquire) && off >= self.from.load(Ordering::Acquire) {
            return Err(eio());
        }
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if self.fail_writes.load(Ordering::Acquire) && off >= self.from.load(Ordering::Acquire) {
            return Err(io::Error::from_raw_os_error(28));
        }
        self.inner.write_at(buf, off)
    }
    /// Fails only when every write fails (the whole device is gone).
    fn sync(&self) -> io::Result<()> {
        if self.fail_writes.load(Ordering::Acquire) && self.from.load(Ordering::Acquire) == 0 {
            return Err(eio());
        }
        self.inner.sync()
    }
    fn allocated_bytes(&self) -> io::Result<u64> {
        self.inner.allocated_bytes()
    }
}

/// A gate: the reads (or writes) it is armed for take their data when
/// called, then wait until released — a request whose reply is late.
#[derive(Default)]
pub struct Gate {
    armed: Mutex<Option<u64>>,
    state: Mutex<(bool, bool)>, // (someone waiting, released)
    cv: Condvar,
}

impl Gate {
    pub fn arm(&self, off: u64) {
        *self.armed.lock().unwrap() = Some(off);
        *self.state.lock().unwrap() = (false, false);
    }
    /// Called by the gated operation: waits if armed for `off`.
    pub fn pass(&self, off: u64) {
        let hit = {
            let mut a = self.armed.lock().unwrap();
            if *a == Some(off) {
                *a = None;
                true
            } else {
                false
            }
        };
        if !hit {
            return;
        }
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.cv.notify_all();
        while !s.1 {
            s = self.cv.wait(s).unwrap();
        }
    }
    pub fn wait_blocked(&self) {
        let mut s = self.state.lock().unwrap();
        while !s.0 {
            s = self.cv.wait(s).unwrap();
        }
    }
    pub fn release(&self) {
        let mut s = self.state.lock().unwrap();
        s.1 = true;
        self.cv.notify_all();
    }
}

/// A backing whose reads can be held (with the data they read at the call).
pub struct GatedBackend {
    pub mem: MemBackend,
    pub reads: Gate,
    pub writes: Gate,
}

impl GatedBackend {
    pub fn new(size: u64) -> Arc<GatedBackend> {
        Arc::new(GatedBackend { mem: MemBackend::new(size), reads: Gate::default(), writes: Gate::default() })
    }
}

impl Backend for GatedBackend {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.mem.read_at(buf, off)?;
        self.reads.pass(off);
        Ok(())
    }
    fn write_at(&self, data: &[u8], off: u64, fua: bool) -> io::Result<()> {
        self.writes.pass(off);
        self.mem.write_at(data, off, fua)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        self.mem.trim(off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, fast: bool) -> io::Result<()> {
        self.mem.write_zeroes(off, len, fast)
    }
    fn read_only(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "gated memory".into()
    }
}

/// A cache device whose reads at one offset range can be held.
pub struct GatedDevice {
    pub inner: Arc<CrashBacking>,
    pub gate: Gate,
    pub lo: AtomicU64,
}

impl Backing for GatedDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.inner.read_at(buf, off)?;
        if off >= self.lo.load(Ordering::Acquire) {
            self.gate.pass(u64::MAX);
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.inner.write_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn allocated_bytes(&self) -> io::Result<u64> {
        self.inner.allocated_bytes()
    }
}
