//! A managed anonymous region: pages can be evicted into the compressed
//! page store (their memory returned with `MADV_DONTNEED`); the first touch
//! of an evicted or never-touched page faults, and a handler thread serves
//! it — decompress from the store and `UFFDIO_COPY`, or `UFFDIO_ZEROPAGE`
//! when the store has no copy.
//!
//! ```text
//!  program thread            handler thread                   store
//!  touch page p ──fault──►   read uffd_msg (address)
//!  (sleeps in the kernel)    get(pool, p, exclusive) ───────► compressed copy
//!                            decompress into a buffer
//!                            UFFDIO_COPY(p, buffer) ──wakes──► program continues
//! ```
//!
//! Eviction here is explicit ([`Region::evict`]): the caller must ensure
//! no thread writes the page while it is evicted (a write between the copy
//! into the store and `MADV_DONTNEED` would be lost). Cold-page detection
//! with write protection, which lifts that condition, comes with `ztier run`.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store};

use crate::uffd::{map_anonymous, Installed, Uffd, EVENT_PAGEFAULT};

/// Page size.
pub const PAGE: usize = 4096;
/// How long the handler keeps polling without sleeping after a fault.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(200);
/// Latency histogram buckets: [0,1), [1,2), … µs; the last collects the rest.
pub const LATENCY_BUCKETS: usize = 256;

/// Errors of a region.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// A system call failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The store refused or failed.
    #[error("store: {0}")]
    Store(String),
    /// Page index out of the region.
    #[error("page {0} is outside the region")]
    OutOfRange(usize),
}

/// Counters of a region.
#[derive(Debug, Default)]
pub struct RegionStats {
    /// Faults served.
    pub faults: AtomicU64,
    /// Served from the store (decompressed).
    pub from_store: AtomicU64,
    /// Served with a zero page.
    pub zero_filled: AtomicU64,
    /// Pages evicted into the store.
    pub evicted: AtomicU64,
    /// Installs retried (EAGAIN) or found done by another thread (EEXIST).
    pub races: AtomicU64,
    /// Fault service time (event read to install done), 1 µs buckets.
    pub latency_us: Vec<AtomicU64>,
}

impl RegionStats {
    /// The `q`-quantile (0..1) of the service time in µs (bucket upper bound).
    pub fn latency_quantile(&self, q: f64) -> Option<usize> {
        let counts: Vec<u64> = self.latency_us.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(i + 1);
            }
        }
        Some(LATENCY_BUCKETS)
    }
}

/// A managed region of anonymous memory.
pub struct Region {
    base: usize,
    pages: usize,
    uffd: Arc<Uffd>,
    store: Arc<Store>,
    pool: u32,
    stop: Arc<AtomicBool>,
    handler: Option<std::thread::JoinHandle<io::Result<()>>>,
    stats: Arc<RegionStats>,
}

impl Region {
    /// Maps `pages` pages, registers them with a new userfaultfd, creates
    /// a persistent pool in `store` and starts the fault handler.
    pub fn new(pages: usize, store: Arc<Store>) -> Result<Region, RegionError> {
        let len = pages * PAGE;
        let base = map_anonymous(len)?;
        let uffd = match Uffd::open().and_then(|u| u.register(base, len).map(|_| u)) {
            Ok(u) => Arc::new(u),
            Err(e) => {
                // SAFETY: unmapping the mapping made above.
                unsafe { libc::munmap(base as *mut libc::c_void, len) };
                return Err(e.into());
            }
        };
        // Persistent (never dropped) and raw-capable: a page must come back
        // even if it does not compress.
        let pool = store
            .create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) })
            .map_err(|e| RegionError::Store(e.to_string()))?;
        let stats = Arc::new(RegionStats {
            latency_us: (0..LATENCY_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let handler = {
            let (uffd, store, stop, stats) = (uffd.clone(), store.clone(), stop.clone(), stats.clone());
            std::thread::spawn(move || {
                let r = serve(&uffd, &store, pool, base, pages, &stop, &stats);
                if let Err(e) = &r {
                    // Threads waiting on a fault would sleep forever, and
                    // unregistering would hand them zero pages: stop loudly.
                    eprintln!("ztier: the fault handler failed ({e}); the region's pages cannot be served: aborting");
                    std::process::abort();
                }
                r
            })
        };
        Ok(Region { base, pages, uffd, store, pool, stop, handler: Some(handler), stats })
    }

    /// Start of the region.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }

    /// Pages in the region.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Counters.
    pub fn stats(&self) -> &RegionStats {
        &self.stats
    }

    /// Compresses page `i` into the store and releases its memory. The
    /// next touch faults and is served from the store. The caller must
    /// ensure no thread writes the page meanwhile (see the module docs).
    /// Zero pages are not stored: they come back as zero pages.
    pub fn evict(&self, i: usize) -> Result<(), RegionError> {
        if i >= self.pages {
            return Err(RegionError::OutOfRange(i));
        }
        let addr = self.base + i * PAGE;
        // Not resident (never touched, or already evicted)? Nothing to do:
        // touching it now would fault into our own handler for nothing.
        let mut vec = [0u8; 1];
        // SAFETY: mincore on one page of our mapping into a 1-byte vector.
        if unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, vec.as_mut_ptr()) } == 0 && vec[0] & 1 == 0
        {
            return Ok(());
        }
        // SAFETY: the page is inside our live mapping and resident; the
        // caller guarantees no concurrent writer.
        let page = unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE) };
        if page.iter().any(|&b| b != 0) {
            self.store
                .put(Key { pool: self.pool, object: 0, index: i as u32 }, page, PutFlags::default())
                .map_err(|e| RegionError::Store(e.to_string()))?;
        }
        // SAFETY: releasing one page of our own mapping.
        if unsafe { libc::madvise(addr as *mut libc::c_void, PAGE, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        self.stats.evicted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Pages of the region resident in memory now (mincore).
    pub fn resident_pages(&self) -> Result<usize, RegionError> {
        let mut v = vec![0u8; self.pages];
        // SAFETY: mincore over our mapping into a vector of one byte per page.
        if unsafe { libc::mincore(self.base as *mut libc::c_void, self.pages * PAGE, v.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(v.iter().filter(|&&b| b & 1 != 0).count())
    }
}

/// The handler loop: one event at a time until `stop`.
fn serve(
    uffd: &Uffd,
    store: &Store,
    pool: u32,
    base: usize,
    pages: usize,
    stop: &AtomicBool,
    stats: &RegionStats,
) -> io::Result<()> {
    let mut buf = vec![0u8; PAGE];
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        // Faults come in bursts: for SPIN after one, poll the descriptor
        // without sleeping (a sleeping handler adds a wake-up to every
        // fault); then sleep in poll.
        let ev = match uffd.try_read()? {
            Some(ev) => ev,
            None if last.elapsed() < SPIN => {
                std::hint::spin_loop();
                continue;
            }
            None => match uffd.read_event(50)? {
                Some(ev) => ev,
                None => continue,
            },
        };
        last = Instant::now();
        let t = Instant::now();
        if ev.kind != EVENT_PAGEFAULT {
            continue;
        }
        let addr = (ev.address as usize) & !(PAGE - 1);
        if addr < base || addr >= base + pages * PAGE {
            continue;
        }
        let i = (addr - base) / PAGE;
        let key = Key { pool, object: 0, index: i as u32 };
        let found = store.get(key, &mut buf, true).map_err(|e| io::Error::other(e.to_string()))?;
        let mut tries = 0;
        loop {
            let r = if found { uffd.copy(addr, &buf)? } else { uffd.zeropage(addr, PAGE)? };
            match r {
                Installed::Done => break,
                Installed::AlreadyThere => {
                    stats.races.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Installed::Retry => {
                    stats.races.fetch_add(1, Ordering::Relaxed);
                    tries += 1;
                    if tries > 100 {
                        return Err(io::Error::other("UFFDIO_COPY kept returning EAGAIN"));
                    }
                }
            }
        }
        stats.faults.fetch_add(1, Ordering::Relaxed);
        if found {
            stats.from_store.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.zero_filled.fetch_add(1, Ordering::Relaxed);
        }
        let us = (t.elapsed().as_nanos() / 1000) as usize;
        stats.latency_us[us.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

impl Drop for Region {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handler.take() {
            let _ = h.join();
        }
        let len = self.pages * PAGE;
        let _ = self.uffd.unregister(self.base, len);
        // SAFETY: unmapping our own mapping; no references into it outlive `self`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, len) };
        let _ = self.store.destroy_pool(self.pool);
    }
}
